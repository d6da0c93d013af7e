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

/**
 * A line that says when data was last refreshed, or that the last refresh failed.
 *
 * Only the state ("Live", "Update failed: …", "Live again") is a live region, so screen
 * readers hear a change of state once; the visible time of the last update sits outside it
 * and changes silently on every poll.
 */
export function liveStatus(label = 'Live') {
  const state = h('span', { class: 'live-state', role: 'status' });
  const time = h('span', { class: 'live-time' });
  const pulse = h('span', { class: 'pulse', 'aria-hidden': 'true' });
  const el = h('p', { class: 'live-status muted' }, pulse, state, time);
  let failed = false;
  let lastOk = null;
  const say = (text) => { if (state.textContent !== text) state.textContent = text; };
  return {
    el,
    /** A refresh succeeded (at `when`). */
    ok(when = new Date()) {
      el.className = 'live-status muted';
      pulse.hidden = false;
      say(failed ? `${label} again` : label);
      failed = false;
      lastOk = when;
      time.textContent = `· updated ${when.toLocaleTimeString()}`;
    },
    /** A refresh failed; `retrying` says whether the page tries again by itself. */
    error(err, retrying = true) {
      el.className = 'live-status error-text';
      pulse.hidden = true;
      failed = true;
      say(`Update failed: ${err.message || err}. Showing the last data received${retrying ? '; retrying' : ''}.`);
      time.textContent = lastOk ? `· last update ${lastOk.toLocaleTimeString()}` : '';
    },
  };
}

/**
 * An error box for a failed request: "Could not <action> (HTTP 503). <message>".
 * `retrying`: the page polls and will try again by itself (said so; one-shot actions are not).
 */
export function errorNotice(err, action, { retrying = false } = {}) {
  const status = err && err.status ? ` (HTTP ${err.status})` : '';
  return notice('error', h('strong', {}, `Could not ${action}${status}. `), err.message || String(err),
    retrying ? ' Retrying…' : '');
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
