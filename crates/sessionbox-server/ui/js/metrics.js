// The server's Prometheus text (GET /metrics) → numbers over time. Pure, so the unit tests
// run it in Node.

const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

function unescapeLabel(value) {
  return value.replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
}

/** Samples of the exposition text: [{name, labels, value}]. Comments and junk are skipped. */
export function parseMetrics(text) {
  const samples = [];
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const m = LINE.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[2]) for (const [, key, value] of m[2].matchAll(LABEL)) labels[key] = unescapeLabel(value);
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return samples;
}

/** The sum of a metric's series (those `where` accepts); null when it has none. */
export function total(samples, name, where = () => true) {
  let sum = null;
  for (const s of samples) {
    if (s.name === name && where(s.labels) && Number.isFinite(s.value)) sum = (sum ?? 0) + s.value;
  }
  return sum;
}

/** Cumulative histogram buckets summed over series: [[le, count]], by le. */
export function buckets(samples, name) {
  const byLe = new Map();
  for (const s of samples) {
    if (s.name !== name || s.labels.le === undefined) continue;
    const le = s.labels.le === '+Inf' ? Infinity : Number(s.labels.le);
    byLe.set(le, (byLe.get(le) ?? 0) + s.value);
  }
  return [...byLe.entries()].sort((a, b) => a[0] - b[0]);
}

/** The q-quantile of cumulative buckets, interpolated linearly within its bucket. */
export function quantile(q, cumulative) {
  if (!cumulative.length) return null;
  const count = cumulative[cumulative.length - 1][1];
  if (!(count > 0)) return null;
  const rank = q * count;
  let prevLe = 0;
  let prevCount = 0;
  for (const [le, c] of cumulative) {
    if (c >= rank) {
      if (le === Infinity) return prevLe;
      if (c === prevCount) return le;
      return prevLe + (le - prevLe) * ((rank - prevCount) / (c - prevCount));
    }
    prevLe = le;
    prevCount = c;
  }
  return prevLe;
}

/** What one scrape says, at time t (ms). */
export function reading(text, t) {
  const s = parseMetrics(text);
  return {
    t,
    live: total(s, 'sessionbox_live_conversations'),
    background: total(s, 'sessionbox_background_commands_running'),
    busy: total(s, 'sessionbox_busy_conversations'),
    execs: total(s, 'sessionbox_execs_total') ?? 0,
    requests: total(s, 'sessionbox_http_requests_total') ?? 0,
    errors: total(s, 'sessionbox_http_errors_total') ?? 0,
    durationSum: total(s, 'sessionbox_http_request_duration_seconds_sum') ?? 0,
    durationCount: total(s, 'sessionbox_http_request_duration_seconds_count') ?? 0,
    buckets: buckets(s, 'sessionbox_http_request_duration_seconds_bucket'),
  };
}

/**
 * The rates between two readings: commands and requests per second, mean and 95th percentile
 * latency (ms) of the requests answered in between. null where it cannot be said (a counter
 * went back: the server restarted; too long apart; nothing answered).
 */
export function between(prev, cur, maxGapMs = 30_000) {
  const point = { t: cur.t, live: cur.live, background: cur.background, busy: cur.busy,
    execRate: null, requestRate: null, meanMs: null, p95Ms: null };
  if (!prev) return point;
  const dt = (cur.t - prev.t) / 1000;
  if (dt <= 0 || cur.t - prev.t > maxGapMs) return point;
  const diff = (a, b) => (b >= a ? b - a : null);
  const execs = diff(prev.execs, cur.execs);
  const requests = diff(prev.requests, cur.requests);
  point.execRate = execs === null ? null : execs / dt;
  point.requestRate = requests === null ? null : requests / dt;
  const count = diff(prev.durationCount, cur.durationCount);
  const sum = diff(prev.durationSum, cur.durationSum);
  if (count && sum !== null) point.meanMs = (sum / count) * 1000;
  if (count) {
    const before = new Map(prev.buckets);
    const delta = cur.buckets.map(([le, c]) => [le, c - (before.get(le) ?? 0)]);
    if (delta.every(([, c]) => c >= 0)) {
      const p95 = quantile(0.95, delta);
      point.p95Ms = p95 === null ? null : p95 * 1000;
    }
  }
  return point;
}

/** A fixed-size buffer that forgets the oldest item. */
export class Ring {
  constructor(capacity) {
    this.capacity = capacity;
    this.items = [];
  }

  push(item) {
    this.items.push(item);
    if (this.items.length > this.capacity) this.items.splice(0, this.items.length - this.capacity);
  }

  get length() {
    return this.items.length;
  }

  last() {
    return this.items[this.items.length - 1];
  }

  /** uPlot's columns: [xs (seconds), ...one array per field]. */
  columns(fields) {
    return [this.items.map((p) => p.t / 1000), ...fields.map((f) => this.items.map((p) => p[f] ?? null))];
  }
}
