// The official OpenSandbox JavaScript SDK (@alibaba-group/opensandbox, pinned in js/package.json),
// on its DEFAULT connection settings, against a real opensandbox-server 1.1.1 whose sandboxes run
// sessionbox's agent as execd. The JavaScript twin of sdk-check.py: it creates a sandbox through
// the server and checks the expectations of upstream's own end-to-end suite
// (tests/javascript/tests/test_sandbox_e2e.test.ts in the OpenSandbox repository, and the
// Python suite's where it asserts more), each counted on its own; prints how many hold, deletes
// the sandbox, checks the server no longer lists it, and exits non-zero when any fails.
//
//   eval "$(scripts/opensandbox-up)"
//   (cd scripts/opensandbox/js && npm ci) && node scripts/opensandbox/sdk-check.mjs [--server-proxy]
//
// `new ConnectionConfig()` takes no options: the domain and API key come from OPEN_SANDBOX_DOMAIN
// and OPEN_SANDBOX_API_KEY as the SDK reads them by default, and execd is reached directly at the
// endpoint the server hands out (docker bridge mode: 127.0.0.1:<port>/proxy/44772, through the
// agent's own /proxy/{port} route). `--server-proxy` sets useServerProxy: true, for comparison.
//
// Deliberate differences from upstream's suite, each because of what sessionbox is:
// - Paths: upstream works in /tmp; the agent confines file operations to its workspace, so every
//   directory and file lives under /workspace/sdk-e2e-<ms>/ (the analogue of /tmp), and the
//   commands upstream runs with workingDirectory "/tmp" run there.
// - The owner/group probe: upstream's `getent group nogroup` needs getent, which the busybox image
//   lacks; `grep -q '^nogroup:' /etc/group` asks the same. The image has nobody/nogroup, so the
//   probe must find them (upstream falls back to root on images without them).
// - Not exercised: the bash session API, the code interpreter, volumes, pause/resume, egress and
//   signed endpoints: the agent is no code interpreter and has no /session, and the rest belong
//   to the server, not to execd.
// - Checked on top (not in upstream's suite, counted apart): upstream execd's line framing as its
//   code has it (an empty line is a "\n" event, a last unterminated line comes at exit), and a
//   file operation outside the workspace (upstream's own /tmp path) refused with a clear error.
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

// The SDK as `npm ci` installed it in js/ beside this file (bare imports would look in
// scripts/opensandbox/node_modules): its ES module entry, as its package.json exports it.
const sdkDir = path.join(path.dirname(fileURLToPath(import.meta.url)), "js", "node_modules", "@alibaba-group", "opensandbox");
const sdkPackage = JSON.parse(readFileSync(path.join(sdkDir, "package.json"), "utf-8"));
const sdkVersion = sdkPackage.version;
const { ConnectionConfig, Sandbox, SandboxManager } = await import(
  pathToFileURL(path.join(sdkDir, sdkPackage.exports["."].import)).href
);

const SERVER_PROXY = process.argv.slice(2).includes("--server-proxy");
const IMAGE = process.env.OPENSANDBOX_SANDBOX_IMAGE || "sessionbox/sandbox:local";
const EXECD_PORT = 44772;

const results = []; // upstream's expectations: [name, ok, detail]
const extras = []; // on top of upstream's suite

class Unmet extends Error {}
const need = (cond, detail) => {
  if (!cond) throw new Unmet(detail);
};
const show = (v) => {
  try {
    return JSON.stringify(v);
  } catch {
    return String(v);
  }
};
const same = (got, want, what) => {
  if (show(got) !== show(want)) throw new Unmet(`${what}: got ${show(got)}, want ${show(want)}`);
};

// An awaited call's value, or what it threw (re-thrown on .v).
async function attempt(promiseOrFn) {
  const t0 = Date.now();
  try {
    const value = await (typeof promiseOrFn === "function" ? promiseOrFn() : promiseOrFn);
    return { value, raised: false, seconds: (Date.now() - t0) / 1000, get v() { return value; } };
  } catch (exc) {
    return { exc, raised: true, seconds: (Date.now() - t0) / 1000, get v() { throw exc; } };
  }
}

