// Agent traces replayed through `posttrainllm serve`, and through llama-server on the same GGUF, with
// and without --cache-reuse (docs/agent-cache.md): tool-calling conversations of --turns turns over a
// system prompt of about 1,500 tokens with tool definitions (get_weather, lookup_verse, calculator);
// each turn a user message, the assistant's reasoning and tool call, a tool output of 200-800 tokens
// of the corpus, and a reply. The harness edits the history as agent harnesses do: it drops the
// reasoning of earlier turns and replaces tool outputs older than 5 turns with a one-line summary, so
// exact prefix reuse stops at the first edit.
// Each turn's request is the history so far (a text prompt, /v1/completions, one token); what it
// reports per turn: prompt tokens, tokens computed (prompt - cached_tokens) and the time to the first
// token, for a fresh server of each mode (-np 1), the modes' order rotating trace by trace. The
// replies are scripted (the same history for every mode).
// --llama-server PATH adds llama-server's two modes (then --model should be a .gguf file both read).
// --kl: each trace is also replayed by `posttrainllm bench --cache-reuse N --trace` (the same turns'
// prompts, each turn's reply scored after its prompt): the reused K/V compounds turn after turn (each
// turn shifts from the previous turn's reuse session with its reply, as the server holds it), and each
// turn's reply distribution is compared with an exact recompute of the same prompt over the whole
// vocabulary: KL, NLL of the reply against the recompute's, top-1 agreement.
// Needs only Node 20 (fetch). Examples:
//   node scripts/bench_agent_trace.mjs --binary build/posttrainllm --model ../shared/models/kjv-small
//   node scripts/bench_agent_trace.mjs --model ../shared/models/gguf/kjv-small-Q4_K_M.gguf \
//     --llama-server ../anchors/llama.cpp/build/bin/llama-server --ctx 12288 \
//     --llama-args '--override-kv llama.context_length=int:12288'    (timed: under flock /work/bench.lock)
//   node scripts/bench_agent_trace.mjs --model ../shared/models/gguf/kjv-small-Q4_K_M.gguf --kl-only
//   node scripts/bench_agent_trace.mjs --model models/kjv-tiny --turns 6 --traces 1   (a quick check)
//   --modes exact,llama-server: only the modes named (as the table prints them)
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { median, option } from '../tests/node/bench_util.mjs';
import { startServer } from '../tests/node/harness.mjs';

const args = process.argv.slice(2);
const opt = (name, dflt) => option(args, name, dflt);
const binary = opt('--binary', 'build/posttrainllm');
const model = opt('--model', '../shared/models/kjv-small');
const threads = opt('--threads', '2');
const turns = Number(opt('--turns', '12'));
const traces = Number(opt('--traces', '2'));
const reuse = opt('--cache-reuse', '256');
const ctx = opt('--ctx', '8192');
const kvFlags = opt('--kv', '').split(' ').filter((x) => x.length > 0);
const seed0 = Number(opt('--seed', '1'));
const llamaServer = opt('--llama-server', '');
// llama-server caps a slot's context at the GGUF's training context: prompts past it (as these traces'
// past kjv-small's 2,048) need e.g. --llama-args '--override-kv llama.context_length=int:12288'.
const llamaArgs = opt('--llama-args', '').split(' ').filter((x) => x.length > 0);
const withKl = args.includes('--kl');
const serve = !args.includes('--kl-only');  // --kl-only: the KL alone (not timed: no lock needed)

// A small deterministic generator (mulberry32): the same traces for the same seed.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const corpus = ['../shared/corpus/val.txt', 'README.md'].find((f) => fs.existsSync(f));
const words = fs.readFileSync(corpus, 'utf8').split(/\s+/).filter((w) => w.length > 0);
// About n tokens of corpus text from a random place (kjv text: about 1.3 tokens a word).
const passage = (r, n) => {
  const count = Math.round(n / 1.3), at = Math.floor(r() * (words.length - count));
  return words.slice(at, at + count).join(' ');
};

const tools = [
  { name: 'get_weather', description: 'The weather of a city today.', parameters: { city: 'string', unit: 'celsius|fahrenheit' } },
  { name: 'lookup_verse', description: 'The text of a verse of the King James Bible.', parameters: { book: 'string', chapter: 'integer', verse: 'integer' } },
  { name: 'calculator', description: 'Evaluates an arithmetic expression.', parameters: { expression: 'string' } },
];

