#pragma once
// The KV manager a scheduler talks to (DESIGN.md "Layers": kv/; vLLM v1's KVCacheManager is the
// model): the room a step, a new prompt's first chunk or a copy takes in the shared pool, counted in
// the pool's own terms (blocks of the storing layers, both kinds), so that the scheduler holds no
// block arithmetic of its own. The pool (block_pool.h) and the caches (kv_cache.h: blocks_needed,
// adopt_prefix) stay the mechanism; a miss is an ordinary false, never an error.
#include <cstddef>
#include <cstdint>

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

 private:
  KVPool& pool_;
  size_t stored_layers_ = 0;
};

}  // namespace ptllm
