// Test support for the dashboard's browser tests: a real `sessionbox serve` (runtime host) on a
// free loopback port with a temporary data directory and API keys of tenants `acme` and
// `globex`, and Debian's Chromium driven by playwright-core.
//
// Two ways to reach the dashboard:
// - the default: the binary serves it at ${url}/ui/ (same origin as the API);
// - UI_DEV=1, for a binary that does not serve /ui/ yet: a small static server here serves
//   crates/sessionbox-server/ui/ with the contract's CSP (connect-src widened to the API's
//   origin), serve gets --cors-origin for it, and the page is opened with ?api=URL.

import { execFile, spawn } from 'node:child_process';
import { accessSync, closeSync, constants, existsSync, mkdtempSync, openSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { delimiter, dirname, extname, isAbsolute, join, normalize, resolve, sep } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);
const here = dirname(fileURLToPath(import.meta.url));
export const repoRoot = resolve(here, '..', '..');
export const uiDir = join(repoRoot, 'crates', 'sessionbox-server', 'ui');
export const devMode = process.env.UI_DEV === '1';

// The contract's policy, as the server sends it on every /ui/ response.
export const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
  + "font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

export function binary() {
  const name = process.env.SESSIONBOX_BIN ?? 'sessionbox';
  const candidates = name.includes(sep)
    ? [resolve(name)]
    : (process.env.PATH ?? '').split(delimiter).filter(isAbsolute).map((dir) => join(dir, name));
  for (const path of candidates) {
    try {
      accessSync(path, constants.X_OK);
      return path;
    } catch {
      // next
    }
  }
  throw new Error(`sessionbox binary not found: ${name} (set SESSIONBOX_BIN)`);
}

export function chromiumPath() {
  const path = process.env.CHROMIUM || '/usr/bin/chromium';
  if (!existsSync(path)) throw new Error(`Chromium not found at ${path} (apt-get install chromium, or set CHROMIUM)`);
  return path;
}

const cleanups = [];
process.on('exit', () => {
  for (const fn of cleanups.splice(0).reverse()) {
    try {
      fn();
    } catch {
      // best effort
    }
  }
});

function tempDir(prefix) {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

async function firstLine(proc, ms) {
  const lines = createInterface({ input: proc.stdout });
  try {
    return await new Promise((ok, fail) => {
      const timer = setTimeout(() => fail(new Error('serve printed no address in time')), ms);
      lines.once('line', (line) => { clearTimeout(timer); ok(line); });
      proc.once('exit', (code) => { clearTimeout(timer); fail(new Error(`serve exited (${code})`)); });
    });
  } finally {
    lines.close();
    proc.stdout.resume();
  }
}

/** Starts serve; returns {url, bin, data, keys: {acme, globex}, sb(args...), stop}. */
export async function startServe({ corsOrigin } = {}) {
  const bin = binary();
  const data = tempDir('sessionbox-ui-test-');
  writeFileSync(join(data, 'sessionbox.toml'), 'runtime = "host"\n');
  const keys = {};
  for (const tenant of ['acme', 'globex']) {
    const { stdout } = await run(bin, ['--data-dir', data, '--tenant', tenant, 'keys', 'create']);
    keys[tenant] = stdout.trim();
  }
  const args = ['--data-dir', data, 'serve', '--runtime', 'host', '--listen', '127.0.0.1:0'];
  if (corsOrigin) args.push('--cors-origin', corsOrigin);
  const log = openSync(join(data, 'serve.log'), 'w');
  const proc = spawn(bin, args, { stdio: ['ignore', 'pipe', log], detached: true });
  const kill = () => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
  };
  cleanups.push(kill);
  const exited = new Promise((done) => proc.once('exit', done));
  const stop = async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGTERM');
      const timer = setTimeout(kill, 15_000);
      await exited;
      clearTimeout(timer);
    }
    try {
      closeSync(log);
    } catch {
      // closed
    }
  };
  try {
    const line = await firstLine(proc, 30_000);
    const url = line.match(/https?:\/\/127\.0\.0\.1:\d+/)?.[0];
    if (!url) throw new Error(`serve printed no address: ${JSON.stringify(line)}`);
    const deadline = Date.now() + 30_000;
    while (!(await fetch(`${url}/healthz`).then((r) => r.ok, () => false))) {
      if (Date.now() > deadline) throw new Error('serve did not become healthy');
      await new Promise((r) => setTimeout(r, 50));
    }
    return { url, bin, data, keys, stop, logFile: join(data, 'serve.log') };
  } catch (error) {
    await stop();
    throw error;
  }
}

