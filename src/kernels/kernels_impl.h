// Kernel bodies written once over a vector-traits type V and compiled once per SIMD target: each
// kernels_<target>.cpp defines PTLLM_TARGET (a target attribute, or nothing), its traits, then
// includes this file. Everything here has internal linkage, so code built for one instruction set
// is never shared with (or picked by the linker for) another.
//
// V provides: F (a register of N floats), N, the gemm tile MR x (NRV * N) and gemv token group GT;
// zero, set1, load, load_n (first n lanes, zeros after), store, store_n; add, sub, mul, div, fma
// (a * b + c), fnma (c - a * b), min, max, reduce_add, reduce_max; load_bf16/f16(_n),
// store_bf16/f16(_n) (16-bit rows at any address); load_u8/u4/u2 (N codes of a packed row);
// round (to nearest), pow2i (2^n for integral n), blend_lt (x < lo ? a : b), transpose (N x N),
// and Bf16Rows (a bf16 row read in consecutive chunks of 2N, as its even and odd elements).
#ifndef PTLLM_TARGET
#error "define PTLLM_TARGET before including kernels_impl.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>

#include "kernels/quant.h"
#include "kernels/simd.h"

namespace ptllm {
namespace {

#if defined(__clang__)
#define PTLLM_UNROLL _Pragma("unroll")
#else
#define PTLLM_UNROLL _Pragma("GCC unroll 16")
#endif

// A 64-byte aligned scratch buffer that only grows (packed tiles, reordered x; one per thread).
class Scratch {
 public:
  ~Scratch() { release(); }
  float* get(size_t n) {
    if (n > size_) {
      release();
      data_ = static_cast<float*>(::operator new[](n * sizeof(float), std::align_val_t(64)));
      size_ = n;
    }
    return data_;
  }

 private:
  void release() {
    if (data_) ::operator delete[](data_, std::align_val_t(64));
    data_ = nullptr;
    size_ = 0;
  }
  float* data_ = nullptr;
  size_t size_ = 0;
};

template <class V>
struct Kernels {
  using F = typename V::F;
  static constexpr int N = V::N;
  static constexpr int MR = V::MR;        // gemm tile: MR rows of x ...
  static constexpr int NR = V::NRV * N;   // ... times NR weight rows (output columns)
  static constexpr int KC = 256;          // depth of one packed tile
  static constexpr int MC = MR * 32;      // rows of x whose panels stay in L2

  // Loaders of a stored row (F32, BF16, F16) by element index.
  struct LdF32 {
    PTLLM_TARGET static F load(const void* p, size_t i) { return V::load(static_cast<const float*>(p) + i); }
    PTLLM_TARGET static F load_n(const void* p, size_t i, int n) { return V::load_n(static_cast<const float*>(p) + i, n); }
  };
  struct LdBF16 {
    PTLLM_TARGET static F load(const void* p, size_t i) { return V::load_bf16(static_cast<const char*>(p) + 2 * i); }
    PTLLM_TARGET static F load_n(const void* p, size_t i, int n) {
      return V::load_bf16_n(static_cast<const char*>(p) + 2 * i, n);
    }
  };
  struct LdF16 {
    PTLLM_TARGET static F load(const void* p, size_t i) { return V::load_f16(static_cast<const char*>(p) + 2 * i); }
    PTLLM_TARGET static F load_n(const void* p, size_t i, int n) {
      return V::load_f16_n(static_cast<const char*>(p) + 2 * i, n);
    }
  };

  // ---- dot / axpy over float32, BF16 or F16 rows ------------------------------------------------

