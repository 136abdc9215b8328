#pragma once
// How a weight matrix is stored, stated once for every reader (safetensors, MLX-quantized
// safetensors, GGUF) and every kernel: the matrix is always [rows][cols] (an output feature a row),
// read in place from the mapped file in one of three formats.
//
// - Dense: dtype F32, F16 or BF16, row-major.
// - Affine (MLX's `quantize`): `bits`-bit unsigned codes, packed little-endian into uint32 words, a
//   row cols * bits / 32 words; one scale and one bias (dtype F16, BF16 or F32) per group of
//   `group_size` consecutive columns; value = scale * code + bias.
// - Ggml (llama.cpp's block formats): each row cols / block_elems blocks of block_bytes bytes, as
//   ggml-quants defines them (kernels/ggml.h).
// - Panels: BF16 values copied at load time into panels of 16 rows with column pairs interleaved
//   (kernels/panels.h), for the AVX-512 and AVX2 products; not in any file.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace ptllm {

enum class WeightFormat : uint8_t { Dense, Affine, Ggml, Panels };

// ggml's type ids, as GGUF files store them.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, BF16 = 30,
};
struct GgmlTypeInfo {
  std::string_view name;  // "Q4_K"; empty: an id this runtime does not know
  int block_elems = 0;    // values a block holds
  int block_bytes = 0;    // bytes a block takes
};
GgmlTypeInfo ggml_type_info(GgmlType t);

struct WeightMatrix {
  DType dtype = DType::F32;    // Dense: the values' dtype; Affine: the scales' and biases' dtype
  const void* data = nullptr;  // Dense: values; Affine: uint32 codes; Ggml: blocks
  int rows = 0;
  int cols = 0;
  WeightFormat format = WeightFormat::Dense;
  // Affine
  int bits = 0;
  int group_size = 0;
  const void* scales = nullptr;  // [rows][cols / group_size]
  const void* biases = nullptr;  // [rows][cols / group_size]
  // Ggml
  GgmlType ggml = GgmlType::F32;
  // 0: the file's row-major blocks; kGgmlPackRows (kernels/ggml.h): a load-time copy with that many
  // rows interleaved per block (ggml_pack). row_bytes() is then a row's share of the copy.
  uint8_t ggml_pack = 0;
  // Affine: 0, the file's row-major codes, scales and biases; kAffinePackRows (kernels/affine.h): a
  // load-time copy with that many rows interleaved, scales and biases inside `data` (affine_pack).
  uint8_t affine_pack = 0;

  size_t row_bytes() const;  // bytes of one row of `data`
  size_t nbytes() const;     // every byte the matrix reads: data, and scales and biases
  std::string format_name() const;  // "BF16", "q4 g64 (BF16 scales)", "Q4_K"
};

// Builders that fill the fields each format uses.
inline WeightMatrix dense_matrix(DType t, const void* data, int rows, int cols) {
  return WeightMatrix{t, data, rows, cols};
}
WeightMatrix affine_matrix(const void* codes, const void* scales, const void* biases, DType scale_dtype, int bits,
                           int group_size, int rows, int cols);
WeightMatrix ggml_matrix(GgmlType t, const void* blocks, int rows, int cols);

}  // namespace ptllm
