// Keys: sign in with an API key; create (secret shown once), list and revoke keys.
// Admin keys see and manage every owner's keys. A key may carry an expiry and a model
// allowlist (docs/accounts.md "Expiry and model allowlists"): the form sends the expiry as
// typed, so the API's one parser (accounts/expiry.py) reads it, as it reads the CLI's.

import { h, mount, notice, tableWrap, badge, chip, field, fmtTime, fmtInt, announce } from '../dom.js';
import { get, post, del, listOf, ApiError, apiBase } from '../api.js';
import { pageHeader, errorNotice, filterSelect } from './common.js';
import { keyIdOf } from '../keyid.js';

/** The one-time secret in a create response, whatever the field is called. */
export function secretOf(body) {
  if (!body || typeof body !== 'object') return '';
  for (const name of ['secret', 'api_key', 'plaintext', 'token']) {
    if (typeof body[name] === 'string') return body[name];
  }
  if (typeof body.key === 'string') return body.key;
  if (body.key && typeof body.key === 'object') return secretOf(body.key);
  return '';
}

/** The model ids of a comma-separated list, trimmed, empty ones dropped; null when none
 * (the key then reaches every model, or its creator's own list for a non-admin). */
function parseModelList(text) {
  const ids = String(text || '').split(',').map((m) => m.trim()).filter(Boolean);
  return ids.length ? ids : null;
}

/** Whether key record `k` is past its expiry at `nowMs` (as ApiKey.expired: at or after it). */
function isExpired(k, nowMs = Date.now()) {
  return k.expires_at !== null && k.expires_at !== undefined && Number(k.expires_at) * 1000 <= nowMs;
}

// More allowed models than this fold into a <details> so a 256-model key keeps its row short.
const MODELS_SHOWN = 6;

function modelsCell(models) {
  if (!Array.isArray(models)) return h('td', { class: 'muted' }, 'all models');
  const chips = models.map((m) => [chip(m), ' ']);
  if (models.length <= MODELS_SHOWN) return h('td', {}, chips);
  return h('td', {}, h('details', {}, h('summary', {}, `${models.length} models`), chips));
}

function expiryCell(k, nowMs) {
  if (k.expires_at === null || k.expires_at === undefined) return h('td', { class: 'muted' }, 'never');
  return h('td', { class: 'nowrap' }, fmtTime(k.expires_at),
    isExpired(k, nowMs) ? [' ', badge('expired', 'bad')] : null);
}

function recordOf(body) {
  if (body && body.key && typeof body.key === 'object') return body.key;
  return body || {};
}

function signInForm(ctx) {
  const [keyField, keyInput] = field('API key',
    h('input', { type: 'password', name: 'api-key', autocomplete: 'off', required: true, spellcheck: 'false',
      placeholder: 'lf-…' }),
    'The key stays in this browser tab only (sessionStorage) and is sent as a bearer token.');
  const errorBox = h('div');
  const button = h('button', { type: 'submit' }, 'Sign in');
  const form = h('form', { class: 'card narrow', 'aria-labelledby': 'signin-title', on: {
    submit: async (e) => {
      e.preventDefault();
      mount(errorBox);
      button.disabled = true;
      button.textContent = 'Checking…';
      try {
        await ctx.signIn(keyInput.value);
        window.dispatchEvent(new HashChangeEvent('hashchange'));
      } catch (err) {
        const msg = err instanceof ApiError && err.status === 401
          ? 'That key was not accepted (401). Check that it was copied whole and has not been revoked.'
          : `Could not check the key: ${err.message}`;
        mount(errorBox, notice('error', msg));
        keyInput.focus();
      } finally {
        button.disabled = false;
        button.textContent = 'Sign in';
      }
    },
  } },
  h('h2', { id: 'signin-title' }, 'Sign in with an API key'),
  keyField, errorBox, h('div', { class: 'actions' }, button),
  h('p', { class: 'muted small' }, 'No key yet? An operator creates the first one with ',
    h('code', {}, 'llmfabric keys create --admin'), '.'));
  return form;
}

