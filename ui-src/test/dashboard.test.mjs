// The dashboard in Debian's Chromium (playwright-core, no browser download) against a real
// `sessionbox serve` (runtime host): see harness.mjs for where the page comes from.
//
// Two groups:
// - "dashboard": what works on any server with the REST API (in UI_DEV=1 mode too);
// - "dashboard with the server side of issue 24": needs /ui/ served by the binary, /v1/whoami,
//   /v1/audit, /v1/installation and pty tickets; skipped in UI_DEV=1 mode.
//
// Screenshots go to docs/dashboard/ (UI_SCREENSHOT_DIR to put them elsewhere).

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { deflateSync } from 'node:zlib';
import { chromium } from 'playwright-core';

import { api, chromiumPath, devMode, repoRoot, startDashboard } from './harness.mjs';

const AXE = readFileSync(new URL('../node_modules/axe-core/axe.min.js', import.meta.url), 'utf8');

const run = promisify(execFile);
const shots = process.env.UI_SCREENSHOT_DIR || join(repoRoot, 'docs', 'dashboard');
const WIDE = { width: 1280, height: 800 };
const NARROW = { width: 360, height: 740 };
const T = { timeout: 60_000 };

// A 2×2 PNG made here: red, green / blue, white.
function crc32(bytes) {
  let c = ~0;
  for (const b of bytes) {
    c ^= b;
    for (let k = 0; k < 8; k += 1) c = (c >>> 1) ^ (0xedb88320 & -(c & 1));
  }
  return ~c >>> 0;
}
function chunk(type, data) {
  const head = Buffer.alloc(8);
  head.writeUInt32BE(data.length, 0);
  head.write(type, 4, 'ascii');
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(Buffer.concat([head.subarray(4), data])), 0);
  return Buffer.concat([head, data, crc]);
}
function png() {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(2, 0);
  ihdr.writeUInt32BE(2, 4);
  ihdr.set([8, 2, 0, 0, 0], 8); // 8-bit RGB
  const rows = Buffer.from([0, 255, 0, 0, 0, 255, 0, 0, 0, 0, 255, 255, 255, 255]);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', ihdr), chunk('IDAT', deflateSync(rows)), chunk('IEND', Buffer.alloc(0)),
  ]);
}
const PNG = png();

let d; // the running server(s)
let browser;
let context;
let page;
const requests = []; // every URL the page asked for
const consoleErrors = [];

function enc(path) {
  return path.split('/').map(encodeURIComponent).join('/');
}

async function rest(key, path, options) {
  const answer = await api(d.api, key, path, options);
  if (answer.status >= 400) throw new Error(`${options?.method ?? 'GET'} ${path}: ${answer.status} ${answer.text}`);
  return answer;
}

async function exec(key, id, command, extra = {}) {
  return (await rest(key, `/v1/conversations/${id}/exec`, { method: 'POST', json: { command, ...extra } })).body;
}

async function readFile(key, id, path) {
  const response = await fetch(`${d.api}/v1/conversations/${id}/files/${enc(path)}`, {
    headers: { Authorization: `Bearer ${key}` },
  });
  return { status: response.status, bytes: Buffer.from(await response.arrayBuffer()) };
}

async function screenshot(name) {
  mkdirSync(shots, { recursive: true });
  await page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
}

async function signIn(key) {
  await page.goto(d.page);
  await page.fill('#api-key', key);
  await page.click('form.sign-in button[type=submit]');
  await page.waitForSelector('h1:text-is("Conversations")');
}

/** Runs axe-core (WCAG 2.1 A and AA rules) on the page as it is; fails on any violation. */
async function axeCheck(what) {
  if (!(await page.evaluate(() => 'axe' in window))) await page.evaluate(AXE);
  const result = await page.evaluate(() => window.axe.run(document, {
    runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] },
    resultTypes: ['violations'],
  }));
  const problems = result.violations.map((v) =>
    `${v.id}: ${v.help} at ${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join(' | ')}`);
  assert.deepEqual(problems, [], `axe on ${what}`);
}

