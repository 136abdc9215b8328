#pragma once
// The CPU executor of an attention plan (attention/plan.h).
//
// Work is cut into (query tokens, KV head, part) pieces. The `group` query heads sharing a KV head
// are processed together, and in prefill those of a tile of consecutive tokens: a block's rows are
// converted (dense_*_block) or its codes unpacked (kivi_*_block) once for all of them. Each part is
// computed in three passes over its blocks (scores, softmax, values) and the parts are merged in
// order at the end (flash-decoding, Dao et al. 2023), so a single decode token keeps every thread
// busy even with 2 KV heads. Parts are computed and merged the same way whether one thread walks
// them all or they are spread over the pool: a token's output is bit for bit the same however a
// prompt was batched (the prompt cache relies on it: tests/test_prompt_cache.cpp). Cache positions
// (PositionMode::Cache) rotate each block's keys once (dequantized into a per-thread buffer when
// quantized) and the query once per block. Scratch is per thread and kept: a decode step allocates
// nothing.
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kv/attention/plan.h"

namespace ptllm {

class BlockPool;
class ThreadPool;

namespace attn {

// Where the blocks of a plan live and how they are stored.
struct CpuStorage {
  const BlockPool* dense = nullptr;  // full-precision blocks: K [kv_head][slot][head_dim], then V the same
  const BlockPool* quant = nullptr;  // KIVI groups (kernels/layout.h, kivi_offsets)
  DType dense_dtype = DType::F32;
  int bits = 0;                      // KIVI code bits (0: dense)
  int n_kv_heads = 0, head_dim = 0, group_size = 0;
  // PositionMode::Cache: keys are stored unrotated; rope_cos/rope_sin [max_delta][head_dim / 2] rotate
  // a key or a query by a distance (null when not rotating).
  bool rotate = false;
  const float *rope_cos = nullptr, *rope_sin = nullptr;
  int max_delta = 0;
};

// Causal attention of the plan's queries: q, out [T][n_heads][head_dim] (n_heads a multiple of the
// KV heads).
void attend_cpu(const Plan& plan, const CpuStorage& s, const float* q, int n_heads, float* out, ThreadPool& pool);

}  // namespace attn
}  // namespace ptllm
