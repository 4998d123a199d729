// typescript-mcp.md: the official MCP TypeScript SDK (@modelcontextprotocol/sdk) against a real
// `sessionbox serve` (runtime host), through the recipe's own functions. No model is used.
// Run: SESSIONBOX_BIN=/path/to/sessionbox node --test --test-concurrency=1 (or ../test.sh).

import assert from 'node:assert/strict';
import { symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import {
  StreamableHTTPClientTransport,
  StreamableHTTPError,
} from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';

import { newDataDir, removeDir, run, startServe, tempDir } from './harness.mjs';
import { connectHttp, connectStdio, disconnect, toolText } from './sessionbox-mcp.mjs';

const NEW_ID = /^mcp-[0-9a-f]{16}$/;
const TOOLS = ['bash', 'edit', 'glob', 'grep', 'ls', 'network', 'preview', 'read', 'skill', 'write'];
const STDIO_TOOLS = TOOLS.filter((name) => name !== 'preview'); // a preview link needs `serve`
// Unicode of one to four UTF-8 bytes, a tab, runs of spaces, an empty line, a final newline.
const TEXT = 'naïve café → ✓ 🚀\n  two  spaces\tand a tab\n\nend\n';

let sb;
before(async () => { sb = await startServe(); });
after(async () => { await sb?.stop(); });

async function call(conn, name, args) {
  return toolText(await conn.client.callTool({ name, arguments: args }));
}

// REST: GET /v1/conversations/{id}/files/{path}, the bytes and the status.
async function restFile(id, path) {
  const r = await fetch(`${sb.url}/v1/conversations/${id}/files/${path}`, {
    headers: { Authorization: `Bearer ${sb.key}` },
  });
  return { status: r.status, body: Buffer.from(await r.arrayBuffer()) };
}

// One raw MCP POST (for what the SDK hides: status codes and bodies of refusals).
async function rawPost(path, message, headers = {}) {
  const r = await fetch(`${sb.url}${path}`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      ...headers,
    },
    body: JSON.stringify(message),
  });
  const text = await r.text();
  return { status: r.status, text };
}

const INITIALIZE = {
  jsonrpc: '2.0', id: 1, method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '0' } },
};

test('tools/list gives the tools, each with a description and an input schema', async () => {
  const conn = await connectHttp(sb.url, sb.key, 'ts-tools');
  try {
    assert.equal(conn.client.getServerVersion()?.name, 'sessionbox');
    const { tools } = await conn.client.listTools();
    assert.deepEqual(tools.map((t) => t.name).sort(), TOOLS);
    const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
    for (const t of tools) {
      assert.ok(t.description?.length > 10, `${t.name} has no description`);
      assert.equal(t.inputSchema.type, 'object', t.name);
    }
    const required = (name) => [...(byName[name].inputSchema.required ?? [])].sort();
    assert.deepEqual(required('bash'), ['command']);
    assert.deepEqual(required('read'), ['path']);
    assert.deepEqual(required('write'), ['content', 'path']);
    assert.deepEqual(required('edit'), ['new_string', 'old_string', 'path']);
    assert.deepEqual(required('glob'), ['pattern']);
    assert.deepEqual(required('grep'), ['pattern']);
    assert.equal(byName.bash.inputSchema.properties.command.type, 'string');
  } finally {
    await disconnect(conn);
  }
});

