// The installation: version, runtime, store, doctor and gc (GET /v1/installation), activity
// over time from /metrics (polled every 5 s into a ring buffer kept for the browser tab,
// plotted with uPlot), and the tenant's egress verdicts.

import { getJson, isMissing, query, request } from './api.js';
import { egressTable } from './records.js';
import { facts, fmtTime, h, inlineError, notAvailable, poll, setText, timeEl } from './dom.js';
import { Ring, between, reading } from './metrics.js';

const METRICS_EVERY_MS = 5000;
const INSTALLATION_EVERY_MS = 15_000;
const EGRESS_EVERY_MS = 10_000;

// Kept while the tab lives, so coming back shows the recent past (15 minutes).
const history = new Ring(180);
let lastReading = null;

let uPlotModule = null;
function loadUPlot() {
  uPlotModule ??= import('../vendor/uplot/uPlot.esm.js').then((m) => m.default);
  return uPlotModule;
}

const CHARTS = [
  {
    id: 'chart-sandboxes',
    title: 'Live sandboxes',
    unit: '',
    series: [
      { field: 'live', label: 'live sandboxes', color: '--chart-1' },
      { field: 'background', label: 'background commands', color: '--chart-2' },
      { field: 'busy', label: 'busy conversations', color: '--chart-3' },
    ],
  },
  {
    id: 'chart-rate',
    title: 'Commands and requests per second',
    unit: '/s',
    series: [
      { field: 'execRate', label: 'commands/s', color: '--chart-1' },
      { field: 'requestRate', label: 'requests/s', color: '--chart-2' },
    ],
  },
  {
    id: 'chart-latency',
    title: 'Request latency (ms)',
    unit: ' ms',
    series: [
      { field: 'meanMs', label: 'mean', color: '--chart-1' },
      { field: 'p95Ms', label: '95th percentile', color: '--chart-3' },
    ],
  },
];

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || '#888';
}

function fmtNumber(v, unit) {
  if (v === null || v === undefined) return '—';
  const text = Math.abs(v) >= 100 || Number.isInteger(v) ? String(Math.round(v)) : v.toFixed(2);
  return `${text}${unit}`;
}

function makeChart(spec) {
  const captionId = `${spec.id}-caption`;
  const summaryId = `${spec.id}-summary`;
  const plotBox = h('div', { class: 'plot', id: spec.id, 'aria-hidden': 'true' });
  const summary = h('p', { class: 'chart-summary', id: summaryId });
  const figure = h('figure', { class: 'chart', 'aria-labelledby': captionId, 'aria-describedby': summaryId },
    h('figcaption', { id: captionId, text: spec.title }), plotBox, summary);
  let plot = null;
  let observer = null;
  return {
    figure,
    async draw() {
      const data = history.columns(spec.series.map((s) => s.field));
      const now = history.last();
      setText(summary, now
        ? `Now: ${spec.series.map((s) => `${s.label} ${fmtNumber(now[s.field], spec.unit)}`).join(', ')}.`
        : 'Collecting: a point every 5 seconds.');
      if (history.length < 2) return;
      if (!plot) {
        const uPlot = await loadUPlot();
        if (plot || !figure.isConnected) return;
        const axis = { stroke: cssVar('--muted'), grid: { stroke: cssVar('--grid'), width: 1 }, ticks: { stroke: cssVar('--grid') } };
        plot = new uPlot({
          width: Math.max(240, plotBox.clientWidth),
          height: 180,
          scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max ?? 1, 1) * 1.1] } },
          axes: [axis, { ...axis, size: 50 }],
          series: [{}, ...spec.series.map((s) => ({
            label: s.label, stroke: cssVar(s.color), width: 2, spanGaps: false,
            value: (u, v) => fmtNumber(v, spec.unit),
          }))],
          legend: { live: false },
          cursor: { drag: { x: false, y: false } },
        }, data, plotBox);
        observer = new ResizeObserver(() => {
          if (plotBox.clientWidth > 0) plot.setSize({ width: plotBox.clientWidth, height: 180 });
        });
        observer.observe(plotBox);
      } else {
        plot.setData(data);
      }
    },
    dispose() {
      observer?.disconnect();
      plot?.destroy();
    },
  };
}

