// #/pools: per pool, instances by node type and lifecycle state (Ray autoscaler v2 states),
// the pending demand, the floor, min/max per type (editable) and the last pass records.

import { state } from './store.js';
import { h, setChildren, num, pill, clock, agoEl, duration, resText } from './util.js';
import { act, toast } from './api.js';
import { nodeLink } from './apps.js';
import { HistoryChart } from './history-chart.js';

// Ray v2's lifecycle in its order (docs/architecture.md §19).
export const INSTANCE_STATES = ['queued', 'requested', 'allocated', 'agent_starting', 'running', 'drain_requested',
  'draining', 'drained', 'terminating', 'terminated', 'allocation_failed', 'agent_start_failed', 'termination_failed'];
const FINISHED = new Set(['terminated', 'allocation_failed']);
const MAX_INSTANCE_ROWS = 500;
const MAX_DECISIONS = 10;

export function poolsPage() {
  let list;
  const cards = new Map();      // pool → {el, parts}
  const openDecisions = new Set();
  const edits = new Map();      // "pool/type" → {min, max} typed but not saved
  const showFinished = new Set(); // pools whose terminated instances are listed too

  // A card's chart asks the server every 10 s: stop it with the card.
  const dropAll = () => { for (const c of cards.values()) c.parts.history.stop(); cards.clear(); };

  const page = {
    title: 'Pools',
    unmount() { dropAll(); },
    mount(main) {
      list = h('div', { class: 'pools' });
      dropAll();
      setChildren(main, h('div', { class: 'page-head' }, h('h1', { text: 'Pools' }),
        h('span', { class: 'muted', text: 'node pools grown and shrunk by the pool autoscaler (Ray autoscaler v2 lifecycle)' })), list);
      this.update({ all: true });
    },
    update(d) {
      if (!(d.all || d.poolSet || d.pools.size)) return;
      const names = [...state.pools.keys()].sort();
      if (!names.length) {
        dropAll();
        setChildren(list, h('p', { class: 'muted', text: state.loading ? 'loading…' : 'No pool has reported. Run `flotilla up --autoscale --pool examples/pool.toml` or `flotilla autoscaler --pool FILE`.' }));
        return;
      }
      if (d.all || d.poolSet) {
        for (const n of [...cards.keys()]) {
          if (!state.pools.has(n)) { cards.get(n).parts.history.stop(); cards.delete(n); }
        }
        for (const n of names) if (!cards.has(n)) cards.set(n, makeCard(n));
        setChildren(list, names.map((n) => cards.get(n).el));
      }
      for (const n of names) if (d.all || d.poolSet || d.pools.has(n)) renderCard(n);
    },
  };

  function makeCard(name) {
    const parts = {
      head: h('header', { class: 'card-head' }),
      types: h('div', { class: 'table-wrap' }),
      demand: h('div'),
      instances: h('div'),
      decisions: h('div', { class: 'timeline' }),
      history: new HistoryChart(`/v1/pools/${encodeURIComponent(name)}/history`),
    };
    parts.history.start();
    // The types table holds inputs: don't replace it while the operator types in it.
    parts.types.addEventListener('focusout', () => setTimeout(() => { if (!parts.types.contains(document.activeElement)) renderTypes(name, parts.types); }, 0));
    const el = h('article', { class: 'card pool-card', 'data-testid': 'pool-card', 'data-pool': name },
      parts.head,
      h('h3', { text: 'Node types' }), parts.types,
      h('div', { class: 'two-col' },
        h('div', {}, h('h3', { text: 'Pending demand and floor' }), parts.demand),
        h('div', {}, h('h3', { text: 'Last passes' }), parts.decisions)),
      h('h3', { text: 'Running instances by node type (every 10 s, kept for a day)' }), parts.history.el,
      h('h3', { text: 'Instances' }), parts.instances);
    return { el, parts };
  }

  function renderCard(name) {
    const p = state.pools.get(name);
    const { parts } = cards.get(name);
    if (!p) return;
    setChildren(parts.head,
      h('h2', { text: name }),
      p.stale ? h('span', { class: 'pill s-suspect', text: 'stale', title: 'no report from its autoscaler lately' }) : null,
      h('span', { class: 'muted', text: [p.provider && `provider ${p.provider}`, p.interval_s && `every ${p.interval_s} s`, p.max_nodes != null && `max ${num(p.max_nodes, 0)} nodes`].filter(Boolean).join(' · ') }),
      h('span', { class: 'spacer' }),
      h('span', { class: 'muted', text: p.reported_ms_ago != null ? `reported ${duration(p.reported_ms_ago)} ago` : 'never reported' }));
    if (!parts.types.contains(document.activeElement)) renderTypes(name, parts.types);
    renderDemand(p, parts.demand);
    renderInstances(name, p, parts.instances);
    renderPasses(p, parts.decisions);
  }

  function renderTypes(name, el) {
    const p = state.pools.get(name);
    if (!p) return;
    const types = p.node_types || [];
    const byType = p.by_type || {};
    // Only states some type is in get a column, in lifecycle order: dense but complete.
    const used = INSTANCE_STATES.filter((s) => Object.values(byType).some((m) => m && m[s]));
    const other = [...new Set(Object.values(byType).flatMap((m) => Object.keys(m || {})))].filter((s) => !INSTANCE_STATES.includes(s));
    const cols = used.concat(other);
    setChildren(el, h('table', { class: 'grid compact' },
      h('thead', {}, h('tr', {},
        h('th', { text: 'type' }), h('th', { text: 'resources' }), h('th', { class: 'r', text: 'cost' }), h('th', { class: 'r', text: 'idle after' }),
        h('th', { text: 'min / max' }),
        cols.map((s) => h('th', { class: 'r state-col' }, pill(s))),
        h('th', { class: 'r', text: 'total' }))),
      h('tbody', {}, types.map((t) => typeRow(name, p, t, cols)))));
    if (!types.length) el.appendChild(h('p', { class: 'muted', text: 'no node types reported' }));
  }

  function typeRow(pool, p, t, cols) {
    const counts = (p.by_type || {})[t.name] || {};
    const bound = (p.bounds || {})[t.name];
    const key = `${pool}/${t.name}`;
    const edit = edits.get(key);
    const min = h('input', { type: 'number', class: 'input num tiny', min: 0, max: 100000, step: 1, 'aria-label': `${t.name} min`, 'data-testid': 'type-min',
      value: edit ? edit.min : (bound ? bound.min : t.min) ?? 0, on: { input: () => remember() } });
    const max = h('input', { type: 'number', class: 'input num tiny', min: 0, max: 100000, step: 1, 'aria-label': `${t.name} max`, 'data-testid': 'type-max',
      value: edit ? edit.max : (bound ? bound.max : t.max) ?? 0, on: { input: () => remember() } });
    function remember() { edits.set(key, { min: min.value, max: max.value }); }
    const save = async () => {
      const a = Number(min.value), b = Number(max.value);
      if (!Number.isInteger(a) || !Number.isInteger(b) || a < 0 || a > b || b > 100000) {
        toast(`${t.name}: need whole numbers with 0 ≤ min ≤ max ≤ 100,000`, 'error');
        return;
      }
      const r = await act('PUT', `/v1/pools/${encodeURIComponent(pool)}/node_types/${encodeURIComponent(t.name)}`, { min: a, max: b },
        `set ${pool}/${t.name} to ${a}..${b}`);
      if (r.ok) edits.delete(key);
    };
    const total = Object.entries(counts).filter(([s]) => !FINISHED.has(s)).reduce((x, [, n]) => x + n, 0);
    return h('tr', { 'data-type': t.name },
      h('td', { class: 'strong', text: t.name }),
      h('td', { class: 'small', text: resText(t.resources) }),
      h('td', { class: 'r num', text: t.cost != null ? num(t.cost, 3) : '–' }),
      h('td', { class: 'r num', text: t.idle_timeout_s != null ? duration(t.idle_timeout_s * 1000) : '–' }),
      h('td', { class: 'nowrap' },
        h('form', { class: 'inline', on: { submit: (e) => { e.preventDefault(); save(); } } },
          min, ' .. ', max, ' ',
          h('button', { type: 'submit', class: 'btn small', 'data-testid': 'type-save', 'data-scope': 'operate', text: 'Set' })),
        h('div', { class: 'muted small', text: bound ? `set here (file: ${t.min}..${t.max})` : 'from the pool file' })),
      cols.map((s) => h('td', { class: `r num ${counts[s] ? '' : 'muted'}`, text: counts[s] ? num(counts[s], 0) : '·' })),
      h('td', { class: 'r num strong', text: num(total, 0), title: 'instances not finished' }));
  }

  function renderInstances(name, p, el) {
    const all = p.instances || [];
    const show = showFinished.has(name);
    const rank = (s) => { const i = INSTANCE_STATES.indexOf(s); return i < 0 ? 99 : i; };
    const visible = all.filter((i) => show || !FINISHED.has(i.state))
      .sort((a, b) => rank(a.state) - rank(b.state) || String(a.id).localeCompare(String(b.id)));
    const hidden = all.length - visible.length;
    const rows = visible.slice(0, MAX_INSTANCE_ROWS);
    setChildren(el,
      h('div', { class: 'muted small' },
        `${num(all.length, 0)} instance records`,
        hidden ? ` · ${num(hidden, 0)} finished hidden ` : ' ',
        all.some((i) => FINISHED.has(i.state)) ? h('button', { type: 'button', class: 'link', text: show ? 'hide finished' : 'show finished',
          on: { click: () => { if (show) showFinished.delete(name); else showFinished.add(name); renderInstances(name, state.pools.get(name), el); } } }) : null,
        visible.length > rows.length ? ` · first ${MAX_INSTANCE_ROWS} shown` : ''),
      rows.length ? h('div', { class: 'table-wrap scroll-y' }, h('table', { class: 'grid compact' },
        h('thead', {}, h('tr', {}, ['instance', 'type', 'state', 'since', 'attempts', 'reason', 'history'].map((c, i) => h('th', { class: i === 4 ? 'r' : '', text: c })))),
        h('tbody', {}, rows.map((i) => h('tr', { 'data-testid': 'instance-row', 'data-instance': i.id, 'data-state': i.state },
          h('td', {}, nodeLink(i.id)),
          h('td', { text: i.node_type }),
          h('td', {}, pill(i.state)),
          h('td', { class: 'nowrap' }, agoEl(i.since_ms, '')),
          h('td', { class: 'r num', text: i.launch_attempts ?? 0 }),
          h('td', { class: 'small', text: i.reason || '' }),
          h('td', { class: 'small muted', text: (i.history || []).map(([s]) => s).join(' → ') })))))) : null);
  }

  function renderPasses(p, el) {
    const decs = (p.decisions || []).slice(0, MAX_DECISIONS);
    if (!decs.length) { setChildren(el, h('p', { class: 'muted', text: 'no pass recorded yet' })); return; }
    setChildren(el, decs.map((d) => passView(d, openDecisions)));
  }

  return page;
}