  template <class Ld>
  PTLLM_TARGET static float dot_t(const float* a, const void* b, int n) {
    F s0 = V::zero(), s1 = V::zero(), s2 = V::zero(), s3 = V::zero();
    int i = 0;
    for (; i + 4 * N <= n; i += 4 * N) {
      s0 = V::fma(V::load(a + i), Ld::load(b, size_t(i)), s0);
      s1 = V::fma(V::load(a + i + N), Ld::load(b, size_t(i + N)), s1);
      s2 = V::fma(V::load(a + i + 2 * N), Ld::load(b, size_t(i + 2 * N)), s2);
      s3 = V::fma(V::load(a + i + 3 * N), Ld::load(b, size_t(i + 3 * N)), s3);
    }
    for (; i + N <= n; i += N) s0 = V::fma(V::load(a + i), Ld::load(b, size_t(i)), s0);
    if (i < n) s1 = V::fma(V::load_n(a + i, n - i), Ld::load_n(b, size_t(i), n - i), s1);
    return V::reduce_add(V::add(V::add(s0, s1), V::add(s2, s3)));
  }
  PTLLM_TARGET static float dot(const float* a, const float* b, int n) { return dot_t<LdF32>(a, b, n); }
  PTLLM_TARGET static float dot_bf16(const float* a, const void* b, int n) { return dot_t<LdBF16>(a, b, n); }
  PTLLM_TARGET static float dot_f16(const float* a, const void* b, int n) { return dot_t<LdF16>(a, b, n); }

  template <class Ld>
  PTLLM_TARGET static void axpy_t(float a, const void* x, float* y, int n) {
    const F av = V::set1(a);
    int i = 0;
    for (; i + 2 * N <= n; i += 2 * N) {
      V::store(y + i, V::fma(av, Ld::load(x, size_t(i)), V::load(y + i)));
      V::store(y + i + N, V::fma(av, Ld::load(x, size_t(i + N)), V::load(y + i + N)));
    }
    for (; i + N <= n; i += N) V::store(y + i, V::fma(av, Ld::load(x, size_t(i)), V::load(y + i)));
    if (i < n) V::store_n(y + i, V::fma(av, Ld::load_n(x, size_t(i), n - i), V::load_n(y + i, n - i)), n - i);
  }
  PTLLM_TARGET static void axpy(float a, const float* x, float* y, int n) { axpy_t<LdF32>(a, x, y, n); }
  PTLLM_TARGET static void axpy_bf16(float a, const void* x, float* y, int n) { axpy_t<LdBF16>(a, x, y, n); }
  PTLLM_TARGET static void axpy_f16(float a, const void* x, float* y, int n) { axpy_t<LdF16>(a, x, y, n); }

  // ---- conversions -------------------------------------------------------------------------------

  PTLLM_TARGET static void to_bf16(const float* src, void* dst, int n) {
    char* d = static_cast<char*>(dst);
    int i = 0;
    for (; i + N <= n; i += N) V::store_bf16(d + 2 * size_t(i), V::load(src + i));
    if (i < n) V::store_bf16_n(d + 2 * size_t(i), V::load_n(src + i, n - i), n - i);
  }
  PTLLM_TARGET static void to_f16(const float* src, void* dst, int n) {
    char* d = static_cast<char*>(dst);
    int i = 0;
    for (; i + N <= n; i += N) V::store_f16(d + 2 * size_t(i), V::load(src + i));
    if (i < n) V::store_f16_n(d + 2 * size_t(i), V::load_n(src + i, n - i), n - i);
  }
  template <class Ld>
  PTLLM_TARGET static void from_t(const void* src, float* dst, int n) {
    int i = 0;
    for (; i + N <= n; i += N) V::store(dst + i, Ld::load(src, size_t(i)));
    if (i < n) V::store_n(dst + i, Ld::load_n(src, size_t(i), n - i), n - i);
  }
  PTLLM_TARGET static void from_bf16(const void* src, float* dst, int n) { from_t<LdBF16>(src, dst, n); }
  PTLLM_TARGET static void from_f16(const void* src, float* dst, int n) { from_t<LdF16>(src, dst, n); }

  // ---- KIVI codes (kernels/quant.h): sum a[i] c[i] and acc[i] += w c[i] ---------------------------

