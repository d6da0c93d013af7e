// Pieces shared by the pages: headers, toolbars, filter selects, live-status lines.

import { h, mount, notice } from '../dom.js';

export function pageHeader(title, subtitle, ...actions) {
  return h('div', { class: 'page-header' },
    h('div', {}, h('h1', {}, title), subtitle ? h('p', { class: 'muted' }, subtitle) : null),
    actions.length ? h('div', { class: 'actions' }, actions) : null);
}

/** A <select> whose options are refreshed without losing the user's choice. */
export function filterSelect(label, allLabel) {
  const select = h('select', { 'aria-label': label });
  const wrap = h('label', { class: 'filter' }, h('span', {}, label), select);
  let known = null;
  const api = {
    el: wrap,
    select,
    get value() { return select.value; },
    set value(v) { select.value = v; },
    setOptions(values) {
      const sig = values.join('\u0000');
      if (sig === known) return;
      known = sig;
      const keep = select.value;
      mount(select, h('option', { value: '' }, allLabel), values.map((v) => h('option', { value: v }, v)));
      select.value = values.includes(keep) ? keep : '';
    },
  };
  api.setOptions([]);
  return api;
}

export function searchBox(label, placeholder) {
  const input = h('input', { type: 'search', placeholder, 'aria-label': label, autocomplete: 'off', spellcheck: 'false' });
  return { el: h('label', { class: 'filter grow' }, h('span', {}, label), input), input };
}

/** A line that says when data was last refreshed, or that the last refresh failed. */
export function liveStatus() {
  const el = h('p', { class: 'live-status muted', role: 'status' });
  return {
    el,
    ok(text) {
      el.className = 'live-status muted';
      mount(el, h('span', { class: 'pulse', 'aria-hidden': 'true' }), text);
    },
    error(err) {
      el.className = 'live-status error-text';
      mount(el, `Update failed: ${err.message || err}. Showing the last data received.`);
    },
  };
}

export function errorNotice(err, what) {
  const status = err && err.status ? ` (HTTP ${err.status})` : '';
  return notice('error', h('strong', {}, `Could not load ${what}${status}. `), err.message || String(err));
}

export function includesText(haystacks, needle) {
  if (!needle) return true;
  const n = needle.toLowerCase();
  return haystacks.some((x) => String(x ?? '').toLowerCase().includes(n));
}

export function signInRequired(what) {
  return notice('info',
    h('strong', {}, `Sign in to see ${what}. `),
    'Use an API key: ', h('a', { href: '#/keys' }, 'sign in on the Keys page'), '.');
}
