// #/apps (the list) and #/apps/NAME (one app: units, routes, autoscaling, decisions,
// capacity over time, and the scale / apply / rollback controls).

import { state } from './store.js';
import { h, setChildren, num, pill, sum, clock, agoEl, duration, resText, cores, chartLibrary, chartNote } from './util.js';
import { act, read, toast, mayChangeApp } from './api.js';
import { SpecEditor } from './spec-editor.js';
import { VersionsView } from './versions.js';
import { RolloutView } from './rollout.js';
import { EventsList } from './events-list.js';
import { LogTail } from './log-tail.js';
import { HistoryChart, APP_SERIES } from './history-chart.js';
import { bar } from './federation.js';

const UNIT_STATE_ORDER = ['running', 'starting', 'allocated', 'placing', 'queued', 'degraded', 'draining', 'stopping', 'failed', 'terminated'];
const stateRank = (s) => { const i = UNIT_STATE_ORDER.indexOf(s); return i < 0 ? 99 : i; };
const appPath = (app) => `/v1/apps/${encodeURIComponent(app)}`;

/** "basic · my-policy" or "manual". */
function policyText(a) {
  if (!a) return 'manual';
  return [a.policy || '(unknown policy)', a.policy_name].filter(Boolean).join(' · ');
}

function unitCounts(units) {
  const entries = Object.entries(units || {}).filter(([, n]) => n).sort((a, b) => stateRank(a[0]) - stateRank(b[0]));
  if (!entries.length) return h('span', { class: 'muted', text: 'none' });
  return entries.map(([s, n]) => h('span', { class: 'count' }, pill(s), h('span', { class: 'num', text: num(n, 0) })));
}

/** An app whose standalone scheduler did not answer the control plane (`unreachable: true`). */
function unreachablePill(s) {
  const el = pill('unreachable', 's-disconnected');
  el.title = s.error?.message || 'its scheduler did not answer';
  return el;
}

// ---- the list --------------------------------------------------------------------------------

export function appsPage() {
  let body;
  return {
    title: 'Apps',
    mount(main) {
      body = h('tbody');
      setChildren(main,
        h('div', { class: 'page-head' }, h('h1', { text: 'Apps' })),
        h('div', { class: 'table-wrap' }, h('table', { class: 'grid' },
          h('thead', {}, h('tr', {},
            h('th', { text: 'app' }), h('th', { class: 'r', text: 'desired' }), h('th', { class: 'r', text: 'min' }), h('th', { class: 'r', text: 'max' }),
            h('th', { text: 'units by state' }), h('th', { text: 'policy' }), h('th', { class: 'r', text: 'serving' }), h('th', { text: 'last decision' }))),
          body)));
      this.update({ all: true });
    },
    update(d) {
      if (!(d.all || d.appSet || d.apps.size)) return;
      const apps = [...state.apps.values()].sort((a, b) => a.app.localeCompare(b.app));
      if (!apps.length) { setChildren(body, h('tr', {}, h('td', { colspan: 8, class: 'muted', text: state.loading ? 'loading…' : 'no apps' }))); return; }
      setChildren(body, apps.map((a) => {
        const s = a.summary || {};
        const last = (a.decisions || []).find((d) => !d.kind); // autoscaling: rebalance and rollout records have a kind
        const href = `#/apps/${encodeURIComponent(a.app)}`;
        return h('tr', { class: 'clickable', 'data-testid': 'app-row', 'data-app': a.app, on: { click: (e) => { if (e.target.tagName !== 'A') location.hash = href; } } },
          h('td', {}, h('a', { href, class: 'strong', text: a.app })),
          h('td', { class: 'r num', text: num(s.desired_units, 0) }),
          h('td', { class: 'r num muted', text: num(s.min_units, 0) }),
          h('td', { class: 'r num muted', text: num(s.max_units, 0) }),
          h('td', {}, s.unreachable ? unreachablePill(s) : unitCounts(s.units)),
          h('td', {}, s.unreachable ? h('span', { class: 'muted', text: '–' }) : policyText(s.autoscaling), s.autoscaling?.override ? h('span', { class: 'tag', text: `override ${s.autoscaling.override.floor}..${s.autoscaling.override.ceiling}` }) : null),
          h('td', { class: 'r num', text: servingText(a) }),
          h('td', {}, last ? [pill(last.action), ' ', h('span', { class: 'muted', text: `${reasonText(last.reason)} · ` }), agoEl(last.at_ms)] : h('span', { class: 'muted', text: '–' })));
      }));
    },
  };
}