function doctorList(checks) {
  if (!checks.length) return h('p', { class: 'muted', text: 'No checks reported.' });
  return h('ul', { class: 'doctor' }, checks.map((c) =>
    h('li', { class: c.ok ? 'ok' : 'failed' },
      h('span', { class: `badge ${c.ok ? 'outcome-ok' : 'outcome-failed'}`, text: c.ok ? 'ok' : 'failing' }),
      ' ', h('strong', { text: c.check }),
      c.detail ? h('span', { class: 'muted', text: ` — ${c.detail}` }) : null)));
}

// `sessionbox doctor` on the server's machine (GET /v1/installation/doctor; the server runs it
// at most every 10 minutes).
export function doctorReport(d) {
  if (!d.available) {
    return h('p', { class: 'muted', text: 'This server cannot run sessionbox doctor (it was not started by sessionbox serve).' });
  }
  const verdict = d.ok
    ? h('span', { class: 'badge outcome-ok', text: 'can run' })
    : h('span', { class: 'badge outcome-failed', text: 'cannot run' });
  return h('div', {},
    h('p', {}, verdict, ' The default runtime ', d.ok ? 'can run here' : 'cannot run here',
      d.checked_at ? h('span', { class: 'muted' }, ' · checked ', timeEl(d.checked_at)) : null, '.'),
    d.problems.length
      ? h('ul', { class: 'doctor', 'aria-label': 'Problems doctor found' }, d.problems.map((p) =>
        h('li', { class: 'failed' }, h('span', { class: 'badge outcome-failed', text: 'problem' }), ' ', h('code', { text: p }))))
      : h('p', { class: 'muted', text: 'No problem found.' }),
    h('details', { class: 'doctor-report' },
      h('summary', { text: 'The whole report (as sessionbox doctor prints it)' }),
      h('pre', { class: 'log', tabindex: '0', 'aria-label': 'sessionbox doctor report', text: d.report })));
}

