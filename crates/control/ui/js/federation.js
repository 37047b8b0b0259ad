// #/federation: one card per domain (member cluster), the shards table and the node heatmap.

import { state, N } from './store.js';
import { h, setChildren, num, cores, bytes, pill, healthCss, sum } from './util.js';
import { Heatmap, heatmapLegend } from './heatmap.js';

const STATUS_ORDER = ['alive', 'suspect', 'draining', 'dead', 'unknown', 'left'];

// One heatmap for the page's whole life: going back to #/federation reuses its layout.
let heatmap = null;

export function federationPage() {
  let summaryEl, cardsEl, shardsEl;
  return {
    title: 'Federation',
    mount(main) {
      heatmap ||= new Heatmap({ onOpen: (id) => { location.hash = `#/nodes/${encodeURIComponent(id)}`; } });
      heatmap.needsLayout = true;
      summaryEl = h('div', { class: 'summary-strip' });
      cardsEl = h('div', { class: 'cards' });
      shardsEl = h('div', { class: 'table-wrap' });
      setChildren(main,
        h('div', { class: 'page-head' }, h('h1', { text: 'Federation' }), summaryEl),
        h('section', {}, h('h2', { text: 'Domains' }), cardsEl),
        h('section', {},
          h('div', { class: 'section-head' }, h('h2', { text: 'Nodes' }), h('span', { class: 'muted', text: 'one cell per node, grouped by domain; hover for details, click to open' })),
          heatmap.el, heatmapLegend()),
        h('section', {}, h('h2', { text: 'Aggregator shards' }), shardsEl));
      this.update({ all: true });
    },
    update(d) {
      if (d.all || d.federation || d.nodeSet) { renderSummary(summaryEl); renderCards(cardsEl); renderShards(shardsEl); }
      if (!state.loading) heatmap.render(d.all ? null : d.nodes, d.all || d.nodeSet, d.all);
    },
  };
}

/** Totals over every node, counted from the live rows (cheap: one pass, only on change). */
function renderSummary(el) {
  // The federation event already counts nodes by status per domain; only without it (an
  // older server, or before it arrives) count the rows.
  const counts = {};
  if (state.federation.domains.length) {
    for (const d of state.federation.domains) for (const [s, n] of Object.entries(d.nodes || {})) counts[s] = (counts[s] || 0) + n;
  } else {
    const status = state.nodes.cols[N.STATUS];
    for (const slot of state.nodes.slots.values()) counts[status[slot]] = (counts[status[slot]] || 0) + 1;
  }
  const shards = state.federation.shards;
  const connected = shards.filter((s) => s.connected).length;
  setChildren(el,
    stat('nodes', num(state.nodes.size, 0)),
    ...STATUS_ORDER.filter((s) => counts[s]).map((s) => stat(s, num(counts[s], 0), `s-${s}`)),
    stat('domains', num(state.federation.domains.length, 0)),
    stat('shards connected', `${connected}/${shards.length}`, connected < shards.length ? 's-suspect' : ''));
}

function stat(label, value, cls) {
  return h('div', { class: `stat ${cls || ''}` }, h('div', { class: 'stat-value num', text: value }), h('div', { class: 'stat-label', text: label }));
}

function renderCards(el) {
  const domains = [...state.federation.domains].sort((a, b) => String(a.domain).localeCompare(String(b.domain)));
  if (!domains.length) { setChildren(el, h('p', { class: 'muted', text: state.loading ? 'loading…' : 'no domains reported yet' })); return; }
  setChildren(el, domains.map(domainCard));
}