  PTLLM_TARGET static F load_codes(const uint8_t* codes, int i, int bits) {
    switch (bits) {
      case 8: return V::load_u8(codes + i);
      case 4: return V::load_u4(codes + i / 2);
      default: return V::load_u2(codes + i / 4);
    }
  }
  PTLLM_TARGET static float dot_codes(const float* a, const uint8_t* codes, int D, int bits) {
    F s0 = V::zero(), s1 = V::zero();
    int i = 0;
    for (; i + 2 * N <= D; i += 2 * N) {
      s0 = V::fma(V::load(a + i), load_codes(codes, i, bits), s0);
      s1 = V::fma(V::load(a + i + N), load_codes(codes, i + N, bits), s1);
    }
    for (; i + N <= D; i += N) s0 = V::fma(V::load(a + i), load_codes(codes, i, bits), s0);
    float sum = V::reduce_add(V::add(s0, s1));
    for (; i < D; ++i) sum += a[i] * float(code_at(codes, i, bits));
    return sum;
  }
  PTLLM_TARGET static void axpy_codes(float w, const uint8_t* codes, int D, int bits, float* acc) {
    const F wv = V::set1(w);
    int i = 0;
    for (; i + N <= D; i += N) V::store(acc + i, V::fma(wv, load_codes(codes, i, bits), V::load(acc + i)));
    for (; i < D; ++i) acc[i] += w * float(code_at(codes, i, bits));
  }

  // ---- elementwise ---------------------------------------------------------------------------------

  // e^x within ~2 ulp (Cephes expf: Cody-Waite reduction, degree-6 polynomial). 0 below the
  // smallest normal's logarithm; inputs above 88 give e^88 (only silu(x < -88) reaches there,
  // where x / (1 + e^88) is already ~0).
  PTLLM_TARGET static F exp(F x) {
    const F lo = V::set1(-87.33654f);
    const F xc = V::min(V::max(x, lo), V::set1(88.0f));
    const F n = V::round(V::mul(xc, V::set1(1.44269504088896341f)));
    F r = V::fnma(n, V::set1(0.693359375f), xc);
    r = V::fnma(n, V::set1(-2.12194440e-4f), r);
    F p = V::set1(1.9875691500e-4f);
    p = V::fma(p, r, V::set1(1.3981999507e-3f));
    p = V::fma(p, r, V::set1(8.3334519073e-3f));
    p = V::fma(p, r, V::set1(4.1665795894e-2f));
    p = V::fma(p, r, V::set1(1.6666665459e-1f));
    p = V::fma(p, r, V::set1(5.0000001201e-1f));
    const F y = V::fma(p, V::mul(r, r), V::add(r, V::set1(1.0f)));
    return V::blend_lt(x, lo, V::zero(), V::mul(y, V::pow2i(n)));
  }

  PTLLM_TARGET static void rmsnorm(const float* x, const float* w, float* out, int n, float eps) {
    F s0 = V::zero(), s1 = V::zero();
    int i = 0;
    for (; i + 2 * N <= n; i += 2 * N) {
      const F a = V::load(x + i), b = V::load(x + i + N);
      s0 = V::fma(a, a, s0);
      s1 = V::fma(b, b, s1);
    }
    for (; i + N <= n; i += N) {
      const F a = V::load(x + i);
      s0 = V::fma(a, a, s0);
    }
    if (i < n) {
      const F a = V::load_n(x + i, n - i);
      s1 = V::fma(a, a, s1);
    }
    const float ss = V::reduce_add(V::add(s0, s1));
    const F inv = V::set1(1.0f / std::sqrt(ss / float(n) + eps));
    for (i = 0; i + N <= n; i += N) V::store(out + i, V::mul(V::load(w + i), V::mul(V::load(x + i), inv)));
    if (i < n) V::store_n(out + i, V::mul(V::load_n(w + i, n - i), V::mul(V::load_n(x + i, n - i), inv)), n - i);
  }

  PTLLM_TARGET static F silu_mul_v(F g, F u) {
    return V::mul(V::div(g, V::add(V::set1(1.0f), exp(V::sub(V::zero(), g)))), u);
  }
  PTLLM_TARGET static void silu_mul(float* gate, const float* up, int n) {
    int i = 0;
    for (; i + N <= n; i += N) V::store(gate + i, silu_mul_v(V::load(gate + i), V::load(up + i)));
    if (i < n) V::store_n(gate + i, silu_mul_v(V::load_n(gate + i, n - i), V::load_n(up + i, n - i)), n - i);
  }

