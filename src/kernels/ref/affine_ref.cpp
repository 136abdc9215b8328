// The scalar twin of the affine products (kernels/affine.h): the same int8 x (affine_q8.h, plain
// order) and integer sums, the float terms summed in double.
#include <vector>

#include "kernels/affine.h"
#include "kernels/affine_q8.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-vectorize", "no-tree-slp-vectorize")
#endif

namespace ptllm {

void affine_matmul_q8_ref(const float* x, int T, const WeightMatrix& w, const float* bias, float* y) {
  AffineXBuffers buf;
  const AffineX ax = quantize_affine_x(x, T, w.cols, w.bits, w.group_size, 0, buf, nullptr);
  const int gs = w.group_size, G = w.cols / gs;
  std::vector<int> codes(size_t(w.cols));
  for (int r = 0; r < w.rows; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes();
    for (int k = 0; k < w.cols; ++k) {
      const int bit = k * w.bits;  // a code within two bytes (bits 3, 5, 6 straddle one)
      const int two = row[bit / 8] | (bit / 8 + 1 < int(w.row_bytes()) ? row[bit / 8 + 1] << 8 : 0);
      codes[size_t(k)] = (two >> (bit % 8)) & ((1 << w.bits) - 1);
    }
    for (int t = 0; t < T; ++t) {
      const int8_t* q = ax.q + size_t(t) * ax.ldq;
      double s = bias ? bias[r] : 0.0;
      for (int g = 0; g < G; ++g) {
        double blocks = 0.0;
        for (int b = g * gs / kQ8Block; b < (g + 1) * gs / kQ8Block; ++b) {
          int isum = 0;
          for (int k = b * kQ8Block; k < (b + 1) * kQ8Block; ++k) isum += codes[size_t(k)] * q[k];
          blocks += double(ax.d[size_t(t) * ax.ldd + size_t(b)]) * isum;
        }
        const size_t i = size_t(r) * size_t(G) + size_t(g), xt = size_t(t) * ax.ldg + size_t(g);
        s += double(affine_param(w.scales, w.dtype, i)) * (blocks + double(ax.xc[xt])) +
             double(affine_param(w.biases, w.dtype, i)) * double(ax.xs[xt]);
      }
      y[size_t(t) * size_t(w.rows) + size_t(r)] = float(s);
    }
  }
}

}  // namespace ptllm
