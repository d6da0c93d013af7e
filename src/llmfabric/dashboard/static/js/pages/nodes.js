// Nodes: lifecycle, hardware, labels, load, last seen and relay path of every node this
// ingress's replica knows, polled about once a second.

import { h, mount, patch, keyed, notice, tableWrap, badge, chip, fmtAgo, fmtNum, fmtInt, shortId, announce } from '../dom.js';
import { get, listOf } from '../api.js';
import { pageHeader, filterSelect, searchBox, liveStatus, errorNotice, includesText } from './common.js';

const POLL_MS = 1000;
const STATES = ['JOIN', 'SERVING', 'DOWN', 'LEFT'];

/** The state a person cares about: SERVING but suspected shows as "suspected". */
export function displayState(n) {
  if (n.suspected && (n.state === 'SERVING' || n.state === 'JOIN')) return 'suspected';
  return n.state;
}

const BADGE = { JOIN: 'info', SERVING: 'ok', DOWN: 'bad', LEFT: 'muted', suspected: 'warn' };

function hardwareText(hw = {}) {
  if (!hw.gpu_count || hw.gpu_model === 'cpu') {
    return `CPU${hw.cpu_count ? ` · ${hw.cpu_count} cores` : ''}${hw.memory_gb ? ` · ${fmtNum(hw.memory_gb, 0)} GB` : ''}`;
  }
  const mem = hw.gpu_memory_gb ? ` · ${fmtNum(hw.gpu_memory_gb, 0)} GB` : '';
  const ic = hw.interconnect && hw.interconnect !== 'none' ? ` · ${hw.interconnect}` : '';
  return `${hw.gpu_count}× ${hw.gpu_model}${mem}${ic}`;
}

function pathCell(n) {
  if ((n.relays || []).length) {
    return h('span', { title: `relays: ${n.relays.join(', ')}` },
      badge('relayed', 'info'), ' via ', n.relays.map((r) => shortId(r, 10)).join(', '));
  }
  if (n.http_addr) {
    return h('span', { title: (n.peer_addrs || []).join(', ') || n.http_addr },
      badge('direct', 'muted'), ' ', h('code', {}, n.http_addr));
  }
  return h('span', { class: 'muted' }, 'no address yet');
}

