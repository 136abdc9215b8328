#pragma once
// config.json -> ModelConfig, for Llama, Mistral and Qwen2 checkpoints in both transformers
// spellings (4.x: rope_theta / rope_scaling / torch_dtype; 5.x: rope_parameters / dtype).
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/moe.h"
#include "model/quantization.h"

namespace ptllm {

// YocoLlama: Llama with YOCO's cross-layer KV sharing (../shared/models/kjv-yoco, modeling_yoco.py):
// layer_types and sliding_window as written, the last num_kv_shared_layers layers without K/V.
enum class Architecture { Llama, Mistral, Qwen2, YocoLlama, Qwen3Moe };
enum class RopeType { Default, Llama3 };
// transformers' layer_types: causal attention over every earlier position, or over the last
// sliding_window positions only (query i sees keys j with i - sliding_window < j <= i).
enum class AttentionKind { Full, Sliding };

struct RopeConfig {
  RopeType type = RopeType::Default;
  double theta = 10000.0;
  // llama3 scaling (transformers' _compute_llama3_parameters)
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position = 8192;
};

struct ModelConfig {
  Architecture arch = Architecture::Llama;
  std::string arch_name;  // as written in config.json, e.g. "LlamaForCausalLM"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2 always; Llama with attention_bias
  bool o_bias = false;    // Llama with attention_bias
  bool mlp_bias = false;  // Llama with mlp_bias
  RopeConfig rope;
  std::string dtype;  // torch_dtype / dtype, informational
  std::optional<int> bos_token_id;
  std::vector<int> eos_token_ids;
  // Per-layer attention, as transformers resolves it for the architecture (config.cpp,
  // parse_attention_kinds): [n_layers] kinds, and the window of the Sliding ones (0: no layer slides).
  std::vector<AttentionKind> layer_kinds;
  int sliding_window = 0;
  // Cross-layer KV sharing (YOCO, arXiv 2405.05254; Gemma 3n's num_kv_shared_layers): [n_layers] the
  // layer whose K/V each layer attends to, itself when it computes its own. The last
  // num_kv_shared_layers layers have no k_proj / v_proj and read the last non-shared layer of their
  // own attention kind (the donor). Any Llama-family config may carry the key.
  int num_kv_shared_layers = 0;
  std::vector<int> kv_source;
  // Routed experts (Qwen3-MoE; model/moe.h): which layers have them, how many, how they are chosen.
  MoeConfig moe;
  // MLX affine quantization of the weights (`quantization` / `quantization_config`; model/quantization.h).
  QuantizationConfig quantization;

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  // [n_layers] each layer's window in tokens, 0 for full attention (what KVShape::layer_window takes).
  std::vector<int> layer_windows() const;
  // Whether layer l computes and stores K/V of its own (false: it reads kv_source[l]'s).
  bool stores_kv(int l) const { return kv_source.empty() || kv_source[size_t(l)] == l; }

  // Throws ptllm::Error naming the file and the field.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& file);
  static ModelConfig load(const std::filesystem::path& config_json);
};

std::string_view architecture_name(Architecture a);

}  // namespace ptllm