function check(name, fn, into = results) {
  try {
    fn();
    into.push([name, true, ""]);
    console.log(`  ok   ${name}`);
  } catch (e) {
    let detail = e instanceof Unmet ? e.message : `${e?.name ?? "Error"}: ${e?.message ?? e}`;
    if (e?.statusCode) detail += ` (HTTP ${e.statusCode}: ${typeof e.rawBody === "string" ? e.rawBody : show(e.rawBody)})`;
    detail = detail.slice(0, 600);
    into.push([name, false, detail]);
    console.log(`  FAIL ${name}: ${detail}`);
  }
}

const recentMs = (ts, what, toleranceMs = 60_000) => {
  need(typeof ts === "number" && ts > 0, `${what}: timestamp ${show(ts)} is not a positive number`);
  need(Math.abs(Date.now() - ts) <= toleranceMs, `${what}: timestamp ${ts} is ${Date.now() - ts} ms off`);
};
const timesClose = (a, b, what, toleranceS = 2) => {
  need(a instanceof Date && b instanceof Date, `${what}: createdAt/modifiedAt not dates`);
  const d = Math.abs(b - a) / 1000;
  need(d <= toleranceS, `${what}: createdAt/modifiedAt ${d}s apart`);
};
const movedForward = (before, after, what) => {
  const d = after - before; // upstream: >= 1 ms less 1000 ms of skew
  need(d >= 1 - 1000, `${what}: modifiedAt moved ${d} ms`);
};
// upstream's assertEndpointHasPort: no scheme; a route ends with /<port>, else host:<port>.
const endpointForm = (endpoint, port) => {
  need(endpoint, "endpoint is empty");
  need(!endpoint.includes("://"), `endpoint ${endpoint} has a scheme`);
  if (endpoint.includes("/")) {
    need(endpoint.endsWith(`/${port}`), `endpoint ${endpoint} does not end with /${port}`);
    need(endpoint.split("/", 1)[0], `endpoint ${endpoint} has no host`);
  } else {
    const i = endpoint.lastIndexOf(":");
    need(i > 0 && endpoint.slice(i + 1) === String(port), `endpoint ${endpoint} is not host:${port}`);
  }
};
const texts = (execution) => execution.logs.stdout.map((m) => m.text);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const readAll = async (iterable) => {
  const chunks = [];
  for await (const c of iterable) chunks.push(c);
  return Buffer.concat(chunks.map((c) => Buffer.from(c)));
};

function recorder() {
  const rec = { stdout: [], stderr: [], inits: [], completes: [], errors: [] };
  rec.initSeen = new Promise((resolve) => (rec.resolveInit = resolve));
  rec.handlers = {
    onStdout: (m) => void rec.stdout.push(m),
    onStderr: (m) => void rec.stderr.push(m),
    onInit: (i) => {
      rec.inits.push(i);
      rec.resolveInit(i);
    },
    onExecutionComplete: (c) => void rec.completes.push(c),
    onError: (e) => void rec.errors.push(e),
  };
  return rec;
}

