import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import {
  BadRequestError,
  Client,
  NotFoundError,
  SessionboxConnectionError,
  SessionboxError,
  SessionboxTimeoutError,
  UnauthorizedError,
} from "sessionbox";
import { TTL_SECS, startServer, uniqueId, type TestServer } from "./server.js";

let server: TestServer;
let client: Client;

before(async () => {
  server = await startServer();
  client = new Client({ baseUrl: server.baseUrl, apiKey: server.key });
});
after(async () => {
  await server?.stop();
});

describe("server", () => {
  test("health, ready, metrics and the OpenAPI document", async () => {
    assert.deepEqual(await new Client({ baseUrl: server.baseUrl }).health(), { status: "ok" });
    const ready = await client.ready();
    assert.equal(ready.status, "ready");
    const metrics = await client.metrics();
    assert.match(metrics, /sessionbox_http_requests_total/);
    const doc = await new Client({ baseUrl: server.baseUrl + "/" }).openapi();
    assert.equal(doc.openapi, "3.1.0");
    assert.ok((doc.paths as Record<string, unknown>)["/v1/conversations/{id}/exec"]);
  });

  test("the checked-in OpenAPI document (the generated types' source) is the server's", async () => {
    const live = await client.openapi();
    const checkedIn = JSON.parse(readFileSync(new URL("../openapi/openapi.json", import.meta.url), "utf8"));
    assert.deepEqual(live, checkedIn, "run `npm run generate -- <server>/v1/openapi.json`");
  });

  test("a wrong key is 401 unauthorized, as is no key", async () => {
    const wrong = new Client({ baseUrl: server.baseUrl, apiKey: "sbk_0000000000000000_" + "0".repeat(64) });
    await assert.rejects(wrong.listConversations(), (err: unknown) => {
      assert.ok(err instanceof UnauthorizedError);
      assert.ok(err instanceof SessionboxError);
      assert.equal(err.status, 401);
      assert.equal(err.code, "unauthorized");
      assert.ok(err.message.length > 0);
      return true;
    });
    await assert.rejects(new Client({ baseUrl: server.baseUrl }).metrics(), { status: 401, code: "unauthorized" });
  });

  test("no server is a connection error with status 0", async () => {
    const nowhere = new Client({ baseUrl: "http://127.0.0.1:9", apiKey: server.key });
    await assert.rejects(nowhere.health(), (err: unknown) => {
      assert.ok(err instanceof SessionboxConnectionError);
      assert.equal(err.code, "connection_error");
      assert.equal(err.status, 0);
      return true;
    });
  });

  test("the baseUrl is required", () => {
    assert.throws(() => new Client({ baseUrl: "" }), TypeError);
  });
});

