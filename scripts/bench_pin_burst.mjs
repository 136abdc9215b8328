// A shared system prompt through a burst of other traffic (docs/agent-cache.md "Pinned system
// prompts"): --clients chat clients share a system prompt of about --system-tokens tokens; the time to
// the first token of their requests is measured before and after a burst of --burst unrelated chat
// requests (each with a system prompt of its own, or --burst-system 0: none) passes through a small KV
// pool (--budget-mb), on a fresh `serve` for each mode:
//   pinned     --kv-pin-mb: the shared prompt's blocks are held through the burst;
//   unpinned   the burst's own system prompts (cached as system, more recently) evict it;
//   roles      unpinned, a burst of user messages only: eviction by role keeps the system prompt.
// Each request asks for one token (its time is the time to the first token). Reported per mode: the
// first request's time (a cold prefill of the system prompt), one client's request alone before and
// after the burst (time and cached tokens), and the median time of all clients at once before and after.
// Needs only Node 20 (fetch). Example:
//   node scripts/bench_pin_burst.mjs --binary build/posttrainllm --model ../shared/models/kjv-small
import fs from 'node:fs';
import { median, option } from '../tests/node/bench_util.mjs';
import { startServer } from '../tests/node/harness.mjs';

const args = process.argv.slice(2);
const opt = (name, dflt) => option(args, name, dflt);
const binary = opt('--binary', 'build/posttrainllm');
const model = opt('--model', '../shared/models/kjv-small');
const threads = opt('--threads', '2');
const clients = Number(opt('--clients', '16'));
const burst = Number(opt('--burst', '200'));
const burstTokens = Number(opt('--burst-tokens', '300'));
const burstSystem = Number(opt('--burst-system', '1'));
const systemTokens = Number(opt('--system-tokens', '1500'));
const budgetMb = opt('--budget-mb', '32');
const pinMb = opt('--pin-mb', '16');
const np = opt('--np', '4');
const ctx = opt('--ctx', String(2048 * Number(np)));  // split between the -np sequences
const modeNames = opt('--modes', 'pinned,unpinned,roles').split(',');
const extra = opt('--serve-args', '').split(' ').filter((x) => x.length > 0);

const corpus = ['../shared/corpus/val.txt', 'README.md'].find((f) => fs.existsSync(f));
const words = fs.readFileSync(corpus, 'utf8').split(/\s+/).filter((w) => w.length > 0);
let cursor = 0;
// About n tokens of corpus text (kjv text: about 1.3 tokens a word), a different place each call.
const passage = (n) => {
  const count = Math.max(1, Math.round(n / 1.3));
  if (cursor + count > words.length) cursor = 0;
  const text = words.slice(cursor, cursor + count).join(' ');
  cursor += count;
  return text;
};

const shared = 'You are the scribe of the archive. Answer in the words of the book.\n' + passage(systemTokens);
const userTurns = Array.from({ length: 2 * clients + 3 }, (_, i) => `Question ${i + 1}: ${passage(40)}`);
// The burst: each chat a system prompt of its own and a user message, or (roles, --burst-system 0)
// the same text as one user message.
const burstTexts = Array.from({ length: burst }, (_, i) => [`Agent ${i + 1}. ` + passage(burstTokens * 0.7), passage(burstTokens * 0.3)]);
const burstBodies = (withSystem) => burstTexts.map(([sys, user]) =>
  withSystem ? [{ role: 'system', content: sys }, { role: 'user', content: user }] : [{ role: 'user', content: sys + ' ' + user }]);

async function chat(srv, messages) {
  const t0 = performance.now();
  const res = await fetch(`http://127.0.0.1:${srv.port}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages, max_tokens: 1, temperature: 0 }),
  });
  if (!res.ok) throw new Error(`${res.status} ${await res.text()}`);
  const usage = (await res.json()).usage;
  return { ms: performance.now() - t0, prompt: usage.prompt_tokens, cached: usage.prompt_tokens_details.cached_tokens };
}

const clientsRound = (srv, from) =>
  Promise.all(Array.from({ length: clients }, (_, i) =>
    chat(srv, [{ role: 'system', content: shared }, { role: 'user', content: userTurns[from + i] }])));

async function burstRound(srv, bodies) {
  let next = 0;
  const worker = async () => {
    while (next < bodies.length) await chat(srv, bodies[next++]);
  };
  const t0 = performance.now();
  await Promise.all(Array.from({ length: 2 * Number(np) }, worker));
  return performance.now() - t0;
}

async function metric(srv, name) {
  const text = await (await fetch(`http://127.0.0.1:${srv.port}/metrics`)).text();
  const m = text.match(new RegExp(`^${name.replace(/[{}"]/g, (c) => '\\' + c)} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
}

const rows = [];
for (const mode of modeNames) {
  if (!['pinned', 'unpinned', 'roles'].includes(mode)) throw new Error(`--modes: unknown mode ${mode}`);
  const flags = ['-t', threads, '-np', np, '-c', ctx, '--kv-budget-mb', budgetMb, '--chat-template', 'chatml', ...extra];
  if (mode === 'pinned') flags.push('--kv-pin-mb', pinMb);
  const srv = await startServer(binary, model, flags);
  try {
    const probe = (i) => chat(srv, [{ role: 'system', content: shared }, { role: 'user', content: userTurns[2 * clients + i] }]);
    const cold = await probe(0);
    const first = await probe(1);  // one client alone: the shared prompt's blocks from the pool
    const before = await clientsRound(srv, 0);
    const burstMs = await burstRound(srv, burstBodies(mode !== 'roles' && burstSystem > 0));
    const firstAfter = await probe(2);  // the first request after the burst: kept, or computed again
    const after = await clientsRound(srv, clients);
    rows.push({
      mode, cold, first, firstAfter, before, after, burstMs,
      pinned: await metric(srv, 'ptllm_kv_blocks_pinned'),
      total: await metric(srv, 'ptllm_kv_blocks_total'),
    });
  } finally {
    await srv.stop();
  }
}

const p50 = (rs, k) => median(rs.map((r) => r[k]));
console.log(`${clients} clients, system prompt ${rows[0]?.cold.prompt} tokens with the first user turn; burst of ${burst} ` +
            `chats of about ${burstTokens} tokens${burstSystem ? ' (each its own system prompt)' : ''}; ` +
            `pool ${budgetMb} MiB (${rows[0]?.total} blocks), -np ${np}, -t ${threads}`);
console.log('mode | cold prefill ms | first request before / after the burst: ms (cached tokens) | ' +
            `${clients} clients at once, TTFT p50 before / after | burst s | pinned blocks`);
for (const r of rows)
  console.log(`${r.mode} | ${r.cold.ms.toFixed(0)} | ${r.first.ms.toFixed(0)} (${r.first.cached}) / ` +
              `${r.firstAfter.ms.toFixed(0)} (${r.firstAfter.cached}) | ${p50(r.before, 'ms').toFixed(0)} / ` +
              `${p50(r.after, 'ms').toFixed(0)} | ${(r.burstMs / 1000).toFixed(1)} | ${r.pinned}`);