  PTLLM_TARGET static void softmax(float* x, int n) {
    F m = V::set1(-INFINITY);
    int i = 0;
    for (; i + N <= n; i += N) m = V::max(m, V::load(x + i));
    float mx = V::reduce_max(m);
    for (int j = i; j < n; ++j) mx = std::max(mx, x[j]);
    const F mv = V::set1(mx);
    F s = V::zero();
    for (i = 0; i + N <= n; i += N) {
      const F e = exp(V::sub(V::load(x + i), mv));
      V::store(x + i, e);
      s = V::add(s, e);
    }
    float sum = V::reduce_add(s);
    if (i < n) {
      V::store_n(x + i, exp(V::sub(V::load_n(x + i, n - i), mv)), n - i);
      for (int j = i; j < n; ++j) sum += x[j];
    }
    const F inv = V::set1(1.0f / sum);
    for (i = 0; i + N <= n; i += N) V::store(x + i, V::mul(V::load(x + i), inv));
    if (i < n) V::store_n(x + i, V::mul(V::load_n(x + i, n - i), inv), n - i);
  }

  // rotate_half RoPE: (a, b) = (x[i], x[i + half]) -> (a cos - b sin, b cos + a sin); the same
  // multiplies and subtraction as the scalar twin (no fused multiply-add), so the results are equal.
  PTLLM_TARGET static void rope_pairs(const float* x, int half, const float* cos, const float* sin, float* out) {
    int i = 0;
    for (; i + N <= half; i += N) {
      const F a = V::load(x + i), b = V::load(x + half + i), c = V::load(cos + i), s = V::load(sin + i);
      V::store(out + i, V::sub(V::mul(a, c), V::mul(b, s)));
      V::store(out + half + i, V::add(V::mul(b, c), V::mul(a, s)));
    }
    if (i < half) {
      const int r = half - i;
      const F a = V::load_n(x + i, r), b = V::load_n(x + half + i, r), c = V::load_n(cos + i, r),
              s = V::load_n(sin + i, r);
      V::store_n(out + i, V::sub(V::mul(a, c), V::mul(b, s)), r);
      V::store_n(out + half + i, V::add(V::mul(b, c), V::mul(a, s)), r);
    }
  }
  PTLLM_TARGET static void rope_rotate(float* x, int n_heads, int head_dim, const float* cos, const float* sin) {
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + size_t(h) * size_t(head_dim);
      rope_pairs(v, head_dim / 2, cos, sin, v);
    }
  }
  PTLLM_TARGET static void rope_rotate_one(const float* x, int head_dim, const float* cos, const float* sin,
                                           float* out) {
    rope_pairs(x, head_dim / 2, cos, sin, out);
  }

  // ---- gemv: y[t][r] = x[t] . W[r] + bias[r] for a few t, weights streamed once ------------------
  // One weight row at a time, so a thread reads its rows as one sequential stream (what hardware
  // prefetchers follow best: interleaving several rows measured 2-3x slower); x stays in L1/L2.
  // Each row's sum is taken in an order fixed by element index, never by address, so results do not
  // depend on where a checkpoint's bytes sit (sharded or re-padded files give identical logits).

  // F32 and F16 rows: chunks of N consecutive elements, U accumulators per row of x (TT * U >= 4
  // hides the FMA latency), the tail masked.
  template <class Ld, int TT>
  PTLLM_TARGET static void gemv_row(const float* x, int K, const void* w, int r, float* y, int ldy, const float* bias) {
    constexpr int U = TT >= 4 ? 1 : 4 / TT;
    F acc[TT][U];
    PTLLM_UNROLL for (int t = 0; t < TT; ++t) PTLLM_UNROLL for (int u = 0; u < U; ++u) acc[t][u] = V::zero();
    const size_t row = size_t(r) * size_t(K);
    int k = 0;
    for (; k + U * N <= K; k += U * N) {
      PTLLM_UNROLL for (int u = 0; u < U; ++u) {
        const F wv = Ld::load(w, row + size_t(k + u * N));
        PTLLM_UNROLL for (int t = 0; t < TT; ++t)
          acc[t][u] = V::fma(V::load(x + size_t(t) * size_t(K) + size_t(k + u * N)), wv, acc[t][u]);
      }
    }
    for (; k < K; k += N) {
      const int n = std::min(N, K - k);
      const F wv = Ld::load_n(w, row + size_t(k), n);
      PTLLM_UNROLL for (int t = 0; t < TT; ++t)
        acc[t][0] = V::fma(V::load_n(x + size_t(t) * size_t(K) + size_t(k), n), wv, acc[t][0]);
    }
    PTLLM_UNROLL for (int t = 0; t < TT; ++t) {
      F s = acc[t][0];
      PTLLM_UNROLL for (int u = 1; u < U; ++u) s = V::add(s, acc[t][u]);
      y[size_t(t) * size_t(ldy) + size_t(r)] = V::reduce_add(s) + (bias ? bias[r] : 0.f);
    }
  }

