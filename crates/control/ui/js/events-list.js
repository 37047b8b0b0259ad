// The recorded events of the object a page shows (`GET /v1/events/history?app=` or
// `?node=`): the newest 20, newest first, asked for again every 5 s while the page is
// open. The live stream carries state; this is what happened to it.

import { h, setChildren, agoEl, clock } from './util.js';
import { readJson } from './api.js';

const EVERY_MS = 5000;

export class EventsList {
  /** `filter` is the query naming the object: `app=echo`, `node=node-1`. */
  constructor(filter) {
    this.filter = filter;
    this.el = h('div', { 'data-testid': 'events-list' });
    this.timer = null;
  }

  start() {
    this.load();
    this.timer = setInterval(() => this.load(), EVERY_MS);
  }

  stop() {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  async load() {
    let v;
    try { v = await readJson(`/v1/events/history?${this.filter}&limit=20`); }
    catch (e) { setChildren(this.el, h('p', { class: 'muted', text: `cannot load the events: ${e.message}` })); return; }
    const events = (v.events || []).slice().reverse();
    if (!events.length) { setChildren(this.el, h('p', { class: 'muted', text: 'No event recorded yet.' })); return; }
    setChildren(this.el, h('table', { class: 'grid compact' },
      h('thead', {}, h('tr', {}, ['when', 'type', 'event', 'by'].map((t) => h('th', { text: t })))),
      h('tbody', {}, events.map((e) => h('tr', { 'data-testid': 'event-row', 'data-type': e.type },
        h('td', { class: 'nowrap', title: clock(e.at_unix_ms) }, agoEl(e.at_unix_ms)),
        h('td', {}, h('span', { class: 'tag', text: e.type })),
        h('td', { text: e.message }),
        h('td', { class: 'muted', text: e.by || '' }))))));
  }
}
