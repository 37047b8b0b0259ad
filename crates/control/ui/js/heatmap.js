// The node heatmap: one cell per node on ONE canvas, grouped by domain. Colour is the health
// score; a mark shows the status. Built for 100,000 nodes:
//   - pixels are written into one ImageData (a Uint32Array view) and put on the canvas, so a
//     full paint is a tight loop, not 100,000 canvas calls;
//   - a `nodes` delta repaints only the changed cells and puts back only their bounding box;
//   - hover and click compute the cell from the mouse position (no per-node DOM);
//   - cells are laid out and painted by the node table's slots, from its columns;
//   - the layout is in device pixels so cells stay crisp at any devicePixelRatio.

import { state, N } from './store.js';
import { h, healthRGB, num, pct } from './util.js';

const CELL_SIZES = [14, 11, 9, 7, 5, 4, 3, 2]; // CSS px, largest that fits wins
const LABEL_H = 18;   // CSS px above each domain's cells
const GROUP_GAP = 6;  // CSS px between domains

// Colours packed as ImageData's little-endian RGBA in a Uint32 (0xAABBGGRR).
const pack = ([r, g, b], a = 255) => ((a << 24) | (b << 16) | (g << 8) | r) >>> 0;
// 101 precomputed health colours (score rounded to 0.01).
const HEALTH = Array.from({ length: 101 }, (_, i) => pack(healthRGB(i / 100)));

export class Heatmap {
  constructor({ onOpen }) {
    this.onOpen = onOpen;
    this.canvas = h('canvas', { class: 'heatmap-canvas', 'data-testid': 'heatmap', role: 'img', 'aria-label': 'node health heatmap' });
    this.labels = h('div', { class: 'heatmap-labels' });
    this.tip = h('div', { class: 'heatmap-tip', hidden: true });
    this.el = h('div', { class: 'heatmap' }, this.canvas, this.labels, this.tip);
    this.ctx = this.canvas.getContext('2d', { alpha: false });
    this.order = [];           // cell → the node table's slot
    this.cellOf = null;        // the table's slot → cell (Int32Array, -1: none), built on first use
    this.table = null;         // the node table and its epoch the cells were laid out from
    this.epoch = -1;
    this.groups = [];          // [{domain, start, count, y (device px, first cell row), rows}]
    this.width = 0;
    this.needsLayout = true;
    this.canvas.addEventListener('mousemove', (e) => this.hover(e));
    this.canvas.addEventListener('mouseleave', () => { this.tip.hidden = true; this.canvas.style.cursor = ''; });
    this.canvas.addEventListener('click', (e) => {
      const id = this.nodeAt(e);
      if (id !== null) this.onOpen(id);
    });
    // Relayout when the available width changes (window resize, sidebar, zoom); while a
    // snapshot streams in, its end lays out anyway.
    this.resizer = new ResizeObserver(() => {
      const w = this.el.clientWidth;
      if (w && Math.abs(w - this.width) > 1) { this.needsLayout = true; if (!state.loading) this.render(null, false, true); }
    });
    this.resizer.observe(this.el);
  }

  /**
   * Renders: a full layout when nodes came or went, else only the cells in `changed`.
   * `now` lays out at once (a new snapshot, the page shown, a new width).
   */
  render(changed, nodeSetChanged, now) {
    if (nodeSetChanged) this.needsLayout = true;
    if (!this.el.isConnected) return;
    // Cells refer to slots: a new table, or slots moved by a compaction, cannot wait.
    if (this.table !== state.nodes || this.epoch !== state.nodes.epoch) { this.needsLayout = true; now = true; }
    if (this.needsLayout) {
      // Nodes joining one by one must not relayout 100,000 cells every frame: at most
      // once a second; meanwhile changed cells that already have a place are repainted.
      const wait = 1000 - (performance.now() - (this.laidOutAt || 0));
      if (now || wait <= 0 || !this.order.length) {
        clearTimeout(this.layoutTimer); this.layoutTimer = null;
        this.layout(); this.paintAll(); this.laidOutAt = performance.now();
        return;
      }
      this.layoutTimer ||= setTimeout(() => { this.layoutTimer = null; this.render(null, false); }, wait);
    }
    if (changed && changed.size && this.buf) this.paintSome(changed);
  }