  // BF16 rows: chunks of 2N elements split into the even and the odd ones, which are a 16-bit shift
  // and a mask away from float32 (cheaper than widening), against x deinterleaved the same way (xd).
  // V::Bf16Rows reads the chunks; on AVX-512 from aligned lines: safetensors data is only 8-byte
  // aligned, and loads straddling cache lines cost ~20% of the streaming rate (bench_kernels decode/*).
  template <int TT>
  PTLLM_TARGET static void gemv_row_bf16(const float* xd, const float* x, int K, const void* w, int r, float* y,
                                         int ldy, const float* bias) {
    constexpr int U = TT == 1 ? 2 : 1;
    constexpr int C = 2 * N;
    F ae[TT][U], ao[TT][U];
    PTLLM_UNROLL for (int t = 0; t < TT; ++t) PTLLM_UNROLL for (int u = 0; u < U; ++u) ae[t][u] = ao[t][u] = V::zero();
    const size_t row = size_t(r) * size_t(K);
    typename V::Bf16Rows rows(static_cast<const char*>(w) + 2 * row);
    const int full = K / C * C;
    int k = 0;
    for (; k + U * C <= full; k += U * C) {
      PTLLM_UNROLL for (int u = 0; u < U; ++u) {
        F e, o;
        rows.next(e, o);
        PTLLM_UNROLL for (int t = 0; t < TT; ++t) {
          const float* xt = xd + size_t(t) * size_t(K) + size_t(k + u * C);
          ae[t][u] = V::fma(V::load(xt), e, ae[t][u]);
          ao[t][u] = V::fma(V::load(xt + N), o, ao[t][u]);
        }
      }
    }
    for (; k < full; k += C) {
      F e, o;
      rows.next(e, o);
      PTLLM_UNROLL for (int t = 0; t < TT; ++t) {
        const float* xt = xd + size_t(t) * size_t(K) + size_t(k);
        ae[t][0] = V::fma(V::load(xt), e, ae[t][0]);
        ao[t][0] = V::fma(V::load(xt + N), o, ao[t][0]);
      }
    }
    for (; k < K; k += N) {  // the tail, in element order
      const int n = std::min(N, K - k);
      const F wv = LdBF16::load_n(w, row + size_t(k), n);
      PTLLM_UNROLL for (int t = 0; t < TT; ++t)
        ae[t][0] = V::fma(V::load_n(x + size_t(t) * size_t(K) + size_t(k), n), wv, ae[t][0]);
    }
    PTLLM_UNROLL for (int t = 0; t < TT; ++t) {
      F s = V::add(ae[t][0], ao[t][0]);
      PTLLM_UNROLL for (int u = 1; u < U; ++u) s = V::add(s, V::add(ae[t][u], ao[t][u]));
      y[size_t(t) * size_t(ldy) + size_t(r)] = V::reduce_add(s) + (bias ? bias[r] : 0.f);
    }
  }
  // x [T][K] with every full chunk of 2N reordered as its even elements, then its odd ones.
  PTLLM_TARGET static const float* deinterleave(const float* x, int T, int K) {
    static thread_local Scratch buf;
    float* xd = buf.get(size_t(T) * size_t(K));
    constexpr int C = 2 * N;
    for (int t = 0; t < T; ++t) {
      const float* src = x + size_t(t) * size_t(K);
      float* dst = xd + size_t(t) * size_t(K);
      for (int c = 0; c + C <= K; c += C)
        for (int i = 0; i < N; ++i) {
          dst[c + i] = src[c + 2 * i];
          dst[c + N + i] = src[c + 2 * i + 1];
        }
    }
    return xd;
  }

