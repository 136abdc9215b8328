// The load and soak workloads of posttrainllm serve, with the openai client.
//
//   load (default): 16 concurrent conversations x 4 turns over a shared ~600-token system prompt,
//     streamed, temperature 0, max 64 tokens a reply. Prints the total seconds, TTFT p50/p95, that
//     all 64 replies completed, and (unless --no-verify) that none was mixed up: each reply is
//     asked again alone afterwards and must be the same text.
//     --schema FILE: every reply constrained by the JSON Schema in FILE (its "schema" member, as in
//     tests/data/json_schemas, or the whole file) through response_format json_schema; the
//     aggregate completion tokens per second is printed either way, to compare the two
//     (--ignore-eos: replies run to max tokens unless a grammar ends them).
//   --soak: 200 requests from 8 clients, with random disconnects mid-stream and malformed requests
//     mixed in; every well-formed one must get the reply it gets alone; afterwards /metrics must
//     show no KV block in use, and the server's RSS is printed before and after.
//
// Either against a server it starts (--binary B --model DIR: a copy of DIR with a ChatML template,
// started with -np 8 -t 2 unless --server-args says otherwise) or one already running (--url).
// Run: node scripts/serve_load.mjs --binary build/posttrainllm --model ../shared/models/kjv-small
import fs from 'node:fs';
import { parseArgs } from 'node:util';
import OpenAI from 'openai';
import { chatmlCopy, startServer } from './harness.mjs';

const { values: opt } = parseArgs({
  options: {
    binary: { type: 'string' }, model: { type: 'string' }, url: { type: 'string' },
    'server-args': { type: 'string', default: '-np 8 -t 2' },
    soak: { type: 'boolean', default: false }, 'no-verify': { type: 'boolean', default: false },
    conversations: { type: 'string', default: '16' }, turns: { type: 'string', default: '4' },
    'max-tokens': { type: 'string', default: '64' }, 'system-tokens': { type: 'string', default: '600' },
    requests: { type: 'string', default: '200' }, clients: { type: 'string', default: '8' },
    seed: { type: 'string', default: '1' }, schema: { type: 'string' },
    'ignore-eos': { type: 'boolean', default: false },
  },
});

const SENTENCES = [
  'In the beginning God created the heaven and the earth.', 'And the earth was without form, and void.',
  'And God said, Let there be light: and there was light.', 'And God saw the light, that it was good.',
  'And the evening and the morning were the first day.', 'The LORD is my shepherd; I shall not want.',
  'He maketh me to lie down in green pastures.', 'Blessed are the meek: for they shall inherit the earth.',
  'To every thing there is a season, and a time to every purpose under the heaven.',
  'A soft answer turneth away wrath: but grievous words stir up anger.',
];

let rngState = BigInt(opt.seed);
function rand() {  // splitmix64: the same workload for a given --seed
  rngState = (rngState + 0x9E3779B97F4A7C15n) & 0xFFFFFFFFFFFFFFFFn;
  let z = rngState;
  z = ((z ^ (z >> 30n)) * 0xBF58476D1CE4E5B9n) & 0xFFFFFFFFFFFFFFFFn;
  z = ((z ^ (z >> 27n)) * 0x94D049BB133111EBn) & 0xFFFFFFFFFFFFFFFFn;
  return Number((z ^ (z >> 31n)) >> 11n) / 2 ** 53;
}
const pick = (a) => a[Math.floor(rand() * a.length)];
const percentile = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

async function post(base, path, body, key) {
  const r = await fetch(base.replace(/\/v1$/, '') + path, {
    method: 'POST', headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
    body: typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body),
  });
  return { status: r.status, body: await r.text() };
}

// A system prompt of exactly n tokens of this model (tokenized by the server).
async function systemPrompt(base, n) {
  let text = '';
  while (text.length < n * 8) text += pick(SENTENCES) + ' ';
  const ids = JSON.parse((await post(base, '/tokenize', { content: text })).body).tokens.slice(0, n);
  return JSON.parse((await post(base, '/detokenize', { tokens: ids })).body).content;
}

