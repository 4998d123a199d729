// The server API: where it is, the key, requests and their errors.
//
// The key lives only in sessionStorage (gone when the browser session ends) and travels only
// in the Authorization header, never in a URL. The API is the page's own origin; only for
// development, a page served from a loopback address may name another loopback server with
// `?api=http://127.0.0.1:PORT` (read once, at start).

const KEY_STORE = 'sessionbox.key';

let base = '';

const LOOPBACK = new Set(['127.0.0.1', 'localhost', '[::1]']);

/** Reads `?api=` once. Returns the base in use ('' for the page's own origin). */
export function configureBase(location = globalThis.location) {
  const asked = new URLSearchParams(location.search).get('api');
  base = '';
  if (!asked) return base;
  let url;
  try {
    url = new URL(asked);
  } catch {
    throw new Error(`?api= is not a URL: ${asked}`);
  }
  if (location.pathname.startsWith('/ui/')) {
    // Served by sessionbox itself: always its own origin, whatever a link says.
    throw new Error('?api= is for development only: a dashboard served by sessionbox talks to its own server');
  }
  const pageLocal = LOOPBACK.has(location.hostname) || location.hostname === '::1';
  if (!pageLocal || !LOOPBACK.has(url.hostname) || !/^https?:$/.test(url.protocol)) {
    throw new Error('?api= is for development only: both the page and the API must be on a loopback address');
  }
  base = url.origin;
  return base;
}

export function apiBase() {
  return base;
}

export function getKey() {
  return sessionStorage.getItem(KEY_STORE);
}
export function setKey(key) {
  sessionStorage.setItem(KEY_STORE, key);
}
export function clearKey() {
  sessionStorage.removeItem(KEY_STORE);
}

/** An error answer of the server (`{code, message}`), or a request that got no answer. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
  }
}

/** Fired with the ApiError when the server refuses the key (401). */
export const auth = new EventTarget();

async function errorOf(response) {
  let code = `http_${response.status}`;
  let message = response.statusText || `HTTP ${response.status}`;
  const text = await response.text().catch(() => '');
  if (text) {
    try {
      const body = JSON.parse(text);
      if (body && typeof body.message === 'string') message = body.message;
      if (body && typeof body.code === 'string') code = body.code;
    } catch {
      message = text.slice(0, 300);
    }
  }
  return new ApiError(response.status, code, message);
}

/**
 * A request to the API; resolves with the Response when it is 2xx, else throws ApiError.
 * options: method, json (a body sent as JSON), body, headers, signal, key (instead of the
 * stored one).
 */
export async function request(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const key = options.key ?? getKey();
  if (key) headers.set('Authorization', `Bearer ${key}`);
  let body = options.body;
  if (options.json !== undefined) {
    headers.set('Content-Type', 'application/json');
    body = JSON.stringify(options.json);
  }
  let response;
  try {
    response = await fetch(base + path, {
      method: options.method || 'GET',
      headers,
      body,
      signal: options.signal,
      cache: 'no-store',
      credentials: 'omit',
      referrerPolicy: 'no-referrer',
    });
  } catch (error) {
    if (error.name === 'AbortError') throw error;
    throw new ApiError(0, 'unreachable', 'The server did not answer (is it running, and reachable from this page?)');
  }
  if (!response.ok) {
    const error = await errorOf(response);
    if (response.status === 401 && options.key === undefined) {
      auth.dispatchEvent(new CustomEvent('unauthorized', { detail: error }));
    }
    throw error;
  }
  return response;
}

export async function getJson(path, options) {
  const response = await request(path, options);
  return response.status === 204 ? null : response.json();
}

export function postJson(path, json, options = {}) {
  return request(path, { ...options, method: 'POST', json }).then((r) =>
    r.status === 204 ? null : r.json());
}

/** True for an answer that says the route does not exist on this server (an older version). */
export function isMissing(error) {
  return error instanceof ApiError && (error.status === 404 || error.status === 405);
}

/** A segment `fetch` would resolve away (`.`, `..`, in any encoding): refused, so a name from
 * the workspace can never turn a request into one for another route. */
function dotSegment(segment) {
  let decoded = segment;
  try {
    decoded = decodeURIComponent(segment);
  } catch {
    // not an escape: taken as it is
  }
  return decoded === '.' || decoded === '..';
}

/** `/v1/conversations/{id}` + rest. */
export function conv(id, rest = '') {
  if (dotSegment(id)) throw new Error(`${JSON.stringify(id)} is not a conversation id`);
  return `/v1/conversations/${encodeURIComponent(id)}${rest}`;
}

/** A workspace path for a URL path: each segment encoded, slashes kept. */
export function pathSegments(path) {
  const segments = path.split('/').filter(Boolean);
  if (segments.some(dotSegment)) throw new Error(`${JSON.stringify(path)} is not a workspace path`);
  return segments.map(encodeURIComponent).join('/');
}

/** `query({a: 1, b: null})` → `?a=1` (null and undefined left out). */
export function query(params) {
  const q = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== '') q.set(name, String(value));
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}

/** The WebSocket URL of an API path (ws: or wss: on the API's origin). */
export function wsUrl(path) {
  const origin = base || globalThis.location.origin;
  return origin.replace(/^http/, 'ws') + path;
}
