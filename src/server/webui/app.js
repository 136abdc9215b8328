// posttrainllm serve's chat page: conversations kept in this browser (localStorage), replies
// streamed from /v1/chat/completions, the server's state from /metrics. Model output is untrusted:
// markdown is rendered with raw HTML escaped, then sanitized by DOMPurify before it reaches the DOM.
'use strict';

const STORE = 'ptllm.webui.conversations';
const CURRENT = 'ptllm.webui.current';
const KEY = 'ptllm.webui.apiKey';

const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};

let conversations = [];
let current = null;        // the conversation shown
let generating = null;     // {controller, conv} while a reply streams
let modelId = '';
let apiKey = localStorage.getItem(KEY) || '';

// ---- errors: shown in a banner, never a blank page ----

function showError(text) {
  $('banner-text').textContent = text;
  $('banner').hidden = false;
}
function clearError() { $('banner').hidden = true; }
window.addEventListener('error', (e) => showError('page error: ' + (e.message || e)));
window.addEventListener('unhandledrejection', (e) => showError('page error: ' + (e.reason && e.reason.message || e.reason)));

// ---- storage ----

function load() {
  try {
    conversations = JSON.parse(localStorage.getItem(STORE) || '[]');
    if (!Array.isArray(conversations)) conversations = [];
  } catch (e) {
    conversations = [];
    showError('the saved conversations could not be read (' + e.message + '); starting afresh');
  }
  current = conversations.find((c) => c.id === localStorage.getItem(CURRENT)) || conversations[0] || null;
}
function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify(conversations));
    if (current) localStorage.setItem(CURRENT, current.id);
  } catch (e) {
    showError('the conversations could not be saved in this browser: ' + e.message);
  }
}
function newConversation() {
  const prev = current;
  const c = {
    id: 'c' + Date.now().toString(36) + Math.random().toString(36).slice(2, 8),
    title: 'New chat',
    created: Date.now(),
    // A new conversation starts with the settings of the one shown.
    system: prev ? prev.system : '',
    settings: prev ? { ...prev.settings } : { temperature: '', top_p: '', max_tokens: '', seed: '' },
    tools: prev ? prev.tools : '',
    schema: prev ? { ...prev.schema } : { on: false, name: 'answer', text: '' },
    messages: [],
  };
  conversations.unshift(c);
  current = c;
  save();
  renderAll();
  $('input').focus();
}

// ---- the server ----

function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  if (apiKey) h.Authorization = 'Bearer ' + apiKey;
  return h;
}

// The error of a non-2xx answer as text (the server's OpenAI-shaped error, or the status).
async function errorText(res) {
  let msg = '';
  try {
    const body = await res.json();
    msg = body && body.error && (body.error.message || JSON.stringify(body.error));
  } catch (_) { /* not JSON */ }
  return `${res.status} ${res.statusText || ''}`.trim() + (msg ? ': ' + msg : '');
}

function unreachable(e) {
  return `cannot reach the server at ${location.origin} (${e.message}): is posttrainllm serve running?`;
}

// A 401: ask for the key.
function needKey(reason) {
  $('key-reason').textContent = reason;
  $('key-input').value = '';
  if (!$('key-dialog').open) $('key-dialog').showModal();
}

async function checkServer() {
  try {
    const res = await fetch('/v1/models', { headers: headers(false) });
    if (res.status === 401) {
      const text = await errorText(res);
      showError(text);
      needKey(apiKey ? 'The API key was refused (' + text + '). Enter the server\'s key.' : 'This server needs an API key.');
      return false;
    }
    if (!res.ok) { showError('/v1/models: ' + await errorText(res)); return false; }
    const body = await res.json();
    modelId = body.data && body.data[0] ? body.data[0].id : '';
    $('model-name').textContent = modelId || 'posttrainllm';
    document.title = (modelId ? modelId + ' - ' : '') + 'posttrainllm';
    return true;
  } catch (e) {
    showError(unreachable(e));
    return false;
  }
}

