#pragma once
// The KV-cache engine (DESIGN.md "The KV cache").
//
// Storage: blocks of B tokens (B = the KIVI group size) taken from pools; a block holds one layer's
// K and V for B tokens of every KV head. Each layer keeps, oldest first:
//   [ sink blocks: the first N tokens, full precision, never evicted, never quantized ]
//   [ quantized blocks: KIVI codes + scales, G = B tokens each ]                  (KIVI only)
//   [ residual blocks: the most recent tokens, full precision ]
// Dense block layout: K [kv_head][token][head_dim], then V the same.
// Each layer has a stream window (0: none): the model's sliding window (KVShape::layer_window),
// StreamingLLM's, or the narrower of the two when both apply (docs/kv-cache.md "Per-layer windows").
// Policy: after each attention call, blocks entirely out of the layer's window are given back
// and the residual's oldest full groups beyond R tokens are quantized (K per channel with scales
// computed once, V per token). Nothing stored is ever moved to make room.
// Attention (attention/plan.h: what each query sees; attention/cpu.h: the CPU executor) reads the
// blocks in parts merged by their softmax states; quantized blocks are read
// directly (the query is scaled per group, codes enter dot products), never dequantized to a copy,
// except K under PositionMode::Cache (a block at a time into a per-thread buffer, to be rotated).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/layout.h"
#include "kv/block_pool.h"
#include "kv/config.h"

namespace ptllm {

class ThreadPool;


// The blocks the sequences of one model and KV configuration draw from: full-precision blocks and
// KIVI groups. Sequences on one pool share the blocks of their common prefixes: a full block is
// published under its content key (KVCache::commit) and found by the next sequence that needs the
// same content (KVCache::adopt_prefix). Running out is an ordinary outcome: KVCache::blocks_needed
// tells before a step whether it fits (the engine checks; nothing is corrupted when it does not).
class KVPool {
 public:
  // Room for `sequences` sequences at their worst case (ctx_size tokens each, or their StreamingLLM
  // window), or, when budget_bytes > 0, as many blocks as fit that many bytes, split between
  // full-precision blocks and KIVI groups in the proportion the worst case needs them.
  // Throws ptllm::Error when the memory cannot be allocated, UsageError for a bad config.
  KVPool(const KVShape& shape, const KVCacheConfig& cfg, int sequences, size_t budget_bytes = 0);
  const KVShape& shape() const { return shape_; }
  const KVCacheConfig& config() const { return cfg_; }
  BlockPool& dense() { return dense_; }
  BlockPool& quant() { return quant_; }
  const BlockPool& dense() const { return dense_; }
  const BlockPool& quant() const { return quant_; }
  bool keyed() const { return keyed_; }
  size_t physical_bytes() const { return dense_.physical_bytes() + quant_.physical_bytes(); }
  // Bytes of the blocks referenced now (each once, however many sequences hold it).
  size_t used_bytes() const { return dense_.in_use() * dense_.block_bytes() + quant_.in_use() * quant_.block_bytes(); }
  // Bytes of the blocks more than one holder references (held once for all of them).
  size_t shared_bytes() const;
  // Blocks referenced now (both kinds).
  size_t blocks_in_use() const { return dense_.in_use() + quant_.in_use(); }

