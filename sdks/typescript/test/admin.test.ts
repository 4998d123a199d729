import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client, ConflictError, UnprocessableError } from "sessionbox";
import { allBytes, readAll, startServer, uniqueId, type TestServer } from "./server.js";

let server: TestServer;
let client: Client;
let other: Client;

before(async () => {
  server = await startServer();
  client = new Client({ baseUrl: server.baseUrl, apiKey: server.key });
  other = new Client({ baseUrl: server.baseUrl, apiKey: server.otherKey });
});
after(async () => {
  await server?.stop();
});

describe("network policies and the egress log", () => {
  test("tenant policy: default, set, read, refuse a bad rule, delete", async () => {
    const initial = await client.getTenantPolicy();
    assert.equal(initial.profile, "none");
    assert.equal(initial.source, "default");

    const set = await client.setTenantPolicy({ profile: "allowlist", allow: ["*.pypi.org:443", "files.pythonhosted.org:443"], deny: ["evil.pypi.org"] });
    assert.equal(set.source, "tenant");
    assert.equal(set.profile, "allowlist");
    assert.deepEqual(set.allow, ["*.pypi.org:443", "files.pythonhosted.org:443"]);
    assert.deepEqual(set.deny, ["evil.pypi.org"]);
    assert.match(set.hash, /^[0-9a-f]{64}$/);
    assert.deepEqual(await client.getTenantPolicy(), set);
    assert.equal((await other.getTenantPolicy()).source, "default", "another tenant is not affected");

    await assert.rejects(client.setTenantPolicy({ profile: "allowlist", allow: ["169.254.169.254"] }), (err: unknown) => {
      assert.ok(err instanceof UnprocessableError);
      assert.equal(err.status, 422);
      assert.equal(err.code, "invalid_request");
      assert.match(err.message, /169\.254\.169\.254/);
      return true;
    });
    assert.deepEqual(await client.getTenantPolicy(), set, "nothing stored on a refusal");

    const removed = await client.deleteTenantPolicy();
    assert.equal(removed.source, "default");
    assert.equal(removed.profile, "none");
  });

  test("conversation policy wins over the tenant's, without creating the conversation", async () => {
    const id = uniqueId("policy");
    await client.setTenantPolicy({ profile: "allowlist", allow: ["example.com:443"] });
    try {
      assert.equal((await client.getConversationPolicy(id)).source, "tenant");
      const own = await client.setConversationPolicy(id, { profile: "none" });
      assert.equal(own.source, "conversation");
      assert.equal(own.profile, "none");
      assert.equal((await client.getConversationPolicy(id)).source, "conversation");
      await assert.rejects(client.getConversation(id), { code: "not_found" }, "not created");
      const back = await client.deleteConversationPolicy(id);
      assert.equal(back.source, "tenant");
      assert.deepEqual(back.allow, ["example.com:443"]);
    } finally {
      await client.deleteTenantPolicy();
    }
  });

  test("the egress log answers lists (empty on the host runtime, which has no gateway)", async () => {
    const id = uniqueId("egress");
    await client.exec(id, "true");
    assert.deepEqual(await client.egressLog({ since: "1h", limit: 10 }), []);
    assert.deepEqual(await client.conversationEgressLog(id, { limit: 5 }), []);
    await assert.rejects(client.egressLog({ limit: 0 }), (err: unknown) => {
      assert.equal((err as { code: string }).code, "invalid_request");
      return true;
    });
  });
});

describe("skills", () => {
  test("list and load the tenant's skills", async () => {
    const skills = await client.listSkills();
    assert.deepEqual(skills, [{ name: "hello-world", description: "Says hello to the world." }]);
    assert.deepEqual(await other.listSkills(), [], "another tenant has none");
    const id = uniqueId("skills");
    await client.openConversation(id);
    const skill = await client.loadSkill(id, "hello-world");
    assert.equal(skill.name, "hello-world");
    assert.match(skill.body, /Run `echo hello`/);
    assert.ok(!skill.body.includes("description:"), "front matter removed");
    assert.ok(skill.base_path.length > 0);
    const listing = await client.exec(id, `cat ${JSON.stringify(skill.base_path + "/SKILL.md")}`);
    assert.match(listing.stdout, /name: hello-world/, "the skill is where base_path says");
    await assert.rejects(client.loadSkill(id, "no-such-skill"), { status: 404, code: "not_found" });
  });
});

