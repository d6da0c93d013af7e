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
import traces from './pages/traces.js';

const PAGES = { catalog, nodes, keys, usage, chat, registry, traces };
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
  const sessionListeners = new Set();
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
    /** Call fn() when the signed-in key's record (session.me) becomes known or changes. */
    onSession(fn) {
      sessionListeners.add(fn);
    },
    sessionChanged() {
      for (const fn of sessionListeners) {
        try { fn(); } catch (err) { console.warn(`${name}: session update failed`, err); }
      }
    },
    /** An AbortController aborted when the page is left. */
    controller() {
      const c = new AbortController();
      controllers.add(c);
      return c;
    },
    stop() {
      alive = false;
      sessionListeners.clear();
      for (const t of timers) window.clearTimeout(t);
      for (const c of controllers) c.abort();
    },
  };
}

/**
 * The page a location hash names. Routes are "#/page?query" ("#page" too, and "" for the
 * default page); unknown "#/..." routes show the default page. Any other hash ("#view", the
 * skip link's target) is an in-page anchor, not a route: null.
 */
export function parseHash(hash) {
  const raw = (hash || '').replace(/^#/, '');
  const [path, query = ''] = raw.split('?');
  const name = path.replace(/^\//, '');
  if (raw && !raw.startsWith('/') && !PAGES[name]) return null;
  return { name: PAGES[name] ? name : DEFAULT_PAGE, params: new URLSearchParams(query) };
}

let routedHash = '';

/** Focus the main region (the skip link's target) without changing the page. */
function focusMain() {
  const view = document.getElementById('view');
  view.focus({ preventScroll: true });
  view.scrollIntoView({ block: 'start' });
}

function onHashChange() {
  if (parseHash(window.location.hash) === null) {
    // An in-page anchor (e.g. "#view" followed without the click handler): keep the page,
    // focus the target and put the page's own address back.
    const target = document.getElementById(window.location.hash.slice(1));
    window.history.replaceState(null, '', routedHash || window.location.pathname);
    if (target) {
      if (!target.hasAttribute('tabindex')) target.setAttribute('tabindex', '-1');
      target.focus();
    }
    return;
  }
  route();
}

function route() {
  const parsed = parseHash(window.location.hash);
  const { name, params } = parsed || { name: DEFAULT_PAGE, params: new URLSearchParams() };
  routedHash = parsed ? window.location.hash : '';
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
  window.addEventListener('hashchange', onHashChange);
  // The skip link's "#view" is not a route: focus the main region and leave the hash alone.
  document.querySelector('.skip-link')?.addEventListener('click', (e) => {
    e.preventDefault();
    focusMain();
  });
  route();
  if (session.key) {
    // The page is already drawn; once the key's record is known (admin or not) the page
    // hears about it and shows what depends on it (the owner column, the admin fields).
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
    if (current) current.sessionChanged();
  }
}

start();
