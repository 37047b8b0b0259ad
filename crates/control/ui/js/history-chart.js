// History charts (`GET /v1/apps/{app}/history?window=`, `/v1/pools/{pool}/history`): an
// app's desired, running and estimated units and serving cores, or a pool's running
// instances by node type, every 10 s for the last 1, 6 or 24 hours, kept by the control
// plane across restarts; autoscaling decisions are marks on it, and the cursor near one
// shows its explanation. Asked again every 10 s while the page is open.

import { h, setChildren, clock, num, chartLibrary, chartNote } from './util.js';
import { readJson } from './api.js';

const WINDOWS = ['1h', '6h', '24h'];
const EVERY_MS = 10000;

const PALETTE = ['#2f6fdf', '#26a65b', '#9b51e0', '#e08a00', '#d13434', '#17a2b8', '#888'];

/** The app chart's lines: units on the left axis, cores on the right. */
const APP_SERIES = [
  { key: 'desired', label: 'desired', scale: 'units', stroke: '#2f6fdf', width: 2, digits: 0 },
  { key: 'running', label: 'running', scale: 'units', stroke: '#26a65b', width: 2, digits: 0 },
  { key: 'estimated', label: 'estimated', scale: 'units', stroke: '#9b51e0', width: 1, dash: [4, 4], digits: 1 },
  { key: 'capacity_cores', label: 'cores', scale: 'cores', stroke: '#888', width: 1, digits: 2 },
];

export { APP_SERIES };

export class HistoryChart {
  /** `path`: the history route; `fixed`: the lines to draw, or none to draw one per key of the points (a pool's node types). */
  constructor(path, fixed) {
    this.path = path;
    this.fixed = fixed;
    this.keys = '';
    this.window = '1h';
    this.chart = null;
    this.decisions = [];
    this.timer = null;
    this.plot = h('div', { class: 'chart', 'data-testid': 'history-chart' });
    this.note = h('div', { class: 'muted small', 'data-testid': 'history-note', text: ' ' });
    this.buttons = WINDOWS.map((w) => h('button', { type: 'button', class: 'btn small', 'data-window': w, text: w,
      'aria-pressed': String(w === this.window), on: { click: () => this.setWindow(w) } }));
    this.el = h('div', {}, h('div', { class: 'controls' }, this.buttons), this.plot, this.note);
  }

  start() { this.load(); this.timer = setInterval(() => this.load(), EVERY_MS); }

  stop() {
    if (this.timer) clearInterval(this.timer);
    if (this.chart) this.chart.destroy();
    this.chart = null;
    this.timer = null;
  }

  setWindow(w) {
    this.window = w;
    for (const b of this.buttons) b.setAttribute('aria-pressed', String(b.dataset.window === w));
    this.plot.dataset.window = w;
    this.load();
  }

  async load() {
    // Answers may arrive out of order (a slow 24 h one after a quick 1 h one): only the
    // newest request's is drawn.
    const asked = (this.asked = (this.asked || 0) + 1);
    let v;
    try { v = await readJson(`${this.path}?window=${this.window}`); }
    catch (e) { if (asked === this.asked) this.note.textContent = `cannot load the history: ${e.message}`; return; }
    if (asked !== this.asked) return;
    const pts = v.points || [];
    this.decisions = (v.decisions || []).filter((d) => d.at_ms).map((d) => ({ t: d.at_ms / 1000, text: `${d.action}: ${d.explanation || ''}` }));
    const col = (k) => pts.map((p) => (p.v && p.v[k] != null ? p.v[k] : null));
    const now = Date.now() / 1000;
    const lines = this.fixed || [...new Set(pts.flatMap((p) => Object.keys(p.v || {})))].sort()
      .map((k, i) => ({ key: k, label: k, scale: 'units', stroke: k === 'total' ? '#333' : PALETTE[i % PALETTE.length], width: k === 'total' ? 2 : 1, digits: 0 }));
    const keys = lines.map((l) => l.key).join(',');
    if (this.chart && keys !== this.keys) { this.chart.destroy(); this.chart = null; this.plot.replaceChildren(); }
    this.keys = keys;
    const data = [pts.map((p) => p.t), ...lines.map((l) => col(l.key))];
    this.plot.dataset.points = String(pts.length);
    this.plot.dataset.marks = String(this.decisions.length);
    this.draw(data, lines, now - v.window_s, now);
    // What the note said about loading is stale now; a decision under the cursor stays.
    if (!pts.length) this.note.textContent = 'No sample yet (one every 10 s).';
    else if (!this.decisions.length || /^(No sample|cannot load)/.test(this.note.textContent)) this.note.textContent = ' ';
  }

  draw(data, lines, from, to) {
    const lib = chartLibrary(() => this.draw(data, lines, from, to));
    if (lib !== 'ready') { setChildren(this.plot, chartNote(lib)); return; }
    if (this.chart) { this.chart.setData(data, false); this.chart.setScale('x', { min: from, max: to }); return; }
    if (!this.plot.isConnected) return;
    const cs = getComputedStyle(document.body);
    const ink = cs.getPropertyValue('--muted').trim() || '#666', grid = cs.getPropertyValue('--line').trim() || '#ddd';
    const axis = (o) => ({ stroke: ink, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 }, ...o });
    const stepped = window.uPlot.paths?.stepped ? window.uPlot.paths.stepped({ align: 1 }) : undefined;
    const self = this;
    // Decisions as vertical dashed lines; the cursor within 8 px of one names it.
    const marks = {
      hooks: {
        draw: [(u) => {
          const ctx = u.ctx;
          ctx.save();
          ctx.strokeStyle = '#e08a00';
          ctx.setLineDash([3, 3]);
          for (const d of self.decisions) {
            const x = Math.round(u.valToPos(d.t, 'x', true));
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
            ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
          }
          ctx.restore();
        }],
        setCursor: [(u) => {
          if (u.cursor.left == null || u.cursor.left < 0) return;
          const near = self.decisions.find((d) => Math.abs(u.valToPos(d.t, 'x') - u.cursor.left) <= 8);
          self.note.textContent = near ? `${clock(near.t * 1000)} · ${near.text}` : ' ';
        }],
      },
    };
    this.chart = new window.uPlot({
      width: Math.max(300, this.plot.clientWidth || 600), height: 220,
      plugins: [marks],
      scales: { x: { time: true, min: from, max: to }, units: { auto: true, range: (u, min, max) => [0, Math.max(1, max * 1.15)] },
        cores: { auto: true, range: (u, min, max) => [0, Math.max(1, max * 1.15)] } },
      axes: [axis({}), axis({ scale: 'units', label: this.fixed ? 'units' : 'instances', size: 50 }),
        ...(lines.some((l) => l.scale === 'cores') ? [axis({ scale: 'cores', side: 1, label: 'cores', grid: { show: false }, size: 50 })] : [])],
      series: [{}, ...lines.map((l) => ({ label: l.label, scale: l.scale, stroke: l.stroke, width: l.width, dash: l.dash,
        paths: l.dash ? undefined : stepped, value: (u, v) => v == null ? '–' : num(v, l.digits) }))],
    }, data, this.plot);
  }
}