function makeTrace(seed) {
  const r = rng(seed);
  const system =
    'You are a careful assistant that answers with the help of tools. Call a tool by writing one line\n' +
    'CALL name {json arguments}; its output follows as a TOOL message. Tools:\n' +
    tools.map((t) => JSON.stringify(t)).join('\n') + '\nGuidelines and examples:\n' + passage(r, 1350);
  const steps = [];
  for (let t = 0; t < turns; ++t) {
    const tool = tools[Math.floor(r() * tools.length)];
    steps.push({
      user: `Question ${t + 1}: ` + passage(r, 30 + Math.floor(r() * 30)),
      reasoning: '<think>' + passage(r, 40 + Math.floor(r() * 40)) + '</think>',
      call: `CALL ${tool.name} ` + JSON.stringify(Object.fromEntries(Object.keys(tool.parameters).map((k) => [k, passage(r, 2)]))),
      output: passage(r, 200 + Math.floor(r() * 600)),
      summary: `[${tool.name} output of turn ${t + 1} summarized: ${passage(r, 10)}]`,
      reply: passage(r, 20 + Math.floor(r() * 30)),
    });
  }
  return { system, steps };
}

// The prompt of turn t (0-based): the history as the harness keeps it, up to this turn's tool output.
function prompt(trace, t) {
  let p = `SYSTEM: ${trace.system}\n`;
  for (let i = 0; i <= t; ++i) {
    const s = trace.steps[i];
    p += `USER: ${s.user}\nASSISTANT: ${i === t ? s.reasoning + '\n' : ''}${s.call}\n`;
    p += `TOOL: ${t - i >= 5 ? s.summary : s.output}\n`;
    if (i < t) p += `ASSISTANT: ${s.reply}\n`;
  }
  return p + 'ASSISTANT:';
}

// What the model is to write after turn t's prompt in the scripted trace (its reply).
const continuation = (trace, t) => ' ' + trace.steps[t].reply + '\n';

