#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace ptllm {

float dot(const float* a, const float* b, int n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float a, const float* x, float* y, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

float dot_stored(const float* a, const void* b, DType t, int n) {
  float s = 0.f;
  switch (t) {
    case DType::F32:
      return dot(a, static_cast<const float*>(b), n);
    case DType::BF16: {
      const uint16_t* h = static_cast<const uint16_t*>(b);
#pragma omp simd reduction(+ : s)
      for (int i = 0; i < n; ++i) s += a[i] * bf16_to_f32(h[i]);
      return s;
    }
    case DType::F16: {
      const uint16_t* h = static_cast<const uint16_t*>(b);
      for (int i = 0; i < n; ++i) s += a[i] * f16_to_f32(h[i]);
      return s;
    }
    default:
      PTLLM_CHECK(!"dot_stored: not a float dtype");
  }
  return s;
}

void axpy_stored(float a, const void* x, DType t, float* y, int n) {
  switch (t) {
    case DType::F32:
      axpy(a, static_cast<const float*>(x), y, n);
      return;
    case DType::BF16: {
      const uint16_t* h = static_cast<const uint16_t*>(x);
#pragma omp simd
      for (int i = 0; i < n; ++i) y[i] += a * bf16_to_f32(h[i]);
      return;
    }
    case DType::F16: {
      const uint16_t* h = static_cast<const uint16_t*>(x);
      for (int i = 0; i < n; ++i) y[i] += a * f16_to_f32(h[i]);
      return;
    }
    default:
      PTLLM_CHECK(!"axpy_stored: not a float dtype");
  }
}

void store_as(const float* src, void* dst, DType t, int n) {
  switch (t) {
    case DType::F32:
      std::copy_n(src, n, static_cast<float*>(dst));
      return;
    case DType::BF16:
      for (int i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(src[i]);
      return;
    case DType::F16:
      for (int i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(src[i]);
      return;
    default:
      PTLLM_CHECK(!"store_as: not a float dtype");
  }
}

void load_from(const void* src, DType t, float* dst, int n) { convert_to_f32(t, src, dst, size_t(n)); }

void weight_row(const WeightMatrix& w, int r, float* out) {
  const size_t off = size_t(r) * size_t(w.cols);
  switch (w.dtype) {
    case DType::F32:
      std::copy_n(static_cast<const float*>(w.data) + off, w.cols, out);
      break;
    case DType::BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(w.data) + off;
#pragma omp simd
      for (int i = 0; i < w.cols; ++i) out[i] = bf16_to_f32(s[i]);
      break;
    }
    default:
      convert_to_f32(w.dtype, static_cast<const uint8_t*>(w.data) + off * dtype_size(w.dtype), out, size_t(w.cols));
  }
}

namespace {
constexpr int kRowTile = 8;  // weight rows converted and reused across all T inputs

void matmul_rows(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, int r0, int r1) {
  thread_local std::vector<float> tile;
  const int K = w.cols;
  if (tile.size() < size_t(kRowTile) * size_t(K)) tile.resize(size_t(kRowTile) * size_t(K));
  for (int rb = r0; rb < r1; rb += kRowTile) {
    const int nr = std::min(kRowTile, r1 - rb);
    const float* rows[kRowTile];
    for (int i = 0; i < nr; ++i) {
      if (w.dtype == DType::F32) {
        rows[i] = static_cast<const float*>(w.data) + size_t(rb + i) * size_t(K);
      } else {
        weight_row(w, rb + i, tile.data() + size_t(i) * size_t(K));
        rows[i] = tile.data() + size_t(i) * size_t(K);
      }
    }
    for (int t = 0; t < T; ++t) {
      const float* xt = x + size_t(t) * size_t(K);
      float* yt = y + size_t(t) * size_t(w.rows);
      for (int i = 0; i < nr; ++i) yt[rb + i] = dot(xt, rows[i], K) + (bias ? bias[rb + i] : 0.f);
    }
  }
}
}  // namespace

void matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool) {
  pool.parallel_for(size_t(w.rows), [&](size_t b, size_t e) { matmul_rows(x, T, w, bias, y, int(b), int(e)); },
                    kRowTile);
}

void matmul_ref(const float* x, int T, const WeightMatrix& w, const float* bias, float* y) {
  std::vector<float> row(size_t(w.cols));
  for (int r = 0; r < w.rows; ++r) {
    weight_row(w, r, row.data());
    for (int t = 0; t < T; ++t) {
      double s = bias ? bias[r] : 0.0;
      for (int k = 0; k < w.cols; ++k) s += double(x[size_t(t) * size_t(w.cols) + size_t(k)]) * row[size_t(k)];
      y[size_t(t) * size_t(w.rows) + size_t(r)] = float(s);
    }
  }
}

void rmsnorm(const float* x, const float* w, float* out, int n, float eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / float(n) + eps);
#pragma omp simd
  for (int i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

void silu_mul(float* gate, const float* up, int n) {
  for (int i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void softmax(float* x, int n) {
  float m = *std::max_element(x, x + n);
  float s = 0.f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  const float inv = 1.0f / s;
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

void rope_cos_sin(const float* inv_freq, int half, int64_t pos, float* cos, float* sin) {
  for (int i = 0; i < half; ++i) {
    const float a = float(pos) * inv_freq[i];
    cos[i] = float(std::cos(double(a)));
    sin[i] = float(std::sin(double(a)));
  }
}

void rope_rotate_one(const float* x, int head_dim, const float* cos, const float* sin, float* out) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    out[i] = x[i] * cos[i] - x[i + half] * sin[i];
    out[i + half] = x[i + half] * cos[i] + x[i] * sin[i];
  }
}

void rope_rotate(float* x, int n_heads, int head_dim, const float* cos, const float* sin) {
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

}  // namespace ptllm