/** The pending demand (from the latest pass) and the floor (the pool's constraints). */
function renderDemand(p, el) {
  const latest = (p.decisions || [])[0];
  const units = latest?.demand?.units || [];
  const floor = p.constraints?.resource_requests || [];
  setChildren(el,
    units.length ? h('table', { class: 'grid compact' },
      h('thead', {}, h('tr', {}, h('th', { text: 'app' }), h('th', { class: 'r', text: 'queued' }), h('th', { class: 'r', text: 'secondary' }), h('th', { text: 'each unit asks' }))),
      h('tbody', {}, units.map((u) => h('tr', {},
        h('td', {}, h('a', { href: `#/apps/${encodeURIComponent(u.app)}`, text: u.app })),
        h('td', { class: 'r num', text: num(u.queued?.primary ?? 0, 0) }),
        h('td', { class: 'r num', text: num(u.queued?.secondary ?? 0, 0) }),
        h('td', { class: 'small', text: (u.members || []).map(resText).join(' + ') })))))
      : h('p', { class: 'muted', text: latest ? 'No queued unit waits for nodes.' : 'No pass yet.' }),
    h('div', { class: 'floor' },
      h('strong', { text: 'Floor ' }), h('span', { class: 'muted', text: '(constraints, Ray\'s request_resources): ' }),
      floor.length ? floor.map((r) => h('span', { class: 'tag', text: `${r.count} × ${resText(r.resources)}` })) : h('span', { class: 'muted', text: 'none' })),
    latest?.instances ? h('div', { class: 'muted small', text: `at the last pass: ${latest.instances.pending ?? 0} pending, ${latest.instances.running ?? 0} running` }) : null);
}

