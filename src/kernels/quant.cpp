#include "kernels/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace ptllm {

const QuantRange& quant_range(int bits) {
  static const QuantRange table[] = {{8, -128, 127}, {4, -8, 7}, {2, -2, 1}};
  for (const auto& r : table)
    if (r.bits == bits) return r;
  PTLLM_CHECK(!"quant_range: bits must be 8, 4 or 2");
  return table[0];
}

namespace {

// Scale and zero as they will be read back (rounded to f16), so codes are computed against them.
void affine_params(float lo, float hi, int bits, uint16_t* scale_h, uint16_t* zero_h, float* scale, float* zero) {
  const float s = std::max(kMinScale, (hi - lo) / float(quant_range(bits).levels()));
  *scale_h = f32_to_f16(s);
  *zero_h = f32_to_f16(lo);
  *scale = std::max(kMinScale, f16_to_f32(*scale_h));
  *zero = f16_to_f32(*zero_h);
}

int to_code(float x, float scale, float zero, int levels) {
  const float c = std::nearbyint((x - zero) / scale);
  if (!(c >= 0.f)) return 0;  // also NaN (an overflowed activation): converting NaN to int is undefined
  return int(std::min(c, float(levels)));
}

void pack_row(const int* c, int D, int bits, uint8_t* out) {
  std::fill_n(out, packed_bytes(D, bits), uint8_t(0));
  for (int i = 0; i < D; ++i) {
    switch (bits) {
      case 8: out[i] = uint8_t(c[i]); break;
      case 4: out[i >> 1] |= uint8_t(c[i] << ((i & 1) * 4)); break;
      default: out[i >> 2] |= uint8_t(c[i] << ((i & 3) * 2)); break;
    }
  }
}

// One key's row between a stored group (k_code_offset) and a plain row: whole 4-byte columns by
// fixed-size copies, 4 * (keys in the tile) bytes apart (k_code_offset(j, b) = k_code_offset(j, 0)
// + b * k_tile_keys(j) for them; attention's float kernels untile every K block they read), then
// the narrower last column.
template <bool ToGroup, class Group>
void k_row_copy(Group* group, int G, int j, size_t pk, uint8_t* row) {
  auto copy = [&](size_t at, size_t b, size_t n) {
    if constexpr (ToGroup)
      std::memcpy(group + at, row + b, n);
    else
      std::memcpy(row + b, group + at, n);
  };
  const size_t full = pk / 4 * 4, base = k_code_offset(j, 0, pk, G), w = k_tile_keys(j, G);
  for (size_t b = 0; b < full; b += 4) copy(base + b * w, b, 4);
  if (full < pk) copy(k_code_offset(j, full, pk, G), full, pk - full);
}

}  // namespace

void quantize_k_group(const float* x, size_t x_stride, int G, int D, int bits, uint8_t* codes, uint16_t* scale,
                      uint16_t* zero) {
  const int levels = quant_range(bits).levels();
  int c[1024];
  PTLLM_CHECK(D <= 1024);
  float s[1024], z[1024];
  for (int d = 0; d < D; ++d) {
    float lo = x[d], hi = x[d];
    for (int t = 1; t < G; ++t) {
      lo = std::min(lo, x[size_t(t) * x_stride + size_t(d)]);
      hi = std::max(hi, x[size_t(t) * x_stride + size_t(d)]);
    }
    affine_params(lo, hi, bits, &scale[d], &zero[d], &s[d], &z[d]);
  }
  const size_t row = packed_bytes(D, bits);
  uint8_t packed[1024];
  for (int t = 0; t < G; ++t) {
    const float* xt = x + size_t(t) * x_stride;
    for (int d = 0; d < D; ++d) c[d] = to_code(xt[d], s[d], z[d], levels);
    pack_row(c, D, bits, packed);
    k_row_copy<true>(codes, G, t, row, packed);  // to its place in the stored group
  }
}

void k_rows_from_group(KRows k, int n, size_t pk, uint8_t* rows) {
  for (int j = 0; j < n; ++j)
    k_row_copy<false>(k.group, k.G, k.j0 + j, pk, rows + size_t(j) * pk);
}

void quantize_v_token(const float* x, int D, int bits, uint8_t* codes, uint16_t* scale, uint16_t* zero) {
  const int levels = quant_range(bits).levels();
  const auto [lo, hi] = std::minmax_element(x, x + D);
  float s, z;
  affine_params(*lo, *hi, bits, scale, zero, &s, &z);
  int c[1024];
  PTLLM_CHECK(D <= 1024);
  for (int d = 0; d < D; ++d) c[d] = to_code(x[d], s, z, levels);
  pack_row(c, D, bits, codes);
}

void dequantize_k_group(const uint8_t* group, const uint16_t* scale, const uint16_t* zero, int G, int D, int bits,
                        float* out) {
  const size_t row = packed_bytes(D, bits);
  std::vector<uint8_t> rows(size_t(G) * row);
  k_rows_from_group(KRows{group, G, 0}, G, row, rows.data());
  const uint8_t* codes = rows.data();
  for (int t = 0; t < G; ++t)
    for (int d = 0; d < D; ++d)
      out[size_t(t) * size_t(D) + size_t(d)] =
          float(code_at(codes + size_t(t) * row, d, bits)) * std::max(kMinScale, f16_to_f32(scale[d])) +
          f16_to_f32(zero[d]);
}

void dequantize_v_token(const uint8_t* codes, uint16_t scale, uint16_t zero, int D, int bits, float* out) {
  const float s = std::max(kMinScale, f16_to_f32(scale)), z = f16_to_f32(zero);
  for (int d = 0; d < D; ++d) out[d] = float(code_at(codes, d, bits)) * s + z;
}

}  // namespace ptllm
