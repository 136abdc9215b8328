#pragma once
// What the fuzzer and its seed writer share: tiny KV caches of several configurations (dense, KIVI,
// StreamingLLM with both position schemes) that decoded states are restored into.
#include <memory>
#include <vector>

#include "kv/kv_cache.h"

namespace ptllm::fuzz {

inline KVShape fuzz_shape() {
  KVShape s;
  s.n_layers = 2;
  s.n_kv_heads = 1;
  s.head_dim = 4;
  s.rope_inv_freq = {1.0f, 0.01f};
  return s;
}

inline std::vector<KVCacheConfig> fuzz_configs() {
  std::vector<KVCacheConfig> out;
  auto add = [&](KVPrecision p, int residual, int sink, int window, PositionMode pos) {
    KVCacheConfig c;
    c.precision = p;
    c.group_size = 2;
    c.residual = residual;
    c.sink = sink;
    c.window = window;
    c.positions = pos;
    c.ctx_size = 16;
    out.push_back(c);
  };
  add(KVPrecision::F32, 0, 0, 0, PositionMode::Absolute);
  add(KVPrecision::Int4, 2, 0, 0, PositionMode::Absolute);
  add(KVPrecision::BF16, 0, 2, 4, PositionMode::Cache);
  add(KVPrecision::Int2, 2, 2, 4, PositionMode::Absolute);
  return out;
}

inline std::vector<std::unique_ptr<KVCache>> fuzz_caches() {
  std::vector<std::unique_ptr<KVCache>> out;
  for (const KVCacheConfig& c : fuzz_configs()) out.push_back(std::make_unique<KVCache>(fuzz_shape(), c));
  return out;
}

}  // namespace ptllm::fuzz
