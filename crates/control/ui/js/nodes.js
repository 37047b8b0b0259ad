// #/nodes: a virtualised, filterable, sortable table of every node (only the rows in view
// are DOM, so 100,000 nodes scroll smoothly), and #/nodes/ID: one node.

import { state, N, healthHistoryOf } from './store.js';
import { h, setChildren, num, pct, pill, healthCss, cores, bytes, clock, throttle, resText } from './util.js';
import { act, readJson, toast } from './api.js';
import { bar } from './federation.js';
import { EventsList } from './events-list.js';

const ROW_H = 26;      // px, fixed so the visible range is arithmetic
const OVERSCAN = 8;    // rows drawn above and below the viewport
const STATUSES = ['alive', 'suspect', 'draining', 'dead', 'unknown', 'left'];

// `get` reads a column's sort key from the node table's columns `c` at slot `s`.
const COLUMNS = [
  { key: 'id', label: 'node', cls: 'c-id', get: (c, s) => c[N.ID][s] },
  { key: 'status', label: 'status', cls: 'c-status', get: (c, s) => c[N.STATUS][s] },
  { key: 'domain', label: 'domain', cls: 'c-domain', get: (c, s) => c[N.DOMAIN][s] },
  { key: 'priority', label: 'priority', cls: 'c-prio', get: (c, s) => c[N.PRIORITY][s] },
  { key: 'shard', label: 'shard', cls: 'c-shard r', get: (c, s) => c[N.SHARD][s] },
  { key: 'health', label: 'health', cls: 'c-health r', get: (c, s) => Number(c[N.HEALTH][s]) || 0 },
  { key: 'cpu', label: 'CPU alloc / cap', cls: 'c-cpu r', get: (c, s) => (c[N.CPU_CAP][s] ? c[N.CPU_ALLOC][s] / c[N.CPU_CAP][s] : 0) },
  { key: 'mem', label: 'memory alloc / cap', cls: 'c-mem r', get: (c, s) => (c[N.MEM_CAP][s] ? c[N.MEM_ALLOC][s] / c[N.MEM_CAP][s] : 0) },
  { key: 'gpu', label: 'GPU', cls: 'c-gpu r', get: (c, s) => c[N.GPU_CAP][s] || 0 },
  { key: 'flags', label: 'flags', cls: 'c-flags', get: (c, s) => (c[N.PREEMPTING][s] ? 4 : 0) + (c[N.CORDONED][s] ? 2 : 0) + (c[N.DRAIN][s] ? 1 : 0) },
];

const cmp = (a, b) => (a < b ? -1 : a > b ? 1 : 0);

// Every node id in id order, rebuilt only when nodes come or go (sorting 100,000 strings
// costs more than a frame, so it is not redone for value changes).
let idOrder = [];
let idOrderFor = null; // the node table and size it was built from
function byIdOrder() {
  if (idOrderFor !== state.nodes || idOrder.length !== state.nodes.size) {
    idOrder = [...state.nodes.keys()].sort(cmp);
    idOrderFor = state.nodes;
  }
  return idOrder;
}
/** Forgets the id order (nodes were added or removed). */
export function nodesChanged() { idOrderFor = null; }

