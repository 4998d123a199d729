// The dashboard's pure modules, run in Node: metrics parsing and rates, routes, file types.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { Ring, between, buckets, parseMetrics, quantile, reading, total } from '../../crates/sessionbox-server/ui/js/metrics.js';
import { hashOf, parseRoute } from '../../crates/sessionbox-server/ui/js/route.js';
import { asText, imageType, joinPath, languageOf, LANGUAGES } from '../../crates/sessionbox-server/ui/js/filetypes.js';
import { configureBase, conv, pathSegments } from '../../crates/sessionbox-server/ui/js/api.js';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { uiDir } from './harness.mjs';

const SCRAPE = `# HELP sessionbox_execs_total Commands started, by mode
# TYPE sessionbox_execs_total counter
sessionbox_execs_total{mode="json"} 3
sessionbox_execs_total{mode="background"} 2
sessionbox_live_conversations 4
sessionbox_http_requests_total{method="GET",route="/v1/conversations/{id}",status="200"} 10
sessionbox_http_requests_total{method="POST",route="/v1/x",status="500"} 2
sessionbox_http_request_duration_seconds_bucket{method="GET",route="/a",le="0.01"} 5
sessionbox_http_request_duration_seconds_bucket{method="GET",route="/a",le="0.1"} 9
sessionbox_http_request_duration_seconds_bucket{method="GET",route="/a",le="+Inf"} 10
sessionbox_http_request_duration_seconds_bucket{method="GET",route="/b",le="0.01"} 0
sessionbox_http_request_duration_seconds_bucket{method="GET",route="/b",le="0.1"} 0
sessionbox_http_request_duration_seconds_bucket{method="GET",route="/b",le="+Inf"} 2
sessionbox_http_request_duration_seconds_sum{method="GET",route="/a"} 0.25
sessionbox_http_request_duration_seconds_count{method="GET",route="/a"} 10
sessionbox_http_request_duration_seconds_sum{method="GET",route="/b"} 1.5
sessionbox_http_request_duration_seconds_count{method="GET",route="/b"} 2
weird_label{a="x\\"y",b="line\\nnext"} 1.5e3
not a sample line
`;

describe('metrics', () => {
  test('parses samples, labels with escapes, and skips comments', () => {
    const samples = parseMetrics(SCRAPE);
    assert.equal(samples.length, 16);
    const weird = samples.find((s) => s.name === 'weird_label');
    assert.deepEqual(weird.labels, { a: 'x"y', b: 'line\nnext' });
    assert.equal(weird.value, 1500);
    assert.equal(total(samples, 'sessionbox_execs_total'), 5);
    assert.equal(total(samples, 'sessionbox_execs_total', (l) => l.mode === 'json'), 3);
    assert.equal(total(samples, 'no_such_metric'), null);
  });

  test('histogram buckets are summed across series and quantiles interpolate', () => {
    const b = buckets(parseMetrics(SCRAPE), 'sessionbox_http_request_duration_seconds_bucket');
    assert.deepEqual(b, [[0.01, 5], [0.1, 9], [Infinity, 12]]);
    // rank 6 of 12 falls in (0.01, 0.1]: 0.01 + 0.09 * (6 - 5) / (9 - 5)
    assert.ok(Math.abs(quantile(0.5, b) - 0.0325) < 1e-9);
    // rank 11.4 falls in +Inf: the last finite bound
    assert.equal(quantile(0.95, b), 0.1);
    assert.equal(quantile(0.5, []), null);
    assert.equal(quantile(0.5, [[0.1, 0], [Infinity, 0]]), null);
  });

  test('rates between two readings, and none across a restart or a long gap', () => {
    const a = reading(SCRAPE, 0);
    const later = SCRAPE
      .replace('sessionbox_execs_total{mode="json"} 3', 'sessionbox_execs_total{mode="json"} 13')
      .replace('route="/a",le="0.01"} 5', 'route="/a",le="0.01"} 15')
      .replace('route="/a",le="0.1"} 9', 'route="/a",le="0.1"} 19')
      .replace('route="/a",le="+Inf"} 10', 'route="/a",le="+Inf"} 20')
      .replace('route="/a"} 0.25', 'route="/a"} 0.35')
      .replace('sessionbox_http_request_duration_seconds_count{method="GET",route="/a"} 10', 'sessionbox_http_request_duration_seconds_count{method="GET",route="/a"} 20');
    const b = reading(later, 5000);
    const p = between(a, b);
    assert.equal(p.execRate, 2); // 10 more in 5 s
    assert.equal(p.live, 4);
    assert.ok(Math.abs(p.meanMs - 10) < 1e-9); // 0.1 s over 10 requests
    assert.ok(p.p95Ms > 0 && p.p95Ms <= 10, `p95 ${p.p95Ms}`); // all 10 in the first bucket
    const restarted = reading(SCRAPE.replace('{mode="json"} 3', '{mode="json"} 0'), 10_000);
    assert.equal(between(b, restarted).execRate, null);
    assert.equal(between(a, reading(SCRAPE, 120_000)).execRate, null);
    assert.equal(between(null, a).execRate, null);
  });

  test('the ring buffer keeps the newest items and gives uPlot columns', () => {
    const ring = new Ring(3);
    for (let i = 1; i <= 5; i += 1) ring.push({ t: i * 1000, v: i, w: i % 2 ? null : i });
    assert.equal(ring.length, 3);
    assert.deepEqual(ring.columns(['v', 'w']), [[3, 4, 5], [3, 4, 5], [null, 4, null]]);
    assert.equal(ring.last().v, 5);
  });
});

