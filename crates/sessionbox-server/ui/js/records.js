// A conversation's records: network policy and egress verdicts, audit trail, snapshots.
// Each panel polls while it is shown.

import { conv, getJson, isMissing, query } from './api.js';
import { dataTable, facts, fmtBytes, fmtTime, h, inlineError, notAvailable, poll, row, timeEl } from './dom.js';

/** Operations that only read: hidden by the audit panel's "changes only" filter. */
export const READ_OPERATIONS = new Set([
  'get', 'list', 'ls', 'read', 'stat', 'glob', 'grep', 'commands', 'command_logs', 'egress_log',
  'policy_get', 'snapshots', 'templates', 'skills', 'skill', 'watch',
]);

function panelShell(id, name, title, intro) {
  const headingId = `${name}-title-${id}`;
  const body = h('div', { class: 'panel-body' });
  const el = h('section', { class: `panel ${name}-panel`, 'aria-labelledby': headingId },
    h('h2', { id: headingId, tabindex: '-1', text: title }),
    intro ? h('p', { class: 'muted', text: intro }) : null,
    body);
  return { el, body };
}

/** A panel whose `load` fills it, polled every `ms` while shown. */
function polled(el, load, ms) {
  let stop = null;
  return {
    el,
    show() {
      stop ??= poll(load, ms);
    },
    hide() {
      stop?.();
      stop = null;
    },
    dispose() {
      stop?.();
    },
  };
}

/**
 * Rows of a table replaced only when the data changed, or each minute for the relative times
 * (nothing focusable in them).
 */
function fillTable(tbody, items, toCells, labels) {
  const stamp = JSON.stringify([Math.floor(Date.now() / 60_000), items]);
  if (tbody.dataset.stamp === stamp) return;
  tbody.dataset.stamp = stamp;
  tbody.replaceChildren(...items.map((item) => row(labels, toCells(item))));
}

// ---------- network ----------

const EGRESS_COLUMNS = ['Target', 'When', 'Verdict', 'Method', 'Rule or reason', 'Sent / received', 'Count'];

export function egressCells(v) {
  return [
    h('code', { text: v.target }),
    timeEl(v.at),
    h('span', { class: `badge verdict-${v.verdict}`, text: v.verdict }),
    v.method,
    v.rule,
    `${fmtBytes(v.bytes_up)} / ${fmtBytes(v.bytes_down)}`,
    String(v.count),
  ];
}

export function egressTable(caption) {
  const table = dataTable(caption, EGRESS_COLUMNS.map((label) => ({ label })), { cls: 'egress' });
  const empty = h('p', { class: 'empty', hidden: true, text: 'No verdicts: nothing asked to reach the network through the gateway.' });
  const fill = (entries) => {
    fillTable(table.tbody, entries, egressCells, EGRESS_COLUMNS);
    table.wrap.hidden = entries.length === 0;
    empty.hidden = entries.length !== 0;
  };
  return { el: h('div', {}, table.wrap, empty), fill };
}

function policyFacts(p) {
  const list = (rules) => (rules.length
    ? h('ul', { class: 'rules' }, rules.map((r) => h('li', {}, h('code', { text: r }))))
    : h('span', { class: 'muted', text: 'none' }));
  const profile = p.profile === 'none' ? 'none (no network)' : p.profile;
  return facts([
    ['Profile', profile],
    ['From', p.source === 'default' ? 'the default' : `the ${p.source}'s policy`],
    ['Allowed', list(p.allow)],
    ['Denied', list(p.deny)],
    ['Set', p.updated_at ? h('time', { datetime: p.updated_at, text: fmtTime(p.updated_at) }) : '—'],
    ['Hash', h('code', { title: p.hash, text: p.hash.slice(0, 16) })],
  ]);
}

export function createNetworkPanel(id) {
  const { el, body } = panelShell(id, 'network', 'Network',
    'The network policy in force and the egress gateway\'s verdicts for this conversation, newest first.');
  const policyBox = h('div', {}, h('p', { class: 'muted', text: 'Loading…' }));
  const verdicts = egressTable('Egress verdicts of this conversation');
  const verdictProblem = h('div', { class: 'problem' });
  body.append(
    h('h3', { text: 'Policy' }), policyBox,
    h('h3', { text: 'Egress verdicts' }), verdictProblem, verdicts.el);
  const load = async () => {
    const [policy, log] = await Promise.allSettled([
      getJson(conv(id, '/policy')),
      getJson(`${conv(id, '/egress-log')}${query({ limit: 100 })}`),
    ]);
    if (policy.status === 'fulfilled') {
      const stamp = JSON.stringify(policy.value);
      if (policyBox.dataset.stamp !== stamp) {
        policyBox.dataset.stamp = stamp;
        policyBox.replaceChildren(policyFacts(policy.value));
      }
    } else {
      policyBox.dataset.stamp = '';
      policyBox.replaceChildren(inlineError(policy.reason, 'Could not read the policy'));
    }
    if (log.status === 'fulfilled') {
      verdictProblem.replaceChildren();
      verdicts.fill(log.value.entries);
    } else {
      verdictProblem.replaceChildren(inlineError(log.reason, 'Could not read the egress log'));
    }
  };
  return polled(el, load, 5000);
}

