// The page's state, fed only by the live stream (GET /v1/events, see the dashboard contract).
// Actions never change it: what the operator sees always comes from the control plane.
//
// Every event marks what it changed in `dirty`; one requestAnimationFrame callback hands the
// accumulated dirt to the current page, so a burst of events costs one render.

import { NodeTable, N } from './node-table.js';

export { N };

/** How many health samples each node keeps for its sparkline, and capacity points per app. */
const HEALTH_KEEP = 240;
const CAPACITY_KEEP = 5000;

/** A node's health samples ({t, v}); one sample (the snapshot's) until it first changes. */
export function healthHistoryOf(id) {
  const hist = state.healthHistory.get(id);
  if (hist) return hist;
  const s = state.nodes.slotOf(id);
  return s === undefined ? null : { t: [state.snapshotAt], v: [state.nodes.cols[N.HEALTH][s]] };
}

export const state = {
  /** Every node's fields, as columns (see node-table.js). */
  nodes: new NodeTable(),
  nodesTotal: 0,
  /** {domains: [...], shards: [...]} as the last `federation` event sent it. */
  federation: { domains: [], shards: [] },
  /** app name → {summary, units, routes, decisions, capacity}. */
  apps: new Map(),
  /** pool name → GET /v1/pools/{pool}. */
  pools: new Map(),
  /** True between snapshot_begin and snapshot_end. */
  loading: true,
  /** 'connecting' | 'live' | 'reconnecting'. */
  conn: 'connecting',
  /** When the current snapshot began (ms) and how many snapshots we have had. */
  snapshots: 0,
  snapshotAt: 0,
  // Client-side history since the page opened. Kept across reconnects on purpose: a
  // control-plane restart should not wipe what the operator was watching.
  /** node id → {t: [], v: []} health samples. */
  healthHistory: new Map(),
  /** app name → {t: [], cpu: [], mem: [], gpu: [], weight: []} (t in seconds for uPlot). */
  capacityHistory: new Map(),
};

/** What changed since the last frame. */
function freshDirty() {
  return {
    all: false,          // everything (a new snapshot, a route change)
    nodes: new Set(),    // node ids whose row changed
    nodeSet: false,      // nodes were added or removed (layouts must be rebuilt)
    federation: false,
    apps: new Set(),     // app names changed (or removed)
    appSet: false,       // an app appeared or went
    pools: new Set(),
    poolSet: false,
    conn: false,
  };
}
let dirty = freshDirty();
let frameQueued = false;
let renderer = () => {};

// Timing hook, read by loadtest/dashboard_perf.py (never by the page). performance.now()
// milliseconds, i.e. from navigation start:
//   takenAt: store.js took the stream over from boot.js (the modules are loaded);
//   snapshotBeginAt / snapshotEndAt: the first snapshot's snapshot_begin arrived (maybe
//     before takenAt: boot.js queues what comes early) / snapshot_end was applied (after
//     every row of it was parsed and applied);
//   snapshotDoneAt: the end of the first frame rendered after that snapshot (the node count
//     shown, the heatmap drawn), snapshotRenderMs that frame's render;
//   applied: [arrived, drawn] per message after snapshotDoneAt (pings aside): when its
//     listener ran, and the end of the animation-frame render that applied it;
//   renders: how long each render took.
// Bounded: at most PERF_KEEP entries per list, then it stops recording.
const PERF_KEEP = 50_000;
const perf = { takenAt: null, snapshotBeginAt: null, snapshotEndAt: null, snapshotDoneAt: null, snapshotRenderMs: null, applied: [], renders: [] };
window.__flotilla = perf;
let arrivals = [];

/** Registers the one function that renders a frame from the accumulated dirt. */
export function onFrame(fn) { renderer = fn; }

export function markAll() { dirty.all = true; queueFrame(); }

function queueFrame() {
  if (frameQueued) return;
  frameQueued = true;
  requestAnimationFrame(() => {
    frameQueued = false;
    const d = dirty;
    dirty = freshDirty();
    const t0 = performance.now();
    try { renderer(d); } catch (e) { console.error('render failed', e); }
    const t1 = performance.now();
    if (perf.renders.length < PERF_KEEP) perf.renders.push(t1 - t0);
    for (const a of arrivals) if (perf.applied.length < PERF_KEEP) perf.applied.push([a, t1]);
    arrivals = [];
    if (perf.snapshotDoneAt === null && perf.snapshotEndAt !== null && !state.loading) {
      perf.snapshotDoneAt = t1;
      perf.snapshotRenderMs = t1 - t0;
    }
  });
}

// ---- applying events -------------------------------------------------------------------