function render(view, ctx, params) {
  const search = searchBox('Search', 'node, provider, GPU, label, model…');
  search.input.value = params.get('q') || '';
  const state = filterSelect('State', 'All states');
  state.setOptions([...STATES, 'suspected']);
  const provider = filterSelect('Provider', 'All providers');
  const live = liveStatus();
  const counts = h('ul', { class: 'stat-cards', 'aria-label': 'Nodes by state' });
  const errorBox = h('div');
  const results = h('div', { class: 'results' }, h('p', { class: 'muted' }, 'Loading nodes…'));

  mount(view,
    pageHeader('Nodes', 'Every node session this ingress knows: lifecycle, hardware, load and how it is reached.'),
    counts,
    h('form', { class: 'toolbar', role: 'search', on: { submit: (e) => e.preventDefault() } },
      search.el, state.el, provider.el),
    h('div', { class: 'row-between' }, h('span'), live.el),
    errorBox,
    results);

  let nodes = null;
  const prevState = new Map();

  const draw = () => {
    if (nodes === null) return;
    const byState = { JOIN: 0, SERVING: 0, suspected: 0, DOWN: 0, LEFT: 0 };
    for (const n of nodes) byState[displayState(n)] = (byState[displayState(n)] || 0) + 1;
    // patch, not mount, everywhere below: this redraws every second, and keyboard focus and
    // the table's horizontal scroll must survive it
    patch(counts, Object.entries(byState).map(([k, v]) =>
      h('li', { class: `stat state-${k.toLowerCase()}`, dataset: { key: k, state: k } },
        h('span', { class: 'stat-value' }, fmtInt(v)), h('span', { class: 'stat-label' }, k))));
    const q = search.input.value.trim();
    const shown = nodes.filter((n) =>
      includesText([n.session_id, n.peer_id, n.provider_id, n.hardware?.gpu_model, n.engine, n.http_addr,
        ...Object.entries(n.labels || {}).map(([k, v]) => `${k}=${v}`),
        ...(n.models || []).map((m) => m.id)], q)
      && (!state.value || displayState(n) === state.value)
      && (!provider.value || n.provider_id === provider.value));
    if (nodes.length === 0) {
      patch(results, keyed('no-nodes', notice('empty', h('strong', {}, 'No nodes yet. '),
        'Nodes appear here as soon as they join the fabric (', h('code', {}, 'llmfabric start'), ').')));
      return;
    }
    if (shown.length === 0) {
      patch(results, keyed('no-match', notice('empty', 'No node matches these filters.')));
      return;
    }
    patch(results, keyed('table', tableWrap('Nodes', h('table', { class: 'data', id: 'nodes-table' },
      h('caption', { class: 'visually-hidden' }, 'Nodes and their lifecycle state'),
      h('thead', {}, h('tr', {},
        ['Node', 'State', 'Provider', 'Hardware', 'Engine · models', 'Labels', 'Load', 'Last seen', 'Path']
          .map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, shown.map(row))))));
  };

  // A provider name is the node's own claim; the verified identity (its certificate's
  // provider, or on PSK networks its key fingerprint) is what allowlists match. An impostor
  // claiming another provider's name must not look like it.
  const providerCell = (n) => {
    if (!n.provider_id) return h('span', { class: 'muted' }, '–');
    const verified = n.verified_provider && n.verified_provider === n.provider_id;
    return [n.provider_id, ' ', verified
      ? badge('verified', 'ok')
      : h('span', { class: 'badge', title: n.verified_provider
        ? `the name is the node's claim; its verified identity is ${n.verified_provider}`
        : "the name is the node's claim; it has no verified identity" }, 'claimed')];
  };

  const row = (n) => {
    const ds = displayState(n);
    const load = n.load || {};
    return h('tr', { dataset: { key: n.session_id, session: n.session_id, state: ds }, class: `state-${ds.toLowerCase()}` },
      h('th', { scope: 'row' },
        h('code', { title: n.session_id }, shortId(n.session_id, 12)),
        h('div', { class: 'muted small', title: `peer ${n.peer_id}` }, `peer ${shortId(n.peer_id, 12)}`),
        (n.roles || []).length ? h('div', {}, n.roles.map(chip)) : null),
      h('td', { class: 'state-cell' }, badge(ds, BADGE[ds] || ''),
        n.suspected && ds !== 'suspected' ? [' ', badge('suspected', 'warn')] : null,
        h('div', { class: 'muted small' }, `inc ${n.incarnation} · v${n.version} · ${n.tier || ''}`)),
      h('td', {}, providerCell(n)),
      h('td', {}, hardwareText(n.hardware)),
      h('td', {}, h('div', {}, n.engine || h('span', { class: 'muted' }, 'bare node')),
        (n.models || []).map((m) => h('div', { class: 'small' },
          h('a', { class: 'model-id', href: `#/catalog?q=${encodeURIComponent(m.id)}`,
            'aria-label': `${m.id} in the catalog` }, m.id),
          h('span', { class: 'muted' }, ` ${m.quantization} · ${m.role}`)))),
      h('td', {}, Object.entries(n.labels || {}).map(([k, v]) => chip(`${k}=${v}`))),
      h('td', { class: 'nowrap load' },
        h('div', {}, `${fmtInt(load.inflight)} in flight`),
        h('div', { class: 'muted small' }, `${fmtInt(load.queued)} queued · ${fmtNum(load.tokens_per_s, 0)} tok/s`)),
      h('td', { class: 'nowrap seen', title: new Date((n.last_seen || 0) * 1000).toISOString() }, fmtAgo(n.last_seen)),
      h('td', {}, pathCell(n)));
  };

  for (const el of [search.input, state.select, provider.select]) el.addEventListener('input', draw);

  ctx.every(POLL_MS, async () => {
    try {
      const body = await get('/v1/fabric/nodes');
      if (!ctx.alive) return;
      const next = listOf(body, 'nodes')
        .slice()
        .sort((a, b) => STATES.indexOf(a.state) - STATES.indexOf(b.state)
          || String(a.provider_id).localeCompare(String(b.provider_id))
          || String(a.session_id).localeCompare(String(b.session_id)));
      mount(errorBox);
      live.ok();
      for (const n of next) {
        const was = prevState.get(n.session_id);
        const now = displayState(n);
        if (was && was !== now) announce(`Node ${shortId(n.session_id, 8)} is now ${now}`);
        prevState.set(n.session_id, now);
      }
      nodes = next;
      provider.setOptions([...new Set(nodes.map((n) => n.provider_id).filter(Boolean))].sort());
      draw(); // patches only what changed ("last seen" ticks every second)
    } catch (err) {
      if (!ctx.alive) return;
      live.error(err);
      if (nodes === null) patch(results, keyed('error', errorNotice(err, 'load the nodes', { retrying: true })));
    }
  });
}

export default { title: 'Nodes', render };
