#pragma once
// A decoder of the Llama family and its relatives (Llama, Mistral, Qwen2/3, Gemma 3, Phi-3, SmolLM3):
// weights mapped from safetensors or GGUF and used in their file dtype, and the forward pass.
// Attention over past tokens is delegated to the KV cache.
#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/platform.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/moe.h"
#include "model/safetensors.h"

namespace ptllm {

class KVCache;
struct KVShape;
class GgufFile;

struct LayerWeights {
  std::vector<float> attn_norm;         // [hidden]
  WeightMatrix wq, wk, wv, wo;          // [q_dim][hidden], [kv_dim][hidden] x2, [hidden][q_dim]
  std::vector<float> bq, bk, bv, bo;    // biases (empty when the architecture has none)
  std::vector<float> q_norm, k_norm;    // [head_dim] per-head RMSNorm gains (ModelConfig::qk_norm), else empty
  std::vector<float> mlp_norm;          // [hidden]
  std::vector<float> post_attn_norm, post_mlp_norm;  // [hidden] Gemma 3's sandwich norms, else empty
  WeightMatrix w_gate, w_up, w_down;    // [inter][hidden] x2, [hidden][inter]
  std::vector<float> b_gate, b_up, b_down;
  MoeWeights moe;  // a sparse layer's router and experts (then w_gate, w_up, w_down are empty)
};

// Most sequences one forward call takes (the per-call lists live on the stack, no allocation).
inline constexpr size_t kMaxBatchSequences = 256;

// One sequence's share of a forward call: its tokens at positions pos0, pos0+1, ..., appended to its
// own cache. logits: [T][vocab] when all_logits, else [vocab] for the last token only; null: none.
struct SequenceBatch {
  KVCache* cache = nullptr;
  std::span<const int32_t> tokens;
  int64_t pos0 = 0;
  float* logits = nullptr;
  bool all_logits = false;
};

// Where a forward pass multiplies activations by a weight matrix, named by the matrices that read
// the same input: q/k/v read the attention norm's output, o_proj the attention output, gate/up the
// MLP norm's output, down_proj silu(gate) * up, the LM head the final norm's output.
enum class MatmulInput : uint8_t { Attention, AttentionOutput, Mlp, MlpDown, LmHead };
inline constexpr int kMatmulInputs = 5;

// Sees the inputs of the weight matrices as the forward pass computes them (GPTQ's calibration,
// model/gptq.h). Null in ForwardState for every normal run: the pass then only tests the pointer.
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  // x: [T][width], the rows about to be multiplied by layer `layer`'s matrices of `site` (the LM
  // head: layer n_layers, the rows whose logits are wanted). Returning false ends the pass there: no
  // later matrix is applied, no logits are written, the cache holds the K/V appended so far.
  virtual bool observe(int layer, MatmulInput site, const float* x, int T, int width) = 0;
};

// Activations of one forward call over T rows (the tokens of every sequence of the batch, one after
// another), sized for the largest T seen; reused so that decode allocates nothing once warmed up.
struct ForwardState {
  using Activations = std::vector<float, HugePageAllocator<float>>;
  int capacity = 0;
  int logit_capacity = 0;
  Activations x;         // [T][hidden] residual stream
  Activations xn;        // [T][hidden] normalized
  Activations q;         // [T][q_dim]
  Activations k, v;      // [T][kv_dim]
  Activations att;       // [T][q_dim]
  Activations gate, up;  // [T][inter]
  std::vector<float> cos, sin;  // [T][head_dim/2] the main RoPE's tables of each row's position
  std::vector<float> cos_local, sin_local;  // [T][head_dim/2] Gemma 3's local RoPE (else unused)
  std::vector<float> logits;    // [rows wanted][vocab], batches of more than one sequence
  int cross_rows = -1;  // rows the last call ran past the cross-decoder's donor (-1: no shortcut layer)
  ForwardObserver* observer = nullptr;  // null: none (every run but a calibration)
  MoeScratch moe;                       // an MoE layer's routing and expert buffers
  MoeCounters* moe_counters = nullptr;  // null: none; else what the expert products read is added
};

class Model {
 public:
  // Reads config.json and the safetensors weights of a model directory, or a .gguf file
  // (model/gguf_model.cpp); checks every tensor against the config. Throws ptllm::Error naming the
  // file and the tensor.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir);

  const ModelConfig& config() const { return cfg_; }
  const std::filesystem::path& dir() const { return dir_; }
  KVShape kv_shape() const;
  size_t weight_bytes() const;  // the weight files' sizes (codes, scales and biases of quantized ones)
  // The storage formats of the weight matrices (WeightMatrix::format_name), the most common first:
  // "BF16", "q4 g64 (BF16 scales)", or "q4 g64 (BF16 scales) + BF16 (1 of 57 matrices)" when a
  // quantized checkpoint keeps some matrices dense.
  std::string weight_format() const;
  // The routed experts' bytes (codes, scales and biases of quantized ones): all of them, and what one
  // token reads (top_k of num_experts in each sparse layer). Zero for a dense model.
  struct ExpertBytes {
    size_t all = 0, per_token = 0;
  };
  ExpertBytes expert_bytes() const;
  const WeightFiles& files() const { return files_; }  // empty for a GGUF model
  const GgufFile* gguf() const { return gguf_.get(); }   // the file of a GGUF model, else null

  // Points the matrix of `module` ("model.layers.3.mlp.down_proj", "model.embed_tokens", "lm_head")
  // at w, of the same rows and cols (the caller keeps w's bytes alive as long as the model): a
  // quantizer measuring a partly quantized model (GPTQ's sequential calibration). A tied LM head
  // follows the embedding. Throws ptllm::Error for an unknown module or another shape.
  void replace_matrix(const std::string& module, const WeightMatrix& w);