function resetForSnapshot(total) {
  state.nodes = new NodeTable();
  state.nodesTotal = total || 0;
  state.federation = { domains: [], shards: [] };
  state.apps = new Map();
  state.pools = new Map();
  state.loading = true;
  state.snapshots += 1;
  state.snapshotAt = Date.now();
  dirty.all = true;
}

// A node's health history starts at its first change after a snapshot, seeded with the
// score the snapshot showed (`prev`, undefined for a node new since): a snapshot of
// 100,000 nodes must not build 100,000 histories. See healthHistoryOf for a node that has
// not changed yet.
function recordHealth(id, score, now, prev) {
  let hist = state.healthHistory.get(id);
  if (!hist) {
    hist = prev !== undefined ? { t: [state.snapshotAt], v: [prev] } : { t: [], v: [] };
    state.healthHistory.set(id, hist);
  }
  const n = hist.v.length;
  if (n && hist.v[n - 1] === score) return; // only changes matter for a sparkline
  hist.t.push(now); hist.v.push(score);
  if (hist.v.length > HEALTH_KEEP * 2) { hist.t.splice(0, HEALTH_KEEP); hist.v.splice(0, HEALTH_KEEP); }
}

// A `nodes` message carries its nodes as columns (crates/control/src/events/columns.rs
// says what each holds), and the table keeps them as columns: applying it is a store per
// node and field, with the strings and capacities the message sends once looked up.
function applyNodes(msg) {
  const now = Date.now();
  const t = state.nodes;
  const ids = msg.id || [];
  const S = msg.strings || [], caps = msg.capacities || [];
  const { status, shard, domain, priority, health, capacity, cpu_alloc: cpuAlloc, mem_alloc: memAlloc, gpu_alloc: gpuAlloc, flags, incarnation } = msg;
  const c = t.cols;
  // A snapshot's end redraws everything (dirty.all): its nodes need no dirt of their own,
  // and only nodes that already have a history record into it.
  const loading = state.loading;
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i];
    let s = t.slotOf(id);
    const prev = s === undefined ? undefined : c[N.HEALTH][s];
    if (s === undefined) { s = t.add(id); dirty.nodeSet = true; }
    const cap = caps[capacity[i]] || [0, 0, 0];
    const f = flags[i];
    c[N.STATUS][s] = S[status[i]]; c[N.SHARD][s] = shard[i]; c[N.DOMAIN][s] = S[domain[i]];
    c[N.PRIORITY][s] = S[priority[i]]; c[N.HEALTH][s] = health[i];
    c[N.CPU_CAP][s] = cap[0]; c[N.CPU_ALLOC][s] = cpuAlloc[i]; c[N.MEM_CAP][s] = cap[1]; c[N.MEM_ALLOC][s] = memAlloc[i];
    c[N.GPU_CAP][s] = cap[2]; c[N.GPU_ALLOC][s] = gpuAlloc[i];
    c[N.CORDONED][s] = (f & 1) !== 0; c[N.DRAIN][s] = (f & 2) !== 0; c[N.PREEMPTING][s] = (f & 4) !== 0;
    c[N.INCARNATION][s] = incarnation[i];
    if (loading) {
      if (state.healthHistory.has(id)) recordHealth(id, health[i], now);
      continue;
    }
    dirty.nodes.add(id);
    recordHealth(id, health[i], now, prev);
  }
  for (const id of msg.removed || []) {
    if (t.delete(id)) { dirty.nodeSet = true; dirty.nodes.add(id); }
  }
  // Slots move: everything laid out by slot is laid out again (nodeSet).
  if (t.sparse()) { t.compact(); dirty.nodeSet = true; }
  if (!state.loading) state.nodesTotal = t.size;
}

function capacityTotals(cap) {
  const out = { cpu: 0, mem: 0, gpu: 0, weight: Number(cap?.total_weight) || 0 };
  for (const p of Object.values(cap?.by_priority || {})) {
    out.cpu += Number(p.cpu_millis) || 0;
    out.mem += Number(p.memory_bytes) || 0;
    out.gpu += Number(p.gpu) || 0;
  }
  return out;
}

function recordCapacity(app, cap) {
  let hist = state.capacityHistory.get(app);
  if (!hist) { hist = { t: [], cpu: [], mem: [], gpu: [], weight: [] }; state.capacityHistory.set(app, hist); }
  const c = capacityTotals(cap);
  const t = Date.now() / 1000;
  const n = hist.t.length;
  // Two points at nearly the same instant would draw a spike; replace the last instead.
  if (n && t - hist.t[n - 1] < 0.2) { hist.t.pop(); hist.cpu.pop(); hist.mem.pop(); hist.gpu.pop(); hist.weight.pop(); }
  hist.t.push(t); hist.cpu.push(c.cpu / 1000); hist.mem.push(c.mem / 1024 ** 3); hist.gpu.push(c.gpu); hist.weight.push(c.weight);
  if (hist.t.length > CAPACITY_KEEP) for (const k of Object.keys(hist)) hist[k].splice(0, hist[k].length - CAPACITY_KEEP);
}

