// Helpers of the serve benchmarks (scripts/bench_kv_store.mjs, scripts/bench_prompt_cache_dir.mjs):
// plain fetch against a server started by harness.mjs's startServer ({ port }).
import fs from 'node:fs';

export const post = async (srv, p, body) => {
  const r = await fetch(`http://127.0.0.1:${srv.port}${p}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  const j = await r.json();
  if (!r.ok) throw new Error(`${p}: ${r.status} ${JSON.stringify(j)}`);
  return j;
};
// The value after `name` in the command line's `args`, or `dflt`.
export const option = (args, name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
export const metric = async (srv, name) => {
  const t = await (await fetch(`http://127.0.0.1:${srv.port}/metrics`)).text();
  const m = t.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
};
// The options both store benchmarks take (scripts/bench_kv_store.mjs, scripts/bench_prompt_cache_dir.mjs).
export function storeBenchOptions(args) {
  const opt = (name, dflt) => option(args, name, dflt);
  const o = {
    binary: opt('--binary', 'build/posttrainllm'),
    model: opt('--model', '../shared/models/kjv-small'),
    threads: opt('--threads', '2'),
    // Tokens of a history: 1,984 so that it and 64 more fit kjv-small's 2,048 positions.
    history: Number(opt('--history', '1984')),
    reps: Number(opt('--reps', '5')),                // histories measured (medians reported)
    requests: Number(opt('--requests', '32')),       // requests of the no-reuse workload
    rounds: Number(opt('--rounds', '4')),            // its rounds, alternating with and without the store
    concurrency: Number(opt('--concurrency', '4')),
    promptLen: Number(opt('--prompt', '512')),       // their prompt tokens
    genTokens: Number(opt('--gen', '64')),           // their generated tokens
    // KV settings of every server, e.g. --kv '--kv-quantize int4' or '--streaming-llm-sink 32 --streaming-llm-window 1024'.
    kvFlags: opt('--kv', '').split(' ').filter((x) => x.length > 0),
    // CPUs (taskset's list) of the servers; redis-server and this client then run on the others, as
    // on the machines of their own a deployment gives them (use with --threads 1 on 2 cores).
    serverCpus: opt('--server-cpus', ''),
    // redis-server's maxmemory in MB (allkeys-lru; 0: none): Redis full and evicting, as a deployment
    // runs it, instead of emptied (FLUSHALL) before each round of the no-reuse workload.
    redisMaxMemory: Number(opt('--redis-maxmemory', '0')),
  };
  o.ctx = String(Math.max(o.history + 64, o.promptLen + o.genTokens + 8));
  return o;
}

// The middle value, or the mean of the two middle ones of an even count.
export const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b), m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

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

// CPU seconds (user + system) a process has used so far, from /proc (Linux; NaN elsewhere).
export function cpuSeconds(pid) {
  try {
    const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = f.slice(f.lastIndexOf(')') + 2).split(' ');  // fields from the state (field 3) on
    return (Number(fields[11]) + Number(fields[12])) / 100;     // utime, stime in clock ticks (USER_HZ 100)
  } catch {
    return NaN;
  }
}

// CPU seconds the threads of `pid` named `name` (the block stores' writers: ptllm-redis,
// ptllm-dirstore) have used so far; 0 when there is none.
export function threadCpuSeconds(pid, name) {
  let total = 0;
  try {
    for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
      if (fs.readFileSync(`/proc/${pid}/task/${tid}/comm`, 'utf8').trim() !== name) continue;
      total += cpuSeconds(`${pid}/task/${tid}`);
    }
  } catch {
    return NaN;
  }
  return total;
}

