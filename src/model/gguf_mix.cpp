#include "model/gguf_mix.h"

#include "core/error.h"

namespace ptllm {

namespace {

struct MixInfo {
  GgufMix mix;
  std::string_view name;
  uint32_t file_type;  // LLAMA_FTYPE_*
  GgmlType base;
};
constexpr MixInfo kMixes[] = {
    {GgufMix::F32, "F32", 0, GgmlType::F32},         {GgufMix::F16, "F16", 1, GgmlType::F16},
    {GgufMix::BF16, "BF16", 32, GgmlType::BF16},     {GgufMix::Q8_0, "Q8_0", 7, GgmlType::Q8_0},
    {GgufMix::Q4_0, "Q4_0", 2, GgmlType::Q4_0},      {GgufMix::Q4_K_M, "Q4_K_M", 15, GgmlType::Q4_K},
    {GgufMix::Q5_K_M, "Q5_K_M", 17, GgmlType::Q5_K}, {GgufMix::Q6_K, "Q6_K", 18, GgmlType::Q6_K},
};

const MixInfo& info(GgufMix m) {
  for (const MixInfo& i : kMixes)
    if (i.mix == m) return i;
  PTLLM_CHECK(false);
  return kMixes[0];
}

bool fits(GgmlType t, int64_t cols) { return cols % ggml_type_info(t).block_elems == 0; }

// llama-quantize's use_more_bits: the first and last eighth of the layers and every third one
// between them get the larger type (attn_v and ffn_down of the _M mixes).
bool more_bits(int layer, int n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

}  // namespace

GgufMix parse_gguf_mix(const std::string& name) {
  std::string names;
  for (const MixInfo& i : kMixes) {
    if (i.name == name) return i.mix;
    names += (names.empty() ? "" : ", ") + std::string(i.name);
  }
  throw UsageError("--type " + name + ": not a type the GGUF writer writes (" + names + ")");
}

std::string_view gguf_mix_name(GgufMix m) { return info(m).name; }
uint32_t gguf_mix_file_type(GgufMix m) { return info(m).file_type; }
GgmlType gguf_mix_base_type(GgufMix m) { return info(m).base; }
bool gguf_mix_quantized(GgufMix m) { return ggml_type_info(info(m).base).block_elems > 1; }

GgufTypeChoice gguf_mix_tensor_type(GgufMix m, const GgufTensorSite& s) {
  const GgmlType base = gguf_mix_base_type(m);
  if (!gguf_mix_quantized(m)) return {base, false};
  GgmlType t = base;
  const bool k_m = m == GgufMix::Q4_K_M || m == GgufMix::Q5_K_M;
  if (s.role == GgufRole::Output || (s.tied && s.role == GgufRole::TokenEmbd)) {
    // The output matrix (and embeddings tied to it) is the most sensitive: Q6_K unless the mix is
    // Q8_0; Q8_0 when the row is not a whole number of the mix's blocks.
    if (!fits(base, s.cols)) t = GgmlType::Q8_0;
    else if (base != GgmlType::Q8_0) t = GgmlType::Q6_K;
  } else if (s.role == GgufRole::AttnV) {
    if (k_m && more_bits(s.layer, s.n_layers)) t = GgmlType::Q6_K;
    // 70B: eight query heads share each V head, so attn_v is small; llama.cpp spends more bits.
    if (s.llama_70b && (t == GgmlType::Q3_K || t == GgmlType::Q4_K)) t = GgmlType::Q5_K;
  } else if (s.role == GgufRole::AttnQkv) {
    // a fused q/k/v (Phi-3's attn_qkv): one step up under the K-quant mixes
    if (m == GgufMix::Q4_K_M) t = GgmlType::Q5_K;
    if (m == GgufMix::Q5_K_M) t = GgmlType::Q6_K;
  } else if (s.role == GgufRole::FfnDown) {
    if (k_m && more_bits(s.layer, s.n_layers)) t = GgmlType::Q6_K;
  }
  if (fits(t, s.cols)) return {t, false};
  // llama-quantize's fallback for rows that are not a whole number of 256-value super-blocks: the
  // 32-value type of about the same size; F16 where even that does not fit (llama-quantize refuses
  // such a row for Q8_0 and Q4_0; the converter writes F16).
  switch (t) {
    case GgmlType::Q4_K: t = GgmlType::Q5_0; break;
    case GgmlType::Q5_K: t = GgmlType::Q5_1; break;
    case GgmlType::Q6_K: t = GgmlType::Q8_0; break;
    default: t = GgmlType::F16; break;
  }
  if (!fits(t, s.cols)) t = GgmlType::F16;
  return {t, true};
}

}  // namespace ptllm