  layout() {
    this.needsLayout = false;
    const dpr = window.devicePixelRatio || 1;
    this.dpr = dpr;
    this.width = this.el.clientWidth || 800;
    // Cells: domains in name order, nodes by id within each (stable, so a node keeps its place).
    const t = state.nodes, ids = t.cols[N.ID], domainOf = t.cols[N.DOMAIN];
    this.table = t; this.epoch = t.epoch;
    const byDomain = new Map();
    for (let s = 0; s < t.end; s++) {
      if (ids[s] === undefined) continue;
      const d = domainOf[s] || 'default';
      let list = byDomain.get(d);
      if (!list) byDomain.set(d, (list = []));
      list.push(s);
    }
    const domains = [...byDomain.keys()].sort();
    this.order = [];
    this.cellOf = null;
    const wDev = Math.floor(this.width * dpr);
    const maxH = Math.max(260, Math.round(window.innerHeight * 0.55));
    // The largest cell size whose layout fits the height budget.
    let chosen = CELL_SIZES[CELL_SIZES.length - 1];
    for (const c of CELL_SIZES) {
      const cols = Math.max(1, Math.floor(this.width / c));
      let hgt = 0;
      for (const d of domains) hgt += LABEL_H + Math.ceil(byDomain.get(d).length / cols) * c + GROUP_GAP;
      if (hgt <= maxH) { chosen = c; break; }
    }
    const cell = Math.max(1, Math.round(chosen * dpr));
    const cols = Math.max(1, Math.floor(wDev / cell));
    const gap = cell >= 5 ? Math.max(1, Math.round(dpr)) : 0;
    const labelH = Math.round(LABEL_H * dpr), groupGap = Math.round(GROUP_GAP * dpr);
    this.cell = cell; this.cols = cols; this.gap = gap;
    let y = 0;
    this.groups = [];
    for (const d of domains) {
      const slots = inIdOrder(byDomain.get(d), ids);
      const start = this.order.length;
      for (const s of slots) this.order.push(s);
      const rows = Math.ceil(slots.length / cols);
      this.groups.push({ domain: d, start, count: slots.length, y: y + labelH, rows });
      y += labelH + rows * cell + groupGap;
    }
    const hDev = Math.max(Math.round(40 * dpr), y);
    this.canvas.width = wDev;
    this.canvas.height = hDev;
    this.canvas.style.width = `${wDev / dpr}px`;
    this.canvas.style.height = `${hDev / dpr}px`;
    this.image = this.ctx.createImageData(wDev, hDev);
    this.buf = new Uint32Array(this.image.data.buffer);
    const cs = getComputedStyle(this.el);
    const rgb = (v, fallback) => {
      const m = /(\d+)\D+(\d+)\D+(\d+)/.exec(cs.getPropertyValue(v));
      return m ? [+m[1], +m[2], +m[3]] : fallback;
    };
    this.bg = pack(rgb('--hm-bg', [255, 255, 255]));
    this.ink = pack(rgb('--hm-ink', [30, 30, 30]));
    this.deadFill = pack(rgb('--hm-dead', [70, 70, 78]));
    this.leftFill = pack(rgb('--hm-left', [210, 210, 215]));
    this.unknownFill = pack(rgb('--hm-unknown', [150, 150, 160]));
    this.deadCross = pack([235, 90, 90]);
    // Domain labels are a handful of DOM elements over the canvas, not canvas text, so
    // they stay sharp and selectable.
    this.labels.replaceChildren(...this.groups.map((g) => {
      const dom = state.federation.domains.find((x) => x.domain === g.domain);
      return h('div', { class: 'heatmap-label', style: { top: `${(g.y - labelH) / dpr}px` } },
        h('strong', { text: g.domain }), ` ${num(g.count, 0)} nodes`, dom ? ` · shard ${dom.shard}` : '');
    }));
    if (!this.order.length) this.labels.replaceChildren(h('div', { class: 'heatmap-label muted', text: state.loading ? 'loading nodes…' : 'no nodes' }));
  }