  // Rows [t, t + TT) of x against weight row r.
  template <class Ld, int TT>
  PTLLM_TARGET static void gemv_group(const float* x, const float* xd, int t, const WeightMatrix& w, int r,
                                      const float* bias, float* y) {
    const size_t xo = size_t(t) * size_t(w.cols);
    float* yt = y + size_t(t) * size_t(w.rows);
    if constexpr (std::is_same_v<Ld, LdBF16>)
      gemv_row_bf16<TT>(xd + xo, x + xo, w.cols, w.data, r, yt, w.rows, bias);
    else
      gemv_row<Ld, TT>(x + xo, w.cols, w.data, r, yt, w.rows, bias);
  }
  // Every row of x against weight rows [r0, r1); groups of rows of x share each weight row, read
  // from memory once and then from L1.
  template <class Ld>
  PTLLM_TARGET static void gemv_t(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, int r0,
                                  int r1) {
    const float* xd = std::is_same_v<Ld, LdBF16> ? deinterleave(x, T, w.cols) : nullptr;
    for (int r = r0; r < r1; ++r) {
      int t = 0;
      if constexpr (V::GT >= 4)
        for (; t + 4 <= T; t += 4) gemv_group<Ld, 4>(x, xd, t, w, r, bias, y);
      for (; t + 2 <= T; t += 2) gemv_group<Ld, 2>(x, xd, t, w, r, bias, y);
      for (; t < T; ++t) gemv_group<Ld, 1>(x, xd, t, w, r, bias, y);
    }
  }
  PTLLM_TARGET static void gemv(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, int r0,
                                int r1) {
    switch (w.dtype) {
      case DType::BF16: gemv_t<LdBF16>(x, T, w, bias, y, r0, r1); break;
      case DType::F16: gemv_t<LdF16>(x, T, w, bias, y, r0, r1); break;
      default: gemv_t<LdF32>(x, T, w, bias, y, r0, r1); break;
    }
  }

  // ---- gemm: packed tiles (Goto/BLIS): x in MR-row panels, W in NR-row panels converted to float32
  // and transposed so a k step of the micro-kernel is NRV vector loads and MR broadcasts ----------