function render(view, ctx) {
  if (!ctx.session.key) {
    mount(view, pageHeader('API keys', 'Keys authenticate calls to the OpenAI-compatible endpoint.'), signInForm(ctx));
    return;
  }
  const isAdmin = () => Boolean(ctx.session.me && ctx.session.me.admin);
  const listBox = h('div', { class: 'results' }, h('p', { class: 'muted' }, 'Loading keys…'));
  const secretBox = h('div');
  const createError = h('div');
  const showRevoked = h('input', { type: 'checkbox', id: 'show-revoked' });
  const ownerFilter = filterSelect('Owner', 'All owners');
  ownerFilter.el.hidden = true;
  let keys = null;

  // ---- create ------------------------------------------------------------------------------
  const [nameField, nameInput] = field('Name', h('input', { type: 'text', required: true, maxlength: '100',
    placeholder: 'e.g. laptop, ci, notebook' }));
  const [ownerField, ownerInput] = field('Owner', h('input', { type: 'text', maxlength: '100' }),
    'Admins: who the key is for (required; "admin" is reserved for admin keys).');
  const [rpmField, rpmInput] = field('Requests / min', h('input', { type: 'number', min: '1', step: '1', inputmode: 'numeric' }), 'Empty: unlimited');
  const [tpmField, tpmInput] = field('Tokens / min', h('input', { type: 'number', min: '1', step: '1', inputmode: 'numeric' }), 'Empty: unlimited');
  const [expiresField, expiresInput] = field('Expires', h('input', { type: 'text', maxlength: '40', spellcheck: 'false',
    autocomplete: 'off', placeholder: 'e.g. 30d, 2027-01-31' }),
  'From now: 90m, 12h, 30d, 2w; or a UTC date 2027-01-31, or 2027-01-31T12:00:00Z. Empty: never (a non-admin’s new key keeps its own expiry).');
  const [modelsField, modelsInput] = field('Models', h('input', { type: 'text', spellcheck: 'false', autocomplete: 'off',
    placeholder: 'e.g. llama-3.1-8b, qwen3-1.7b' }),
  'Comma-separated model ids the key may use. Empty: all models (a non-admin’s new key keeps its own list).');
  const adminBox = h('input', { type: 'checkbox', id: 'new-key-admin' });
  const adminField = h('div', { class: 'field check' }, adminBox, h('label', { for: 'new-key-admin' }, 'Admin key (sees and manages all keys)'));
  const createButton = h('button', { type: 'submit' }, 'Create key');
  const adminOnly = h('div', { class: 'admin-only', hidden: !isAdmin() }, ownerField, adminField);

  const createForm = h('form', { class: 'card', 'aria-labelledby': 'create-title', on: { submit: async (e) => {
    e.preventDefault();
    mount(createError);
    const body = { name: nameInput.value.trim() };
    if (!body.name) { mount(createError, notice('error', 'Give the key a name.')); nameInput.focus(); return; }
    if (rpmInput.value) body.requests_per_min = Number(rpmInput.value);
    if (tpmInput.value) body.tokens_per_min = Number(tpmInput.value);
    if (expiresInput.value.trim()) body.expires_at = expiresInput.value.trim();
    const models = parseModelList(modelsInput.value);
    if (models) body.models = models;
    if (isAdmin()) {
      if (ownerInput.value.trim()) body.owner = ownerInput.value.trim();
      if (adminBox.checked) body.admin = true;
    }
    createButton.disabled = true;
    try {
      const resp = await post('/v1/fabric/keys', body);
      const secret = secretOf(resp);
      showSecret(secret, recordOf(resp));
      createForm.reset();
      await load();
    } catch (err) {
      mount(createError, errorNotice(err, 'create the key'));
    } finally {
      createButton.disabled = false;
    }
  } } },
  h('h2', { id: 'create-title' }, 'Create a key'),
  h('div', { class: 'grid-fields' }, nameField, rpmField, tpmField, expiresField, modelsField),
  adminOnly, createError, h('div', { class: 'actions' }, createButton));

  function showSecret(secret, rec) {
    if (!secret) {
      mount(secretBox, notice('error', 'The key was created but the server did not return its secret.'));
      return;
    }
    const out = h('input', { type: 'text', readonly: true, id: 'new-key-secret', value: secret,
      'aria-label': 'New API key', spellcheck: 'false', class: 'mono' });
    const copied = h('span', { class: 'muted small', role: 'status' });
    const copy = h('button', { type: 'button', on: { click: async () => {
      out.select();
      try { await navigator.clipboard.writeText(secret); copied.textContent = 'Copied.'; } catch {
        copied.textContent = 'Press Ctrl+C to copy the selected key.';
      }
    } } }, 'Copy');
    const panel = h('section', { class: 'card secret', 'aria-labelledby': 'secret-title', tabindex: '-1' },
      h('h2', { id: 'secret-title' }, `New key “${rec.name || ''}” created`),
      h('p', {}, h('strong', {}, 'Copy it now: it is shown only once. '), 'The fabric keeps only a hash of it.'),
      h('div', { class: 'copy-row' }, out, copy, copied),
      h('p', { class: 'small' }, 'Use it with any OpenAI client:'),
      h('pre', { class: 'snippet', tabindex: '0', 'aria-label': 'Example environment for OpenAI clients' },
        `export OPENAI_BASE_URL=${window.location.origin}${apiBase()}/v1\nexport OPENAI_API_KEY=${secret}`),
      h('div', { class: 'actions' }, h('button', { type: 'button', class: 'secondary',
        on: { click: () => { mount(secretBox); nameInput.focus(); } } }, 'Done, I saved it')));
    mount(secretBox, panel);
    panel.focus();
    out.select();
    announce('New key created. Copy it now; it is shown only once.');
  }

  // ---- list ----------------------------------------------------------------------------------
  function draw() {
    if (keys === null) return;
    const shown = keys.filter((k) => (showRevoked.checked || k.active !== false)
      && (!ownerFilter.value || k.owner === ownerFilter.value));
    if (keys.length === 0 || shown.length === 0) {
      mount(listBox, notice('empty', keys.length === 0 ? 'No keys yet.' : 'No active keys. Tick “Show revoked” to see the others.'));
      return;
    }
    const admin = isAdmin();
    const myId = keyIdOf(ctx.session.key);
    const now = Date.now();
    const cols = ['Name', 'Key', ...(admin ? ['Owner'] : []), 'Created', 'Expires', 'Models', 'Limits', 'Status', 'Actions'];
    mount(listBox, tableWrap('API keys', h('table', { class: 'data', id: 'keys-table' },
      h('caption', { class: 'visually-hidden' }, 'API keys'),
      h('thead', {}, h('tr', {}, cols.map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, shown.map((k) => {
        const actions = h('td', { class: 'nowrap' });
        const active = k.active !== false && !k.revoked_at;
        const expired = isExpired(k, now);
        if (active) mount(actions, revokeButton(k, actions));
        return h('tr', { dataset: { keyId: k.id, active: String(active), expired: String(expired) } },
          h('th', { scope: 'row' }, k.name || h('span', { class: 'muted' }, '(unnamed)'),
            k.id === myId ? [' ', badge('this session', 'info')] : null,
            k.admin ? [' ', badge('admin', 'warn')] : null),
          h('td', {}, h('code', {}, k.prefix || `lf-${k.id}-…`)),
          admin ? h('td', {}, k.owner) : null,
          h('td', { class: 'nowrap' }, fmtTime(k.created_at)),
          expiryCell(k, now),
          modelsCell(k.models),
          h('td', { class: 'small' },
            k.requests_per_min ? `${fmtInt(k.requests_per_min)} req/min` : 'unlimited req',
            h('br'), k.tokens_per_min ? `${fmtInt(k.tokens_per_min)} tok/min` : 'unlimited tokens'),
          h('td', {}, !active ? badge(`revoked ${fmtTime(k.revoked_at)}`, 'muted')
            : expired ? badge('expired', 'bad') : badge('active', 'ok')),
          actions);
      })))));
  }

  function revokeButton(k, cell) {
    return h('button', { type: 'button', class: 'small danger', 'aria-label': `Revoke key ${k.name || k.id}`,
      on: { click: () => {
        const confirmBtn = h('button', { type: 'button', class: 'small danger', 'aria-label': `Confirm revoking key ${k.name || k.id}`,
          on: { click: async () => {
            confirmBtn.disabled = true;
            try {
              await del(`/v1/fabric/keys/${encodeURIComponent(k.id)}`);
              announce(`Key ${k.name || k.id} revoked`);
              if (k.id === keyIdOf(ctx.session.key)) { ctx.signOut(); return; }
              await load();
            } catch (err) {
              mount(cell, h('span', { class: 'error-text small', role: 'alert' }, err.message), ' ', revokeButton(k, cell));
            }
          } } }, 'Confirm revoke');
        const cancel = h('button', { type: 'button', class: 'small secondary',
          on: { click: () => { mount(cell, revokeButton(k, cell)); cell.querySelector('button')?.focus(); } } }, 'Cancel');
        mount(cell, confirmBtn, ' ', cancel);
        confirmBtn.focus();
      } } }, 'Revoke');
  }

  async function load() {
    try {
      const body = await get('/v1/fabric/keys');
      if (!ctx.alive) return;
      keys = listOf(body, 'keys').slice().sort((a, b) => (b.created_at || 0) - (a.created_at || 0));
      ownerFilter.setOptions([...new Set(keys.map((k) => k.owner))].sort());
      showRole();
      draw();
    } catch (err) {
      if (!ctx.alive) return;
      if (err instanceof ApiError && err.status === 401) { ctx.signOut(); return; }
      mount(listBox, errorNotice(err, 'load the keys'));
    }
  }

  const subtitle = () => (isAdmin() ? 'You are an admin: you see and manage every owner’s keys.'
    : 'Your keys for the OpenAI-compatible endpoint.');
  const header = pageHeader('API keys', subtitle());
  /** Show what depends on being an admin; session.me may arrive after the first draw. */
  function showRole() {
    adminOnly.hidden = !isAdmin();
    ownerFilter.el.hidden = !isAdmin();
    const sub = header.querySelector('p');
    if (sub) sub.textContent = subtitle();
  }
  ctx.onSession(() => { showRole(); draw(); });

  showRevoked.addEventListener('change', draw);
  ownerFilter.select.addEventListener('input', draw);
  mount(view,
    header,
    secretBox,
    createForm,
    h('section', { class: 'card', 'aria-labelledby': 'list-title' },
      h('div', { class: 'row-between' }, h('h2', { id: 'list-title' }, 'Keys'),
        h('div', { class: 'actions' }, ownerFilter.el,
          h('div', { class: 'field check' }, showRevoked, h('label', { for: 'show-revoked' }, 'Show revoked')))),
      listBox));
  load();
}

export default { title: 'Keys', render };
