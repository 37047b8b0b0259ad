// A member's live tail (`GET /v1/apps/APP/units/UNIT/members/MEMBER/logs?follow=true`):
// its last lines, then each new one as the member writes it, read from the chunked answer
// as it comes. Logs take a token (they may hold what a member should show no one), so the
// first tail asks for one. Only the newest MAX_LINES stay on the page.

import { h, setChildren } from './util.js';
import { getToken, askToken, setToken, readJson } from './api.js';

const MAX_LINES = 1000;

export class LogTail {
  constructor(app) {
    this.app = app;
    this.el = h('div', { class: 'log-tail', 'data-testid': 'log-panel' },
      h('p', { class: 'muted', text: 'Choose "logs" on a member to follow what it writes.' }));
    this.abort = null;
  }

  /** Follows `stream` (stdout or stderr) of member `member` of unit `unit`, in place of any other. */
  async open(unit, member, stream = 'stdout') {
    this.stop();
    let token = getToken();
    // An API without tokens needs none; otherwise logs take one.
    const open = !token && await readJson('/v1/whoami').then((g) => g.open, () => false);
    if (!token && !open) token = await askToken(`The logs of ${unit}/${member} need the control plane's API token. It is kept in this tab only.`);
    if (!token && !open) return;
    const pre = h('pre', { class: 'log-lines', 'data-testid': 'log-tail', 'data-member': `${unit}/${member}` });
    const state = h('span', { class: 'muted', 'data-testid': 'log-state', text: 'connecting…' });
    const pick = (s) => h('button', { type: 'button', class: s === stream ? 'btn small primary' : 'btn small', text: s,
      on: { click: () => this.open(unit, member, s) } });
    setChildren(this.el,
      h('div', { class: 'section-head' },
        h('h3', { class: 'mono', text: `${unit}/${member}` }), pick('stdout'), pick('stderr'), state,
        h('span', { class: 'spacer' }),
        h('button', { type: 'button', class: 'btn small', text: 'close', on: { click: () => this.close() } })),
      pre);
    const abort = new AbortController();
    this.abort = abort;
    const path = `/v1/apps/${encodeURIComponent(this.app)}/units/${encodeURIComponent(unit)}/members/${encodeURIComponent(member)}/logs`;
    let resp;
    try {
      const headers = token ? { authorization: `Bearer ${token}` } : {};
      resp = await fetch(`${path}?stream=${stream}&tail=200&follow=true`, { headers, signal: abort.signal });
    } catch (e) {
      if (!abort.signal.aborted) state.textContent = `cannot reach the control plane: ${e.message}`;
      return;
    }
    if (!resp.ok) {
      let message = `${resp.status}`;
      try { message = (await resp.json()).error.message; } catch { /* not JSON */ }
      if (resp.status === 401) setToken('');
      state.textContent = message;
      state.className = 'warn';
      return;
    }
    state.textContent = 'following';
    const reader = resp.body.getReader();
    const text = new TextDecoder();
    let pending = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        pending += text.decode(value, { stream: true });
        const cut = pending.lastIndexOf('\n');
        if (cut < 0) continue;
        this.append(pre, pending.slice(0, cut).split('\n'));
        pending = pending.slice(cut + 1);
      }
      state.textContent = 'ended: the member stopped, or the stream broke (the last line says which)';
    } catch (e) {
      if (!abort.signal.aborted) state.textContent = `the stream broke: ${e.message}`;
    }
  }

  append(pre, lines) {
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    for (const l of lines) pre.appendChild(h('div', { class: 'log-line', text: l }));
    while (pre.childNodes.length > MAX_LINES) pre.removeChild(pre.firstChild);
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  stop() {
    if (this.abort) this.abort.abort();
    this.abort = null;
  }

  close() {
    this.stop();
    setChildren(this.el, h('p', { class: 'muted', text: 'Choose "logs" on a member to follow what it writes.' }));
  }
}
