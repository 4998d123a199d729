// The sessionbox dashboard: sign-in, routing between the views (hash routes, so one
// index.html serves them all):
//   #/                         conversations
//   #/c/{id}[/{tab}]           one conversation (tabs: files, terminal, commands, network,
//                              audit, snapshots)
//   #/c/{id}/files/{dir...}    its file browser in a directory
//   #/installation             the installation

import { ApiError, auth, clearKey, configureBase, getJson, getKey, isMissing, setKey } from './js/api.js';
import { announce, clearErrors, errorText, fmtRelative, fmtTime, h } from './js/dom.js';
import { renderConversations } from './js/conversations.js';
import { ConversationView } from './js/conversation.js';
import { parseRoute } from './js/route.js';
import { renderInstallation } from './js/installation.js';

const main = document.getElementById('main');
const session = { tenant: null, whoami: null };
let current = { kind: null, dispose: () => {}, view: null };

function setNav(name) {
  for (const a of document.querySelectorAll('[data-nav]')) {
    if (a.dataset.nav === name) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

function leave() {
  try {
    current.dispose();
  } catch (error) {
    console.error(error);
  }
  current = { kind: null, dispose: () => {}, view: null };
}

function focusHeading() {
  const heading = main.querySelector('h1');
  if (heading) {
    heading.setAttribute('tabindex', '-1');
    heading.focus({ preventScroll: false });
  }
}

function route() {
  if (!getKey()) {
    showSignIn();
    return;
  }
  const r = parseRoute(location.hash);
  if (r.name === 'conversation' && current.kind === 'conversation' && current.view.id === r.id) {
    current.view.show(r);
    return;
  }
  leave();
  clearErrors();
  main.replaceChildren();
  if (r.name === 'conversations') {
    setNav('conversations');
    document.title = 'Conversations · sessionbox';
    current = { kind: 'conversations', dispose: renderConversations(main, session) };
  } else if (r.name === 'installation') {
    setNav('installation');
    document.title = 'Installation · sessionbox';
    current = { kind: 'installation', dispose: renderInstallation(main, session) };
  } else if (r.name === 'conversation') {
    setNav('conversations');
    document.title = `${r.id} · sessionbox`;
    const view = new ConversationView(main, r.id, session);
    current = { kind: 'conversation', view, dispose: () => view.dispose() };
    view.show(r);
  } else {
    setNav(null);
    document.title = 'Not found · sessionbox';
    main.append(h('h1', { text: 'Not found' }),
      h('p', {}, 'There is no such page. ', h('a', { href: '#/', text: 'Go to the conversations' })));
  }
  focusHeading();
}

/** Checks a key: whoami where the server has it, else any tenant-wide read. */
async function identify(key) {
  try {
    const who = await getJson('/v1/whoami', { key });
    return { tenant: who.tenant, whoami: who };
  } catch (error) {
    if (!isMissing(error)) throw error;
  }
  await getJson('/v1/conversations?limit=1', { key });
  return { tenant: null, whoami: null };
}

function showSignedIn() {
  document.getElementById('site-nav').hidden = false;
  document.getElementById('who').hidden = false;
  const text = document.getElementById('who-text');
  if (!session.tenant) {
    // An older server without /v1/whoami: the key works, its tenant is not known here.
    text.replaceChildren('Signed in');
    return;
  }
  const parts = ['Tenant ', h('strong', { id: 'tenant-name', text: session.tenant })];
  const expires = session.whoami?.expires_at;
  if (expires) {
    parts.push(' · key expires ', h('time', { datetime: expires, title: fmtTime(expires), text: fmtRelative(expires) }));
  }
  text.replaceChildren(...parts);
}

function showSignIn(reason) {
  leave();
  document.getElementById('site-nav').hidden = true;
  document.getElementById('who').hidden = true;
  document.title = 'Sign in · sessionbox';
  const input = h('input', {
    id: 'api-key', name: 'api-key', type: 'password', autocomplete: 'off', spellcheck: 'false',
    required: true, 'aria-describedby': 'api-key-help api-key-error',
  });
  const error = h('p', { id: 'api-key-error', class: 'form-error', role: 'alert' });
  const submit = h('button', { type: 'submit', text: 'Sign in' });
  const form = h('form', { class: 'sign-in', novalidate: true },
    h('label', { for: 'api-key', text: 'API key' }),
    input,
    h('p', { id: 'api-key-help', class: 'muted' },
      'A key made with ', h('code', { text: 'sessionbox keys create' }),
      '. It is kept only for this browser tab and sent only in request headers.'),
    error,
    submit);
  if (reason) error.textContent = reason;
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (!key) {
      error.textContent = 'Enter an API key.';
      input.setAttribute('aria-invalid', 'true');
      input.focus();
      return;
    }
    submit.disabled = true;
    error.textContent = '';
    try {
      const who = await identify(key);
      setKey(key);
      Object.assign(session, who);
      input.value = '';
      showSignedIn();
      announce(session.tenant ? `Signed in as tenant ${session.tenant}` : 'Signed in');
      route();
    } catch (e) {
      input.setAttribute('aria-invalid', 'true');
      error.textContent = e instanceof ApiError && e.status === 401
        ? `The server refused this key: ${e.message}`
        : `Could not sign in: ${errorText(e)}`;
      input.focus();
    } finally {
      submit.disabled = false;
    }
  });
  main.replaceChildren(h('section', { class: 'sign-in-page', 'aria-labelledby': 'sign-in-title' },
    h('h1', { id: 'sign-in-title', text: 'Sign in' }), form));
  input.focus();
}

function signOut(reason) {
  clearKey();
  session.tenant = null;
  session.whoami = null;
  clearErrors();
  showSignIn(reason);
}

async function start() {
  try {
    configureBase();
  } catch (error) {
    main.replaceChildren(h('h1', { text: 'Cannot start' }), h('p', { class: 'error-box', text: error.message }));
    return;
  }
  auth.addEventListener('unauthorized', (event) => {
    if (!getKey()) return;
    signOut(`The server refused the key (${event.detail.message}). Enter a key again.`);
  });
  document.getElementById('sign-out').addEventListener('click', () => {
    signOut();
    announce('Signed out');
  });
  window.addEventListener('hashchange', route);
  // The skip link moves the focus without touching the hash (the hash is the route).
  document.querySelector('.skip-link').addEventListener('click', (event) => {
    event.preventDefault();
    main.focus();
  });
  const key = getKey();
  if (key) {
    try {
      Object.assign(session, await identify(key));
      showSignedIn();
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) return; // the listener signed out
      main.replaceChildren(h('h1', { text: 'Cannot reach the server' }),
        h('p', { class: 'error-box', text: errorText(error) }),
        h('p', {}, h('button', { type: 'button', onclick: () => location.reload(), text: 'Try again' })));
      return;
    }
  }
  route();
}

start();
