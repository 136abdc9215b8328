#include "kernels/ggml.h"

#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"

namespace ptllm {

namespace {
float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q8_0: f16 d, 32 int8 q; value = d * q.
void dequant_q8_0(const uint8_t* b, float* out) {
  const float d = f16_at(b);
  for (int i = 0; i < 32; ++i) out[i] = d * float(int8_t(b[2 + i]));
}
// Q4_0: f16 d, 16 bytes; value i (i < 16) from the low nibble of byte i, value i + 16 from its high
// nibble; value = d * (nibble - 8).
void dequant_q4_0(const uint8_t* b, float* out) {
  const float d = f16_at(b);
  for (int i = 0; i < 16; ++i) {
    out[i] = d * float(int(b[2 + i] & 0x0f) - 8);
    out[i + 16] = d * float(int(b[2 + i] >> 4) - 8);
  }
}
}  // namespace

bool ggml_supported(GgmlType t) { return t == GgmlType::Q8_0 || t == GgmlType::Q4_0; }

void ggml_dequant_row(const WeightMatrix& w, int r, float* out) {
  const GgmlTypeInfo info = ggml_type_info(w.ggml);
  const auto* row = static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes();
  const int blocks = w.cols / info.block_elems;
  for (int i = 0; i < blocks; ++i) {
    const uint8_t* b = row + size_t(i) * size_t(info.block_bytes);
    float* o = out + size_t(i) * size_t(info.block_elems);
    switch (w.ggml) {
      case GgmlType::Q8_0: dequant_q8_0(b, o); break;
      case GgmlType::Q4_0: dequant_q4_0(b, o); break;
      default: throw Error("GGML tensor type " + std::string(info.name) + ": not supported by the kernels");
    }
  }
}

// The generic product: each row dequantized once, then dotted with every x row. The SIMD kernels
// that read the blocks in place replace it.
void ggml_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool) {
  if (!ggml_supported(w.ggml))
    throw Error("GGML tensor type " + std::string(ggml_type_info(w.ggml).name) + ": not supported by the kernels");
  pool.parallel_for(size_t(w.rows), [&](size_t b, size_t e) {
    std::vector<float> row(size_t(w.cols));
    for (size_t r = b; r < e; ++r) {
      ggml_dequant_row(w, int(r), row.data());
      for (int t = 0; t < T; ++t)
        y[size_t(t) * size_t(w.rows) + r] =
            dot(x + size_t(t) * size_t(w.cols), row.data(), w.cols) + (bias ? bias[r] : 0.f);
    }
  });
}

}  // namespace ptllm
