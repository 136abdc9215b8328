#pragma once
// Reuse after an edit (llama.cpp's --cache-reuse / n_cache_reuse): when a new prompt differs from a
// history the pool still holds (a turn dropped, a tool output summarized, earlier reasoning removed),
// the runs of that history's tokens that reappear later in the prompt, each at least N tokens, are
// taken by shifting their K/V to their new positions (KVCache::append_shifted) instead of computing
// them. An approximation: a shifted token's K/V attended to the old context, not the new one
// (docs/agent-cache.md "Reuse after an edit" has its measured cost). Opt-in per request; exact
// prefix adoption is unchanged and never sees a shifted block.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/kv_cache.h"

namespace ptllm {

class Session;

// A history whose blocks the pool may still hold: its tokens and where its salted chain begins.
struct CachedHistory {
  std::vector<int32_t> tokens;
  KVPool::Shifted shifted;
};
// What a session's history is, for a later request to shift from.
CachedHistory cached_history(const Session& s);

// A run of `len` cached tokens from cached index `src`, taken at prompt index `dst`.
struct ReuseChunk {
  int64_t src = 0, dst = 0, len = 0;
};

// The runs to shift (llama.cpp's server walk): from prompt index `from` (what the session holds
// already), the rest of the prefix both share (a run of its own at the same positions, however
// short), then every run of at least min_len cached tokens equal to the prompt's next ones, cached
// tokens that match nothing being skipped (dropped from the history). Only the
// first `cached_avail` cached tokens count, and the prompt's last token is never taken (its logits
// are computed). With max_gap 0 runs are contiguous in the prompt, as llama-server's: the first
// unmatched prompt token ends the walk. With max_gap > 0, up to that many prompt tokens no run
// supplies (an inserted summary, a token merged at the seam of a cut) may come before the next run:
// they are computed, then the run is shifted after them; and a run may come from earlier in the
// history than the last one (a turn moved), the runs after the last one being preferred.
std::vector<ReuseChunk> plan_cache_reuse(std::span<const int32_t> cached, int64_t cached_avail,
                                         std::span<const int32_t> prompt, int64_t from, int64_t min_len,
                                         int64_t max_gap = 0);

// Appends the chunks (plan_cache_reuse, from the session's position) to `session`, K/V read from
// the pool's blocks of `history` and shifted; stops at the first block the pool no longer holds or
// when an append would leave fewer than `reserve_dense` full-precision blocks free. The first
// append marks the session's cache as shifted under `salt`. Returns the tokens appended.
int64_t apply_cache_reuse(Session& session, KVPool& pool, const CachedHistory& history,
                          std::span<const int32_t> prompt, std::span<const ReuseChunk> chunks, uint64_t salt,
                          size_t reserve_dense);

// Empty when min_len (a request's n_cache_reuse, or --cache-reuse: `name`) can be used with this KV
// configuration, else why not, naming it: below the block size, negative, or under StreamingLLM.
std::string cache_reuse_error(int64_t min_len, const KVCacheConfig& kv, std::string_view name);

}  // namespace ptllm

namespace ptllm {

class Model;
class ThreadPool;
struct SessionOptions;

// What reuse after an edit costs (bench --cache-reuse): a history of keep + drop + rest tokens of
// `text` is computed on a shared pool; the edited prompt drops its `drop` tokens after the first
// `keep`, and the next `score` tokens of `text` follow it. The edited prompt is computed three ways:
// from scratch (the reference), with exact prefix reuse only, and with reuse after the edit
// (runs of at least min_len tokens shifted); the scored tokens are teacher-forced after each.
struct ReuseMeasureConfig {
  int64_t keep = 300, drop = 400, rest = 800, score = 64;
  int min_len = 256;
};
struct ReuseMeasurement {
  int64_t prompt_tokens = 0;                     // of the edited prompt
  int64_t adopted = 0, shifted = 0;              // taken exactly, taken by shifting
  int64_t computed_exact = 0, computed_reuse = 0;  // prompt tokens computed: exact reuse only, with shifting
  double kl_mean = 0, kl_max = 0;                // KL(reference || shifted) per scored token, nats
  double kl_exact_max = 0;                       // the same for exact reuse (0 but for float order)
  double nll_reference = 0, nll_reuse = 0;       // mean NLL of the scored tokens
  double top1_agreement = 0;                     // scored positions whose argmax is the reference's
};
ReuseMeasurement measure_cache_reuse(const Model& model, const SessionOptions& opts, ThreadPool& threads,
                                     std::span<const int32_t> text, const ReuseMeasureConfig& cfg);
// The same for any edit: `history` computed on a shared pool, then `prompt` three ways and `scored`
// teacher-forced after each. max_gap: prompt tokens no run supplies computed between runs, as the
// server does (plan_cache_reuse; the server's is its prefill chunk).
ReuseMeasurement measure_cache_reuse(const Model& model, const SessionOptions& opts, ThreadPool& threads,
                                     std::span<const int32_t> history, std::span<const int32_t> prompt,
                                     std::span<const int32_t> scored, int min_len, int64_t max_gap = 0);

// A conversation's turns, each measured against a recompute as above, where the reused K/V compounds:
// each turn's history is the previous turn's reuse session as a server holds it after the reply (its
// prompt, partly shifted, and the reply teacher-forced after it), so that a run shifted at one turn
// may be shifted again at the next. turns[t].prompt is turn t's whole prompt, turns[t].scored the reply
// scored after it. The first turn has no history: it is exact.
struct TraceTurn {
  std::vector<int32_t> prompt, scored;
};
std::vector<ReuseMeasurement> measure_cache_reuse_trace(const Model& model, const SessionOptions& opts,
                                                        ThreadPool& threads, std::span<const TraceTurn> turns,
                                                        int min_len, int64_t max_gap = 0);

}  // namespace ptllm
