// Traces: the ingress's last requests (GET /v1/fabric/traces, admin keys) and, for the one
// selected, a waterfall of its spans: auth, queue, route, each attempt (forward to the first
// byte, with the node's own time under it as the node reported it, then the stream; an
// attempt through a relay says so), drawn in SVG on one time axis; then a table of its
// attempts: the model each was for (a request with `models` fallbacks tries several), its
// phase (prefill/decode, or a stream's continuation), node and outcome.

import { h, s, mount, notice, tableWrap, fmtNum, fmtTime, shortId } from '../dom.js';
import { get, ApiError } from '../api.js';
import { pageHeader, errorNotice, signInRequired, liveStatus } from './common.js';

const ROW = 22;
const LABEL_W = 150;
const BAR_W = 560;

/** Spans in waterfall order: depth-first from the root, siblings by start time. */
export function waterfallRows(spans) {
  const kids = new Map();
  for (const sp of spans) {
    const list = kids.get(sp.parent_id) || [];
    list.push(sp);
    kids.set(sp.parent_id, list);
  }
  const ids = new Set(spans.map((sp) => sp.span_id));
  const roots = spans.filter((sp) => !ids.has(sp.parent_id));
  const out = [];
  const walk = (sp, depth) => {
    if (out.length > 200) return;
    out.push({ span: sp, depth });
    for (const k of (kids.get(sp.span_id) || []).sort((a, b) => a.start_ms - b.start_ms)) walk(k, depth + 1);
  };
  for (const r of roots) walk(r, 0);
  return out;
}

function spanLabel(sp) {
  const a = sp.attrs || {};
  if (sp.name === 'attempt') {
    const via = a.via === 'relay' ? ' via relay' : '';
    return `attempt ${a.attempt ?? ''} → ${shortId(String(a.node || ''), 12)}${via}`;
  }
  if (sp.name === 'node') return a.clamped ? 'node (clamped)' : 'node';
  return sp.name;
}

/** An attempt's phase: prefill or decode (the two-phase path), or a stream's continuation. */
function attemptPhase(a) {
  if (a.phase != null) return String(a.phase);
  return a.continuation ? 'continuation' : '';
}

function spanNote(sp) {
  const a = sp.attrs || {};
  if (sp.name === 'node' && a.reported_ms != null) return ` (the node reported ${fmtNum(a.reported_ms, 1)} ms)`;
  if (sp.name === 'attempt') {
    const phase = attemptPhase(a);
    return `${a.model != null ? ` for model ${a.model}` : ''}${phase ? `, ${phase}` : ''}${a.relay ? ` (through relay ${a.relay})` : ''}`;
  }
  return '';
}

/** The attempts of a trace, in order: what the waterfall's labels have no room for. */
export function attemptsTable(trace) {
  const attempts = (trace.spans || []).filter((sp) => sp.name === 'attempt')
    .sort((x, y) => (x.attrs?.attempt ?? 0) - (y.attrs?.attempt ?? 0) || x.start_ms - y.start_ms);
  if (attempts.length === 0) return null;
  const table = h('table', { id: 'attempts-table' },
    h('thead', {}, h('tr', {}, ['Attempt', 'Model', 'Phase', 'Node', 'Outcome'].map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', {}, attempts.map((sp) => {
      const a = sp.attrs || {};
      const outcome = a.error ? `failed: ${a.error}` : a.status != null ? `status ${a.status}` : '-';
      return h('tr', { 'data-attempt': String(a.attempt ?? '') },
        h('td', { class: 'num' }, String(a.attempt ?? '-')),
        h('td', {}, a.model != null ? String(a.model) : '-'),
        h('td', {}, attemptPhase(a) || '-'),
        h('td', { title: String(a.node ?? '') }, shortId(String(a.node ?? ''), 16)),
        h('td', {}, outcome));
    })));
  return tableWrap('Attempts of the selected trace', table);
}