// ---- the status panel (/metrics, Prometheus text) ----

function parseMetrics(text) {
  const m = {};
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const sp = line.lastIndexOf(' ');
    m[line.slice(0, sp)] = Number(line.slice(sp + 1));
  }
  return m;
}

let statusTimer = null;
async function refreshStatus() {
  const body = $('status-body');
  const rows = [];
  try {
    const res = await fetch('/metrics', { headers: headers(false) });
    if (!res.ok) {
      rows.push(['state', await errorText(res)]);
    } else {
      const m = parseMetrics(await res.text());
      const n = (k) => (m[k] === undefined ? '?' : m[k]);
      rows.push(['state', 'up']);
      rows.push(['sequences', `${n('ptllm_requests_running')} running of ${n('ptllm_parallel_slots')}`]);
      rows.push(['queue', `${n('ptllm_requests_queued')} waiting`]);
      rows.push(['KV blocks', `${n('ptllm_kv_blocks_used')} used of ${n('ptllm_kv_blocks_total')}`]);
      rows.push(['shared', String(n('ptllm_kv_blocks_shared'))]);
      rows.push(['cached', String(n('ptllm_kv_blocks_cached'))]);
      rows.push(['free', String(n('ptllm_kv_blocks_free'))]);
      const ratio = m.ptllm_prefix_cache_hit_ratio;
      rows.push(['prompt cache hits', ratio === undefined ? '?' : (100 * ratio).toFixed(1) + '%']);
      rows.push(['requests', `${n('ptllm_requests_finished_total')} done, ${n('ptllm_requests_cancelled_total')} cancelled`]);
    }
  } catch (e) {
    rows.push(['state', 'unreachable']);
  }
  body.replaceChildren();
  for (const [k, v] of rows) {
    body.append(el('dt', '', k), el('dd', '', v));
  }
}
function startStatus() {
  if (statusTimer) clearInterval(statusTimer);
  refreshStatus();
  statusTimer = setInterval(() => { if (!document.hidden) refreshStatus(); }, 2000);
}

// ---- rendering ----

const escapeHtml = (s) => s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));

let markdownReady = false;
function setupMarkdown() {
  if (!window.marked || !window.DOMPurify || !window.hljs) {
    showError('the markdown libraries did not load: replies are shown as plain text');
    return;
  }
  marked.setOptions({ gfm: true, breaks: true, headerIds: false, mangle: false });
  marked.use({
    renderer: {
      // Raw HTML in a reply is shown as the text it is, not interpreted.
      html(html) { return escapeHtml(html); },
      code(code, lang) {
        const name = (lang || '').trim().split(/\s+/)[0].toLowerCase();
        let body;
        try {
          body = name && hljs.getLanguage(name) ? hljs.highlight(name, code, true).value : escapeHtml(code);
        } catch (_) {
          body = escapeHtml(code);
        }
        return `<pre><code class="hljs${name ? ' language-' + escapeHtml(name) : ''}">${body}</code></pre>`;
      },
    },
  });
  // Links open in a new tab and tell the other site nothing.
  DOMPurify.addHook('afterSanitizeAttributes', (node) => {
    if (node.tagName === 'A') {
      node.setAttribute('target', '_blank');
      node.setAttribute('rel', 'noopener noreferrer');
    }
  });
  markdownReady = true;
}

function renderMarkdown(target, text) {
  if (!markdownReady) {
    target.textContent = text;
    return;
  }
  const html = DOMPurify.sanitize(marked.parse(text), { USE_PROFILES: { html: true } });
  target.innerHTML = html;
  for (const pre of target.querySelectorAll('pre')) {
    const copy = el('button', 'copy', 'Copy');
    copy.type = 'button';
    copy.addEventListener('click', () => copyText(pre.querySelector('code').textContent, copy));
    pre.prepend(copy);
  }
}

