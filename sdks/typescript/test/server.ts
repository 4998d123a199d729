// Starts a real `sessionbox serve` (the binary from $SESSIONBOX_BIN, default `sessionbox` on the
// PATH) on a free loopback port, with a temporary data directory, the `host` runtime and API keys
// for two tenants; stops it and removes everything it made.
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { Client } from "sessionbox";
import { mkdtempSync, mkdirSync, readFileSync, readdirSync, readlinkSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const BIN = process.env.SESSIONBOX_BIN || "sessionbox";

export interface TestServer {
  /** `http://127.0.0.1:PORT` */
  baseUrl: string;
  /** A key of tenant `acme`. */
  key: string;
  /** A key of tenant `other`. */
  otherKey: string;
  /** The data directory. */
  dataDir: string;
  /** Stops the server and removes the data directory. */
  stop(): Promise<void>;
}

export const TTL_SECS = 3600;

function sessionbox(dataDir: string, args: string[]): string {
  return execFileSync(BIN, ["--data-dir", dataDir, ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] }).trim();
}

export async function startServer(): Promise<TestServer> {
  const dataDir = mkdtempSync(join(tmpdir(), "sessionbox-ts-"));
  const skills = join(dataDir, "skills-src");
  mkdirSync(join(skills, "hello-world"), { recursive: true });
  writeFileSync(
    join(skills, "hello-world", "SKILL.md"),
    "---\nname: hello-world\ndescription: Says hello to the world.\n---\n# Hello\n\nRun `echo hello`.\n",
  );
  writeFileSync(
    join(dataDir, "sessionbox.toml"),
    [
      'runtime = "host"',
      "[lifecycle]",
      `ttl_secs = ${TTL_SECS}`,
      "[skills.tenants]",
      `acme = [${JSON.stringify(skills)}]`,
      "",
    ].join("\n"),
  );
  const key = sessionbox(dataDir, ["keys", "create", "--tenant", "acme", "--label", "ts-sdk-test"]);
  const otherKey = sessionbox(dataDir, ["keys", "create", "--tenant", "other"]);
  if (!/^sbk_[0-9a-f]{16}_[0-9a-f]{64}$/.test(key)) throw new Error(`unexpected key: ${key}`);

  const child: ChildProcess = spawn(
    BIN,
    ["--data-dir", dataDir, "serve", "--listen", "127.0.0.1:0", "--gc-interval-secs", "0"],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let stderr = "";
  child.stderr!.setEncoding("utf8").on("data", (d: string) => (stderr += d));
  const baseUrl = await new Promise<string>((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`serve did not start within 15 s: ${stderr}`)), 15_000);
    child.stdout!.setEncoding("utf8").on("data", (d: string) => {
      out += d;
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`serve exited with ${code}: ${stderr}`));
    });
  });

  let stopped = false;
  return {
    baseUrl,
    key,
    otherKey,
    dataDir,
    async stop() {
      if (stopped) return;
      stopped = true;
      // Destroy every conversation left (which kills their processes), then check that no
      // process is left in the data directory.
      if (child.exitCode === null) {
        for (const apiKey of [key, otherKey]) {
          const c = new Client({ baseUrl, apiKey });
          const ids: string[] = [];
          for await (const conv of c.conversations()) ids.push(conv.id);
          for (const id of ids) await c.destroyConversation(id);
          const left = await c.listConversations();
          if (left.conversations.length > 0) throw new Error(`conversations left: ${JSON.stringify(left)}`);
        }
        const deadline = Date.now() + 10_000;
        let stray = processesIn(dataDir);
        while (stray.length > 0 && Date.now() < deadline) {
          await new Promise((r) => setTimeout(r, 100));
          stray = processesIn(dataDir);
        }
        if (stray.length > 0) throw new Error(`processes left in ${dataDir}: ${stray.join(", ")}`);
      }
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
        child.kill("SIGTERM");
        const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
        await exited;
        clearTimeout(timer);
      }
      rmSync(dataDir, { recursive: true, force: true });
      if (existsSync(dataDir)) throw new Error(`could not remove ${dataDir}`);
    },
  };
}

/** Processes (not zombies) whose working directory is inside `dir`, other than the server. */
function processesIn(dir: string): string[] {
  const out: string[] = [];
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid) || !processAlive(Number(pid))) continue;
    try {
      const cwd = readlinkSync(`/proc/${pid}/cwd`);
      if (cwd === dir || cwd.startsWith(dir + "/")) out.push(`${pid} (${readFileSync(`/proc/${pid}/cmdline`, "utf8").replace(/\0/g, " ").trim()})`);
    } catch {
      // gone, or not ours to read
    }
  }
  return out;
}

/** True while a process runs (not ended, and not a zombie waiting to be reaped). Linux only. */
export function processAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
    return state !== "Z" && state !== "X";
  } catch {
    return false;
  }
}

/** A conversation id unique to this run. */
let counter = 0;
export function uniqueId(prefix: string): string {
  counter += 1;
  return `${prefix}-${process.pid}-${counter}`;
}

/** Reads a stream to its end. */
export async function readAll(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  let total = 0;
  const reader = stream.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    total += value.length;
  }
  const out = new Uint8Array(total);
  let offset = 0;
  for (const c of chunks) {
    out.set(c, offset);
    offset += c.length;
  }
  return out;
}

/** All 256 byte values, twice, in an order that is not sorted. */
export function allBytes(): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(512);
  for (let i = 0; i < 256; i++) {
    out[i] = i;
    out[511 - i] = i;
  }
  return out;
}

/** Polls until `check` answers true or the deadline passes. */
export async function eventually(check: () => Promise<boolean>, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("condition not met in time");
}
