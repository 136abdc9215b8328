#include "engine/bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/stream.h"
#include "model/gguf.h"
#include "sample/sampler.h"

namespace ptllm {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int32_t> random_ids(size_t n, int vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<int32_t> out(n);
  for (auto& x : out) x = id(rng);
  return out;
}

// One run in a fresh session: context (untimed), prompt (timed: prefill, ttft), greedy decode (timed),
// after the prompt or, with at_context, from the context's depth (llama-bench's tg test starts from a
// cache of its -d tokens, the prompt not in it). kv_before_decode: the cache's logical bytes when
// decode starts.
BenchRun one_run(const Model& model, const SessionOptions& opts, ThreadPool& pool, const std::vector<int32_t>& context,
                 const std::vector<int32_t>& prompt, int gen, bool at_context, std::unique_ptr<Session>& session,
                 size_t* kv_before_decode, const std::function<void(bool after)>& beside_decode) {
  session.reset();  // the previous run's cache goes before the next one is allocated
  session = std::make_unique<Session>(model, opts, pool);
  if (!context.empty()) session->feed(context);
  BenchRun r;
  const auto t0 = Clock::now();
  std::span<float> logits = session->feed(prompt);
  r.prefill_ms = ms_since(t0);
  int32_t next = argmax(logits);
  r.ttft_ms = ms_since(t0);
  if (at_context) {
    const int64_t depth = int64_t(context.size());
    if (!session->has_cache() || session->cache().rewind_floor() <= depth) {
      session->truncate(depth);
    } else {  // tokens already quantized or evicted: the context fed again
      session.reset();
      session = std::make_unique<Session>(model, opts, pool);
      if (!context.empty()) session->feed(context);
      r.rebuilt = true;
    }
  }
  Session& s = *session;
  r.decode_depth = s.position();
  *kv_before_decode = s.has_cache() ? s.cache().logical_bytes() : 0;
  if (beside_decode) beside_decode(false);
  const auto t1 = Clock::now();
  for (int i = 0; i < gen; ++i) {
    logits = s.feed({&next, 1});
    next = argmax(logits);
  }
  r.decode_ms = ms_since(t1);
  if (beside_decode) beside_decode(true);
  return r;
}

}  // namespace

size_t decode_weight_bytes(const Model& model) {
  // Every tensor but an untied embedding (a token reads one row of it): a quantized one is its codes,
  // scales and biases, "model.embed_tokens.{weight,scales,biases}". Of the routed experts, the top_k
  // a token is sent to in each sparse layer.
  const bool tied = model.config().tie_word_embeddings && !model.files().find("lm_head.weight");
  const Model::ExpertBytes experts = model.expert_bytes();
  size_t total = 0;
  if (const GgufFile* g = model.gguf()) {  // every tensor, less the embedding when an output matrix exists
    for (const GgufTensor& t : g->tensors()) total += size_t(t.nbytes);
    if (g->find_tensor("output.weight"))
      if (const GgufTensor* e = g->find_tensor("token_embd.weight")) total -= size_t(e->nbytes);
    return total - experts.all + experts.per_token;
  }
  for (const auto& f : model.files().files())
    for (const auto& [name, t] : f->tensors())
      if (tied || !name.starts_with("model.embed_tokens.")) total += t.nbytes;
  return total - experts.all + experts.per_token;
}