/** "4 endpoints · 1.5 cores": what the route table and capacity say the app serves with. */
function servingText(a) {
  const n = a.routes?.routes?.length || 0;
  let cpu = 0;
  for (const p of Object.values(a.capacity?.by_priority || {})) cpu += Number(p.cpu_millis) || 0;
  return `${n} endpoint${n === 1 ? '' : 's'}${cpu ? ' · ' + cores(cpu) : ''}`;
}

// ---- one app ----------------------------------------------------------------------------------

export function appPage(name) {
  const ui = {};
  const openDecisions = new Set(); // which records the operator expanded (kept across updates)
  let chart = null, chartResize = null;
  let scaleTouched = false;
  let specLoaded = false;

  const page = {
    title: name,
    mount(main) {
      ui.main = main;
      ui.onGrant = () => ui.main.toggleAttribute('data-app-denied', !mayChangeApp(name));
      document.addEventListener('flotilla-grant', ui.onGrant);
      ui.head = h('div', { class: 'page-head' });
      ui.units = h('div');
      ui.routes = h('div');
      ui.policy = h('div');
      ui.decisions = h('div', { class: 'timeline' });
      ui.chart = h('div', { class: 'chart' });
      ui.scaleInput = h('input', { type: 'number', class: 'input num', 'data-testid': 'scale-input', step: 1, 'aria-label': 'units',
        on: { input: () => { scaleTouched = true; }, keydown: (e) => { if (e.key === 'Enter') scale(); } } });
      ui.scaleButton = h('button', { type: 'button', class: 'btn primary', 'data-testid': 'scale-button', 'data-scope': 'operate', 'data-app': name, text: 'Scale', on: { click: () => scale() } });
      ui.scaleHint = h('span', { class: 'muted' });
      ui.autoButton = h('button', { type: 'button', class: 'btn', 'data-scope': 'operate', 'data-app': name, text: 'Lift override', hidden: true, title: 'let the policy decide again ({"auto": true})', on: { click: () => liftOverride() } });
      ui.editor = new SpecEditor({});
      ui.applyButton = h('button', { type: 'button', class: 'btn primary', 'data-testid': 'apply-button', 'data-scope': 'deploy', 'data-app': name, text: 'Apply spec', on: { click: () => applySpec() } });
      ui.rollbackButton = h('button', { type: 'button', class: 'btn', 'data-testid': 'rollback-button', 'data-scope': 'operate', 'data-app': name, text: 'Roll back', disabled: true, on: { click: () => rollback() } });
      ui.reloadButton = h('button', { type: 'button', class: 'btn', text: 'Reload', title: 'load the current spec again (drops your edits)', on: { click: () => loadSpec(true) } });
      ui.specState = h('span', { class: 'muted' });
      ui.versions = new VersionsView(name, () => loadSpec(true));
      ui.rollout = new RolloutView(name);
      ui.events = new EventsList(`app=${encodeURIComponent(name)}`);
      ui.logs = new LogTail(name);
      ui.history = new HistoryChart(`${appPath(name)}/history`, APP_SERIES);
      setChildren(main,
        h('div', { class: 'crumbs' }, h('a', { href: '#/apps', text: 'Apps' }), ' / ', h('span', { text: name })),
        ui.head,
        h('div', { class: 'two-col' },
          h('section', { class: 'card' }, h('h2', { text: 'Scale' }),
            h('div', { class: 'controls' }, ui.scaleInput, ui.scaleButton, ui.autoButton), ui.scaleHint),
          h('section', { class: 'card' }, h('h2', { text: 'Autoscaling' }), ui.policy)),
        h('section', { 'data-testid': 'rollout' }, h('div', { class: 'section-head' }, h('h2', { text: 'Rollout' }),
          h('span', { class: 'muted', text: 'the last rollout; a canary\'s step, share and both versions\' numbers (flotilla rollout status)' })), ui.rollout.el),
        h('section', {}, h('div', { class: 'section-head' }, h('h2', { text: 'History' }),
          h('span', { class: 'muted', text: 'units and serving cores every 10 s, kept for a day; dashed marks are autoscaling decisions' })), ui.history.el),
        h('section', {}, h('div', { class: 'section-head' }, h('h2', { text: 'Capacity since this page opened' }), h('span', { class: 'muted', text: 'serving capacity (route weights × resources), from the live stream' })), ui.chart),
        h('section', {}, h('h2', { text: 'Decisions' }), ui.decisions),
        h('section', {}, h('div', { class: 'section-head' }, h('h2', { text: 'Events' }),
          h('span', { class: 'muted', text: 'what happened to this app, newest first (flotilla events --app)' })), ui.events.el),
        h('section', {}, h('h2', { text: 'Units' }), ui.units),
        h('section', {}, h('div', { class: 'section-head' }, h('h2', { text: 'Logs' }),
          h('span', { class: 'muted', text: 'a member\'s output, live (flotilla logs APP UNIT/MEMBER -f)' })), ui.logs.el),
        h('section', {}, h('h2', { text: 'Route weights' }), ui.routes),
        h('section', { class: 'card' },
          h('div', { class: 'section-head' }, h('h2', { text: 'Spec' }), ui.specState),
          ui.editor.el,
          h('div', { class: 'controls' }, ui.applyButton, ui.rollbackButton, ui.reloadButton)),
        h('section', {}, h('div', { class: 'section-head' }, h('h2', { text: 'Versions' }),
          h('span', { class: 'muted', text: 'every applied spec, newest first (the last 20)' })), ui.versions.el));
      loadSpec(false);
      ui.versions.load();
      ui.events.start();
      ui.history.start();
      this.update({ all: true });
    },
    update(d) {
      if (!(d.all || d.apps.has(name))) return;
      const a = state.apps.get(name);
      if (!a) {
        setChildren(ui.head, h('h1', { text: name }), h('p', { class: 'muted', text: state.loading ? 'loading…' : 'no such app (it may have been removed)' }));
        return;
      }
      ui.onGrant();
      renderHead(a);
      // Another operator (or an auto-revert) changed the spec in force: list it.
      const appliedAt = a.summary?.spec?.at_unix_ms;
      if (appliedAt && ui.appliedAt && appliedAt !== ui.appliedAt) ui.versions.load();
      ui.appliedAt = appliedAt;
      renderScale(a);
      ui.rollout.update(a.summary);
      renderPolicy(a);
      renderDecisions(a);
      renderUnits(a);
      renderRoutes(a);
      renderChart();
    },
    unmount() {
      document.removeEventListener('flotilla-grant', ui.onGrant);
      ui.main.removeAttribute('data-app-denied');
      ui.events.stop();
      ui.history.stop();
      ui.logs.stop();
      ui.rollout.stop();
      if (chart) chart.destroy();
      if (chartResize) chartResize.disconnect();
      chart = null;
    },
  };

  function renderHead(a) {
    const s = a.summary || {};
    setChildren(ui.head,
      h('h1', { text: name }),
      h('div', { class: 'summary-strip' },
        statBox('desired', num(s.desired_units, 0)),
        statBox('min', num(s.min_units, 0)),
        statBox('max', num(s.max_units, 0)),
        statBox('units', num(sum(s.units), 0)),
        h('div', { class: 'stat wide' }, h('div', { class: 'stat-value' }, unitCounts(s.units)), h('div', { class: 'stat-label', text: 'by state' })),
        s.scheduler_url ? statBox('scheduler', s.scheduler_url) : null),
      s.unreachable ? h('p', { class: 'muted', 'data-testid': 'app-unreachable' }, unreachablePill(s), ' ', s.error?.message || '') : null);
  }

  function renderScale(a) {
    const s = a.summary || {};
    ui.scaleInput.min = s.min_units ?? 0;
    ui.scaleInput.max = s.max_units ?? 0;
    // Follow the live value until the operator types; never clobber what they typed.
    if (!scaleTouched && document.activeElement !== ui.scaleInput) ui.scaleInput.value = s.desired_units ?? '';
    const auto = s.autoscaling;
    ui.autoButton.hidden = !(auto && auto.override);
    ui.scaleHint.textContent = auto
      ? `Autoscaled: a number pins the policy to it (floor = ceiling) until the override is lifted. Range ${s.min_units}..${s.max_units}.`
      : `Desired units, ${s.min_units}..${s.max_units}.`;
  }

  async function scale() {
    const s = state.apps.get(name)?.summary || {};
    let n = Math.round(Number(ui.scaleInput.value));
    if (!Number.isFinite(n) || ui.scaleInput.value === '') { toast('Enter a number of units', 'error'); return; }
    const lo = s.min_units ?? 0, hi = s.max_units ?? n;
    const clamped = Math.max(lo, Math.min(hi, n));
    if (clamped !== n) { ui.scaleInput.value = clamped; n = clamped; toast(`Clamped to ${lo}..${hi}: scaling to ${n}`, 'ok'); }
    ui.scaleButton.disabled = true;
    const r = await act('PUT', `${appPath(name)}/scale`, { units: n }, `scale ${name} to ${n}`);
    ui.scaleButton.disabled = false;
    if (r.ok) scaleTouched = false;
  }

  async function liftOverride() {
    await act('PUT', `${appPath(name)}/scale`, { auto: true }, `lift the override of ${name}`);
  }

  async function loadSpec(force) {
    if (specLoaded && !force) return;
    ui.specState.textContent = 'loading…';
    try {
      const resp = await read(`${appPath(name)}/spec`);
      ui.editor.value = await resp.text();
      const prev = (resp.headers.get('x-flotilla-has-previous') || '').toLowerCase() === 'true';
      ui.rollbackButton.disabled = !prev;
      ui.rollbackButton.title = prev ? 're-apply the spec this app had before its last apply' : 'no earlier spec to go back to';
      ui.specState.textContent = prev ? 'current spec · an earlier spec can be restored' : 'current spec';
      specLoaded = true;
    } catch (e) {
      ui.specState.textContent = `cannot load the spec: ${e.message}`;
    }
  }

  async function applySpec() {
    ui.editor.clearErrors();
    ui.applyButton.disabled = true;
    const r = await act('PUT', `${appPath(name)}/spec`, ui.editor.value, `apply the spec of ${name}`, { contentType: 'text/plain; charset=utf-8', quiet: true });
    ui.applyButton.disabled = false;
    if (r.ok) { await loadSpec(true); ui.versions.load(); return; }
    if (r.error.code === 'cancelled') return;
    if (r.error.code === 'invalid_spec') {
      ui.editor.showErrors(r.error.message);
      toast(`The spec was refused; ${name} keeps its old spec. See the errors under the editor.`, 'error');
    } else {
      toast(`apply the spec of ${name}: ${r.error.message}`, 'error');
    }
  }

  async function rollback() {
    if (!confirm(`Re-apply the spec ${name} had before its last apply?`)) return;
    const r = await act('POST', `${appPath(name)}/rollback`, undefined, `roll back ${name}`);
    if (r.ok) { await loadSpec(true); ui.versions.load(); }
  }

  function renderPolicy(a) {
    const au = a.summary?.autoscaling;
    if (!au) { setChildren(ui.policy, h('p', { class: 'muted', text: 'No policy: the desired units are what Scale sets.' })); return; }
    const rows = [
      ['policy', au.policy || '(the named policy is unknown)'],
      ['named policy', au.policy_name || '–'],
      ['override', au.override ? `floor ${au.override.floor}, ceiling ${au.override.ceiling} (set by scale)` : 'none: the policy decides within min..max'],
      ['demand', au.demand ? `${(au.demand.requests || []).map((r) => `${r.count} × ${resText(r.resources)}`).join(', ') || 'none'} (expires ${clock(au.demand.expires_unix_ms)})` : 'none'],
    ];
    const last = au.last_decision;
    setChildren(ui.policy,
      h('table', { class: 'kv' }, h('tbody', {}, rows.map(([k, v]) => h('tr', {}, h('th', { text: k }), h('td', { text: v }))))),
      last ? h('p', {}, h('span', { class: 'muted', text: 'last decision: ' }), pill(last.action), ' ', last.explanation || reasonText(last.reason)) : null);
  }

  function renderDecisions(a) {
    const list = a.decisions || [];
    if (!list.length) { setChildren(ui.decisions, h('p', { class: 'muted', text: a.summary?.autoscaling ? 'No decision yet.' : 'This app has no autoscaling policy, so no decisions.' })); return; }
    setChildren(ui.decisions, list.map((dec) => decisionView(dec, openDecisions)));
  }

  function renderUnits(a) {
    const units = a.units || [];
    if (!units.length) { setChildren(ui.units, h('p', { class: 'muted', text: 'No units.' })); return; }
    const byDomain = new Map();
    for (const u of units) {
      const d = u.domain || '(unplaced)';
      if (!byDomain.has(d)) byDomain.set(d, []);
      byDomain.get(d).push(u);
    }
    const groups = [...byDomain.entries()].sort((x, y) => x[0].localeCompare(y[0]));
    setChildren(ui.units, groups.map(([domain, list]) => {
      list.sort((x, y) => stateRank(x.state) - stateRank(y.state) || String(x.unit_id).localeCompare(String(y.unit_id)));
      const counts = {};
      for (const u of list) counts[u.state] = (counts[u.state] || 0) + 1;
      return h('div', { class: 'unit-group' },
        h('h3', {}, h('span', { text: domain }), h('span', { class: 'muted', text: ` · ${list.length} unit${list.length === 1 ? '' : 's'} ` }), unitCounts(counts)),
        h('table', { class: 'grid compact' },
          h('thead', {}, h('tr', {}, ['unit / member', 'group', 'node', 'state', 'address', 'usage', ''].map((c) => h('th', { text: c })))),
          list.map((u) => unitRows(u, (unit, member) => ui.logs.open(unit, member)))));
    }));
  }

  function renderRoutes(a) {
    const routes = a.routes?.routes || [];
    if (!routes.length) { setChildren(ui.routes, h('p', { class: 'muted', text: 'No routes: nothing serves yet.' })); return; }
    const total = routes.reduce((t, r) => t + (Number(r.weight) || 0), 0) || 1;
    const max = Math.max(...routes.map((r) => Number(r.weight) || 0)) || 1; // weights are fractions: scale to the largest
    const sorted = [...routes].sort((x, y) => (y.weight - x.weight) || String(x.endpoint).localeCompare(String(y.endpoint)));
    setChildren(ui.routes,
      h('p', { class: 'muted', text: `route table version ${a.routes.version ?? '–'} · ${routes.length} endpoints` }),
      h('table', { class: 'grid compact routes' },
        h('thead', {}, h('tr', {}, h('th', { text: 'endpoint' }), h('th', { text: 'node' }), h('th', { text: 'unit / member' }), h('th', { class: 'r', text: 'weight' }), h('th', { class: 'r', text: 'share' }), h('th', { class: 'bar-col wide' }))),
        h('tbody', {}, sorted.map((r) => h('tr', {},
          h('td', { class: 'mono', text: r.endpoint }),
          h('td', {}, nodeLink(r.node_id)),
          h('td', { class: 'mono muted', text: `${r.unit_id} / ${r.member}` }),
          h('td', { class: 'r num', text: num(r.weight, 3) }),
          h('td', { class: 'r num', text: `${num((r.weight / total) * 100, 1)} %` }),
          h('td', { class: 'bar-col wide' }, bar((Number(r.weight) || 0) / max, `weight ${r.weight}`, 'accent')))))));
  }

  function renderChart() {
    const hist = state.capacityHistory.get(name);
    const lib = chartLibrary(renderChart);
    if (lib !== 'ready') { setChildren(ui.chart, chartNote(lib)); return; }
    const data = chartData(hist);
    if (!chart) {
      if (!ui.chart.isConnected) return;
      ui.chart.replaceChildren();
      const cs = getComputedStyle(document.body);
      const ink = cs.getPropertyValue('--muted').trim() || '#666', grid = cs.getPropertyValue('--line').trim() || '#ddd';
      const axis = (o) => ({ stroke: ink, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 }, ...o });
      const stepped = window.uPlot.paths?.stepped ? window.uPlot.paths.stepped({ align: 1 }) : undefined;
      chart = new window.uPlot({
        width: Math.max(300, ui.chart.clientWidth || 600), height: 220,
        cursor: { drag: { x: true, y: false } },
        scales: { x: { time: true }, cores: { auto: true, range: (u, min, max) => [0, Math.max(1, max * 1.15)] }, gib: { auto: true, range: (u, min, max) => [0, Math.max(1, max * 1.15)] } },
        axes: [axis({}), axis({ scale: 'cores', label: 'cores · GPU · weight', size: 60 }), axis({ scale: 'gib', side: 1, label: 'GiB', grid: { show: false }, size: 60 })],
        series: [
          {},
          { label: 'CPU', scale: 'cores', stroke: '#2f6fdf', width: 2, paths: stepped, value: (u, v) => v == null ? '–' : `${num(v, 2)} cores` },
          { label: 'Memory', scale: 'gib', stroke: '#9b51e0', width: 2, paths: stepped, value: (u, v) => v == null ? '–' : `${num(v, 2)} GiB` },
          { label: 'GPU', scale: 'cores', stroke: '#e08a00', width: 2, paths: stepped, value: (u, v) => v == null ? '–' : num(v, 0) },
          { label: 'weight', scale: 'cores', stroke: '#26a65b', width: 1, dash: [4, 4], paths: stepped, value: (u, v) => v == null ? '–' : num(v, 3) },
        ],
      }, data, ui.chart);
      chartResize = new ResizeObserver(() => { if (chart && ui.chart.clientWidth) chart.setSize({ width: ui.chart.clientWidth, height: 220 }); });
      chartResize.observe(ui.chart);
    } else {
      chart.setData(data);
    }
  }

  return page;
}

