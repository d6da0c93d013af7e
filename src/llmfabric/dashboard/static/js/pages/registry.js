// Registry inspector: the raw signed records and third-party facts of this replica, read-only.

import { h, mount, patch, notice, badge, shortId } from '../dom.js';
import { get, listOf } from '../api.js';
import { pageHeader, searchBox, errorNotice, includesText, liveStatus } from './common.js';

function pick(obj, ...paths) {
  for (const p of paths) {
    let v = obj;
    for (const k of p.split('.')) v = v && typeof v === 'object' ? v[k] : undefined;
    if (v !== undefined && v !== null && v !== '') return v;
  }
  return '';
}

/** A one-line summary of a raw record: [kind, id, state, provider]. */
export function summarize(rec) {
  const kind = pick(rec, 'kind', 'type') || (pick(rec, 'signature', 'record.signature') ? 'record' : 'fact');
  const id = pick(rec, 'session_id', 'record.session_id', 'key', 'subject');
  const state = pick(rec, 'state', 'record.state', 'lifecycle');
  const provider = pick(rec, 'meta.provider_id', 'record.meta.provider_id', 'provider_id');
  return [String(kind), String(id), String(state), String(provider)];
}

function render(view, ctx) {
  const search = searchBox('Search', 'any text in the records…');
  const auto = h('input', { type: 'checkbox', id: 'registry-auto' });
  const live = liveStatus('Loaded');
  const refresh = h('button', { type: 'button', class: 'secondary', on: { click: () => load() } }, 'Refresh');
  const count = h('p', { class: 'summary', 'aria-live': 'polite' });
  const results = h('div', { class: 'results' }, h('p', { class: 'muted' }, 'Loading records…'));
  const expandAll = h('button', { type: 'button', class: 'link', on: { click: () => {
    const all = results.querySelectorAll('details');
    const open = [...all].some((d) => !d.open);
    for (const d of all) d.open = open;
  } } }, 'Expand / collapse all');

  mount(view,
    pageHeader('Registry inspector', 'The raw records of this node’s replica, exactly as replicated. Read-only: no route can change the registry.', refresh),
    h('form', { class: 'toolbar', role: 'search', on: { submit: (e) => e.preventDefault() } },
      search.el, h('div', { class: 'field check' }, auto, h('label', { for: 'registry-auto' }, 'Refresh every 2 s'))),
    h('div', { class: 'row-between' }, count, h('div', {}, expandAll, ' ', live.el)),
    results);

  let records = null;
  let providers = new Map();
  let texts = [];

  function draw() {
    if (records === null) return;
    const q = search.input.value.trim();
    const shown = records.map((r, i) => [r, texts[i]]).filter(([, t]) => includesText([t], q));
    count.textContent = `${records.length} record${records.length === 1 ? '' : 's'}${shown.length !== records.length ? ` · ${shown.length} shown` : ''}`;
    if (records.length === 0) { mount(results, notice('empty', 'The replica holds no records yet.')); return; }
    if (shown.length === 0) { mount(results, notice('empty', 'No record contains that text.')); return; }
    const wasOpen = new Set([...results.querySelectorAll('details[open]')].map((d) => d.dataset.idx));
    mount(results, h('ul', { class: 'records' }, shown.map(([r, text]) => {
      const [kind, id, st, ownProv] = summarize(r);
      const prov = ownProv || providers.get(id) || '';
      const suspects = Array.isArray(r.suspects) ? r.suspects.length : 0;
      const idx = String(records.indexOf(r));
      return h('li', {}, h('details', { dataset: { idx, session: id }, open: wasOpen.has(idx) },
        h('summary', {}, badge(kind, 'muted'), ' ', h('code', { title: id }, shortId(id, 16) || '(no id)'),
          st ? [' ', badge(st, st === 'SERVING' ? 'ok' : st === 'DOWN' ? 'bad' : 'info')] : null,
          suspects ? [' ', badge(`suspected by ${suspects}`, 'warn')] : null,
          r.evicted ? [' ', badge('evicted', 'bad')] : null,
          prov ? h('span', { class: 'muted' }, ` · ${prov}`) : null),
        h('pre', { class: 'json', tabindex: '0', 'aria-label': `Record ${id}` }, text)));
    })));
  }

  async function load() {
    try {
      const [body, nodesBody] = await Promise.all([
        get('/v1/fabric/records'),
        get('/v1/fabric/nodes').catch(() => null),
      ]);
      if (!ctx.alive) return;
      records = listOf(body, 'records');
      providers = new Map(listOf(nodesBody, 'nodes').map((n) => [n.session_id, n.provider_id]));
      texts = records.map((r) => JSON.stringify(r, null, 2));
      live.ok();
      draw();
    } catch (err) {
      if (!ctx.alive) return;
      live.error(err, auto.checked);
      if (records === null) patch(results, errorNotice(err, 'load the registry records', { retrying: auto.checked }));
    }
  }

  search.input.addEventListener('input', draw);
  let autoOn = false;
  auto.addEventListener('change', () => {
    if (auto.checked && !autoOn) {
      autoOn = true;
      ctx.every(2000, async () => { if (auto.checked) await load(); });
    }
  });
  load();
}

export default { title: 'Registry', render };