// The no-reuse workload: `ps` (distinct prompts) sent `concurrency` at a time, each to generate
// `genTokens`. Returns the tokens (prompt + completion), wall seconds and the CPU seconds the server
// and the `others` pids (a redis-server) used meanwhile.
export async function noReuseRun(srv, ps, concurrency, genTokens, others = []) {
  const pids = [srv.proc.pid, ...others];
  const cpu0 = pids.map(cpuSeconds);
  const writer = () => threadCpuSeconds(srv.proc.pid, 'ptllm-redis') + threadCpuSeconds(srv.proc.pid, 'ptllm-dirstore');
  const w0 = writer();
  const t0 = performance.now();
  let next = 0, tokens = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < ps.length) {
      const p = ps[next++];
      const r = await post(srv, '/v1/completions', { prompt: p, max_tokens: genTokens, temperature: 0 });
      tokens += r.usage.prompt_tokens + r.usage.completion_tokens;
    }
  }));
  const seconds = (performance.now() - t0) / 1000;
  const cpu = pids.map((p, i) => cpuSeconds(p) - cpu0[i]);
  return { tokens, seconds, rate: tokens / seconds, serverCpu: cpu[0], otherCpu: cpu.slice(1).reduce((a, b) => a + b, 0),
           writerCpu: writer() - w0 };
}

// Rounds of the no-reuse workload alternating two modes (`a` first in even rounds, `b` first in odd
// ones, so a machine's drift favours neither); start(mode, round) gives a started server, which is
// stopped after its run. Prints each run and returns the comparison of b against a.
export async function alternate(rounds, a, b, start, ps, concurrency, genTokens, others = () => []) {
  const runs = { [a]: [], [b]: [] };
  for (let round = 0; round < rounds; ++round) {
    for (const mode of round % 2 === 0 ? [a, b] : [b, a]) {
      const srv = await start(mode, round);
      const r = await noReuseRun(srv, ps, concurrency, genTokens, mode === b ? others() : []);
      runs[mode].push(r);
      // The store's lookups of the round (the scheduler's thread waits for each): NaN without one.
      const lookups = await metric(srv, 'ptllm_kv_store_lookup_seconds_count');
      const lookupMs = 1000 * (await metric(srv, 'ptllm_kv_store_lookup_seconds_sum'));
      console.log(`round ${round} ${mode.padEnd(20)}: ${r.tokens} tokens in ${r.seconds.toFixed(2)} s = ${r.rate.toFixed(1)} tok/s; ` +
                  `CPU ${r.serverCpu.toFixed(2)} s server${mode === b ? ` (${r.writerCpu.toFixed(2)} s its store writer)` : ''}` +
                  `${mode === b && others().length ? `, ${r.otherCpu.toFixed(2)} s store` : ''}` +
                  `${lookups > 0 ? `; ${lookups} lookups, ${lookupMs.toFixed(1)} ms in all` : ''}`);
      await srv.stop();
    }
  }
  const mean = (xs) => xs.reduce((x, y) => x + y, 0) / xs.length;
  const rate = (m) => mean(runs[m].map((r) => r.rate));
  const cpuPerToken = (m) => mean(runs[m].map((r) => (r.serverCpu + r.otherCpu) / r.tokens));
  const spread = (m) => {
    const xs = runs[m].map((r) => r.rate);
    return 100 * (Math.max(...xs) - Math.min(...xs)) / mean(xs);
  };
  // Each round's two runs sat next to each other in time: the median of the rounds' ratios is the
  // figure a drifting machine moves least.
  const ratios = runs[b].map((r, i) => r.rate / runs[a][i].rate);
  // The rounds' costs (percent fewer tokens a second), their mean and its standard error: with the
  // rounds independent, the cost is within two standard errors of the mean 95 times in 100.
  const costs = ratios.map((x) => 100 * (1 - x));
  const meanCost = mean(costs);
  const seCost = costs.length > 1
    ? Math.sqrt(costs.reduce((t, x) => t + (x - meanCost) ** 2, 0) / (costs.length - 1) / costs.length) : NaN;
  return {
    meanCost, seCost,
    rateA: rate(a), rateB: rate(b), cost: 100 * (1 - rate(b) / rate(a)),
    pairCost: 100 * (1 - median(ratios)), bFaster: ratios.filter((x) => x > 1).length,
    cpuCost: 100 * (cpuPerToken(b) / cpuPerToken(a) - 1), spreadA: spread(a), spreadB: spread(b),
    // The store's own CPU (its writer thread and the store process) against the server's without it.
    storeCpuShare: 100 * mean(runs[b].map((r) => (r.writerCpu + r.otherCpu) / r.tokens)) / cpuPerToken(a),
  };
}