  paintAll() {
    this.buf.fill(this.bg);
    const { cols, cell } = this;
    for (const g of this.groups) {
      for (let k = 0, x = 0, y = g.y; k < g.count; k++) {
        this.paintAt(g.start + k, x, y);
        x += cell;
        if (x >= cols * cell) { x = 0; y += cell; }
      }
    }
    this.ctx.putImageData(this.image, 0, 0);
  }

  paintSome(ids) {
    let x0 = Infinity, y0 = Infinity, x1 = -1, y1 = -1;
    for (const id of ids) {
      const i = this.cellFor(id);
      if (i < 0) continue;
      const [x, y] = this.cellXY(i);
      this.paintAt(i, x, y);
      if (x < x0) x0 = x; if (y < y0) y0 = y;
      if (x > x1) x1 = x; if (y > y1) y1 = y;
    }
    if (x1 < 0) return;
    this.ctx.putImageData(this.image, 0, 0, x0, y0, x1 - x0 + this.cell, y1 - y0 + this.cell);
  }

  /** The cell's top-left corner in device px. */
  cellXY(i) {
    // Few domains: a linear scan is cheaper than keeping a per-node group index.
    let g = this.groups[0];
    for (const gr of this.groups) { if (i >= gr.start) g = gr; else break; }
    const k = i - g.start;
    return [(k % this.cols) * this.cell, g.y + Math.floor(k / this.cols) * this.cell];
  }

  /** The cell of a node, or -1. The index is built when a change first needs it, not on
   * the way to the first paint. */
  cellFor(id) {
    const slot = this.table.slotOf(id);
    if (!this.cellOf) {
      this.cellOf = new Int32Array(this.table.end).fill(-1);
      for (let i = 0; i < this.order.length; i++) this.cellOf[this.order[i]] = i;
    }
    return slot === undefined || slot >= this.cellOf.length ? -1 : this.cellOf[slot];
  }

  /** The node id in cell i. */
  idAt(i) { return this.table.cols[N.ID][this.order[i]]; }

  /** Paints cell i, whose top-left corner is (x, y). */
  paintAt(i, x, y) {
    const c = this.table.cols, slot = this.order[i];
    const s = this.cell - this.gap; // drawn size
    const W = this.canvas.width, buf = this.buf;
    if (c[N.ID][slot] === undefined) { this.fill(x, y, s, this.bg); return; }
    const status = c[N.STATUS][slot];
    const score = Math.round(Math.max(0, Math.min(1, Number(c[N.HEALTH][slot]) || 0)) * 100);
    let base = HEALTH[score];
    if (status === 'dead') base = this.deadFill;
    else if (status === 'left') base = this.leftFill;
    else if (status === 'unknown') base = this.unknownFill;
    this.fill(x, y, s, base);
    if (s < 3) return;
    const set = (px, py, c) => { buf[(y + py) * W + x + px] = c; };
    if (status === 'dead') {
      // A cross: dead is unmistakable even among red (unhealthy) cells.
      for (let k = 0; k < s; k++) { set(k, k, this.deadCross); set(s - 1 - k, k, this.deadCross); }
    } else if (status === 'suspect') {
      // An outline around the health colour.
      for (let k = 0; k < s; k++) { set(k, 0, this.ink); set(k, s - 1, this.ink); set(0, k, this.ink); set(s - 1, k, this.ink); }
    } else if (status === 'draining' || c[N.DRAIN][slot]) {
      // A diagonal stripe.
      for (let k = 0; k < s; k++) { set(s - 1 - k, k, this.ink); if (s >= 6 && k + 1 < s) set(s - 2 - k < 0 ? 0 : s - 2 - k, k, this.ink); }
    } else if (c[N.CORDONED][slot]) {
      // A dot in the middle.
      const d = Math.max(1, Math.round(s / 3)), o = Math.floor((s - d) / 2);
      for (let a = 0; a < d; a++) for (let b = 0; b < d; b++) set(o + a, o + b, this.ink);
    }
  }