/** One pool pass record, expandable. */
function passView(d, openSet) {
  const key = `${d.at_ms}`;
  const launches = Object.entries(d.launch || {});
  const terms = d.terminate || [];
  const infeasible = d.infeasible || [];
  const action = launches.length ? 'launch' : terms.length ? 'terminate' : infeasible.length ? 'infeasible' : 'none';
  const details = h('details', { class: `decision a-${action}`, 'data-testid': 'decision', open: openSet.has(key),
    on: { toggle: () => { if (details.open) openSet.add(key); else openSet.delete(key); } } },
    h('summary', {},
      h('span', { class: 'mono muted', text: clock(d.at_ms) }),
      pill(action),
      h('span', { class: 'ellipsis', text: d.explanation || '' })),
    h('div', { class: 'decision-body' },
      d.explanation ? h('pre', { class: 'explanation', text: d.explanation.split('; ').join('\n') }) : null,
      launches.length ? h('div', {}, h('strong', { text: 'launch ' }), launches.map(([t, n]) => h('span', { class: 'tag', text: `${n} × ${t}` }))) : null,
      terms.length ? h('table', { class: 'grid compact' }, h('tbody', {}, terms.map((t) => h('tr', {},
        h('td', {}, nodeLink(t.node_id)), h('td', {}, pill(t.cause || 'terminate')), h('td', { class: 'small', text: t.detail || '' }))))) : null,
      infeasible.length ? h('ul', { class: 'small' }, infeasible.map((i) => h('li', { text: `cannot place ${i.count} × ${typeof i.request === 'string' ? i.request : JSON.stringify(i.request)}: ${i.reason}` }))) : null,
      d.packing ? h('table', { class: 'kv' }, h('tbody', {},
        kvRow('placed on existing', JSON.stringify(d.packing.placed_on_existing ?? null)),
        kvRow('launched capacity', JSON.stringify(d.packing.launched ?? null)),
        kvRow('waste', JSON.stringify(d.packing.waste ?? null)),
        kvRow('decision time', d.decision_seconds != null ? `${num(d.decision_seconds * 1000, 3)} ms` : '–'))) : null,
      d.policy ? h('div', {},
        h('strong', { text: 'policy: ' }), pill(d.policy.action || 'none'), ' ',
        h('span', { text: d.policy.explanation || '' }),
        d.policy_desired ? h('span', { class: 'muted', text: ` · desired ${JSON.stringify(d.policy_desired)}` }) : null) : null));
  return details;
}

function kvRow(k, v) { return h('tr', {}, h('th', { text: k }), h('td', { class: 'mono small', text: v })); }
