// Helpers of the serve benchmarks (scripts/bench_kv_store.mjs, scripts/bench_prompt_cache_dir.mjs):
// plain fetch against a server started by harness.mjs's startServer ({ port }).
import fs from 'node:fs';

export const post = async (srv, p, body) => {
  const r = await fetch(`http://127.0.0.1:${srv.port}${p}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  const j = await r.json();
  if (!r.ok) throw new Error(`${p}: ${r.status} ${JSON.stringify(j)}`);
  return j;
};
export const metric = async (srv, name) => {
  const t = await (await fetch(`http://127.0.0.1:${srv.port}/metrics`)).text();
  const m = t.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
};
export const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

// Distinct token-id prompts from the corpus (or the README when the corpus is absent), each begun by
// its own text so that no two share a block.
export async function prompts(srv, n, len) {
  const corpus = ['../shared/corpus/val.txt', 'README.md'].find((f) => fs.existsSync(f));
  const text = fs.readFileSync(corpus, 'utf8');
  const ids = (await post(srv, '/tokenize', { content: text.slice(0, 400000) })).tokens;
  if (ids.length < n * len) throw new Error(`the corpus holds ${ids.length} tokens, fewer than ${n} x ${len}`);
  return Array.from({ length: n }, (_, i) => ids.slice(i * len, (i + 1) * len));
}

// TTFT of one request: its time with max_tokens 1 (prefill and one sampled token), non-streamed.
export async function ttft(srv, ids) {
  const t0 = performance.now();
  const r = await post(srv, '/v1/completions', { prompt: ids, max_tokens: 1, temperature: 0 });
  return { ms: performance.now() - t0, cached: r.usage.prompt_tokens_details.cached_tokens, text: r.choices[0].text };
}