  // Exchanging token blocks with a store outside the process (kv/exchange.cpp, persist/kv_store.h).
  // A sequence's token blocks are its sink blocks (StreamingLLM: the first `sink` tokens in blocks of
  // B, the last one shorter when B does not divide them), then stream blocks of B tokens (token_block).
  // A token block travels in one of two forms, each storing layer's block in layer order:
  // - full precision: the full-precision block in the prompt-cache file's layout (KVCache::serialize),
  //   the slots past a short block's tokens zeroed: what computing the block published at the end of
  //   its step, before the policy quantized (KIVI) or evicted (a window) it;
  // - quantized (KIVI only, stream blocks): the layer's KIVI group as the policy stored it (codes,
  //   scales and zeros), published once the policy quantized the block.
  // A block so loaded and adopted is what computing it would have left (quantization is a function
  // of the group's content); the adopting sequence's policy quantizes a full-precision one itself.
  // Whether blocks can be exchanged: a keyed pool (every shared one).
  bool exchangeable() const;
  // Whether stream blocks have a quantized form (KIVI).
  bool has_quantized_form() const { return quant_.block_bytes() > 0; }
  // Bytes of one token block, every storing layer, in the given form.
  size_t exchange_bytes(bool quantized = false) const;
  struct TokenRange {
    int64_t start;
    int len;
  };
  // Token block j: its first token and its length.
  TokenRange token_block(size_t j) const;
  // Token blocks wholly within the first n tokens.
  size_t complete_blocks(int64_t n) const;
  // Sink blocks (StreamingLLM): they are never quantized.
  size_t sink_blocks() const;
  // The largest append of a sequence under a policy (KVCache::max_append: StreamingLLM, KIVI or a
  // sliding layer), and the grid a KIVI sequence's adopted prefix must end on (KVCache::cut_dependent).
  int policy_chunk() const;
  // The most token blocks a sequence adopts (KVCache::adopt_prefix): the sink blocks and the stream
  // blocks its ring holds beside a tail to compute (unbounded without a window).
  size_t adoptable_limit() const;
  // Extends `hashes` (the chained content hashes of tokens' blocks, from the first) to the first
  // n_blocks token blocks of `tokens` (which must hold them).
  void extend_block_hashes(std::span<const int32_t> tokens, size_t n_blocks, std::vector<BlockHash>& hashes) const;
  // The token block (hash h, token ids ids) if every storing layer holds it in the given form: a
  // reference taken on each (appended to `held`), else false and nothing held. `held` is opaque:
  // give it back with release_held.
  bool hold_block(const BlockHash& h, std::span<const int32_t> ids, std::vector<int32_t>& held,
                  bool quantized = false);
  // Appends the bytes of the token block to `out` if every storing layer holds it (else false).
  bool read_block(const BlockHash& h, std::span<const int32_t> ids, std::string& out, bool quantized = false);
  // The bytes read_block gives, in place, for a token block of B tokens: hold_block's references
  // taken (appended to `held`) and a view of each storing layer's block appended to `parts`,
  // valid while held (a published block is never written again). False, nothing held, for a block
  // the pool does not hold or a short one (its slots past its tokens are read_block's to zero).
  bool view_block(const BlockHash& h, std::span<const int32_t> ids, std::vector<int32_t>& held,
                  std::vector<std::string_view>& parts, bool quantized = false);
  // Writes `bytes` (exchange_bytes(quantized) of them) into fresh blocks and publishes them as
  // computing them would have, holding a reference on each; a layer that already holds the block
  // keeps its own. False (nothing held, nothing changed) when the pool has no free block left.
  bool import_block(const BlockHash& h, std::span<const int32_t> ids, std::string_view bytes,
                    std::vector<int32_t>& held, bool quantized = false);
  // Drops the references hold_block / import_block took.
  void release_held(std::vector<int32_t>& held);

  // Reuse after an edit (kv/shift.cpp). The chained hashes of a sequence whose tokens from token
  // block `shifted.from_block` on are approximate (KVCache::mark_shifted): those blocks are published
  // under a chain salted by `shifted.salt`, never under the keys an exact computation owns.
  struct Shifted {
    size_t from_block = SIZE_MAX;  // SIZE_MAX: an exact sequence
    uint64_t salt = 0;
  };
  void extend_block_hashes(std::span<const int32_t> tokens, size_t n_blocks, std::vector<BlockHash>& hashes,
                           const Shifted& shifted) const;
  // Like hold_block, each storing layer's block in whichever form the pool holds it (its KIVI group
  // first, else full precision): one entry per storing layer appended to `held`, or false and nothing.
  bool hold_block_any(const BlockHash& h, std::span<const int32_t> ids, std::vector<int32_t>& held);
  // The first n tokens of a block hold_block_any holds (an entry of `held`), as float32 rows: k and v
  // [n][kv_dim], dequantized from a KIVI group.
  void read_rows(int32_t held_entry, int n, float* k, float* v) const;

