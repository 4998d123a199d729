import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { Client, NotFoundError, SessionboxError, execBytes, type ExecStreamEvent } from "sessionbox";
import { allBytes, startServer, uniqueId, type TestServer } from "./server.js";

let server: TestServer;
let client: Client;

before(async () => {
  server = await startServer();
  client = new Client({ baseUrl: server.baseUrl, apiKey: server.key });
});
after(async () => {
  await server?.stop();
});

describe("exec", () => {
  test("runs a command: exit code, stdout, stderr, cwd, env, stdin", async () => {
    const id = uniqueId("exec");
    const r = await client.exec(id, "echo out; echo err >&2; exit 3");
    assert.equal(r.exit_code, 3);
    assert.deepEqual(r.status, { code: 3 });
    assert.equal(r.stdout, "out\n");
    assert.equal(r.stderr, "err\n");
    assert.equal(r.timed_out, false);
    assert.equal(r.stdout_base64 ?? null, null);

    await client.mkdir(id, "sub/dir");
    const cwd = await client.exec(id, "pwd; echo $GREETING", { cwd: "sub/dir", env: { GREETING: "héllo" } });
    assert.match(cwd.stdout, /\/sub\/dir\nhéllo\n$/);

    const stdin = await client.exec(id, "tr a-z A-Z", { stdin: "hello\n" });
    assert.equal(stdin.stdout, "HELLO\n");
  });

  test("a command creates the conversation, and files persist across calls", async () => {
    const id = uniqueId("exec-persist");
    await client.exec(id, "echo 42 > n.txt");
    const r = await client.exec(id, "cat n.txt");
    assert.equal(r.stdout, "42\n");
    assert.equal((await client.getConversation(id)).usage!.execs, 2);
  });

  test("binary stdin and stdout round-trip all 256 byte values", async () => {
    const id = uniqueId("exec-binary");
    const bytes = allBytes();
    const r = await client.exec(id, "cat", { stdin: bytes });
    assert.equal(r.exit_code, 0);
    assert.equal(typeof r.stdout_base64, "string", "not UTF-8, so the exact bytes come as base64");
    assert.deepEqual(execBytes(r).stdout, bytes);
    assert.ok(r.stdout.includes("\uFFFD"));
    // And back through a file, written by the command.
    const w = await client.exec(id, "cat > bytes.bin && od -An -tx1 bytes.bin | wc -w", { stdin: bytes });
    assert.equal(w.stdout.trim(), "512");
    assert.deepEqual(await client.readFile(id, "bytes.bin"), bytes);
  });

  test("a command past its timeout is 124 and timed_out", async () => {
    const r = await client.exec(uniqueId("exec-timeout"), "sleep 5", { commandTimeoutMs: 300 });
    assert.equal(r.timed_out, true);
    assert.equal(r.exit_code, 124);
  });

  test("output past output_limit is truncated", async () => {
    const r = await client.exec(uniqueId("exec-limit"), "head -c 5000 /dev/zero | tr '\\0' x", { outputLimit: 1000 });
    assert.equal(r.stdout.length, 1000);
    assert.equal(r.stdout_truncated, true);
  });

  test("an unknown option value is refused by the server with invalid_request", async () => {
    await assert.rejects(client.exec(uniqueId("exec-bad"), "true", { commandTimeoutMs: 0 }), (err: unknown) => {
      assert.ok(err instanceof SessionboxError);
      assert.equal(err.code, "invalid_request");
      assert.ok(err.status === 400 || err.status === 422, `status ${err.status}`);
      return true;
    });
  });
});

describe("exec as a stream", () => {
  test("events come in the order the command writes them, then exit", async () => {
    const id = uniqueId("stream");
    const events: ExecStreamEvent[] = [];
    const times: number[] = [];
    const start = Date.now();
    for await (const ev of client.execStream(id, "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three; exit 5")) {
      events.push(ev);
      times.push(Date.now() - start);
    }
    const summary = events.map((e) => (e.type === "exit" ? `exit:${e.exit_code}` : `${e.type}:${e.text}`));
    assert.deepEqual(summary, ["stdout:one\n", "stderr:two\n", "stdout:three\n", "exit:5"]);
    // Streamed as it happens, not all at the end.
    assert.ok(times[1]! - times[0]! >= 200, `events apart in time: ${times.join(",")}`);
    const exit = events.at(-1)!;
    assert.ok(exit.type === "exit" && exit.timed_out === false && exit.duration_ms >= 500);
  });

  test("binary output comes with its exact bytes", async () => {
    const bytes = allBytes();
    const chunks: Uint8Array[] = [];
    for await (const ev of client.execStream(uniqueId("stream-binary"), "cat", { stdin: bytes })) {
      if (ev.type === "stdout") chunks.push(ev.bytes);
    }
    const joined = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
    let o = 0;
    for (const c of chunks) {
      joined.set(c, o);
      o += c.length;
    }
    assert.deepEqual(joined, bytes);
  });

  test("leaving the loop early closes the stream, which kills the command", async () => {
    const id = uniqueId("stream-break");
    for await (const ev of client.execStream(id, "echo started; sleep 2; echo late > late.txt")) {
      assert.equal(ev.type, "stdout");
      break;
    }
    await new Promise((r) => setTimeout(r, 2800));
    const r = await client.exec(id, "test -e late.txt && echo present || echo absent");
    assert.equal(r.stdout, "absent\n");
  });

  test("a command that cannot run ends the stream with the error a JSON exec answers", async () => {
    const id = uniqueId("stream-cwd");
    await assert.rejects(client.exec(id, "true", { cwd: "no/such/dir" }), (err: unknown) => err instanceof NotFoundError && err.code === "not_found");
    const events: ExecStreamEvent[] = [];
    const iterate = async () => {
      for await (const ev of client.execStream(id, "true", { cwd: "no/such/dir" })) events.push(ev);
    };
    await assert.rejects(iterate(), (err: unknown) => {
      assert.ok(err instanceof NotFoundError, String(err));
      assert.equal(err.code, "not_found");
      assert.equal(err.status, 404);
      return true;
    });
    assert.deepEqual(events, []);
  });

  test("bad input is an error before the stream starts", async () => {
    const iterate = async () => {
      for await (const _ of client.execStream("bad id", "true")) {
        // never reached
      }
    };
    await assert.rejects(iterate(), { status: 400, code: "invalid_id" });
  });
});
