#pragma once
// A Session: the token history, the position counter and the KV cache of one generation.
// Prefill and decode are both `feed`: T tokens in, logits out.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"

namespace ptllm {

class KVManager;
class ThreadPool;

struct SessionOptions {
  KVCacheConfig kv;
  bool use_cache = true;  // false: recompute the whole sequence every step (the reference path)
};

class Session {
 public:
  // Throws ptllm::Error if the cache cannot be allocated. kv_pool: a pool shared with other sessions
  // (same model and KV options): a prompt's first feed then takes the blocks of the longest prefix
  // the pool already holds instead of computing them; null: a private pool.
  Session(const Model& model, const SessionOptions& opts, ThreadPool& pool, KVPool* kv_pool = nullptr);

  // Feeds tokens (a prompt: one batched pass; a sampled token: one step) and returns the logits
  // of the last one [vocab]. Throws ptllm::Error if the context would exceed --ctx-size.
  std::span<float> feed(std::span<const int32_t> tokens);
  // Same, returning the logits of every fed token [T][vocab] (teacher forcing).
  std::span<float> feed_all(std::span<const int32_t> tokens);

  // One forward pass for several sessions of one model (every weight matrix read once for all of
  // them): sessions[i] is fed tokens[i], at most its max_chunk() tokens (decode: one each). Then each
  // session's last_logits() are its last token's. st holds the batch's activations (kept by the
  // caller, so steps allocate nothing once warmed up). Throws ptllm::Error, feeding none of them,
  // when one would not fit its context.
  // drafts (when given): drafts[i] != 0 feeds session i as feed_draft() does (its step left open, the
  // logits of every token kept: draft_rows()), for commit_draft() to close.
  static void feed_batch(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> tokens,
                         ForwardState& st, std::span<const uint8_t> drafts = {});
  // Most tokens one feed_batch() may give this session.
  int max_chunk() const;

  // Rewinds to the first n tokens of the history (a conversation whose template rewrote a turn, a
  // regenerated reply): the next feed continues from there. Throws ptllm::Error and changes nothing
  // when the cache cannot go back that far (tokens already evicted or quantized: see
  // KVCache::rewind_floor) or when n exceeds the history. The last logits are gone until the next feed.
  void truncate(int64_t n);

  // Speculative decoding (engine/speculative.h): feeds the last sampled token and drafted ones in
  // one pass and returns the logits of every one [T][vocab], leaving the step open (nothing
  // published, no policy run: KVCache::drop_unstepped) until commit_draft(n) keeps the first n of
  // them, 1 <= n <= T; the rest are rewound without a copy and last_logits() are the n-th token's.
  // T is at most max_draft_append().
  std::span<float> feed_draft(std::span<const int32_t> tokens);
  void commit_draft(int64_t n);
  // The logits of every token of the open draft step [T][vocab].
  std::span<float> draft_rows();
  int max_draft_append() const;

  // Tokens of the last feed taken from the shared pool instead of computed.
  int64_t reused_tokens() const { return reused_; }
  // On a fresh session drawing from a shared pool: takes the pool's blocks for the longest prefix of
  // `prompt` it holds (at least the last token is left to feed) and returns how many tokens that is;
  // what feed() does first on its own, for a caller that feeds the rest in chunks (feed_batch).
  // 0 with a private pool or without room. accept (when given): only a prefix whose token count it
  // accepts is taken (adoption_is_exact).
  int64_t adopt_prefix(std::span<const int32_t> prompt, const std::function<bool(int64_t)>& accept = {});
  // The same through a scheduler's KV manager (KVManager::allocate_computed), which then frees `held`
  // (references its get_computed_blocks took).
  int64_t adopt_prefix(KVManager& kv, std::span<const int32_t> prompt, const std::function<bool(int64_t)>& accept,
                       std::vector<int32_t>& held);
  // Gives every KV block back through the manager (KVManager::free); the session is empty after.
  void release(KVManager& kv);
  // From now on the first feed() of an empty session computes every token: only adopt_prefix takes
  // the pool's blocks (a caller that checks an adoption's exactness itself: engine/prompt_blocks.h).
  void adopt_only_explicitly() { auto_adopt_ = false; }

  // Reuse after an edit (engine/cache_reuse.h): appends `ids` without a forward pass, their K/V
  // written by `rows(layer, k, v)` for each storing layer (k, v: [ids.size()][kv_dim], as computed
  // `delta` positions away; K is rotated by delta: KVCache::append_shifted). The first such append
  // marks the cache shifted under `salt`. At most max_chunk() tokens; the last logits are gone until
  // the next feed.
  void append_shifted(std::span<const int32_t> ids, int64_t delta, uint64_t salt,
                      const std::function<void(int layer, float* k, float* v)>& rows);

  // The retention classes of this sequence's tokens in a shared pool (KVCache::set_retention).
  void set_retention(std::vector<RetentionSpan> spans) {
    if (cache_) cache_->set_retention(std::move(spans));
  }

  // Whether `more` tokens can still be fed (always, under StreamingLLM).
  bool fits(int64_t more) const;
  const std::vector<int32_t>& history() const { return history_; }
  // Logits of the last token fed [vocab] (empty before the first feed).
  std::span<const float> last_logits() const;
  // Restores a saved state (prompt cache): the token history, the KV cache's serialized state and
  // the logits of the last token. Needs a fresh session (nothing fed) with the same options;
  // throws ptllm::Error and stays empty if the state does not fit them.
  void restore(std::span<const int32_t> history, std::string_view kv_state, std::span<const float> last_logits);
  int64_t position() const { return int64_t(history_.size()); }
  // The KV cache (not available with use_cache = false).
  const KVCache& cache() const { return *cache_; }
  bool has_cache() const { return cache_ != nullptr; }
  const Model& model() const { return model_; }
  const SessionOptions& options() const { return opts_; }

 private:
  std::span<float> run(std::span<const int32_t> tokens, bool all_logits);
  void check_room(int T) const;
  static void check_room(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> tokens);

  const Model& model_;
  SessionOptions opts_;
  ThreadPool& pool_;
  std::unique_ptr<KVCache> cache_;
  ForwardState state_;
  std::vector<float> logits_;  // [T][vocab]
  size_t last_row_ = 0;        // row of logits_ holding the last token's logits
  std::vector<int32_t> history_;
  int64_t reused_ = 0;
  bool auto_adopt_ = true;     // feed() on an empty session adopts the pool's prefix first
  bool logits_valid_ = false;  // false after a rewind, until the next feed
  int64_t draft_from_ = -1;    // position before an open feed_draft step (-1: none)
  std::vector<float> shift_k_, shift_v_;  // append_shifted's rows
};

// The default KV capacity: min(max_position_embeddings, 4096), as DESIGN.md says.
int default_ctx_size(const ModelConfig& cfg);

// Whether adopting the first `adopted` tokens of an n-token prompt from a pool, then feeding the rest
// in appends of `chunk` tokens (the last one shorter), computes every token bit for bit as feeding the
// whole prompt that way does: the prefix ends on `grid` (1, or KVCache::cut_dependent's grid), and
// the last append is as long as the cold computation's or both take matmul's batched path (more
// than kMatmulSmallRows rows: a row's result depends on which path computed it).
bool adoption_is_exact(int64_t n, int64_t adopted, int64_t chunk, int64_t grid);

}  // namespace ptllm