BenchResult run_bench(const Model& model, const SessionOptions& opts, ThreadPool& pool, const BenchConfig& cfg,
                      const std::function<void(int run, bool after)>& beside_decode) {
  PTLLM_CHECK(cfg.prompt_tokens > 0 && cfg.gen_tokens > 0 && cfg.repeat > 0 && cfg.context >= 0);
  const int vocab = model.config().vocab_size;
  std::mt19937_64 rng(cfg.seed);
  const auto context = random_ids(size_t(cfg.context), vocab, rng);
  const auto prompt = random_ids(size_t(cfg.prompt_tokens), vocab, rng);

  std::unique_ptr<Session> session;
  size_t kv_before = 0;
  {  // Warm-up: faults the mapped weights in and sizes the buffers, outside the measurement.
    const std::vector<int32_t> few(prompt.begin(), prompt.begin() + std::min<ptrdiff_t>(8, ptrdiff_t(prompt.size())));
    one_run(model, opts, pool, {}, few, 2, cfg.decode_at_context, session, &kv_before, {});
  }
  BenchResult res;
  std::vector<double> prefill, decode, ttft;
  for (int i = 0; i < cfg.repeat; ++i) {
    std::function<void(bool)> beside;
    if (beside_decode) beside = [&beside_decode, i](bool after) { beside_decode(i, after); };
    BenchRun r =
        one_run(model, opts, pool, context, prompt, cfg.gen_tokens, cfg.decode_at_context, session, &kv_before, beside);
    res.runs.push_back(r);
    prefill.push_back(double(cfg.prompt_tokens) / (r.prefill_ms / 1000));
    decode.push_back(double(cfg.gen_tokens) / (r.decode_ms / 1000));
    ttft.push_back(r.ttft_ms);
  }
  res.prefill_tok_s = median(prefill);
  res.decode_tok_s = median(decode);
  res.ttft_ms = median(ttft);
  if (session->has_cache()) {
    const KVCache& kv = session->cache();
    res.kv_logical_bytes = kv.logical_bytes();
    res.kv_physical_bytes = kv.physical_bytes();
    res.kv_stored = kv.n_stored();
    res.kv_tokens = kv.n_tokens();
    res.kv_layers = kv_layer_report(kv);
    res.kv_bytes_per_token = (kv_before + res.kv_logical_bytes) / 2;
  }
  res.weight_bytes_per_token = decode_weight_bytes(model);
  return res;
}

namespace {

struct ParallelRun {
  double decode_ms = 0, prefill_ms = 0;
  std::vector<double> ttft_ms;
};

// n fresh sessions: each prompt fed alone (timed: its time to first token), then gen_tokens batched
// greedy steps of all of them (timed).
ParallelRun parallel_run(const Model& model, const SessionOptions& opts, ThreadPool& pool, size_t budget,
                         const std::vector<std::vector<int32_t>>& prompts, int gen,
                         std::vector<std::unique_ptr<Session>>& sessions, std::unique_ptr<KVPool>& kv, ForwardState& st) {
  sessions.clear();  // the previous run's caches go before the next ones are allocated
  kv.reset();
  const size_t n = prompts.size();
  // One pool for all of them, room for each at its worst case: prefixes in common are held once.
  kv = std::make_unique<KVPool>(model.kv_shape(), opts.kv, int(n), budget);
  for (size_t i = 0; i < n; ++i) sessions.push_back(std::make_unique<Session>(model, opts, pool, kv.get()));
  ParallelRun r;
  std::vector<int32_t> next(n);
  const auto t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    const auto ti = Clock::now();
    next[i] = argmax(sessions[i]->feed(prompts[i]));
    r.ttft_ms.push_back(ms_since(ti));
  }
  r.prefill_ms = ms_since(t0);
  std::vector<Session*> ptrs;
  std::vector<std::span<const int32_t>> feeds;
  for (size_t i = 0; i < n; ++i) {
    ptrs.push_back(sessions[i].get());
    feeds.emplace_back(&next[i], 1);
  }
  const auto t1 = Clock::now();
  for (int step = 0; step < gen; ++step) {
    Session::feed_batch(ptrs, feeds, st);
    for (size_t i = 0; i < n; ++i) next[i] = argmax(sessions[i]->last_logits());
  }
  r.decode_ms = ms_since(t1);
  return r;
}

}  // namespace

