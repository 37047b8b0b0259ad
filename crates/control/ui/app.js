// Flotilla dashboard: entry point. Routes (#/federation, #/apps, #/apps/NAME, #/nodes,
// #/nodes/ID, #/pools), the top bar, and the frame loop that hands the stream's changes to
// the page on screen. Plain ES2020 modules, no build step; see js/ for the pieces.
//
// Only the federation page's modules are imported here (boot.js preloads exactly these):
// the other pages' are imported when first shown, and fetched ahead once the first
// snapshot is drawn, so the first paint does not wait for code it does not run.

import { state, connect, onFrame, onProgress, markAll } from './js/store.js';
import { askToken, getToken, onTokenChange, refreshGrant, setToken, toast } from './js/api.js';
import { federationPage } from './js/federation.js';
import { num } from './js/util.js';

const main = document.getElementById('main');
let page = null;

/** The other pages' modules. */
const load = {
  apps: () => import('./js/apps.js'),
  nodes: () => import('./js/nodes.js'),
  pools: () => import('./js/pools.js'),
};

/** The page for the current hash: [nav key, its module (a promise) or null, (module) => page object]. */
function route() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [pathPart, queryPart] = raw.split('?');
  const parts = pathPart.split('/').filter(Boolean).map((p) => { try { return decodeURIComponent(p); } catch { return p; } });
  const query = new URLSearchParams(queryPart || '');
  const rest = parts.slice(1).join('/');
  switch (parts[0]) {
    case 'apps': return ['apps', load.apps(), (m) => (rest ? m.appPage(rest) : m.appsPage())];
    case 'nodes': return ['nodes', load.nodes(), (m) => (rest ? m.nodePage(rest) : m.nodesPage(query))];
    case 'pools': return ['pools', load.pools(), (m) => m.poolsPage()];
    default: return ['federation', null, () => federationPage()];
  }
}

let navigations = 0;
async function navigate() {
  const n = ++navigations;
  const [key, module, make] = route();
  let mod = null;
  if (module) {
    try { mod = await module; } catch (e) { console.error('loading the page failed', e); toast('Could not load the page: reload to try again', 'error'); return; }
    if (n !== navigations) return; // navigated again meanwhile
  }
  if (page && page.unmount) page.unmount();
  page = make(mod);
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
  if (!fetchedAhead) {
    fetchedAhead = true;
    setTimeout(() => { for (const f of Object.values(load)) f().catch(() => {}); }, 0);
  }
});
let fetchedAhead = false;

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