/** Navigates by hash, keeping the page (and its ?api= in dev mode). */
async function go(hash) {
  await page.evaluate((h) => { location.hash = h; }, hash);
}

before(async () => {
  d = await startDashboard();
  const { acme, globex } = d.keys;
  await exec(acme, 'acme-demo', [
    'mkdir -p src notes',
    'printf \'fn main() {\\n    println!("hello from sessionbox");\\n}\\n\' > src/main.rs',
    'printf "# Notes\\n\\nplain words\\n" > notes/readme.md',
    'printf "downloaded bytes\\n" > notes.txt',
  ].join(' && '));
  await rest(acme, '/v1/conversations/acme-demo/files/pic.png', { method: 'PUT', body: PNG });
  await exec(acme, 'acme-demo', 'echo started-bg; sleep 1; echo finished-bg; echo warn-bg >&2', { background: true });
  await exec(acme, 'acme-other', 'true');
  // A conversation whose process holds 64 MiB (the host runtime measures its processes).
  await exec(acme, 'acme-busy', 'python3 -c \'import time; b = b"x" * (64 << 20); time.sleep(120)\'', { background: true });
  await exec(globex, 'globex-secret', 'echo globex');

  browser = await chromium.launch({
    executablePath: chromiumPath(),
    args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update', '--no-first-run'],
  });
  context = await browser.newContext({ viewport: WIDE, acceptDownloads: true, colorScheme: 'light' });
  // Every CSP violation the page sees, with the script that caused it.
  await context.addInitScript(() => {
    window.cspViolations = [];
    document.addEventListener('securitypolicyviolation', (e) => {
      window.cspViolations.push({ directive: e.violatedDirective, blocked: e.blockedURI, source: e.sourceFile, sample: e.sample });
    });
  });
  page = await context.newPage();
  page.on('request', (r) => requests.push(r.url()));
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push(`pageerror: ${e.message}`));
});

after(async () => {
  await browser?.close();
  await d?.stopAll();
});