/** uPlot columns from the history, extended to "now" so a flat line reaches the present. */
function chartData(hist) {
  const now = Date.now() / 1000;
  if (!hist || !hist.t.length) return [[now], [null], [null], [null], [null]];
  const ext = (a) => a.concat([a[a.length - 1]]);
  return [hist.t.concat([Math.max(now, hist.t[hist.t.length - 1] + 0.001)]), ext(hist.cpu), ext(hist.mem), ext(hist.gpu), ext(hist.weight)];
}

function statBox(label, value) {
  return h('div', { class: 'stat' }, h('div', { class: 'stat-value num', text: value }), h('div', { class: 'stat-label', text: label }));
}

export function nodeLink(id) {
  if (!id) return h('span', { class: 'muted', text: '–' });
  return h('a', { class: 'mono', href: `#/nodes/${encodeURIComponent(id)}`, text: id });
}

/** A unit's row and its members' rows; `onLogs(unit, member)` follows a placed member's logs. */
function unitRows(u, onLogs) {
  const extra = [
    u.secondary ? 'secondary' : null,
    u.generation != null ? `gen ${u.generation}` : null,
    u.template ? `template ${String(u.template).slice(0, 12)}` : null,
    u.replaced_by ? `replaced by ${u.replaced_by}` : null,
  ].filter(Boolean).join(' · ');
  return h('tbody', { class: 'unit' },
    h('tr', { class: 'unit-row', 'data-testid': 'unit-row', 'data-unit': u.unit_id, 'data-state': u.state },
      h('td', { class: 'mono strong', text: u.unit_id }),
      h('td', { class: 'muted', colspan: 2, text: extra }),
      h('td', {}, pill(u.state)),
      h('td', { colspan: 2, class: 'warn', text: u.unplaced_reason || '' })),
    (u.members || []).map((m) => h('tr', { class: 'member-row' },
      h('td', { class: 'mono indent', text: m.member }),
      // Its group, and which of the template's alternatives it runs as (none: the template).
      h('td', { text: m.alternative ? `${m.role} · alternative ${m.alternative}` : m.role }),
      h('td', {}, nodeLink(m.node_id)),
      h('td', {}, pill(m.state)),
      h('td', { class: 'mono', text: m.address || '–' }),
      h('td', { class: 'muted', text: m.usage ? resText(m.usage) : '' }),
      h('td', {}, m.node_id && u.state !== 'terminated'
        ? h('button', { type: 'button', class: 'btn small', 'data-testid': 'member-logs', 'data-member': `${u.unit_id}/${m.member}`, text: 'logs',
          on: { click: () => onLogs(u.unit_id, m.member) } })
        : null))));
}