export function renderInstallation(main, session) {
  const serverBox = h('div', {}, h('p', { class: 'muted', text: 'Loading…' }));
  const doctorBox = h('div', {}, h('p', { class: 'muted', text: 'Loading…' }));
  const gcBox = h('div', {}, h('p', { class: 'muted', text: 'Loading…' }));
  const reportBox = h('div', {}, h('p', { class: 'muted', text: 'Running the checks…' }));
  const metricsProblem = h('div', { class: 'problem' });
  const charts = CHARTS.map(makeChart);
  const egressProblem = h('div', { class: 'problem' });
  const egress = egressTable('Egress verdicts of every conversation of the tenant');

  const section = (id, title, ...content) => h('section', { class: 'block', 'aria-labelledby': id },
    h('h2', { id, text: title }), ...content);
  main.append(
    h('h1', { text: 'Installation' }),
    section('inst-server', 'Server', serverBox),
    section('inst-activity', 'Activity', h('p', { class: 'muted', text: 'Sampled from /metrics every 5 seconds while this page is open; the last 15 minutes are kept for this browser tab.' }),
      metricsProblem, h('div', { class: 'charts' }, charts.map((c) => c.figure))),
    section('inst-doctor', 'Checks', doctorBox),
    section('inst-doctor-report', 'Doctor', reportBox),
    section('inst-gc', 'Garbage collection', gcBox),
    section('inst-egress', session.tenant ? `Egress verdicts of tenant ${session.tenant}` : 'Egress verdicts of the tenant',
      egressProblem, egress.el));

  const drawAll = () => Promise.all(charts.map((c) => c.draw()));

  const loadMetrics = async () => {
    try {
      const text = await (await request('/metrics')).text();
      const r = reading(text, Date.now());
      history.push(between(lastReading, r));
      lastReading = r;
      metricsProblem.replaceChildren();
    } catch (error) {
      metricsProblem.replaceChildren(inlineError(error, 'Could not read /metrics'));
    }
    await drawAll();
  };

  let installationMissing = false;
  const loadInstallation = async () => {
    let inst = null;
    let missingError = null;
    if (!installationMissing) {
      try {
        inst = await getJson('/v1/installation');
      } catch (error) {
        if (!isMissing(error)) {
          serverBox.replaceChildren(inlineError(error, 'Could not read the installation'));
          return;
        }
        installationMissing = true;
        missingError = error;
      }
    }
    let ready = null;
    try {
      ready = await getJson('/readyz');
    } catch (error) {
      ready = { status: `not ready: ${error.message}` };
    }
    if (inst) {
      serverBox.replaceChildren(facts([
        ['Version', inst.version],
        ['Runtime', inst.runtime],
        ['Store', inst.store],
        ['Boundary', inst.boundary],
        ['Status', ready?.status ?? '—'],
        ['Live sandboxes', String(inst.live_sandboxes)],
        ['Conversations', String(inst.conversations)],
      ]));
      doctorBox.replaceChildren(doctorList(inst.checks || []));
      gcBox.replaceChildren(inst.gc
        ? h('div', {}, h('p', {}, 'Last run ', timeEl(inst.gc.at), ` (${fmtTime(inst.gc.at)}).`),
          inst.gc.error
            ? h('p', { class: 'error', text: `It failed: ${inst.gc.error}` })
            : facts([
              ['Expired conversations destroyed', String(inst.gc.expired)],
              ['Stuck conversations finished', String(inst.gc.stuck)],
              ['Orphans removed', String(inst.gc.orphans)],
              ['Dangling records removed', String(inst.gc.dangling)],
              ['Idle sandboxes stopped', String(inst.gc.idle_stopped)],
              ['Snapshots expired', String(inst.gc.snapshots_expired)],
            ]))
        : h('p', { class: 'muted', text: 'No garbage collection has run since the server started.' }));
    } else if (installationMissing) {
      if (missingError || !serverBox.querySelector('.unavailable')) {
        const fallback = facts([
          ['Runtime', ready?.runtime ?? '—'],
          ['Status', ready?.status ?? '—'],
        ]);
        serverBox.replaceChildren(notAvailable('The installation summary (GET /v1/installation)', missingError), fallback);
        doctorBox.replaceChildren(notAvailable('The checks'));
        gcBox.replaceChildren(notAvailable('The last garbage collection'));
      } else {
        const dl = serverBox.querySelector('dl');
        dl?.replaceWith(facts([['Runtime', ready?.runtime ?? '—'], ['Status', ready?.status ?? '—']]));
      }
    }
  };

  let doctorMissing = false;
  const loadDoctor = async () => {
    if (doctorMissing) return;
    try {
      reportBox.replaceChildren(doctorReport(await getJson('/v1/installation/doctor')));
    } catch (error) {
      if (isMissing(error)) {
        doctorMissing = true;
        reportBox.replaceChildren(notAvailable('The doctor report (GET /v1/installation/doctor)', error));
      } else {
        reportBox.replaceChildren(inlineError(error, 'Could not read the doctor report'));
      }
    }
  };

  const loadEgress = async () => {
    try {
      const answer = await getJson(`/v1/egress-log${query({ limit: 100 })}`);
      egress.fill(answer.entries);
      egressProblem.replaceChildren();
    } catch (error) {
      egressProblem.replaceChildren(inlineError(error, 'Could not read the egress log'));
    }
  };

  drawAll();
  const stops = [
    poll(loadMetrics, METRICS_EVERY_MS),
    poll(loadInstallation, INSTALLATION_EVERY_MS),
    poll(loadDoctor, INSTALLATION_EVERY_MS),
    poll(loadEgress, EGRESS_EVERY_MS),
  ];
  return () => {
    for (const stop of stops) stop();
    for (const chart of charts) chart.dispose();
  };
}
