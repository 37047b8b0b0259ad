// The spec editor of the app page: a textarea over a backdrop that highlights lines, a
// line-number gutter, and the list of validation errors from a 422 `invalid_spec`.
//
// The server's message is "invalid app spec:\n  - unit.head.cpu: must be above 0\n  - ...":
// each line is `path: message`. We find the TOML line for each path by tracking the
// current [table] while scanning: `cpu = ...` under `[unit.head]` is `unit.head.cpu`.

import { h, setChildren } from './util.js';

/** Splits the server's message into [{path, message, text}], one per listed problem. */
export function parseSpecErrors(message) {
  const lines = String(message || '').split('\n').map((l) => l.trim()).filter(Boolean);
  const items = lines.filter((l) => l.startsWith('- ')).map((l) => l.slice(2));
  // Not a list (e.g. a TOML syntax error, or "the spec names app ..."): one error, whole text.
  if (!items.length) return [{ path: null, message: String(message || ''), text: String(message || '') }];
  return items.map((text) => {
    // The path is the leading dotted word: "unit.head.cpu: ..." or "units.min (3) is above ...".
    const m = /^([A-Za-z_][\w-]*(?:\[\d+\])?(?:\.[\w-]+(?:\[\d+\])?)*)(:\s*|\s)(.*)$/.exec(text);
    return m ? { path: m[1], message: m[3], text } : { path: null, message: text, text };
  });
}

/** Each key line of a TOML document with its full dotted path: [{line (0-based), path, key}]. */
export function tomlKeyLines(text) {
  const out = [];
  let table = '';
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const l = lines[i].replace(/#.*$/, '').trim();
    if (!l) continue;
    let m = /^\[\[?\s*([^\]]+?)\s*\]\]?$/.exec(l);
    if (m) {
      table = m[1].replace(/\s*\.\s*/g, '.').replace(/"/g, '');
      out.push({ line: i, path: table, key: table.split('.').pop(), header: true });
      continue;
    }
    m = /^("?)([\w.-]+)\1\s*=/.exec(l);
    if (m) {
      const key = m[2];
      out.push({ line: i, path: table ? `${table}.${key}` : key, key: key.split('.').pop(), header: false });
    }
  }
  return out;
}

/**
 * The line (0-based) an error's path points at, or -1: the exact key, else a key with the
 * same last segment (preferring one in the same table), else the table itself, else the
 * line a TOML syntax error names.
 */
export function lineForError(err, keys) {
  if (err.path) {
    const path = err.path.replace(/\[\d+\]/g, '');
    const exact = keys.find((k) => k.path === path);
    if (exact) return exact.line;
    const last = path.split('.').pop();
    const parent = path.split('.').slice(0, -1).join('.');
    const sameTable = keys.find((k) => !k.header && k.key === last && k.path.startsWith(parent));
    if (sameTable) return sameTable.line;
    const anyKey = keys.find((k) => !k.header && k.key === last);
    if (anyKey) return anyKey.line;
    // A whole table (e.g. "unit.head: command, args and env are ... bytes"), or its parent.
    for (let p = path; p; p = p.split('.').slice(0, -1).join('.')) {
      const t = keys.find((k) => k.header && k.path === p);
      if (t) return t.line;
    }
  }
  const m = /line (\d+)/.exec(err.text || '');
  return m ? Number(m[1]) - 1 : -1;
}

export class SpecEditor {
  constructor({ onApply }) {
    this.errorLines = new Map(); // line → [messages]
    this.textarea = h('textarea', {
      class: 'spec-text', 'data-testid': 'spec-editor', spellcheck: 'false', wrap: 'off',
      autocomplete: 'off', 'aria-label': 'app spec (TOML)',
      on: { input: () => this.sync(), scroll: () => this.syncScroll() },
    });
    this.backdrop = h('div', { class: 'spec-backdrop', 'aria-hidden': 'true' });
    this.gutter = h('div', { class: 'spec-gutter', 'aria-hidden': 'true' });
    this.errors = h('ul', { class: 'spec-errors' });
    this.el = h('div', { class: 'spec-editor' },
      h('div', { class: 'spec-frame' }, this.gutter, h('div', { class: 'spec-area' }, this.backdrop, this.textarea)),
      this.errors);
    this.onApply = onApply;
  }

  get value() { return this.textarea.value; }
  set value(v) { this.textarea.value = v; this.clearErrors(); }

  clearErrors() { this.errorLines = new Map(); this.errors.replaceChildren(); this.sync(); }

  /** Shows the server's refusal: each error listed, and its line highlighted. */
  showErrors(message) {
    const errs = parseSpecErrors(message);
    const keys = tomlKeyLines(this.textarea.value);
    this.errorLines = new Map();
    const items = errs.map((e) => {
      const line = lineForError(e, keys);
      if (line >= 0) {
        if (!this.errorLines.has(line)) this.errorLines.set(line, []);
        this.errorLines.get(line).push(e.text);
      }
      return h('li', { class: 'spec-error', 'data-testid': 'spec-error', 'data-path': e.path || '', 'data-line': line >= 0 ? line + 1 : '' },
        line >= 0 ? h('button', { type: 'button', class: 'link', text: `line ${line + 1}`, on: { click: () => this.goTo(line) } }) : null,
        e.path ? h('code', { text: e.path }) : null,
        h('span', { text: e.path ? e.message : e.text }));
    });
    setChildren(this.errors, items);
    this.sync();
    const first = [...this.errorLines.keys()].sort((a, b) => a - b)[0];
    if (first !== undefined) this.goTo(first, false);
  }

  /** Scrolls to a line and selects it. */
  goTo(line, focus = true) {
    const lines = this.textarea.value.split('\n');
    let start = 0;
    for (let i = 0; i < line && i < lines.length; i++) start += lines[i].length + 1;
    const lh = parseFloat(getComputedStyle(this.textarea).lineHeight) || 18;
    this.textarea.scrollTop = Math.max(0, line * lh - this.textarea.clientHeight / 3);
    if (focus) { this.textarea.focus(); this.textarea.setSelectionRange(start, start + (lines[line] || '').length); }
    this.syncScroll();
  }

  /** Redraws the backdrop and gutter: one row per line, error lines marked. */
  sync() {
    const lines = this.textarea.value.split('\n');
    const rows = [], nums = [];
    for (let i = 0; i < lines.length; i++) {
      const msgs = this.errorLines.get(i);
      // The backdrop carries the text invisibly so wide lines size it like the textarea.
      rows.push(h('div', { class: msgs ? 'spec-line err' : 'spec-line', text: lines[i] || ' ' }));
      nums.push(h('div', { class: msgs ? 'err' : '', title: msgs ? msgs.join('\n') : null, text: String(i + 1) }));
    }
    this.backdrop.replaceChildren(...rows);
    this.gutter.replaceChildren(...nums);
    this.syncScroll();
  }

  syncScroll() {
    this.backdrop.style.transform = `translate(${-this.textarea.scrollLeft}px, ${-this.textarea.scrollTop}px)`;
    this.gutter.scrollTop = this.textarea.scrollTop;
  }
}
