#include "kernels/ggml_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace ptllm {

namespace {

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// Q8_0: d = max|x| / 127, q = round(x / d).
void quantize_q8_0(const float* x, uint8_t* b) {
  float amax = 0.f;
  for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float d = amax / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  put_f16(b, d);
  for (int i = 0; i < 32; ++i) b[2 + i] = uint8_t(int8_t(std::lround(x[i] * id)));
}

// Q4_0: the value of largest magnitude m (its sign kept), d = m / -8, q = min(15, trunc(x / d + 8.5));
// value i in the low nibble of byte i, value i + 16 in its high nibble.
void quantize_q4_0(const float* x, uint8_t* b) {
  float amax = 0.f, max = 0.f;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  const float d = max / -8.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  put_f16(b, d);
  for (int i = 0; i < 16; ++i) {
    const int lo = std::min(15, int(int8_t(x[i] * id + 8.5f)));
    const int hi = std::min(15, int(int8_t(x[i + 16] * id + 8.5f)));
    b[2 + i] = uint8_t(lo | (hi << 4));
  }
}

}  // namespace

bool ggml_quantize_supported(GgmlType t) { return t == GgmlType::Q8_0 || t == GgmlType::Q4_0; }

void quantize_row_ggml(GgmlType t, const float* x, int n, uint8_t* out) {
  const GgmlTypeInfo info = ggml_type_info(t);
  PTLLM_CHECK(ggml_quantize_supported(t) && n % info.block_elems == 0);
  for (int k = 0; k < n / info.block_elems; ++k) {
    const float* xb = x + size_t(k) * size_t(info.block_elems);
    uint8_t* ob = out + size_t(k) * size_t(info.block_bytes);
    if (t == GgmlType::Q8_0) quantize_q8_0(xb, ob);
    else quantize_q4_0(xb, ob);
  }
}

}  // namespace ptllm