async function copyText(text, button) {
  try {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
    } else {  // plain http to another host: no clipboard API
      const ta = el('textarea');
      ta.value = text;
      document.body.append(ta);
      ta.select();
      document.execCommand('copy');
      ta.remove();
    }
    button.textContent = 'Copied';
  } catch (e) {
    button.textContent = 'Copy failed';
  }
  setTimeout(() => { button.textContent = 'Copy'; }, 1500);
}

function renderList() {
  const list = $('conversations');
  list.replaceChildren();
  for (const c of conversations) {
    const li = el('li', c === current ? 'active' : '');
    li.dataset.id = c.id;
    const title = el('button', 'title', c.title || 'Untitled');
    title.type = 'button';
    title.addEventListener('click', () => {
      if (generating) return showError('wait for the reply or stop it before switching conversations');
      current = c;
      save();
      renderAll();
    });
    const rename = el('button', 'rename', '✎');
    rename.type = 'button';
    rename.title = 'Rename';
    rename.setAttribute('aria-label', 'Rename');
    rename.addEventListener('click', () => {
      const t = prompt('Name of the conversation', c.title);
      if (t !== null && t.trim()) {
        c.title = t.trim();
        save();
        renderList();
      }
    });
    const del = el('button', 'delete', '×');
    del.type = 'button';
    del.title = 'Delete';
    del.setAttribute('aria-label', 'Delete');
    del.addEventListener('click', () => {
      if (generating && generating.conv === c) return showError('stop the reply before deleting its conversation');
      if (!confirm(`Delete "${c.title}"?`)) return;
      conversations = conversations.filter((x) => x !== c);
      if (current === c) current = conversations[0] || null;
      save();
      renderAll();
    });
    li.append(title, rename, del);
    list.append(li);
  }
}

function statsText(s) {
  const parts = [];
  if (s.prompt_tokens !== undefined) parts.push(`prompt ${s.prompt_tokens} tokens, ${s.cached_tokens ?? 0} cached`);
  if (s.completion_tokens !== undefined) parts.push(`${s.completion_tokens} generated`);
  else if (s.received) parts.push(`${s.received} pieces received`);
  if (s.ttft_ms !== undefined) parts.push(`TTFT ${s.ttft_ms.toFixed(0)} ms`);
  if (s.tok_s !== undefined) parts.push(`${s.tok_s.toFixed(1)} tok/s`);
  if (s.finish) parts.push(s.finish);
  return parts.join(' · ');
}

// The bubble of message i of the current conversation.
function renderMessage(m, i) {
  const box = el('div', 'message ' + m.role);
  box.dataset.index = i;
  const who = el('div', 'role', m.role === 'tool' ? 'tool result' : m.role);
  box.append(who);
  if (m.reasoning_content) {
    const d = el('details', 'reasoning');
    d.append(el('summary', '', 'Reasoning'), el('div', 'reasoning-text', m.reasoning_content));
    box.append(d);
  }
  const body = el('div', 'content');
  if (m.role === 'assistant') renderMarkdown(body, m.content || '');
  else body.textContent = m.content || '';
  if (m.role === 'tool') body.classList.add('tool-result');
  box.append(body);
  for (const call of m.tool_calls || []) box.append(renderCall(m, call));
  if (m.error) box.append(el('div', 'error', m.error));
  if (m.stats) box.append(el('div', 'stats', statsText(m.stats)));
  return box;
}

// A tool call, and a box for its result while the conversation waits for one.
function renderCall(m, call) {
  const box = el('div', 'tool-call');
  box.append(el('div', 'call-head', 'call ' + call.function.name));
  let args = call.function.arguments || '';
  try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (_) { /* shown as sent */ }
  box.append(el('pre', 'call-args', args));
  const answered = current.messages.some((x) => x.role === 'tool' && x.tool_call_id === call.id);
  if (!answered && !generating && current.messages[current.messages.length - 1] === m) {
    const form = el('form', 'tool-answer');
    const ta = el('textarea');
    ta.rows = 2;
    ta.placeholder = 'the result of ' + call.function.name;
    const b = el('button', '', 'Send result');
    b.type = 'submit';
    form.append(ta, b);
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      addToolResult(m, call, ta.value);
    });
    box.append(form);
  }
  return box;
}

