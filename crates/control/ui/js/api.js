// Talking to the control plane: reads (no token) and actions (Bearer token), the token
// modal, and the toast that reports every action's outcome.
//
// An action never changes the page's state: on success the stream brings the change, on
// refusal the server's error message is shown and nothing else happens.

import { h } from './util.js';

const TOKEN_KEY = 'flotilla.api-token';

export function getToken() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch { return ''; }
}
export function setToken(t) {
  try {
    if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
  } catch { /* storage disabled: the token lives for this call only */ }
  tokenListeners.forEach((fn) => fn(!!t));
}
const tokenListeners = [];
export function onTokenChange(fn) { tokenListeners.push(fn); }

// ---- what the token may do ----------------------------------------------------------------

let grant = null;
/** What the tab's token may do (`GET /v1/whoami`), or null: no token, or one the API does not know. */
export function currentGrant() { return grant; }

/**
 * Asks what the tab's token may do and marks the page so that controls it cannot use are
 * hidden (style.css: `[data-scope]` against `body[data-no-SCOPE]`). Without a token
 * nothing is hidden: the first action asks for one.
 */
export async function refreshGrant() {
  let g = null;
  if (getToken()) {
    try { g = await readJson('/v1/whoami'); } catch { g = null; }
    if (g && !g.name && !g.open) g = null; // a token the API does not know: show all, the action says why
  }
  grant = g;
  const has = (s) => !g || g.open || (g.scopes || []).includes(s) || (g.scopes || []).includes('admin');
  for (const s of ['operate', 'deploy', 'admin']) document.body.toggleAttribute(`data-no-${s}`, !has(s));
  document.body.toggleAttribute('data-apps-limited', !!(g && g.apps));
  // Pages that hide per app (a token limited to some apps) look again.
  document.dispatchEvent(new CustomEvent('flotilla-grant'));
}
onTokenChange(() => { refreshGrant(); });

/** Whether the token may change app `name` at all (a per-app token may not change others). */
export function mayChangeApp(name) { return !grant || !grant.apps || grant.apps.includes(name); }

// ---- toast -----------------------------------------------------------------------------

let toastTimer = null;
/**
 * Shows `text` in the toast; errors stay until dismissed, successes fade after 5 s. The
 * text element keeps the last message (and its kind) even once hidden.
 */
export function toast(text, kind = 'ok') {
  const wrap = document.getElementById('toast-wrap');
  const el = document.getElementById('toast');
  clearTimeout(toastTimer);
  el.dataset.kind = kind;
  wrap.dataset.kind = kind;
  el.textContent = text;
  wrap.hidden = false;
  wrap.setAttribute('role', kind === 'error' ? 'alert' : 'status');
  if (kind !== 'error') toastTimer = setTimeout(() => { wrap.hidden = true; }, 5000);
}
document.getElementById('toast-close').addEventListener('click', () => { document.getElementById('toast-wrap').hidden = true; });

// ---- token modal -------------------------------------------------------------------------

/**
 * Opens the token dialog. Resolves with the saved token, or '' when cancelled.
 * `reason` says why it is asked (e.g. the action waiting for it).
 */
