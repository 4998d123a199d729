// A terminal in the conversation's sandbox: xterm.js over the pty WebSocket. The socket is
// opened with a short-lived ticket (POST .../pty/tickets), never with the key: a browser
// cannot put headers on a WebSocket, and a key must not go into a URL.
//
// Frames: the server sends {"type":"connected"} first, output as binary 0x01 + bytes, and
// {"type":"exit","exit_code":N} at the end; input goes as binary 0x00 + UTF-8 bytes and a
// size change as {"type":"resize","cols":C,"rows":R}.

import { conv, isMissing, postJson, wsUrl } from './api.js';
import { errorText, h, inlineError, notAvailable } from './dom.js';

const OUTPUT = 0x01;
const INPUT = 0x00;

let modules = null;
function loadXterm() {
  modules ??= Promise.all([
    import('../vendor/xterm/xterm.js'),
    import('../vendor/xterm-addon-fit/addon-fit.js'),
  ]).then(([xterm, fit]) => ({ Terminal: xterm.Terminal, FitAddon: fit.FitAddon }));
  return modules;
}

/**
 * xterm.js writes its theme and cell sizes into <style> elements, which this page's CSP
 * (style-src 'self', no 'unsafe-inline') does not apply. This copies their text into
 * constructed style sheets (document.adoptedStyleSheets), which the CSP allows, and keeps
 * them in step. Returns a function that stops and removes them.
 */
export function mirrorStyleElements(root) {
  const sheets = new Map(); // <style> → {sheet, text}
  const sync = () => {
    const added = [];
    const removed = new Set();
    for (const el of root.querySelectorAll('style')) {
      let entry = sheets.get(el);
      if (!entry) {
        entry = { sheet: new CSSStyleSheet(), text: null };
        sheets.set(el, entry);
        added.push(entry.sheet);
      }
      if (entry.text !== el.textContent) {
        entry.text = el.textContent;
        entry.sheet.replaceSync(entry.text);
      }
    }
    for (const [el, entry] of sheets) {
      if (!root.contains(el)) {
        sheets.delete(el);
        removed.add(entry.sheet);
      }
    }
    if (added.length || removed.size) {
      document.adoptedStyleSheets = [...document.adoptedStyleSheets.filter((s) => !removed.has(s)), ...added];
    }
  };
  const observer = new MutationObserver(sync);
  observer.observe(root, { subtree: true, childList: true, characterData: true });
  sync();
  return () => {
    observer.disconnect();
    const ours = new Set([...sheets.values()].map((entry) => entry.sheet));
    document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => !ours.has(s));
  };
}

const THEME = {
  background: '#0d1117',
  foreground: '#e6edf3',
  cursor: '#e6edf3',
  cursorAccent: '#0d1117',
  selectionBackground: '#264f78',
  black: '#484f58',
  red: '#ff7b72',
  green: '#3fb950',
  yellow: '#d29922',
  blue: '#58a6ff',
  magenta: '#bc8cff',
  cyan: '#39c5cf',
  white: '#b1bac4',
  brightBlack: '#6e7681',
  brightRed: '#ffa198',
  brightGreen: '#56d364',
  brightYellow: '#e3b341',
  brightBlue: '#79c0ff',
  brightMagenta: '#d2a8ff',
  brightCyan: '#56d4dd',
  brightWhite: '#ffffff',
};

