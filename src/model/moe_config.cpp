// Qwen3-MoE's config.json fields (kept apart from the expert kernels: the config readers, and the
// fuzz target of config.json, link this alone).
#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "model/moe.h"

namespace ptllm {

bool MoeConfig::sparse(int layer) const {
  if (!enabled()) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

namespace {

constexpr int64_t kMaxExperts = 1 << 16;

constexpr int64_t kMaxWidth = int64_t(1) << 20;

int int_field(const nlohmann::json& j, const std::string& file, const char* key, int64_t lo, int64_t hi,
              std::optional<int> dflt) {
  if (!j.contains(key) || j[key].is_null()) {
    if (!dflt) throw Error(file + ": field '" + key + "' is missing (a mixture-of-experts model needs it)");
    // A default can fall outside what the other fields allow (top-8 of 6 experts).
    if (*dflt < lo || *dflt > hi)
      throw Error(file + ": field '" + key + "' is missing, and its default " + std::to_string(*dflt) +
                  " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]: give it");
    return *dflt;
  }
  const nlohmann::json& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    throw Error(file + ": field '" + key + "' must be an integer in [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "], got " + v.dump());
  return int(v.get<int64_t>());
}

}  // namespace

void parse_moe_config(const nlohmann::json& j, const std::string& file, int n_layers, MoeConfig& m) {
  // Absent fields take Qwen3MoeConfig's defaults (128 experts, top-8, 768 wide), as transformers reads
  // them; num_local_experts is the attribute num_experts maps to.
  const char* experts_key = !j.contains("num_experts") && j.contains("num_local_experts") ? "num_local_experts"
                                                                                         : "num_experts";
  m.num_experts = int_field(j, file, experts_key, 1, kMaxExperts, 128);
  m.top_k = int_field(j, file, "num_experts_per_tok", 1, std::min<int64_t>(m.num_experts, kMaxTopK), 8);
  m.intermediate_size = int_field(j, file, "moe_intermediate_size", 1, kMaxWidth, 768);
  m.decoder_sparse_step = int_field(j, file, "decoder_sparse_step", 1, 1 << 20, 1);
  m.norm_topk_prob = false;  // Qwen3MoeConfig's default
  if (j.contains("norm_topk_prob") && !j["norm_topk_prob"].is_null()) {
    if (!j["norm_topk_prob"].is_boolean())
      throw Error(file + ": field 'norm_topk_prob' must be true or false, got " + j["norm_topk_prob"].dump());
    m.norm_topk_prob = j["norm_topk_prob"].get<bool>();
  }
  m.mlp_only_layers.clear();
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    const nlohmann::json& l = j["mlp_only_layers"];
    if (!l.is_array()) throw Error(file + ": field 'mlp_only_layers' must be a list of layer indices, got " + l.dump());
    for (size_t i = 0; i < l.size(); ++i) {
      if (!l[i].is_number_integer() || l[i].get<int64_t>() < 0 || l[i].get<int64_t>() >= n_layers)
        throw Error(file + ": field 'mlp_only_layers[" + std::to_string(i) + "]' must be a layer index in [0, " +
                    std::to_string(n_layers - 1) + "], got " + l[i].dump());
      m.mlp_only_layers.push_back(l[i].get<int>());
    }
  }
  // Fields of other MoE families that would change the math, refused rather than ignored: a shared
  // expert beside the routed ones (Qwen2-MoE, DeepSeek), another gating function or a scaled routing.
  auto refuse_if = [&](const char* key, bool set, const std::string& why) {
    if (j.contains(key) && !j[key].is_null() && set)
      throw Error(file + ": field '" + key + "' (" + j[key].dump() + "): " + why + " is not supported");
  };
  auto positive = [&](const char* key) {
    return j.contains(key) && j[key].is_number() && j[key].get<double>() > 0;
  };
  refuse_if("shared_expert_intermediate_size", positive("shared_expert_intermediate_size"), "a shared expert");
  refuse_if("n_shared_experts", positive("n_shared_experts"), "a shared expert");
  refuse_if("num_shared_experts", positive("num_shared_experts"), "a shared expert");
  refuse_if("scoring_func", j.contains("scoring_func") && j["scoring_func"] != "softmax",
            "a gating function other than softmax");
  refuse_if("routed_scaling_factor",
            j.contains("routed_scaling_factor") && !(j["routed_scaling_factor"].is_number() &&
                                                     j["routed_scaling_factor"].get<double>() == 1.0),
            "scaled routing weights");
  refuse_if("n_group", positive("n_group") && j["n_group"].get<double>() > 1, "grouped expert selection");
}

}  // namespace ptllm