 private:
  friend class KVCache;
  KVPool(const KVShape& shape, const KVCacheConfig& cfg, size_t dense_blocks, size_t quant_blocks, bool keyed);
  KVShape shape_;
  KVCacheConfig cfg_;
  bool keyed_;
  BlockPool dense_, quant_;
};

// The shared pool has no room for a step, a rewind or an adoption: nothing was changed; the caller
// waits, pauses a sequence or evicts one (the engine's choice).
struct KVPoolFull : Error {
  using Error::Error;
};

// Blocks one step would take at most from each pool.
struct BlocksNeeded {
  size_t dense = 0, quant = 0;
};

class KVCache {
 public:
  // Throws ptllm::Error when the capacity cannot be allocated, UsageError for a bad config.
  // pool: the shared pool to draw from (its shape and config must be these); null: a private one
  // sized for this sequence's worst case, which never runs out.
  KVCache(const KVShape& shape, const KVCacheConfig& cfg, KVPool* pool = nullptr);
  ~KVCache();
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  const KVShape& shape() const { return shape_; }
  const KVCacheConfig& config() const { return cfg_; }
  // Whether the model must leave q and k unrotated (the cache applies RoPE at read).
  bool rotates_at_read() const { return cfg_.positions == PositionMode::Cache; }

  // The layer whose blocks `layer` appends to and attends over: itself, or for a KV-shared layer
  // (YOCO) its donor (KVShape::kv_source). A shared layer stores nothing: the model skips its append
  // and calls attend(kv_layer(layer), ...) with its own queries.
  int kv_layer(int layer) const { return shape_.source_of(layer); }
  bool stores(int layer) const { return shape_.stores(layer); }

  // Stores T new tokens of `layer` (a storing layer): k, v [T][n_kv_heads * head_dim]. T <= max_append().
  void append(int layer, const float* k, const float* v, int T);
  // Causal attention of the T tokens just appended to `layer`: query t (global index n_before + t)
  // sees the sinks and its own window. q, out: [T][n_heads][head_dim]. Reads only: the policy runs
  // after the step (end_step).
  void attend(int layer, const float* q, int T, int n_heads, float* out, ThreadPool& pool);

  // Gives back blocks out of the window and quantizes full groups beyond the residual for `layer`.
  void apply_policy(int layer);
  // After a step (every layer appended and attended), called by the engine: on a shared pool, the
  // blocks the step filled are published under their content keys so that other sequences find
  // them (history: every token fed so far); then the policy of every layer.
  void end_step(std::span<const int32_t> history);
  // On an empty cache: takes references to the pool's blocks for the longest prefix of `tokens`
  // whose full blocks all layers hold (at least the last token is left to compute, so that its
  // logits exist), exactly as computing them here would have left them. Past them, where the prompt
  // diverges inside a block the pool holds (or goes on past a shorter one a finished sequence left),
  // the tokens it shares with that block are copied into a fresh block of this sequence (the shared
  // one is never written), except under a cut-dependent policy (KIVI: see cut_dependent). Returns the
  // tokens adopted. accept (when given): the longest prefix whose token count it accepts is taken
  // (or nothing).
  int64_t adopt_prefix(std::span<const int32_t> tokens, const std::function<bool(int64_t)>& accept = {});
  // Blocks appending T tokens (and the policy after them) may take, at most (exact for the
  // full-precision blocks).
  BlocksNeeded blocks_needed(int T) const;
  const KVPool& pool() const { return *pool_; }
  bool shares_pool() const { return own_pool_ == nullptr; }