let responseFormat;  // --schema
if (opt.schema) {
  const doc = JSON.parse(fs.readFileSync(opt.schema, 'utf8'));
  responseFormat = { type: 'json_schema', json_schema: { name: 'reply', schema: doc.schema ?? doc, strict: true } };
}
const extra = () => ({ ...(responseFormat ? { response_format: responseFormat } : {}),
                       ...(opt['ignore-eos'] ? { ignore_eos: true } : {}) });

async function streamReply(client, model, messages, maxTokens, abortAfter = 0) {
  const t0 = performance.now();
  const controller = new AbortController();
  const stream = await client.chat.completions.create(
    { model, messages, temperature: 0, max_tokens: maxTokens, stream: true, stream_options: { include_usage: true },
      ...extra() },
    { signal: controller.signal });
  let text = '', ttft = null, finish = null, chunks = 0, tokens = 0;
  try {
    for await (const c of stream) {
      if (c.usage) tokens = c.usage.completion_tokens;
      const piece = c.choices[0]?.delta?.content ?? '';
      if (piece && ttft === null) ttft = performance.now() - t0;
      text += piece;
      finish = c.choices[0]?.finish_reason ?? finish;
      if (abortAfter && ++chunks >= abortAfter) {
        controller.abort();
        return { aborted: true };
      }
    }
  } catch (e) {
    if (abortAfter) return { aborted: true };
    throw e;
  }
  return { text, ttft: ttft ?? performance.now() - t0, finish, tokens };
}

async function alone(client, model, messages, maxTokens) {
  const r = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: maxTokens, ...extra() });
  return r.choices[0].message.content;
}

async function loadRun(client, model, base) {
  const nConv = Number(opt.conversations), nTurns = Number(opt.turns), maxTokens = Number(opt['max-tokens']);
  const system = await systemPrompt(base, Number(opt['system-tokens']));
  const asked = [];  // [{messages, reply}] for the check
  const ttfts = [];
  let completed = 0, tokens = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: nConv }, async (_, c) => {
    const messages = [{ role: 'system', content: system }];
    for (let t = 0; t < nTurns; ++t) {
      messages.push({ role: 'user', content: `Conversation ${c}, question ${t}: ${SENTENCES[(c + t) % SENTENCES.length]}` });
      const r = await streamReply(client, model, messages, maxTokens);
      ttfts.push(r.ttft);
      tokens += r.tokens;
      if (r.finish === 'stop' || r.finish === 'length') ++completed;
      asked.push({ messages: messages.map((m) => ({ ...m })), reply: r.text });
      messages.push({ role: 'assistant', content: r.text });
    }
  }));
  const seconds = (performance.now() - t0) / 1000;
  console.log(`load: ${nConv} conversations x ${nTurns} turns, system prompt ${opt['system-tokens']} tokens, ` +
              `max ${maxTokens} tokens a reply`);
  console.log(`total ${seconds.toFixed(2)} s, TTFT p50 ${percentile(ttfts, 50).toFixed(0)} ms, ` +
              `p95 ${percentile(ttfts, 95).toFixed(0)} ms`);
  console.log(`replies completed: ${completed} of ${nConv * nTurns}; ${tokens} completion tokens, ` +
              `${(tokens / seconds).toFixed(1)} tok/s aggregate${opt.schema ? ' (JSON Schema ' + opt.schema + ')' : ''}`);
  let bad = completed === nConv * nTurns ? 0 : 1;
  if (!opt['no-verify']) {
    let mixed = 0;
    for (const a of asked) if ((await alone(client, model, a.messages, maxTokens)) !== a.reply) ++mixed;
    console.log(`replies equal to the same request alone: ${asked.length - mixed} of ${asked.length}` +
                (mixed ? ' (MIXED UP or not reproducible)' : ''));
    bad += mixed;
  }
  return bad;
}

