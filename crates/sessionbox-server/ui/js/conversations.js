// The conversations of the tenant: a live list (polled), search and filters, disk and memory
// use, destroy.

import { conv, getJson, query } from './api.js';
import { destroyConversation } from './dialogs.js';
import { announce, dataTable, fmtBytes, h, inlineError, poll, setText, syncRows, timeEl } from './dom.js';
import { hashOf } from './route.js';

const LIST_EVERY_MS = 5000;
// Disk and memory come from each conversation's own GET, at most USAGE_PER_ROUND a round.
const USAGE_EVERY_MS = 15_000;
const USAGE_PER_ROUND = 20;
const PAGE = 1000;
const MAX_PAGES = 10;

const COLUMNS = ['Conversation', 'State', 'Runtime', 'Last used', 'Expires', 'Disk', 'Memory', 'Actions'];

/** Every conversation of the tenant (following cursors, up to MAX_PAGES pages). */
export async function listAll() {
  const all = [];
  let cursor = null;
  for (let page = 0; page < MAX_PAGES; page += 1) {
    const answer = await getJson(`/v1/conversations${query({ limit: PAGE, cursor })}`);
    all.push(...answer.conversations);
    cursor = answer.next_cursor;
    if (!cursor) return { conversations: all, complete: true };
  }
  return { conversations: all, complete: false };
}

export function matches(c, { text, state, runtime }) {
  if (text && !c.id.toLowerCase().includes(text.toLowerCase())) return false;
  if (state && c.state !== state) return false;
  if (runtime && c.runtime !== runtime) return false;
  return true;
}

export function diskCell(disk, runtime) {
  if (!disk) {
    return h('span', {
      class: 'muted',
      title: runtime === 'isolated' ? 'not measured yet' : `no disk quota on the ${runtime} runtime`,
      text: '—',
    });
  }
  const share = disk.bytes_limit ? disk.bytes_used / disk.bytes_limit : 0;
  return h('span', { class: 'disk' },
    h('meter', {
      min: '0', max: String(disk.bytes_limit || 1), value: String(disk.bytes_used),
      high: String(Math.round((disk.bytes_limit || 1) * 0.8)),
      'aria-label': 'Disk use',
    }),
    ` ${fmtBytes(disk.bytes_used)} of ${fmtBytes(disk.bytes_limit)}`,
    share >= 0.9 ? h('strong', { class: 'warn', text: ' (nearly full)' }) : null);
}

export function memoryCell(memory, runtime) {
  if (!memory) {
    return h('span', {
      class: 'muted',
      title: runtime === 'aio' ? 'conversations share one container on the aio runtime'
        : 'no sandbox running (stopped, paused or not started), or not measured yet',
      text: '—',
    });
  }
  const how = memory.measured === 'cgroup' ? 'charged to its memory cgroup' : 'resident memory of its processes';
  if (!memory.bytes_limit) {
    return h('span', { class: 'memory', title: `${how}; no limit for the sandbox as a whole` },
      `${fmtBytes(memory.bytes_used)}`, h('span', { class: 'muted', text: ' (no limit)' }));
  }
  const share = memory.bytes_used / memory.bytes_limit;
  return h('span', { class: 'memory', title: how },
    h('meter', {
      min: '0', max: String(memory.bytes_limit), value: String(memory.bytes_used),
      high: String(Math.round(memory.bytes_limit * 0.8)),
      'aria-label': 'Memory use',
    }),
    ` ${fmtBytes(memory.bytes_used)} of ${fmtBytes(memory.bytes_limit)}`,
    share >= 0.9 ? h('strong', { class: 'warn', text: ' (near its limit)' }) : null);
}

export function stateBadge(state) {
  return h('span', { class: `badge state-${state}`, text: state });
}

