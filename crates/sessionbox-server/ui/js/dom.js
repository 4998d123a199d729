// Building the page: elements, formatting, messages, polling. Text always goes in as text
// (textContent), never as markup.

import { ApiError } from './api.js';

/**
 * h('a', {href: '#/', class: 'x', onclick: fn, 'aria-label': '...'}, 'text', child...)
 * Props starting with `on` are listeners; `class`, `text`, `hidden`, `value`, `checked`,
 * `disabled` and `type` set properties; everything else is an attribute (never `style`).
 */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on') && typeof value === 'function') {
      el.addEventListener(name.slice(2), value);
    } else if (name === 'class') {
      el.className = value;
    } else if (name === 'text') {
      el.textContent = value;
    } else if (['hidden', 'value', 'checked', 'disabled', 'type', 'selected'].includes(name)) {
      el[name] = value;
    } else {
      el.setAttribute(name, value === true ? '' : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

/** Sets textContent only when it changed (keeps the DOM still for assistive technology). */
export function setText(el, text) {
  const s = String(text ?? '');
  if (el.textContent !== s) el.textContent = s;
}

let idCounter = 0;
export function uid(prefix = 'id') {
  idCounter += 1;
  return `${prefix}-${idCounter}`;
}

// ---------- formatting ----------

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
export function fmtBytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return '—';
  let v = Number(n);
  let i = 0;
  while (v >= 1024 && i < UNITS.length - 1) {
    v /= 1024;
    i += 1;
  }
  return i === 0 ? `${v} B` : `${v < 10 ? v.toFixed(1) : Math.round(v)} ${UNITS[i]}`;
}

export function fmtDuration(ms) {
  if (ms === null || ms === undefined) return '—';
  if (ms < 1000) return `${ms} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
  const hrs = Math.floor(m / 60);
  return `${hrs} h ${m % 60} min`;
}

/** "3 min ago", "in 2 h" relative to now. */
export function fmtRelative(iso, now = Date.now()) {
  if (!iso) return '—';
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return iso;
  const diff = t - now;
  const abs = Math.abs(diff);
  let text;
  if (abs < 45_000) return diff <= 0 ? 'just now' : 'in a moment';
  if (abs < 3_600_000) text = `${Math.round(abs / 60_000)} min`;
  else if (abs < 86_400_000) text = `${Math.round(abs / 3_600_000)} h`;
  else text = `${Math.round(abs / 86_400_000)} d`;
  return diff < 0 ? `${text} ago` : `in ${text}`;
}

/** A <time> element: relative text, the exact time as its title and datetime. */
export function timeEl(iso, now) {
  if (!iso) return h('span', { class: 'muted', text: '—' });
  return h('time', { datetime: iso, title: fmtTime(iso), text: fmtRelative(iso, now) });
}

export function fmtTime(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

// ---------- messages ----------

/** The text to show for an error: the server's message and code. */
export function errorText(error) {
  if (error instanceof ApiError) {
    return error.status ? `${error.message} (${error.code}, HTTP ${error.status})` : error.message;
  }
  return error?.message || String(error);
}

/** Shows an error in the page's alert region (read out by screen readers). */
export function showError(error, context) {
  const region = document.getElementById('alerts');
  const text = context ? `${context}: ${errorText(error)}` : errorText(error);
  const item = h('div', { class: 'alert' },
    h('p', { text }),
    h('button', { type: 'button', class: 'link', onclick: () => item.remove(), text: 'Dismiss' }));
  // One of each message at a time; the newest first.
  for (const old of region.querySelectorAll('.alert p')) {
    if (old.textContent === text) old.parentElement.remove();
  }
  region.prepend(item);
  while (region.children.length > 3) region.lastElementChild.remove();
}

export function clearErrors() {
  clear(document.getElementById('alerts'));
}

/** A polite announcement (status region): upload done, destroyed, ... */
export function announce(text) {
  const region = document.getElementById('status');
  region.textContent = '';
  // A fresh text node is announced even when the same text comes twice.
  setTimeout(() => { region.textContent = text; }, 30);
}

/** An inline error box within a panel (not announced: the panel's own state). */
export function inlineError(error, context) {
  return h('p', { class: 'error-box', text: context ? `${context}: ${errorText(error)}` : errorText(error) });
}

/** A panel saying a feature is not there on this server. */
export function notAvailable(what, error) {
  return h('div', { class: 'unavailable' },
    h('p', { class: 'unavailable-title', text: `${what} is not available on this server.` }),
    h('p', { class: 'muted', text: error ? `It answered: ${errorText(error)}. A newer sessionbox serves it.` : 'A newer sessionbox serves it.' }));
}

// ---------- tables ----------

/**
 * A table in a scrollable, focusable wrapper. columns: [{label, class}]. Returns {wrap,
 * table, tbody}.
 */
export function dataTable(caption, columns, { captionHidden = true, cls = '' } = {}) {
  const tbody = h('tbody');
  const table = h('table', { class: `data ${cls}` },
    h('caption', { class: captionHidden ? 'visually-hidden' : '', text: caption }),
    h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col', class: c.class || '', text: c.label })))),
    tbody);
  const wrap = h('div', { class: 'table-wrap', role: 'region', 'aria-label': caption, tabindex: '0' }, table);
  return { wrap, table, tbody };
}

/**
 * Keeps tbody's rows in the order of `items`, reusing the row of each key so that focus and
 * selection survive a refresh. make(item) → tr; update(tr, item) refreshes it.
 */
export function syncRows(tbody, items, keyOf, make, update) {
  const rows = new Map();
  for (const tr of tbody.children) rows.set(tr.dataset.key, tr);
  const keep = new Set();
  items.forEach((item, index) => {
    const key = keyOf(item);
    keep.add(key);
    let tr = rows.get(key);
    if (!tr) {
      tr = make(item);
      tr.dataset.key = key;
    }
    update(tr, item);
    if (tbody.children[index] !== tr) tbody.insertBefore(tr, tbody.children[index] || null);
  });
  for (const [key, tr] of rows) if (!keep.has(key)) tr.remove();
}

/** A row of cells; each cell gets data-label (the column's name, shown on narrow screens). */
export function row(labels, cells) {
  return h('tr', {}, cells.map((cell, i) =>
    h(i === 0 ? 'th' : 'td', { scope: i === 0 ? 'row' : undefined, 'data-label': labels[i] }, cell)));
}

/** A definition list from [[term, value], ...]. */
export function facts(pairs, cls = 'facts') {
  return h('dl', { class: cls }, pairs.map(([term, value]) =>
    h('div', {}, h('dt', { text: term }), h('dd', {}, value))));
}

// ---------- polling ----------

/**
 * Calls fn now and then every `ms` while the page is visible, never two at once. Returns a
 * stop function. `fn` handles its own errors.
 */
export function poll(fn, ms) {
  let stopped = false;
  let timer = null;
  let running = false;
  const tick = async () => {
    timer = null;
    if (stopped) return;
    if (!document.hidden && !running) {
      running = true;
      try {
        await fn();
      } catch (error) {
        console.error(error);
      } finally {
        running = false;
      }
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  const onVisible = () => {
    if (!document.hidden && timer !== null && !running) {
      clearTimeout(timer);
      tick();
    }
  };
  document.addEventListener('visibilitychange', onVisible);
  tick();
  const stop = () => {
    stopped = true;
    if (timer !== null) clearTimeout(timer);
    document.removeEventListener('visibilitychange', onVisible);
  };
  stop.now = () => {
    if (stopped || running) return;
    if (timer !== null) clearTimeout(timer);
    tick();
  };
  return stop;
}
