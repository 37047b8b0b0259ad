// Small helpers shared by every page: DOM building (text only, never HTML from data),
// number formatting with units, and colours.

/**
 * Builds an element. `attrs` keys: `class`, `text` (textContent), `dataset` (object),
 * `on` (object of event listeners), `style` (object), anything else is set as an attribute
 * (`false`/`null`/`undefined` values are skipped). Children may be nodes, strings (as text)
 * or nested arrays; null/false children are skipped.
 * Everything user-provided ends up as textContent or an attribute value, so it is never
 * parsed as HTML.
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'text') el.textContent = String(v);
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k === 'on') for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
      else if (k === 'style') Object.assign(el.style, v);
      else if (k === 'value') el.value = v;
      else if (k === 'checked' || k === 'disabled' || k === 'hidden' || k === 'open') el[k] = !!v;
      else el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** Replaces all children of `el`. */
export function setChildren(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;

/** "1,234.5" with at most `digits` decimals, trailing zeros dropped, thousands grouped.
 * Not Intl.NumberFormat: building its first one loads ICU's data, 10-20 ms on the way to
 * the first paint. */
export function num(x, digits = 1) {
  if (x === null || x === undefined) return '–';
  const v = Number(x);
  if (Number.isNaN(v)) return '–';
  if (!Number.isFinite(v)) return v > 0 ? '∞' : '-∞';
  const fixed = Math.abs(v).toFixed(digits);
  if (fixed.includes('e')) return String(v); // 1e21 and up
  const [whole, frac = ''] = fixed.split('.');
  const decimals = frac.replace(/0+$/, '');
  const grouped = whole.replace(/\B(?=(\d{3})+$)/g, ',');
  const sign = v < 0 && (whole !== '0' || decimals) ? '-' : '';
  return `${sign}${grouped}${decimals ? '.' + decimals : ''}`;
}

/** Cores from millicores: fewer decimals as the number grows (2,035 cores, 6.25 cores). */
export function cores(millis) {
  const c = (millis || 0) / 1000;
  return `${num(c, c >= 100 ? 0 : c >= 10 ? 1 : 2)} cores`;
}
export const coresBare = (millis) => num((millis || 0) / 1000, 2);
export function bytes(b) {
  b = b || 0;
  if (b >= GiB * 1024) return `${num(b / GiB / 1024, 2)} TiB`;
  if (b >= GiB || b === 0) return `${num(b / GiB, 2)} GiB`;
  return `${num(b / MiB, 0)} MiB`;
}
export const gib = (b) => num((b || 0) / GiB, 1);
export const pct = (x) => `${num(x * 100, 0)} %`;

/** "3 s ago", "2 min ago" for a past time in ms since the epoch. */
export function ago(ms) {
  if (!ms) return '–';
  const d = Math.max(0, Date.now() - ms);
  return `${duration(d)} ago`;
}

/**
 * A span showing "N s ago" for `ms` that stays true: one timer refreshes every such span
 * on the page each second (a handful of elements, never per node).
 */
export function agoEl(ms, cls = 'muted') {
  return h('span', { class: cls, 'data-at': ms || 0, title: ms ? new Date(ms).toISOString() : null, text: ago(ms) });
}
setInterval(() => {
  for (const el of document.querySelectorAll('[data-at]')) el.textContent = ago(Number(el.dataset.at));
}, 1000);

export function duration(d) {
  if (d < 1000) return `${Math.round(d)} ms`;
  if (d < 60_000) return `${Math.round(d / 1000)} s`;
  if (d < 3_600_000) return `${Math.round(d / 60_000)} min`;
  if (d < 86_400_000) return `${num(d / 3_600_000, 1)} h`;
  return `${num(d / 86_400_000, 1)} d`;
}

export function clock(ms) {
  if (!ms) return '–';
  const d = new Date(ms);
  return d.toLocaleTimeString('en-GB', { hour12: false });
}

/** Health score (1 = healthy) to a colour: green → amber → red, as [r, g, b]. */
export function healthRGB(score) {
  const s = Math.max(0, Math.min(1, Number.isFinite(score) ? score : 0));
  // Piecewise between red (0), amber (0.5) and green (1) so mid scores stand out.
  const red = [214, 48, 49], amber = [240, 165, 0], green = [38, 166, 91];
  const [a, b, t] = s < 0.5 ? [red, amber, s / 0.5] : [amber, green, (s - 0.5) / 0.5];
  return [0, 1, 2].map((i) => Math.round(a[i] + (b[i] - a[i]) * t));
}
// 101 precomputed CSS colours (score rounded to 0.01): the tables colour many cells per frame.
const HEALTH_CSS = Array.from({ length: 101 }, (_, i) => `rgb(${healthRGB(i / 100).join(',')})`);
export const healthCss = (score) => HEALTH_CSS[Math.round(Math.max(0, Math.min(1, Number(score) || 0)) * 100)];

/** Sum of a `{key: number}` object. */
export const sum = (o) => Object.values(o || {}).reduce((a, b) => a + (Number(b) || 0), 0);

/** A pill showing a status or state word with a colour class of its own. */
export function pill(word, extra) {
  return h('span', { class: `pill s-${String(word).replace(/[^a-z_]/gi, '')}${extra ? ' ' + extra : ''}`, text: word });
}

/** A compact resources object `{cpu_millis, memory_bytes, gpu, ...}` as text. */
export function resText(r) {
  if (!r) return '–';
  const parts = [];
  if (r.cpu_millis) parts.push(cores(r.cpu_millis));
  if (r.memory_bytes) parts.push(bytes(r.memory_bytes));
  if (r.gpu) parts.push(`${num(r.gpu, 0)} GPU`);
  for (const [k, v] of Object.entries(r)) {
    if (k === 'cpu_millis' || k === 'memory_bytes' || k === 'gpu' || !v) continue;
    parts.push(`${num(v, 2)} ${k}`);
  }
  return parts.length ? parts.join(' · ') : 'nothing';
}

/** Calls `fn` at most once per `ms`, trailing call kept. */
export function throttle(fn, ms) {
  let last = 0, timer = null;
  return function throttled(...args) {
    const now = performance.now();
    const run = () => { last = performance.now(); timer = null; fn(...args); };
    if (now - last >= ms) run();
    else if (!timer) timer = setTimeout(run, ms - (now - last));
  };
}

// uPlot, the charts' library (window.uPlot), is loaded when a chart first needs it: the
// federation page has none, and running it before the page's modules held their first
// paint back.
let chartLoad = null;
let chartMissing = false;

/**
 * 'ready' when uPlot is here; 'loading' (then `redraw` runs once the load ends, either
 * way) or 'missing' (it failed to load). A chart shows `chartNote(state)` until ready.
 */
export function chartLibrary(redraw) {
  if (typeof window.uPlot === 'function') return 'ready';
  if (chartMissing) return 'missing';
  chartLoad ||= new Promise((resolve) => {
    document.head.append(h('script', { src: '/ui/vendor/uPlot.iife.min.js', on: { load: () => resolve(true), error: () => resolve(false) } }));
  }).then((ok) => { chartMissing = !ok; });
  chartLoad.then(() => redraw());
  return 'loading';
}

/** What a chart shows while its library loads, or if it could not. */
export function chartNote(state) {
  return h('p', { class: 'muted', text: state === 'missing' ? 'chart library missing' : 'loading the chart…' });
}