  // Largest T one append may take (prefill is fed in chunks of at most this).
  int max_append() const;
  // Whether `more` tokens fit (always under StreamingLLM, and when every layer slides within ctx_size).
  bool fits(int64_t more) const;
  // Whether the policy evicts or quantizes between appends (StreamingLLM, KIVI or a sliding layer),
  // so that how a prompt is cut into appends changes what is stored (the prompt cache's grid).
  bool has_policy() const { return cfg_.streaming() || bits_ > 0 || windows_; }
  // Whether what a query sees depends on where the appends were cut (KIVI: a group is quantized when
  // the policy runs after an append, so a query of the next append reads it quantized, one of the
  // same append reads it in full precision). Eviction never does: a query never sees what its
  // window left. So under it the pool is given only the blocks computed as appends of max_append()
  // tokens from the first would compute them (a prompt's prefill chunks, not the decode steps after
  // a group was quantized), and a prefix adopted from the pool gives a cold computation's output
  // exactly when it ends where the cold computation's appends are cut (Scheduler: its prefill grid).
  bool cut_dependent() const { return bits_ > 0; }
  // Tokens appended so far (the position counter), and tokens attention sees now (the most any layer
  // sees: a sliding layer sees its window).
  int64_t n_tokens() const;
  int n_stored() const;
  // Tokens `layer` holds in its blocks now (the sinks and the stream from its first block's first
  // slot, masked ones included): what its memory grows with.
  int64_t held_tokens(int layer) const;

  // Rewinds to the first n tokens. Possible down to rewind_floor(): tokens already evicted or
  // quantized cannot be restored; below it, throws ptllm::Error and changes nothing.
  void truncate(int64_t n);
  int64_t rewind_floor() const;
  void clear();

  // Speculative decoding (kv/draft.cpp). The most tokens one append may take so that each of its
  // queries sees what it would see were the tokens appended one step at a time (KIVI quantizes a
  // group between steps; eviction never changes what a query sees); at least 1.
  int exact_append() const;
  // Keeps the first n tokens of those appended since the last end_step (drafts the model rejected);
  // end_step was not called for them, so nothing of theirs was published, evicted or quantized and
  // the blocks dropped are this sequence's own: no copy, no room needed. The caller then calls
  // end_step for the tokens kept.
  void drop_unstepped(int64_t n);

  // Reuse after an edit (kv/shift.cpp): T tokens of `layer` whose K and V another sequence computed
  // `delta` positions away from where they go now (k, v: [T][kv_dim] float32, K as stored there).
  // K is rotated again by delta (RoPE composes: R(p + delta) = R(delta) R(p)) unless the cache rotates
  // at read; V is position-free. Then appended as append() does (k is rotated in place). What they
  // attended to was another context: an approximation, exact in the first layer only.
  void append_shifted(int layer, float* k, const float* v, int T, int64_t delta);
  // From the next token on this sequence holds approximate K/V: its blocks from there are published
  // under a chain salted by `salt` (KVPool::Shifted), which exact adoption never looks up. Undone by a
  // rewind to before that point or clear().
  void mark_shifted(uint64_t salt);
  // The retention class of this sequence's tokens (block_pool.h: which cached blocks the pool takes
  // first): the blocks it publishes or adopts get the lowest class of the spans their tokens touch;
  // tokens past the last span are Transient (generated). No spans (the default): every block User.
  void set_retention(std::vector<RetentionSpan> spans) { retention_ = std::move(spans); }
  Retention retention_of(int64_t first, int64_t end) const;

  // The first token published under the salted chain (-1: none), and the salt.
  int64_t shifted_from() const { return shifted_from_; }
  uint64_t shift_salt() const { return shift_salt_; }

  size_t logical_bytes() const;   // what attention reads for the stored tokens, scales included
  size_t logical_bytes(int layer) const;  // the same for one layer (0 for a KV-shared one)
  size_t physical_bytes() const;  // what the pools hold allocated (a shared pool: all of it)

