// serve --prompt-cache-dir (docs/server.md), for a quiet machine:
//  1. a restart: the time to first token of a ~2,000-token history on a freshly started server that
//     finds its blocks in the directory a previous server (stopped with SIGTERM) wrote, against the
//     same history's cold prefill on that previous server;
//  2. the directory's cost when every block misses: tokens per second of a workload with no reuse
//     (distinct prompts) with --prompt-cache-dir against the same server without it, alternating.
// Starts its own `posttrainllm serve` processes on a temporary directory; needs only Node 20 (fetch),
// no npm packages. Examples:
//   node scripts/bench_prompt_cache_dir.mjs --binary build/posttrainllm --model ../shared/models/kjv-small
//   node scripts/bench_prompt_cache_dir.mjs --model models/kjv-tiny --history 400 --reps 2 --requests 8   (a quick check)
//   node scripts/bench_prompt_cache_dir.mjs --binary build/posttrainllm --model ../shared/models/kjv-small --kv '--kv-quantize int4'
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { alternate, median, metric, post, prompts, ttft, storeBenchOptions } from '../tests/node/bench_util.mjs';
import { startServer } from '../tests/node/harness.mjs';

const { binary, model, threads, history, reps, requests, rounds, concurrency, promptLen, genTokens, kvFlags, ctx } =
  storeBenchOptions(process.argv.slice(2));


const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ptllm-pcache-'));
const serve = (extra) =>
  startServer(binary, model, ['-t', threads, '-c', String(Number(ctx) * concurrency), '-np', String(concurrency), ...kvFlags, ...extra]);
try {
  // 1. Restarts.
  const cacheDir = path.join(dir, 'cache');
  let srv = await serve(['--prompt-cache-dir', cacheDir]);
  const hs = await prompts(srv, reps, history);
  const coldMs = [], warmMs = [];
  for (let i = 0; i < reps; ++i) {
    const c = await ttft(srv, hs[i]);
    coldMs.push(c.ms);
    const code = await srv.stop();  // SIGTERM: the queued blocks are written before the exit
    if (code !== 0) throw new Error(`serve exited ${code}`);
    const t0 = performance.now();
    srv = await serve(['--prompt-cache-dir', cacheDir]);
    const startMs = performance.now() - t0;
    const w = await ttft(srv, hs[i]);
    if (w.text !== c.text) throw new Error(`after the restart: ${JSON.stringify(w.text)}, before ${JSON.stringify(c.text)}`);
    warmMs.push(w.ms);
    console.log(`history ${i}: cold ${c.ms.toFixed(1)} ms; after a restart (${startMs.toFixed(0)} ms to listen) ` +
                `${w.ms.toFixed(1)} ms with ${w.cached} of ${history} tokens cached`);
  }
  const lookups = await metric(srv, 'ptllm_kv_store_lookup_seconds_count');
  const lookupSum = await metric(srv, 'ptllm_kv_store_lookup_seconds_sum');
  console.log(`TTFT of a ${history}-token history: cold ${median(coldMs).toFixed(1)} ms, after a restart ` +
              `${median(warmMs).toFixed(1)} ms (medians of ${reps}): ${(median(coldMs) / median(warmMs)).toFixed(1)}x lower; ` +
              `last server: ${(1000 * lookupSum / lookups).toFixed(2)} ms a lookup`);
  await srv.stop();

  // 2. Throughput with every block missing, against no directory, in alternating rounds (with the
  // CPU seconds per token of the server: what the directory costs whatever else runs).
  const probe = await serve([]);
  const ps = (await prompts(probe, requests + 1, promptLen)).slice(1);
  await probe.stop();
  const c = await alternate(rounds, 'no directory', '--prompt-cache-dir', (mode, round) =>
    serve(mode === '--prompt-cache-dir' ? ['--prompt-cache-dir', path.join(dir, `miss${round}`)] : []),
  ps, concurrency, genTokens);
  console.log(`no reuse (${rounds} rounds): ${c.rateB.toFixed(1)} tok/s with --prompt-cache-dir, ${c.rateA.toFixed(1)} without: ` +
              `${c.cost.toFixed(1)}% fewer (runs of one mode spread ${c.spreadA.toFixed(1)}% and ${c.spreadB.toFixed(1)}%); ` +
              `CPU per token: ${c.cpuCost.toFixed(1)}% more; the writer thread's: ${c.storeCpuShare.toFixed(1)}% of the server's without it`);
} finally {
  fs.rmSync(dir, { recursive: true, force: true });
}
