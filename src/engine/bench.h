#pragma once
// The measurements behind `posttrainllm bench`: prefill and decode speed of a Session, the
// machine's memory bandwidth, peak RSS, and the decode floor they imply (DESIGN.md "Performance
// model": a decode step reads every weight once plus the stored K/V).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/platform.h"
#include "engine/kv_report.h"
#include "engine/session.h"

namespace ptllm {

class ThreadPool;

struct BenchConfig {
  int prompt_tokens = 512;  // measured prefill
  int gen_tokens = 128;     // measured decode steps
  int repeat = 3;           // runs; speeds are the median
  int context = 0;          // tokens in the cache before the measured prompt (prefilled, not timed)
  uint64_t seed = 1;        // the random token ids
  // Decode from the context's depth, as llama-bench's tg test: after the timed prompt the cache goes
  // back to the context's tokens (Session::truncate; rebuilt in a fresh session, untimed, where it
  // cannot rewind: KIVI-quantized or evicted tokens). false: decode continues after the prompt.
  bool decode_at_context = false;
};

struct BenchRun {
  double prefill_ms = 0;  // feeding the prompt
  double ttft_ms = 0;     // prompt fed and the first token chosen (greedy)
  double decode_ms = 0;   // gen_tokens steps of one token each
  int64_t decode_depth = 0;  // tokens in the sequence when decode started
  bool rebuilt = false;      // decode_at_context: the cache could not rewind and was rebuilt
};

struct BenchResult {
  std::vector<BenchRun> runs;
  double prefill_tok_s = 0, decode_tok_s = 0, ttft_ms = 0;  // medians over the runs
  // The cache after the last run (zeros without a cache).
  size_t kv_logical_bytes = 0, kv_physical_bytes = 0;
  int kv_stored = 0;
  int64_t kv_tokens = 0;
  KVLayerReport kv_layers;  // which layers store K/V, the bytes of each
  // Bytes one decode step reads: the weights it streams, and the stored K/V attention reads
  // (its logical bytes, averaged over the measured steps).
  size_t weight_bytes_per_token = 0;
  size_t kv_bytes_per_token = 0;
};

// Runs an untimed warm-up (which faults the mapped weights in), then `repeat` measured runs, each
// in a fresh Session: context, then the prompt, then greedy decode (after the prompt, or from the
// context's depth: BenchConfig::decode_at_context). Token ids are random. beside_decode (when given)
// is called in each measured run right before its decode is timed (after = false) and right after
// (after = true), outside the timings: the bandwidth is measured there.
BenchResult run_bench(const Model& model, const SessionOptions& opts, ThreadPool& pool, const BenchConfig& cfg,
                      const std::function<void(int run, bool after)>& beside_decode = {});

// `bench --parallel`: n sequences prefilled one after another (each its own random prompt of
// prompt_tokens, the first shared_prefix of them common to all), then decoding together, one batched
// step for all of them per token (the weights read once a step).
struct ParallelBenchConfig {
  int prompt_tokens = 128;
  int gen_tokens = 64;
  int shared_prefix = 0;  // <= prompt_tokens
  int repeat = 1;         // runs; speeds are the median
  uint64_t seed = 1;
  size_t kv_budget_bytes = 0;  // the shared pool's size (0: room for every sequence's worst case)
};

struct ParallelBenchResult {
  int parallel = 0;
  double aggregate_decode_tok_s = 0;  // n * gen_tokens / the decode time (median over the runs)
  double decode_tok_s = 0;            // per sequence: they step together, so aggregate / n
  double prefill_tok_s = 0;           // all prompts' tokens / the time to prefill them all
  double ttft_ms = 0;                 // mean over the sequences of their prompt fed + first token chosen
  double ttft_first_ms = 0, ttft_last_ms = 0;  // the first sequence's and the last one's
  size_t kv_logical_bytes = 0;   // summed over the sequences
  KVLayerReport kv_layers;       // the first sequence's
  size_t kv_physical_bytes = 0;  // what the shared pool holds allocated
  size_t kv_used_bytes = 0;      // the blocks referenced at the end, each once
  size_t kv_shared_bytes = 0;    // logical bytes held once for several sequences
  double peak_rss_mb = 0;
};

// Runs an untimed warm-up, then `repeat` measured runs with n sessions (fresh each run).
ParallelBenchResult run_parallel_bench(const Model& model, const SessionOptions& opts, ThreadPool& pool,
                                       const ParallelBenchConfig& cfg, int n);

// Weight bytes a decode step streams: every tensor, except an untied embedding table (one row of it
// is read, not the table).
size_t decode_weight_bytes(const Model& model);

struct Bandwidth {
  // A SIMD sum over the buffer, split over the pool, each thread's stream asked for ahead as the
  // products ask for their weights (touched every 4 KiB, or line by line: the faster): what decode does.
  double read_gb_s = 0;
  double copy_gb_s = 0;  // memcpy, counted as bytes read plus bytes written (STREAM's convention)
};
// STREAM-style: best of `trials` passes over `bytes` of memory (read) and bytes/2 -> bytes/2 (copy).
// The buffer is on transparent huge pages where the kernel allows them, as the packed weights are.
Bandwidth measure_bandwidth(ThreadPool& pool, size_t bytes, int trials);

// The process's peak resident set in MiB (core/platform.h's peak_rss_bytes; reset_peak_rss restarts
// it where the system allows); 0 where unknown.
double peak_rss_mib();

}  // namespace ptllm