async function lifecycle(sb, cfg) {
  console.log("lifecycle");
  const healthy = await attempt(sb.isHealthy());
  check("isHealthy() is true", () => same(healthy.v, true, "isHealthy"));

  const info = await attempt(sb.getInfo());
  check("getInfo: Running, entrypoint, metadata", () => {
    const i = info.v;
    same(i.id, sb.id, "info.id");
    same(i.status.state, "Running", "state");
    same(i.entrypoint, ["tail", "-f", "/dev/null"], "entrypoint");
    same(i.metadata?.tag, "e2e-test", "metadata tag");
  });
  check("getInfo: expiry within [1, 6] min of creation", () => {
    const i = info.v;
    need(i.expiresAt > i.createdAt, "expiresAt is not after createdAt");
    const min = (i.expiresAt - i.createdAt) / 60_000;
    need(min >= 1 && min <= 6, `timeout 5 min gave ${min} min`);
  });

  const ep = await attempt(sb.getEndpoint(EXECD_PORT));
  check(`getEndpoint(${EXECD_PORT}): host:port or a route ending /${EXECD_PORT}`, () =>
    endpointForm(ep.v.endpoint, EXECD_PORT),
  );
  console.log(`  (execd endpoint: ${ep.raised ? ep.exc : ep.value.endpoint})`);

  const metrics = await attempt(sb.getMetrics());
  check("getMetrics: cpu, memory, recent timestamp", () => {
    const m = metrics.v;
    need(m.cpuCount > 0, `cpuCount ${m.cpuCount}`);
    need(m.cpuUsedPercentage >= 0 && m.cpuUsedPercentage <= 100, `cpu ${m.cpuUsedPercentage}%`);
    need(m.memoryTotalMiB > 0, `memory total ${m.memoryTotalMiB}`);
    need(m.memoryUsedMiB >= 0 && m.memoryUsedMiB <= m.memoryTotalMiB, `memory used ${m.memoryUsedMiB}`);
    recentMs(m.timestamp, "metrics", 120_000);
  });

  const renew = await attempt(sb.renew(20 * 60));
  const renewed = await attempt(sb.getInfo());
  check("renew(20 min): expiresAt moves forward, 18-22 min left", () => {
    const r = renew.v;
    const i = renewed.v;
    need(r.expiresAt instanceof Date, "expiresAt is not a Date");
    need(r.expiresAt > info.v.expiresAt, "renew did not move expiresAt forward");
    need(Math.abs(i.expiresAt - r.expiresAt) < 10_000, "renew answer and info differ");
    const left = (i.expiresAt - Date.now()) / 60_000;
    need(left > 18 && left < 22, `remaining ${left} min`);
  });

  const conn = await attempt(async () => {
    const sb2 = await Sandbox.connect({ sandboxId: sb.id, connectionConfig: cfg });
    try {
      return [sb2.id, await sb2.isHealthy(), await sb2.commands.run("echo connect-ok")];
    } finally {
      await sb2.close();
    }
  });
  check("Sandbox.connect: healthy, `echo connect-ok` gives one stdout line", () => {
    const [sid, ok, r] = conn.v;
    same(sid, sb.id, "connected id");
    same(ok, true, "connected isHealthy");
    same(r.error, undefined, "error");
    same(texts(r), ["connect-ok"], "stdout");
  });
}

async function foreground(sb, base) {
  console.log("commands");
  let rec = recorder();
  const echo = await attempt(sb.commands.run("echo 'Hello OpenSandbox E2E'", undefined, rec.handlers));
  check("run(echo): an id, no error", () => {
    need(echo.v.id && echo.v.id.trim(), `execution id ${show(echo.v.id)}`);
    same(echo.v.error, undefined, "error");
  });
  check("run(echo): exactly one stdout message, the line without its newline", () => {
    const r = echo.v;
    same(texts(r), ["Hello OpenSandbox E2E"], "stdout messages");
    need(!r.logs.stdout[0].isError, "isError");
    recentMs(r.logs.stdout[0].timestamp, "stdout");
    same(r.logs.stderr.length, 0, "stderr messages");
  });
  check("run(echo): exit code 0, execution_complete with a time", () => {
    const r = echo.v;
    same(r.exitCode, 0, "exitCode");
    need(r.complete, "no execution_complete");
    need(r.complete.executionTimeMs >= 0, "executionTimeMs < 0");
    recentMs(r.complete.timestamp, "complete");
  });
  check("run(echo): handlers see 1 init, 1 stdout, 1 complete, 0 errors", () => {
    same(rec.inits.length, 1, "init events");
    same(rec.inits[0].id, echo.v.id, "init id");
    recentMs(rec.inits[0].timestamp, "init");
    same(rec.completes.length, 1, "complete events");
    same(rec.stdout.map((m) => m.text), ["Hello OpenSandbox E2E"], "onStdout");
    same(rec.errors.length, 0, "error events");
  });

  const pwd = await attempt(sb.commands.run("pwd", { workingDirectory: base }));
  check("run(pwd, workingDirectory): that directory, one line", () => {
    const r = pwd.v;
    same(r.error, undefined, "error");
    same(texts(r), [base], "stdout");
    same(r.exitCode, 0, "exitCode");
    need(r.complete, "no execution_complete");
  });

  const bg = await attempt(sb.commands.run("sleep 30", { background: true }));
  check("run(sleep 30, background): returns within 10 s, no exit code", () => {
    need(bg.seconds < 10, `took ${bg.seconds}s`);
    same(bg.v.exitCode ?? null, null, "exitCode");
  });

  rec = recorder();
  const name = "nonexistent-command-that-does-not-exist";
  const fail = await attempt(sb.commands.run(name, undefined, rec.handlers));
  check("run(missing command): error CommandExecError", () => {
    need(fail.v.id && fail.v.id.trim(), `execution id ${show(fail.v.id)}`);
    need(fail.v.error, "no error");
    same(fail.v.error.name, "CommandExecError", "error.name");
  });
  check("run(missing command): stderr names the command", () => {
    const err = fail.v.logs.stderr;
    need(err.length > 0, "no stderr");
    need(err.some((m) => m.text.includes(name)), `stderr ${show(err.map((m) => m.text))}`);
    need(err.every((m) => m.isError === true), "a stderr message with isError not true");
    recentMs(err[0].timestamp, "stderr");
  });
  check("run(missing command): no complete, exitCode == Number(error.value)", () => {
    same(fail.v.complete, undefined, "complete");
    same(fail.v.exitCode, Number(fail.v.error.value), "exitCode vs error.value");
  });
  check("run(missing command): handlers see 1 init, an error, 0 completes", () => {
    same(rec.inits.length, 1, "init events");
    same(rec.inits[0].id, fail.v.id, "init id");
    need(rec.errors.length >= 1, "no error event");
    same(rec.errors[0].name, "CommandExecError", "error event name");
    same(rec.completes.length, 0, "complete events");
    need(rec.stderr.length && rec.stderr[0].text.includes(name), "onStderr's first message lacks the name");
  });
}

