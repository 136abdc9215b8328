// The figures of serve --kv-store (docs/kv-store.md), for a quiet machine:
//  1. cross-replica reuse: replica B's time to first token for a 2,000-token history that replica A
//     computed and put to Redis, against a cold prefill of a history of the same length on a server
//     without a store (target: at least 10x lower);
//  2. the store's cost when every block misses: tokens per second of a workload with no reuse
//     (distinct prompts) with --kv-store against the same server without it (target: at most 5% fewer).
// Starts its own redis-server (no persistence, a temporary directory) and `posttrainllm serve`
// processes; needs only Node 20 (fetch), no npm packages. Examples:
//   node scripts/bench_kv_store.mjs --binary build/posttrainllm --model ../shared/models/kjv-small
//   node scripts/bench_kv_store.mjs --model models/kjv-tiny --history 400 --reps 2 --requests 8   (a quick check)
//   node scripts/bench_kv_store.mjs --binary build/posttrainllm --model ../shared/models/kjv-small --kv '--kv-quantize int4'
//   node scripts/bench_kv_store.mjs --binary build/posttrainllm --model ../shared/models/kjv-small --threads 1 --server-cpus 0
//     (every server on CPU 0, redis-server and this client on the others: the store's cost to the
//     server itself, with Redis on a machine of its own as in a deployment of several replicas)
//   ... --redis-maxmemory 64   (redis-server full and evicting, allkeys-lru, instead of emptied each round)
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { alternate, median, metric, prompts, ttft, storeBenchOptions } from '../tests/node/bench_util.mjs';
import { startServer } from '../tests/node/harness.mjs';

const { binary, model, threads, history, reps, requests, rounds, concurrency, promptLen, genTokens, kvFlags, ctx,
        serverCpus, redisMaxMemory } = storeBenchOptions(process.argv.slice(2));

// Every thread of process `pid` on `cpus` (taskset's list).
function pin(pid, cpus) {
  const r = spawnSync('taskset', ['-a', '-p', '-c', cpus, String(pid)], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`taskset -a -p -c ${cpus} ${pid}: ${r.stderr || r.error}`);
}
// The CPUs not in `cpus` (a list such as "0" or "0-1,4"), as a list.
function otherCpus(cpus) {
  const mine = new Set();
  for (const part of cpus.split(',')) {
    const [a, b] = part.split('-').map(Number);
    for (let c = a; c <= (b ?? a); ++c) mine.add(c);
  }
  const rest = [...Array(os.cpus().length).keys()].filter((c) => !mine.has(c));
  if (rest.length === 0) throw new Error(`--server-cpus ${cpus}: leaves no CPU for redis-server and the client`);
  return rest.join(',');
}

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// The first line of Redis's answer to an inline command.
function redisCommand(port, command) {
  return new Promise((resolve) => {
    const c = net.connect(port, '127.0.0.1', () => c.write(`${command}\r\n`));
    c.on('data', (d) => { c.destroy(); resolve(d.toString().split('\r\n')[0]); });
    c.on('error', () => resolve(''));
  });
}

async function startRedis() {
  const port = await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ptllm-redis-'));
  const proc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
                                      '--dir', dir, '--loglevel', 'warning',
                                      ...(redisMaxMemory > 0 ? ['--maxmemory', `${redisMaxMemory}mb`,
                                                                '--maxmemory-policy', 'allkeys-lru'] : [])],
                     { stdio: 'ignore' });
  for (let i = 0; i < 200; ++i) {
    const ok = await new Promise((resolve) => {
      const c = net.connect(port, '127.0.0.1', () => c.write('PING\r\n'));
      c.on('data', (d) => { c.destroy(); resolve(d.toString().startsWith('+PONG')); });
      c.on('error', () => resolve(false));
    });
    if (ok) return { url: `redis://127.0.0.1:${port}`, pid: proc.pid, flush: () => redisCommand(port, 'FLUSHALL'), stop: () => { proc.kill('SIGTERM'); fs.rmSync(dir, { recursive: true, force: true }); } };
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('redis-server did not answer PING');
}