ParallelBenchResult run_parallel_bench(const Model& model, const SessionOptions& opts, ThreadPool& pool,
                                       const ParallelBenchConfig& cfg, int n) {
  PTLLM_CHECK(n > 0 && cfg.prompt_tokens > 0 && cfg.gen_tokens > 0 && cfg.repeat > 0 &&
              cfg.shared_prefix >= 0 && cfg.shared_prefix <= cfg.prompt_tokens);
  const int vocab = model.config().vocab_size;
  std::mt19937_64 rng(cfg.seed);
  const auto prefix = random_ids(size_t(cfg.shared_prefix), vocab, rng);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = prefix;
    const auto tail = random_ids(size_t(cfg.prompt_tokens - cfg.shared_prefix), vocab, rng);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(std::move(p));
  }
  std::unique_ptr<KVPool> kv;  // declared first: it outlives the sessions drawing from it
  std::vector<std::unique_ptr<Session>> sessions;
  ForwardState st;
  {  // Warm-up: the weights faulted in, the batch's buffers sized.
    std::vector<std::vector<int32_t>> few;
    for (const auto& p : prompts) few.emplace_back(p.begin(), p.begin() + std::min<ptrdiff_t>(8, ptrdiff_t(p.size())));
    parallel_run(model, opts, pool, cfg.kv_budget_bytes, few, 2, sessions, kv, st);
  }
  sessions.clear();
  kv.reset();
  reset_peak_rss();
  std::vector<double> decode, prefill;
  ParallelRun last;
  for (int i = 0; i < cfg.repeat; ++i) {
    last = parallel_run(model, opts, pool, cfg.kv_budget_bytes, prompts, cfg.gen_tokens, sessions, kv, st);
    decode.push_back(double(n) * cfg.gen_tokens / (last.decode_ms / 1000));
    prefill.push_back(double(n) * cfg.prompt_tokens / (last.prefill_ms / 1000));
  }
  ParallelBenchResult res;
  res.parallel = n;
  res.aggregate_decode_tok_s = median(decode);
  res.decode_tok_s = res.aggregate_decode_tok_s / n;
  res.prefill_tok_s = median(prefill);
  double sum = 0;
  for (double t : last.ttft_ms) sum += t;
  res.ttft_ms = sum / double(n);
  res.ttft_first_ms = last.ttft_ms.front();
  res.ttft_last_ms = last.ttft_ms.back();
  for (const auto& s : sessions) res.kv_logical_bytes += s->cache().logical_bytes();
  res.kv_layers = kv_layer_report(sessions.front()->cache());
  res.kv_physical_bytes = kv->physical_bytes();
  res.kv_used_bytes = kv->used_bytes();
  res.kv_shared_bytes = kv->shared_bytes();
  res.peak_rss_mb = peak_rss_mib();
  return res;
}

Bandwidth measure_bandwidth(ThreadPool& pool, size_t bytes, int trials) {
  // On huge pages, as the packed weights decode streams: over 4 KiB pages the read depends on where
  // the pages land and the TLB, and on a VM moved between about 35 and 60 GB/s from one process to
  // the next while decode did not move.
  const size_t n = std::max<size_t>(bytes / sizeof(float), 1 << 16) / 16 * 16;
  std::unique_ptr<float, void (*)(float*)> a(static_cast<float*>(huge_page_alloc(n * sizeof(float))),
                                             [](float* p) { std::free(p); });
  if (!a) throw Error("cannot allocate " + std::to_string(n * sizeof(float)) + " bytes for the bandwidth test");
  std::fill_n(a.get(), n, 1.0f);  // fault every page in before timing
  const size_t half = n / 2;
  // Parts of 16 KiB: every thread streams long contiguous runs.
  const size_t grain = 4096, kPage = 4096 / sizeof(float);
  Bandwidth bw;
  std::atomic<float> sink{0};  // keeps the sums observable
  // The two ways the products read (the faster one counts): 4 KiB at a time, each touched ahead
  // (kernels/stream.h), or 1 KiB at a time with each of its lines asked for 4 KiB ahead (the
  // K-quants; AVX2's 32-value blocks). Which is faster depends on the CPU.
  const auto read = [&](bool lines) {
    const size_t piece = lines ? kPage / 4 : kPage;
    const auto t0 = Clock::now();
    pool.parallel_for(
        n,
        [&](size_t b, size_t e) {
          float s = 0;
          for (size_t i = b; i < e; i += piece) {
            if (lines)
              for (size_t l = 0; l < piece; l += 16) __builtin_prefetch(a.get() + i + kPage + l);
            else
              touch_ahead(a.get() + i);
            s += dot(a.get() + i, a.get() + i, int(std::min(piece, e - i)));
          }
          sink.store(s, std::memory_order_relaxed);
        },
        grain);
    return double(n * sizeof(float)) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
  };
  for (int t = 0; t < trials; ++t) {
    bw.read_gb_s = std::max({bw.read_gb_s, read(false), read(true)});
    auto t0 = Clock::now();
    pool.parallel_for(
        half, [&](size_t b, size_t e) { std::memcpy(a.get() + half + b, a.get() + b, (e - b) * sizeof(float)); }, grain);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    bw.copy_gb_s = std::max(bw.copy_gb_s, 2.0 * double(half * sizeof(float)) / s / 1e9);
  }
  return bw;
}

double peak_rss_mib() { return double(peak_rss_bytes()) / double(1 << 20); }

}  // namespace ptllm
