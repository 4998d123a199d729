import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { Client, ConversationClient, NotFoundError } from "sessionbox";
import { allBytes, eventually, readAll, startServer, uniqueId, type TestServer } from "./server.js";

let server: TestServer;
let client: Client;

before(async () => {
  server = await startServer();
  client = new Client({ baseUrl: server.baseUrl, apiKey: server.key });
});
after(async () => {
  await server?.stop();
});

describe("a conversation bound to its id", () => {
  test("every method acts on that conversation", async () => {
    const id = uniqueId("handle");
    const chat = client.conversation(id);
    assert.ok(chat instanceof ConversationClient);
    assert.equal(chat.id, id);
    await assert.rejects(chat.get(), NotFoundError, "making the handle sent nothing");

    const opened = await chat.open();
    assert.equal(opened.created, true);
    assert.equal((await chat.get()).id, id);
    assert.ok((await chat.renew()).expires_at);
    assert.equal(await chat.diskUsage(), null);

    // exec
    assert.equal((await chat.exec("echo hi")).stdout, "hi\n");
    const streamed: string[] = [];
    for await (const ev of chat.execStream("echo a; echo b >&2")) streamed.push(ev.type);
    assert.deepEqual(streamed.at(-1), "exit");

    // background commands
    const cmd = await chat.spawn("echo bg; exec sleep 20");
    assert.ok((await chat.listCommands()).some((c) => c.id === cmd.id));
    assert.equal((await chat.getCommand(cmd.id)).running, true);
    await eventually(async () => (await chat.commandLogs(cmd.id)).stdout.text === "bg\n");
    const followed = chat.followCommand(cmd.id);
    const first = await followed.next();
    assert.equal(first.value && first.value.type === "stdout" && first.value.text, "bg\n");
    await followed.return(undefined);
    await assert.rejects(chat.writeStdin(cmd.id, "x"), { code: "runtime_unavailable" });
    await assert.rejects(chat.closeStdin(cmd.id), { code: "runtime_unavailable" });
    assert.equal((await chat.killCommand(cmd.id)).killed, true);

    // files
    await chat.writeFile("b.bin", allBytes());
    assert.deepEqual(await chat.readFile("b.bin"), allBytes());
    assert.deepEqual(await readAll(await chat.downloadFile("b.bin")), allBytes());
    await chat.writeText("t.txt", "one one");
    assert.equal(await chat.readText("t.txt"), "one one");
    await chat.uploadFile("s.txt", new Blob(["streamed"]).stream());
    assert.equal(await chat.readText("s.txt"), "streamed");
    assert.deepEqual((await chat.uploadFiles([{ path: "m/u.txt", data: "u" }])).map((f) => f.path), ["m/u.txt"]);
    assert.equal(await chat.editFile("t.txt", "one", "two", { replaceAll: true }), 2);
    assert.equal(await chat.readText("t.txt"), "two two");
    await chat.mkdir("d/e");
    assert.ok((await chat.ls()).some((e) => e.name === "d" && e.kind === "directory"));
    assert.deepEqual(await chat.glob("m/*.txt"), ["m/u.txt"]);
    assert.deepEqual((await chat.grep("two")).map((m) => m.path), ["t.txt"]);
    assert.equal((await chat.stat("t.txt")).size, 7);
    await chat.remove("d", { recursive: true });
    await assert.rejects(chat.stat("d"), NotFoundError);
    const watch = chat.watch();
    assert.equal((await watch.next()).value?.kind, "ready");
    await watch.return(undefined);
    assert.equal((await chat.createPreviewLink(3000)).port, 3000);

    // policy, egress, skills
    assert.equal((await chat.setPolicy({ profile: "none" })).source, "conversation");
    assert.equal((await chat.getPolicy()).source, "conversation");
    assert.equal((await chat.deletePolicy()).source, "default");
    assert.deepEqual(await chat.egressLog(), []);
    assert.equal((await chat.loadSkill("hello-world")).name, "hello-world");

    // snapshots and fork
    const snap = uniqueId("handle-snap");
    assert.equal((await chat.snapshot(snap)).origin, id);
    await chat.writeText("t.txt", "changed");
    assert.equal((await chat.restore(snap)).conversation, id);
    assert.equal(await chat.readText("t.txt"), "two two");
    const copy = await chat.fork(uniqueId("handle-fork"));
    assert.ok(copy instanceof ConversationClient);
    assert.equal(await copy.readText("t.txt"), "two two");
    await client.deleteSnapshot(snap);

    // destroy
    await copy.destroy();
    await chat.destroy();
    assert.ok(!existsSync(opened.workspace_root));
    await assert.rejects(chat.get(), NotFoundError);
  });
});