function renderMessages() {
  const box = $('messages');
  box.replaceChildren();
  if (!current || current.messages.length === 0) {
    box.append(el('p', 'empty', 'Send a message to start. Conversations stay in this browser.'));
    return;
  }
  current.messages.forEach((m, i) => box.append(renderMessage(m, i)));
  box.scrollTop = box.scrollHeight;
}

function renderSettings() {
  const c = current;
  $('set-system').value = c ? c.system : '';
  $('set-temperature').value = c ? c.settings.temperature : '';
  $('set-top-p').value = c ? c.settings.top_p : '';
  $('set-max-tokens').value = c ? c.settings.max_tokens : '';
  $('set-seed').value = c ? c.settings.seed : '';
  $('set-tools').value = c ? c.tools : '';
  $('set-schema-on').checked = c ? c.schema.on : false;
  $('set-schema-name').value = c ? c.schema.name : 'answer';
  $('set-schema').value = c ? c.schema.text : '';
  $('schema-fields').hidden = !$('set-schema-on').checked;
}

function renderAll() {
  renderList();
  renderMessages();
  renderSettings();
}

function bindSettings() {
  // A setting changed before the first message starts a conversation (which renders the form anew,
  // so the value is read first and the form rendered again after it is kept).
  const bind = (id, set) => $(id).addEventListener($(id).type === 'checkbox' ? 'change' : 'input', () => {
    const value = $(id).type === 'checkbox' ? $(id).checked : $(id).value;
    const created = !current;
    if (created) newConversation();
    set(current, value);
    save();
    if (created) renderSettings();
  });
  bind('set-system', (c, v) => { c.system = v; });
  bind('set-temperature', (c, v) => { c.settings.temperature = v; });
  bind('set-top-p', (c, v) => { c.settings.top_p = v; });
  bind('set-max-tokens', (c, v) => { c.settings.max_tokens = v; });
  bind('set-seed', (c, v) => { c.settings.seed = v; });
  bind('set-tools', (c, v) => { c.tools = v; });
  bind('set-schema-name', (c, v) => { c.schema.name = v; });
  bind('set-schema', (c, v) => { c.schema.text = v; });
  bind('set-schema-on', (c, v) => {
    c.schema.on = v;
    $('schema-fields').hidden = !v;
  });
}

// ---- a request ----

// The request body of conversation c; throws an Error naming the setting that is wrong.
function requestBody(c) {
  // A number field holding text that is not a number reads as empty: refused, not taken as "default".
  for (const [id, name] of [['set-temperature', 'temperature'], ['set-top-p', 'top_p'], ['set-max-tokens', 'max_tokens'], ['set-seed', 'seed']])
    if ($(id).validity.badInput) throw new Error(`${name}: not a number`);
  const messages = [];
  if (c.system.trim()) messages.push({ role: 'system', content: c.system });
  for (const m of c.messages) {
    if (m.role === 'assistant') {
      if (!m.content && !(m.tool_calls && m.tool_calls.length)) continue;  // a failed reply
      const a = { role: 'assistant', content: m.content || '' };
      if (m.tool_calls && m.tool_calls.length) a.tool_calls = m.tool_calls;
      messages.push(a);
    } else if (m.role === 'tool') {
      messages.push({ role: 'tool', tool_call_id: m.tool_call_id, content: m.content });
    } else {
      messages.push({ role: m.role, content: m.content });
    }
  }
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  if (modelId) body.model = modelId;
  const num = (name, v, integer) => {
    if (v === '' || v === undefined || v === null) return;
    const x = Number(v);
    if (!Number.isFinite(x) || (integer && !Number.isInteger(x))) throw new Error(`${name}: '${v}' is not a ${integer ? 'whole ' : ''}number`);
    body[name] = x;
  };
  num('temperature', c.settings.temperature);
  num('top_p', c.settings.top_p);
  num('max_tokens', c.settings.max_tokens, true);
  num('seed', c.settings.seed, true);
  if (c.tools.trim()) {
    let tools;
    try { tools = JSON.parse(c.tools); } catch (e) { throw new Error('tools: not JSON (' + e.message + ')'); }
    if (!Array.isArray(tools)) throw new Error('tools: must be a JSON list of {"type": "function", "function": {...}}');
    body.tools = tools;
  }
  if (c.schema.on) {
    let schema;
    try { schema = JSON.parse(c.schema.text); } catch (e) { throw new Error('JSON schema: not JSON (' + e.message + ')'); }
    body.response_format = { type: 'json_schema', json_schema: { name: c.schema.name || 'answer', schema } };
  }
  return body;
}