const TYPES = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8', '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml', '.png': 'image/png', '.txt': 'text/plain; charset=utf-8',
};

/**
 * Dev mode: serves `root` on 127.0.0.1:port (0: any free port) with the contract's headers,
 * connect-src widened to apiOrigin (http and ws).
 */
export async function serveStatic(root, apiOrigin, port = 0) {
  const wsOrigin = apiOrigin.replace(/^http/, 'ws');
  const csp = CSP.replace("connect-src 'self'", `connect-src 'self' ${apiOrigin} ${wsOrigin}`);
  const server = createServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    let file = normalize(join(root, path));
    if (file !== root && !file.startsWith(root + sep)) {
      res.writeHead(403).end();
      return;
    }
    try {
      if (statSync(file).isDirectory()) file = join(file, 'index.html');
      const body = readFileSync(file);
      res.writeHead(200, {
        'Content-Type': TYPES[extname(file)] ?? 'application/octet-stream',
        'Content-Security-Policy': csp,
        'X-Content-Type-Options': 'nosniff',
        'Referrer-Policy': 'no-referrer',
        'Cache-Control': 'no-store',
      });
      res.end(body);
    } catch {
      res.writeHead(404, { 'Content-Type': 'text/plain' }).end('not found');
    }
  });
  await new Promise((ok, fail) => {
    server.once('error', fail);
    server.listen(port, '127.0.0.1', ok);
  });
  cleanups.push(() => server.close());
  return { url: `http://127.0.0.1:${server.address().port}`, stop: () => new Promise((ok) => server.close(ok)) };
}

/** A free loopback port (closed again: a small race, fine for tests). */
async function freePort() {
  const probe = createServer();
  await new Promise((ok) => probe.listen(0, '127.0.0.1', ok));
  const { port } = probe.address();
  await new Promise((ok) => probe.close(ok));
  return port;
}

/**
 * Starts what the tests need: serve (and, in dev mode, the static server), and tells where
 * the dashboard is: {page: URL to open, api: the API's origin, ...serve}.
 */
export async function startDashboard() {
  if (!devMode) {
    const serve = await startServe();
    return { ...serve, page: `${serve.url}/ui/`, api: serve.url, stopAll: serve.stop };
  }
  // serve needs the page's origin (--cors-origin) and the page's CSP needs serve's: pick the
  // static server's port first.
  const port = await freePort();
  const serve = await startServe({ corsOrigin: `http://127.0.0.1:${port}` });
  const site = await serveStatic(uiDir, serve.url, port);
  return {
    ...serve,
    page: `${site.url}/?api=${encodeURIComponent(serve.url)}`,
    api: serve.url,
    stopAll: async () => {
      await site.stop();
      await serve.stop();
    },
  };
}

/** A REST call with a key: resolves with {status, headers, body (parsed JSON or text)}. */
export async function api(base, key, path, { method = 'GET', json, body, headers = {} } = {}) {
  const h = { Authorization: `Bearer ${key}`, ...headers };
  let payload = body;
  if (json !== undefined) {
    h['Content-Type'] = 'application/json';
    payload = JSON.stringify(json);
  }
  const response = await fetch(base + path, { method, headers: h, body: payload });
  const text = await response.text();
  let parsed = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // not JSON
  }
  return { status: response.status, headers: response.headers, body: parsed, text };
}