export function nodesPage(query) {
  const filters = {
    domain: query.get('domain') || '', status: query.get('status') || '', priority: query.get('priority') || '',
    label: query.get('label') || '', text: query.get('q') || '',
  };
  let sortKey = query.get('sort') || 'id', sortDir = query.get('dir') === 'desc' ? -1 : 1;
  let ids = [];              // filtered and sorted node ids
  let labelMatch = null;     // Set of ids matching a server-side label filter, or null
  let labelNote = '';
  const ui = {};
  let scrollQueued = false;

  const refilterSoon = throttle(() => { refilter(); renderRows(); }, 1000);

  const page = {
    title: 'Nodes',
    mount(main) {
      ui.domain = h('select', { class: 'input', 'aria-label': 'domain', on: { change: () => setFilter('domain', ui.domain.value) } });
      ui.status = h('select', { class: 'input', 'aria-label': 'status', on: { change: () => setFilter('status', ui.status.value) } },
        h('option', { value: '', text: 'any status' }), STATUSES.map((s) => h('option', { value: s, text: s })));
      ui.priority = h('select', { class: 'input', 'aria-label': 'priority', on: { change: () => setFilter('priority', ui.priority.value) } },
        h('option', { value: '', text: 'any priority' }), h('option', { value: 'high', text: 'high' }), h('option', { value: 'low', text: 'low' }));
      ui.label = h('input', { class: 'input', placeholder: 'label k=v', 'aria-label': 'label filter k=v', value: filters.label, spellcheck: 'false',
        on: { keydown: (e) => { if (e.key === 'Enter') setFilter('label', ui.label.value.trim()); }, change: () => setFilter('label', ui.label.value.trim()) } });
      ui.text = h('input', { class: 'input', placeholder: 'node id contains…', 'aria-label': 'node id search', value: filters.text, spellcheck: 'false',
        on: { input: throttle(() => setFilter('text', ui.text.value.trim()), 200) } });
      ui.count = h('span', { class: 'muted' });
      ui.head = h('div', { class: 'vt-head', role: 'row' });
      ui.rows = h('div', { class: 'vt-rows', role: 'rowgroup' });
      ui.empty = h('div', { class: 'vt-empty muted', hidden: true });
      ui.spacer = h('div', { class: 'vt-spacer' }, ui.rows, ui.empty);
      ui.scroller = h('div', { class: 'vt-scroll', role: 'table', 'aria-label': 'nodes', on: { scroll: onScroll } }, ui.spacer);
      ui.status.value = filters.status; ui.priority.value = filters.priority;
      setChildren(main,
        h('div', { class: 'page-head' }, h('h1', { text: 'Nodes' }), ui.count),
        h('div', { class: 'filters' }, ui.domain, ui.status, ui.priority, ui.label, ui.text,
          h('button', { type: 'button', class: 'btn', text: 'Clear', on: { click: clearFilters } })),
        h('div', { class: 'vt' }, ui.head, ui.scroller));
      // Rows are clicked through one delegated listener, not one per row.
      ui.rows.addEventListener('click', (e) => {
        const row = e.target.closest('[data-node]');
        if (row && e.target.tagName !== 'A') location.hash = `#/nodes/${encodeURIComponent(row.dataset.node)}`;
      });
      renderHead();
      if (filters.label) loadLabel();
      this.update({ all: true });
    },
    update(d) {
      if (d.all || d.nodeSet || d.federation) renderDomainOptions();
      if (d.all || d.nodeSet) { nodesChanged(); refilter(); renderRows(); return; }
      if (d.nodes.size) {
        // Changed rows may move in or out of the filter or the order: redo that at most
        // once a second; the rows in view show the new values now.
        // With no filter and the id order, a changed value cannot move a row.
        if (sortKey !== 'id' || Object.values(filters).some(Boolean)) refilterSoon();
        page.refreshVisible(d.nodes);
      }
    },
  };

  function setFilter(k, v) {
    if (filters[k] === v) return;
    filters[k] = v;
    writeQuery();
    if (k === 'label') { loadLabel(); return; }
    refilter(); ui.scroller.scrollTop = 0; renderRows();
  }

  function clearFilters() {
    Object.assign(filters, { domain: '', status: '', priority: '', label: '', text: '' });
    ui.domain.value = ''; ui.status.value = ''; ui.priority.value = ''; ui.label.value = ''; ui.text.value = '';
    labelMatch = null; labelNote = '';
    writeQuery(); refilter(); renderRows();
  }

  /** Keeps filters in the address (shareable; survives a reload) without re-routing. */
  function writeQuery() {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(filters)) if (v) q.set(k === 'text' ? 'q' : k, v);
    if (sortKey !== 'id') q.set('sort', sortKey);
    if (sortDir < 0) q.set('dir', 'desc');
    const s = q.toString();
    history.replaceState(null, '', `#/nodes${s ? '?' + s : ''}`);
  }

  /**
   * Labels other than domain and priority are not in the stream's compact rows: ask the
   * server which nodes carry the label (GET /v1/nodes?label=k=v) once per filter change.
   */
  async function loadLabel() {
    labelMatch = null; labelNote = '';
    const f = filters.label;
    const m = /^([^=]+)=(.*)$/.exec(f);
    if (f && !m) { toast('A label filter is k=v', 'error'); return; }
    if (m && (m[1] === 'domain' || m[1] === 'priority')) { refilter(); renderRows(); return; } // local
    if (f) {
      labelNote = 'asking the server…';
      renderCount();
      try {
        const rows = await readJson(`/v1/nodes?label=${encodeURIComponent(f)}`);
        if (filters.label !== f) return; // changed meanwhile
        labelMatch = new Set(rows.map((r) => r.node_id));
        labelNote = `label ${f}: ${labelMatch.size} nodes at ${clock(Date.now())}`;
      } catch (e) {
        labelNote = '';
        toast(`label filter: ${e.message}`, 'error');
      }
    }
    refilter(); ui.scroller.scrollTop = 0; renderRows();
  }

  function refilter() {
    const lm = /^([^=]+)=(.*)$/.exec(filters.label || '');
    const localLabel = lm && (lm[1] === 'domain' || lm[1] === 'priority') ? lm : null;
    const text = filters.text.toLowerCase();
    const t = state.nodes, c = t.cols;
    const out = [];
    for (const id of byIdOrder()) {
      const s = t.slotOf(id);
      if (s === undefined) continue;
      if (filters.domain && c[N.DOMAIN][s] !== filters.domain) continue;
      if (filters.status && c[N.STATUS][s] !== filters.status) continue;
      if (filters.priority && c[N.PRIORITY][s] !== filters.priority) continue;
      if (localLabel && c[localLabel[1] === 'domain' ? N.DOMAIN : N.PRIORITY][s] !== localLabel[2]) continue;
      if (!localLabel && filters.label && labelMatch && !labelMatch.has(id)) continue;
      if (!localLabel && filters.label && !labelMatch) continue; // still loading
      if (text && !id.toLowerCase().includes(text)) continue;
      out.push(s);
    }
    if (sortKey === 'id') {
      // Nodes were visited in id order already (byIdOrder): no sort needed.
      ids = out.map((s) => c[N.ID][s]);
      if (sortDir < 0) ids.reverse();
    } else {
      const col = COLUMNS.find((k) => k.key === sortKey) || COLUMNS[0];
      // Decorate-sort: read each key once; the id breaks ties so the order is stable.
      const keyed = out.map((s) => [col.get(c, s), c[N.ID][s]]);
      keyed.sort((a, b) => sortDir * cmp(a[0], b[0]) || cmp(a[1], b[1]));
      ids = keyed.map((k) => k[1]);
    }
    ui.spacer.style.height = `${ids.length * ROW_H}px`;
    renderCount();
  }

  function renderCount() {
    ui.count.textContent = `${num(ids.length, 0)} of ${num(state.nodes.size, 0)} nodes${labelNote ? ' · ' + labelNote : ''}`;
  }

  function renderDomainOptions() {
    const domains = new Set(state.federation.domains.map((d) => d.domain));
    if (!domains.size) for (const s of state.nodes.slots.values()) domains.add(state.nodes.cols[N.DOMAIN][s]);
    if (filters.domain) domains.add(filters.domain);
    const list = [...domains].sort();
    const key = list.join('\n');
    if (ui.domain.dataset.key === key) return;
    ui.domain.dataset.key = key;
    setChildren(ui.domain, h('option', { value: '', text: 'any domain' }), list.map((d) => h('option', { value: d, text: d })));
    ui.domain.value = filters.domain;
  }

  function renderHead() {
    setChildren(ui.head, COLUMNS.map((c) => h('div', {
      class: `vt-cell ${c.cls} sortable${c.key === sortKey ? (sortDir > 0 ? ' asc' : ' desc') : ''}`, role: 'columnheader',
      'aria-sort': c.key === sortKey ? (sortDir > 0 ? 'ascending' : 'descending') : 'none', tabindex: 0,
      text: c.label,
      on: {
        click: () => sortBy(c.key),
        keydown: (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); sortBy(c.key); } },
      },
    })));
  }

  function sortBy(key) {
    if (sortKey === key) sortDir = -sortDir; else { sortKey = key; sortDir = key === 'health' ? 1 : (key === 'cpu' || key === 'mem' || key === 'gpu' ? -1 : 1); }
    writeQuery(); renderHead(); refilter(); renderRows();
  }

  function onScroll() {
    if (scrollQueued) return;
    scrollQueued = true;
    requestAnimationFrame(() => { scrollQueued = false; renderRows(false); });
  }

  // Row elements are recycled as a ring: row i of the list lives in element i % pool.length,
  // absolutely placed at i × ROW_H. Scrolling refills only the rows that came into range,
  // so a frame costs what scrolled in, not a whole screen of rows.
  let pool = [];
  let slotRow = [];       // element k → list index it shows (-1: none)
  let shownIds = null;    // the list the slots were filled from
  let shownFirst = 0, shownLast = 0;

  /** Draws the rows in view (plus OVERSCAN); `force` refills every slot (new list or values). */
  function renderRows(force = true) {
    const top = ui.scroller.scrollTop;
    const height = ui.scroller.clientHeight || 600;
    const size = Math.ceil(height / ROW_H) + 2 * OVERSCAN + 1;
    if (pool.length !== size) {
      pool = Array.from({ length: size }, makeRow);
      slotRow = new Array(size).fill(-1);
      ui.rows.replaceChildren(...pool.map((p) => p.el));
      force = true;
    }
    if (force || shownIds !== ids) { slotRow.fill(-1); shownIds = ids; }
    const first = Math.max(0, Math.floor(top / ROW_H) - OVERSCAN);
    const last = Math.min(ids.length, first + size);
    shownFirst = first; shownLast = last;
    for (let i = first; i < last; i++) {
      const k = i % size;
      if (slotRow[k] === i) continue;
      const r = state.nodes.get(ids[i]);
      const c = pool[k];
      if (r) fillRow(c, r); else hideRow(c);
      c.el.style.transform = `translateY(${i * ROW_H}px)`;
      slotRow[k] = i;
    }
    // Slots with no row in range (a short list) are hidden.
    for (let k = 0; k < size; k++) {
      const i = slotRow[k];
      if (i < first || i >= last) { hideRow(pool[k]); slotRow[k] = -1; }
    }
    ui.empty.hidden = ids.length > 0;
    ui.empty.textContent = state.loading ? 'loading…' : 'no node matches';
  }

  /** Redraws the visible rows whose node changed. */
  function refreshVisible(changed) {
    for (let i = shownFirst; i < shownLast; i++) {
      if (!changed.has(ids[i])) continue;
      const r = state.nodes.get(ids[i]);
      if (r) fillRow(pool[i % pool.length], r);
    }
  }
  page.refreshVisible = refreshVisible;
  page.renderRowsIfMoved = () => renderRows(false);

  return page;
}