describe("snapshots, fork and templates", () => {
  // Tenant `other` has no skills, so its workspaces hold only what the test writes.
  let snapClient: Client;
  before(() => {
    snapClient = other;
  });

  test("snapshot, list, get, restore, fork, export/import, templates, delete", async () => {
    const id = uniqueId("snap");
    const name = uniqueId("snapshot");
    await snapClient.writeFile(id, "data/all.bin", allBytes());
    await snapClient.writeText(id, "notes.txt", "version 1\n");

    const snap = await snapClient.createSnapshot(id, name, { keepSeconds: 0 });
    assert.equal(snap.name, name);
    assert.equal(snap.origin, id);
    assert.equal(snap.files, 2);
    assert.equal(snap.bytes, 512 + 10);
    assert.equal(snap.expires_at ?? null, null, "keep_seconds 0: kept until deleted");
    await assert.rejects(snapClient.createSnapshot(id, name), (err: unknown) => err instanceof ConflictError && err.code === "already_exists");
    assert.ok((await snapClient.listSnapshots()).some((s) => s.name === name));
    assert.deepEqual(await client.listSnapshots(), [], "another tenant sees none");
    assert.equal((await snapClient.getSnapshot(name)).bytes, snap.bytes);

    // Restore replaces the workspace: later changes go.
    await snapClient.writeText(id, "notes.txt", "version 2\n");
    await snapClient.writeText(id, "later.txt", "later");
    const restored = await snapClient.restoreSnapshot(id, name);
    assert.equal(restored.conversation, id);
    assert.equal(restored.files, 2);
    assert.equal(await snapClient.readText(id, "notes.txt"), "version 1\n");
    await assert.rejects(snapClient.readText(id, "later.txt"), { code: "not_found" });

    // Fork a live conversation: a copy that shares nothing writable.
    const forked = uniqueId("fork");
    const f = await snapClient.forkConversation(id, forked);
    assert.equal(f.conversation, forked);
    await snapClient.writeText(forked, "notes.txt", "forked\n");
    assert.equal(await snapClient.readText(id, "notes.txt"), "version 1\n");
    assert.deepEqual(await snapClient.readFile(forked, "data/all.bin"), allBytes());
    await assert.rejects(snapClient.forkConversation(id, forked), { status: 409, code: "already_exists" });

    // Fork from the snapshot.
    const fromSnap = uniqueId("from-snap");
    await snapClient.forkSnapshot(name, fromSnap);
    assert.equal(await snapClient.readText(fromSnap, "notes.txt"), "version 1\n");

    // Export, and import under another name (the zstd archive, and a plain tar).
    const archive = await snapClient.exportSnapshotBytes(name);
    assert.deepEqual([...archive.subarray(0, 4)], [0x28, 0xb5, 0x2f, 0xfd], "zstd magic");
    const streamed = await readAll(await snapClient.exportSnapshot(name));
    assert.deepEqual(streamed, archive);
    const imported = await snapClient.importSnapshot(`${name}-imported`, archive, { keepSeconds: 3600 });
    assert.equal(imported.origin ?? null, null);
    assert.equal(imported.runtime, "import");
    assert.equal(imported.bytes, snap.bytes);
    assert.ok(imported.expires_at);

    const dir = mkdtempSync(join(tmpdir(), "sessionbox-tar-"));
    try {
      mkdirSync(join(dir, "t"));
      writeFileSync(join(dir, "t", "hello.txt"), "from a tar\n");
      execFileSync("tar", ["-cf", join(dir, "a.tar"), "-C", join(dir, "t"), "."]);
      const tar = new Uint8Array(readFileSync(join(dir, "a.tar")));
      const fromTar = await snapClient.importSnapshot(`${name}-tar`, new Blob([tar]));
      assert.equal(fromTar.files, 1);
      const t = uniqueId("from-tar");
      await snapClient.forkSnapshot(`${name}-tar`, t);
      assert.equal(await snapClient.readText(t, "hello.txt"), "from a tar\n");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    await assert.rejects(snapClient.importSnapshot(`${name}-bad`, new TextEncoder().encode("not an archive")), {
      status: 400,
      code: "invalid_request",
    });

    // Templates.
    const tpl = uniqueId("tpl");
    const set = await snapClient.setTemplate(tpl, `${name}-imported`);
    assert.equal(set.snapshot, `${name}-imported`);
    assert.ok((await snapClient.listTemplates()).some((t) => t.name === tpl && t.snapshot === `${name}-imported`));
    const fromTpl = uniqueId("from-tpl");
    await snapClient.forkTemplate(tpl, fromTpl);
    assert.deepEqual(await snapClient.readFile(fromTpl, "data/all.bin"), allBytes());
    await assert.rejects(snapClient.deleteSnapshot(`${name}-imported`), { status: 409 }, "a template names it");
    await snapClient.deleteTemplate(tpl);
    assert.ok(!(await snapClient.listTemplates()).some((t) => t.name === tpl));

    // Delete, also when absent.
    for (const n of [name, `${name}-imported`, `${name}-tar`]) await snapClient.deleteSnapshot(n);
    await snapClient.deleteSnapshot(name);
    await assert.rejects(snapClient.getSnapshot(name), { status: 404, code: "not_found" });
    assert.ok(!(await snapClient.listSnapshots()).some((s) => s.name.startsWith(name)));
  });

  test("a bad snapshot name is invalid_request; an unknown one not_found", async () => {
    await assert.rejects(snapClient.getSnapshot("bad name"), { status: 400, code: "invalid_request" });
    await assert.rejects(snapClient.forkSnapshot("no-such-snapshot", uniqueId("x")), { status: 404, code: "not_found" });
    await assert.rejects(snapClient.restoreSnapshot(uniqueId("nobody"), "no-such-snapshot"), { status: 404 });
  });
});