function domainCard(d) {
  const nodes = d.nodes || {};
  const total = sum(nodes);
  const statuses = STATUS_ORDER.filter((s) => nodes[s]).concat(Object.keys(nodes).filter((s) => !STATUS_ORDER.includes(s) && nodes[s]));
  const cap = d.capacity || {}, alloc = d.allocated || {};
  return h('article', { class: 'card domain-card', 'data-testid': 'domain-card', 'data-domain': d.domain },
    h('header', { class: 'card-head' },
      h('h3', {}, h('a', { href: `#/nodes?domain=${encodeURIComponent(d.domain)}`, text: d.domain, title: 'list its nodes' })),
      h('span', { class: 'muted', text: `shard ${d.shard}` }),
      h('span', { class: 'spacer' }),
      h('span', { class: 'num strong', text: num(total, 0) }), h('span', { class: 'muted', text: ' nodes' })),
    h('div', { class: 'card-row' },
      statuses.length ? statuses.map((s) => h('a', { class: 'count', href: `#/nodes?domain=${encodeURIComponent(d.domain)}&status=${encodeURIComponent(s)}`, title: `list the ${s} nodes of ${d.domain}` },
        pill(s), h('span', { class: 'num', text: num(nodes[s], 0) }))) : h('span', { class: 'muted', text: 'no nodes' })),
    h('div', { class: 'card-row muted' },
      `priority high ${num(d.priority?.high || 0, 0)} · low ${num(d.priority?.low || 0, 0)}`,
      h('span', { class: 'spacer' }),
      `units ${num(d.units || 0, 0)}`),
    healthHistogram(d.health || []),
    h('table', { class: 'mini' },
      h('thead', {}, h('tr', {}, h('th', {}), h('th', { class: 'r', text: 'free' }), h('th', { class: 'r', text: 'total' }), h('th', { class: 'bar-col' }))),
      h('tbody', {},
        capRow('CPU', cap.cpu_millis, alloc.cpu_millis, cores),
        capRow('Memory', cap.memory_bytes, alloc.memory_bytes, bytes),
        capRow('GPU', cap.gpu, alloc.gpu, (x) => `${num(x || 0, 0)} GPU`))));
}

function capRow(label, total, used, fmt) {
  total = Number(total) || 0; used = Number(used) || 0;
  const frac = total ? Math.min(1, used / total) : 0;
  return h('tr', {},
    h('th', { text: label }),
    h('td', { class: 'r num', text: fmt(Math.max(0, total - used)) }),
    h('td', { class: 'r num muted', text: fmt(total) }),
    h('td', { class: 'bar-col' }, bar(frac, `${Math.round(frac * 100)} % allocated`)));
}

/** A horizontal bar: `frac` filled. */
export function bar(frac, title, cls = '') {
  return h('div', { class: `bar ${cls}`, title }, h('div', { class: 'bar-fill', style: { width: `${Math.max(0, Math.min(1, frac)) * 100}%` } }));
}

/** The 10-bucket health distribution as small vertical bars, red (0) to green (1). */
function healthHistogram(buckets) {
  const max = Math.max(1, ...buckets);
  return h('div', { class: 'histo', title: 'health score distribution, 0 (left) to 1 (right)' },
    buckets.map((n, i) => h('div', { class: 'histo-col', title: `${(i / 10).toFixed(1)}–${((i + 1) / 10).toFixed(1)}: ${n} nodes` },
      h('div', { class: 'histo-bar', style: { height: `${n ? Math.max(4, (n / max) * 100) : 0}%`, background: healthCss((i + 0.5) / 10) } }))),
    h('div', { class: 'histo-axis muted' }, h('span', { text: '0' }), h('span', { text: 'health' }), h('span', { text: '1' })));
}

function renderShards(el) {
  const shards = [...state.federation.shards].sort((a, b) => a.shard - b.shard);
  setChildren(el, h('table', { class: 'grid' },
    h('thead', {}, h('tr', {}, ['shard', 'address', 'connected', 'epoch', 'seq', 'nodes', 'updated'].map((c, i) => h('th', { class: i >= 3 ? 'r' : '', text: c })))),
    h('tbody', {}, shards.length ? shards.map((s) => h('tr', {},
      h('td', { class: 'num', text: s.shard }),
      h('td', { class: 'mono', text: s.address || '' }),
      h('td', {}, pill(s.connected ? 'connected' : 'disconnected')),
      h('td', { class: 'r num', text: s.epoch ?? '' }),
      h('td', { class: 'r num', text: num(s.seq, 0) }),
      h('td', { class: 'r num', text: num(s.nodes, 0) }),
      h('td', { class: 'r num', text: s.updated_ms_ago == null ? '–' : `${num(s.updated_ms_ago, 0)} ms ago` }))) :
      h('tr', {}, h('td', { colspan: 7, class: 'muted', text: 'no shards reported yet' })))));
}