export function waterfall(trace) {
  const rows = waterfallRows(trace.spans || []);
  const total = Math.max(trace.duration_ms || 0, ...rows.map((r) => r.span.end_ms), 0.001);
  const x = (ms) => LABEL_W + (Math.max(0, ms) / total) * BAR_W;
  const height = rows.length * ROW + 24;
  const svg = s('svg', {
    id: 'waterfall', class: 'waterfall', role: 'img', width: LABEL_W + BAR_W + 90, height,
    viewBox: `0 0 ${LABEL_W + BAR_W + 90} ${height}`,
    'aria-label': `Waterfall of trace ${trace.trace_id}: ${rows.length} spans over ${fmtNum(total, 1)} ms`,
  });
  rows.forEach(({ span, depth }, i) => {
    const y = i * ROW + 4;
    const w = Math.max(1, x(span.end_ms) - x(span.start_ms));
    const failed = (span.attrs && (span.attrs.error || (span.attrs.status ?? 0) >= 500));
    svg.append(s('g', { class: `wf-row wf-${span.name.replace(/[^a-z]/g, '')}${failed ? ' wf-failed' : ''}`, 'data-span': span.name },
      s('title', { text: `${span.name}: ${fmtNum(span.start_ms, 1)}–${fmtNum(span.end_ms, 1)} ms${span.attrs && span.attrs.error ? ` (${span.attrs.error})` : ''}${spanNote(span)}` }),
      s('text', { x: 4 + depth * 10, y: y + 14, class: 'wf-label', text: spanLabel(span) }),
      s('rect', { x: x(span.start_ms), y: y + 3, width: w, height: ROW - 8, rx: 2, class: 'wf-bar' }),
      s('text', { x: x(span.start_ms) + w + 4, y: y + 14, class: 'wf-ms', text: `${fmtNum(span.end_ms - span.start_ms, 1)} ms` })));
  });
  svg.append(s('text', { x: LABEL_W, y: height - 4, class: 'wf-axis', text: '0 ms' }),
    s('text', { x: LABEL_W + BAR_W, y: height - 4, class: 'wf-axis', 'text-anchor': 'end', text: `${fmtNum(total, 1)} ms` }));
  return svg;
}

function render(view, ctx) {
  if (!ctx.session.key) {
    mount(view, pageHeader('Traces', 'The last requests of this ingress, as waterfalls.'), signInRequired('traces'));
    return;
  }
  const status = liveStatus();
  const listBox = h('div', {}, h('p', { class: 'muted' }, 'Loading traces…'));
  const detail = h('section', { class: 'card', id: 'trace-detail', 'aria-label': 'Selected trace' });
  mount(view, pageHeader('Traces', 'The last requests of this ingress (newest first); pick one to see its waterfall.', status.el), listBox, detail);
  let selected = '';
  let traces = [];

  function showDetail() {
    const t = traces.find((x) => x.trace_id === selected) || traces[0];
    if (!t) { mount(detail); return; }
    selected = t.trace_id;
    const a = t.attrs || {};
    mount(detail,
      h('h2', {}, 'Trace ', h('code', { id: 'trace-id' }, t.trace_id)),
      h('p', { class: 'muted' }, `${a.model || '-'} · status ${t.status} · ${fmtNum(t.duration_ms, 1)} ms · ${fmtTime(t.started_at)}`),
      h('div', { class: 'waterfall-wrap' }, waterfall(t)),
      attemptsTable(t));
    for (const tr of listBox.querySelectorAll('tr[data-trace]')) {
      if (tr.dataset.trace === selected) tr.setAttribute('aria-selected', 'true');
      else tr.removeAttribute('aria-selected');
    }
  }

  async function load() {
    let body;
    try {
      body = await get('/v1/fabric/traces?limit=50');
    } catch (err) {
      if (err instanceof ApiError && err.status === 403) {
        mount(listBox, notice('empty', 'Traces are shown to admin keys only.'));
        return;
      }
      status.error(err);
      mount(listBox, errorNotice(err, 'load traces'));
      return;
    }
    status.ok();
    traces = body.data || [];
    if (!body.enabled) {
      mount(listBox, notice('empty', 'Tracing is off on this ingress (keep_traces = 0).'));
      return;
    }
    if (traces.length === 0) {
      mount(listBox, notice('empty', 'No requests traced yet. Requests to /v1/chat/completions and the other OpenAI routes show up here.'));
      mount(detail);
      return;
    }
    const table = h('table', { id: 'traces-table' },
      h('thead', {}, h('tr', {}, ['Time', 'Model', 'Status', 'Duration', 'Attempts', 'Trace'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, traces.map((t) => h('tr', { 'data-trace': t.trace_id, 'data-status': String(t.status) },
        h('td', {}, fmtTime(t.started_at)),
        h('td', {}, (t.attrs && t.attrs.model) || '-'),
        h('td', {}, String(t.status)),
        h('td', { class: 'num' }, `${fmtNum(t.duration_ms, 1)} ms`),
        h('td', { class: 'num' }, String((t.spans || []).filter((sp) => sp.name === 'attempt').length)),
        h('td', {}, h('button', { type: 'button', class: 'link', on: { click: () => { selected = t.trace_id; showDetail(); } } }, shortId(t.trace_id, 12)))))));
    mount(listBox, tableWrap('Recent request traces', table));
    showDetail();
  }

  ctx.every(5000, load);
}

export default { title: 'Traces', render };
