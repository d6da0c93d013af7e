// Talking to the fabric's JSON API on the same origin (docs/http-api.md).

const KEY_STORAGE = 'llmfabric.apiKey';

/** The path the API lives under: whatever precedes "/ui/" in the page's own path. */
export function apiBase(pathname = window.location.pathname) {
  const i = pathname.lastIndexOf('/ui/');
  return i >= 0 ? pathname.slice(0, i) : '';
}

export class ApiError extends Error {
  constructor(status, message, code = '', type = '') {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    this.type = type;
  }
}

// ---- the signed-in API key (sessionStorage: gone when the tab closes) -------------------

export function getKey() {
  try {
    return window.sessionStorage.getItem(KEY_STORAGE) || '';
  } catch {
    return '';
  }
}

export function setKey(key) {
  try {
    if (key) window.sessionStorage.setItem(KEY_STORAGE, key);
    else window.sessionStorage.removeItem(KEY_STORAGE);
  } catch {
    // storage disabled: the key lives only for this page view
  }
}

function headersWith(extra = {}, auth = true) {
  const headers = { Accept: 'application/json', ...extra };
  const key = getKey();
  if (auth && key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

/** Turn a failed response into an ApiError using OpenAI's error shape when present. */
export async function errorFrom(resp) {
  let message = `${resp.status} ${resp.statusText || 'error'}`.trim();
  let code = String(resp.status);
  let type = '';
  try {
    const text = await resp.text();
    try {
      const body = JSON.parse(text);
      const err = body && (body.error ?? body);
      if (typeof err === 'string') message = err;
      else if (err && typeof err.message === 'string') {
        message = err.message;
        code = err.code ? String(err.code) : code;
        type = err.type ? String(err.type) : '';
      }
    } catch {
      if (text && text.length < 300) message = `${resp.status}: ${text}`;
    }
  } catch {
    // body unreadable: keep the status line
  }
  return new ApiError(resp.status, message, code, type);
}

/** JSON request; resolves to the parsed body, rejects with ApiError. */
export async function request(method, path, { body, headers, signal, auth = true } = {}) {
  const init = { method, headers: headersWith(headers, auth), signal, cache: 'no-store' };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['Content-Type'] = 'application/json';
  }
  let resp;
  try {
    resp = await fetch(`${apiBase()}${path}`, init);
  } catch (err) {
    if (err && err.name === 'AbortError') throw err;
    throw new ApiError(0, 'Cannot reach the ingress: is the fabric running?', 'network');
  }
  if (!resp.ok) throw await errorFrom(resp);
  if (resp.status === 204) return null;
  const text = await resp.text();
  return text ? JSON.parse(text) : null;
}

export const get = (path, opts) => request('GET', path, opts);
export const post = (path, body, opts) => request('POST', path, { ...opts, body });
export const del = (path, opts) => request('DELETE', path, opts);

/** A raw fetch (for streaming) with the same base path and bearer key. */
export function rawFetch(path, { method = 'GET', body, headers, signal } = {}) {
  const init = { method, headers: headersWith(headers), signal, cache: 'no-store' };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['Content-Type'] = 'application/json';
  }
  return fetch(`${apiBase()}${path}`, init);
}

/** Accept either `{"<name>": [...]}` or a bare list. */
export function listOf(body, name) {
  if (Array.isArray(body)) return body;
  if (body && Array.isArray(body[name])) return body[name];
  if (body && Array.isArray(body.data)) return body.data;
  return [];
}