test('/mcp/new: each session its own conversation; its id reaches that workspace again', async () => {
  const a = await connectHttp(sb.url, sb.key);
  const b = await connectHttp(sb.url, sb.key);
  try {
    assert.match(a.conversationId, NEW_ID);
    assert.match(b.conversationId, NEW_ID);
    assert.notEqual(a.conversationId, b.conversationId);

    let r = await call(a, 'write', { path: 'notes/secret.txt', content: TEXT });
    assert.ok(!r.isError, r.text);
    r = await call(b, 'read', { path: 'notes/secret.txt' });
    assert.ok(r.isError && r.text.includes('not_found'), `b reads a's file: ${r.text}`);
    r = await call(b, 'ls', { path: '.' });
    assert.ok(!r.isError && !r.text.includes('notes'), `b lists a's files: ${r.text}`);
    r = await call(b, 'bash', { command: 'echo mine > b-only.txt; ls -A' });
    assert.equal(r.text, 'b-only.txt\nExit code: 0');
    r = await call(a, 'read', { path: 'b-only.txt' });
    assert.ok(r.isError && r.text.includes('not_found'), `a reads b's file: ${r.text}`);

    // A third session, at /mcp/conversations/{a's id}: a's workspace.
    const c = await connectHttp(sb.url, sb.key, a.conversationId);
    try {
      assert.equal(c.conversationId, a.conversationId);
      r = await call(c, 'read', { path: 'notes/secret.txt' });
      assert.ok(!r.isError && r.text.includes('naïve café → ✓ 🚀'), r.text);
      r = await call(c, 'ls', { path: 'notes' });
      assert.ok(!r.isError && r.text.includes('secret.txt'), r.text);
    } finally {
      await disconnect(c);
    }
    // And over REST, byte for byte; b's conversation has no such file.
    const file = await restFile(a.conversationId, 'notes/secret.txt');
    assert.equal(file.status, 200);
    assert.deepEqual(file.body, Buffer.from(TEXT));
    assert.equal((await restFile(b.conversationId, 'notes/secret.txt')).status, 404);
  } finally {
    await disconnect(a);
    await disconnect(b);
  }
});

test('bash output and files come back byte for byte', async () => {
  const conn = await connectHttp(sb.url, sb.key, 'ts-bytes');
  try {
    let r = await call(conn, 'write', { path: 'bytes.txt', content: TEXT });
    assert.ok(!r.isError, r.text);
    r = await call(conn, 'bash', { command: 'cat bytes.txt' });
    assert.equal(r.text, `${TEXT}Exit code: 0`);
    // Unicode in the command line too, and a result that ends in an empty line.
    r = await call(conn, 'bash', { command: "printf '%s\\n' 'Grüße, 世界 🚀' '' | tee out.txt" });
    assert.equal(r.text, 'Grüße, 世界 🚀\n\nExit code: 0');
    assert.deepEqual((await restFile('ts-bytes', 'out.txt')).body, Buffer.from('Grüße, 世界 🚀\n\n'));
    // Standard error follows standard output; the exit code is the model's to read.
    r = await call(conn, 'bash', { command: 'echo out; echo err >&2; exit 3' });
    assert.equal(r.text, 'out\nerr\nExit code: 3');
  } finally {
    await disconnect(conn);
  }
});