describe('routes', () => {
  test('hash routes', () => {
    assert.deepEqual(parseRoute(''), { name: 'conversations' });
    assert.deepEqual(parseRoute('#/'), { name: 'conversations' });
    assert.deepEqual(parseRoute('#/installation'), { name: 'installation' });
    assert.deepEqual(parseRoute('#/c/abc'), { name: 'conversation', id: 'abc', tab: 'files', path: '' });
    assert.deepEqual(parseRoute('#/c/abc/terminal'), { name: 'conversation', id: 'abc', tab: 'terminal', path: '' });
    assert.deepEqual(parseRoute('#/c/abc/files/src/a%20b'), { name: 'conversation', id: 'abc', tab: 'files', path: 'src/a b' });
    assert.deepEqual(parseRoute('#/c/abc/nope'), { name: 'missing' });
    assert.deepEqual(parseRoute('#/c/abc/terminal/x'), { name: 'missing' });
    assert.deepEqual(parseRoute('#/elsewhere'), { name: 'missing' });
  });

  test('hashOf round-trips through parseRoute', () => {
    for (const [id, tab, path] of [['a.b-c', 'files', ''], ['x', 'files', 'dir/with space/é'], ['x', 'audit', '']]) {
      const r = parseRoute(hashOf(id, tab, path));
      assert.deepEqual([r.id, r.tab, r.path], [id, tab, path]);
    }
    assert.equal(hashOf('x'), '#/c/x');
  });
});

describe('file types', () => {
  test('languages and images by name', () => {
    assert.equal(languageOf('src/main.rs'), 'rust');
    assert.equal(languageOf('Makefile'), 'makefile');
    assert.equal(languageOf('a/Dockerfile'), 'dockerfile');
    assert.equal(languageOf('pyproject.toml'), 'ini');
    assert.equal(languageOf('README'), null);
    assert.equal(imageType('x/y.PNG'), 'image/png');
    // An SVG can hold script: never a blob: image, always XML text.
    assert.equal(imageType('logo.svg'), null);
    assert.equal(languageOf('logo.svg'), 'xml');
    assert.equal(imageType('notes.txt'), null);
    assert.equal(joinPath('', 'a'), 'a');
    assert.equal(joinPath('a/b/', '/c'), 'a/b/c');
  });

  test('every language the page may ask for is vendored', () => {
    for (const language of LANGUAGES) {
      assert.ok(existsSync(join(uiDir, 'vendor', 'highlight', 'languages', `${language}.min.js`)), language);
    }
  });

  test('text or binary', () => {
    const enc = new TextEncoder();
    assert.equal(asText(enc.encode('héllo')), 'héllo');
    assert.equal(asText(new Uint8Array([104, 0, 105])), null);
    assert.equal(asText(new Uint8Array([0xff, 0xfe, 0x41])), null);
    // A character cut in two at the end of a partial read is not binary.
    const cut = enc.encode('abcé').subarray(0, 4);
    assert.equal(asText(cut, true), 'abc');
    assert.equal(asText(cut, false), null);
  });
});

describe('api', () => {
  test('?api= is honoured only in development, between loopback addresses', () => {
    const at = (pathname, hostname, search) => ({ pathname, hostname, search });
    assert.equal(configureBase(at('/', '127.0.0.1', '?api=http://127.0.0.1:7070')), 'http://127.0.0.1:7070');
    assert.equal(configureBase(at('/ui/', '127.0.0.1', '')), '');
    // Served by sessionbox: its own server, whatever a link says.
    assert.throws(() => configureBase(at('/ui/', '127.0.0.1', '?api=http://127.0.0.1:9')));
    assert.throws(() => configureBase(at('/', 'dash.example', '?api=http://127.0.0.1:9')));
    assert.throws(() => configureBase(at('/', '127.0.0.1', '?api=https://evil.example')));
    configureBase(at('/ui/', '127.0.0.1', ''));
  });

  test('a dot segment never reaches a URL', () => {
    assert.equal(pathSegments('a/b c/d'), 'a/b%20c/d');
    for (const bad of ['..', 'a/../b', './x', 'a/%2e%2e/b', '%2E']) {
      assert.throws(() => pathSegments(bad), bad);
    }
    assert.throws(() => conv('..'));
    assert.equal(conv('c1', '/ls'), '/v1/conversations/c1/ls');
  });
});