// On top of upstream's suite: upstream execd's line framing (its code, not its e2e tests): one
// event per line without its terminator, an empty line as "\n", a last unterminated line at exit.
async function framing(sb) {
  const blank = await attempt(sb.commands.run("printf 'a\\n\\nb\\n'"));
  check(
    "framing: printf 'a\\n\\nb\\n' gives stdout events a, \\n, b",
    () => same(texts(blank.v), ["a", "\n", "b"], "stdout events"),
    extras,
  );
  const tail = await attempt(sb.commands.run("printf 'x\\ny'"));
  check("framing: printf 'x\\ny' gives x, then y at exit", () => same(texts(tail.v), ["x", "y"], "stdout events"), extras);
}

async function statusAndLogs(sb) {
  const started = await attempt(
    sb.commands.run("sh -c 'echo log-line-1; echo log-line-2; sleep 2'", { background: true }),
  );
  const cid = started.raised ? undefined : started.value.id;
  const status = await attempt(sb.commands.getCommandStatus(cid));
  check("getCommandStatus(background id): that id, running a boolean", () => {
    need(started.v.id, "no command id");
    same(status.v.id, cid, "status.id");
    same(typeof status.v.running, "boolean", "typeof running");
  });
  const logs = await attempt(async () => {
    let text = "";
    let cursor;
    for (let i = 0; i < 20; i++) {
      const l = await sb.commands.getBackgroundCommandLogs(cid, cursor);
      text += l.content;
      cursor = l.cursor ?? cursor;
      if (text.includes("log-line-2")) break;
      await sleep(1000);
    }
    return text;
  });
  check("getBackgroundCommandLogs(cursor): both lines", () =>
    need(logs.v.includes("log-line-1") && logs.v.includes("log-line-2"), `logs ${show(logs.v)}`),
  );
}

async function envs(sb) {
  const key = "OPEN_SANDBOX_E2E_CMD_ENV";
  const value = `env-ok-${Date.now()}`;
  const probe = `sh -c 'if [ -z "\${${key}:-}" ]; then echo "__EMPTY__"; else echo "\${${key}}"; fi'`;
  const baseline = await attempt(sb.commands.run(probe));
  const injected = await attempt(
    sb.commands.run(probe, { envs: { [key]: value, OPEN_SANDBOX_E2E_SECOND_ENV: "second-ok" } }),
  );
  check("run(probe): variable unset without envs", () => {
    same(baseline.v.error, undefined, "error");
    same(texts(baseline.v).join("\n").trim(), "__EMPTY__", "output");
  });
  check("run(probe, envs): the variable's value", () => {
    same(injected.v.error, undefined, "error");
    same(texts(injected.v).join("\n").trim(), value, "output");
  });
}