function metric(text, name) {
  const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
}

const rssKiB = (pid) => pid ? Number(fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]) : NaN;

async function soakRun(client, model, base, pid) {
  const prompts = SENTENCES.map((s) => [{ role: 'user', content: s }]);
  const maxTokens = 32;
  const want = [];
  for (const p of prompts) want.push(await alone(client, model, p, maxTokens));
  const rss0 = rssKiB(pid);
  const malformed = ['{"messages": [', '{"messages": []}', '{"messages": "hi"}',
    '{"messages": [{"role": "user", "content": 5}]}', '{"model": 3, "messages": [{"role": "user", "content": "x"}]}',
    '{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', '[1,2,3]',
    Buffer.from('{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 'latin1')];  // not UTF-8
  const counts = { ok: 0, wrong: 0, rejected: 0, notRejected: 0, disconnected: 0 };
  let next = 0;
  const total = Number(opt.requests);
  await Promise.all(Array.from({ length: Number(opt.clients) }, async () => {
    while (next < total) {
      ++next;
      const roll = rand(), i = Math.floor(rand() * prompts.length);
      if (roll < 0.15) {
        const r = await post(base, '/v1/chat/completions', pick(malformed));
        ++counts[r.status === 400 && JSON.parse(r.body).error ? 'rejected' : 'notRejected'];
      } else if (roll < 0.35) {
        await streamReply(client, model, prompts[i], 200, 1 + Math.floor(rand() * 4));
        ++counts.disconnected;
      } else {
        const text = roll < 0.7 ? (await streamReply(client, model, prompts[i], maxTokens)).text
                                : await alone(client, model, prompts[i], maxTokens);
        ++counts[text === want[i] ? 'ok' : 'wrong'];
      }
    }
  }));
  // The cancelled requests end at the scheduler's next step: wait (bounded) for the pool to settle.
  let m = '';
  for (let k = 0; k < 200; ++k) {
    m = await (await fetch(base.replace(/\/v1$/, '') + '/metrics')).text();
    if (metric(m, 'ptllm_requests_running') === 0 && metric(m, 'ptllm_kv_blocks_used') === 0) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  const used = metric(m, 'ptllm_kv_blocks_used');
  console.log(`soak: ${total} requests from ${opt.clients} clients: ${counts.ok} correct, ${counts.wrong} wrong, ` +
              `${counts.rejected} malformed rejected with 400, ${counts.notRejected} malformed not rejected, ` +
              `${counts.disconnected} disconnected mid-stream`);
  console.log(`afterwards: KV blocks in use ${used}, cancelled ${metric(m, 'ptllm_requests_cancelled_total')}, ` +
              `RSS ${rssKiB(pid)} KiB (before the soak ${rss0} KiB)`);
  return counts.wrong + counts.notRejected + (used === 0 ? 0 : 1);
}

async function main() {
  let server = null, model = null, base = opt.url, dir = null;
  if (!base) {
    if (!opt.binary || !opt.model) throw new Error('give --url, or --binary and --model');
    dir = chatmlCopy(opt.model);
    server = await startServer(opt.binary, dir, opt['server-args'].split(/\s+/).filter(Boolean));
    base = server.baseURL;
  }
  const client = new OpenAI({ baseURL: base, apiKey: process.env.OPENAI_API_KEY ?? 'none', maxRetries: 0 });
  for await (const m of client.models.list()) model = m.id;
  let bad = 0;
  try {
    bad = opt.soak ? await soakRun(client, model, base, server?.proc.pid) : await loadRun(client, model, base);
  } finally {
    if (server) {
      const code = await server.stop();
      console.log(`server exit code ${code}`);
      if (code !== 0) bad += 1;
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }
  process.exit(bad ? 1 : 0);
}

await main();
