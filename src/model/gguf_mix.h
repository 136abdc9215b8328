#pragma once
// The per-tensor type choice of a GGUF file type ("mix"): which block type each weight of a Llama /
// Qwen2 checkpoint gets under Q4_K_M, Q5_K_M, Q6_K, Q4_0, Q8_0 and the float types. The quantized
// mixes follow llama-quantize (llama.cpp src/llama-quant.cpp, llama_tensor_get_type, without an
// importance matrix or per-tensor overrides), so that a file written here holds the same types,
// tensor by tensor, as llama-quantize's of the same model; docs/gguf.md lists the rules.
// Policy only: the writer (model/gguf_writer) asks, the quantizers (kernels/ggml.h) carry it out.
#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/weights.h"

namespace ptllm {

enum class GgufMix { F32, F16, BF16, Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K };

// "Q4_K_M" -> the mix; throws UsageError listing the names.
GgufMix parse_gguf_mix(const std::string& name);
std::string_view gguf_mix_name(GgufMix m);
// llama.cpp's general.file_type (enum llama_ftype) of the mix.
uint32_t gguf_mix_file_type(GgufMix m);
// The type most 2-D weights get (Q4_K for Q4_K_M).
GgmlType gguf_mix_base_type(GgufMix m);
bool gguf_mix_quantized(GgufMix m);

// What a weight is, for the choice: llama-quantize's tensor categories of the architectures written.
enum class GgufRole { TokenEmbd, Output, AttnQ, AttnK, AttnV, AttnQkv, AttnOutput, FfnGate, FfnUp, FfnDown };

struct GgufTensorSite {
  GgufRole role = GgufRole::AttnQ;
  int layer = 0;       // block index (AttnV, FfnDown: which layers get more bits)
  int n_layers = 1;
  int64_t cols = 0;    // row length (dims[0]): a row is a whole number of blocks or the type falls back
  bool tied = false;   // no output.weight: the token embeddings get the output's type
  bool llama_70b = false;  // llama.cpp's LLM_TYPE_70B (llama, 80 layers, GQA): attn_v one step up
};

struct GgufTypeChoice {
  GgmlType type;
  bool fell_back;  // the planned type did not fit the row length (llama-quantize's "falling back")
};

// The type of the 2-D weight at `site` under mix m.
GgufTypeChoice gguf_mix_tensor_type(GgufMix m, const GgufTensorSite& site);

}  // namespace ptllm