async function interrupt(sb) {
  const rec = recorder();
  const t0 = Date.now();
  const task = sb.commands.run("sleep 30", undefined, rec.handlers);
  task.catch(() => undefined);
  const out = await attempt(async () => {
    const init = await Promise.race([
      rec.initSeen,
      sleep(15_000).then(() => Promise.reject(new Error("no init within 15 s"))),
    ]);
    await sb.commands.interrupt(init.id);
    const execution = await Promise.race([
      task,
      sleep(30_000).then(() => Promise.reject(new Error("the run did not end within 30 s"))),
    ]);
    return [execution, (Date.now() - t0) / 1000];
  });
  check("interrupt(init id): the run ends within 20 s", () => {
    const [execution, elapsed] = out.v;
    same(rec.inits.length, 1, "init events");
    recentMs(rec.inits[0].timestamp, "init");
    same(execution.id, rec.inits[0].id, "execution id");
    need(elapsed < 20, `took ${elapsed}s`);
  });
  const followUp = await attempt(sb.commands.run("echo interrupt-ok"));
  check("interrupt: an error (name and value) or stderr reports it; the next run works", () => {
    const [execution] = out.v;
    need(rec.completes.length || rec.errors.length, "neither complete nor error");
    if (rec.completes.length) same(rec.completes.length, 1, "complete events");
    need(execution.error || execution.logs.stderr.length, "no error and no stderr");
    if (execution.error) {
      need(execution.error.name && execution.error.value, `error ${show(execution.error)}`);
      recentMs(execution.error.timestamp, "error", 180_000);
    }
    same(followUp.v.error, undefined, "follow-up error");
    same(texts(followUp.v)[0], "interrupt-ok", "follow-up stdout");
  });
}

