// A small SVG stacked bar chart (no library). Each bar is a category (a day); each
// stacked segment a series (a model or a key). Text goes in as text nodes only.

import { h, s, fmtInt } from './dom.js';

const PALETTE = [
  '#4f7df3', '#f28e2b', '#59a14f', '#e15759', '#76b7b2',
  '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#8cd17d',
];

export function colorFor(index) {
  return PALETTE[index % PALETTE.length];
}

/** Round axis ticks: niceTicks(937) -> [0, 200, 400, 600, 800, 1000]. */
export function niceTicks(max, count = 5) {
  if (!(max > 0)) return [0, 1];
  const raw = max / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((st) => st >= raw) || 10 * mag;
  const top = Math.ceil(max / step) * step;
  const ticks = [];
  for (let v = 0; v <= top + step / 2; v += step) ticks.push(Number(v.toPrecision(12)));
  return ticks;
}

function compact(n) {
  if (n >= 1e9) return `${+(n / 1e9).toFixed(1)}G`;
  if (n >= 1e6) return `${+(n / 1e6).toFixed(1)}M`;
  if (n >= 1e3) return `${+(n / 1e3).toFixed(1)}k`;
  return String(n);
}

/**
 * @param {object} opts
 * @param {string[]} opts.categories  x values in order (e.g. days)
 * @param {string[]} opts.series      stacked series names in order
 * @param {(cat: string, ser: string) => number} opts.value
 * @param {string} opts.title         accessible name of the chart
 * @param {string} opts.unit          what the values count ("tokens", "requests")
 * @returns {HTMLElement} a figure holding the svg and its legend
 */
export function stackedBarChart({ categories, series, value, title, unit }) {
  const width = 960;
  const height = 300;
  const m = { top: 16, right: 12, bottom: 42, left: 56 };
  const iw = width - m.left - m.right;
  const ih = height - m.top - m.bottom;
  const totals = categories.map((c) => series.reduce((acc, sr) => acc + (value(c, sr) || 0), 0));
  const ticks = niceTicks(Math.max(0, ...totals));
  const top = ticks[ticks.length - 1] || 1;
  const y = (v) => m.top + ih - (v / top) * ih;
  const band = iw / Math.max(1, categories.length);
  const barW = Math.max(4, Math.min(56, band * 0.7));

  const grid = ticks.map((t) => s('g', { class: 'tick' },
    s('line', { x1: m.left, x2: width - m.right, y1: y(t), y2: y(t) }),
    s('text', { x: m.left - 6, y: y(t), dy: '0.32em', 'text-anchor': 'end', text: compact(t) })));

  const every = Math.max(1, Math.ceil(categories.length / 10));
  const bars = categories.map((c, i) => {
    const x = m.left + i * band + (band - barW) / 2;
    let acc = 0;
    const segs = series.map((sr, j) => {
      const v = value(c, sr) || 0;
      if (v <= 0) return null;
      const y0 = y(acc);
      acc += v;
      const y1 = y(acc);
      return s('rect', {
        x, y: y1, width: barW, height: Math.max(0.5, y0 - y1), fill: colorFor(j),
        class: 'seg', 'data-series': sr, 'data-category': c,
      }, s('title', { text: `${c} · ${sr}: ${fmtInt(v)} ${unit}` }));
    });
    const label = i % every === 0
      ? s('text', { class: 'xlabel', x: x + barW / 2, y: height - m.bottom + 16, 'text-anchor': 'middle',
        text: c.length === 10 ? c.slice(5) : c })
      : null;
    return s('g', { class: 'bar' }, segs, label);
  });

  const svg = s('svg', {
    class: 'chart', viewBox: `0 0 ${width} ${height}`, role: 'img',
    'aria-label': `${title}: ${categories.length} bars, total ${fmtInt(totals.reduce((a, b) => a + b, 0))} ${unit}`,
    preserveAspectRatio: 'xMidYMid meet',
  },
  s('title', { text: title }),
  s('g', { class: 'grid' }, grid),
  s('line', { class: 'axis', x1: m.left, x2: width - m.right, y1: y(0), y2: y(0) }),
  s('g', { class: 'bars' }, bars),
  s('text', { class: 'ylabel', x: 12, y: m.top + ih / 2, transform: `rotate(-90 12 ${m.top + ih / 2})`,
    'text-anchor': 'middle', text: unit }));

  const legend = h('ul', { class: 'legend', 'aria-label': 'Legend' },
    series.map((sr, j) => h('li', {},
      h('span', { class: 'swatch', 'data-color': j % PALETTE.length, 'aria-hidden': 'true' }), sr)));
  // swatch colours come from CSS classes only (CSP forbids inline styles): see app.css
  return h('figure', { class: 'chart-figure' }, svg, legend);
}
