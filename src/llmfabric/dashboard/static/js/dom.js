// DOM helpers. Every piece of data enters the page as a Text node or an attribute value;
// nothing here parses HTML, so data from the fabric cannot inject markup. Bidirectional
// controls in text are shown escaped (see `shown`).

// Bidi embeddings, overrides and isolates (U+202A-202E, U+2066-2069) and the marks (U+200E,
// U+200F, U+061C): a member's name holding U+202E ("right-to-left override") would reorder
// the rest of its table cell (other aliases, labels) and show itself reversed.
const BIDI = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
const HAS_BIDI = new RegExp(BIDI.source); // (no /g: test() keeps no lastIndex)

/** `value` as text with its bidi controls written as escapes (`\u202e`), as the terminal
 * shows them (llmfabric.untrusted.printable): text from the fabric cannot reorder what is
 * around it nor disguise itself. Every text node and title this module makes goes through it. */
export function shown(value) {
  const text = String(value);
  return HAS_BIDI.test(text)
    ? text.replace(BIDI, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)
    : text;
}

const SHOWN_ATTRS = new Set(['title', 'aria-label', 'placeholder', 'alt']);

/**
 * Build an element. `attrs` keys: `class`, `text`, `on` ({event: handler}), `dataset`,
 * boolean properties (`disabled`, `checked`, `hidden`, ...) and any other attribute.
 * Children may be nodes, strings/numbers (inserted as text), arrays, null or false.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key === 'text') el.textContent = shown(value);
    else if (key === 'on') {
      for (const [ev, fn] of Object.entries(value)) el.addEventListener(ev, fn);
    } else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key === 'value') el.value = value;
    else if (value === true) el.setAttribute(key, '');
    else el.setAttribute(key, SHOWN_ATTRS.has(key) ? shown(value) : String(value));
  }
  append(el, children);
  return el;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** Build an SVG element (same rules as h). */
export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'text') el.textContent = shown(value);
    else if (key === 'on') {
      for (const [ev, fn] of Object.entries(value)) el.addEventListener(ev, fn);
    } else el.setAttribute(key, SHOWN_ATTRS.has(key) ? shown(value) : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(shown(child)));
  }
}

