// An app's canary rollout (`[rollout] strategy = "canary"`): the step and the new
// version's share of the requests, why it waits, both versions' error rate and p99 over
// the step (a chart since the page opened), and the promote and abort buttons
// (`POST …/rollout/promote|abort`, scope deploy).

import { h, setChildren, num, pill, chartLibrary, chartNote } from './util.js';
import { act } from './api.js';

const POINTS = 600;

export class RolloutView {
  constructor(app) {
    this.app = app;
    this.template = null;
    this.points = [[], [], [], [], []]; // t, new error %, stable error %, new p99, stable p99
    this.chart = null;
    this.info = h('div', { 'data-testid': 'rollout-info' });
    this.plot = h('div', { class: 'chart', 'data-testid': 'rollout-chart' });
    const path = (verb) => `/v1/apps/${encodeURIComponent(app)}/rollout/${verb}`;
    this.promote = h('button', { type: 'button', class: 'btn primary', 'data-testid': 'promote-button', 'data-scope': 'deploy', 'data-app': app, text: 'Promote',
      title: 'end the traffic shifting now: the rest rolls as a rolling update',
      on: { click: () => act('POST', path('promote'), undefined, `promote the canary of ${app}`) } });
    this.abort = h('button', { type: 'button', class: 'btn', 'data-testid': 'abort-button', 'data-scope': 'deploy', 'data-app': app, text: 'Abort',
      title: 'fail the canary now: the spec goes back to the last one that ran',
      on: { click: () => { if (confirm(`Abort the canary of ${app} and go back to the last spec that ran?`)) act('POST', path('abort'), undefined, `abort the canary of ${app}`); } } });
    this.controls = h('div', { class: 'controls' }, this.promote, this.abort);
    this.el = h('div', {}, this.info, this.controls, this.plot);
  }

  /** `summary`: the app's summary (`rollout`, `canary`). */
  update(summary) {
    const r = summary?.rollout, c = summary?.canary;
    const shifting = !!c;
    // `display`, not `hidden`: the stylesheet's flex layout of .controls wins over `hidden`.
    this.controls.style.display = shifting ? '' : 'none';
    this.plot.style.display = shifting ? '' : 'none';
    if (!r) { setChildren(this.info, h('p', { class: 'muted', text: 'No rollout yet.' })); return; }
    const state = String(r.state || '').replace('_', ' ');
    if (!shifting) {
      const how = r.canary ? (r.canary.promoted ? 'canary, promoted' : 'canary') : 'rolling';
      setChildren(this.info, h('p', {}, pill(state), ` template ${r.template} · ${how}`, r.reason ? h('span', { class: 'muted', text: ` · ${r.reason}` }) : null));
      return;
    }
    if (r.template !== this.template) { this.template = r.template; this.points = [[], [], [], [], []]; }
    const p = this.points;
    p[0].push(Date.now() / 1000);
    p[1].push(c.new.requests ? c.new.error_rate * 100 : null);
    p[2].push(c.stable.requests ? c.stable.error_rate * 100 : null);
    p[3].push(c.new.p99_ms ?? null);
    p[4].push(c.stable.p99_ms ?? null);
    if (p[0].length > POINTS) for (const a of p) a.shift();
    const side = (label, s) => h('tr', { 'data-testid': `rollout-${label}` },
      h('th', { text: label }), h('td', { class: 'r num', text: num(s.requests, 0) }), h('td', { class: 'r num', text: num(s.errors, 0) }),
      h('td', { class: 'r num', text: `${num(s.error_rate * 100, 2)} %` }), h('td', { class: 'r num', text: s.p99_ms == null ? '–' : `${num(s.p99_ms, 1)} ms` }));
    const steps = (c.steps || []).map((s, i) => h('span', { class: i + 1 === c.step ? 'tag strong' : 'tag', text: s }));
    setChildren(this.info,
      h('p', { 'data-testid': 'rollout-step' }, pill(state), ` canary of ${r.template}: step ${c.step} of ${(c.steps || []).length} `, steps,
        h('span', { class: 'strong', 'data-testid': 'rollout-share', text: ` · ${num(c.share * 100, 1)} % of requests` }),
        h('span', { class: 'muted', text: ` · ${c.routers} router${c.routers === 1 ? '' : 's'} reporting` })),
      c.waiting ? h('p', { class: 'muted', 'data-testid': 'rollout-waiting', text: `waits: ${c.waiting}` }) : null,
      h('table', { class: 'grid compact' },
        h('thead', {}, h('tr', {}, ['version', 'requests', 'errors', 'error rate', 'p99'].map((t, i) => h('th', { class: i ? 'r' : '', text: t })))),
        h('tbody', {}, side('new', c.new), side('stable', c.stable))));
    this.draw();
  }

  draw() {
    if (!this.plot.isConnected) return;
    const lib = chartLibrary(() => this.draw());
    if (lib !== 'ready') { setChildren(this.plot, chartNote(lib)); return; }
    if (!this.chart) {
      this.plot.replaceChildren();
      const cs = getComputedStyle(document.body);
      const ink = cs.getPropertyValue('--muted').trim() || '#666', grid = cs.getPropertyValue('--line').trim() || '#ddd';
      const axis = (o) => ({ stroke: ink, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 }, ...o });
      this.chart = new window.uPlot({
        width: Math.max(300, this.plot.clientWidth || 600), height: 200,
        scales: { x: { time: true }, pct: { auto: true, range: (u, min, max) => [0, Math.max(1, max * 1.15)] }, ms: { auto: true, range: (u, min, max) => [0, Math.max(1, max * 1.15)] } },
        axes: [axis({}), axis({ scale: 'pct', label: 'error rate %', size: 60 }), axis({ scale: 'ms', side: 1, label: 'p99 ms', grid: { show: false }, size: 60 })],
        series: [
          {},
          { label: 'new errors', scale: 'pct', stroke: '#d13434', width: 2, value: (u, v) => v == null ? '–' : `${num(v, 2)} %` },
          { label: 'stable errors', scale: 'pct', stroke: '#26a65b', width: 2, value: (u, v) => v == null ? '–' : `${num(v, 2)} %` },
          { label: 'new p99', scale: 'ms', stroke: '#e08a00', width: 1, dash: [4, 4], value: (u, v) => v == null ? '–' : `${num(v, 1)} ms` },
          { label: 'stable p99', scale: 'ms', stroke: '#2f6fdf', width: 1, dash: [4, 4], value: (u, v) => v == null ? '–' : `${num(v, 1)} ms` },
        ],
      }, this.points, this.plot);
    } else {
      this.chart.setData(this.points);
    }
  }

  stop() {
    if (this.chart) this.chart.destroy();
    this.chart = null;
  }
}