  // Packed x, shared by every thread of a product: for each depth block k0 (KC columns), the MR-row
  // panels of x, each [kc][MR], rows past T zero. Panel p of block k0 starts at
  // ap + k0 * Tp + p * MR * kc, Tp = T rounded up to MR. Packs panels [p0, p1).
  PTLLM_TARGET static void pack_a(const float* x, int T, int K, int p0, int p1, float* ap) {
    const size_t Tp = size_t((T + MR - 1) / MR * MR);
    for (int k0 = 0; k0 < K; k0 += KC) {
      const int kc = std::min(KC, K - k0);
      for (int p = p0; p < p1; ++p) {
        float* dst = ap + size_t(k0) * Tp + size_t(p) * MR * size_t(kc);
        const int m = std::min(MR, T - p * MR);
        for (int i = 0; i < MR; ++i) {
          const float* src = x + size_t(p * MR + i) * size_t(K) + size_t(k0);
          for (int k = 0; k < kc; ++k) dst[size_t(k) * MR + size_t(i)] = i < m ? src[k] : 0.f;
        }
      }
    }
  }
  // bp [kc][NR] <- weight rows [r, r + nr), columns [k0, k0 + kc), N x N blocks transposed in registers.
  template <class Ld>
  PTLLM_TARGET static void pack_b(const void* w, int K, int r, int nr, int k0, int kc, float* bp) {
    for (int j0 = 0; j0 < NR; j0 += N) {
      for (int k = 0; k < kc; k += N) {
        const int kn = std::min(N, kc - k);
        F blk[N];
        PTLLM_UNROLL for (int j = 0; j < N; ++j) {
          const size_t off = size_t(r + j0 + j) * size_t(K) + size_t(k0 + k);
          if (j0 + j >= nr)
            blk[j] = V::zero();
          else
            blk[j] = kn == N ? Ld::load(w, off) : Ld::load_n(w, off, kn);
        }
        V::transpose(blk);
        for (int i = 0; i < kn; ++i) V::store(bp + size_t(k + i) * NR + size_t(j0), blk[i]);
      }
    }
  }
  // c[i][j] (+)= sum_k ap[k][i] bp[k][j] for i < m, j < n; bias added when not accumulating.
  PTLLM_TARGET static void micro(int kc, const float* ap, const float* bp, float* c, size_t ldc, int m, int n,
                                 bool accumulate, const float* bias) {
    F acc[MR][V::NRV];
    PTLLM_UNROLL for (int i = 0; i < MR; ++i) PTLLM_UNROLL for (int v = 0; v < V::NRV; ++v) acc[i][v] = V::zero();
    for (int k = 0; k < kc; ++k) {
      F b[V::NRV];
      PTLLM_UNROLL for (int v = 0; v < V::NRV; ++v) b[v] = V::load(bp + size_t(k) * NR + size_t(v) * N);
      const float* a = ap + size_t(k) * MR;
      PTLLM_UNROLL for (int i = 0; i < MR; ++i) {
        const F av = V::set1(a[i]);
        PTLLM_UNROLL for (int v = 0; v < V::NRV; ++v) acc[i][v] = V::fma(av, b[v], acc[i][v]);
      }
    }
    PTLLM_UNROLL for (int i = 0; i < MR; ++i) {
      float* ci = c + size_t(i) * ldc;
      PTLLM_UNROLL for (int v = 0; v < V::NRV; ++v) {
        const int cols = n - v * N;
        if (i >= m || cols <= 0) continue;
        F r = acc[i][v];
        if (cols >= N) {
          if (accumulate)
            r = V::add(r, V::load(ci + v * N));
          else if (bias)
            r = V::add(r, V::load(bias + v * N));
          V::store(ci + v * N, r);
        } else {
          if (accumulate)
            r = V::add(r, V::load_n(ci + v * N, cols));
          else if (bias)
            r = V::add(r, V::load_n(bias + v * N, cols));
          V::store_n(ci + v * N, r, cols);
        }
      }
    }
  }
  // y[t][r] for r in [r0, r1) from x packed by pack_a.
  template <class Ld>
  PTLLM_TARGET static void gemm_t(const float* ap, int T, const WeightMatrix& w, const float* bias, float* y, int r0,
                                  int r1) {
    static thread_local Scratch b_buf;
    const int K = w.cols;
    const size_t Tp = size_t((T + MR - 1) / MR * MR);
    float* bp = b_buf.get(size_t(KC) * NR);
    for (int k0 = 0; k0 < K; k0 += KC) {
      const int kc = std::min(KC, K - k0);
      const bool accumulate = k0 > 0;
      const float* block = ap + size_t(k0) * Tp;
      // MC rows of x at a time keep their panels in L2 while the weight tiles pass.
      for (int i0 = 0; i0 < T; i0 += MC) {
        const int mc = std::min(MC, T - i0);
        for (int jr = r0; jr < r1; jr += NR) {
          const int nr = std::min(NR, r1 - jr);
          pack_b<Ld>(w.data, K, jr, nr, k0, kc, bp);
          for (int ir = 0; ir < mc; ir += MR)
            micro(kc, block + size_t(i0 + ir) * size_t(kc), bp, y + size_t(i0 + ir) * size_t(w.rows) + size_t(jr),
                  size_t(w.rows), std::min(MR, mc - ir), nr, accumulate, bias && !accumulate ? bias + jr : nullptr);
        }
      }
    }
  }
  PTLLM_TARGET static void gemm(const float* ap, int T, const WeightMatrix& w, const float* bias, float* y, int r0,
                                int r1) {
    switch (w.dtype) {
      case DType::BF16: gemm_t<LdBF16>(ap, T, w, bias, y, r0, r1); break;
      case DType::F16: gemm_t<LdF16>(ap, T, w, bias, y, r0, r1); break;
      default: gemm_t<LdF32>(ap, T, w, bias, y, r0, r1); break;
    }
  }
};

template <class V>
constexpr KernelTable make_table(SimdTarget target) {
  using K = Kernels<V>;
  return KernelTable{target,          K::dot,         K::dot_bf16,    K::dot_f16,     K::axpy,
                     K::axpy_bf16,    K::axpy_f16,    K::to_bf16,     K::to_f16,      K::from_bf16,
                     K::from_f16,     K::dot_codes,   K::axpy_codes,  K::rmsnorm,     K::silu_mul,
                     K::softmax,      K::rope_rotate, K::rope_rotate_one, K::gemv,    K::pack_a,
                     K::gemm,         K::MR,          K::NR};
}

#undef PTLLM_UNROLL

}  // namespace
}  // namespace ptllm