export function renderConversations(main, session) {
  const search = h('input', { id: 'conv-search', type: 'search', autocomplete: 'off', placeholder: 'id contains…' });
  const stateSel = h('select', { id: 'conv-state' },
    h('option', { value: '', text: 'Any' }),
    ['active', 'expired', 'destroying'].map((s) => h('option', { value: s, text: s })));
  const runtimeSel = h('select', { id: 'conv-runtime' }, h('option', { value: '', text: 'Any' }));
  const filters = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter conversations' },
    h('div', { class: 'field' }, h('label', { for: 'conv-search', text: 'Search by id' }), search),
    h('div', { class: 'field' }, h('label', { for: 'conv-state', text: 'State' }), stateSel),
    h('div', { class: 'field' }, h('label', { for: 'conv-runtime', text: 'Runtime' }), runtimeSel));
  filters.addEventListener('submit', (e) => e.preventDefault());

  const summary = h('p', { class: 'muted summary', id: 'conv-summary', text: 'Loading…' });
  const problem = h('div', { class: 'problem' });
  const { wrap, tbody } = dataTable('Conversations', COLUMNS.map((label) => ({ label })), { cls: 'cards' });
  const empty = h('p', { class: 'empty', hidden: true });

  main.append(
    h('h1', { text: 'Conversations' }),
    h('p', { class: 'lede' }, session.tenant ? `Tenant ${session.tenant}. ` : '',
      'The list refreshes every few seconds.'),
    filters, summary, problem, wrap, empty);

  let all = [];
  let complete = true;
  let updatedAt = null;
  const usages = new Map(); // id → {disk, memory, at}
  let usageRound = false;
  let stop = () => {};

  const criteria = () => ({ text: search.value.trim(), state: stateSel.value, runtime: runtimeSel.value });

  const make = (c) => {
    const link = h('a', { href: hashOf(c.id), class: 'conv-link' }, c.id);
    const destroy = h('button', {
      type: 'button', class: 'danger small', text: 'Destroy', 'aria-label': `Destroy ${c.id}`,
      onclick: async () => {
        if (await destroyConversation(c.id)) {
          usages.delete(c.id);
          stop.now?.();
        }
      },
    });
    const cells = [link, h('span'), h('span'), h('span'), h('span'), h('span'), h('span'), destroy];
    const tr = h('tr', {}, cells.map((cell, i) =>
      h(i === 0 ? 'th' : 'td', { scope: i === 0 ? 'row' : undefined, 'data-label': COLUMNS[i] }, cell)));
    tr.cellsOf = cells;
    return tr;
  };
  const update = (tr, c) => {
    const [, state, runtime, used, expires, disk, memory] = tr.cellsOf;
    const usage = usages.get(c.id);
    const stamp = JSON.stringify([c.state, c.runtime, c.last_used_at, c.expires_at, usage?.disk ?? null,
      usage?.memory ?? null, Math.floor(Date.now() / 30_000)]);
    if (tr.dataset.stamp === stamp) return;
    tr.dataset.stamp = stamp;
    state.replaceChildren(stateBadge(c.state));
    setText(runtime, c.runtime);
    used.replaceChildren(timeEl(c.last_used_at));
    expires.replaceChildren(c.expires_at ? timeEl(c.expires_at) : h('span', { class: 'muted', text: 'never' }));
    disk.replaceChildren(diskCell(usage?.disk, c.runtime));
    memory.replaceChildren(memoryCell(usage?.memory, c.runtime));
  };

  const render = () => {
    const runtimes = [...new Set(all.map((c) => c.runtime))].sort();
    const known = new Set([...runtimeSel.options].map((o) => o.value));
    for (const r of runtimes) if (!known.has(r)) runtimeSel.append(h('option', { value: r, text: r }));
    const shown = all.filter((c) => matches(c, criteria()));
    syncRows(tbody, shown, (c) => c.id, make, update);
    wrap.hidden = shown.length === 0;
    empty.hidden = shown.length !== 0;
    empty.textContent = all.length === 0 ? 'No conversations yet. An agent makes one with its first call.'
      : 'No conversation matches these filters.';
    const time = updatedAt ? updatedAt.toLocaleTimeString() : '';
    setText(summary, `${shown.length} of ${all.length}${complete ? '' : '+'} conversations shown · updated ${time}`);
    return shown;
  };

  // aio reports neither (one shared container); the others report memory, isolated disk too.
  const refreshUsages = async (shown) => {
    if (usageRound) return;
    usageRound = true;
    try {
      const now = Date.now();
      const due = shown
        .filter((c) => c.runtime !== 'aio' && c.state === 'active')
        .filter((c) => !usages.has(c.id) || now - usages.get(c.id).at > USAGE_EVERY_MS)
        .slice(0, USAGE_PER_ROUND);
      for (const c of due) {
        try {
          const one = await getJson(conv(c.id));
          usages.set(c.id, { disk: one.disk ?? null, memory: one.memory ?? null, at: Date.now() });
        } catch {
          usages.set(c.id, { disk: null, memory: null, at: Date.now() });
        }
      }
      if (due.length) render();
    } finally {
      usageRound = false;
    }
  };

  const load = async () => {
    try {
      const answer = await listAll();
      all = answer.conversations.sort((a, b) => Date.parse(b.last_used_at) - Date.parse(a.last_used_at));
      complete = answer.complete;
      updatedAt = new Date();
      problem.replaceChildren();
      const shown = render();
      refreshUsages(shown);
    } catch (error) {
      problem.replaceChildren(inlineError(error, 'Could not load the conversations'));
    }
  };

  let debounce = null;
  const onFilter = () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => {
      const shown = render();
      announce(`${shown.length} of ${all.length} conversations shown`);
    }, 250);
  };
  search.addEventListener('input', onFilter);
  stateSel.addEventListener('change', onFilter);
  runtimeSel.addEventListener('change', onFilter);

  stop = poll(load, LIST_EVERY_MS);
  return () => {
    stop();
    clearTimeout(debounce);
  };
}