export function askToken(reason) {
  return new Promise((resolve) => {
    const root = document.getElementById('modal-root');
    const input = h('input', {
      type: 'password', 'data-testid': 'token-input', autocomplete: 'off', spellcheck: 'false',
      placeholder: 'paste the API token', value: getToken(), class: 'input wide',
    });
    const close = (value) => { root.replaceChildren(); document.removeEventListener('keydown', onKey); resolve(value); };
    const save = () => {
      const t = input.value.trim();
      if (!t) { input.focus(); return; }
      setToken(t);
      close(t);
    };
    const onKey = (e) => { if (e.key === 'Escape') close(''); };
    document.addEventListener('keydown', onKey);
    const dialog = h('div', { class: 'modal', role: 'dialog', 'aria-modal': 'true', 'aria-labelledby': 'token-title' },
      h('h2', { id: 'token-title', text: 'API token' }),
      h('p', { class: 'muted', text: reason || 'Actions need the control plane\'s API token (the file api-token in its data directory). It is kept in this tab only.' }),
      h('form', { on: { submit: (e) => { e.preventDefault(); save(); } } },
        input,
        h('div', { class: 'modal-buttons' },
          getToken() ? h('button', { type: 'button', class: 'btn', text: 'Forget token', 'data-testid': 'token-forget', on: { click: () => { setToken(''); toast('Token forgotten', 'ok'); close(''); } } }) : null,
          h('span', { class: 'spacer' }),
          h('button', { type: 'button', class: 'btn', text: 'Cancel', on: { click: () => close('') } }),
          h('button', { type: 'submit', class: 'btn primary', text: 'Save', 'data-testid': 'token-save' }))));
    const backdrop = h('div', { class: 'backdrop', on: { mousedown: (e) => { if (e.target === backdrop) close(''); } } }, dialog);
    root.replaceChildren(backdrop);
    input.focus();
  });
}

// ---- HTTP --------------------------------------------------------------------------------

/** The server's `{"error": {"code", "message"}}`, or a stand-in built from the status. */
async function errorOf(resp) {
  const text = await resp.text().catch(() => '');
  try {
    const j = JSON.parse(text);
    if (j && j.error) return { code: j.error.code || String(resp.status), message: j.error.message || text, status: resp.status };
  } catch { /* not JSON */ }
  return { code: String(resp.status), message: text || `${resp.status} ${resp.statusText}`, status: resp.status };
}

/** A read (no token). Returns the Response; throws {code, message} when it is not ok. */
export async function read(path) {
  let resp;
  // Reads need no token, but with one the spec shows its secret env values.
  const headers = { accept: 'application/json, text/plain' };
  const token = getToken();
  if (token) headers.authorization = `Bearer ${token}`;
  try { resp = await fetch(path, { headers }); }
  catch (e) { throw { code: 'network', message: `cannot reach the control plane: ${e.message}` }; }
  if (!resp.ok) throw await errorOf(resp);
  return resp;
}

export async function readJson(path) { return (await read(path)).json(); }

/**
 * An action: asks for the token first if there is none, sends it as Bearer, and reports the
 * outcome in the toast. Resolves {ok: true, data} or {ok: false, error}.
 * `what` names the action for the messages ("scale echo to 3").
 */
export async function act(method, path, body, what, { contentType = 'application/json', quiet = false } = {}) {
  let token = getToken();
  if (!token) {
    token = await askToken(`"${what}" needs the control plane's API token. It is kept in this tab only.`);
    if (!token) return { ok: false, error: { code: 'cancelled', message: 'cancelled' } };
  }
  const headers = { authorization: `Bearer ${token}` };
  let payload;
  if (body !== undefined) {
    headers['content-type'] = contentType;
    payload = contentType === 'application/json' ? JSON.stringify(body) : body;
  }
  let resp;
  try { resp = await fetch(path, { method, headers, body: payload }); }
  catch (e) {
    const error = { code: 'network', message: `cannot reach the control plane: ${e.message}` };
    toast(`${what}: ${error.message}`, 'error');
    return { ok: false, error };
  }
  if (!resp.ok) {
    const error = await errorOf(resp);
    // A refused token is dropped so the next action asks for a good one.
    if (resp.status === 401) { setToken(''); error.message += ' (the token was forgotten; the next action asks for it)'; }
    if (!quiet) toast(`${what}: ${error.message}`, 'error');
    return { ok: false, error };
  }
  const text = await resp.text();
  let data = text;
  try { data = text ? JSON.parse(text) : null; } catch { /* plain text */ }
  toast(`${what}: done`, 'ok');
  return { ok: true, data, resp };
}