/** One recyclable row: the element and its cells, filled by fillRow. */
function makeRow() {
  const link = h('a', { class: 'mono' });
  const status = h('span', { class: 'pill' });
  const swatch = h('span', { class: 'swatch' });
  const healthText = document.createTextNode('');
  const cell = (cls, ...kids) => h('div', { class: `vt-cell ${cls}` }, ...kids);
  const c = {
    link, status, swatch, healthText,
    domain: cell('c-domain'), prio: cell('c-prio'), shard: cell('c-shard r num'),
    cpu: cell('c-cpu r num'), mem: cell('c-mem r num'), gpu: cell('c-gpu r num'), flags: cell('c-flags'),
  };
  c.el = h('div', { class: 'vt-row', role: 'row', hidden: true },
    cell('c-id', link), cell('c-status', status), c.domain, c.prio, c.shard,
    cell('c-health r num', swatch, healthText), c.cpu, c.mem, c.gpu, c.flags);
  return c;
}

/** A spare row: hidden and without its test hooks, so only rows showing a node carry them. */
function hideRow(c) {
  c.el.hidden = true;
  c.el.removeAttribute('data-testid');
  delete c.el.dataset.node;
  delete c.el.dataset.status;
}

function fillRow(c, r) {
  const id = r[N.ID];
  c.el.hidden = false;
  c.el.dataset.testid = 'node-row';
  const health = Number(r[N.HEALTH]) || 0;
  const status = r[N.STATUS];
  c.el.dataset.node = id;
  c.el.dataset.status = status;
  c.link.textContent = id;
  c.link.href = `#/nodes/${encodeURIComponent(id)}`;
  c.status.textContent = status;
  c.status.className = `pill s-${status}`;
  c.domain.textContent = r[N.DOMAIN];
  c.prio.textContent = r[N.PRIORITY];
  c.shard.textContent = r[N.SHARD];
  c.swatch.style.background = healthCss(health);
  c.healthText.nodeValue = num(health, 2);
  c.cpu.textContent = `${num(r[N.CPU_ALLOC] / 1000, 1)} / ${num(r[N.CPU_CAP] / 1000, 1)} cores`;
  c.mem.textContent = `${num(r[N.MEM_ALLOC] / 1024 ** 3, 1)} / ${num(r[N.MEM_CAP] / 1024 ** 3, 1)} GiB`;
  c.gpu.textContent = r[N.GPU_CAP] ? `${r[N.GPU_ALLOC]} / ${r[N.GPU_CAP]}` : '–';
  c.flags.textContent = [r[N.PREEMPTING] ? 'preempting' : null, r[N.CORDONED] ? 'cordoned' : null, r[N.DRAIN] ? 'drain requested' : null].filter(Boolean).join(' · ');
}