// Reads an SSE body: calls onEvent(json) for each data line but [DONE].
async function readEvents(res, onEvent) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split('\n')) {
        if (!line.startsWith('data:')) continue;  // ": waiting" comments keep the connection alive
        const data = line.slice(5).trim();
        if (data === '[DONE]') return;
        onEvent(JSON.parse(data));
      }
    }
  }
}

async function generate() {
  const c = current;
  let body;
  try {
    body = requestBody(c);
  } catch (e) {
    showError(e.message);
    return;
  }
  clearError();
  const reply = { role: 'assistant', content: '', stats: {} };
  c.messages.push(reply);
  save();
  const controller = new AbortController();
  generating = { controller, conv: c };
  setBusy(true);
  renderMessages();
  let node = $('messages').lastElementChild;  // the reply's bubble, replaced as text arrives
  const t0 = performance.now();
  let tFirst = null;
  let tEnd = null;
  let tLast = null;
  let pieces = 0;  // deltas with text: one token each, but for text the server held back
  let scheduled = false;
  const update = () => {
    scheduled = false;
    if (current !== c || !node.isConnected) return;
    const fresh = renderMessage(reply, c.messages.length - 1);
    node.replaceWith(fresh);
    node = fresh;
    $('messages').scrollTop = $('messages').scrollHeight;
  };
  const schedule = () => {
    if (!scheduled) {
      scheduled = true;
      requestAnimationFrame(update);
    }
  };
  try {
    const res = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers(true), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!res.ok) {
      const text = await errorText(res);
      reply.error = text;
      showError(text);
      if (res.status === 401) needKey('The API key was refused (' + text + '). Enter the server\'s key.');
    } else {
      await readEvents(res, (chunk) => {
        if (chunk.error) {
          reply.error = chunk.error.message || JSON.stringify(chunk.error);
          return;
        }
        if (chunk.usage) {
          reply.stats.prompt_tokens = chunk.usage.prompt_tokens;
          reply.stats.completion_tokens = chunk.usage.completion_tokens;
          reply.stats.cached_tokens = chunk.usage.prompt_tokens_details ? chunk.usage.prompt_tokens_details.cached_tokens : 0;
        }
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) return;
        const d = choice.delta || {};
        if (d.content || d.reasoning_content || d.tool_calls) {
          tLast = performance.now();
          if (tFirst === null) tFirst = tLast;
          ++pieces;
        }
        if (d.content) reply.content += d.content;
        if (d.reasoning_content) reply.reasoning_content = (reply.reasoning_content || '') + d.reasoning_content;
        for (const tc of d.tool_calls || []) {
          reply.tool_calls = reply.tool_calls || [];
          const call = reply.tool_calls[tc.index] ||
            (reply.tool_calls[tc.index] = { id: '', type: 'function', function: { name: '', arguments: '' } });
          if (tc.id) call.id = tc.id;
          if (tc.function && tc.function.name) call.function.name += tc.function.name;
          if (tc.function && tc.function.arguments) call.function.arguments += tc.function.arguments;
        }
        if (choice.finish_reason) {
          reply.stats.finish = choice.finish_reason;
          tEnd = performance.now();
        }
        schedule();
      });
    }
  } catch (e) {
    if (e.name === 'AbortError') {
      reply.stats.finish = 'stopped';
      setTimeout(refreshStatus, 600);  // the server cancels the request at its next step
    } else {
      reply.error = e instanceof SyntaxError ? 'the server sent a malformed event: ' + e.message : unreachable(e);
      showError(reply.error);
    }
  }
  if (tFirst !== null) {
    reply.stats.ttft_ms = tFirst - t0;
    // Decode speed: the tokens after the first over the time from the first to the finish (or, for
    // a reply stopped before its usage came, the deltas received up to the last). Left out when
    // everything arrived at once (a tool call is sent once complete; a short reply can come in one
    // read), where the browser cannot time it.
    if (reply.stats.completion_tokens === undefined) reply.stats.received = pieces;
    const n = reply.stats.completion_tokens ?? pieces;
    const t1 = reply.stats.completion_tokens !== undefined ? tEnd : tLast;
    if (n > 1 && t1 !== null && t1 - tFirst >= 1) reply.stats.tok_s = (n - 1) / ((t1 - tFirst) / 1000);
  }
  if (!reply.stats.finish && !reply.error) reply.error = 'the reply ended without a finish reason';
  generating = null;
  setBusy(false);
  save();
  renderList();
  if (current === c) renderMessages();
  refreshStatus();
}

