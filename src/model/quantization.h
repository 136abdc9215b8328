#pragma once
// config.json's `quantization` (what mlx-lm's `convert -q` writes) or `quantization_config` (the
// copy it writes for transformers): MLX affine quantization (kernels/weights.h, WeightFormat::Affine)
// of the linear layers and the embedding. One default {group_size, bits}, and per-module overrides
// keyed by the module's path, as mlx-lm's mixed recipes write them:
//
//   "quantization": {"group_size": 64, "bits": 4,
//                    "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8},
//                    "lm_head": false}
//
// A module with an override of its own must be quantized as it says (false: left in its float
// dtype); any other module is quantized with the default when the file has its `.scales`, and left
// dense otherwise (mlx-lm's loader decides the same way: `f"{path}.scales" in weights`).
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace ptllm {

struct AffineSpec {
  int bits = 0;
  int group_size = 0;
  bool operator==(const AffineSpec&) const = default;
};

// What the runtime reads (mlx's affine_quantize): bits 2, 3, 4, 5, 6, 8; groups of 32, 64, 128.
bool affine_supported(const AffineSpec& s);
inline constexpr int kAffineBits[] = {2, 3, 4, 5, 6, 8};
inline constexpr int kAffineGroupSizes[] = {32, 64, 128};

struct QuantizationConfig {
  std::optional<AffineSpec> base;  // none: the checkpoint is not quantized
  // module path -> its own spec; nullopt: `false`, the module is not quantized
  std::map<std::string, std::optional<AffineSpec>> overrides;

  bool quantized() const { return base.has_value(); }
  // The override written for `module`, if any (the outer optional), else nullptr.
  const std::optional<AffineSpec>* override_for(const std::string& module) const;
  // The spec a module with `.scales` in the file is read with: its override, else the default.
  std::optional<AffineSpec> for_module(const std::string& module) const;

  // The object mlx-lm writes ({"group_size", "bits", overrides...}); null when not quantized.
  nlohmann::json to_json() const;
  // `q` is the value of config.json's `key` ("quantization" or "quantization_config"). Throws
  // ptllm::Error naming the file and the field (e.g. "quantization.bits").
  static QuantizationConfig from_json(const nlohmann::json& q, const std::string& file, const std::string& key);
};

}  // namespace ptllm
