#pragma once
// config.json -> ModelConfig, for Llama, Mistral, Qwen2, Qwen3, Gemma 3 (text), Phi-3 and SmolLM3
// checkpoints in both transformers spellings (4.x: rope_theta / rope_scaling / torch_dtype; 5.x:
// rope_parameters / dtype).
#include <cstdint>
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
enum class Architecture { Llama, Mistral, Qwen2, Qwen3, Gemma3, Phi3, SmolLM3, YocoLlama, Qwen3Moe };
enum class RopeType { Default, Llama3, Linear, LongRope };
// The MLP's gate activation: SiLU, or GELU with the tanh approximation (gelu_pytorch_tanh).
enum class Activation { Silu, GeluTanh };
// Which RoPE a layer applies: the model's, Gemma 3's local one (its sliding layers), or none
// (SmolLM3's NoPE layers).
enum class LayerRope : uint8_t { Main, Local, None };
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
  // linear (transformers' _compute_linear_scaling_rope_parameters): frequencies divided by `factor`.
  // longrope (_compute_longrope_parameters): frequency i divided by short_factor[i], or by
  // long_factor[i] past original_max_position; cos and sin scaled by attention_factor.
  std::vector<double> short_factor, long_factor;  // [rotary_dim / 2]
  double attention_factor = 1.0;
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
  // Per-head RMSNorm of q and k after their projections, before RoPE (Qwen3's q_norm / k_norm over
  // head_dim, with rms_norm_eps).
  bool qk_norm = false;
  // Gemma 3: every RMSNorm scales by (1 + weight); the embedding is multiplied by sqrt(hidden_size);
  // post-attention and post-feed-forward norms ("sandwich"); the attention scale is
  // query_pre_attn_scalar^-0.5; logits soft-capped as cap * tanh(logits / cap).
  bool norm_plus_one = false;
  bool sandwich_norms = false;
  float embed_scale = 1.0f;
  double query_pre_attn_scalar = 0;  // 0: head_dim (the scale 1/sqrt(head_dim))
  float final_logit_softcapping = 0;  // 0: none
  Activation activation = Activation::Silu;
  // Rotated dims of a head: the first rotary_dim (partial_rotary_factor, Phi-3), in transformers'
  // rotate_half pairing within them; the rest pass through. 0: head_dim.
  int rotary_dim = 0;
  // Phi-3's checkpoint layout: q, k, v in one qkv_proj; gate and up in one gate_up_proj.
  bool fused_qkv = false, fused_gate_up = false;
  // Gemma 3: the sliding layers' RoPE (rope_local_base_freq), the global layers' is `rope`.
  RopeConfig rope_local;
  // [n_layers] which RoPE each layer applies (empty: Main everywhere).
  std::vector<LayerRope> layer_rope;
  RopeConfig rope;
  std::string dtype;  // torch_dtype / dtype, informational
  bool gguf = false;  // read from a .gguf file (model/gguf_config.cpp)
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
  int rotated_dims() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  LayerRope rope_of(int l) const { return layer_rope.empty() ? LayerRope::Main : layer_rope[size_t(l)]; }
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