async function filesystem(sb, base) {
  console.log("files");
  const ts = Date.now();
  const d1 = `${base}/fs_test1_${ts}`;
  const d2 = `${base}/fs_test2_${ts}`;
  const mk = await attempt(sb.files.createDirectories([{ path: d1, mode: 755 }, { path: d2, mode: 644 }]));
  const dinfo = await attempt(sb.files.getFileInfo([d1, d2]));
  check("createDirectories(755, 644): info shows those modes", () => {
    mk.v;
    const m = dinfo.v;
    same(m[d1]?.path, d1, "path");
    same(m[d2]?.path, d2, "path");
    same(m[d1]?.mode, 755, "mode of the 755 directory");
    same(m[d2]?.mode, 644, "mode of the 644 directory");
    need(m[d1].owner && m[d1].group, "owner/group empty");
    timesClose(m[d1].createdAt, m[d1].modifiedAt, "directory");
  });
  const ls = await attempt(sb.commands.run("ls -la | grep fs_test", { workingDirectory: base }));
  check("`ls -la | grep fs_test`: exactly 2 lines", () => {
    same(ls.v.error, undefined, "error");
    same(ls.v.logs.stdout.length, 2, "lines");
  });

  const f1 = `${d1}/test_file1.txt`;
  const f2 = `${d1}/test_file2.txt`;
  const f3 = `${d1}/test_file3.txt`;
  const content = "Hello Filesystem!\nLine 2 with special chars: åäö\nLine 3";
  const bytes = new TextEncoder().encode(content);
  const size = bytes.length;
  const ownerPick = await attempt(
    sb.commands.run("id -u nobody >/dev/null 2>&1 && echo nobody || echo root", { workingDirectory: base }),
  );
  const groupPick = await attempt(
    sb.commands.run("grep -q '^nogroup:' /etc/group && echo nogroup || echo root", { workingDirectory: base }),
  );
  const owner = ownerPick.raised ? "root" : (texts(ownerPick.value)[0] || "root").trim();
  const group = groupPick.raised ? "root" : (groupPick.value.logs.stdout[0]?.text || "root").trim();
  const wrote = await attempt(
    sb.files.writeFiles([
      { path: f1, data: content, mode: 644 },
      { path: f2, data: bytes, mode: 755 },
      { path: f3, data: bytes, mode: 755, owner, group },
    ]),
  );
  check(`writeFiles(string 644, bytes 755, bytes ${owner}:${group} 755)`, () => {
    same([owner, group], ["nobody", "nogroup"], "the image's nobody/nogroup");
    wrote.v;
  });

  const found = await attempt(sb.files.search({ path: d1, pattern: "*" }));
  check("search(dir, '*'): the 3 files, by absolute path", () => {
    const paths = found.v.map((f) => f.path).sort();
    same(paths, [f1, f2, f3].sort(), "found");
  });

  const r1 = await attempt(sb.files.readFile(f1, { encoding: "utf-8" }));
  const r2 = await attempt(sb.files.readBytes(f2));
  const r3 = await attempt(readAll(sb.files.readBytesStream(f3)));
  check("readFile / readBytes / readBytesStream: the content", () => {
    same(r1.v, content, "readFile");
    same(new TextDecoder().decode(r2.v), content, "readBytes");
    same(r3.v.toString("utf-8"), content, "readBytesStream");
  });
  const part = await attempt(sb.files.readFile(f1, { encoding: "utf-8", range: "bytes=0-9" }));
  check("readFile(range bytes=0-9): the first 10 bytes", () => same(part.v, content.slice(0, 10), "range"));

  const finfo = await attempt(sb.files.getFileInfo([f1, f2, f3]));
  const infoOf = (p, mode, o, g) => () => {
    const i = finfo.v[p];
    need(i, `no info for ${p}`);
    same(i.path, p, "path");
    same(i.size, size, "size");
    same(i.mode, mode, "mode");
    need(i.owner != null && i.group != null, "owner/group missing");
    if (o) same([i.owner, i.group], [o, g], "owner:group");
    timesClose(i.createdAt, i.modifiedAt, p);
  };
  check("getFileInfo(string file): size, mode 644", infoOf(f1, 644));
  check("getFileInfo(bytes file): size, mode 755", infoOf(f2, 755));
  check("getFileInfo(owned file): mode 755, owner nobody, group nogroup", infoOf(f3, 755, "nobody", "nogroup"));

  const perm = await attempt(
    sb.files.setPermissions([
      { path: f1, mode: 755, owner, group },
      { path: f2, mode: 600, owner, group },
    ]),
  );
  const pinfo = await attempt(sb.files.getFileInfo([f1, f2]));
  check("setPermissions(755 and 600, nobody:nogroup): info shows them", () => {
    perm.v;
    const m = pinfo.v;
    same([m[f1]?.mode, m[f1]?.owner, m[f1]?.group], [755, "nobody", "nogroup"], "first file");
    same([m[f2]?.mode, m[f2]?.owner, m[f2]?.group], [600, "nobody", "nogroup"], "second file");
  });

  const before = await attempt(sb.files.getFileInfo([f1]));
  const up1 = `${content}\nAppended line to file1`;
  const up2 = `${content}\nAppended line to file2`;
  await sleep(50);
  const rewrote = await attempt(
    sb.files.writeFiles([
      { path: f1, data: up1, mode: 644 },
      { path: f2, data: up2, mode: 755 },
    ]),
  );
  const n1 = await attempt(sb.files.readFile(f1));
  const n2 = await attempt(sb.files.readFile(f2));
  const after = await attempt(sb.files.getFileInfo([f1]));
  check("writeFiles again: new content, size, modifiedAt forward", () => {
    rewrote.v;
    same(n1.v, up1, "first file");
    same(n2.v, up2, "second file");
    same(after.v[f1].size, Buffer.byteLength(up1), "size");
    movedForward(before.v[f1].modifiedAt, after.v[f1].modifiedAt, "rewrite");
  });

  await sleep(50);
  const rep = await attempt(
    sb.files.replaceContentsDetailed([
      { path: f1, oldContent: "Appended line to file1", newContent: "Replaced line in file1" },
    ]),
  );
  const repRead = await attempt(sb.files.readFile(f1));
  const repInfo = await attempt(sb.files.getFileInfo([f1]));
  check("replaceContentsDetailed: replacedCount 1, text replaced", () => {
    same(rep.v.map((r) => [r.path, r.replacedCount]), [[f1, 1]], "results");
    need(repRead.v.includes("Replaced line in file1") && !repRead.v.includes("Appended line to file1"), repRead.v);
    movedForward(after.v[f1].modifiedAt, repInfo.v[f1].modifiedAt, "replace");
  });
  const none = await attempt(
    sb.files.replaceContentsDetailed([
      { path: f1, oldContent: "this string does not exist", newContent: "irrelevant" },
    ]),
  );
  const noneRead = await attempt(sb.files.readFile(f1));
  check("replaceContentsDetailed(no match): replacedCount 0, unchanged", () => {
    same(none.v.map((r) => [r.path, r.replacedCount]), [[f1, 0]], "results");
    same(noneRead.v, repRead.v, "content");
  });
  const multi = `${d1}/multi_match.txt`;
  const mw = await attempt(sb.files.writeFiles([{ path: multi, data: "foo bar foo baz foo" }]));
  const mr = await attempt(sb.files.replaceContentsDetailed([{ path: multi, oldContent: "foo", newContent: "qux" }]));
  const mc = await attempt(sb.files.readFile(multi));
  check("replaceContentsDetailed(3 matches): replacedCount 3", () => {
    mw.v;
    same(mr.v.map((r) => r.replacedCount), [3], "counts");
    same(mc.v, "qux bar qux baz qux", "content");
  });
  const ba = `${d1}/batch_a.txt`;
  const bb = `${d1}/batch_b.txt`;
  const bw = await attempt(
    sb.files.writeFiles([
      { path: ba, data: "hello world" },
      { path: bb, data: "hello hello" },
    ]),
  );
  const br = await attempt(
    sb.files.replaceContentsDetailed([
      { path: ba, oldContent: "hello", newContent: "hi" },
      { path: bb, oldContent: "hello", newContent: "hi" },
    ]),
  );
  const bca = await attempt(sb.files.readFile(ba));
  const bcb = await attempt(sb.files.readFile(bb));
  check("replaceContentsDetailed(batch of 2 files): 1 and 2", () => {
    bw.v;
    same(br.v.length, 2, "results");
    same(Object.fromEntries(br.v.map((r) => [r.path, r.replacedCount])), { [ba]: 1, [bb]: 2 }, "counts");
    same([bca.v, bcb.v], ["hi world", "hi hi"], "contents");
  });
  await attempt(sb.files.deleteFiles([multi, ba, bb]));
  const plain = await attempt(
    sb.files.replaceContents([{ path: f1, oldContent: "Replaced line in file1", newContent: "Final line in file1" }]),
  );
  const plainRead = await attempt(sb.files.readFile(f1));
  check("replaceContents (no result): text replaced", () => {
    plain.v;
    need(plainRead.v.includes("Final line in file1"), plainRead.v);
  });

  const moved = `${d2}/moved_file3.txt`;
  const mv = await attempt(sb.files.moveFiles([{ src: f3, dest: moved }]));
  const mvr = await attempt(sb.files.readFile(moved));
  const old = await attempt(sb.files.readBytes(f3));
  check("moveFiles: content at the destination, old path gone", () => {
    mv.v;
    same(mvr.v, content, "moved content");
    need(old.raised, "the old path still reads");
  });
  const dl = await attempt(sb.files.deleteFiles([f2]));
  const gone = await attempt(sb.files.readFile(f2));
  check("deleteFiles: reading the file then rejects", () => {
    dl.v;
    need(gone.raised, "a deleted file still reads");
  });
  const left = await attempt(sb.files.search({ path: d1, pattern: "*" }));
  check("search after move and delete: only the first file", () =>
    same(left.v.map((f) => f.path), [f1], "found"),
  );
  const rd = await attempt(sb.files.deleteDirectories([d1, d2]));
  const vr = await attempt(
    sb.commands.run(`test ! -d ${d1} && test ! -d ${d2} && echo OK`, { workingDirectory: base }),
  );
  check("deleteDirectories: both gone (`test ! -d` prints OK)", () => {
    rd.v;
    same(vr.v.error, undefined, "error");
    same(texts(vr.v), ["OK"], "stdout");
  });

  console.log("line reads");
  const p = `${base}/line-read-e2e.txt`;
  const lw = await attempt(sb.files.writeFiles([{ path: p, data: "line1\nline2\nline3\nline4\nline5" }]));
  for (const [opts, want] of [
    [{ offset: 2, limit: 2 }, "line2\nline3"],
    [{ offset: 4 }, "line4\nline5"],
    [{ limit: 2 }, "line1\nline2"],
  ]) {
    const got = await attempt(sb.files.readFile(p, opts));
    check(`readFile(${show(opts)})`, () => {
      lw.v;
      same(got.v, want, "lines");
    });
  }
  await attempt(sb.files.deleteFiles([p]));

  // sessionbox's own, on top: upstream's /tmp is outside the workspace, refused clearly.
  const outside = await attempt(sb.files.writeFiles([{ path: `/tmp/sdk-e2e-${ts}.txt`, data: "x" }]));
  check(
    "a write outside the workspace (/tmp) is refused, naming the workspace",
    () => {
      need(outside.raised, "a write to /tmp succeeded");
      const raw = outside.exc?.rawBody;
      const text = `${outside.exc?.message ?? ""} ${typeof raw === "string" ? raw : show(raw ?? "")}`;
      need(text.includes("OUTSIDE_WORKSPACE") || text.includes("outside the workspace"), `error ${text}`);
      console.log(`  (the agent's answer: ${text.slice(0, 200)})`);
    },
    extras,
  );
}