// ---- one node ----------------------------------------------------------------------------------

export function nodePage(id) {
  const ui = {};
  let detail = null;      // GET /v1/nodes/{node}
  let detailError = '';
  const path = `/v1/nodes/${encodeURIComponent(id)}`;
  const refetchSoon = throttle(() => fetchDetail(), 2000);

  const page = {
    title: id,
    mount(main) {
      ui.head = h('div', { class: 'page-head' });
      ui.live = h('div');
      ui.spark = h('canvas', { class: 'sparkline', width: 360, height: 60, 'aria-label': 'health since the page opened' });
      ui.sparkNote = h('div', { class: 'muted small' });
      ui.info = h('div');
      ui.members = h('div');
      ui.events = new EventsList(`node=${encodeURIComponent(id)}`);
      const btn = (verb, tid, title) => h('button', { type: 'button', class: 'btn', 'data-testid': tid, 'data-scope': 'operate', text: verb[0].toUpperCase() + verb.slice(1), title,
        on: { click: () => act('POST', `${path}/${verb}`, undefined, `${verb} ${id}`) } });
      setChildren(main,
        h('div', { class: 'crumbs' }, h('a', { href: '#/nodes', text: 'Nodes' }), ' / ', h('span', { class: 'mono', text: id })),
        ui.head,
        h('div', { class: 'controls' },
          btn('cordon', 'cordon-button', 'no new work is placed here'),
          btn('drain', 'drain-button', 'move the units away, then leave'),
          btn('uncordon', 'uncordon-button', 'accept work again (also cancels a drain request)')),
        h('div', { class: 'two-col' },
          h('section', { class: 'card' }, h('h2', { text: 'Capacity and allocation' }), ui.live),
          h('section', { class: 'card' }, h('h2', { text: 'Health since this page opened' }), ui.spark, ui.sparkNote)),
        h('section', {}, h('h2', { text: 'Members placed here' }), ui.members),
        h('section', {}, h('h2', { text: 'Events' }), ui.events.el),
        h('section', { class: 'card' }, h('h2', { text: 'Details' }), ui.info));
      fetchDetail();
      ui.events.start();
      this.update({ all: true });
    },
    unmount() { ui.events.stop(); },
    update(d) {
      if (!(d.all || d.nodes.has(id))) return;
      renderLive();
      drawSpark();
      if (!d.all) refetchSoon(); // members and labels are not in the stream's row
    },
  };

  async function fetchDetail() {
    try { detail = await readJson(path); detailError = ''; }
    catch (e) { detailError = e.message; }
    renderDetail();
  }

  function renderLive() {
    const r = state.nodes.get(id);
    if (!r) {
      setChildren(ui.head, h('h1', { class: 'mono', text: id }),
        h('span', { 'data-testid': 'node-status', class: 'muted', text: state.loading ? 'loading' : 'not in the view' }));
      setChildren(ui.live, h('p', { class: 'muted', text: state.loading ? 'loading…' : 'This node is not in the view (it may have left).' }));
      return;
    }
    const health = Number(r[N.HEALTH]) || 0;
    setChildren(ui.head,
      h('h1', { class: 'mono', text: id }),
      h('span', { class: `pill big s-${r[N.STATUS]}`, 'data-testid': 'node-status', text: r[N.STATUS] }),
      r[N.CORDONED] ? h('span', { class: 'tag', text: 'cordoned' }) : null,
      r[N.DRAIN] ? h('span', { class: 'tag', text: 'drain requested' }) : null,
      r[N.PREEMPTING] ? h('span', { class: 'tag', 'data-testid': 'node-preempting', text: 'preempting' }) : null,
      h('span', { class: 'muted', text: `${r[N.DOMAIN]} · priority ${r[N.PRIORITY]} · shard ${r[N.SHARD]} · incarnation ${r[N.INCARNATION]}` }),
      h('span', { class: 'health-badge', style: { background: healthCss(health) }, text: `health ${num(health, 2)}` }));
    const line = (label, used, cap, fmt) => h('tr', {},
      h('th', { text: label }),
      h('td', { class: 'r num', text: fmt(used) }),
      h('td', { class: 'r num muted', text: fmt(cap) }),
      h('td', { class: 'r num', text: cap ? pct(used / cap) : '–' }),
      h('td', { class: 'bar-col wide' }, bar(cap ? used / cap : 0, `${fmt(used)} of ${fmt(cap)}`)));
    setChildren(ui.live, h('table', { class: 'mini' },
      h('thead', {}, h('tr', {}, h('th'), h('th', { class: 'r', text: 'allocated' }), h('th', { class: 'r', text: 'capacity' }), h('th', { class: 'r', text: 'used' }), h('th', { class: 'bar-col wide' }))),
      h('tbody', {},
        line('CPU', r[N.CPU_ALLOC], r[N.CPU_CAP], cores),
        line('Memory', r[N.MEM_ALLOC], r[N.MEM_CAP], bytes),
        line('GPU', r[N.GPU_ALLOC], r[N.GPU_CAP], (x) => `${num(x || 0, 0)} GPU`))));
  }

  function drawSpark() {
    const c = ui.spark;
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth || 360, hgt = 60;
    if (c.width !== Math.round(w * dpr)) { c.width = Math.round(w * dpr); c.height = Math.round(hgt * dpr); }
    const ctx = c.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, hgt);
    const hist = healthHistoryOf(id);
    if (!hist || !hist.t.length) { ui.sparkNote.textContent = 'no sample yet'; return; }
    const now = Date.now();
    const t0 = hist.t[0], span = Math.max(1000, now - t0);
    const x = (t) => ((t - t0) / span) * (w - 4) + 2;
    const y = (v) => 4 + (1 - v) * (hgt - 8);
    // Guides at 0.5 and 1.
    ctx.strokeStyle = 'rgba(128,128,128,0.3)'; ctx.lineWidth = 1;
    ctx.beginPath(); ctx.moveTo(0, y(1)); ctx.lineTo(w, y(1)); ctx.moveTo(0, y(0.5)); ctx.lineTo(w, y(0.5)); ctx.stroke();
    // Health holds its value until the next change: a step line, coloured by the last value.
    ctx.strokeStyle = healthCss(hist.v[hist.v.length - 1]); ctx.lineWidth = 2;
    ctx.beginPath();
    ctx.moveTo(x(hist.t[0]), y(hist.v[0]));
    for (let i = 1; i < hist.t.length; i++) { ctx.lineTo(x(hist.t[i]), y(hist.v[i - 1])); ctx.lineTo(x(hist.t[i]), y(hist.v[i])); }
    ctx.lineTo(x(now), y(hist.v[hist.v.length - 1]));
    ctx.stroke();
    const min = Math.min(...hist.v), max = Math.max(...hist.v);
    ui.sparkNote.textContent = `${hist.v.length} change${hist.v.length === 1 ? '' : 's'} since ${clock(t0)} · min ${num(min, 2)} · max ${num(max, 2)} · now ${num(hist.v[hist.v.length - 1], 2)}`;
  }

  function renderDetail() {
    if (!detail) {
      setChildren(ui.members, h('p', { class: 'muted', text: detailError ? `cannot load: ${detailError}` : 'loading…' }));
      setChildren(ui.info, h('p', { class: 'muted', text: detailError ? `cannot load: ${detailError}` : 'loading…' }));
      return;
    }
    const members = detail.members || [];
    setChildren(ui.members, members.length
      ? h('table', { class: 'grid compact' },
        h('thead', {}, h('tr', {}, ['app', 'unit', 'member', 'role', 'state', 'address'].map((c) => h('th', { text: c })))),
        h('tbody', {}, members.map((m) => h('tr', {},
          h('td', {}, h('a', { href: `#/apps/${encodeURIComponent(m.app)}`, text: m.app })),
          h('td', { class: 'mono', text: m.unit_id }),
          h('td', { class: 'mono', text: m.member }),
          h('td', { text: m.role }),
          h('td', {}, pill(m.state || '–')),
          h('td', { class: 'mono', text: m.address || '–' })))))
      : h('p', { class: 'muted', text: 'No app member runs here.' }));
    const hl = detail.health || {};
    const labels = Object.entries(detail.labels || {}).sort();
    setChildren(ui.info, h('div', { class: 'decision-cols' },
      h('table', { class: 'kv' }, h('tbody', {},
        kv('status since', detail.status_since ? `${detail.status_since}` : '–'),
        kv('capacity', resText(detail.capacity)),
        kv('allocated', resText(detail.allocated)),
        kv('health score', num(hl.score, 3)),
        kv('cpu utilisation', hl.cpu_utilisation != null ? pct(hl.cpu_utilisation) : '–'),
        kv('cpu steal', hl.cpu_steal != null ? pct(hl.cpu_steal) : '–'),
        kv('load per core', num(hl.load_per_core, 2)),
        kv('memory pressure', hl.memory_pressure != null ? num(hl.memory_pressure, 3) : '–'),
        kv('preemption notice', hl.preemption_notice ? 'yes' : 'no'))),
      h('table', { class: 'kv' },
        h('thead', {}, h('tr', {}, h('th', { text: 'label' }), h('th', { text: 'value' }))),
        h('tbody', {}, labels.length ? labels.map(([k, v]) => h('tr', {}, h('th', { class: 'mono', text: k }), h('td', { class: 'mono', text: v })))
          : h('tr', {}, h('td', { colspan: 2, class: 'muted', text: 'no labels' }))))));
  }

  return page;
}

function kv(k, v) { return h('tr', {}, h('th', { text: k }), h('td', { text: v })); }