describe('dashboard', () => {
  test('a wrong key is refused with the server\'s message; the right one signs in', T, async () => {
    await page.goto(d.page);
    assert.equal(await page.evaluate(() => document.activeElement?.id), 'api-key');
    await page.fill('#api-key', 'sbk_0000000000000000_not-a-real-key');
    await page.click('form.sign-in button[type=submit]');
    await page.waitForSelector('#api-key-error:has-text("refused")');
    assert.equal(await page.getAttribute('#api-key', 'aria-invalid'), 'true');
    await signIn(d.keys.acme);
    // The key is kept for the tab only, in sessionStorage.
    const stored = await page.evaluate(() => ({ session: sessionStorage.length, local: localStorage.length }));
    assert.deepEqual(stored, { session: 1, local: 0 });
  });

  test('the list shows the tenant\'s conversations and never another tenant\'s', T, async () => {
    await page.waitForSelector('tr[data-key="acme-demo"]');
    await page.waitForSelector('tr[data-key="acme-other"]');
    // globex's conversation exists (its own key sees it) but is not listed for acme.
    const theirs = await rest(d.keys.globex, '/v1/conversations');
    assert.ok(theirs.body.conversations.some((c) => c.id === 'globex-secret'));
    assert.equal(await page.locator('text=globex-secret').count(), 0);
    const row = page.locator('tr[data-key="acme-demo"]');
    assert.match(await row.innerText(), /active/);
    assert.match(await row.innerText(), /host/);
    await screenshot('conversations');
    await page.setViewportSize(NARROW);
    await page.waitForTimeout(300);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `the list scrolls sideways at 360px by ${overflow}px`);
    await screenshot('conversations-narrow');
    await page.setViewportSize(WIDE);
  });

  test('memory: a conversation\'s running processes show in the list and on its page', T, async () => {
    const cell = page.locator('tr[data-key="acme-busy"] td[data-label="Memory"]');
    await page.waitForFunction(() => /MiB/.test(document.querySelector('tr[data-key="acme-busy"] td[data-label="Memory"]')?.textContent ?? ''),
      null, { timeout: 30_000 });
    const text = await cell.innerText();
    const mib = Number(/([\d.]+)\s*MiB/.exec(text)[1]);
    assert.ok(mib >= 64, `64 MiB held, the list says ${text}`);
    assert.match(text, /no limit/);
    // A conversation with nothing running shows no memory.
    assert.equal((await page.locator('tr[data-key="acme-other"] td[data-label="Memory"]').innerText()).trim(), '—');
    await go('#/c/acme-busy/files');
    await page.waitForSelector('dd:has-text("MiB")');
    await go('#/');
    await page.waitForSelector('tr[data-key="acme-demo"]');
  });

  test('search and the state filter narrow the list', T, async () => {
    await page.fill('#conv-search', 'other');
    await page.waitForFunction(() => !document.querySelector('tr[data-key="acme-demo"]'));
    assert.equal(await page.locator('tr[data-key="acme-other"]').count(), 1);
    await page.fill('#conv-search', 'zzz-nothing');
    await page.waitForSelector('p.empty:has-text("No conversation matches")');
    await page.fill('#conv-search', '');
    await page.selectOption('#conv-state', 'expired');
    await page.waitForSelector('p.empty:has-text("No conversation matches")');
    await page.selectOption('#conv-state', '');
    await page.waitForSelector('tr[data-key="acme-demo"]');
  });

  test('a conversation: browse into a directory and preview a highlighted text file', T, async () => {
    await page.click('tr[data-key="acme-demo"] a');
    await page.waitForSelector('h1:has-text("acme-demo")');
    await page.waitForSelector('a.entry.dir:text("src/")');
    await page.click('a.entry.dir:text("src/")');
    await page.waitForFunction(() => location.hash.endsWith('/files/src'));
    await page.waitForSelector('.crumbs [aria-current="page"]:text("src")');
    await page.click('button[aria-label="Preview main.rs"]');
    await page.waitForSelector('pre.code code.language-rust');
    const code = page.locator('pre.code code');
    assert.match(await code.innerText(), /hello from sessionbox/);
    assert.ok(await page.locator('pre.code .hljs-keyword').count() > 0, 'no highlighted keyword');
    // The preview heading takes the focus, for keyboard and screen reader users.
    assert.equal(await page.evaluate(() => document.activeElement?.tagName), 'H3');
    await screenshot('conversation-files');
    // The breadcrumb goes back up.
    await page.click('.files-panel .crumbs a:text("workspace")');
    await page.waitForSelector('button[aria-label="Preview notes.txt"]');
  });

  test('an image previews through a blob: URL', T, async () => {
    await page.click('button[aria-label="Preview pic.png"]');
    const img = page.locator('.preview img');
    await img.waitFor();
    assert.match(await img.getAttribute('src'), /^blob:/);
    await page.waitForFunction(() => document.querySelector('.preview img')?.naturalWidth === 2);
  });

  test('download saves the file\'s bytes', T, async () => {
    const [download] = await Promise.all([
      page.waitForEvent('download'),
      page.click('button[aria-label="Download notes.txt"]'),
    ]);
    assert.equal(download.suggestedFilename(), 'notes.txt');
    assert.equal(readFileSync(await download.path(), 'utf8'), 'downloaded bytes\n');
  });

  test('upload by drag and drop lands the bytes in the folder shown', T, async () => {
    await go('#/c/acme-demo/files/src');
    await page.waitForSelector('button[aria-label="Preview main.rs"]');
    const content = `dropped at ${Date.now()}\nsecond line\n`;
    const transfer = await page.evaluateHandle((text) => {
      const dt = new DataTransfer();
      dt.items.add(new File([text], 'dropped.txt', { type: 'text/plain' }));
      return dt;
    }, content);
    await page.dispatchEvent('.files-panel .listing', 'dragenter', { dataTransfer: transfer });
    await page.dispatchEvent('.files-panel .listing', 'dragover', { dataTransfer: transfer });
    await page.dispatchEvent('.files-panel .listing', 'drop', { dataTransfer: transfer });
    await page.waitForSelector('tr.fresh button[aria-label="Preview dropped.txt"]');
    await page.waitForSelector('.upload-status:has-text("Uploaded src/dropped.txt")');
    const file = await readFile(d.keys.acme, 'acme-demo', 'src/dropped.txt');
    assert.equal(file.status, 200);
    assert.equal(file.bytes.toString('utf8'), content);
  });

  test('upload with the file input', T, async () => {
    const bytes = Buffer.from([0, 1, 2, 3, 250, 251, 252, 253, 254, 255]);
    await page.setInputFiles('.files-panel input[type=file]', { name: 'picked.bin', mimeType: 'application/octet-stream', buffer: bytes });
    await page.waitForSelector('button[aria-label="Preview picked.bin"]');
    const file = await readFile(d.keys.acme, 'acme-demo', 'src/picked.bin');
    assert.deepEqual([...file.bytes], [...bytes]);
    // A binary file is not shown as text.
    await page.click('button[aria-label="Preview picked.bin"]');
    await page.waitForSelector('.preview-body:has-text("Binary file")');
  });

  test('a missing folder shows the server\'s message', T, async () => {
    await go('#/c/acme-demo/files/no-such-dir');
    await page.waitForSelector('.files-panel .error-box');
    const text = await page.innerText('.files-panel .error-box');
    assert.match(text, /not found: no-such-dir/);
    assert.match(text, /not_found/);
  });

  test('an unknown conversation is not created by looking at it; "Create it" does', T, async () => {
    await go('#/c/acme-new');
    await page.waitForSelector('.conv-facts .error-box:has-text("There is no conversation acme-new")');
    await page.waitForSelector('.panels button:text("Create it")');
    assert.equal(await page.locator('.files-panel').count(), 0);
    assert.equal((await api(d.api, d.keys.acme, '/v1/conversations/acme-new')).status, 404);
    await page.click('.panels button:text("Create it")');
    await page.waitForSelector('.files-panel p.empty:text("This folder is empty.")');
    await page.waitForSelector('.conv-facts .badge:text("active")');
    assert.equal((await api(d.api, d.keys.acme, '/v1/conversations/acme-new')).status, 200);
  });

  test('background commands and their output', T, async () => {
    await go('#/c/acme-demo/commands');
    const row = page.locator('.commands-panel tbody tr', { hasText: 'finished-bg' });
    await row.waitFor();
    await row.locator('button').click();
    await page.waitForSelector('.logs pre.log[aria-label="stdout"]:has-text("finished-bg")', { timeout: 20_000 });
    assert.match(await page.innerText('.logs pre.log[aria-label="stdout"]'), /started-bg\s+finished-bg/);
    await page.waitForSelector('.logs pre.log[aria-label="stderr"]:has-text("warn-bg")');
    await page.waitForSelector('.logs [role=status]:has-text("Finished (exit 0)")', { timeout: 20_000 });
    await row.locator('.badge:text("exit 0")').waitFor();
  });

  test('network: the policy in force and the conversation\'s egress verdicts', T, async () => {
    await go('#/c/acme-demo/network');
    await page.waitForSelector('.network-panel dd:has-text("none (no network)")');
    await page.waitForSelector('.network-panel :text("No verdicts")');
  });

  test('snapshots: only this conversation\'s', T, async () => {
    await rest(d.keys.acme, '/v1/conversations/acme-demo/snapshots', { method: 'POST', json: { name: 'demo-snap' } });
    await rest(d.keys.acme, '/v1/conversations/acme-other/snapshots', { method: 'POST', json: { name: 'other-snap' } });
    await go('#/c/acme-demo/snapshots');
    await page.waitForSelector('.snapshots-panel code:text("demo-snap")');
    assert.equal(await page.locator('.snapshots-panel :text("other-snap")').count(), 0);
  });

  test('terminal protocol, against a scripted socket in the page', T, async () => {
    // The real terminal is tested below with the server; this drives the page's side of the
    // protocol (ticket, frames, resize, exit) against a socket scripted here.
    const origin = new URL(d.page).origin;
    let ticketBody = null;
    await page.route('**/v1/conversations/acme-other/pty/tickets', async (route) => {
      ticketBody = route.request().postData();
      assert.match(route.request().headers().authorization ?? '', /^Bearer sbk_/);
      await route.fulfill({
        status: 200,
        contentType: 'application/json',
        headers: { 'access-control-allow-origin': origin },
        body: JSON.stringify({ ticket: 'tkt-123/+=', expires_at: new Date(Date.now() + 60_000).toISOString() }),
      });
    });
    const seen = { urls: [], inputs: [], resizes: [] };
    // Only this conversation's socket: a WebSocket route outlives unrouteAll.
    await page.routeWebSocket(/\/acme-other\/pty\?ticket=/, (ws) => {
      seen.urls.push(ws.url());
      ws.send(JSON.stringify({ type: 'connected' }));
      ws.send(Buffer.concat([Buffer.from([1]), Buffer.from('scripted$ ')]));
      let line = '';
      ws.onMessage((message) => {
        if (typeof message === 'string') {
          const frame = JSON.parse(message);
          if (frame.type === 'resize') seen.resizes.push(frame);
          return;
        }
        assert.equal(message[0], 0, 'input frames start with 0x00');
        const text = message.subarray(1).toString('utf8');
        seen.inputs.push(text);
        ws.send(Buffer.concat([Buffer.from([1]), Buffer.from(text.replace(/\r/g, '\r\n'))]));
        line += text;
        if (line.endsWith('\r')) {
          if (line.trim() === 'exit') {
            ws.send(JSON.stringify({ type: 'exit', exit_code: 3 }));
            ws.close({ code: 1000 });
          } else {
            ws.send(Buffer.concat([Buffer.from([1]), Buffer.from(`reversed: ${[...line.trim()].reverse().join('')}\r\nscripted$ `)]));
          }
          line = '';
        }
      });
    });
    await go('#/c/acme-other/terminal');
    await page.waitForSelector('.terminal-panel .term-status:text("Connected")');
    await page.waitForSelector('.terminal-panel .xterm-rows:has-text("scripted$")');
    await page.click('.terminal-panel .term-host');
    await page.keyboard.type('héllo');
    await page.keyboard.press('Enter');
    await page.waitForSelector('.terminal-panel .xterm-rows:has-text("reversed: olléh")');
    assert.equal(seen.urls.length, 1);
    assert.ok(seen.urls[0].endsWith(`/v1/conversations/acme-other/pty?ticket=${encodeURIComponent('tkt-123/+=')}`), seen.urls[0]);
    assert.ok(!seen.urls[0].includes(d.keys.acme));
    assert.equal(ticketBody, '{}');
    assert.equal(seen.inputs.join(''), 'héllo\r');
    assert.ok(seen.resizes.length >= 1 && seen.resizes.at(-1).cols > 20 && seen.resizes.at(-1).rows > 5, JSON.stringify(seen.resizes));
    // xterm.js's own <style> elements are refused by the CSP; the page mirrors them into
    // constructed style sheets, so the theme applies: light text on the dark background.
    const color = await page.evaluate(() => getComputedStyle(document.querySelector('.terminal-panel .xterm-rows')).color);
    assert.equal(color, 'rgb(230, 237, 243)');
    // F6 leaves the terminal for the toolbar.
    await page.keyboard.press('F6');
    assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'Disconnect');
    await page.click('.terminal-panel .term-host');
    await page.keyboard.type('exit');
    await page.keyboard.press('Enter');
    await page.waitForSelector('.terminal-panel .term-status:text("The shell exited with code 3")');
    await page.unroute('**/v1/conversations/acme-other/pty/tickets');
    await page.unrouteAll({ behavior: 'ignoreErrors' });
  });

  test('destroy asks first; Cancel keeps the conversation, Destroy removes it', T, async () => {
    await exec(d.keys.acme, 'acme-doomed', 'true');
    await go('#/');
    const row = page.locator('tr[data-key="acme-doomed"]');
    await row.waitFor();
    await row.locator('button:text("Destroy")').click();
    const dialog = page.locator('dialog.confirm');
    await dialog.waitFor();
    assert.match(await dialog.innerText(), /Destroy conversation acme-doomed\?/);
    // The safe choice has the focus; Escape cancels.
    assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'Cancel');
    await page.keyboard.press('Escape');
    await dialog.waitFor({ state: 'detached' });
    assert.equal((await api(d.api, d.keys.acme, '/v1/conversations/acme-doomed')).status, 200);
    await row.locator('button:text("Destroy")').click();
    await dialog.locator('button:text-is("Destroy")').click();
    await row.waitFor({ state: 'detached' });
    assert.equal((await api(d.api, d.keys.acme, '/v1/conversations/acme-doomed')).status, 404);
    await page.waitForSelector('#status:has-text("acme-doomed destroyed")');
  });

  test('installation: activity plotted from /metrics', { timeout: 90_000 }, async () => {
    await go('#/installation');
    await page.waitForSelector('h1:text-is("Installation")');
    // Two samples (5 s apart) make a line: uPlot draws on a canvas.
    await page.waitForSelector('#chart-rate canvas', { timeout: 30_000 });
    await page.waitForSelector('#chart-sandboxes-summary:has-text("live sandboxes")');
    assert.match(await page.innerText('#chart-latency-summary'), /mean \d/);
    await page.waitForTimeout(5500); // a third point
    await screenshot('installation');
  });

  test('keyboard: the skip link, visible focus, and the main landmarks', T, async () => {
    await go('#/');
    await page.waitForSelector('tr[data-key="acme-demo"]');
    // The skip link is the first stop: Shift+Tab from the first link of the header.
    await page.focus('a.brand');
    await page.keyboard.press('Shift+Tab');
    assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'Skip to content');
    const outline = await page.evaluate(() => getComputedStyle(document.activeElement).outlineStyle);
    assert.equal(outline, 'solid');
    await page.keyboard.press('Enter');
    assert.equal(await page.evaluate(() => document.activeElement?.id), 'main');
    // Landmarks and one h1.
    assert.equal(await page.locator('header').count(), 1);
    assert.equal(await page.locator('main').count(), 1);
    assert.equal(await page.locator('nav[aria-label="Main"]').count(), 1);
    assert.equal(await page.locator('h1').count(), 1);
    // Every form control has a label.
    const unlabelled = await page.evaluate(() => [...document.querySelectorAll('input, select')]
      .filter((el) => !el.labels?.length && !el.getAttribute('aria-label')).map((el) => el.outerHTML));
    assert.deepEqual(unlabelled, []);
    // The conversation link is reachable by Tab and opens with Enter.
    await page.focus('tr[data-key="acme-demo"] a');
    await page.keyboard.press('Enter');
    await page.waitForSelector('h1:has-text("acme-demo")');
    await page.setViewportSize(NARROW);
    await page.waitForTimeout(300);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `the conversation page scrolls sideways at 360px by ${overflow}px`);
    await page.setViewportSize(WIDE);
  });

  test('a revoked key sends the page back to the sign-in form with the reason', T, async () => {
    const { stdout } = await run(d.bin, ['--data-dir', d.data, '--tenant', 'acme', 'keys', 'create', '--label', 'revoke-me']);
    const key = stdout.trim();
    await page.evaluate(() => sessionStorage.clear());
    await signIn(key);
    const keyId = key.split('_')[1];
    await run(d.bin, ['--data-dir', d.data, 'keys', 'revoke', keyId]);
    await page.waitForSelector('#api-key-error:has-text("refused")', { timeout: 20_000 });
    assert.equal(await page.evaluate(() => sessionStorage.length), 0);
    await signIn(d.keys.acme);
  });

  test('accessibility: axe-core finds no WCAG 2.1 A/AA violation, light or dark', { timeout: 120_000 }, async () => {
    for (const scheme of ['light', 'dark']) {
      await page.emulateMedia({ colorScheme: scheme });
      await go('#/');
      await page.waitForSelector('tr[data-key="acme-demo"]');
      await axeCheck(`the list (${scheme})`);
      await go('#/c/acme-demo/files/src');
      await page.click('button[aria-label="Preview main.rs"]');
      await page.waitForSelector('pre.code .hljs-keyword');
      await axeCheck(`the files with a preview (${scheme})`);
      await go('#/c/acme-demo/commands');
      await page.locator('.commands-panel tbody tr button').first().click();
      await page.waitForSelector('.logs pre.log[aria-label="stdout"]:has-text("finished-bg")');
      await axeCheck(`the commands with output (${scheme})`);
      for (const tab of ['network', 'snapshots']) {
        await go(`#/c/acme-demo/${tab}`);
        await page.waitForSelector(`.${tab}-panel table, .${tab}-panel dl`);
        await axeCheck(`the ${tab} tab (${scheme})`);
      }
      await go('#/installation');
      await page.waitForSelector('#chart-rate canvas', { timeout: 30_000 });
      await axeCheck(`the installation (${scheme})`);
      await go('#/');
      await page.locator('tr[data-key="acme-demo"] button:text("Destroy")').click();
      await page.locator('dialog.confirm').waitFor();
      await axeCheck(`the destroy dialog (${scheme})`);
      await page.keyboard.press('Escape');
    }
    await page.emulateMedia({ colorScheme: 'light' });
    await page.evaluate(() => sessionStorage.clear());
    await page.goto(d.page);
    await page.waitForSelector('#api-key');
    await axeCheck('the sign-in form');
    await signIn(d.keys.acme);
  });

  test('nothing left 127.0.0.1, no key in any URL, and the CSP held', T, async () => {
    assert.ok(requests.length > 20, `only ${requests.length} requests seen`);
    for (const url of requests) {
      const u = new URL(url);
      if (u.protocol === 'blob:' || u.protocol === 'data:') continue;
      assert.equal(u.hostname, '127.0.0.1', `a request went to ${url}`);
      for (const key of Object.values(d.keys)) assert.ok(!url.includes(key), `a key in ${url}`);
    }
    const violations = await page.evaluate(() => window.cspViolations);
    // xterm.js makes <style> elements (refused, then mirrored: see the terminal test); any
    // other violation is the page's own fault.
    const others = violations.filter((v) => !(v.directive.startsWith('style-src') && v.blocked === 'inline' && /\/vendor\/xterm\/xterm\.js$/.test(v.source ?? '')));
    assert.deepEqual(others, []);
    const errors = consoleErrors.filter((e) => !/Content Security Policy|status of 40[14]/.test(e));
    assert.deepEqual(errors, []);
  });
});