  // The stored state (every layer's bookkeeping and the bytes of every block in use), for the
  // prompt cache. deserialize() needs a fresh cache built with the same shape and config; it checks
  // every count against them and throws ptllm::Error (leaving the cache empty) on any inconsistency.
  void serialize(std::string& out) const;
  void deserialize(std::string_view in);

  // One stored token's K or V for KV head g as float32 (dequantized when needed; tests and
  // persistence). `index` is the global token index; it must still be stored.
  void read_key(int layer, int64_t index, int g, float* out) const;
  void read_value(int layer, int64_t index, int g, float* out) const;

 private:
  struct Layer;
  struct Located;
  Located locate(int layer, int64_t index) const;
  void quantize_block(Layer& L, size_t entry);
  void own_block(int32_t& id);
  using TokenBlock = KVPool::TokenRange;
  TokenBlock token_block(size_t j) const { return pool_->token_block(j); }
  struct Adopted {
    int32_t id;
    bool quantized;
  };
  size_t adoptable_blocks(std::span<const int32_t> tokens, std::vector<Adopted>& got);
  size_t adopt_partial(std::span<const int32_t> tokens, size_t m, const std::function<bool(int64_t)>& accept,
                       std::vector<int32_t>& copies);
  void publish_tail();
  bool adoption_exact(size_t m, const std::vector<Adopted>& got, size_t* to_quantize) const;

  KVShape shape_;
  KVCacheConfig cfg_;
  DType dense_;            // storage dtype of full-precision blocks
  int bits_ = 0;           // KIVI code bits (0: dense)
  size_t dense_token_bytes_;  // one token of one layer, K and V, all heads
  std::unique_ptr<KVPool> own_pool_;  // a private pool (null when drawing from a shared one)
  KVPool* pool_;
  BlockPool& dense_pool_;
  BlockPool& quant_pool_;
  // Prefix keys: the chained key of the token blocks published so far (kv/prefix.cpp).
  uint64_t chain_lo_ = 0, chain_hi_ = 0;
  size_t n_keyed_ = 0;
  // Under a cut-dependent policy (KIVI) only the blocks a cold computation would store alike are
  // published: canon_ leading tokens were computed as appends of chunk_ tokens from the first would
  // have (same_cut); stepped_: the tokens stored at the last end_step.
  int64_t canon_ = 0, stepped_ = 0;
  bool same_cut(int64_t t, int64_t s) const;
  // Approximate tokens from here on (mark_shifted); -1: none.
  int64_t shifted_from_ = -1;
  uint64_t shift_salt_ = 0;
  std::vector<RetentionSpan> retention_;
  // The token ids of the last, partly filled token block at the last end_step (tail_block_ its
  // index), published when the sequence lets go of its blocks (clear): a later prompt that goes on
  // past them copies them (adopt_prefix) instead of computing them.
  // Only tokens before the first one an append of at most kMatmulSmallRows (kernels/ops.h) computed
  // go: its rows (a decode step's) may differ in their last bits from a cold prompt's larger batch,
  // and every later token attended to them. narrow_lo_, narrow_hi_: from that token to the end of
  // the last such append (empty: none); last_n_: tokens at the last step.
  std::vector<int32_t> tail_ids_;
  size_t tail_block_ = 0;
  int64_t tail_end_ = 0, last_n_ = 0, narrow_lo_ = 0, narrow_hi_ = 0;
  std::vector<Layer> layers_;
  std::vector<int> stored_;  // the layers that store K/V (all but YOCO's KV-shared ones), ascending
  // PositionMode::Cache: [table][delta][head_dim/2], one table per distinct frequency set
  // (KVShape::inv_freq_of), rope_table_[layer] the offset of a layer's.
  std::vector<float> rope_cos_, rope_sin_;
  std::vector<size_t> rope_table_;
  int max_delta_ = 0;
  int chunk_ = 0;
  bool windows_ = false;    // some layer slides
  bool unbounded_ = false;  // no context limit: StreamingLLM, or every layer slides within ctx_size
};


}  // namespace ptllm
