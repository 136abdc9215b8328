#include "kernels/affine.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/ops.h"

namespace ptllm {

namespace {
float scale_at(const void* p, DType t, size_t i) {
  const auto* b = static_cast<const uint8_t*>(p);
  if (t == DType::F32) {
    float f;
    std::memcpy(&f, b + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, b + 2 * i, 2);
  return t == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}
}  // namespace

void affine_dequant_row(const WeightMatrix& w, int r, float* out) {
  const auto* row = static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes();
  const size_t groups = size_t(w.cols / w.group_size);
  const uint32_t mask = (1u << w.bits) - 1u;
  for (int k = 0; k < w.cols; ++k) {
    const size_t bit = size_t(k) * size_t(w.bits);
    uint32_t v = 0;  // the (at most 16) bits from the code's first byte on
    std::memcpy(&v, row + bit / 8, std::min<size_t>(4, w.row_bytes() - bit / 8));
    const uint32_t code = (v >> (bit % 8)) & mask;
    const size_t g = size_t(r) * groups + size_t(k / w.group_size);
    out[k] = scale_at(w.scales, w.dtype, g) * float(code) + scale_at(w.biases, w.dtype, g);
  }
}

// The generic product: each row dequantized once, then dotted with every x row. The SIMD kernels
// that read the codes in place replace it.
void affine_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool) {
  pool.parallel_for(size_t(w.rows), [&](size_t b, size_t e) {
    std::vector<float> row(size_t(w.cols));
    for (size_t r = b; r < e; ++r) {
      affine_dequant_row(w, int(r), row.data());
      for (int t = 0; t < T; ++t)
        y[size_t(t) * size_t(w.rows) + r] =
            dot(x + size_t(t) * size_t(w.cols), row.data(), w.cols) + (bias ? bias[r] : 0.f);
    }
  });
}

}  // namespace ptllm
