// Test support, as ../conftest.py does it for the Python recipes: a real `sessionbox serve`
// (runtime host) on a free loopback port with a temporary data directory and an API key of
// tenant `acme`. The binary is $SESSIONBOX_BIN (../test.sh sets it).

import { execFile, spawn } from 'node:child_process';
import { closeSync, constants, accessSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, isAbsolute, join, resolve, sep } from 'node:path';
import { createInterface } from 'node:readline';
import { promisify } from 'node:util';

export const run = promisify(execFile);

export function binary() {
  const name = process.env.SESSIONBOX_BIN ?? 'sessionbox';
  const candidates = name.includes(sep)
    ? [resolve(name)]
    : (process.env.PATH ?? '').split(delimiter).filter(isAbsolute).map((dir) => join(dir, name));
  for (const path of candidates) {
    try {
      accessSync(path, constants.X_OK);
      return path;
    } catch {}
  }
  throw new Error(`sessionbox binary not found: ${name} (set SESSIONBOX_BIN)`);
}

// Every temporary directory made here, removed when the tests end even if one fails first.
const made = new Set();
export function tempDir(prefix) {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  made.add(dir);
  return dir;
}
export function removeDir(dir) {
  rmSync(dir, { recursive: true, force: true });
  made.delete(dir);
}

// A data directory whose sessionbox.toml picks the `host` runtime (no root needed).
export function newDataDir(prefix) {
  const dir = tempDir(prefix);
  writeFileSync(join(dir, 'sessionbox.toml'), 'runtime = "host"\n');
  return dir;
}

const servers = new Set();
process.on('exit', () => {
  for (const proc of servers) proc.kill('SIGKILL');
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

async function firstLine(proc, timeoutMs) {
  const lines = createInterface({ input: proc.stdout });
  try {
    return await new Promise((resolveLine, reject) => {
      const timer = setTimeout(() => reject(new Error('serve printed no address in time')), timeoutMs);
      lines.once('line', (line) => { clearTimeout(timer); resolveLine(line); });
      proc.once('exit', (code) => { clearTimeout(timer); reject(new Error(`serve exited (${code})`)); });
    });
  } finally {
    lines.close();
    proc.stdout.resume(); // anything it prints later is drained
  }
}

export async function startServe() {
  const bin = binary();
  const data = tempDir('sessionbox-recipes-ts-');
  const { stdout } = await run(bin, ['--data-dir', data, 'keys', 'create', '--tenant', 'acme']);
  const key = stdout.trim();
  const log = openSync(join(data, 'serve.log'), 'w');
  const proc = spawn(bin, ['serve', '--runtime', 'host', '--data-dir', data, '--listen', '127.0.0.1:0'], {
    stdio: ['ignore', 'pipe', log],
    detached: true,
  });
  servers.add(proc);
  const exited = new Promise((done) => proc.once('exit', done));
  const stop = async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGTERM');
      const timer = setTimeout(() => proc.kill('SIGKILL'), 15_000);
      await exited;
      clearTimeout(timer);
    }
    servers.delete(proc);
    closeSync(log);
    removeDir(data);
  };
  try {
    const line = await firstLine(proc, 20_000); // "listening on http://127.0.0.1:PORT"
    const url = line.match(/http:\/\/127\.0\.0\.1:\d+/)?.[0];
    if (!url) throw new Error(`serve printed no address: ${JSON.stringify(line)}`);
    const deadline = Date.now() + 20_000;
    for (;;) {
      const ok = await fetch(`${url}/healthz`).then((r) => r.ok, () => false);
      if (ok) break;
      if (Date.now() > deadline) throw new Error('serve did not become healthy');
      await new Promise((r) => setTimeout(r, 50));
    }
    return { bin, data, url, key, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}
