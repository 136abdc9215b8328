// KVCache::attend: the layer's attention plan (attention/plan.h), run by the CPU executor
// (attention/cpu.h). It only reads: the policy runs after the step (KVCache::end_step).
#include "kv/attention/cpu.h"
#include "kv/attention/plan.h"
#include "kv/cache_internal.h"

namespace ptllm {

void KVCache::attend(int layer, const float* q, int T, int n_heads, float* out, ThreadPool& pool) {
  const Layer& L = layers_[size_t(layer)];
  const attn::Plan plan(L, attn::PlanSettings{cfg_.group_size, cfg_.sink, cfg_.window}, T);
  attn::CpuStorage storage;
  storage.dense = &dense_pool_;
  storage.quant = &quant_pool_;
  storage.dense_dtype = dense_;
  storage.bits = bits_;
  storage.n_kv_heads = shape_.n_kv_heads;
  storage.head_dim = shape_.head_dim;
  storage.group_size = cfg_.group_size;
  storage.rotate = rotates_at_read();
  if (storage.rotate) {
    storage.rope_cos = rope_cos_.data() + rope_table_[size_t(layer)];
    storage.rope_sin = rope_sin_.data() + rope_table_[size_t(layer)];
  }
  storage.max_delta = max_delta_;
  attn::attend_cpu(plan, storage, q, n_heads, out, pool);
}

}  // namespace ptllm