// One request for one token (prefill and the first token: its time is the time to the first token,
// as bench_util's ttft), and its usage.
async function turn(srv, text) {
  const t0 = performance.now();
  const res = await fetch(`http://127.0.0.1:${srv.port}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: text, max_tokens: 1, temperature: 0 }),
  });
  if (!res.ok) throw new Error(`${res.status} ${await res.text()}`);
  const usage = (await res.json()).usage;
  const ttft = performance.now() - t0;
  return { ttft, prompt: usage.prompt_tokens, computed: usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens };
}

const freePort = () => new Promise((resolve, reject) => {
  const s = net.createServer();
  s.once('error', reject);
  s.listen(0, '127.0.0.1', () => {
    const { port } = s.address();
    s.close(() => resolve(port));
  });
});

// llama-server on a free loopback port, once /health answers 200.
async function startLlama(flags) {
  const port = await freePort();
  const proc = spawn(llamaServer, ['-m', model, '--host', '127.0.0.1', '--port', String(port), ...flags],
                     { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  proc.stderr.on('data', (d) => { log = (log + d.toString()).slice(-4000); });
  const exited = new Promise((res) => proc.once('exit', (code) => res(code)));
  for (let i = 0; i < 600; ++i) {
    if (proc.exitCode !== null) throw new Error(`llama-server exited (${proc.exitCode}):\n${log}`);
    try {
      if ((await fetch(`http://127.0.0.1:${port}/health`)).status === 200) break;
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  return { port, stop: () => (proc.kill('SIGTERM'), exited) };
}

// Each mode: how to start its server.
const modes = {
  exact: () => startServer(binary, model, ['-t', threads, '-np', '1', '-c', ctx, ...kvFlags]),
  [`--cache-reuse ${reuse}`]: () => startServer(binary, model, ['-t', threads, '-np', '1', '-c', ctx, ...kvFlags, '--cache-reuse', reuse]),
};
if (llamaServer) {
  const common = ['-t', threads, '-tb', threads, '-np', '1', '-c', ctx, '--no-warmup', ...llamaArgs];
  modes['llama-server'] = () => startLlama(common);
  modes[`llama-server --cache-reuse ${reuse}`] = () => startLlama([...common, '--cache-reuse', reuse]);
}
// --modes exact,llama-server: only these (names as printed), in this order.
const only = opt('--modes', '');
if (only) {
  const keep = only.split(',');
  for (const m of keep) if (!(m in modes)) throw new Error(`--modes: no mode "${m}" (${Object.keys(modes).join(', ')})`);
  for (const m of Object.keys(modes)) if (!keep.includes(m)) delete modes[m];
}
const results = Object.fromEntries(Object.keys(modes).map((m) => [m, []]));
for (let k = 0; k < traces && serve; ++k) {
  const trace = makeTrace(seed0 + k);
  const names = Object.keys(modes);
  const order = names.map((_, i) => names[(i + k) % names.length]);  // rotate which runs first
  for (const mode of order) {
    const srv = await modes[mode]();
    try {
      for (let t = 0; t < turns; ++t) results[mode].push({ trace: k, turn: t, ...(await turn(srv, prompt(trace, t))) });
    } finally {
      await srv.stop();
    }
  }
}

// The KL of each turn's reply under reuse, compounding, against a recompute (bench --cache-reuse --trace).
const kl = [], klSummary = [];
if (withKl || !serve) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ptllm-trace-'));
  try {
    for (let k = 0; k < traces; ++k) {
      const trace = makeTrace(seed0 + k);
      const file = path.join(dir, `trace${k}.json`);
      fs.writeFileSync(file, JSON.stringify(trace.steps.map((_, t) => ({ prompt: prompt(trace, t), reply: continuation(trace, t) }))));
      const r = spawnSync(binary, ['bench', model, '--cache-reuse', reuse, '--trace', file, '-n', '64', '-t', threads,
                                   '-c', ctx, '--json', ...kvFlags], { encoding: 'utf8', maxBuffer: 1 << 26 });
      if (r.status !== 0) throw new Error(`bench --trace: ${r.stderr}`);
      const lines = r.stdout.trim().split('\n').map((l) => JSON.parse(l));
      for (const x of lines.slice(0, -1)) {
        kl.push({ trace: k, ...x });
        console.error(`trace ${k} turn ${x.turn}: KL mean ${x.kl_mean.toFixed(4)} max ${x.kl_max.toFixed(4)}`);
      }
      klSummary.push({ trace: k, ...lines[lines.length - 1] });
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

const names = serve ? Object.keys(modes) : [];
if (serve) console.log(`trace turn | prompt | computed: ${names.join(' / ')} | TTFT ms: ${names.join(' / ')}`);
for (let i = 0; serve && i < results[names[0]].length; ++i) {
  const rs = names.map((m) => results[m][i]);
  console.log(`${rs[0].trace} ${String(rs[0].turn + 1).padStart(2)} | ${rs.map((r) => r.prompt).join('/')} | ` +
              `${rs.map((r) => r.computed).join(' / ')} | ${rs.map((r) => r.ttft.toFixed(0)).join(' / ')}`);
}
for (const m of names) {
  const rs = results[m], later = rs.filter((r) => r.turn > 0);
  console.log(`${m}: ${rs.reduce((s, r) => s + r.computed, 0)} of ${rs.reduce((s, r) => s + r.prompt, 0)} prompt ` +
              `tokens computed; TTFT p50 ${median(rs.map((r) => r.ttft)).toFixed(0)} ms, after the first turn ` +
              `${median(later.map((r) => r.ttft)).toFixed(0)} ms`);
}
if (withKl || !serve) {
  console.log(`KL of each turn's reply with --cache-reuse ${reuse}, the reuse compounding, against a recompute ` +
              '(bench --cache-reuse --trace), per turn:');
  console.log('trace turn | prompt | computed exact / reuse (shifted) | KL mean / max | NLL reuse / recompute (diff) | top-1');
  for (const r of kl)
    console.log(`${r.trace} ${String(r.turn).padStart(2)} | ${r.prompt_tokens} | ${r.computed_exact} / ${r.computed_reuse} ` +
                `(${r.shifted_tokens}) | ${r.kl_mean.toFixed(4)} / ${r.kl_max.toFixed(4)} | ${r.nll_reuse.toFixed(4)} / ` +
                `${r.nll_reference.toFixed(4)} (${(r.nll_reuse - r.nll_reference >= 0 ? '+' : '')}${(r.nll_reuse - r.nll_reference).toFixed(4)}) | ` +
                `${(100 * r.top1_agreement).toFixed(1)}%`);
  for (const x of klSummary)
    console.log(`trace ${x.trace}: ${x.turns} turns, ${x.scored_tokens} reply tokens: KL mean ${x.kl_mean.toFixed(4)} nats, ` +
                `max ${x.kl_max.toFixed(4)}; NLL ${x.nll_reuse.toFixed(4)} against ${x.nll_reference.toFixed(4)} ` +
                `(${(x.nll_reuse - x.nll_reference >= 0 ? '+' : '')}${(x.nll_reuse - x.nll_reference).toFixed(4)}); exact reuse KL max ${x.kl_exact_max.toExponential(1)}`);
}
