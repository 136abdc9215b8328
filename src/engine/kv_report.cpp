#include "engine/kv_report.h"

#include <nlohmann/json.hpp>

#include "kv/kv_cache.h"

namespace ptllm {

std::vector<int> KVLayerReport::stored() const {
  std::vector<int> out;
  for (int l = 0; l < int(source.size()); ++l)
    if (source[size_t(l)] == l) out.push_back(l);
  return out;
}

bool KVLayerReport::any_shared() const { return stored().size() != source.size(); }

KVLayerReport kv_layer_report(const KVCache& kv) {
  KVLayerReport r;
  for (int l = 0; l < kv.shape().n_layers; ++l) {
    r.source.push_back(kv.kv_layer(l));
    r.logical_bytes.push_back(kv.logical_bytes(l));
    r.held_tokens.push_back(kv.held_tokens(l));
  }
  return r;
}

nlohmann::json kv_layers_json(const KVLayerReport& r) {
  return {{"stored_layers", r.stored()},
          {"source_layer", r.source},
          {"logical_bytes", r.logical_bytes},
          {"held_tokens", r.held_tokens}};
}

}  // namespace ptllm
