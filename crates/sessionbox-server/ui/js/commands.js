// A conversation's background commands (running and recently finished), polled, and the
// output of one of them, followed from byte offsets while it runs.

import { conv, getJson, query } from './api.js';
import { dataTable, fmtDuration, h, inlineError, poll, setText, syncRows, timeEl } from './dom.js';

const LIST_EVERY_MS = 3000;
const LOGS_EVERY_MS = 1500;
const KEEP_CHARS = 2_000_000;

const COLUMNS = ['Command', 'Status', 'Started', 'Duration', 'Output'];

export function commandStatus(c) {
  if (c.running) return { text: 'running', cls: 'running' };
  if (c.error) return { text: `could not run: ${c.error.message}`, cls: 'failed' };
  if (c.killed) return { text: 'killed', cls: 'failed' };
  if (c.timed_out) return { text: 'timed out', cls: 'failed' };
  if (c.status && 'signal' in c.status) return { text: `signal ${c.status.signal}`, cls: 'failed' };
  const code = c.exit_code ?? c.status?.code;
  return { text: `exit ${code}`, cls: code === 0 ? 'ok' : 'failed' };
}

function logView(label) {
  const pre = h('pre', { class: 'log', tabindex: '0', 'aria-label': label });
  const note = h('p', { class: 'muted log-note' });
  return { box: h('div', { class: 'log-box' }, h('h4', { text: label }), pre, note), pre, note };
}

export function createCommandsPanel(id) {
  const headingId = `commands-title-${id}`;
  const problem = h('div', { class: 'problem' });
  const { wrap, tbody } = dataTable('Background commands', COLUMNS.map((label) => ({ label })), { cls: 'commands' });
  const empty = h('p', { class: 'empty', hidden: true, text: 'No background commands. Commands run with "background": true show here, running and finished.' });
  const logs = h('section', { class: 'logs', hidden: true, 'aria-labelledby': `logs-title-${id}` });
  const el = h('section', { class: 'panel commands-panel', 'aria-labelledby': headingId },
    h('h2', { id: headingId, tabindex: '-1', text: 'Background commands' }),
    h('p', { class: 'muted', text: 'Running commands and the recent finished ones, newest first; the list refreshes every few seconds.' }),
    problem, wrap, empty, logs);

  let stopList = null;
  let stopLogs = null;
  let chosen = null;

  const openLogs = (c) => {
    stopLogs?.();
    chosen = c.id;
    const title = h('h3', { id: `logs-title-${id}`, tabindex: '-1' }, 'Output of ', h('code', { text: c.command }));
    const state = h('p', { class: 'muted', role: 'status' });
    const out = logView('stdout');
    const err = logView('stderr');
    const logProblem = h('div', { class: 'problem' });
    const close = h('button', {
      type: 'button', class: 'secondary small', text: 'Close output',
      onclick: () => {
        stopLogs?.();
        stopLogs = null;
        chosen = null;
        logs.hidden = true;
        logs.replaceChildren();
        tbody.querySelector(`tr[data-key="${CSS.escape(c.id)}"] button`)?.focus();
      },
    });
    logs.replaceChildren(h('div', { class: 'preview-head' }, title, close), state, logProblem,
      h('div', { class: 'log-pair' }, out.box, err.box));
    logs.hidden = false;
    title.focus();

    let stdoutOffset = 0;
    let stderrOffset = 0;
    let done = false;
    const appendTo = (view, piece) => {
      if (!piece?.text) return;
      let text = view.pre.textContent + piece.text;
      if (text.length > KEEP_CHARS) {
        text = text.slice(text.length - KEEP_CHARS);
        view.note.textContent = 'Older output is not shown here.';
      }
      view.pre.textContent = text;
      view.pre.scrollTop = view.pre.scrollHeight;
    };
    const fetchLogs = async () => {
      if (done) return;
      try {
        const answer = await getJson(conv(id, `/commands/${encodeURIComponent(c.id)}/logs${query({
          stdout_offset: stdoutOffset, stderr_offset: stderrOffset,
        })}`));
        appendTo(out, answer.stdout);
        appendTo(err, answer.stderr);
        const more = answer.stdout_next_offset !== stdoutOffset || answer.stderr_next_offset !== stderrOffset;
        stdoutOffset = answer.stdout_next_offset;
        stderrOffset = answer.stderr_next_offset;
        if (answer.stdout_truncated) out.note.textContent = 'stdout went past the output limit: the rest was discarded.';
        if (answer.stderr_truncated) err.note.textContent = 'stderr went past the output limit: the rest was discarded.';
        if (!out.pre.textContent) out.note.textContent ||= '(nothing yet)';
        else if (out.note.textContent === '(nothing yet)') out.note.textContent = '';
        if (!err.pre.textContent) err.note.textContent ||= '(nothing yet)';
        else if (err.note.textContent === '(nothing yet)') err.note.textContent = '';
        logProblem.replaceChildren();
        if (answer.running) {
          setText(state, 'Running: output refreshes every few seconds.');
        } else if (!more) {
          done = true;
          setText(state, `Finished (exit ${answer.exit_code ?? '—'}).`);
          stopLogs?.();
        }
      } catch (error) {
        logProblem.replaceChildren(inlineError(error, 'Could not read the output'));
      }
    };
    stopLogs = poll(fetchLogs, LOGS_EVERY_MS);
  };

  const make = (c) => {
    const status = h('span');
    const started = h('span');
    const duration = h('span');
    const button = h('button', {
      type: 'button', class: 'secondary small', text: 'Show output',
      'aria-label': `Show output of ${c.command}`, onclick: () => openLogs(c),
    });
    const tr = h('tr', {},
      h('th', { scope: 'row', 'data-label': COLUMNS[0] }, h('code', { class: 'command', text: c.command })),
      h('td', { 'data-label': COLUMNS[1] }, status),
      h('td', { 'data-label': COLUMNS[2] }, started),
      h('td', { 'data-label': COLUMNS[3] }, duration),
      h('td', { 'data-label': COLUMNS[4] }, button));
    tr.parts = { status, started, duration };
    return tr;
  };
  const update = (tr, c) => {
    const s = commandStatus(c);
    if (tr.parts.status.textContent !== s.text) {
      tr.parts.status.replaceChildren(h('span', { class: `badge cmd-${s.cls}`, text: s.text }));
    }
    tr.parts.started.replaceChildren(timeEl(c.started_at));
    setText(tr.parts.duration, fmtDuration(c.duration_ms));
    tr.classList.toggle('chosen', c.id === chosen);
  };

  const load = async () => {
    try {
      const answer = await getJson(conv(id, '/commands'));
      const list = answer.commands.slice().reverse();
      syncRows(tbody, list, (c) => c.id, make, update);
      wrap.hidden = list.length === 0;
      empty.hidden = list.length !== 0;
      problem.replaceChildren();
    } catch (error) {
      problem.replaceChildren(inlineError(error, 'Could not list the commands'));
    }
  };

  return {
    el,
    show() {
      stopList ??= poll(load, LIST_EVERY_MS);
    },
    hide() {
      stopList?.();
      stopList = null;
    },
    dispose() {
      stopList?.();
      stopLogs?.();
    },
  };
}