function applyApp(msg) {
  if (!msg || !msg.app) return;
  const prev = state.apps.get(msg.app);
  if (!prev) dirty.appSet = true;
  // The server sends the app's whole picture; keep what a partial message leaves out.
  const next = { ...(prev || {}), ...msg };
  state.apps.set(msg.app, next);
  dirty.apps.add(msg.app);
  if (msg.capacity) recordCapacity(msg.app, msg.capacity);
}

/** The `ui` build of the first snapshot: the build this page was loaded from. */
let loadedFrom = null;

const handlers = {
  snapshot_begin(msg) {
    // The control plane serves another build of the page than this one was loaded from
    // (an upgrade, and the stream reconnected): its stream and the modules still to be
    // imported may not fit this page's. Load the page again.
    if (msg.ui && loadedFrom && msg.ui !== loadedFrom) { location.reload(); return; }
    loadedFrom ||= msg.ui;
    resetForSnapshot(msg.nodes_total);
  },
  nodes: applyNodes,
  snapshot_end() {
    state.loading = false;
    state.nodesTotal = state.nodes.size;
    dirty.all = true;
    setConn('live');
  },
  federation(msg) { state.federation = { domains: msg.domains || [], shards: msg.shards || [] }; dirty.federation = true; },
  app: applyApp,
  app_removed(msg) {
    if (state.apps.delete(msg.app)) { dirty.appSet = true; dirty.apps.add(msg.app); }
  },
  pool(msg) {
    if (!msg || !msg.pool) return;
    if (!state.pools.has(msg.pool)) dirty.poolSet = true;
    state.pools.set(msg.pool, msg);
    dirty.pools.add(msg.pool);
  },
  ping() {},
};

// ---- the connection ----------------------------------------------------------------------

let source = null;
let lastMessage = 0;
let retryDelay = 1000;
let progress = () => {};

/** Called with (loaded, total) while a snapshot streams in. */
export function onProgress(fn) { progress = fn; }

function setConn(c) {
  if (state.conn === c) return;
  state.conn = c;
  dirty.conn = true;
  queueFrame();
}

/** Takes over the stream boot.js opened, or opens one (reconnecting). EventSource
 * reconnects by itself; we only step in when it gives up. */
export function connect() {
  const boot = window.flotillaStream;
  if (boot && !source) {
    source = boot.source;
    watch(source);
    perf.takenAt = performance.now();
    boot.take(receive);
    // It may have given up before we were here to see it.
    if (source.readyState === EventSource.CLOSED) source.onerror();
    return;
  }
  if (source) source.close();
  source = new EventSource('/v1/events');
  watch(source);
  for (const name of EVENTS) source.addEventListener(name, (ev) => receive(name, ev.data, performance.now()));
}

/** The events the stream sends, as boot.js lists them (it opened the stream first). */
const EVENTS = window.flotillaStream?.names || Object.keys(handlers);
for (const name of Object.keys(handlers)) {
  if (!EVENTS.includes(name)) console.error(`boot.js does not listen for "${name}" events`);
}

function watch(s) {
  lastMessage = Date.now();
  s.onopen = () => { retryDelay = 1000; lastMessage = Date.now(); };
  s.onerror = () => {
    setConn('reconnecting');
    // CLOSED means the browser will not retry (e.g. the answer was not an event stream).
    if (s.readyState === EventSource.CLOSED) {
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 15000);
    }
  };
}

/** One message of the stream: `arrived` is when its listener ran (performance.now()). */
function receive(name, data, arrived) {
  const fn = handlers[name];
  if (!fn) return;
  lastMessage = Date.now();
  let msg;
  try { msg = data ? JSON.parse(data) : {}; } catch (e) { console.warn('bad event', name, e); return; }
  try { fn(msg); } catch (e) { console.error('applying', name, 'failed', e); }
  if (name === 'snapshot_begin' && perf.snapshotBeginAt === null) perf.snapshotBeginAt = arrived;
  if (name === 'snapshot_end' && perf.snapshotEndAt === null) perf.snapshotEndAt = performance.now();
  if (perf.snapshotDoneAt !== null && name !== 'ping') arrivals.push(arrived);
  if (state.loading) progress(state.nodes.size, state.nodesTotal);
  queueFrame();
}

// The server pings every 15 s; silence for much longer means a half-open connection that
// EventSource would not notice, so start over.
setInterval(() => {
  if (source && Date.now() - lastMessage > 45_000) {
    setConn('reconnecting');
    connect();
  }
}, 5000);
