#pragma once
// The sizes and offsets of the packed block layouts (kernels/ggml.h describes them), stated once for
// the packer (ggml.cpp) and the products (x86/ggml_kernels_impl.h).
#include <cstdint>

#include "kernels/ggml.h"

namespace ptllm::ggml_layout {

// The 32-value types: a unit of two blocks of 16 rows, first the rows' d of both blocks (64 bytes;
// Q4_1, Q5_1: then their m, 64 more), then per block its code lines (Q5_0, Q5_1: after 64 bytes of
// fifth bits). The products take codes offset by code_offset (-o sum x per block).
constexpr bool with_min(GgmlType t) { return t == GgmlType::Q4_1 || t == GgmlType::Q5_1; }
constexpr bool with_fifth(GgmlType t) { return t == GgmlType::Q5_0 || t == GgmlType::Q5_1; }
constexpr int unit32_bytes(GgmlType t) {
  return kGgmlPackRows * 2 * (t == GgmlType::Q8_0 ? 34 : 18 + (with_min(t) ? 2 : 0) + (with_fifth(t) ? 4 : 0));
}
constexpr int head32_bytes(GgmlType t) { return with_min(t) ? 128 : 64; }
constexpr int block32_bytes(GgmlType t) { return (unit32_bytes(t) - head32_bytes(t)) / 2; }
constexpr int32_t code_offset(GgmlType t) {
  return t == GgmlType::Q8_0 ? 128 : t == GgmlType::Q5_0 ? 16 : t == GgmlType::Q4_0 ? 8 : 0;
}
static_assert(block32_bytes(GgmlType::Q4_0) == 256 && block32_bytes(GgmlType::Q5_0) == 320 &&
              block32_bytes(GgmlType::Q8_0) == 512 && block32_bytes(GgmlType::Q4_1) == 256 &&
              block32_bytes(GgmlType::Q5_1) == 320 && unit32_bytes(GgmlType::Q5_1) == 768);

// The K-quants: one 256-value block of 16 rows. Q4_K and Q5_K keep their scales a byte each (4 bytes
// a row more than the file); Q5_K's sub-block j has 64 bytes of fifth bits before its four lines.
constexpr int k_block_bytes(GgmlType t) {
  return kGgmlPackRows * (t == GgmlType::Q6_K ? 210 : t == GgmlType::Q5_K ? 180 : 148);
}
constexpr int k45_lines(bool five, int j) { return five ? 320 + 320 * j + 64 : 320 + 256 * j; }

}  // namespace ptllm::ggml_layout
