// The scalar reference twins of the kernels: plain loops, one element at a time. The tests compare
// every SIMD target with these; the benchmarks report each kernel's speed-up over them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/affine.h"
#include "kernels/ggml.h"
#include "kernels/ops.h"
#include "kernels/panels.h"
#include "kernels/quant.h"

// Keep the twins scalar: GCC would otherwise auto-vectorize the element-wise loops for the
// baseline target, and a "scalar" reference would not be one.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-vectorize", "no-tree-slp-vectorize")
#endif

namespace ptllm {

namespace {
float stored_at(const void* p, DType t, int i) {
  const auto* b = static_cast<const uint8_t*>(p);
  if (t == DType::F32) {
    float f;
    std::memcpy(&f, b + 4 * size_t(i), 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, b + 2 * size_t(i), 2);
  return t == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}
}  // namespace

float dot_ref(const float* a, const float* b, int n) {
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_ref(float a, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

float dot_stored_ref(const float* a, const void* b, DType t, int n) {
  PTLLM_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16);
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += a[i] * stored_at(b, t, i);
  return s;
}

void axpy_stored_ref(float a, const void* x, DType t, float* y, int n) {
  PTLLM_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16);
  for (int i = 0; i < n; ++i) y[i] += a * stored_at(x, t, i);
}

void dense_k_block_ref(const float* q, int nq, const void* k, DType t, float qscale, int nk, int D, float* out,
                       int ld_out) {
  for (int h = 0; h < nq; ++h)
    for (int j = 0; j < nk; ++j)
      out[size_t(h) * size_t(ld_out) + size_t(j)] =
          dot_stored_ref(q + size_t(h) * size_t(D),
                         static_cast<const uint8_t*>(k) + size_t(j) * size_t(D) * dtype_size(t), t, D) * qscale;
}

void dense_v_block_ref(const float* p, int ld_p, int nq, const void* v, DType t, int nk, int D, float* acc) {
  for (int h = 0; h < nq; ++h)
    for (int j = 0; j < nk; ++j)
      axpy_stored_ref(p[size_t(h) * size_t(ld_p) + size_t(j)],
                      static_cast<const uint8_t*>(v) + size_t(j) * size_t(D) * dtype_size(t), t,
                      acc + size_t(h) * size_t(D), D);
}

void store_as_ref(const float* src, void* dst, DType t, int n) {
  auto* d = static_cast<uint8_t*>(dst);
  for (int i = 0; i < n; ++i) {
    if (t == DType::F32) {
      std::memcpy(d + 4 * size_t(i), &src[i], 4);
    } else {
      PTLLM_CHECK(t == DType::BF16 || t == DType::F16);
      const uint16_t h = t == DType::BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
      std::memcpy(d + 2 * size_t(i), &h, 2);
    }
  }
}

void load_from_ref(const void* src, DType t, float* dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = stored_at(src, t, i);
}

void rmsnorm_ref(const float* x, const float* w, float* out, int n, float eps) {
  float ss = 0.f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / float(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

void silu_mul_ref(float* gate, const float* up, int n) {
  for (int i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void softmax_ref(float* x, int n) {
  float m = x[0];
  for (int i = 1; i < n; ++i) m = std::max(m, x[i]);
  float s = 0.f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  const float inv = 1.0f / s;
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

float max_of_ref(const float* x, int n) {
  float m = x[0];
  for (int i = 1; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

float exp_sum_ref(float* x, int n, float m) {
  float s = 0.f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  return s;
}

void rope_rotate_one_ref(const float* x, int head_dim, const float* cos, const float* sin, float* out) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    out[i] = x[i] * cos[i] - x[i + half] * sin[i];
    out[i + half] = x[i + half] * cos[i] + x[i] * sin[i];
  }
}

void rope_rotate_ref(float* x, int n_heads, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + size_t(h) * size_t(head_dim);
    for (int i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos[i] - b * sin[i];
      v[i + half] = b * cos[i] + a * sin[i];
    }
  }
}

// The int8 query of kivi_k_block (quant.h), the same operations as the SIMD kernels
// (kernels_impl.h, kivi_k_quantize), so the same q8 and integer sums; only qz's rounding differs.
void kivi_k_block_ref(const float* q, int nq, KRows k, const uint16_t* scale, const uint16_t* zero, float qscale,
                      int nk, int D, int bits, float* out, int ld_out) {
  const size_t pk = packed_bytes(D, bits);
  std::vector<uint8_t> rows(size_t(nk) * pk);
  k_rows_from_group(k, nk, pk, rows.data());
  const uint8_t* codes = rows.data();
  std::vector<float> sd(static_cast<size_t>(D)), zd(static_cast<size_t>(D)), q8(static_cast<size_t>(D));
  const float mid = float((1 << bits) - 1) / 2.f;
  for (int i = 0; i < D; ++i) {
    const float s = std::max(f16_to_f32(scale[i]), kMinScale);
    sd[size_t(i)] = s * qscale;
    zd[size_t(i)] = (f16_to_f32(zero[i]) + mid * s) * qscale;
  }
  for (int h = 0; h < nq; ++h) {
    const float* qh = q + size_t(h) * size_t(D);
    float amax = 0.f, qz = 0.f;
    for (int i = 0; i < D; ++i) {
      q8[size_t(i)] = qh[i] * sd[size_t(i)];
      amax = std::max(amax, std::fabs(q8[size_t(i)]));
      qz += qh[i] * zd[size_t(i)];
    }
    const bool some = amax >= kMinQueryMax;
    const float a = some ? amax / 127.f : 0.f, inv = some ? 127.f / amax : 0.f;
    int32_t qsum = 0;
    for (int i = 0; i < D; ++i) {
      q8[size_t(i)] = some ? std::nearbyint(q8[size_t(i)] * inv) : 0.f;
      qsum += int32_t(q8[size_t(i)]);
    }
    const float b = mid * float(qsum);
    for (int j = 0; j < nk; ++j) {
      int32_t s = 0;
      for (int i = 0; i < D; ++i) s += int32_t(q8[size_t(i)]) * code_at(codes + size_t(j) * pk, i, bits);
      out[size_t(h) * size_t(ld_out) + size_t(j)] = (float(s) - b) * a + qz;
    }
  }
}

void kivi_v_block_ref(const float* p, int ld_p, int nq, const uint8_t* codes, const uint16_t* scale,
                      const uint16_t* zero, int nk, int D, int bits, float* acc, float* zacc) {
  const size_t pk = packed_bytes(D, bits);
  for (int h = 0; h < nq; ++h)
    for (int j = 0; j < nk; ++j) {
      const float w = p[size_t(h) * size_t(ld_p) + size_t(j)];
      const float s = std::max(kMinScale, f16_to_f32(scale[j]));
      for (int i = 0; i < D; ++i)
        acc[size_t(h) * size_t(D) + size_t(i)] += w * s * float(code_at(codes + size_t(j) * pk, i, bits));
      zacc[h] += w * f16_to_f32(zero[j]);
    }
}

void matmul_ref(const float* x, int T, const WeightMatrix& w, const float* bias, float* y) {
  std::vector<float> row(size_t(w.cols));
  for (int r = 0; r < w.rows; ++r) {
    if (w.format == WeightFormat::Affine)
      affine_dequant_row(w, r, row.data());
    else if (w.format == WeightFormat::Ggml)
      ggml_dequant_row(w, r, row.data());
    else if (w.format == WeightFormat::Panels)
      panels_row(w, r, row.data());
    else
      load_from_ref(static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes(), w.dtype, row.data(), w.cols);
    for (int t = 0; t < T; ++t) {
      double s = bias ? bias[r] : 0.0;
      for (int k = 0; k < w.cols; ++k) s += double(x[size_t(t) * size_t(w.cols) + size_t(k)]) * row[size_t(k)];
      y[size_t(t) * size_t(w.rows) + size_t(r)] = float(s);
    }
  }
}

}  // namespace ptllm
