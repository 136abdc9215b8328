#pragma once
// The KV manager a scheduler talks to (DESIGN.md "Layers": kv/; vLLM v1's KVCacheManager is the
// model): the blocks a prompt finds computed (get_computed_blocks), their adoption into a sequence
// (allocate_computed) and the room a step, a new prompt's first chunk or a copy takes in the shared
// pool (can_append, fits: what allocate_slots checks), and the blocks going back (free), counted in
// the pool's own terms (blocks of the storing layers, both kinds), so that the scheduler holds no
// block arithmetic of its own. The pool (block_pool.h) and the caches (kv_cache.h: blocks_needed,
// adopt_prefix) stay the mechanism; a miss is an ordinary false, never an error.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kv/kv_cache.h"

namespace ptllm {

class KVManager {
 public:
  explicit KVManager(KVPool& pool);
  KVPool& pool() { return pool_; }
  const KVPool& pool() const { return pool_; }

  // Full-precision blocks kept free for the next decode step of `running` sequences: one block of
  // each storing layer a sequence (a shared layer stores none: YOCO).
  size_t decode_reserve(size_t running) const;
  // The same and room for a prefill chunk of `chunk` tokens beside them (a block more: the chunk may
  // begin inside one).
  size_t prefill_reserve(size_t running, int chunk) const;
  // Whether `cache` can append T tokens (and run its policy) leaving `reserve` full-precision blocks
  // free for other sequences.
  bool can_append(const KVCache& cache, int T, size_t reserve = 0) const;
  // One step's appends together: add_need adds what `cache` appending T tokens takes to `sum`, fits
  // says whether the pool has room for the sum.
  void add_need(const KVCache& cache, int T, BlocksNeeded& sum) const;
  bool fits(const BlocksNeeded& sum) const;
  // Tokens the complete token blocks within the first n tokens hold (what a history can give whole).
  int64_t complete_tokens(int64_t n) const;
  // Bytes of the blocks a pool reference list holds (KVPool::hold_block's `held`) of one kind.
  size_t held_bytes(size_t blocks, bool quantized) const;
  // Bytes of the whole pool (both kinds).
  size_t capacity_bytes() const;

  // The token blocks an n-token prompt may take: its whole blocks but the last token's (computed for
  // its logits), no more than a sequence adopts, ending where `exact` accepts the tokens they hold.
  size_t adoptable_blocks(int64_t n, const std::function<bool(int64_t)>& exact) const;
  // get_computed_blocks: of token blocks first..n-1 of `tokens` (their chained hashes extended into
  // `hashes`), the run from `first` the pool holds, each storing layer's block in full precision or,
  // under KIVI past the sink blocks, as its quantized group: a reference taken on each (appended to
  // `held`, given back with free). Returns the run's length.
  size_t get_computed_blocks(std::span<const int32_t> tokens, size_t first, size_t n, std::vector<BlockHash>& hashes,
                             std::vector<int32_t>& held);
  // Of a sequence's first `adopted` blocks (hashes: at least theirs), the leading run the pool holds in
  // its final form: all of them; under KIVI the sinks and the run of quantized groups (a block adopted
  // in full precision reaches its final form once this sequence quantizes it).
  size_t final_form_blocks(std::span<const int32_t> tokens, std::span<const BlockHash> hashes, size_t adopted);
  // allocate, for the computed blocks: takes into an empty cache the longest prefix of `tokens` the
  // pool holds that `accept` takes (KVCache::adopt_prefix), then frees `held` (the cache holds its own
  // references now; the rest stay findable). Returns the tokens adopted.
  int64_t allocate_computed(KVCache& cache, std::span<const int32_t> tokens, const std::function<bool(int64_t)>& accept,
                            std::vector<int32_t>& held);
  // free: a sequence's blocks back to the pool (the published ones stay findable, its last partial
  // block published: KVCache::clear), or the references get_computed_blocks or a pin took.
  void free(KVCache& cache);
  void free(std::vector<int32_t>& held);

 private:
  KVPool& pool_;
  size_t stored_layers_ = 0;
};

}  // namespace ptllm