const redis = await startRedis();
if (serverCpus) {
  const rest = otherCpus(serverCpus);
  pin(process.pid, rest);
  pin(redis.pid, rest);
  console.log(`servers on CPUs ${serverCpus} (-t ${threads}); redis-server and the client on CPUs ${rest}`);
}
const serve = async (extra) => {
  const srv = await startServer(binary, model, ['-t', threads, '-c', String(Number(ctx) * concurrency), '-np', String(concurrency), ...kvFlags, ...extra]);
  if (serverCpus) pin(srv.proc.pid, serverCpus);
  return srv;
};
try {
  // 1. Cross-replica TTFT.
  const a = await serve(['--kv-store', redis.url]);
  const b = await serve(['--kv-store', redis.url]);
  const cold = await serve([]);
  const hs = await prompts(cold, 2 * reps, history);
  const coldMs = [], warmMs = [];
  for (let i = 0; i < reps; ++i) {
    const c = await ttft(cold, hs[2 * i]);
    coldMs.push(c.ms);
    const before = await metric(a, 'ptllm_kv_store_writes_total');
    const ra = await ttft(a, hs[2 * i + 1]);
    const blocks = Math.floor((history) / 32);
    for (let t = 0; t < 600 && (await metric(a, 'ptllm_kv_store_writes_total')) - before < blocks; ++t)
      await new Promise((r) => setTimeout(r, 50));
    const lookupBefore = await metric(b, 'ptllm_kv_store_lookup_seconds_sum');
    const rb = await ttft(b, hs[2 * i + 1]);
    const lookupMs = 1000 * ((await metric(b, 'ptllm_kv_store_lookup_seconds_sum')) - lookupBefore);
    if (rb.text !== ra.text) throw new Error(`replica B answered ${JSON.stringify(rb.text)}, A ${JSON.stringify(ra.text)}`);
    warmMs.push(rb.ms);
    console.log(`history ${i}: cold ${c.ms.toFixed(1)} ms; replica B ${rb.ms.toFixed(1)} ms ` +
                `(its lookup ${lookupMs.toFixed(1)} ms) with ${rb.cached} of ${history} tokens cached`);
  }
  const hits = await metric(b, 'ptllm_kv_store_hits_total');
  const lookups = await metric(b, 'ptllm_kv_store_lookup_seconds_count');
  const lookupSum = await metric(b, 'ptllm_kv_store_lookup_seconds_sum');
  console.log(`TTFT of a ${history}-token history: cold prefill ${median(coldMs).toFixed(1)} ms (median of ${reps}), ` +
              `second replica ${median(warmMs).toFixed(1)} ms: ${(median(coldMs) / median(warmMs)).toFixed(1)}x lower ` +
              `(target: at least 10x); B: ${hits} blocks from Redis in ${lookups} lookups, ${(1000 * lookupSum / lookups).toFixed(2)} ms each`);
  for (const s of [a, b, cold]) await s.stop();

  // 2. Throughput with every block missing, against no store, in alternating rounds. Besides tokens
  // per second (noisy on a shared machine), the CPU seconds per token of the server and of
  // redis-server: what the store costs the machine whatever else runs on it.
  const probe = await serve([]);
  const ps = (await prompts(probe, requests + 1, promptLen)).slice(1);
  await probe.stop();
  // Each round with the store starts from an empty Redis (the blocks of the rounds before would
  // otherwise pile up, 147 MB a round for kjv-small, and redis-server's CPU grow with them), or with
  // --redis-maxmemory from a full one that evicts (the first part of the benchmark filled it).
  if (redisMaxMemory > 0) console.log(`redis-server: maxmemory ${redisMaxMemory} MB, allkeys-lru, never emptied`);
  const c = await alternate(rounds, 'no store', '--kv-store', async (mode, round) => {
    if (mode !== '--kv-store') return serve([]);
    if (redisMaxMemory === 0 && (await redis.flush()) !== '+OK') throw new Error('redis-server did not answer FLUSHALL');
    return serve(['--kv-store', redis.url, '--kv-store-prefix', `miss${round}`]);
  }, ps, concurrency, genTokens, () => [redis.pid]);
  console.log(`no reuse (${rounds} rounds): ${c.rateB.toFixed(1)} tok/s with --kv-store, ${c.rateA.toFixed(1)} without: ` +
              `${c.cost.toFixed(1)}% fewer (target: at most 5%); median of the rounds' ratios ` +
              `${c.pairCost.toFixed(1)}% fewer, their mean ${c.meanCost.toFixed(1)}% +- ${(2 * c.seCost).toFixed(1)}% ` +
              `(two standard errors), the store faster in ${c.bFaster} of ${rounds} rounds; ` +
              `runs of one mode spread ${c.spreadA.toFixed(1)}% and ` +
              `${c.spreadB.toFixed(1)}%; CPU per token, server and redis-server: ${c.cpuCost.toFixed(1)}% more; ` +
              `the store's own ` +
              `CPU (writer thread and redis-server): ${c.storeCpuShare.toFixed(1)}% of the server's without it`);
} finally {
  redis.stop();
}
