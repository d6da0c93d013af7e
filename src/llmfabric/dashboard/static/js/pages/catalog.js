// Catalog: every model with its serving nodes, GPU types, providers, quantization and
// context, refreshed live; search and filters.

import { h, mount, patch, keyed, notice, tableWrap, badge, chip, fmtContext, fmtNum, shortId, fingerprint } from '../dom.js';
import { get, listOf, ApiError } from '../api.js';
import { pageHeader, filterSelect, searchBox, liveStatus, errorNotice, includesText } from './common.js';

const POLL_MS = 2000;

function statusOf(model) {
  if (model.serving > 0) return 'serving';
  return 'unavailable';
}

/** The fabric's model view; a standalone ingress without it has /v1/models (same fields). */
async function loadModels() {
  try {
    return listOf(await get('/v1/fabric/models'), 'models');
  } catch (err) {
    if (!(err instanceof ApiError) || err.status !== 404) throw err;
    return listOf(await get('/v1/models'), 'data');
  }
}

async function loadNodes() {
  try {
    return listOf(await get('/v1/fabric/nodes'), 'nodes');
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) return [];
    throw err;
  }
}

function render(view, ctx, params) {
  const search = searchBox('Search', 'model, alias, GPU, provider…');
  search.input.value = params.get('q') || '';
  const gpu = filterSelect('GPU', 'All GPUs');
  const provider = filterSelect('Provider', 'All providers');
  const quant = filterSelect('Quantization', 'All');
  const status = filterSelect('Status', 'Any status');
  status.setOptions(['serving', 'unavailable']);
  const live = liveStatus();
  const errorBox = h('div');
  const results = h('div', { class: 'results' }, h('p', { class: 'muted' }, 'Loading the catalog…'));
  const summary = h('p', { class: 'summary', 'aria-live': 'polite' });

  mount(view,
    pageHeader('Catalog', 'Models served by the fabric right now, and the hardware behind them.'),
    h('form', { class: 'toolbar', role: 'search', on: { submit: (e) => e.preventDefault() } },
      search.el, gpu.el, provider.el, quant.el, status.el),
    h('div', { class: 'row-between' }, summary, live.el),
    errorBox,
    results);

  let models = null;
  let nodesById = new Map();
  let lastSig = '';

  const draw = () => {
    if (models === null) return;
    const q = search.input.value.trim();
    const shown = models.filter((m) =>
      includesText([m.id, ...(m.aliases || []), ...(m.gpus || []), ...(m.providers || []), ...(m.quantizations || [])], q)
      && (!gpu.value || (m.gpus || []).includes(gpu.value))
      && (!provider.value || (m.providers || []).includes(provider.value))
      && (!quant.value || (m.quantizations || []).includes(quant.value))
      && (!status.value || statusOf(m) === status.value));
    const serving = models.filter((m) => m.serving > 0).length;
    const said = `${models.length} model${models.length === 1 ? '' : 's'}, ${serving} serving`
      + (shown.length !== models.length ? ` · ${shown.length} shown` : '');
    if (summary.textContent !== said) summary.textContent = said; // a live region: only real changes
    // patch, not mount: focus and horizontal scroll inside the table survive each refresh
    if (models.length === 0) {
      patch(results, keyed('no-models', notice('empty',
        h('strong', {}, 'No models are served yet. '),
        'Start a node with ', h('code', {}, 'llmfabric start --process vllm serve MODEL'),
        ' or run ', h('code', {}, 'llmfabric demo'), '; models appear here within seconds.')));
      return;
    }
    if (shown.length === 0) {
      patch(results, keyed('no-match', notice('empty', 'No model matches these filters. ',
        h('button', { type: 'button', class: 'link', on: { click: clear } }, 'Clear filters'))));
      return;
    }
    patch(results, keyed('table', tableWrap('Models', h('table', { class: 'data', id: 'catalog-table' },
      h('caption', { class: 'visually-hidden' }, 'Models in the fabric'),
      h('thead', {}, h('tr', {},
        ['Model', 'Status', 'Nodes', 'GPUs', 'Providers', 'Quantization', 'Context', 'Demand']
          .map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, shown.map(row))))));
  };

  const row = (m) => {
    const st = statusOf(m);
    return h('tr', { dataset: { key: m.id, model: m.id, status: st } },
      h('th', { scope: 'row' },
        h('div', { class: 'model-id' }, m.id),
        (m.aliases || []).length ? h('div', { class: 'muted small' }, `aka ${m.aliases.join(', ')}`) : null,
        h('a', { class: 'small', href: `#/chat?model=${encodeURIComponent(m.id)}`,
          'aria-label': `Try ${m.id} in the chat playground` }, 'Try in chat')),
      h('td', {}, st === 'serving'
        ? badge(`Serving · ${m.serving}`, 'ok')
        : badge('Unavailable', 'bad')),
      h('td', {}, h('ul', { class: 'node-list' }, (m.nodes || []).map((sid) => nodeItem(sid)))),
      h('td', {}, (m.gpus || []).map(chip)),
      h('td', {}, (m.providers || []).map((name) => (m.unverified_providers || []).includes(name)
        ? h('span', { class: 'chip claimed', title: 'claimed by a node whose verified identity is not this name' },
          name, h('span', { class: 'muted small' }, ' (claimed)'))
        : chip(name))),
      h('td', {}, (m.quantizations || []).map(chip)),
      h('td', { class: 'num' }, fmtContext(m.max_context)),
      h('td', { class: 'num demand', title: 'Requests per second the ingress nodes observed over the last 5 minutes' },
        m.demand_rps > 0 ? `${fmtNum(m.demand_rps, m.demand_rps < 10 ? 2 : 0)} req/s` : '—'));
  };

  const nodeItem = (sid) => {
    const n = nodesById.get(sid);
    const state = n ? (n.suspected && n.state === 'SERVING' ? 'suspected' : n.state) : 'unknown';
    const label = n ? `${n.hardware?.gpu_count || 0}× ${n.hardware?.gpu_model || '?'}` : '';
    return h('li', { dataset: { key: sid } },
      h('a', { href: `#/nodes?q=${encodeURIComponent(sid)}`, title: sid,
        class: `node-chip state-${state.toLowerCase()}` },
      h('span', { class: 'dot', 'aria-hidden': 'true' }),
      `${shortId(sid, 8)} `, h('span', { class: 'muted' }, label),
      h('span', { class: 'visually-hidden' }, ` (${state})`)));
  };

  function clear() {
    search.input.value = '';
    for (const f of [gpu, provider, quant, status]) f.value = '';
    draw();
    search.input.focus();
  }

  for (const el of [search.input, gpu.select, provider.select, quant.select, status.select]) {
    el.addEventListener('input', draw);
  }

  ctx.every(POLL_MS, async () => {
    try {
      const [nextModels, nextNodes] = await Promise.all([loadModels(), loadNodes()]);
      if (!ctx.alive) return;
      mount(errorBox);
      live.ok();
      const sig = fingerprint([nextModels, nextNodes.map((n) => [n.session_id, n.state, n.suspected])]);
      if (sig === lastSig) return;
      lastSig = sig;
      models = nextModels;
      nodesById = new Map(nextNodes.map((n) => [n.session_id, n]));
      gpu.setOptions([...new Set(models.flatMap((m) => m.gpus || []))].sort());
      provider.setOptions([...new Set(models.flatMap((m) => m.providers || []))].sort());
      quant.setOptions([...new Set(models.flatMap((m) => m.quantizations || []))].sort());
      draw();
    } catch (err) {
      if (!ctx.alive) return;
      live.error(err);
      if (models === null) patch(results, keyed('error', errorNotice(err, 'load the catalog', { retrying: true })));
    }
  });
}

export default { title: 'Catalog', render };
