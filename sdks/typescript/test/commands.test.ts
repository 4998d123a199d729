import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { Client, ServerError, SessionboxTimeoutError, outputBytes, type CommandStreamEvent } from "sessionbox";
import { eventually, processAlive, startServer, uniqueId, type TestServer } from "./server.js";

let server: TestServer;
let client: Client;

before(async () => {
  server = await startServer();
  client = new Client({ baseUrl: server.baseUrl, apiKey: server.key });
});
after(async () => {
  await server?.stop();
});

describe("background commands", () => {
  test("spawn, get, list, logs with offsets, and the exit code", async () => {
    const id = uniqueId("bg");
    const started = await client.spawn(id, "echo first; sleep 0.5; echo second; echo oops >&2; exit 7");
    assert.equal(started.running, true);
    assert.match(started.id, /^[A-Za-z0-9_-]{1,64}$/);

    const listed = await client.listCommands(id);
    assert.ok(listed.some((c) => c.id === started.id));

    await eventually(async () => !(await client.getCommand(id, started.id)).running);
    const done = await client.getCommand(id, started.id);
    assert.equal(done.exit_code, 7);
    assert.deepEqual(done.status, { code: 7 });
    assert.equal(done.stdout_bytes, "first\nsecond\n".length);
    assert.ok(done.finished_at);

    const all = await client.commandLogs(id, started.id);
    assert.equal(all.stdout.text, "first\nsecond\n");
    assert.equal(all.stderr.text, "oops\n");
    assert.equal(all.stdout_next_offset, 13);
    assert.equal(all.running, false);
    assert.equal(all.exit_code, 7);

    const rest = await client.commandLogs(id, started.id, { stdoutOffset: 6, stderrOffset: 5 });
    assert.equal(rest.stdout.text, "second\n");
    assert.equal(rest.stderr.text, "");
    await assert.rejects(client.commandLogs(id, started.id, { stdoutOffset: 1000 }), { status: 400 });
  });

  test("logs long-poll with waitMs until output comes", async () => {
    const id = uniqueId("bg-poll");
    const cmd = await client.spawn(id, "sleep 0.6; echo late");
    const t0 = Date.now();
    const logs = await client.commandLogs(id, cmd.id, { waitMs: 5000 });
    const waited = Date.now() - t0;
    assert.ok(waited >= 300, `waited ${waited} ms`);
    assert.ok(logs.stdout.text === "late\n" || !logs.running);
  });

  test("follow streams output in order, binary-safe, then the exit", async () => {
    const id = uniqueId("bg-follow");
    const cmd = await client.spawn(id, "echo a; sleep 0.3; printf '\\377\\000\\001' >&2; sleep 0.3; echo b");
    const events: CommandStreamEvent[] = [];
    for await (const ev of client.followCommand(id, cmd.id)) events.push(ev);
    const out = events.map((e) => (e.type === "stdout" ? e.text : "")).join("");
    assert.equal(out, "a\nb\n");
    const err = events.filter((e) => e.type === "stderr");
    assert.ok(err[0] && err[0].type === "stderr");
    assert.deepEqual([...err[0].bytes], [0xff, 0, 1]);
    const last = events.at(-1)!;
    assert.ok(last.type === "exit");
    assert.equal(last.exit_code, 0);
    assert.equal(last.running, false);
    assert.equal(last.id, cmd.id);
    // Order of the stdout and stderr events as written: a, then the bytes, then b.
    assert.deepEqual(
      events.map((e) => e.type),
      ["stdout", "stderr", "stdout", "exit"],
    );
    // From an offset: only what follows.
    const later: string[] = [];
    for await (const ev of client.followCommand(id, cmd.id, { stdoutOffset: 2, stderrOffset: 3 })) {
      if (ev.type !== "exit") later.push(ev.text);
    }
    assert.deepEqual(later, ["b\n"]);
    const logs = await client.commandLogs(id, cmd.id);
    assert.deepEqual([...outputBytes(logs.stderr)], [0xff, 0, 1]);
  });

  test("a follow past its timeoutMs ends with SessionboxTimeoutError and leaves the command running", async () => {
    const id = uniqueId("bg-follow-timeout");
    const cmd = await client.spawn(id, "echo begun; exec sleep 20");
    const seen: string[] = [];
    const follow = async () => {
      for await (const ev of client.followCommand(id, cmd.id, { timeoutMs: 700 })) {
        if (ev.type !== "exit") seen.push(ev.text);
      }
    };
    await assert.rejects(follow(), (err: unknown) => {
      assert.ok(err instanceof SessionboxTimeoutError, String(err));
      assert.equal(err.code, "client_timeout");
      return true;
    });
    assert.deepEqual(seen, ["begun\n"]);
    assert.equal((await client.getCommand(id, cmd.id)).running, true);
    const killed = await client.killCommand(id, cmd.id);
    assert.equal(killed.killed, true);
  });

  test("kill ends a running command and answers its final status", async () => {
    const id = uniqueId("bg-kill");
    const cmd = await client.spawn(id, "echo $$ > pid; exec sleep 30");
    await eventually(async () => (await client.exec(id, "test -s pid && echo y")).stdout === "y\n");
    const pid = Number((await client.readText(id, "pid")).trim());
    assert.ok(processAlive(pid));
    const killed = await client.killCommand(id, cmd.id);
    assert.equal(killed.running, false);
    assert.equal(killed.killed, true);
    assert.ok(killed.status && "signal" in killed.status, JSON.stringify(killed.status));
    assert.ok(!processAlive(pid), "the process has ended (host runtime: a host process)");
    // Killing an ended command answers it as it was.
    const again = await client.killCommand(id, cmd.id);
    assert.equal(again.killed, true);
  });

  test("stdin kept open is refused on the host runtime with 503 runtime_unavailable", async () => {
    const id = uniqueId("bg-stdin");
    await assert.rejects(client.spawn(id, "cat", { keepStdinOpen: true }), (err: unknown) => {
      assert.ok(err instanceof ServerError);
      assert.equal(err.status, 503);
      assert.equal(err.code, "runtime_unavailable");
      return true;
    });
    assert.deepEqual(await client.listCommands(id), [], "nothing was started");
    const cmd = await client.spawn(id, "sleep 5");
    await assert.rejects(client.writeStdin(id, cmd.id, "data\n", { close: true }), { status: 503, code: "runtime_unavailable" });
    await assert.rejects(client.closeStdin(id, cmd.id), { status: 503, code: "runtime_unavailable" });
    await client.killCommand(id, cmd.id);
  });

  test("a bad command id is invalid_request, an unknown one not_found", async () => {
    const id = uniqueId("bg-errors");
    await client.openConversation(id);
    await assert.rejects(client.getCommand(id, "bad id"), { status: 400, code: "invalid_request" });
    await assert.rejects(client.getCommand(id, "doesnotexist"), { status: 404, code: "not_found" });
    await assert.rejects(client.killCommand(id, "doesnotexist"), { status: 404, code: "not_found" });
    await assert.rejects(client.listCommands(uniqueId("bg-missing")), { status: 404, code: "not_found" });
  });

  test("destroying the conversation kills its commands", async () => {
    const id = uniqueId("bg-destroy");
    await client.spawn(id, "echo $$ > pid; exec sleep 30");
    await eventually(async () => (await client.exec(id, "test -s pid && echo y")).stdout === "y\n");
    const pid = Number((await client.readText(id, "pid")).trim());
    assert.ok(processAlive(pid), "the command runs (host runtime: a host process)");
    await client.destroyConversation(id);
    await eventually(async () => !processAlive(pid));
    await assert.rejects(client.listCommands(id), { code: "not_found" });
  });
});
