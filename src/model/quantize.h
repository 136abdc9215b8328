#pragma once
// Quantization to the MLX affine layout (kernels/weights.h, WeightFormat::Affine): one matrix
// (affine_quantize_rows), and a whole checkpoint directory into another (quantize_checkpoint, what
// `posttrainllm quantize` runs; docs/quantization.md).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/quantization.h"

namespace ptllm {

class ThreadPool;

enum class QuantMethod {
  // Round to nearest, with mlx's affine_quantize scale and bias per group: the group's range over
  // 2^bits - 1 steps, the edge of larger magnitude as the bias, the scale nudged so that code
  // round(edge / scale) lands on 0.0 exactly (mlx/ops.cpp, the CPU/CUDA/Metal kernels alike).
  Rtn,
  // Search: RTN's scale and bias, or the best of a small grid of inverse scales around it, each
  // refitted by least squares over its codes (llama.cpp's make_qkx2_quants idea), whichever gives
  // the group the smallest squared error once rounded to the stored dtype.
  Search,
  // GPTQ (Frantar et al. 2022): each matrix's columns rounded in order, each one's error spread
  // over the columns not yet rounded through the inverse of H = sum x x^T of the matrix's inputs on
  // calibration text (model/gptq.h); the groups' scales and biases fitted by Search on the updated
  // weights. Needs QuantizeOptions::calibration.
  Gptq,
};

// mlx-lm's mixed recipes (mlx_lm/convert.py, mixed_quant_predicate): `low` bits everywhere but
// v_proj and down_proj of the first and last eighth of the layers and every third layer between,
// and the LM head, at `high` bits (llama.cpp's Q4_K_M choice). With tied embeddings the embedding is
// the LM head, so it takes the high bits too.
enum class QuantRecipe { None, Mixed_2_6, Mixed_3_6, Mixed_4_6 };
std::string_view quant_recipe_name(QuantRecipe r);
struct RecipeBits {
  int low = 0, high = 0;
};
RecipeBits recipe_bits(QuantRecipe r);  // {0, 0} for None
// Whether layer `layer` of `n_layers` takes the recipe's high bits for its v_proj and down_proj.
bool recipe_uses_more_bits(int layer, int n_layers);

std::string_view quant_method_name(QuantMethod m);

// w: [rows][cols] float32, cols a multiple of s.group_size. Writes codes [rows][cols * bits / 32]
// (code j of a row at bits [j * bits, (j + 1) * bits) of the row's little-endian bit stream, as mlx
// packs every width), scales and biases [rows][cols / group_size] as `scale_dtype` (F32, F16 or
// BF16). Codes are rounded against the scale and bias as stored (mlx rounds against their float
// values; the same thing with F32 scales), so narrow scale dtypes cost no extra error.
// importance (Search only; null: all 1): [cols], each input's weight in the squared error the search
// minimizes (a diagonal stand-in for GPTQ's H without calibration text).
void affine_quantize_rows(const float* w, int rows, int cols, const AffineSpec& s, QuantMethod m, DType scale_dtype,
                          uint32_t* codes, void* scales, void* biases, const float* importance = nullptr);

struct QuantizeOptions {
  AffineSpec spec{4, 64};
  QuantMethod method = QuantMethod::Rtn;
  bool keep_embeddings = false;  // embed_tokens and lm_head stay in their float dtype
  int embedding_bits = 0;        // > 0: embed_tokens and lm_head at these bits (a per-module entry)
  int embedding_group_size = 0;  // > 0: their group size (a per-module entry); 0: spec.group_size
  QuantRecipe recipe = QuantRecipe::None;  // replaces spec.bits by the recipe's low and high bits
  // Gptq: the calibration sequences (token ids, BOS first; calibration_windows in model/gptq.h), and
  // the dampening added to H's diagonal, a fraction of its mean.
  std::vector<std::vector<int32_t>> calibration;
  double gptq_damp = 0.01;
  bool gptq_act_order = false;  // columns by decreasing H_ii, static groups (model/gptq.h)
};

// What the user asked for; unset fields take the defaults (resolve_quantize_options).
struct QuantizeRequest {
  std::optional<int> bits, group_size, embedding_bits;
  std::optional<QuantMethod> method;
  bool keep_embeddings = false;
  bool calibration = false;  // --calib was given
  QuantRecipe recipe = QuantRecipe::None;
};

// The defaults, chosen on kjv-small (docs/quantization.md): 4 bits unless asked; below 8 bits groups
// of 32 (64 at 8); the embedding / LM head at 6 bits in the same groups when the other matrices have
// 4 or fewer (as llama.cpp's Q4_K_M keeps its output at Q6_K); --method search without calibration
// text, gptq with it. Every field given is kept as given.
QuantizeOptions resolve_quantize_options(const QuantizeRequest& r);

// One line naming what a written checkpoint is expected to lose, by the measured class it belongs
// to (docs/quantization.md, "Quality classes"): e.g. "near-lossless (8-bit: kjv-small PPL within
// 0.05%)".
std::string quality_class(const QuantizeOptions& o);

struct QuantizeReport {
  int matrices_quantized = 0;
  int matrices_dense = 0;   // left in their float dtype (--keep-embeddings, or no group divides them)
  size_t source_bytes = 0;  // the source's weight files
  size_t output_bytes = 0;  // model.safetensors written
  int64_t parameters = 0;   // elements of every tensor of the source (output_bytes * 8 / parameters: bits a weight)
  QuantizationConfig quantization;  // as written to config.json
  std::string weight_format;        // Model::weight_format() of the written checkpoint
};

// Reads the F32/F16/BF16 checkpoint in `in` (every tensor checked as Model::load checks it) and
// writes `out`: model.safetensors with the same tensor names, each linear layer's and the embedding's
// `weight` as U32 codes plus `scales` and `biases` (the source's dtype), norms and biases as they
// were; config.json with "quantization" and "quantization_config" as mlx-lm writes them; the
// tokenizer and generation files copied. A matrix whose input width the group size does not divide
// takes the largest supported group that does (a per-module entry in config.json), or stays dense.
// The result is loaded back before returning. progress(done, total): source bytes processed.
// Throws ptllm::Error naming the file.
QuantizeReport quantize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                                   const QuantizeOptions& opts, ThreadPool& pool,
                                   const std::function<void(size_t done, size_t total)>& progress = {});

}  // namespace ptllm