/** Replace all children of `el`. */
export function mount(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/**
 * Make the children of `el` look like `children` while keeping every existing node that
 * still fits: text changes in place, attributes are synced, and elements with a `data-key`
 * are matched by key (anywhere among their siblings), the others by position. Live pages
 * redraw through this so that keyboard focus, selection and scroll positions inside them
 * survive a refresh. Event listeners are not copied: use it for markup whose listeners
 * (if any) do not depend on the data.
 */
export function patch(el, ...children) {
  const next = document.createElement('div');
  append(next, children);
  const active = document.activeElement;
  const hadFocus = active && active !== document.body && el.contains(active);
  morphChildren(el, next);
  // A moved row can lose focus in some browsers: give it back if its element survived.
  if (hadFocus && document.activeElement !== active && active.isConnected && el.contains(active)) {
    active.focus({ preventScroll: true });
  }
  return el;
}

/** Give `el` a `data-key` for patch(): keyed siblings are only ever matched by key. */
export function keyed(key, el) {
  el.setAttribute('data-key', key);
  return el;
}

function keyOf(node) {
  return node.nodeType === Node.ELEMENT_NODE ? node.getAttribute('data-key') : null;
}

function sameKind(a, b) {
  return a.nodeType === b.nodeType && a.nodeName === b.nodeName && keyOf(a) === keyOf(b);
}

function morph(cur, next) {
  if (cur.nodeType !== Node.ELEMENT_NODE) {
    if (cur.nodeValue !== next.nodeValue) cur.nodeValue = next.nodeValue;
    return;
  }
  for (const { name } of [...cur.attributes]) {
    if (!next.hasAttribute(name)) cur.removeAttribute(name);
  }
  for (const { name, value } of [...next.attributes]) {
    if (cur.getAttribute(name) !== value) cur.setAttribute(name, value);
  }
  morphChildren(cur, next);
}

function morphChildren(cur, next) {
  const keyed = new Map();
  for (const child of cur.childNodes) {
    const key = keyOf(child);
    if (key !== null) keyed.set(key, child);
  }
  let cursor = cur.firstChild;
  for (const child of [...next.childNodes]) {
    const key = keyOf(child);
    let match = null;
    if (key !== null) {
      match = keyed.get(key) || null;
      keyed.delete(key);
    } else if (cursor && keyOf(cursor) === null) {
      match = cursor;
    }
    if (match && sameKind(match, child)) {
      if (match === cursor) cursor = cursor.nextSibling;
      else cur.insertBefore(match, cursor);
      morph(match, child);
    } else {
      cur.insertBefore(child, cursor);
    }
  }
  while (cursor) {
    const after = cursor.nextSibling;
    cur.removeChild(cursor);
    cursor = after;
  }
}

let uid = 0;
/** A unique id for label/aria wiring. */
export function nextId(prefix = 'f') {
  uid += 1;
  return `${prefix}-${uid}`;
}

/** A labelled form control: returns [wrapper, control]. */
export function field(label, control, hint) {
  const id = control.id || nextId('ctl');
  control.id = id;
  let hintEl = null;
  if (hint) {
    hintEl = h('small', { class: 'hint', id: `${id}-hint` }, hint);
    control.setAttribute('aria-describedby', hintEl.id);
  }
  return [h('div', { class: 'field' }, h('label', { for: id }, label), control, hintEl), control];
}

/** A notice box: kind is 'info' | 'error' | 'empty' | 'success'. */
export function notice(kind, ...children) {
  const role = kind === 'error' ? 'alert' : null;
  return h('div', { class: `notice ${kind}`, role }, ...children);
}

/** Wrap a table so it scrolls horizontally on narrow screens. */
export function tableWrap(label, table) {
  return h('div', { class: 'table-wrap', role: 'region', 'aria-label': label, tabindex: '0' }, table);
}

export function badge(text, kind = '') {
  return h('span', { class: `badge ${kind}`.trim() }, text);
}

export function chip(text) {
  return h('span', { class: 'chip' }, text);
}

/** Tell screen readers about something that changed (polite). */
export function announce(message) {
  const el = document.getElementById('announcer');
  if (!el) return;
  el.textContent = '';
  window.setTimeout(() => { el.textContent = message; }, 30);
}

// ---- formatting -------------------------------------------------------------------------

export function fmtInt(n) {
  if (n === null || n === undefined || Number.isNaN(Number(n))) return '–';
  return Number(n).toLocaleString('en-US', { maximumFractionDigits: 0 });
}

export function fmtNum(n, digits = 1) {
  if (n === null || n === undefined || Number.isNaN(Number(n))) return '–';
  return Number(n).toLocaleString('en-US', { maximumFractionDigits: digits });
}

/** 131072 -> "128k", 4096 -> "4k", 1000 -> "1000". */
export function fmtContext(tokens) {
  const n = Number(tokens) || 0;
  if (n >= 1024 && n % 1024 === 0) return `${n / 1024}k`;
  return fmtInt(n);
}

/** Seconds since `unixSeconds` as "3 s ago" / "5 min ago" / "2 h ago". */
export function fmtAgo(unixSeconds, nowMs = Date.now()) {
  if (!unixSeconds) return 'never';
  const d = Math.max(0, nowMs / 1000 - Number(unixSeconds));
  if (d < 1.5) return 'just now';
  if (d < 90) return `${Math.round(d)} s ago`;
  if (d < 5400) return `${Math.round(d / 60)} min ago`;
  if (d < 172800) return `${Math.round(d / 3600)} h ago`;
  return `${Math.round(d / 86400)} d ago`;
}

/** Unix seconds as UTC to the second ("2027-01-31 00:00:00 UTC"), the one format of every
 * time the pages list; '–' for none or a value that is not a time. */
export function fmtTime(unixSeconds) {
  if (!unixSeconds) return '–';
  const d = new Date(Number(unixSeconds) * 1000);
  if (Number.isNaN(d.getTime())) return '–';  // (toISOString would throw: no page at all)
  return d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC');
}

/** First characters of a long id, for display (the full id goes into a title). */
export function shortId(id, n = 10) {
  const str = String(id ?? '');
  return str.length > n ? `${str.slice(0, n)}…` : str;
}

/** Cheap structural fingerprint so polling pages re-render only when data changed. */
export function fingerprint(value) {
  return JSON.stringify(value);
}
