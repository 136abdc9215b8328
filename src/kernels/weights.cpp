#include "kernels/weights.h"

#include "core/error.h"
#include "kernels/ggml_pack_layout.h"

namespace ptllm {

GgmlTypeInfo ggml_type_info(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return {"F32", 1, 4};
    case GgmlType::F16: return {"F16", 1, 2};
    case GgmlType::BF16: return {"BF16", 1, 2};
    case GgmlType::Q4_0: return {"Q4_0", 32, 2 + 16};
    case GgmlType::Q4_1: return {"Q4_1", 32, 2 + 2 + 16};
    case GgmlType::Q5_0: return {"Q5_0", 32, 2 + 4 + 16};
    case GgmlType::Q5_1: return {"Q5_1", 32, 2 + 2 + 4 + 16};
    case GgmlType::Q8_0: return {"Q8_0", 32, 2 + 32};
    case GgmlType::Q8_1: return {"Q8_1", 32, 4 + 4 + 32};
    case GgmlType::Q2_K: return {"Q2_K", 256, 256 / 16 + 256 / 4 + 2 + 2};
    case GgmlType::Q3_K: return {"Q3_K", 256, 256 / 8 + 256 / 4 + 12 + 2};
    case GgmlType::Q4_K: return {"Q4_K", 256, 2 + 2 + 12 + 256 / 2};
    case GgmlType::Q5_K: return {"Q5_K", 256, 2 + 2 + 12 + 256 / 8 + 256 / 2};
    case GgmlType::Q6_K: return {"Q6_K", 256, 256 / 2 + 256 / 4 + 256 / 16 + 2};
    case GgmlType::Q8_K: return {"Q8_K", 256, 4 + 256 + 256 / 16 * 2};
  }
  return {};
}

size_t WeightMatrix::row_bytes() const {
  switch (format) {
    case WeightFormat::Dense:
    case WeightFormat::Panels: return size_t(cols) * dtype_size(dtype);
    case WeightFormat::Affine: return size_t(cols) * size_t(bits) / 32 * sizeof(uint32_t);
    case WeightFormat::Ggml: {
      // Packed: a row's share of its groups' units (Q4_K and Q5_K keep their scales a byte each:
      // 4 bytes a block more than the file; kernels/ggml.h).
      const GgmlTypeInfo i = ggml_type_info(ggml);
      if (ggml_pack) {
        const bool k = i.block_elems == 256;
        return size_t(cols) / (k ? 256u : 64u) *
               size_t(k ? ggml_layout::k_block_bytes(ggml) : ggml_layout::unit32_bytes(ggml)) / kGgmlPackRows;
      }
      return size_t(cols) / size_t(i.block_elems) * size_t(i.block_bytes);
    }
  }
  return 0;
}

size_t WeightMatrix::nbytes() const {
  size_t n = size_t(rows) * row_bytes();
  if (format == WeightFormat::Affine) n += 2 * size_t(rows) * size_t(cols / group_size) * dtype_size(dtype);
  return n;
}

std::string WeightMatrix::format_name() const {
  switch (format) {
    case WeightFormat::Dense:
    case WeightFormat::Panels: return std::string(dtype_name(dtype));  // a layout of the same values
    case WeightFormat::Affine:
      return "q" + std::to_string(bits) + " g" + std::to_string(group_size) + " (" + std::string(dtype_name(dtype)) +
             " scales)";
    case WeightFormat::Ggml: return std::string(ggml_type_info(ggml).name);
  }
  return "?";
}

WeightMatrix affine_matrix(const void* codes, const void* scales, const void* biases, DType scale_dtype, int bits,
                           int group_size, int rows, int cols) {
  PTLLM_CHECK(group_size > 0 && cols % group_size == 0 && cols * bits % 32 == 0);
  WeightMatrix w{scale_dtype, codes, rows, cols};
  w.format = WeightFormat::Affine;
  w.bits = bits;
  w.group_size = group_size;
  w.scales = scales;
  w.biases = biases;
  return w;
}

WeightMatrix ggml_matrix(GgmlType t, const void* blocks, int rows, int cols) {
  const GgmlTypeInfo i = ggml_type_info(t);
  PTLLM_CHECK(i.block_elems > 0 && cols % i.block_elems == 0);
  WeightMatrix w{DType::F32, blocks, rows, cols};
  w.format = WeightFormat::Ggml;
  w.ggml = t;
  return w;
}

}  // namespace ptllm
