import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import {
  Client,
  ConflictError,
  ForbiddenError,
  NotFoundError,
  RangeNotSatisfiableError,
  type WatchStreamItem,
} from "sessionbox";
import { allBytes, readAll, startServer, uniqueId, type TestServer } from "./server.js";

let server: TestServer;
let client: Client;

before(async () => {
  server = await startServer();
  client = new Client({ baseUrl: server.baseUrl, apiKey: server.key });
});
after(async () => {
  await server?.stop();
});

async function workspace(id: string): Promise<string> {
  return (await client.openConversation(id)).workspace_root;
}

describe("files", () => {
  test("bytes round-trip all 256 values, and land on disk exactly", async () => {
    const id = uniqueId("files-bytes");
    const bytes = allBytes();
    await client.writeFile(id, "bin/all.bin", bytes);
    const root = await workspace(id);
    assert.deepEqual(new Uint8Array(readFileSync(join(root, "bin/all.bin"))), bytes);
    assert.deepEqual(await client.readFile(id, "bin/all.bin"), bytes);
    const sum = await client.exec(id, "od -An -tu1 -v bin/all.bin | tr -s ' ' '\\n' | grep -c .");
    assert.equal(sum.stdout.trim(), "512");
    // An ArrayBuffer and a Blob are bodies too.
    await client.writeFile(id, "ab.bin", bytes.buffer.slice(0));
    assert.deepEqual(await client.readFile(id, "ab.bin"), bytes);
    await client.writeFile(id, "blob.bin", new Blob([bytes]));
    assert.deepEqual(await client.readFile(id, "blob.bin"), bytes);
  });

  test("text round-trips as UTF-8, in paths with spaces and unusual characters", async () => {
    const id = uniqueId("files-text");
    const text = "héllo wörld ✓ 🎉\nline 2\n";
    const path = "dir with space/a+b&c?d#e%.txt";
    await client.writeText(id, path, text);
    assert.equal(await client.readText(id, path), text);
    const root = await workspace(id);
    assert.equal(readFileSync(join(root, path), "utf8"), text);
    // An absolute path under the workspace root names the same file.
    assert.equal(await client.readText(id, join(root, path)), text);
  });

  test("ranges, and a range past the end is 416", async () => {
    const id = uniqueId("files-range");
    await client.writeText(id, "r.txt", "0123456789");
    assert.equal(await client.readText(id, "r.txt", { range: { start: 2, end: 5 } }), "2345");
    assert.equal(await client.readText(id, "r.txt", { range: { start: 7 } }), "789");
    await assert.rejects(client.readFile(id, "r.txt", { range: { start: 100, end: 200 } }), (err: unknown) => {
      assert.ok(err instanceof RangeNotSatisfiableError);
      assert.equal(err.code, "range_not_satisfiable");
      assert.equal(err.status, 416);
      return true;
    });
  });

  test("streaming download and upload", async () => {
    const id = uniqueId("files-stream");
    const size = 3 * 1024 * 1024 + 17;
    const big = new Uint8Array(size);
    for (let i = 0; i < size; i++) big[i] = (i * 31 + (i >> 8)) & 0xff;
    // Upload from a stream, in uneven chunks.
    let offset = 0;
    const stream = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (offset >= size) {
          controller.close();
          return;
        }
        const n = Math.min(65_537, size - offset);
        controller.enqueue(big.slice(offset, offset + n));
        offset += n;
      },
    });
    await client.uploadFile(id, "big.bin", stream);
    const st = await client.stat(id, "big.bin");
    assert.equal(st.size, size);
    const download = await client.downloadFile(id, "big.bin");
    assert.ok(download instanceof ReadableStream);
    assert.deepEqual(await readAll(download), big);
    // bytes through uploadFile too
    await client.uploadFile(id, "small.bin", allBytes());
    assert.deepEqual(await readAll(await client.downloadFile(id, "small.bin")), allBytes());
    // A download cancelled early is fine.
    const partial = await client.downloadFile(id, "big.bin");
    const reader = partial.getReader();
    const first = await reader.read();
    assert.ok(first.value && first.value.length > 0);
    await reader.cancel();
  });

  test("multipart upload of several files", async () => {
    const id = uniqueId("files-upload");
    const written = await client.uploadFiles(id, [
      { path: "up/a.txt", data: "alpha" },
      { path: "up/b.bin", data: allBytes() },
      { path: "up/nested/c.txt", data: new Blob(["gamma"]) },
    ]);
    assert.deepEqual(
      written.map((f) => [f.path, f.bytes]),
      [
        ["up/a.txt", 5],
        ["up/b.bin", 512],
        ["up/nested/c.txt", 5],
      ],
    );
    assert.equal(await client.readText(id, "up/a.txt"), "alpha");
    assert.deepEqual(await client.readFile(id, "up/b.bin"), allBytes());
    assert.equal(await client.readText(id, "up/nested/c.txt"), "gamma");
    await assert.rejects(client.uploadFiles(id, [{ path: "ok.txt", data: "y" }, { path: "../escape.txt", data: "x" }]), {
      status: 403,
      code: "outside_workspace",
    });
    await assert.rejects(client.readText(id, "ok.txt"), NotFoundError, "a bad path refuses the whole upload");
  });

  test("edit: unique replacement, not unique is 409, replaceAll", async () => {
    const id = uniqueId("files-edit");
    await client.writeText(id, "e.txt", "one two two three\n");
    assert.equal(await client.editFile(id, "e.txt", "one", "ONE"), 1);
    await assert.rejects(client.editFile(id, "e.txt", "two", "2"), (err: unknown) => {
      assert.ok(err instanceof ConflictError);
      assert.equal(err.code, "conflict");
      return true;
    });
    assert.equal(await client.editFile(id, "e.txt", "two", "2", { replaceAll: true }), 2);
    assert.equal(await client.readText(id, "e.txt"), "ONE 2 2 three\n");
    await assert.rejects(client.editFile(id, "nope.txt", "a", "b"), { code: "not_found" });
  });

  test("ls, stat, glob, grep, mkdir", async () => {
    const id = uniqueId("files-fs");
    await client.mkdir(id, "src/lib");
    await client.writeText(id, "src/main.ts", "const Answer = 42;\nconsole.log(answer);\n");
    await client.writeText(id, "src/lib/util.ts", "export const answer = 41 + 1;\n");
    await client.writeText(id, "README.md", "no answers here\n");
    await client.exec(id, "chmod 0750 src/main.ts");

    // (`.skills` holds the tenant's skills on the host runtime.)
    const root = (await client.ls(id)).filter((e) => !e.name.startsWith("."));
    assert.deepEqual(root.map((e) => [e.name, e.kind]).sort(), [
      ["README.md", "file"],
      ["src", "directory"],
    ]);
    const src = await client.ls(id, "src");
    const main = src.find((e) => e.name === "main.ts")!;
    assert.equal(main.size, 40);

    const st = await client.stat(id, "src/main.ts");
    assert.equal(st.kind, "file");
    assert.equal(st.mode, "0750");
    assert.equal(st.size, 40);
    assert.ok(Math.abs(st.modified_unix - Date.now() / 1000) < 120);
    assert.equal((await client.stat(id, "src/lib")).kind, "directory");

    assert.deepEqual((await client.glob(id, "src/**/*.ts")).sort(), ["src/lib/util.ts", "src/main.ts"]);
    assert.deepEqual(await client.glob(id, "*.nothing"), []);

    const matches = await client.grep(id, "answer");
    assert.deepEqual(matches.map((m) => `${m.path}:${m.line_number}`).sort(), [
      "README.md:1",
      "src/lib/util.ts:1",
      "src/main.ts:2",
    ]);
    const ci = await client.grep(id, "^const answer", { caseInsensitive: true, path: "src", glob: "**/*.ts" });
    assert.deepEqual(ci.map((m) => m.line), ["const Answer = 42;"]);
    assert.equal((await client.grep(id, "answer", { path: "src", maxMatches: 1 })).length, 1);
  });

  test("remove: files, a non-empty directory needs recursive", async () => {
    const id = uniqueId("files-rm");
    await client.writeText(id, "d/x/y.txt", "y");
    const rootDir = await workspace(id);
    await assert.rejects(client.remove(id, "d"), (err: unknown) => err instanceof ConflictError && err.status === 409);
    assert.ok(existsSync(join(rootDir, "d/x/y.txt")));
    await client.remove(id, "d/x/y.txt");
    assert.ok(!existsSync(join(rootDir, "d/x/y.txt")));
    await client.writeText(id, "d/x/z.txt", "z");
    await client.remove(id, "d", { recursive: true });
    assert.ok(!existsSync(join(rootDir, "d")));
    await assert.rejects(client.remove(id, "d"), { status: 404, code: "not_found" });
  });

  test("a missing file is 404 not_found; a path outside the workspace is 403 outside_workspace", async () => {
    const id = uniqueId("files-errors");
    await client.openConversation(id);
    await assert.rejects(client.readFile(id, "missing.txt"), (err: unknown) => {
      assert.ok(err instanceof NotFoundError);
      assert.equal(err.code, "not_found");
      assert.equal(err.status, 404);
      return true;
    });
    await assert.rejects(client.downloadFile(id, "missing.txt"), { code: "not_found" });
    await assert.rejects(client.stat(id, "missing.txt"), { code: "not_found" });
    await assert.rejects(client.readFile(id, "/etc/passwd"), (err: unknown) => {
      assert.ok(err instanceof ForbiddenError);
      assert.equal(err.code, "outside_workspace");
      return true;
    });
    await assert.rejects(client.writeText(id, "../../escape.txt", "x"), { status: 403, code: "outside_workspace" });
    await assert.rejects(client.ls(uniqueId("files-nobody")), { code: "not_found" });
  });

  test("watch reports changes beneath a directory", async () => {
    // The write is atomic (a temporary file renamed), so the file appears as created or moved in.
    const landed = (e: WatchStreamItem) =>
      (e.kind === "created" && e.path.endsWith("/w/new.txt")) || (e.kind === "moved" && e.to.endsWith("/w/new.txt"));
    const id = uniqueId("files-watch");
    await client.mkdir(id, "w");
    const controller = new AbortController();
    const events: WatchStreamItem[] = [];
    const watching = (async () => {
      for await (const ev of client.watch(id, { path: "w", signal: controller.signal })) {
        events.push(ev);
        if (ev.kind === "ready") await client.writeText(id, "w/new.txt", "x");
        if (landed(ev)) break;
      }
    })();
    const timer = setTimeout(() => controller.abort(), 10_000);
    await watching;
    clearTimeout(timer);
    assert.equal(events[0]!.kind, "ready");
    assert.ok(events.some(landed), JSON.stringify(events));
  });

  test("a preview link names the port", async () => {
    const id = uniqueId("files-preview");
    await client.openConversation(id);
    const link = await client.createPreviewLink(id, 8000, { ttlSecs: 60 });
    assert.match(link.path, /^\/v1\/previews\/[^/]+\/$/);
    assert.equal(link.port, 8000);
    assert.ok(Date.parse(link.expires_at) - Date.now() <= 61_000);
  });
});