export function createTerminalPanel(id) {
  const headingId = `terminal-title-${id}`;
  const status = h('p', { class: 'term-status', role: 'status', text: 'Not connected' });
  const connectButton = h('button', { type: 'button', text: 'Connect' });
  const disconnectButton = h('button', { type: 'button', class: 'secondary', text: 'Disconnect', disabled: true });
  const readerBox = h('input', { type: 'checkbox', id: `term-reader-${id}` });
  const problem = h('div', { class: 'problem' });
  const host = h('div', { class: 'term-host', id: `term-host-${id}` });
  const toolbar = h('div', { class: 'toolbar' }, connectButton, disconnectButton,
    h('span', { class: 'field inline' }, readerBox, h('label', { for: `term-reader-${id}`, text: 'Screen reader mode' })),
    status);
  const el = h('section', { class: 'panel terminal-panel', 'aria-labelledby': headingId },
    h('h2', { id: headingId, tabindex: '-1', text: 'Terminal' }),
    h('p', { class: 'muted hint', id: `term-hint-${id}` },
      'A shell in the conversation\'s workspace. Keys typed in the terminal go to the shell, Tab included: press ',
      h('kbd', { text: 'F6' }), ' to move the focus out of it. Closing it (or leaving this conversation) ends the shell.'),
    toolbar, problem, host);

  let term = null;
  let fit = null;
  let socket = null;
  let unmirror = null;
  let resizeObserver = null;
  let visible = false;
  let connecting = false;
  const encoder = new TextEncoder();

  const setStatus = (text) => {
    status.textContent = text;
  };

  const send = (bytes) => {
    if (socket?.readyState !== WebSocket.OPEN) return;
    const frame = new Uint8Array(bytes.length + 1);
    frame[0] = INPUT;
    frame.set(bytes, 1);
    socket.send(frame);
  };

  const fitNow = () => {
    if (!term || !visible || host.clientWidth === 0) return;
    try {
      fit.fit();
    } catch {
      // not measurable yet (hidden)
    }
  };

  const sendSize = () => {
    if (socket?.readyState === WebSocket.OPEN && term) {
      socket.send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));
    }
  };

  const ensureTerminal = async () => {
    if (term) return;
    const { Terminal, FitAddon } = await loadXterm();
    unmirror = mirrorStyleElements(host);
    term = new Terminal({
      cursorBlink: true,
      fontFamily: '"DejaVu Sans Mono", "Liberation Mono", ui-monospace, monospace',
      fontSize: 14,
      theme: THEME,
      scrollback: 5000,
      screenReaderMode: readerBox.checked,
      // Links the sandbox prints (OSC 8) open only after the user confirms the address, in a
      // window with no opener and no referrer (so no copy of this tab's session storage).
      linkHandler: {
        activate(_event, uri) {
          let url;
          try {
            url = new URL(uri);
          } catch {
            return;
          }
          if (url.protocol !== 'https:' && url.protocol !== 'http:') return;
          if (window.confirm(`Open a link the sandbox printed?\n\n${url.href}`)) {
            window.open(url.href, '_blank', 'noopener,noreferrer');
          }
        },
      },
    });
    fit = new FitAddon();
    term.loadAddon(fit);
    term.open(host);
    term.textarea?.setAttribute('aria-describedby', `term-hint-${id}`);
    term.attachCustomKeyEventHandler((event) => {
      if (event.key === 'F6') {
        if (event.type === 'keydown') {
          event.preventDefault();
          (disconnectButton.disabled ? connectButton : disconnectButton).focus();
        }
        return false;
      }
      return true;
    });
    term.onData((data) => send(encoder.encode(data)));
    term.onBinary((data) => send(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff)));
    term.onResize(() => sendSize());
    resizeObserver = new ResizeObserver(() => requestAnimationFrame(fitNow));
    resizeObserver.observe(host);
    fitNow();
  };

  const setConnected = (on) => {
    connectButton.disabled = on;
    disconnectButton.disabled = !on;
    connectButton.textContent = on ? 'Connect' : (term ? 'Connect again' : 'Connect');
  };

  const connect = async () => {
    if (connecting || socket) return;
    connecting = true;
    connectButton.disabled = true;
    problem.replaceChildren();
    setStatus('Connecting…');
    try {
      let ticket;
      try {
        ticket = await postJson(conv(id, '/pty/tickets'), {});
      } catch (error) {
        if (isMissing(error)) {
          problem.replaceChildren(notAvailable('A terminal in the browser (POST …/pty/tickets)', error));
          toolbar.hidden = true;
          host.hidden = true;
        } else {
          problem.replaceChildren(inlineError(error, 'Could not open a terminal'));
          setStatus('Not connected');
        }
        setConnected(false);
        return;
      }
      await ensureTerminal();
      const ws = new WebSocket(wsUrl(`${conv(id, '/pty')}?ticket=${encodeURIComponent(ticket.ticket)}`));
      ws.binaryType = 'arraybuffer';
      socket = ws;
      let exited = false;
      ws.addEventListener('message', (event) => {
        if (typeof event.data === 'string') {
          let message;
          try {
            message = JSON.parse(event.data);
          } catch {
            return;
          }
          if (message.type === 'connected') {
            setStatus('Connected');
            setConnected(true);
            fitNow();
            sendSize();
            if (visible) term.focus();
          } else if (message.type === 'exit') {
            exited = true;
            setStatus(`The shell exited with code ${message.exit_code}`);
            term.write(`\r\n\x1b[2m[the shell exited with code ${message.exit_code}]\x1b[0m\r\n`);
          }
          return;
        }
        const bytes = new Uint8Array(event.data);
        if (bytes.length && bytes[0] === OUTPUT) term.write(bytes.subarray(1));
      });
      ws.addEventListener('close', (event) => {
        if (socket === ws) socket = null;
        setConnected(false);
        if (!exited) {
          setStatus(event.code === 1000 || event.code === 1005 ? 'Disconnected' : `Disconnected (${event.code}${event.reason ? `: ${event.reason}` : ''})`);
        }
      });
      ws.addEventListener('error', () => {
        problem.replaceChildren(h('p', { class: 'error-box', text: 'The terminal connection failed (the ticket may have expired, or the server refused the socket).' }));
      });
    } catch (error) {
      problem.replaceChildren(inlineError(error, 'Could not start the terminal'));
      setStatus(`Not connected: ${errorText(error)}`);
      setConnected(false);
    } finally {
      connecting = false;
    }
  };

  const disconnect = () => {
    socket?.close(1000);
    socket = null;
    setConnected(false);
    setStatus('Disconnected');
  };

  connectButton.addEventListener('click', connect);
  disconnectButton.addEventListener('click', disconnect);
  readerBox.addEventListener('change', () => {
    if (term) term.options.screenReaderMode = readerBox.checked;
  });

  let started = false;
  return {
    el,
    show() {
      visible = true;
      requestAnimationFrame(fitNow);
      if (!started) {
        started = true;
        connect();
      }
    },
    hide() {
      visible = false;
    },
    dispose() {
      visible = false;
      socket?.close(1000);
      socket = null;
      resizeObserver?.disconnect();
      term?.dispose();
      unmirror?.();
    },
  };
}