// ---- decision records --------------------------------------------------------------------------

/** "cooldown (12 s left)" from a reason object `{kind, ...}`. */
export function reasonText(r) {
  if (!r) return '';
  if (typeof r === 'string') return r;
  const kind = String(r.kind || '').replace(/_/g, ' ');
  const bits = [];
  if (r.remaining_ms != null) bits.push(`${duration(r.remaining_ms)} left`);
  if (r.missing) bits.push(`missing ${r.missing}`);
  if (r.threshold != null) bits.push(`threshold ${num(r.threshold, 3)}`);
  return bits.length ? `${kind} (${bits.join(', ')})` : kind;
}

const unitsText = (u) => (u ? `${u.primary ?? 0}${u.secondary ? ` + ${u.secondary} secondary` : ''}` : '–');
const total = (u) => (u ? (u.primary || 0) + (u.secondary || 0) : 0);

/** One app decision record as an expandable entry of the timeline. Rebalance moves and
 * canary steps share the log (`kind`), with their time as `at` and only an explanation. */
function decisionView(dec, openSet) {
  if (dec.kind === 'rebalance' || dec.kind === 'rollout') {
    return h('details', { class: `decision a-${dec.action}`, 'data-testid': 'decision', 'data-kind': dec.kind },
      h('summary', {}, h('span', { class: 'mono muted', text: clock(dec.at) }), pill(dec.action),
        h('span', { class: 'reason', text: dec.kind }), h('span', { class: 'muted ellipsis', text: dec.explanation || '' })),
      h('div', { class: 'decision-body' }, h('pre', { class: 'explanation', text: dec.explanation || '' })));
  }
  const key = `${dec.at_ms}:${dec.action}:${total(dec.desired)}`;
  const change = total(dec.desired) - total(dec.current);
  const details = h('details', { class: `decision a-${dec.action}`, 'data-testid': 'decision', open: openSet.has(key),
    on: { toggle: () => { if (details.open) openSet.add(key); else openSet.delete(key); } } },
    h('summary', {},
      h('span', { class: 'mono muted', text: clock(dec.at_ms) }),
      pill(dec.action),
      h('span', { class: 'num strong', text: `${total(dec.current)} → ${total(dec.desired)}` }),
      change ? h('span', { class: change > 0 ? 'delta up' : 'delta down', text: change > 0 ? `+${change}` : String(change) }) : null,
      h('span', { class: 'reason', text: reasonText(dec.reason) }),
      h('span', { class: 'muted ellipsis', text: dec.explanation || '' })),
    h('div', { class: 'decision-body' },
      dec.explanation ? h('pre', { class: 'explanation', text: dec.explanation }) : null,
      h('div', { class: 'decision-cols' },
        h('table', { class: 'kv' }, h('tbody', {},
          kvRow('policy', [dec.policy, dec.policy_name].filter(Boolean).join(' · ')),
          kvRow('action', dec.action),
          kvRow('reason', reasonText(dec.reason)),
          kvRow('current units', unitsText(dec.current)),
          kvRow('desired units', unitsText(dec.desired)),
          dec.phase ? kvRow('phase', dec.phase) : null,
          dec.graceful_decommission_timeout_ms != null ? kvRow('drain timeout', duration(dec.graceful_decommission_timeout_ms)) : null,
          kvRow('at', new Date(dec.at_ms).toISOString()))),
        inputsTable(dec.inputs))));
  return details;
}

function kvRow(k, v) { return h('tr', {}, h('th', { text: k }), h('td', { text: v })); }

function inputsTable(inputs) {
  const entries = Object.entries(inputs || {});
  if (!entries.length) return h('p', { class: 'muted', text: 'no inputs' });
  return h('table', { class: 'kv inputs' },
    h('thead', {}, h('tr', {}, h('th', { text: 'input' }), h('th', { class: 'r', text: 'value' }))),
    h('tbody', {}, entries.map(([k, v]) => h('tr', {}, h('th', { class: 'mono', text: k }), h('td', { class: 'r num', text: typeof v === 'number' ? num(v, 4) : JSON.stringify(v) })))));
}
