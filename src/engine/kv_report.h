#pragma once
// Which layers of a cache store K/V and what each holds, for the memory reports of sample, bench and
// eval: a YOCO model's KV-shared layers store nothing and read another layer's (KVShape::kv_source).
#include <cstddef>
#include <cstdint>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ptllm {

class KVCache;

struct KVLayerReport {
  std::vector<int> source;            // [n_layers] the layer whose K/V each reads (itself: its own)
  std::vector<size_t> logical_bytes;  // [n_layers] what attention reads now (0 for a shared layer)
  std::vector<int64_t> held_tokens;   // [n_layers] tokens in its blocks (0 for a shared layer)
  std::vector<int> stored() const;    // the layers that store K/V
  bool any_shared() const;
};

KVLayerReport kv_layer_report(const KVCache& kv);
// {"stored_layers": [...], "source_layer": [...], "logical_bytes": [...], "held_tokens": [...]}
nlohmann::json kv_layers_json(const KVLayerReport& r);

}  // namespace ptllm