function addToolResult(m, call, text) {
  current.messages.push({ role: 'tool', tool_call_id: call.id, name: call.function.name, content: text });
  save();
  const pending = m.tool_calls.some((tc) => !current.messages.some((x) => x.role === 'tool' && x.tool_call_id === tc.id));
  if (pending) return renderMessages();
  generate();
}

function setBusy(busy) {
  $('send').hidden = busy;
  $('stop').hidden = !busy;
  document.body.classList.toggle('busy', busy);
}

function send() {
  const text = $('input').value;
  if (!text.trim() || generating) return;
  if (!current) newConversation();
  const c = current;
  try {
    requestBody(c);  // the settings are checked before the message is taken
  } catch (e) {
    showError(e.message);
    return;
  }
  c.messages.push({ role: 'user', content: text });
  if (c.title === 'New chat') c.title = text.trim().split('\n')[0].slice(0, 40);
  $('input').value = '';
  save();
  renderList();
  generate();
}

// ---- start ----

function start() {
  load();
  setupMarkdown();
  bindSettings();
  $('composer').addEventListener('submit', (e) => { e.preventDefault(); send(); });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  $('stop').addEventListener('click', () => { if (generating) generating.controller.abort(); });
  $('new-chat').addEventListener('click', () => {
    if (generating) return showError('wait for the reply or stop it before starting another conversation');
    newConversation();
  });
  $('banner-close').addEventListener('click', clearError);
  $('toggle-settings').addEventListener('click', () => {
    const s = $('settings');
    s.hidden = !s.hidden;
    $('toggle-settings').setAttribute('aria-expanded', String(!s.hidden));
  });
  $('key-form').addEventListener('submit', () => {
    apiKey = $('key-input').value.trim();
    if (apiKey) localStorage.setItem(KEY, apiKey);
    else localStorage.removeItem(KEY);
    $('forget-key').hidden = !apiKey;
    clearError();
    checkServer().then((ok) => { if (ok) startStatus(); else refreshStatus(); });
  });
  $('forget-key').hidden = !apiKey;
  $('forget-key').addEventListener('click', () => {
    apiKey = '';
    localStorage.removeItem(KEY);
    $('forget-key').hidden = true;
    checkServer().then(refreshStatus);
  });
  renderAll();
  checkServer().then((ok) => { if (ok) startStatus(); else refreshStatus(); });
}

start();
