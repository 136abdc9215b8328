// Agent traces replayed through `posttrainllm serve` with and without --cache-reuse (docs/agent-cache.md):
// tool-calling conversations of --turns turns over a system prompt of about 1,500 tokens with tool
// definitions (get_weather, lookup_verse, calculator); each turn a user message, the assistant's
// reasoning and tool call, a tool output of 200-800 tokens of the corpus, and a reply. The harness
// edits the history as agent harnesses do: it drops the reasoning of earlier turns and replaces tool
// outputs older than 5 turns with a one-line summary, so exact prefix reuse stops at the first edit.
// Each turn's request is the history so far (a text prompt, /v1/completions, one token); what it
// reports per turn: prompt tokens, tokens computed (prompt - cached_tokens) and the time to the first
// token, for a fresh server of each mode, the modes alternating trace by trace. The replies are
// scripted (the same history for both modes).
// Needs only Node 20 (fetch). Examples:
//   node scripts/bench_agent_trace.mjs --binary build/posttrainllm --model ../shared/models/kjv-small
//   node scripts/bench_agent_trace.mjs --model models/kjv-tiny --turns 6 --traces 1   (a quick check)
import fs from 'node:fs';
import { median } from '../tests/node/bench_util.mjs';
import { startServer } from '../tests/node/harness.mjs';

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const binary = opt('--binary', 'build/posttrainllm');
const model = opt('--model', '../shared/models/kjv-small');
const threads = opt('--threads', '2');
const turns = Number(opt('--turns', '12'));
const traces = Number(opt('--traces', '2'));
const reuse = opt('--cache-reuse', '256');
const ctx = opt('--ctx', '8192');
const kvFlags = opt('--kv', '').split(' ').filter((x) => x.length > 0);
const seed0 = Number(opt('--seed', '1'));

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

const modes = { exact: [], [`--cache-reuse ${reuse}`]: ['--cache-reuse', reuse] };
const results = Object.fromEntries(Object.keys(modes).map((m) => [m, []]));
for (let k = 0; k < traces; ++k) {
  const trace = makeTrace(seed0 + k);
  const order = k % 2 ? Object.keys(modes).reverse() : Object.keys(modes);  // alternate which runs first
  for (const mode of order) {
    const srv = await startServer(binary, model, ['-t', threads, '-np', '1', '-c', ctx, ...kvFlags, ...modes[mode]]);
    try {
      for (let t = 0; t < turns; ++t) results[mode].push({ trace: k, turn: t, ...(await turn(srv, prompt(trace, t))) });
    } finally {
      await srv.stop();
    }
  }
}

const names = Object.keys(modes);
console.log(`trace turn | prompt | computed ${names.join(' / ')} | TTFT ms ${names.join(' / ')}`);
for (let i = 0; i < results[names[0]].length; ++i) {
  const a = results[names[0]][i], b = results[names[1]][i];
  console.log(`${a.trace} ${String(a.turn + 1).padStart(2)} | ${a.prompt} | ${a.computed} / ${b.computed} | ` +
              `${a.ttft.toFixed(0)} / ${b.ttft.toFixed(0)}`);
}
for (const m of names) {
  const rs = results[m], later = rs.filter((r) => r.turn > 0);
  console.log(`${m}: ${rs.reduce((s, r) => s + r.computed, 0)} of ${rs.reduce((s, r) => s + r.prompt, 0)} prompt ` +
              `tokens computed; TTFT p50 ${median(rs.map((r) => r.ttft)).toFixed(0)} ms, after the first turn ` +
              `${median(later.map((r) => r.ttft)).toFixed(0)} ms`);
}