// ---------- audit ----------

const AUDIT_COLUMNS = ['Operation', 'When', 'Outcome', 'Detail'];

export function createAuditPanel(id) {
  const { el, body } = panelShell(id, 'audit', 'Audit trail',
    'What was done to this conversation through the API, newest first (this page\'s own reads included). Never file contents, commands or secrets.');
  const filter = h('select', { id: `audit-filter-${id}` },
    h('option', { value: 'all', text: 'All operations' }),
    h('option', { value: 'changes', text: 'Changes only (hide reads)' }));
  const problem = h('div', { class: 'problem' });
  const table = dataTable('Audit records', AUDIT_COLUMNS.map((label) => ({ label })), { cls: 'audit' });
  const empty = h('p', { class: 'empty', hidden: true, text: 'No records.' });
  body.append(h('div', { class: 'filters' }, h('div', { class: 'field' },
    h('label', { for: `audit-filter-${id}`, text: 'Show' }), filter)), problem, table.wrap, empty);
  let records = [];
  let missing = false;
  const render = () => {
    // `http.X` and `mcp.X` are the front ends' records of operation X.
    const isRead = (op) => READ_OPERATIONS.has(op.replace(/^(http|mcp)\./, ''));
    const shown = filter.value === 'changes' ? records.filter((r) => !isRead(r.operation)) : records;
    fillTable(table.tbody, shown, (r) => [
      h('code', { text: r.operation }),
      timeEl(r.at),
      h('span', { class: `badge outcome-${r.outcome === 'ok' ? 'ok' : 'failed'}`, text: r.outcome }),
      r.detail ? h('code', { class: 'detail', text: r.detail }) : h('span', { class: 'muted', text: '—' }),
    ], AUDIT_COLUMNS);
    table.wrap.hidden = shown.length === 0;
    empty.hidden = shown.length !== 0;
  };
  filter.addEventListener('change', render);
  const load = async () => {
    if (missing) return;
    try {
      const answer = await getJson(`/v1/audit${query({ conversation: id, limit: 200 })}`);
      records = answer.records;
      problem.replaceChildren();
      render();
    } catch (error) {
      if (isMissing(error)) {
        missing = true;
        table.wrap.hidden = true;
        filter.disabled = true;
        problem.replaceChildren(notAvailable('The audit trail (GET /v1/audit)', error));
      } else {
        problem.replaceChildren(inlineError(error, 'Could not read the audit trail'));
      }
    }
  };
  return polled(el, load, 10_000);
}

// ---------- snapshots ----------

const SNAPSHOT_COLUMNS = ['Name', 'Taken', 'Contents', 'Size', 'Stored', 'Expires'];

export function createSnapshotsPanel(id) {
  const { el, body } = panelShell(id, 'snapshots', 'Snapshots',
    'Snapshots taken of this conversation\'s workspace, oldest first.');
  const problem = h('div', { class: 'problem' });
  const table = dataTable('Snapshots of this conversation', SNAPSHOT_COLUMNS.map((label) => ({ label })), { cls: 'snapshots' });
  const empty = h('p', { class: 'empty', hidden: true },
    'No snapshots of this conversation. Take one with ', h('code', { text: `sessionbox snapshot take -c ${id}` }),
    ' or POST …/snapshots.');
  body.append(problem, table.wrap, empty);
  const load = async () => {
    try {
      const answer = await getJson('/v1/snapshots');
      const mine = answer.snapshots.filter((s) => s.origin === id);
      fillTable(table.tbody, mine, (s) => [
        h('code', { text: s.name }),
        h('time', { datetime: s.created_at, text: fmtTime(s.created_at) }),
        `${s.files} files, ${s.directories} folders, ${s.links} links`,
        fmtBytes(s.bytes),
        fmtBytes(s.stored_bytes),
        s.expires_at ? timeEl(s.expires_at) : 'never',
      ], SNAPSHOT_COLUMNS);
      table.wrap.hidden = mine.length === 0;
      empty.hidden = mine.length !== 0;
      problem.replaceChildren();
    } catch (error) {
      problem.replaceChildren(inlineError(error, 'Could not list the snapshots'));
    }
  };
  return polled(el, load, 15_000);
}

