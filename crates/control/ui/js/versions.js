// The versions of an app's spec on its page (`GET /v1/apps/{app}/versions`): who applied
// each and when, what it changed from the one before (a diff, opened per version), and a
// button to roll back to any earlier one (`POST …/rollback {"to": N}`).

import { h, setChildren, agoEl, clock } from './util.js';
import { act, readJson } from './api.js';

export class VersionsView {
  /** `onChange` runs after a rollback changed the spec in force (the page reloads it). */
  constructor(app, onChange) {
    this.app = app;
    this.onChange = onChange;
    this.open = new Set(); // versions whose diff the operator opened
    this.rows = [];
    this.el = h('div', { 'data-testid': 'versions' });
  }

  async load() {
    try {
      const v = await readJson(`/v1/apps/${encodeURIComponent(this.app)}/versions`);
      this.rows = v.versions || [];
      this.render();
    } catch (e) {
      setChildren(this.el, h('p', { class: 'muted', text: `cannot load the versions: ${e.message}` }));
    }
  }

  render() {
    if (!this.rows.length) { setChildren(this.el, h('p', { class: 'muted', text: 'No version recorded yet.' })); return; }
    setChildren(this.el, h('table', { class: 'grid versions' },
      h('thead', {}, h('tr', {}, ['version', 'applied', 'source', 'by', 'changes', ''].map((t) => h('th', { text: t })))),
      h('tbody', {}, this.rows.flatMap((r) => this.row(r)))));
  }

  row(r) {
    const changes = r.changes;
    const opened = this.open.has(r.version);
    const toggle = changes && changes.length
      ? h('button', { type: 'button', class: 'btn link', 'data-testid': `diff-toggle-${r.version}`, 'aria-expanded': String(opened),
        text: `${changes.length} change${changes.length === 1 ? '' : 's'} ${opened ? '▾' : '▸'}`,
        on: { click: () => { if (opened) this.open.delete(r.version); else this.open.add(r.version); this.render(); } } })
      : h('span', { class: 'muted', text: changes ? 'none' : 'the oldest kept' });
    const source = r.rollback_of ? `${r.source} of ${r.rollback_of}` : r.source;
    const back = r.in_force
      ? h('span', { class: 'pill s-alive', text: 'in force' })
      : h('button', { type: 'button', class: 'btn', 'data-testid': `rollback-to-${r.version}`, 'data-scope': 'operate', 'data-app': this.app, text: `Roll back to ${r.version}`,
        on: { click: () => this.rollback(r.version) } });
    const rows = [h('tr', { 'data-version': String(r.version) },
      h('td', { class: 'num', text: String(r.version) }),
      h('td', { title: clock(r.at_unix_ms) }, agoEl(r.at_unix_ms)),
      h('td', { text: source, title: r.reason || '' }),
      h('td', { text: r.by || '–' }),
      h('td', {}, toggle),
      h('td', { class: 'r' }, back))];
    if (opened && changes) {
      rows.push(h('tr', { class: 'diff-row' }, h('td', { colspan: '6' },
        h('ul', { class: 'diff', 'data-testid': `diff-${r.version}` }, changes.map(diffLine)))));
    }
    return rows;
  }

  async rollback(version) {
    if (!confirm(`Roll ${this.app} back to version ${version}? It becomes a new version and rolls out as an apply does.`)) return;
    const r = await act('POST', `/v1/apps/${encodeURIComponent(this.app)}/rollback`, { to: version }, `roll ${this.app} back to version ${version}`);
    if (r.ok) { await this.load(); this.onChange(); }
  }
}

/** One changed setting: removed (−), added (+) or changed (old → new). */
function diffLine(c) {
  if (c.before === undefined) return h('li', { class: 'add' }, h('code', { text: `+ ${c.path} = ${c.after}` }));
  if (c.after === undefined) return h('li', { class: 'del' }, h('code', { text: `− ${c.path} = ${c.before}` }));
  return h('li', { class: 'chg' }, h('code', { text: `${c.path}: ` }), h('code', { class: 'del', text: c.before }), ' → ', h('code', { class: 'add', text: c.after }));
}