  // How many weight matrices load packed into panels (kernels/panels.h); 0 where the CPU's kernels
  // keep the row-major layout.
  size_t panel_matrices() const { return panel_packed_; }
  // How many block matrices load repacked in 16-row groups (kernels/ggml.h, ggml_pack).
  size_t ggml_packed_matrices() const { return ggml_packed_; }
  // How many MLX affine matrices load repacked in 16-row groups (kernels/affine.h, affine_pack).
  size_t affine_packed_matrices() const { return affine_packed_; }

  // Runs tokens at positions pos0, pos0+1, ... through the model, appending their K/V to `cache`.
  // logits: [T][vocab] when all_logits, else [vocab] for the last token only; null: not computed.
  void forward(std::span<const int32_t> tokens, int64_t pos0, KVCache& cache, ForwardState& st, float* logits,
               bool all_logits, ThreadPool& pool) const;
  // The same for several sequences in one pass (each a distinct cache; any mix of decode tokens and
  // prefill chunks, each at most its cache's max_append()): every weight matrix is read once for all
  // their rows, attention runs per sequence over its own cache.
  void forward(std::span<const SequenceBatch> batch, ForwardState& st, ThreadPool& pool) const;

 private:
  Model() = default;
  static std::unique_ptr<Model> load_gguf(const std::filesystem::path& file);  // model/gguf_model.cpp

  std::filesystem::path dir_;
  ModelConfig cfg_;
  WeightFiles files_;
  WeightMatrix embed_;    // [vocab][hidden]
  WeightMatrix lm_head_;  // [vocab][hidden] (the embedding when tied)
  bool head_repacked_ = false;  // tied, the LM head a packed copy of the embedding (pack_panels)
  bool head_tied() const { return head_repacked_ || lm_head_.data == embed_.data; }
  std::vector<float> final_norm_;  // [hidden]
  std::vector<LayerWeights> layers_;
  // RoPE frequencies [head_dim/2]: the main ones, Gemma 3's local ones, Phi-3's long ones (LongRoPE
  // past original_max_position; empty otherwise). Frequencies past rotated_dims()/2 are 0: the dims
  // that pass through, rotated by nothing (head_perm_).
  std::vector<float> inv_freq_, inv_freq_local_, inv_freq_long_;
  // Partial rotary: where each of a head's dims goes so that the rotated pairs are (i, i + head_dim/2)
  // as everywhere else (q and k alike, so q.k is unchanged); empty when all rotate.
  std::vector<int> head_perm_;
  // [head_dim] per-dim factors on q and k before RoPE (LongRoPE's attention_factor on the rotated dims;
  // q also by the attention scale's ratio to 1/sqrt(head_dim)); empty: 1.
  std::vector<float> q_scale_, k_scale_;
  void init_rope();  // the three above, from the config (model.cpp)
  std::vector<std::unique_ptr<float[]>> aligned_copies_;  // misaligned tensors, copied (rare)
  // Copies the matrices the CPU's kernels read faster in their own layout (GGUF blocks and MLX affine
  // in 16-row groups, BF16 in panels) into packed_bytes_: every layer's and the LM head (with the
  // embedding when tied).
  void pack_panels();
  struct FreeBytes {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t[], FreeBytes> packed_bytes_;  // every matrix repacked at load (pack_panels)
  size_t panel_packed_ = 0, ggml_packed_ = 0, affine_packed_ = 0;
  std::shared_ptr<const GgufFile> gguf_;  // a GGUF model's file: the weights point into its mapping
  bool qk_permuted_ = false;  // q/k rows in llama.cpp's order (gguf_qk_permuted): undone after the matmul

  // YOCO's prefill shortcut: the last layer that stores K/V when every later one reads it (the
  // cross-decoder's donor), -1 otherwise. From its attention on, only the rows whose logits are wanted
  // are computed (docs/yoco.md).
  int cross_layer_ = -1;

  // rows: [batch.size()] each sequence's rows in the buffers now (its tokens, or fewer past cross_layer_).
  using Rows = std::array<int, kMaxBatchSequences>;
  void embed_and_rope(std::span<const SequenceBatch> batch, ForwardState& st) const;
  // What a layer does to freshly projected q or k rows before RoPE, head by head: llama.cpp's row
  // order undone (a GGUF llama file), the per-head RMSNorm (qk_norm), the partial-rotary order
  // (head_perm_), the per-dim scale.
  void prepare_heads(float* x, int T, int heads, const std::vector<float>& norm, const std::vector<float>& scale) const;
  // The RoPE tables of a layer's rows (null: the layer has no RoPE).
  const float* rope_cos(int layer, const ForwardState& st) const;
  const float* rope_sin(int layer, const ForwardState& st) const;
  void norm_rows(float* x, int T, const std::vector<float>& w) const;  // RMSNorm of T rows of hidden, in place
  static void gelu_tanh_mul(float* gate, const float* up, int n);
  void append_kv(int layer, std::span<const SequenceBatch> batch, const Rows& rows, ForwardState& st) const;
  void attention(int layer, std::span<const SequenceBatch> batch, const Rows& rows, ForwardState& st,
                 ThreadPool& pool) const;
  int keep_wanted_rows(std::span<const SequenceBatch> batch, Rows& rows, int T, ForwardState& st) const;
  void lm_head(std::span<const SequenceBatch> batch, const Rows& rows, ForwardState& st, ThreadPool& pool) const;
};

// RoPE inverse frequencies for a config (default, llama3, linear; longrope with the short factors, or
// the long ones when `long_factors`), as transformers computes them: [rotary_dim / 2] over rotary_dim.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int rotary_dim, bool long_factors = false);

}  // namespace ptllm
