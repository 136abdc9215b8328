#pragma once
// Internal to src/kv: the per-layer bookkeeping of a KVCache (its block tables, block_table.h) and
// the bounds that size its pools, shared by the files that implement KVCache (kv_cache.cpp: storage and counts,
// attention/attend.cpp, policy.cpp, prefix.cpp, state.cpp).
#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kv/block_table.h"
#include "kv/kv_cache.h"

namespace ptllm {
namespace kvdetail {

// Prefill chunk under StreamingLLM or KIVI: bounds the full-precision blocks a batched pass needs.
inline constexpr int kChunk = 64;

struct Bounds {
  size_t sink_blocks, dense_stream_blocks, quant_blocks;
};

// One layer's blocks; window: its stream window (0: none); bounded: at most ctx_size tokens are
// ever appended.
inline Bounds block_bounds(const KVCacheConfig& c, int chunk, int window, bool bounded) {
  const int B = c.group_size;
  Bounds b{};
  b.sink_blocks = c.streaming() ? ceil_div(c.sink, B) : 0;
  // Stream tokens held while a chunk attends: its window (M - 1 before the first query), the chunk,
  // up to B - 1 masked tokens of a partly evicted block, and one block of alignment slack.
  size_t window_blocks = window > 0 ? ceil_div(int64_t(window) + chunk + B - 2, B) + 1 : ceil_div(c.ctx_size, B);
  if (bounded) window_blocks = std::min(window_blocks, ceil_div(c.ctx_size, B));
  if (is_kivi(c.precision)) {
    b.dense_stream_blocks = std::min(window_blocks, ceil_div(int64_t(c.residual) + B - 1 + chunk, B) + 1);
    b.quant_blocks = window_blocks;
  } else {
    b.dense_stream_blocks = window_blocks;
    b.quant_blocks = 0;
  }
  return b;
}

// Prefill chunk: bounded when a policy (StreamingLLM, KIVI, a sliding layer) limits the
// full-precision blocks a batched pass may hold.
inline int chunk_for(const KVShape& shape, const KVCacheConfig& c) {
  return (c.streaming() || is_kivi(c.precision) || shape.any_window()) ? kChunk : c.ctx_size;
}
// Without StreamingLLM the context is limited by ctx_size unless every layer forgets what leaves its
// window; a window wider than ctx_size never slides within it, so that limit stays.
inline bool unbounded_for(const KVShape& shape, const KVCacheConfig& c) {
  bool all_slide = true;
  for (int l = 0; l < shape.n_layers; ++l)
    if (shape.stores(l)) all_slide = all_slide && shape.window_of(l) > 0 && shape.window_of(l) <= c.ctx_size;
  return c.streaming() || all_slide;
}
// Stream tokens a query of layer l sees, itself included (0: all): the layer's own window, StreamingLLM's,
// or the narrower of the two.
inline int stream_window(const KVShape& shape, const KVCacheConfig& c, int l) {
  const int native = shape.window_of(l);
  return native > 0 && c.streaming() ? std::min(native, c.window) : std::max(native, c.window);
}
// The prefix keys of token blocks (prefix.cpp): a root over the KV settings and the shape, then
// key(block j) = H(key(block j-1), its first index, its token ids).
using Key128 = BlockHash;
Key128 root_key(const KVShape& shape, const KVCacheConfig& cfg);
Key128 chain_key(Key128 parent, int64_t start, std::span<const int32_t> tokens);
// The parent of the first approximate block of a shifted sequence (kv/shift.cpp).
Key128 salted_key(Key128 parent, uint64_t salt);

// Per sequence, worst case: full-precision blocks and KIVI groups, over every layer.
inline std::pair<size_t, size_t> blocks_per_sequence(const KVShape& shape, const KVCacheConfig& c) {
  const int chunk = chunk_for(shape, c);
  const bool bounded = !unbounded_for(shape, c);
  size_t dense = 0, quant = 0;
  for (int l = 0; l < shape.n_layers; ++l) {
    if (!shape.stores(l)) continue;  // a KV-shared layer reads its donor's blocks
    const Bounds b = block_bounds(c, chunk, stream_window(shape, c, l), bounded);
    dense += b.sink_blocks + b.dense_stream_blocks;
    quant += b.quant_blocks;
  }
  return {dense, quant};
}

}  // namespace kvdetail

// One layer's block table (block_table.h). A KV-shared layer (KVShape::kv_source) keeps an empty
// one: the model appends to and attends over its donor's (KVCache::kv_layer), and every loop over
// stored blocks (policy, prefix keys, serialization) walks the storing layers only (KVCache::stored_).
struct KVCache::Layer : kvdetail::BlockTable {};

// Where one stored token lives.
struct KVCache::Located {
  const uint8_t* block;
  bool quantized;
  int slot;
};

}  // namespace ptllm