async function main() {
  const mode = SERVER_PROXY ? "useServerProxy: true" : "default settings";
  const cfg = SERVER_PROXY ? new ConnectionConfig({ useServerProxy: true }) : new ConnectionConfig();
  console.log(`JS SDK @alibaba-group/opensandbox@${sdkVersion}, ${mode}: creating a sandbox from ${IMAGE}`);
  const t0 = Date.now();
  const created = await attempt(
    Sandbox.create({
      connectionConfig: cfg,
      image: IMAGE,
      entrypoint: ["tail", "-f", "/dev/null"],
      timeoutSeconds: 5 * 60,
      readyTimeoutSeconds: 60,
      healthCheckPollingInterval: 200,
      metadata: { tag: "e2e-test", "sessionbox.test": "sdk-check-js" },
      env: { E2E_TEST: "true", EXECD_API_GRACE_SHUTDOWN: "3s" },
    }),
  );
  check("Sandbox.create: ready (execd /ping through the endpoint handed out)", () => created.v);
  if (created.raised) {
    console.log(`JS SDK (${mode}): the sandbox never became ready; nothing else can run`);
    return 1;
  }
  const sb = created.value;
  console.log(`  (sandbox ${sb.id} ready in ${(Date.now() - t0) / 1000}s)`);
  const sandboxId = sb.id;
  const base = `/workspace/sdk-e2e-${Date.now()}`;
  try {
    const mk = await attempt(sb.commands.run(`mkdir -p ${base}`));
    if (mk.raised || mk.value.exitCode !== 0) console.log(`  (could not make ${base}: ${mk.exc ?? show(mk.value.error)})`);
    await lifecycle(sb, cfg);
    await foreground(sb, base);
    await framing(sb);
    await statusAndLogs(sb);
    await envs(sb);
    await interrupt(sb);
    await filesystem(sb, base);
  } finally {
    await attempt(sb.kill());
    await attempt(sb.close());
  }

  const manager = SandboxManager.create({ connectionConfig: cfg });
  const info = await attempt(manager.getSandboxInfo(sandboxId));
  await attempt(manager.close());
  const state = info.raised ? null : String(info.value.status?.state).toLowerCase();
  const deleted = state === null || state === "terminated" || state === "stopping";
  console.log(`sandbox ${sandboxId}: ${deleted ? "deleted" : `still ${state}`}`);

  const held = results.filter((r) => r[1]).length;
  console.log(`JS SDK (${mode}): ${held} of ${results.length} upstream expectations hold`);
  for (const [name, ok, detail] of results) if (!ok) console.log(`  differs: ${name}: ${detail}`);
  const extraHeld = extras.filter((r) => r[1]).length;
  console.log(`JS SDK (${mode}): ${extraHeld} of ${extras.length} further checks hold (upstream framing, differences by design)`);
  for (const [name, ok, detail] of extras) if (!ok) console.log(`  differs: ${name}: ${detail}`);
  return held === results.length && extraHeld === extras.length && deleted ? 0 : 1;
}

process.exitCode = await main();
