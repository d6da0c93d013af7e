// Usage: tokens and requests per key and model per day, as a stacked SVG bar chart and a table.

import { h, mount, notice, tableWrap, fmtInt } from '../dom.js';
import { get, listOf, ApiError } from '../api.js';
import { pageHeader, filterSelect, errorNotice, signInRequired } from './common.js';
import { stackedBarChart } from '../chart.js';

const METRICS = {
  total_tokens: 'tokens',
  prompt_tokens: 'prompt tokens',
  completion_tokens: 'completion tokens',
  requests: 'requests',
};

/** Every UTC day from `first` to `last` inclusive ("YYYY-MM-DD"). */
export function daysBetween(first, last) {
  const out = [];
  const end = Date.parse(`${last}T00:00:00Z`);
  for (let t = Date.parse(`${first}T00:00:00Z`); t <= end && out.length < 400; t += 86400000) {
    out.push(new Date(t).toISOString().slice(0, 10));
  }
  return out;
}

function render(view, ctx) {
  if (!ctx.session.key) {
    mount(view, pageHeader('Usage', 'Tokens and requests per key and model, per day.'), signInRequired('usage'));
    return;
  }
  const metric = h('select', { id: 'usage-metric' },
    Object.entries(METRICS).map(([v, label]) => h('option', { value: v }, label[0].toUpperCase() + label.slice(1))));
  const groupBy = h('select', { id: 'usage-group' },
    h('option', { value: 'model' }, 'Model'), h('option', { value: 'key' }, 'Key'));
  const range = h('select', { id: 'usage-range' },
    h('option', { value: '7' }, 'Last 7 days'), h('option', { value: '30', selected: true }, 'Last 30 days'),
    h('option', { value: '90' }, 'Last 90 days'), h('option', { value: '0' }, 'All time'));
  const keyFilter = filterSelect('Key', 'All keys');
  const modelFilter = filterSelect('Model', 'All models');
  const chartBox = h('div', { class: 'card chart-card' }, h('p', { class: 'muted' }, 'Loading usage…'));
  const tableBox = h('div');
  const totals = h('ul', { class: 'stat-cards', 'aria-label': 'Totals in range' });
  const refresh = h('button', { type: 'button', class: 'secondary', on: { click: () => load() } }, 'Refresh');

  mount(view,
    pageHeader('Usage', 'Tokens and requests per key and model, per UTC day.', refresh),
    h('form', { class: 'toolbar', on: { submit: (e) => e.preventDefault() } },
      h('label', { class: 'filter', for: 'usage-metric' }, h('span', {}, 'Measure'), metric),
      h('label', { class: 'filter', for: 'usage-group' }, h('span', {}, 'Stack by'), groupBy),
      h('label', { class: 'filter', for: 'usage-range' }, h('span', {}, 'Range'), range),
      keyFilter.el, modelFilter.el),
    totals, chartBox, tableBox);

  let rows = null;
  let keyNames = new Map();
  const keyLabel = (id) => (keyNames.get(id) ? `${keyNames.get(id)} (${id.slice(0, 6)}…)` : id);

  function draw() {
    if (rows === null) return;
    const days = Number(range.value);
    const since = days ? new Date(Date.now() - (days - 1) * 86400000).toISOString().slice(0, 10) : '';
    const shown = rows.filter((r) => (!since || r.day >= since)
      && (!keyFilter.value || r.key_id === keyFilter.value)
      && (!modelFilter.value || r.model === modelFilter.value));
    const sum = (f) => shown.reduce((a, r) => a + (Number(r[f]) || 0), 0);
    mount(totals,
      [['requests', 'requests'], ['prompt_tokens', 'prompt tokens'], ['completion_tokens', 'completion tokens'], ['total_tokens', 'total tokens']]
        .map(([f, label]) => h('li', { class: 'stat' }, h('span', { class: 'stat-value' }, fmtInt(sum(f))), h('span', { class: 'stat-label' }, label))));
    if (shown.length === 0) {
      mount(chartBox, notice('empty', rows.length === 0
        ? 'No usage recorded yet. Calls to /v1/chat/completions with your key show up here (usage is flushed every few seconds).'
        : 'No usage in this range or for these filters.'));
      mount(tableBox);
      return;
    }
    const m = metric.value;
    const seriesOf = (r) => (groupBy.value === 'key' ? keyLabel(r.key_id) : r.model);
    const dayList = shown.map((r) => r.day).sort();
    const today = new Date().toISOString().slice(0, 10);
    const lastDay = dayList[dayList.length - 1] > today ? dayList[dayList.length - 1] : today;
    const categories = daysBetween(since || dayList[0], lastDay);
    const series = [...new Set(shown.map(seriesOf))].sort();
    const cell = new Map();
    for (const r of shown) {
      const k = `${r.day}\u0000${seriesOf(r)}`;
      cell.set(k, (cell.get(k) || 0) + (Number(r[m]) || 0));
    }
    mount(chartBox,
      h('h2', { class: 'chart-title' }, `${METRICS[m][0].toUpperCase()}${METRICS[m].slice(1)} per day, by ${groupBy.value}`),
      stackedBarChart({ categories, series, value: (c, s) => cell.get(`${c}\u0000${s}`) || 0,
        title: `${METRICS[m]} per day by ${groupBy.value}`, unit: METRICS[m] }));
    const admin = Boolean(ctx.session.me && ctx.session.me.admin);
    const sorted = shown.slice().sort((a, b) => b.day.localeCompare(a.day) || a.model.localeCompare(b.model));
    mount(tableBox, h('section', { class: 'card', 'aria-labelledby': 'usage-table-title' },
      h('h2', { id: 'usage-table-title' }, 'Per key, model and day'),
      tableWrap('Usage rows', h('table', { class: 'data', id: 'usage-table' },
        h('thead', {}, h('tr', {}, ['Day', 'Key', ...(admin ? ['Owner'] : []), 'Model', 'Requests', 'Prompt', 'Completion', 'Total']
          .map((c, i) => h('th', { scope: 'col', class: i >= (admin ? 4 : 3) ? 'num' : null }, c)))),
        h('tbody', {}, sorted.map((r) => h('tr', {},
          h('td', { class: 'nowrap' }, r.day), h('td', {}, keyNames.get(r.key_id) || '', ' ', h('code', { class: 'muted small' }, r.key_id)),
          admin ? h('td', {}, r.owner) : null, h('td', {}, r.model),
          h('td', { class: 'num' }, fmtInt(r.requests)), h('td', { class: 'num' }, fmtInt(r.prompt_tokens)),
          h('td', { class: 'num' }, fmtInt(r.completion_tokens)), h('td', { class: 'num' }, fmtInt(r.total_tokens ?? (r.prompt_tokens + r.completion_tokens)))))),
        h('tfoot', {}, h('tr', {}, h('th', { scope: 'row', colspan: admin ? 4 : 3 }, 'Total'),
          h('td', { class: 'num' }, fmtInt(sum('requests'))), h('td', { class: 'num' }, fmtInt(sum('prompt_tokens'))),
          h('td', { class: 'num' }, fmtInt(sum('completion_tokens'))), h('td', { class: 'num' }, fmtInt(sum('total_tokens')))))))));
  }

  async function load() {
    try {
      const [body, keysBody] = await Promise.all([
        get('/v1/fabric/usage'),
        get('/v1/fabric/keys').catch(() => null),
      ]);
      if (!ctx.alive) return;
      keyNames = new Map(listOf(keysBody, 'keys').map((k) => [k.id, k.name]));
      rows = listOf(body, 'usage').map((r) => ({
        ...r, total_tokens: r.total_tokens ?? ((Number(r.prompt_tokens) || 0) + (Number(r.completion_tokens) || 0)),
      }));
      keyFilter.setOptions([...new Set(rows.map((r) => r.key_id))].sort());
      modelFilter.setOptions([...new Set(rows.map((r) => r.model))].sort());
      draw();
    } catch (err) {
      if (!ctx.alive) return;
      if (err instanceof ApiError && err.status === 401) { ctx.signOut(); return; }
      mount(chartBox, errorNotice(err, 'load usage'));
    }
  }

  ctx.onSession(draw); // the Owner column needs session.me, which may arrive after the first draw
  for (const el of [metric, groupBy, range, keyFilter.select, modelFilter.select]) el.addEventListener('input', draw);
  load();
}

export default { title: 'Usage', render };