  fill(x, y, s, c) {
    const W = this.canvas.width, buf = this.buf;
    // At 100,000 nodes a cell is 2 device px: a plain loop beats a fill() call per line.
    for (let py = 0, o = y * W + x; py < s; py++, o += W) for (let px = 0; px < s; px++) buf[o + px] = c;
  }

  /** The node under the mouse, or null. */
  nodeAt(e) {
    const rect = this.canvas.getBoundingClientRect();
    const x = (e.clientX - rect.left) * (this.canvas.width / rect.width);
    const y = (e.clientY - rect.top) * (this.canvas.height / rect.height);
    for (const g of this.groups) {
      if (y < g.y || y >= g.y + g.rows * this.cell) continue;
      const col = Math.floor(x / this.cell), r = Math.floor((y - g.y) / this.cell);
      if (col < 0 || col >= this.cols) return null;
      const k = r * this.cols + col;
      return k < g.count ? (this.idAt(g.start + k) ?? null) : null;
    }
    return null;
  }

  hover(e) {
    const id = this.nodeAt(e);
    const row = id !== null ? state.nodes.get(id) : null;
    if (!row) { this.tip.hidden = true; this.canvas.style.cursor = ''; return; }
    this.canvas.style.cursor = 'pointer';
    const flags = [row[N.PREEMPTING] ? 'preempting' : '', row[N.CORDONED] ? 'cordoned' : '', row[N.DRAIN] ? 'drain requested' : ''].filter(Boolean).join(', ');
    this.tip.replaceChildren(
      h('div', { class: 'tip-id', text: id }),
      h('div', { text: `${row[N.STATUS]}${flags ? ' · ' + flags : ''}` }),
      h('div', { text: `health ${pct(Number(row[N.HEALTH]) || 0)} · ${row[N.DOMAIN]} · ${row[N.PRIORITY]}` }),
      h('div', { class: 'muted', text: `cpu ${num(row[N.CPU_ALLOC] / 1000, 1)}/${num(row[N.CPU_CAP] / 1000, 1)} cores` }));
    this.tip.hidden = false;
    // Keep the tip inside the map: flip left/up near the edges.
    const r = this.el.getBoundingClientRect();
    let tx = e.clientX - r.left + 14, ty = e.clientY - r.top + 14;
    if (tx + 220 > r.width) tx = e.clientX - r.left - 230;
    if (ty + 80 > r.height) ty = e.clientY - r.top - 84;
    this.tip.style.left = `${Math.max(0, tx)}px`;
    this.tip.style.top = `${Math.max(0, ty)}px`;
  }
}

/**
 * `slots` by their node's id. A snapshot comes in id order and nodes that joined since
 * take the slots after it, so the slots are a sorted run and a short tail: sort the tail
 * and merge, rather than comparing 100,000 ids through a callback.
 */
function inIdOrder(slots, ids) {
  let k = 1;
  while (k < slots.length && ids[slots[k - 1]] < ids[slots[k]]) k += 1;
  if (k >= slots.length) return slots;
  const tail = slots.slice(k).sort((a, b) => (ids[a] < ids[b] ? -1 : ids[a] > ids[b] ? 1 : 0));
  const out = new Array(slots.length);
  let i = 0, j = 0, o = 0;
  while (i < k && j < tail.length) out[o++] = ids[slots[i]] < ids[tail[j]] ? slots[i++] : tail[j++];
  while (i < k) out[o++] = slots[i++];
  while (j < tail.length) out[o++] = tail[j++];
  return out;
}

/** The legend under the heatmap (HTML: colours and marks). */
export function heatmapLegend() {
  const swatch = (cls, label) => h('span', { class: 'legend-item' }, h('span', { class: `legend-swatch ${cls}` }), label);
  return h('div', { class: 'heatmap-legend' },
    h('span', { class: 'legend-item' }, 'health ', h('span', { class: 'legend-gradient' }), ' 0 → 1'),
    swatch('lg-suspect', 'suspect'), swatch('lg-dead', 'dead'), swatch('lg-drain', 'draining'),
    swatch('lg-cordon', 'cordoned'), swatch('lg-left', 'left'), swatch('lg-unknown', 'unknown'));
}
