// Entry point: hash router, sign-in state and page lifecycle.

import { h, mount, announce } from './dom.js';
import { getKey, setKey, get, listOf, ApiError } from './api.js';
import { keyIdOf } from './keyid.js';
import catalog from './pages/catalog.js';
import nodes from './pages/nodes.js';
import keys from './pages/keys.js';
import usage from './pages/usage.js';
import chat from './pages/chat.js';
import registry from './pages/registry.js';

const PAGES = { catalog, nodes, keys, usage, chat, registry };
const DEFAULT_PAGE = 'catalog';


const session = {
  key: getKey(),
  me: null, // the signed-in key's public record, when the keys API lists it
  checked: false,
};

/** Check a key against the keys API. Resolves to {me}; rejects with ApiError (401: bad key). */
async function whoAmI(key) {
  const body = await get('/v1/fabric/keys', { headers: { Authorization: `Bearer ${key}` }, auth: false });
  const id = keyIdOf(key);
  const mine = listOf(body, 'keys').find((k) => k.id === id) || null;
  return { me: mine };
}

async function signIn(key) {
  const trimmed = key.trim();
  const { me } = await whoAmI(trimmed);
  setKey(trimmed);
  session.key = trimmed;
  session.me = me;
  session.checked = true;
  renderSession();
  announce('Signed in');
}

function signOut() {
  setKey('');
  session.key = '';
  session.me = null;
  session.checked = false;
  renderSession();
  announce('Signed out');
  route();
}

function renderSession() {
  const el = document.getElementById('session');
  if (!el) return;
  if (!session.key) {
    mount(el, h('a', { class: 'button small', href: '#/keys' }, 'Sign in'));
    return;
  }
  const who = session.me
    ? `${session.me.owner}${session.me.admin ? ' (admin)' : ''}`
    : `key ${keyIdOf(session.key) || 'set'}`;
  mount(el,
    h('span', { class: 'who', title: 'Signed in with an API key kept in this tab only' }, `Signed in: ${who}`),
    h('button', { type: 'button', class: 'small secondary', on: { click: signOut } }, 'Sign out'));
}

// ---- page lifecycle ---------------------------------------------------------------------

let current = null; // {name, stop: () => void}

function makeContext(name) {
  const timers = new Set();
  const controllers = new Set();
  let alive = true;
  return {
    session,
    signIn,
    signOut,
    get alive() { return alive; },
    /** Run fn now and then every ms after it settles, while the page is shown. */
    every(ms, fn) {
      const tick = async () => {
        if (!alive) return;
        if (!document.hidden) {
          try { await fn(); } catch (err) { console.warn(`${name}: poll failed`, err); }
        }
        if (alive) timers.add(window.setTimeout(tick, ms));
      };
      tick();
    },
    /** An AbortController aborted when the page is left. */
    controller() {
      const c = new AbortController();
      controllers.add(c);
      return c;
    },
    stop() {
      alive = false;
      for (const t of timers) window.clearTimeout(t);
      for (const c of controllers) c.abort();
    },
  };
}

function parseHash() {
  const raw = (window.location.hash || '').replace(/^#\/?/, '');
  const [name, query = ''] = raw.split('?');
  return { name: PAGES[name] ? name : DEFAULT_PAGE, params: new URLSearchParams(query) };
}

function route() {
  const { name, params } = parseHash();
  if (current) current.stop();
  const page = PAGES[name];
  const view = document.getElementById('view');
  const ctx = makeContext(name);
  current = ctx;
  for (const a of document.querySelectorAll('.nav a')) {
    if (a.dataset.page === name) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  document.title = `${page.title} · llmfabric`;
  mount(view);
  try {
    page.render(view, ctx, params);
  } catch (err) {
    mount(view, h('div', { class: 'notice error', role: 'alert' }, `This page failed to load: ${err.message}`));
  }
  // Move focus to the new page (for screen readers) unless the page focused a control itself.
  if (routed && !view.contains(document.activeElement)) view.focus({ preventScroll: true });
  routed = true;
}
let routed = false;

async function start() {
  renderSession();
  window.addEventListener('hashchange', route);
  route();
  if (session.key) {
    try {
      const { me } = await whoAmI(session.key);
      session.me = me;
      session.checked = true;
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) {
        setKey('');
        session.key = '';
      }
    }
    renderSession();
  }
}

start();