describe("conversations", () => {
  test("open creates once, then opens; get shows it with usage", async () => {
    const id = uniqueId("open");
    const first = await client.openConversation(id);
    assert.equal(first.created, true);
    assert.equal(first.conversation.id, id);
    assert.equal(first.conversation.state, "active");
    assert.equal(first.conversation.runtime, "host");
    assert.match(first.key, /^[0-9a-f]{64}$/);
    assert.ok(existsSync(first.workspace_root), "the workspace exists on the host");
    const second = await client.createConversation(id);
    assert.equal(second.created, false);
    assert.equal(second.key, first.key);

    const got = await client.getConversation(id);
    assert.equal(got.id, id);
    assert.ok(got.usage, "usage is shown by get");
    assert.ok((got.usage!.by_operation["open"] ?? 0) >= 1, JSON.stringify(got.usage));
    assert.ok(got.usage!.operations >= 1);
  });

  test("list pages through every conversation of the tenant, and only its own", async () => {
    const ids = [uniqueId("list"), uniqueId("list"), uniqueId("list")];
    for (const id of ids) await client.openConversation(id);
    const other = new Client({ baseUrl: server.baseUrl, apiKey: server.otherKey });
    const otherId = uniqueId("other-tenant");
    await other.openConversation(otherId);

    const page = await client.listConversations({ limit: 1 });
    assert.equal(page.conversations.length, 1);
    assert.equal(typeof page.next_cursor, "string");
    const next = await client.listConversations({ limit: 1, cursor: page.next_cursor! });
    assert.notEqual(next.conversations[0]!.id, page.conversations[0]!.id);

    const all: string[] = [];
    for await (const c of client.conversations({ limit: 2 })) all.push(c.id);
    for (const id of ids) assert.ok(all.includes(id), `${id} listed`);
    assert.ok(!all.includes(otherId), "another tenant's conversation is not listed");
    assert.deepEqual([...all].sort(), all, "listed by id");
    await assert.rejects(client.getConversation(otherId), NotFoundError);
  });

  test("renew moves the expiry forward and does not create", async () => {
    const id = uniqueId("renew");
    const opened = await client.openConversation(id);
    const before = Date.parse(opened.conversation.expires_at!);
    assert.ok(Math.abs(before - (Date.parse(opened.conversation.last_used_at) + TTL_SECS * 1000)) < 5000);
    await new Promise((r) => setTimeout(r, 1200)); // last use is written at most once a second
    const renewed = await client.renewConversation(id);
    const after = Date.parse(renewed.expires_at!);
    assert.ok(after > before, `expiry moved: ${renewed.expires_at} > ${opened.conversation.expires_at}`);
    const missing = uniqueId("renew-missing");
    await assert.rejects(client.renewConversation(missing), { code: "not_found", status: 404 });
    await assert.rejects(client.getConversation(missing), NotFoundError, "renew created nothing");
  });

  test("disk usage is null on the host runtime (no quota)", async () => {
    const id = uniqueId("disk");
    await client.openConversation(id);
    assert.equal(await client.diskUsage(id), null);
    await assert.rejects(client.diskUsage(uniqueId("disk-missing")), { code: "not_found" });
  });

  test("destroy removes the workspace and the record; destroying again succeeds", async () => {
    const id = uniqueId("destroy");
    const opened = await client.openConversation(id);
    await client.writeText(id, "a.txt", "x");
    assert.ok(existsSync(opened.workspace_root));
    await client.destroyConversation(id);
    assert.ok(!existsSync(opened.workspace_root), "the workspace is gone");
    await assert.rejects(client.getConversation(id), { status: 404, code: "not_found" });
    await client.destroyConversation(id);
    const again = await client.openConversation(id);
    assert.equal(again.created, true);
    await assert.rejects(client.readText(id, "a.txt"), { code: "not_found" });
  });

  test("an invalid conversation id is 400 invalid_id and creates nothing", async () => {
    for (const bad of ["bad id", "-leading", "x".repeat(129), "a/b"]) {
      await assert.rejects(client.openConversation(bad), (err: unknown) => {
        assert.ok(err instanceof BadRequestError, `${bad}: ${String(err)}`);
        assert.equal(err.status, 400);
        assert.equal(err.code, "invalid_id");
        return true;
      });
    }
    const all: string[] = [];
    for await (const c of client.conversations()) all.push(c.id);
    assert.ok(!all.some((id) => id.includes("bad") || id.includes("leading")));
  });

  test("a client timeout aborts the request with SessionboxTimeoutError", async () => {
    const id = uniqueId("timeout");
    const quick = new Client({ baseUrl: server.baseUrl, apiKey: server.key, timeoutMs: 300 });
    const started = Date.now();
    await assert.rejects(quick.exec(id, "sleep 3"), (err: unknown) => {
      assert.ok(err instanceof SessionboxTimeoutError, String(err));
      assert.equal(err.code, "client_timeout");
      assert.equal(err.status, 0);
      return true;
    });
    assert.ok(Date.now() - started < 2500);
    // A per-call timeout wins over the client's.
    const r = await quick.exec(id, "sleep 0.5; echo done", { timeoutMs: 10_000 });
    assert.equal(r.stdout, "done\n");
  });

  test("an AbortSignal cancels a request and rejects with its reason", async () => {
    const controller = new AbortController();
    const pending = client.exec(uniqueId("abort"), "sleep 3");
    setTimeout(() => controller.abort(new Error("stop it")), 200);
    const aborted = client.exec(uniqueId("abort"), "sleep 3", { signal: controller.signal });
    await assert.rejects(aborted, /stop it/);
    const r = await pending;
    assert.equal(r.exit_code, 0);
  });
});