describe('dashboard with the server side of issue 24', { skip: devMode && 'UI_DEV=1: the binary does not serve /ui/ and the new endpoints yet' }, () => {
  test('/ui/ is served with the CSP and security headers; /ui redirects to it', T, async () => {
    const response = await fetch(`${d.url}/ui/`);
    assert.equal(response.status, 200);
    assert.match(response.headers.get('content-type'), /text\/html/);
    const csp = response.headers.get('content-security-policy');
    assert.ok(csp, 'no Content-Security-Policy on /ui/');
    for (const part of ["default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"]) {
      assert.ok(csp.includes(part), `CSP lacks ${part}: ${csp}`);
    }
    assert.equal(response.headers.get('x-content-type-options'), 'nosniff');
    assert.equal(response.headers.get('referrer-policy'), 'no-referrer');
    const js = await fetch(`${d.url}/ui/app.js`);
    assert.equal(js.status, 200);
    assert.match(js.headers.get('content-type'), /javascript/);
    const bare = await fetch(`${d.url}/ui`, { redirect: 'manual' });
    assert.ok([301, 302, 307, 308].includes(bare.status), `GET /ui: ${bare.status}`);
    assert.match(bare.headers.get('location'), /\/ui\/$/);
  });

  test('whoami: the header names the tenant', T, async () => {
    await go('#/');
    await page.waitForSelector('#tenant-name:text-is("acme")');
  });

  test('terminal: a command typed in the browser runs in the workspace', { timeout: 90_000 }, async () => {
    await go('#/c/acme-demo/terminal');
    await page.waitForSelector('.terminal-panel .term-status:text("Connected")', { timeout: 30_000 });
    await page.click('.terminal-panel .term-host');
    await page.keyboard.type('echo "$((6*7))-from-the-pty" && ls src');
    await page.keyboard.press('Enter');
    await page.waitForSelector('.terminal-panel .xterm-rows:has-text("42-from-the-pty")', { timeout: 30_000 });
    await page.waitForSelector('.terminal-panel .xterm-rows:has-text("dropped.txt")');
    await screenshot('conversation-terminal');
    await page.keyboard.type('exit');
    await page.keyboard.press('Enter');
    await page.waitForSelector('.terminal-panel .term-status:has-text("exited with code 0")', { timeout: 30_000 });
  });

  test('audit: the trail of the conversation shows the upload', T, async () => {
    await go('#/c/acme-demo/audit');
    await page.waitForSelector('.audit-panel tbody code:text-is("http.upload")');
    await page.selectOption('.audit-panel select', 'changes');
    await page.waitForFunction(() => ![...document.querySelectorAll('.audit-panel tbody code')]
      .some((c) => ['ls', 'http.ls', 'http.get', 'get'].includes(c.textContent)));
    await page.waitForSelector('.audit-panel tbody code:text-is("http.upload")');
  });

  test('installation: version, runtime, store and checks', T, async () => {
    await go('#/installation');
    const server = page.locator('section[aria-labelledby="inst-server"]');
    await server.locator('dt:text("Store")').waitFor();
    assert.match(await server.innerText(), /Runtime\s+host/);
    assert.match(await server.innerText(), /Store\s+(sqlite|postgres)/);
    await page.locator('section[aria-labelledby="inst-doctor"] ul.doctor li').first().waitFor();
    // sessionbox doctor's report, as the CLI prints it, with its verdict.
    const doctor = page.locator('section[aria-labelledby="inst-doctor-report"]');
    await doctor.locator('details.doctor-report').waitFor({ timeout: 30_000 });
    const api = await rest(d.keys.acme, '/v1/installation/doctor');
    assert.equal(api.body.available, true);
    assert.match(await doctor.innerText(), api.body.ok ? /can run here/ : /cannot run here/);
    await doctor.locator('summary').click();
    const shown = await doctor.locator('pre').innerText();
    assert.match(shown, /^sandbox layers/);
    assert.equal(shown.trim(), api.body.report.trim());
    await page.waitForSelector('#chart-rate canvas', { timeout: 30_000 });
    await screenshot('installation');
  });
});
