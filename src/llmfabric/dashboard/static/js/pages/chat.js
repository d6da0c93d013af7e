// Chat playground: pick a model, optionally restrict providers (X-Fabric-Providers), and
// stream an answer from the same OpenAI endpoint consumers use; shows which node served.

import { h, mount, notice, field, fmtNum, fmtInt, shortId } from '../dom.js';
import { get, listOf, rawFetch, errorFrom, ApiError } from '../api.js';
import { readChatStream } from '../sse.js';
import { pageHeader } from './common.js';

// The conversation survives page switches within this tab (not reloads).
// A node decides how much it streams: the playground shows at most this much of an answer
// and then stops reading, so an endless answer from a hostile node cannot freeze the tab
// (an honest one of 32768 tokens is ~130k characters).
export const MAX_ANSWER_CHARS = 256 * 1024;
const state = { messages: [], model: '', providers: new Set() };

function render(view, ctx, params) {
  if (params.get('model')) state.model = params.get('model');
  const modelSelect = h('select', { required: true });
  const [modelField] = field('Model', modelSelect);
  const providerBox = h('div', { class: 'checks' }, h('span', { class: 'muted small' }, 'Loading providers…'));
  const providerSet = h('fieldset', { class: 'providers' },
    h('legend', {}, 'Trusted providers'),
    h('p', { class: 'hint', id: 'providers-hint' }, 'Tick none to allow any provider. Ticked: only those verified identities may see your prompt (sent as X-Fabric-Providers). A name is what a node claims; the identity beside it is what the fabric verified (its certificate, or its key fingerprint on networks joined with a shared secret).'),
    providerBox);
  const [maxField, maxInput] = field('Max tokens', h('input', { type: 'number', min: '1', max: '32768', step: '1', value: '256' }));
  const [tempField, tempInput] = field('Temperature', h('input', { type: 'number', min: '0', max: '2', step: '0.1', value: '0.7' }));
  const [sysField, sysInput] = field('System prompt (optional)', h('textarea', { rows: '2', placeholder: 'You are a helpful assistant.' }));
  // A log (polite live region): a new message is read out once; while an answer streams the
  // log is aria-busy, so screen readers wait and read the finished answer, not every token.
  const transcript = h('ol', { class: 'transcript', id: 'transcript', role: 'log', 'aria-live': 'polite',
    'aria-relevant': 'additions text', 'aria-label': 'Conversation' });
  const prompt = h('textarea', { id: 'chat-input', rows: '3', placeholder: 'Ask something…', required: true,
    'aria-describedby': 'chat-input-hint' });
  const send = h('button', { type: 'submit', id: 'chat-send' }, 'Send');
  const stop = h('button', { type: 'button', class: 'secondary', hidden: true }, 'Stop');
  const clear = h('button', { type: 'button', class: 'secondary', on: { click: () => {
    state.messages = [];
    drawTranscript();
    prompt.focus();
  } } }, 'Clear');
  const errorBox = h('div');
  let controller = null;
  // The model list's load. A message sent before it arrives (Enter right after opening the
  // page) waits for it instead of being told there is no model to talk to.
  let modelsLoaded = false;
  let waitingForModels = false;

  const composer = h('form', { class: 'composer', on: { submit: (e) => { e.preventDefault(); sendMessage(); } } },
    h('label', { for: 'chat-input', class: 'visually-hidden' }, 'Message'),
    prompt,
    h('div', { class: 'row-between' },
      h('small', { class: 'hint', id: 'chat-input-hint' }, 'Enter sends, Shift+Enter adds a line.'),
      h('div', { class: 'actions' }, clear, stop, send)));

  prompt.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); composer.requestSubmit(); }
  });
  stop.addEventListener('click', () => controller && controller.abort());
  modelSelect.addEventListener('change', () => { state.model = modelSelect.value; });

  mount(view,
    pageHeader('Chat playground', 'Try a model through the same OpenAI endpoint your code uses.'),
    h('div', { class: 'chat-layout' },
      h('aside', { class: 'card chat-settings', 'aria-label': 'Chat settings' },
        modelField, providerSet, h('div', { class: 'grid-fields two' }, maxField, tempField), sysField),
      h('section', { class: 'card chat-main', 'aria-label': 'Conversation' }, transcript, errorBox, composer)));

  function messageItem(m) {
    const meta = h('div', { class: 'meta small' });
    if (m.role === 'assistant') fillMeta(meta, m);
    return h('li', { class: `msg ${m.role}`, dataset: { role: m.role } },
      h('div', { class: 'who' }, m.role === 'user' ? 'You' : (m.model || 'assistant')),
      h('div', { class: 'text' }, m.content || (m.pending ? '…' : '')),
      meta);
  }

  function fillMeta(meta, m) {
    const bits = [];
    if (m.node) bits.push(['Served by node ', h('code', { class: 'served-by', title: m.node }, shortId(m.node, 12))]);
    if (m.ttftMs != null) bits.push(`first token ${fmtInt(m.ttftMs)} ms`);
    if (m.tokPerS) bits.push(`${fmtNum(m.tokPerS, 0)} tok/s`);
    if (m.usage) bits.push(`${fmtInt(m.usage.prompt_tokens)} in · ${fmtInt(m.usage.completion_tokens)} out`);
    if (m.stopped) bits.push('stopped');
    if (m.cut) bits.push(`cut: the playground shows ${fmtInt(MAX_ANSWER_CHARS)} characters of an answer`);
    mount(meta, bits.map((b, i) => [i ? ' · ' : '', b]));
  }

  function drawTranscript() {
    if (state.messages.length === 0) {
      mount(transcript, h('li', { class: 'empty muted' }, 'No messages yet. Pick a model and say hello.'));
      return;
    }
    mount(transcript, state.messages.map(messageItem));
    transcript.scrollTop = transcript.scrollHeight;
  }

  async function sendMessage() {
    if (!modelsLoaded) {
      if (waitingForModels) return; // sent twice while waiting: once is enough
      waitingForModels = true;
      try { await modelsReady; } finally { waitingForModels = false; }
      if (!ctx.alive) return;
    }
    mount(errorBox);
    const text = prompt.value.trim();
    if (!text) { prompt.focus(); return; }
    if (!modelSelect.value) { mount(errorBox, notice('error', 'No model to talk to: the catalog has no serving model.')); return; }
    state.model = modelSelect.value;
    const history = state.messages.filter((m) => !m.error).map((m) => ({ role: m.role, content: m.content }));
    const messages = [...(sysInput.value.trim() ? [{ role: 'system', content: sysInput.value.trim() }] : []),
      ...history, { role: 'user', content: text }];
    // Append (not redraw): a redrawn log would read the whole conversation out again.
    if (state.messages.length === 0) mount(transcript);
    const question = { role: 'user', content: text };
    state.messages.push(question);
    transcript.append(messageItem(question));
    const answer = { role: 'assistant', content: '', model: state.model, pending: true };
    state.messages.push(answer);
    prompt.value = '';
    transcript.setAttribute('aria-busy', 'true');
    const item = messageItem(answer);
    transcript.append(item);
    transcript.scrollTop = transcript.scrollHeight;
    const textEl = item.querySelector('.text');
    const metaEl = item.querySelector('.meta');
    const body = { model: state.model, messages, stream: true, stream_options: { include_usage: true } };
    if (maxInput.value) body.max_tokens = Number(maxInput.value);
    if (tempInput.value !== '') body.temperature = Number(tempInput.value);
    const headers = {};
    if (state.providers.size) headers['X-Fabric-Providers'] = [...state.providers].join(',');
    controller = ctx.controller();
    send.disabled = true;
    stop.hidden = false;
    const t0 = performance.now();
    let tFirst = null;
    // Deltas go into one text node (appendData), and the log scrolls once a frame: setting
    // textContent and reading scrollHeight per delta cost time quadratic in the answer.
    const textNode = document.createTextNode('');
    let scrolling = false;
    const scrollSoon = () => {
      if (scrolling) return;
      scrolling = true;
      window.requestAnimationFrame(() => { scrolling = false; transcript.scrollTop = transcript.scrollHeight; });
    };
    try {
      const resp = await rawFetch('/v1/chat/completions', { method: 'POST', body, headers, signal: controller.signal });
      answer.node = resp.headers.get('X-Fabric-Node') || '';
      fillMeta(metaEl, answer);
      if (!resp.ok) throw await errorFrom(resp);
      const result = await readChatStream(resp, (delta) => {
        if (answer.cut) return;
        if (tFirst === null) { tFirst = performance.now(); answer.ttftMs = tFirst - t0; textEl.replaceChildren(textNode); }
        const room = MAX_ANSWER_CHARS - answer.content.length;
        const part = delta.length > room ? delta.slice(0, room) : delta;
        answer.content += part;
        textNode.appendData(part);
        scrollSoon();
        if (part !== delta) { answer.cut = true; controller.abort(); }
      });
      answer.usage = result.usage;
      const secs = (performance.now() - (tFirst ?? t0)) / 1000;
      const outTokens = result.usage?.completion_tokens;
      if (outTokens && secs > 0) answer.tokPerS = outTokens / secs;
    } catch (err) {
      if (err && err.name === 'AbortError') {
        answer.stopped = !answer.cut;
      } else {
        answer.error = true;
        let msg = err.message || String(err);
        if (err instanceof ApiError && err.status === 401) msg = `${msg} Sign in with an API key on the Keys page.`;
        mount(errorBox, notice('error', h('strong', {}, 'The request failed. '), msg));
      }
    } finally {
      answer.pending = false;
      if (!answer.content) textEl.textContent = answer.error ? '(no answer)' : answer.stopped ? '(stopped)' : '(empty answer)';
      fillMeta(metaEl, answer);
      item.classList.toggle('failed', Boolean(answer.error));
      transcript.removeAttribute('aria-busy');
      send.disabled = false;
      stop.hidden = true;
      controller = null;
      if (ctx.alive) prompt.focus();
    }
  }

  async function loadModels() {
    try {
      let models;
      try {
        models = listOf(await get('/v1/fabric/models'), 'models');
      } catch (err) {
        if (!(err instanceof ApiError) || err.status !== 404) throw err;
        models = listOf(await get('/v1/models'), 'data').map((m) => ({ id: m.id, serving: 1 }));
      }
      if (!ctx.alive) return;
      const sorted = models.slice().sort((a, b) => (b.serving > 0) - (a.serving > 0) || a.id.localeCompare(b.id));
      mount(modelSelect, sorted.length === 0 ? h('option', { value: '' }, 'No models served yet')
        : sorted.map((m) => h('option', { value: m.id }, m.serving > 0 ? m.id : `${m.id} (unavailable)`)));
      if (state.model && sorted.some((m) => m.id === state.model)) modelSelect.value = state.model;
      state.model = modelSelect.value;
    } catch (err) {
      mount(modelSelect, h('option', { value: '' }, 'Could not load models'));
      mount(errorBox, notice('error', `Could not load the model list: ${err.message}`));
    }
  }

  async function loadProviders() {
    try {
      const providers = listOf(await get('/v1/fabric/providers'), 'providers');
      if (!ctx.alive) return;
      if (providers.length === 0) { mount(providerBox, h('span', { class: 'muted small' }, 'No providers known yet.')); return; }
      // One box per verified identity: a claimed name alone proves nothing (anyone can claim
      // it), so the allowlist carries what the fabric verified for the nodes behind it.
      const choices = providers.flatMap((p) => (p.verified || []).map((v) => ({ name: p.id, id: v })));
      if (choices.length === 0) { mount(providerBox, h('span', { class: 'muted small' }, 'No verified providers yet.')); return; }
      mount(providerBox, choices.map((c, i) => {
        const box = h('input', { type: 'checkbox', id: `prov-${i}`, value: c.id, checked: state.providers.has(c.id),
          'aria-describedby': 'providers-hint',
          on: { change: (e) => { if (e.target.checked) state.providers.add(c.id); else state.providers.delete(c.id); } } });
        const short = c.id.length > 16 ? `${c.id.slice(0, 12)}…` : c.id;
        return h('div', { class: 'check' }, box, h('label', { for: box.id, title: c.id }, c.name,
          h('span', { class: 'muted small' }, ` · ${short}`)));
      }));
    } catch (err) {
      mount(providerBox, h('span', { class: 'error-text small' }, `Could not load providers: ${err.message}`));
    }
  }

  drawTranscript();
  const modelsReady = loadModels().finally(() => { modelsLoaded = true; });
  loadProviders();
  prompt.focus();
}

export default { title: 'Chat', render };