test('workspace files are read-only resources; a /mcp/new session is told its conversation', async () => {
  const conn = await connectHttp(sb.url, sb.key);
  try {
    // The HTTP session's instructions name the conversation made for it, as stdio's do.
    assert.match(conn.client.getInstructions() ?? '', new RegExp(`conversation is \`${conn.conversationId}\``));
    assert.ok(conn.client.getServerCapabilities()?.resources, 'resources are offered');
    let r = await call(conn, 'write', { path: 'docs/note one.md', content: TEXT });
    assert.ok(!r.isError, r.text);
    r = await call(conn, 'bash', { command: "printf '\\377\\000x' > raw.bin" });
    assert.ok(!r.isError, r.text);
    const { resources } = await conn.client.listResources();
    const byUri = Object.fromEntries(resources.map((x) => [x.uri, x]));
    assert.deepEqual(Object.keys(byUri).sort(), ['file:///docs/note%20one.md', 'file:///raw.bin']);
    assert.equal(byUri['file:///docs/note%20one.md'].name, 'docs/note one.md');
    assert.equal(byUri['file:///docs/note%20one.md'].mimeType, 'text/markdown');
    let read = await conn.client.readResource({ uri: 'file:///docs/note%20one.md' });
    assert.equal(read.contents[0].text, TEXT);
    read = await conn.client.readResource({ uri: 'file:///raw.bin' });
    assert.deepEqual(Buffer.from(read.contents[0].blob, 'base64'), Buffer.from([0xff, 0x00, 0x78]));
    // A missing file and a path out of the workspace are protocol errors, and change nothing.
    await assert.rejects(conn.client.readResource({ uri: 'file:///missing.txt' }), /not_found/);
    await assert.rejects(conn.client.readResource({ uri: 'file:///../../etc/passwd' }), /error \(/);
    // A long output is cut with advice on what to do next.
    r = await call(conn, 'bash', { command: 'yes x | head -c 100000' });
    assert.match(r.text, /output truncated: \d+ more characters; to see all of it, redirect the output to a file/);
  } finally {
    await disconnect(conn);
  }
});

test('an invalid conversation id or a missing key is refused with an HTTP error', async () => {
  for (const id of ['../x', 'a'.repeat(300), '-dash', 'sp ace']) {
    await assert.rejects(connectHttp(sb.url, sb.key, id), (e) => {
      assert.ok(e instanceof StreamableHTTPError, String(e));
      assert.equal(e.code, 400, `${JSON.stringify(id).slice(0, 20)}: ${e.message}`);
      assert.match(e.message, /invalid_id/);
      return true;
    });
  }
  let raw = await rawPost('/mcp/conversations/..%2Fx', INITIALIZE, { Authorization: `Bearer ${sb.key}` });
  assert.equal(raw.status, 400);
  assert.equal(JSON.parse(raw.text).code, 'invalid_id');

  // No key, and a wrong one: 401 before anything is opened.
  const bare = new StreamableHTTPClientTransport(new URL(`${sb.url}/mcp/new`));
  await assert.rejects(new Client({ name: 'no-key', version: '0' }).connect(bare), (e) => e.code === 401);
  await assert.rejects(connectHttp(sb.url, 'sbk_0000000000000000_nope', 'ts-x'), (e) => e.code === 401);
  raw = await rawPost('/mcp/new', INITIALIZE);
  assert.equal(raw.status, 401);
  assert.equal(JSON.parse(raw.text).code, 'unauthorized');

  // The server is still up and serving.
  const conn = await connectHttp(sb.url, sb.key, 'ts-after-errors');
  try {
    assert.equal((await call(conn, 'bash', { command: 'echo ok' })).text, 'ok\nExit code: 0');
  } finally {
    await disconnect(conn);
  }
});

test('closing the client ends the MCP session, not the conversation', async () => {
  const conn = await connectHttp(sb.url, sb.key);
  const { conversationId } = conn;
  const sessionId = conn.transport.sessionId;
  assert.ok(sessionId, 'no Mcp-Session-Id');
  assert.ok(!(await call(conn, 'write', { path: 'keep.txt', content: 'still here\n' })).isError);
  await disconnect(conn); // DELETE with the session id; the SDK throws unless it is 2xx (or 405)

  // The session is gone...
  const raw = await rawPost('/mcp/new', { jsonrpc: '2.0', id: 2, method: 'tools/list' }, {
    Authorization: `Bearer ${sb.key}`, 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18',
  });
  assert.equal(raw.status, 404, raw.text);
  // ... the conversation and its file are not.
  const file = await restFile(conversationId, 'keep.txt');
  assert.equal(file.status, 200);
  assert.equal(file.body.toString(), 'still here\n');
  const again = await connectHttp(sb.url, sb.key, conversationId);
  try {
    const r = await call(again, 'read', { path: 'keep.txt' });
    assert.ok(!r.isError && r.text.includes('still here'), r.text);
  } finally {
    await disconnect(again);
  }
});

test('stdio: each `sessionbox mcp --new` process is a conversation of its own, named', async () => {
  const data = tempDir('sessionbox-ts-stdio-');
  const args = ['mcp', '--new', '--data-dir', data, '--runtime', 'host'];
  const open = async () => {
    const conn = await connectStdio({ command: sb.bin, args, stderr: 'pipe' });
    conn.stderr = '';
    conn.transport.stderr.on('data', (chunk) => { conn.stderr += chunk; });
    return conn;
  };
  try {
    const a = await open();
    const b = await open();
    try {
      assert.match(a.conversationId ?? '', NEW_ID, a.client.getInstructions());
      assert.match(b.conversationId ?? '', NEW_ID);
      assert.notEqual(a.conversationId, b.conversationId);
      const { tools } = await a.client.listTools();
      assert.deepEqual(tools.map((t) => t.name).sort(), STDIO_TOOLS);
      for (const conn of [a, b]) {
        const line = `sessionbox mcp: conversation ${conn.conversationId}\n`;
        for (let i = 0; i < 100 && !conn.stderr.includes('\n'); i++) await new Promise((r) => setTimeout(r, 20));
        assert.ok(conn.stderr.includes(line), conn.stderr);
      }

      let r = await call(a, 'write', { path: 'stdio.txt', content: TEXT });
      assert.ok(!r.isError, r.text);
      r = await call(a, 'bash', { command: 'cat stdio.txt' });
      assert.equal(r.text, `${TEXT}Exit code: 0`);
      r = await call(b, 'read', { path: 'stdio.txt' });
      assert.ok(r.isError && r.text.includes('not_found'), `b reads a's file: ${r.text}`);
      r = await call(b, 'write', { path: 'other.txt', content: 'b\n' });
      assert.ok(!r.isError, r.text);
      r = await call(b, 'ls', {});
      assert.ok(!r.isError && r.text.includes('other.txt') && !r.text.includes('stdio.txt'), r.text);
    } finally {
      await disconnect(a);
      await disconnect(b);
    }
    // Both processes have exited; their conversations stay in the data directory.
    const cli = (...more) => run(sb.bin, ['--data-dir', data, '--runtime', 'host', ...more]);
    const listed = JSON.parse((await cli('conversations', '--json')).stdout).map((c) => c.id).sort();
    assert.deepEqual(listed, [a.conversationId, b.conversationId].sort());
    assert.equal((await cli('read', '-c', a.conversationId, 'stdio.txt')).stdout, TEXT);
  } finally {
    removeDir(data);
  }
});

test('example.mjs, as the page runs it: HTTP (/mcp/new and a chat id) and stdio', async () => {
  const example = fileURLToPath(new URL('./example.mjs', import.meta.url));
  const node = (args, env) =>
    run(process.execPath, [example, ...args], { env: { ...process.env, ...env }, timeout: 30_000 });
  const expect = (stdout, tools = TOOLS) => {
    const id = stdout.match(/^conversation: (\S+)\n/)?.[1];
    assert.ok(id, stdout);
    const listed = stdout.match(/^tools: (.*)$/m)?.[1].split(' ').sort();
    assert.deepEqual(listed, tools);
    assert.ok(stdout.endsWith('Wrote 15 bytes to fruit.txt\napple\nfig\npear\nExit code: 0\n'), stdout);
    return id;
  };
  const http = { SESSIONBOX_URL: sb.url, SESSIONBOX_API_KEY: sb.key };

  const made = expect((await node([], http)).stdout);
  assert.match(made, NEW_ID);
  assert.equal((await restFile(made, 'sorted.txt')).body.toString(), 'apple\nfig\npear\n');
  assert.equal(expect((await node(['ts-chat-42'], http)).stdout), 'ts-chat-42');
  assert.equal((await restFile('ts-chat-42', 'sorted.txt')).body.toString(), 'apple\nfig\npear\n');

  // stdio: `sessionbox` found on PATH, the data directory in SESSIONBOX_HOME.
  const home = newDataDir('sessionbox-ts-example-');
  const bin = tempDir('sessionbox-ts-bin-');
  try {
    symlinkSync(sb.bin, join(bin, 'sessionbox'));
    const env = { PATH: `${bin}:${process.env.PATH}`, SESSIONBOX_HOME: home };
    const id = expect((await node(['--stdio'], env)).stdout, STDIO_TOOLS);
    assert.match(id, NEW_ID);
    const { stdout } = await run(sb.bin, ['--data-dir', home, 'read', '-c', id, 'sorted.txt']);
    assert.equal(stdout, 'apple\nfig\npear\n');
  } finally {
    removeDir(home);
    removeDir(bin);
  }
});
