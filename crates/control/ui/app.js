// Flotilla dashboard: entry point. Routes (#/federation, #/apps, #/apps/NAME, #/nodes,
// #/nodes/ID, #/pools), the top bar, and the frame loop that hands the stream's changes to
// the page on screen. Plain ES2020 modules, no build step; see js/ for the pieces.

import { state, connect, onFrame, onProgress, markAll } from './js/store.js';
import { askToken, getToken, onTokenChange, refreshGrant, setToken, toast } from './js/api.js';
import { federationPage } from './js/federation.js';
import { appsPage, appPage } from './js/apps.js';
import { nodesPage, nodePage } from './js/nodes.js';
import { poolsPage } from './js/pools.js';
import { num } from './js/util.js';

const main = document.getElementById('main');
let page = null;

/** The page for the current hash: [nav key, page object]. */
function route() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [pathPart, queryPart] = raw.split('?');
  const parts = pathPart.split('/').filter(Boolean).map((p) => { try { return decodeURIComponent(p); } catch { return p; } });
  const query = new URLSearchParams(queryPart || '');
  switch (parts[0]) {
    case 'apps': return ['apps', parts[1] ? appPage(parts.slice(1).join('/')) : appsPage()];
    case 'nodes': return ['nodes', parts[1] ? nodePage(parts.slice(1).join('/')) : nodesPage(query)];
    case 'pools': return ['pools', poolsPage()];
    default: return ['federation', federationPage()];
  }
}

function navigate() {
  if (page && page.unmount) page.unmount();
  const [key, next] = route();
  page = next;
  for (const a of document.querySelectorAll('.nav a')) {
    a.classList.toggle('active', a.dataset.page === key);
    if (a.dataset.page === key) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  document.title = `${page.title} · Flotilla`;
  main.replaceChildren();
  try { page.mount(main); } catch (e) { console.error('mount failed', e); }
  window.scrollTo(0, 0);
}

// The nodes page rewrites its own query (filters) with replaceState, which fires no
// hashchange, so only real navigation lands here.
window.addEventListener('hashchange', navigate);

// One render per animation frame, whatever the stream sent since the last one.
onFrame((dirty) => {
  if (dirty.conn || dirty.all) renderConn();
  if (dirty.all || dirty.nodeSet || dirty.nodes.size) document.querySelector('[data-testid="node-count"]').textContent = num(state.nodes.size, 0);
  // While a snapshot streams in, the pages would only draw half a picture: wait for its end.
  if (state.loading) return;
  document.getElementById('loading').hidden = true;
  if (page) page.update(dirty);
});

onProgress((loaded, total) => {
  const el = document.getElementById('loading');
  el.hidden = false;
  el.textContent = total ? `loading the snapshot: ${num(loaded, 0)} of ${num(total, 0)} nodes` : 'loading the snapshot…';
});

function renderConn() {
  const el = document.getElementById('conn');
  const text = state.conn === 'live' ? 'live' : state.conn === 'reconnecting' ? 'reconnecting' : 'connecting';
  el.dataset.state = text;
  document.getElementById('conn-status').textContent = text;
  el.title = text === 'live' ? 'receiving the live stream' : 'the live stream is down; the browser reconnects by itself';
}

// The API token control: shows whether a token is kept; opens the dialog (save / forget).
function renderTokenButton(has) {
  const b = document.getElementById('token-button');
  b.textContent = has ? 'API token ✓' : 'API token';
  b.title = has ? 'a token is kept for this tab; click to change or forget it' : 'set the API token actions need';
}
document.getElementById('token-button').addEventListener('click', async () => {
  const t = await askToken();
  if (t) toast('Token saved for this tab', 'ok');
});
onTokenChange(renderTokenButton);
renderTokenButton(!!getToken());
// Exposed for tests and the console: forget the token without the dialog.
window.flotillaForgetToken = () => setToken('');

navigate();
refreshGrant();
connect();
markAll();
