// Constrained against free decoding through two servers on the same GGUF: ours and llama-server,
// alternating. Each round sends the same prompts to /v1/completions, greedy, with and without a
// JSON Schema (`json_schema`, the field both servers take), and reports completion tokens per
// second of wall time per server and mode, and the constrained/free ratio.
//   node scripts/bench_grammar_server.mjs --ours build/posttrainllm --llama DIR/llama-server \
//        --model ../shared/models/gguf/kjv-small-Q4_K_M.gguf [--schema FILE] [--rounds 3]
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import { parseArgs } from 'node:util';

const { values: opt } = parseArgs({ options: {
  ours: { type: 'string' }, llama: { type: 'string' }, model: { type: 'string' },
  schema: { type: 'string', default: 'tests/data/json_schemas/real/tool_get_weather.json' },
  rounds: { type: 'string', default: '3' }, 'max-tokens': { type: 'string', default: '96' },
} });
const doc = JSON.parse(fs.readFileSync(opt.schema, 'utf8'));
const schema = doc.schema ?? doc;
const PROMPTS = ['And the LORD said unto Moses,', 'In the beginning', 'A soft answer turneth away wrath:',
                 'The weather in Paris today:', 'Blessed are the meek:'];

const freePort = () => new Promise((res) => { const s = net.createServer(); s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => res(p)); }); });
async function start(bin, args) {
  const port = await freePort();
  const proc = spawn(bin, [...args, '--host', '127.0.0.1', '--port', String(port)], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = ''; proc.stderr.on('data', (d) => { err += d; });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 600; ++i) {
    try { if ((await fetch(base + '/health')).ok) return { proc, base }; } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  proc.kill(); throw new Error(`${bin} did not start: ${err.slice(-2000)}`);
}
async function run(base, constrained) {
  let tokens = 0; const t0 = performance.now();
  for (const prompt of PROMPTS) {
    const body = { prompt, max_tokens: Number(opt['max-tokens']), temperature: 0, ...(constrained ? { json_schema: schema } : {}) };
    const r = await fetch(base + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const j = await r.json();
    if (!r.ok) throw new Error(JSON.stringify(j));
    // a reply the grammar ended must be the JSON it was held to
    if (constrained && j.choices[0].finish_reason === 'stop') JSON.parse(j.choices[0].text);
    tokens += j.usage.completion_tokens;
  }
  return tokens / ((performance.now() - t0) / 1000);
}
const servers = [['ours', opt.ours, ['serve', opt.model, '-t', '2', '-np', '1']],
                 ['llama-server', opt.llama, ['-m', opt.model, '-t', '2', '-np', '1', '-c', '2048']]];
const results = {};
for (let r = 0; r < Number(opt.rounds); ++r)
  for (const [name, bin, args] of servers) {
    const s = await start(bin, args);
    try {
      for (const c of [false, true]) {
        // A server that refuses a mode (llama-server's output parser rejects some random-weight text
        // with a 500) gets NaN for it; the other rows still compare.
        let rate = NaN;
        try { rate = await run(s.base, c); } catch (e) { console.error(`${name} ${c ? 'schema' : 'free'}: ${e.message}`); }
        (results[`${name} ${c ? 'schema' : 'free'}`] ??= []).push(rate);
      }
    } finally { s.proc.kill(); await new Promise((res) => s.proc.once('exit', res)); }
  }
const med = (xs) => { const ok = xs.filter((x) => !Number.isNaN(x)).sort((a, b) => a - b); return ok.length ? ok[Math.floor(ok.length / 2)] : NaN; };
for (const [k, v] of Object.entries(results)) console.log(`${k}: ${v.map((x) => x.toFixed(1)).join(', ')} tok/s (median ${med(v).toFixed(1)})`);
for (const [name] of servers) {
  const ratios = results[`${name} schema`].map((x, i) => x / results[`${name} free`][i]);
  console.log(`${name} schema/free: ${ratios.map((x) => x.toFixed(3)).join(', ')}`);
}
const mine = results['ours schema'], theirs = results['llama-server schema'];
console.log(`ours/llama-server with the schema: ${mine.map((x, i) => (x / theirs[i]).toFixed(3)).join(', ')}`);
