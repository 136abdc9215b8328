// Kernel bodies written once over a vector-traits type V and compiled once per SIMD target: each
// kernels_<target>.cpp defines PTLLM_TARGET (a target attribute, or nothing), its traits, then
// includes this file. Everything here has internal linkage, so code built for one instruction set
// is never shared with (or picked by the linker for) another.
//
// V provides: F (a register of N floats), N, the gemm tile MR x (NRV * N) and gemv token group GT;
// zero, set1, load, load_n (first n lanes, zeros after), store, store_n; add, sub, mul, div, fma
// (a * b + c), fnma (c - a * b), min, max, reduce_add, reduce_add4 (four sums at once), reduce_max; load_bf16/f16(_n),
// store_bf16/f16(_n) (16-bit rows at any address); load_u8/u4/u2 (N codes of a packed row);
// load_u4_split/load_u2_split (N bytes of codes split by position in the byte), deinterleave and
// interleave (2N lanes <-> even and odd lanes);
// round (to nearest), ldexp_ge (x < lo ? 0 : y 2^n for integral n), transpose (N x N),
// and Bf16Rows (a bf16 row read in consecutive chunks of 2N, as its even and odd elements),
// bf16_pairs (one such chunk from any address).
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
#include "kernels/scratch.h"
#include "kernels/simd.h"

namespace ptllm {
namespace {

#if defined(__clang__)
#define PTLLM_UNROLL _Pragma("unroll")
#else
#define PTLLM_UNROLL _Pragma("GCC unroll 16")
#endif

// kivi_k_spans and kivi_v_spans (quant.h) through a target's one-block kernels: the block calls in
// order. Scales (a line or two each; the codes are asked for by the block kernels through k_next and
// v_next): while span i's keys are scored, the K scales span i + 2 reads and the V scales of span i
// (the AVX-512 values pass rounds the weights of several spans before it reads their codes, so the
// first ones' scales must be at hand by then); while span i's values are summed, the V scales of
// span i + 2.
inline void ask_span_scales(const KiviSpan* s, int ns, int i, bool values, int D) {
  const int t = i + 2;
  if (!values) {
    if (t < ns) prefetch_f16(s[t].ks, D), prefetch_f16(s[t].kz, D);
    prefetch_f16(s[i].vs, s[i].n), prefetch_f16(s[i].vz, s[i].n);
  } else if (t < ns) {
    prefetch_f16(s[t].vs, s[t].n), prefetch_f16(s[t].vz, s[t].n);
  }
}
template <auto Block>
void k_spans_by_block(const float* q, int nq, const KiviSpan* s, int ns, int G, float qscale, int D, int bits,
                      float* out, int ld_out) {
  for (int i = 0; i < ns; ++i) {
    ask_span_scales(s, ns, i, false, D);
    Block(q, nq, KRows{s[i].k, G, s[i].k0}, s[i].ks, s[i].kz, qscale, s[i].n, D, bits, out + s[i].col, ld_out,
          s[i].k_next);
  }
}
template <auto Block>
void v_spans_by_block(const float* p, int ld_p, int nq, const KiviSpan* s, int ns, int D, int bits, float* acc,
                      float* zacc) {
  for (int i = 0; i < ns; ++i) {
    ask_span_scales(s, ns, i, true, D);
    Block(p + s[i].col, ld_p, nq, s[i].v, s[i].vs, s[i].vz, s[i].n, D, bits, acc, zacc, s[i].v_next);
  }
}

// kivi_k_block and kivi_v_block through a target's span kernels: one span.
template <auto Spans>
void k_block_by_spans(const float* q, int nq, KRows k, const uint16_t* scale, const uint16_t* zero, float qscale,
                      int nk, int D, int bits, float* out, int ld_out, const void* next) {
  const KiviSpan s{k.group, k.j0, nullptr, scale, zero, nullptr, nullptr, nk, 0, next, nullptr};
  Spans(q, nq, &s, 1, k.G, qscale, D, bits, out, ld_out);
}
template <auto Spans>
void v_block_by_spans(const float* p, int ld_p, int nq, const uint8_t* codes, const uint16_t* scale,
                      const uint16_t* zero, int nk, int D, int bits, float* acc, float* zacc, const void* next) {
  const KiviSpan s{nullptr, 0, codes, nullptr, nullptr, scale, zero, nk, 0, nullptr, next};
  Spans(p, ld_p, nq, &s, 1, D, bits, acc, zacc);
}

template <class V>
struct Kernels {
  using F = typename V::F;
  static constexpr int N = V::N;
  static constexpr int MR = V::MR;        // gemm tile: MR rows of x ...
  static constexpr int NR = V::NRV * N;   // ... times NR weight rows (output columns)
  // Depth of one packed tile, and rows of x whose panels are walked while a weight tile is reused:
  // MC >= 512 so a 512-token prompt packs each weight tile once. Measured against 256 / MR * 32 on
  // the Llama-3.2-1B shapes (bench_kernels prefill/): 3-8% faster, y rewritten half as often.
  static constexpr int KC = 512;
  static constexpr int MC = MR * 48;

  // Asks for the cache lines of `next` (the rows the attention reads after these, laid out the same;
  // null: none) that start within bytes [lo, hi): called for each stretch of rows as it is read, it
  // asks for every line once, a few at a time (kv/kv_cache.cpp says why).
  [[gnu::always_inline]] PTLLM_TARGET static void prefetch_lines(const void* next, size_t lo, size_t hi) {
    if (!next) return;
    const char* p = static_cast<const char*>(next);
    for (size_t o = (lo + 63) / 64 * 64; o < hi; o += 64) __builtin_prefetch(p + o);
  }

  // Loaders of a stored row (F32, BF16, F16) by element index.
  struct LdF32 {
    static constexpr size_t kBytes = 4;
    PTLLM_TARGET static F load(const void* p, size_t i) { return V::load(static_cast<const float*>(p) + i); }
    PTLLM_TARGET static F load_n(const void* p, size_t i, int n) { return V::load_n(static_cast<const float*>(p) + i, n); }
  };
  struct LdBF16 {
    static constexpr size_t kBytes = 2;
    PTLLM_TARGET static F load(const void* p, size_t i) { return V::load_bf16(static_cast<const char*>(p) + 2 * i); }
    PTLLM_TARGET static F load_n(const void* p, size_t i, int n) {
      return V::load_bf16_n(static_cast<const char*>(p) + 2 * i, n);
    }
  };
  struct LdF16 {
    static constexpr size_t kBytes = 2;
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

  // ---- KIVI blocks: nk code rows for the nq query heads sharing a KV head (GQA) -----------------
  // Each code is unpacked and converted once and used by every head; passes of up to HR heads keep
  // their accumulators in registers (more heads: another pass).
  // Codes are read in groups of N bytes, GCH = N * 8 / BITS channels, unpacked without shuffles:
  // register r of the KPB = 8 / BITS a group gives holds channels r, r + KPB, r + 2 KPB, ... (a
  // shift and a mask each). The query (K) and the accumulators (V) are put in that order instead,
  // once per block ("split"). Channels past the last whole group are read N at a time in order,
  // then one at a time.
  static constexpr int HR = 4;
  static constexpr int CG = N >= 16 ? 4 : 2;  // registers of codes per unrolled step
  template <int BITS>
  static constexpr int KPB = 8 / BITS;
  template <int BITS>
  static constexpr int GCH = N * KPB<BITS>;
  template <int BITS>  // the middle code, (2^bits - 1) / 2 (kivi_k_block)
  static constexpr float kMid = float((1 << BITS) - 1) / 2.f;
  template <int BITS>  // groups per unrolled step
  static constexpr int UG = CG / KPB<BITS> > 1 ? CG / KPB<BITS> : 1;

  template <int BITS>
  PTLLM_TARGET static F load_codes_t(const uint8_t* codes, int i) {
    if constexpr (BITS == 8)
      return V::load_u8(codes + i);
    else if constexpr (BITS == 4)
      return V::load_u4(codes + i / 2);
    else
      return V::load_u2(codes + i / 4);
  }
  // The KPB registers of the group starting at channel g0 (a multiple of GCH).
  template <int BITS>
  PTLLM_TARGET static void load_group(const uint8_t* codes, int g0, F* r) {
    const uint8_t* p = codes + size_t(g0) * BITS / 8;
    if constexpr (BITS == 8)
      r[0] = V::load_u8(p);
    else if constexpr (BITS == 4)
      V::load_u4_split(p, r[0], r[1]);
    else
      V::load_u2_split(p, r);
  }
  // KPB registers of consecutive channels <-> the group order.
  template <int BITS>
  PTLLM_TARGET static void split(F* x) {
    if constexpr (BITS == 4) {
      F e, o;
      V::deinterleave(x[0], x[1], e, o);
      x[0] = e;
      x[1] = o;
    } else if constexpr (BITS == 2) {
      F e01, o01, e23, o23;
      V::deinterleave(x[0], x[1], e01, o01);  // channels 0 mod 2, 1 mod 2 of the first half
      V::deinterleave(x[2], x[3], e23, o23);
      V::deinterleave(e01, e23, x[0], x[2]);  // 0 mod 4, 2 mod 4
      V::deinterleave(o01, o23, x[1], x[3]);  // 1 mod 4, 3 mod 4
    }
  }
  template <int BITS>
  PTLLM_TARGET static void unsplit(F* x) {
    if constexpr (BITS == 4) {
      F a, b;
      V::interleave(x[0], x[1], a, b);
      x[0] = a;
      x[1] = b;
    } else if constexpr (BITS == 2) {
      F e01, e23, o01, o23;
      V::interleave(x[0], x[2], e01, e23);
      V::interleave(x[1], x[3], o01, o23);
      V::interleave(e01, o01, x[0], x[1]);
      V::interleave(e23, o23, x[2], x[3]);
    }
  }

  // K, one pass of R <= HR heads: out[h][j] = a[h] (sum_i q8[h][i] c_j[i] - b[h]) + qz[h], q8 [R][D]
  // the int8 query (quant.h, kivi_k_block) held as floats, its whole groups split. The sums of
  // integers are exact in float32 (|q8| <= 127, c <= 255: D <= 518), whatever their order. Two
  // keys at a time (2R independent FMA chains), a key's R sums reduced together.
  template <int BITS, int R>
  PTLLM_TARGET static void kivi_k_finish(const F* s, const float* qs, const float* a, const float* b,
                                         const float* qz, const uint8_t* c, int D, int full, float* out, int ld_out,
                                         int j) {
    float sum[4];
    V::reduce_add4(s[0], R > 1 ? s[1] : V::zero(), R > 2 ? s[2] : V::zero(), R > 3 ? s[3] : V::zero(), sum);
    PTLLM_UNROLL for (int h = 0; h < R; ++h) {
      for (int i = full; i < D; ++i) sum[h] += qs[size_t(h) * size_t(D) + size_t(i)] * float(code_at(c, i, BITS));
      out[size_t(h) * size_t(ld_out) + size_t(j)] = (sum[h] - b[h]) * a[h] + qz[h];
    }
  }
  template <int BITS, int R, int U>  // U groups from channel g0
  PTLLM_TARGET static void kivi_k_groups(const float* qs, int D, const uint8_t* c0, const uint8_t* c1, int g0, F* s0,
                                         F* s1) {
    constexpr int K = KPB<BITS>;
    PTLLM_UNROLL for (int u = 0; u < U; ++u) {
      const int gu = g0 + u * GCH<BITS>;
      F r0[K], r1[K];
      load_group<BITS>(c0, gu, r0);
      load_group<BITS>(c1, gu, r1);
      PTLLM_UNROLL for (int k = 0; k < K; ++k) PTLLM_UNROLL for (int h = 0; h < R; ++h) {
        const F qv = V::load(qs + size_t(h) * size_t(D) + size_t(gu + k * N));
        s0[h] = V::fma(qv, r0[k], s0[h]);
        s1[h] = V::fma(qv, r1[k], s1[h]);
      }
    }
  }
  template <int BITS, int R>
  PTLLM_TARGET static void kivi_k_pass(const float* qs, const float* a, const float* b, const float* qz,
                                       const uint8_t* codes, int nk, int D, float* out, int ld_out, const void* next) {
    static_assert(R >= 1 && R <= HR && HR == 4);
    constexpr int G = GCH<BITS>, U = UG<BITS>;
    const size_t pk = packed_bytes(D, BITS);
    const int full_u = D / (U * G) * (U * G), full_g = D / G * G, full = D / N * N;
    for (int j = 0; j < nk; j += 2) {
      prefetch_lines(next, size_t(j) * pk, size_t(std::min(j + 2, nk)) * pk);
      // An odd last key is paired with itself; only its first result is kept.
      const uint8_t* c0 = codes + size_t(j) * pk;
      const uint8_t* c1 = j + 1 < nk ? c0 + pk : c0;
      F s0[R], s1[R];
      PTLLM_UNROLL for (int h = 0; h < R; ++h) s0[h] = s1[h] = V::zero();
      int i = 0;
      for (; i < full_u; i += U * G) kivi_k_groups<BITS, R, U>(qs, D, c0, c1, i, s0, s1);
      for (; i < full_g; i += G) kivi_k_groups<BITS, R, 1>(qs, D, c0, c1, i, s0, s1);
      for (; i < full; i += N) {
        const F cv0 = load_codes_t<BITS>(c0, i), cv1 = load_codes_t<BITS>(c1, i);
        PTLLM_UNROLL for (int h = 0; h < R; ++h) {
          const F qv = V::load(qs + size_t(h) * size_t(D) + size_t(i));
          s0[h] = V::fma(qv, cv0, s0[h]);
          s1[h] = V::fma(qv, cv1, s1[h]);
        }
      }
      kivi_k_finish<BITS, R>(s0, qs, a, b, qz, c0, D, full, out, ld_out, j);
      if (j + 1 < nk) kivi_k_finish<BITS, R>(s1, qs, a, b, qz, c1, D, full, out, ld_out, j + 1);
    }
  }
  // Scales are read as float16 and floored at kMinScale, as the reference dequantizes them.
  PTLLM_TARGET static F load_scale(const uint16_t* p, int n) {
    return V::max(n == N ? V::load_f16(p) : V::load_f16_n(p, n), V::set1(kMinScale));
  }
  // sd [D] = max(kMinScale, s) * qscale, zd [D] = (z + mid * max(kMinScale, s)) * qscale: the key
  // at the middle code mid = (2^bits - 1) / 2.
  PTLLM_TARGET static void kivi_k_factors(const uint16_t* scale, const uint16_t* zero, float qscale, float mid, int D,
                                          float* sd, float* zd) {
    const F qsv = V::set1(qscale), mv = V::set1(mid);
    for (int i = 0; i < D; i += N) {
      const int n = std::min(N, D - i);
      const F s = load_scale(scale + i, n);
      const F sv = V::mul(s, qsv);
      const F zv = V::mul(V::add(n == N ? V::load_f16(zero + i) : V::load_f16_n(zero + i, n), V::mul(mv, s)), qsv);
      if (n == N) {
        V::store(sd + i, sv);
        V::store(zd + i, zv);
      } else {
        V::store_n(sd + i, sv, n);
        V::store_n(zd + i, zv, n);
      }
    }
  }
  // One head's query for kivi_k_block (quant.h): q8[i] = round(q[i] sd[i] * (127 / amax)) (as
  // floats, in channel order), a = amax / 127 with amax = max_i |q[i] sd[i]| (amax below
  // kMinQueryMax: a = 0 and q8 = 0), qsum = sum_i q8[i] (exact), qz = sum_i q[i] zd[i]. Division,
  // multiplication and rounding to nearest even are exact operations, so every target and the
  // twin get the same q8.
  PTLLM_TARGET static void kivi_k_quantize(const float* qh, const float* sd, const float* zd, int D, float* q8,
                                           float& a, float& qsum, float& qz) {
    F z = V::zero(), m = V::zero();
    int i = 0;
    for (; i + N <= D; i += N) {
      const F qv = V::load(qh + i), x = V::mul(qv, V::load(sd + i));
      V::store(q8 + i, x);
      m = V::max(m, V::max(x, V::sub(V::zero(), x)));
      z = V::fma(qv, V::load(zd + i), z);
    }
    float amax = V::reduce_max(m);
    qz = V::reduce_add(z);
    for (; i < D; ++i) {
      q8[i] = qh[i] * sd[i];
      amax = std::max(amax, std::fabs(q8[i]));
      qz += qh[i] * zd[i];
    }
    if (!(amax >= kMinQueryMax)) {
      a = qsum = 0.f;
      std::fill(q8, q8 + D, 0.f);
      return;
    }
    a = amax / 127.f;
    const float inv = 127.f / amax;
    const F iv = V::set1(inv);
    F t = V::zero();
    for (i = 0; i + N <= D; i += N) {
      const F x = V::round(V::mul(V::load(q8 + i), iv));
      V::store(q8 + i, x);
      t = V::add(t, x);
    }
    qsum = V::reduce_add(t);
    for (; i < D; ++i) {
      q8[i] = std::nearbyint(q8[i] * inv);
      qsum += q8[i];
    }
  }
  template <int BITS>
  PTLLM_TARGET static void kivi_k_block_b(const float* q, int nq, const uint8_t* codes, const uint16_t* scale,
                                          const uint16_t* zero, float qscale, int nk, int D, float* out, int ld_out,
                                          const void* next) {
    static thread_local Scratch buf;
    // [D] scale * qscale, [D] zero * qscale, [HR][D] int8 query heads of a pass (as floats).
    float* sd = buf.get((2 + size_t(HR)) * size_t(D));
    float* zd = sd + D;
    float* qs = zd + D;
    kivi_k_factors(scale, zero, qscale, kMid<BITS>, D, sd, zd);
    float qz[HR], a[HR], b[HR];
    for (int h0 = 0; h0 < nq; h0 += HR) {
      const int r = std::min(HR, nq - h0);
      for (int h = 0; h < r; ++h) {
        float* qsh = qs + size_t(h) * size_t(D);
        kivi_k_quantize(q + size_t(h0 + h) * size_t(D), sd, zd, D, qsh, a[h], b[h], qz[h]);
        b[h] *= kMid<BITS>;
        constexpr int K = KPB<BITS>;
        for (int g = 0; g + GCH<BITS> <= D; g += GCH<BITS>) {
          F x[K];
          PTLLM_UNROLL for (int k = 0; k < K; ++k) x[k] = V::load(qsh + g + k * N);
          split<BITS>(x);
          PTLLM_UNROLL for (int k = 0; k < K; ++k) V::store(qsh + g + k * N, x[k]);
        }
      }
      float* oh = out + size_t(h0) * size_t(ld_out);
      const void* nx = h0 == 0 ? next : nullptr;  // the first pass reads every row
      switch (r) {
        case 4: kivi_k_pass<BITS, 4>(qs, a, b, qz, codes, nk, D, oh, ld_out, nx); break;
        case 3: kivi_k_pass<BITS, 3>(qs, a, b, qz, codes, nk, D, oh, ld_out, nx); break;
        case 2: kivi_k_pass<BITS, 2>(qs, a, b, qz, codes, nk, D, oh, ld_out, nx); break;
        default: kivi_k_pass<BITS, 1>(qs, a, b, qz, codes, nk, D, oh, ld_out, nx); break;
      }
    }
  }
  // Stored K rows to plain rows in a per-thread buffer (the float kernels read rows; the tiled
  // order is the VNNI kernel's, kernels_avx512.cpp). Whole tiles whose columns come in multiples of
  // N: N x N blocks of 4-byte words transposed in registers (a tile's column c holds the words of
  // its 16 keys in turn: k_code_offset); the rest word by word (k_rows_from_group). AVX2, int4, 4
  // heads, a group of 32 keys, head_dim 64: the block kernel took 305 ns on plain rows, 418 ns
  // untiling word by word, 320 ns with the transposes (int8: 285, 457, 315-324 ns).
  PTLLM_TARGET static const uint8_t* k_plain(KRows k, int nk, size_t pk) {
    static thread_local Scratch buf;
    uint8_t* rows = reinterpret_cast<uint8_t*>(buf.get((size_t(nk) * pk + 3) / 4));
    const size_t cols = pk / 4;
    int j = 0;
    if (pk % 4 == 0 && cols % N == 0 && 16 % N == 0)
      for (; j + 16 <= nk && (k.j0 + j) % 16 == 0 && k.j0 + j + 16 <= k.G; j += 16) {
        const uint8_t* tile = k.group + size_t(k.j0 + j) * pk;
        for (int t0 = 0; t0 < 16; t0 += N)
          for (size_t c0 = 0; c0 < cols; c0 += N) {
            F blk[N];  // blk[r]: column c0 + r of keys t0.., then (transposed) key t0 + r's columns c0..
            PTLLM_UNROLL for (int r = 0; r < N; ++r)
              blk[r] = V::load(reinterpret_cast<const float*>(tile + (c0 + size_t(r)) * 64 + size_t(t0) * 4));
            V::transpose(blk);
            PTLLM_UNROLL for (int r = 0; r < N; ++r)
              V::store(reinterpret_cast<float*>(rows + size_t(j + t0 + r) * pk + c0 * 4), blk[r]);
          }
      }
    k_rows_from_group(KRows{k.group, k.G, k.j0 + j}, nk - j, pk, rows + size_t(j) * pk);
    return rows;
  }
  PTLLM_TARGET static void kivi_k_block(const float* q, int nq, KRows k, const uint16_t* scale, const uint16_t* zero,
                                        float qscale, int nk, int D, int bits, float* out, int ld_out,
                                        const void* next) {
    // next: the next group's codes, laid out as these: its bytes of the same keys' tiles.
    if (next) next = static_cast<const uint8_t*>(next) + size_t(k.j0) / 16 * 16 * packed_bytes(D, bits);
    const uint8_t* codes = k_plain(k, nk, packed_bytes(D, bits));
    switch (bits) {
      case 8: kivi_k_block_b<8>(q, nq, codes, scale, zero, qscale, nk, D, out, ld_out, next); break;
      case 4: kivi_k_block_b<4>(q, nq, codes, scale, zero, qscale, nk, D, out, ld_out, next); break;
      default: kivi_k_block_b<2>(q, nq, codes, scale, zero, qscale, nk, D, out, ld_out, next); break;
    }
  }

  // V, one pass of R <= HR heads over the U groups from channel g0 (split while accumulated):
  // acc[h][i] += sum_j p[h][j] s_j c_j[i].
  template <int BITS, int R, int U>
  PTLLM_TARGET static void kivi_v_groups(const float* p, int ld_p, const uint8_t* codes, size_t pk,
                                         const float* scale, int nk, int D, int g0, float* acc, const void* next) {
    constexpr int K = KPB<BITS>;
    F s[R][U][K];
    PTLLM_UNROLL for (int h = 0; h < R; ++h) PTLLM_UNROLL for (int u = 0; u < U; ++u) {
      PTLLM_UNROLL for (int k = 0; k < K; ++k)
        s[h][u][k] = V::load(acc + size_t(h) * size_t(D) + size_t(g0 + u * GCH<BITS> + k * N));
      split<BITS>(s[h][u]);
    }
    for (int j = 0; j < nk; ++j) {
      prefetch_lines(next, size_t(j) * pk, size_t(j + 1) * pk);
      const uint8_t* cj = codes + size_t(j) * pk;
      F w[R];
      PTLLM_UNROLL for (int h = 0; h < R; ++h) w[h] = V::set1(p[size_t(h) * size_t(ld_p) + size_t(j)] * scale[j]);
      PTLLM_UNROLL for (int u = 0; u < U; ++u) {
        F r[K];
        load_group<BITS>(cj, g0 + u * GCH<BITS>, r);
        PTLLM_UNROLL for (int k = 0; k < K; ++k) PTLLM_UNROLL for (int h = 0; h < R; ++h)
          s[h][u][k] = V::fma(w[h], r[k], s[h][u][k]);
      }
    }
    PTLLM_UNROLL for (int h = 0; h < R; ++h) PTLLM_UNROLL for (int u = 0; u < U; ++u) {
      unsplit<BITS>(s[h][u]);
      PTLLM_UNROLL for (int k = 0; k < K; ++k)
        V::store(acc + size_t(h) * size_t(D) + size_t(g0 + u * GCH<BITS> + k * N), s[h][u][k]);
    }
  }
  // The same over channels [i0, i0 + N), in order.
  template <int BITS, int R>
  PTLLM_TARGET static void kivi_v_chunk(const float* p, int ld_p, const uint8_t* codes, size_t pk,
                                        const float* scale, int nk, int D, int i0, float* acc) {
    F s[R];
    PTLLM_UNROLL for (int h = 0; h < R; ++h) s[h] = V::load(acc + size_t(h) * size_t(D) + size_t(i0));
    for (int j = 0; j < nk; ++j) {
      const F cv = load_codes_t<BITS>(codes + size_t(j) * pk, i0);
      PTLLM_UNROLL for (int h = 0; h < R; ++h)
        s[h] = V::fma(V::set1(p[size_t(h) * size_t(ld_p) + size_t(j)] * scale[j]), cv, s[h]);
    }
    PTLLM_UNROLL for (int h = 0; h < R; ++h) V::store(acc + size_t(h) * size_t(D) + size_t(i0), s[h]);
  }
  template <int BITS, int R>
  PTLLM_TARGET static void kivi_v_pass(const float* p, int ld_p, const uint8_t* codes, const float* scale,
                                       const float* zero, int nk, int D, float* acc, float* zacc, const void* next) {
    constexpr int G = GCH<BITS>, U = UG<BITS>;
    const size_t pk = packed_bytes(D, BITS);
    const int full_u = D / (U * G) * (U * G), full_g = D / G * G, full = D / N * N;
    int i = 0;
    // The first group pass asks for the next block's rows.
    for (; i < full_u; i += U * G)
      kivi_v_groups<BITS, R, U>(p, ld_p, codes, pk, scale, nk, D, i, acc, i == 0 ? next : nullptr);
    for (; i < full_g; i += G)
      kivi_v_groups<BITS, R, 1>(p, ld_p, codes, pk, scale, nk, D, i, acc, i == 0 ? next : nullptr);
    for (; i < full; i += N) kivi_v_chunk<BITS, R>(p, ld_p, codes, pk, scale, nk, D, i, acc);
    for (int h = 0; h < R; ++h) {
      const float* ph = p + size_t(h) * size_t(ld_p);
      for (int c = full; c < D; ++c) {
        float s = acc[size_t(h) * size_t(D) + size_t(c)];
        for (int j = 0; j < nk; ++j) s += ph[j] * scale[j] * float(code_at(codes + size_t(j) * pk, c, BITS));
        acc[size_t(h) * size_t(D) + size_t(c)] = s;
      }
      // The zero-point term: sum_j p[h][j] z_j.
      F z = V::zero();
      int j = 0;
      for (; j + N <= nk; j += N) z = V::fma(V::load(ph + j), V::load(zero + j), z);
      float zs = V::reduce_add(z);
      for (; j < nk; ++j) zs += ph[j] * zero[j];
      zacc[h] += zs;
    }
  }
  template <int BITS>
  PTLLM_TARGET static void kivi_v_block_b(const float* p, int ld_p, int nq, const uint8_t* codes, const uint16_t* scale,
                                          const uint16_t* zero, int nk, int D, float* acc, float* zacc,
                                          const void* next) {
    static thread_local Scratch buf;
    float* sf = buf.get(2 * size_t(nk));  // [nk] scales, [nk] zeros as float32
    float* zf = sf + nk;
    for (int j = 0; j < nk; j += N) {
      const int n = std::min(N, nk - j);
      const F sv = load_scale(scale + j, n), zv = n == N ? V::load_f16(zero + j) : V::load_f16_n(zero + j, n);
      if (n == N) {
        V::store(sf + j, sv);
        V::store(zf + j, zv);
      } else {
        V::store_n(sf + j, sv, n);
        V::store_n(zf + j, zv, n);
      }
    }
    for (int h0 = 0; h0 < nq; h0 += HR) {
      const float* ph = p + size_t(h0) * size_t(ld_p);
      float* ah = acc + size_t(h0) * size_t(D);
      const void* nx = h0 == 0 ? next : nullptr;
      switch (std::min(HR, nq - h0)) {
        case 4: kivi_v_pass<BITS, 4>(ph, ld_p, codes, sf, zf, nk, D, ah, zacc + h0, nx); break;
        case 3: kivi_v_pass<BITS, 3>(ph, ld_p, codes, sf, zf, nk, D, ah, zacc + h0, nx); break;
        case 2: kivi_v_pass<BITS, 2>(ph, ld_p, codes, sf, zf, nk, D, ah, zacc + h0, nx); break;
        default: kivi_v_pass<BITS, 1>(ph, ld_p, codes, sf, zf, nk, D, ah, zacc + h0, nx); break;
      }
    }
  }
  PTLLM_TARGET static void kivi_v_block(const float* p, int ld_p, int nq, const uint8_t* codes, const uint16_t* scale,
                                        const uint16_t* zero, int nk, int D, int bits, float* acc, float* zacc,
                                        const void* next) {
    switch (bits) {
      case 8: kivi_v_block_b<8>(p, ld_p, nq, codes, scale, zero, nk, D, acc, zacc, next); break;
      case 4: kivi_v_block_b<4>(p, ld_p, nq, codes, scale, zero, nk, D, acc, zacc, next); break;
      default: kivi_v_block_b<2>(p, ld_p, nq, codes, scale, zero, nk, D, acc, zacc, next); break;
    }
  }

  // ---- dense blocks: nk stored rows (F32, BF16, F16) for the nq query heads sharing a KV head --
  // Each chunk of a row is converted once and used by every head of a pass of up to HR heads.

  // K: out[h][j] = qscale * sum_i q[h][i] k_j[i]. Two keys at a time (2R independent FMA chains).
  template <class Ld, int R>
  PTLLM_TARGET static void dense_k_pass(const float* q, const void* k, float qscale, int nk, int D, float* out,
                                        int ld_out, const void* next) {
    const int full = D / N * N;
    for (int j = 0; j < nk; j += 2) {
      // An odd last key is paired with itself; only its first result is kept.
      const size_t r0 = size_t(j) * size_t(D), r1 = j + 1 < nk ? r0 + size_t(D) : r0;
      prefetch_lines(next, r0 * Ld::kBytes, size_t(std::min(j + 2, nk)) * size_t(D) * Ld::kBytes);
      F s0[R], s1[R];
      PTLLM_UNROLL for (int h = 0; h < R; ++h) s0[h] = s1[h] = V::zero();
      int i = 0;
      for (; i < full; i += N) {
        const F k0 = Ld::load(k, r0 + size_t(i)), k1 = Ld::load(k, r1 + size_t(i));
        PTLLM_UNROLL for (int h = 0; h < R; ++h) {
          const F qv = V::load(q + size_t(h) * size_t(D) + size_t(i));
          s0[h] = V::fma(qv, k0, s0[h]);
          s1[h] = V::fma(qv, k1, s1[h]);
        }
      }
      if (i < D) {
        const int n = D - i;
        const F k0 = Ld::load_n(k, r0 + size_t(i), n), k1 = Ld::load_n(k, r1 + size_t(i), n);
        PTLLM_UNROLL for (int h = 0; h < R; ++h) {
          const F qv = V::load_n(q + size_t(h) * size_t(D) + size_t(i), n);
          s0[h] = V::fma(qv, k0, s0[h]);
          s1[h] = V::fma(qv, k1, s1[h]);
        }
      }
      float sum0[4], sum1[4];
      V::reduce_add4(s0[0], R > 1 ? s0[1] : V::zero(), R > 2 ? s0[2] : V::zero(), R > 3 ? s0[3] : V::zero(), sum0);
      V::reduce_add4(s1[0], R > 1 ? s1[1] : V::zero(), R > 2 ? s1[2] : V::zero(), R > 3 ? s1[3] : V::zero(), sum1);
      PTLLM_UNROLL for (int h = 0; h < R; ++h) {
        out[size_t(h) * size_t(ld_out) + size_t(j)] = sum0[h] * qscale;
        if (j + 1 < nk) out[size_t(h) * size_t(ld_out) + size_t(j + 1)] = sum1[h] * qscale;
      }
    }
  }
  template <class Ld>
  PTLLM_TARGET static void dense_k_block_t(const float* q, int nq, const void* k, float qscale, int nk, int D,
                                           float* out, int ld_out, const void* next) {
    for (int h0 = 0; h0 < nq; h0 += HR) {
      const float* qh = q + size_t(h0) * size_t(D);
      float* oh = out + size_t(h0) * size_t(ld_out);
      const void* nx = h0 == 0 ? next : nullptr;  // the first pass reads every row
      switch (std::min(HR, nq - h0)) {
        case 4: dense_k_pass<Ld, 4>(qh, k, qscale, nk, D, oh, ld_out, nx); break;
        case 3: dense_k_pass<Ld, 3>(qh, k, qscale, nk, D, oh, ld_out, nx); break;
        case 2: dense_k_pass<Ld, 2>(qh, k, qscale, nk, D, oh, ld_out, nx); break;
        default: dense_k_pass<Ld, 1>(qh, k, qscale, nk, D, oh, ld_out, nx); break;
      }
    }
  }
  PTLLM_TARGET static void dense_k_block(const float* q, int nq, const void* k, DType t, float qscale, int nk, int D,
                                         float* out, int ld_out, const void* next) {
    switch (t) {
      case DType::BF16: dense_k_block_t<LdBF16>(q, nq, k, qscale, nk, D, out, ld_out, next); break;
      case DType::F16: dense_k_block_t<LdF16>(q, nq, k, qscale, nk, D, out, ld_out, next); break;
      default: dense_k_block_t<LdF32>(q, nq, k, qscale, nk, D, out, ld_out, next); break;
    }
  }

  // V: acc[h][i] += sum_j p[h][j] v_j[i], U chunks of N channels from i0 (the last one possibly
  // n < N wide) held in registers for R heads while the rows pass.
  template <class Ld, int R, int U>
  PTLLM_TARGET static void dense_v_chunks(const float* p, int ld_p, const void* v, int nk, int D, int i0, int n_last,
                                          float* acc, const void* next) {
    F s[R][U];
    PTLLM_UNROLL for (int h = 0; h < R; ++h) PTLLM_UNROLL for (int u = 0; u < U; ++u) {
      const float* a = acc + size_t(h) * size_t(D) + size_t(i0 + u * N);
      s[h][u] = u == U - 1 && n_last < N ? V::load_n(a, n_last) : V::load(a);
    }
    const size_t width = size_t((U - 1) * N + n_last);
    for (int j = 0; j < nk; ++j) {
      const size_t row = size_t(j) * size_t(D) + size_t(i0);
      prefetch_lines(next, row * Ld::kBytes, (row + width) * Ld::kBytes);
      F w[R];
      PTLLM_UNROLL for (int h = 0; h < R; ++h) w[h] = V::set1(p[size_t(h) * size_t(ld_p) + size_t(j)]);
      PTLLM_UNROLL for (int u = 0; u < U; ++u) {
        const F vv = u == U - 1 && n_last < N ? Ld::load_n(v, row + size_t(u * N), n_last)
                                              : Ld::load(v, row + size_t(u * N));
        PTLLM_UNROLL for (int h = 0; h < R; ++h) s[h][u] = V::fma(w[h], vv, s[h][u]);
      }
    }
    PTLLM_UNROLL for (int h = 0; h < R; ++h) PTLLM_UNROLL for (int u = 0; u < U; ++u) {
      float* a = acc + size_t(h) * size_t(D) + size_t(i0 + u * N);
      if (u == U - 1 && n_last < N)
        V::store_n(a, s[h][u], n_last);
      else
        V::store(a, s[h][u]);
    }
  }
  template <class Ld, int R>
  PTLLM_TARGET static void dense_v_pass(const float* p, int ld_p, const void* v, int nk, int D, float* acc,
                                        const void* next) {
    constexpr int U = CG;
    int i = 0;
    for (; i + U * N <= D; i += U * N) dense_v_chunks<Ld, R, U>(p, ld_p, v, nk, D, i, N, acc, next);
    for (; i + N <= D; i += N) dense_v_chunks<Ld, R, 1>(p, ld_p, v, nk, D, i, N, acc, next);
    if (i < D) dense_v_chunks<Ld, R, 1>(p, ld_p, v, nk, D, i, D - i, acc, next);
  }
  template <class Ld>
  PTLLM_TARGET static void dense_v_block_t(const float* p, int ld_p, int nq, const void* v, int nk, int D, float* acc,
                                           const void* next) {
    for (int h0 = 0; h0 < nq; h0 += HR) {
      const float* ph = p + size_t(h0) * size_t(ld_p);
      float* ah = acc + size_t(h0) * size_t(D);
      const void* nx = h0 == 0 ? next : nullptr;  // the first pass reads every row
      switch (std::min(HR, nq - h0)) {
        case 4: dense_v_pass<Ld, 4>(ph, ld_p, v, nk, D, ah, nx); break;
        case 3: dense_v_pass<Ld, 3>(ph, ld_p, v, nk, D, ah, nx); break;
        case 2: dense_v_pass<Ld, 2>(ph, ld_p, v, nk, D, ah, nx); break;
        default: dense_v_pass<Ld, 1>(ph, ld_p, v, nk, D, ah, nx); break;
      }
    }
  }
  PTLLM_TARGET static void dense_v_block(const float* p, int ld_p, int nq, const void* v, DType t, int nk, int D,
                                         float* acc, const void* next) {
    switch (t) {
      case DType::BF16: dense_v_block_t<LdBF16>(p, ld_p, nq, v, nk, D, acc, next); break;
      case DType::F16: dense_v_block_t<LdF16>(p, ld_p, nq, v, nk, D, acc, next); break;
      default: dense_v_block_t<LdF32>(p, ld_p, nq, v, nk, D, acc, next); break;
    }
  }

  // A KIVI K group back to float32 (the cache's rotate-at-read path): out[j][i] = c_j[i] s[i] + z[i].
  template <int BITS>
  PTLLM_TARGET static void kivi_k_dequant_b(const uint8_t* codes, const uint16_t* scale, const uint16_t* zero, int nk,
                                            int D, float* out) {
    const size_t pk = packed_bytes(D, BITS);
    const int full = D / N * N;
    for (int j = 0; j < nk; ++j) {
      const uint8_t* c = codes + size_t(j) * pk;
      float* o = out + size_t(j) * size_t(D);
      for (int i = 0; i < full; i += N)
        V::store(o + i, V::fma(load_codes_t<BITS>(c, i), load_scale(scale + i, N), V::load_f16(zero + i)));
      for (int i = full; i < D; ++i)
        o[i] = float(code_at(c, i, BITS)) * std::max(kMinScale, f16_to_f32(scale[i])) + f16_to_f32(zero[i]);
    }
  }
  PTLLM_TARGET static void kivi_k_dequant(KRows k, const uint16_t* scale, const uint16_t* zero, int nk, int D, int bits,
                                          float* out) {
    const uint8_t* codes = k_plain(k, nk, packed_bytes(D, bits));
    switch (bits) {
      case 8: kivi_k_dequant_b<8>(codes, scale, zero, nk, D, out); break;
      case 4: kivi_k_dequant_b<4>(codes, scale, zero, nk, D, out); break;
      default: kivi_k_dequant_b<2>(codes, scale, zero, nk, D, out); break;
    }
  }

  PTLLM_TARGET static float max_of(const float* x, int n) {
    F m = V::set1(-INFINITY);
    int i = 0;
    for (; i + N <= n; i += N) m = V::max(m, V::load(x + i));
    float mx = V::reduce_max(m);
    for (; i < n; ++i) mx = std::max(mx, x[i]);
    return mx;
  }

  // x[i] = e^(x[i] - m), returns the sum (the softmax numerators of one block of scores).
  PTLLM_TARGET static float exp_sum(float* x, int n, float m) {
    const F mv = V::set1(m);
    F s = V::zero();
    int i = 0;
    for (; i + N <= n; i += N) {
      const F e = exp(V::sub(V::load(x + i), mv));
      V::store(x + i, e);
      s = V::add(s, e);
    }
    float sum = V::reduce_add(s);
    if (i < n) {
      V::store_n(x + i, exp(V::sub(V::load_n(x + i, n - i), mv)), n - i);
      for (int j = i; j < n; ++j) sum += x[j];
    }
    return sum;
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
    return V::ldexp_ge(y, n, x, lo);
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
  // The stream is also asked for kGemvAhead bytes ahead of the line being read: the hardware
  // prefetchers stop at every 4 KiB page, so without it each page starts with misses the core
  // waits for. Where one core, not the memory, bounds the stream (one thread, or a machine with
  // more bandwidth than two cores draw) it brings a bf16 row stream to the rate of a plain read
  // (docs/performance.md, "How it is built").
  // Called once per step of Span bytes of a row stream (byte: the step's offset from w), it asks for
  // each line kGemvAhead bytes on once: every line of the step, or (steps shorter than a line) the
  // line the step starts. A target may ask nearer (V::kGemvAhead: AVX2, whose BF16 decode on a Zen 3
  // read 55-71% of the floor 4 KiB ahead, 70-79% 2 KiB ahead).
  static constexpr size_t gemv_ahead_bytes() {
    if constexpr (requires { V::kGemvAhead; })
      return V::kGemvAhead;
    else
      return 4096;
  }
  static constexpr size_t kGemvAhead = gemv_ahead_bytes();
  template <size_t Span>
  [[gnu::always_inline]] PTLLM_TARGET static void gemv_ahead(const void* w, size_t byte) {
    const char* p = static_cast<const char*>(w) + byte + kGemvAhead;
    if constexpr (Span >= 64)
      PTLLM_UNROLL for (size_t b = 0; b < Span; b += 64) __builtin_prefetch(p + b);
    else if (byte % 64 < Span)
      __builtin_prefetch(p);
  }

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
      gemv_ahead<U * N * Ld::kBytes>(w, (row + size_t(k)) * Ld::kBytes);
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
      gemv_ahead<size_t(U * C * 2)>(w, 2 * (row + size_t(k)));
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
  // x [T][K] with every full chunk of 2N reordered as its even elements, then its odd ones (the
  // tail past the last full chunk is not written: the products read it from x).
  PTLLM_TARGET static void deinterleave_bf16(const float* x, int T, int K, float* xd) {
    constexpr int C = 2 * N;
    for (int t = 0; t < T; ++t) {
      const float* src = x + size_t(t) * size_t(K);
      float* dst = xd + size_t(t) * size_t(K);
      for (int c = 0; c + C <= K; c += C) {
        F e, o;
        V::deinterleave(V::load(src + c), V::load(src + c + N), e, o);
        V::store(dst + c, e);
        V::store(dst + c + N, o);
      }
    }
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
  // BF16, several rows of x (batched decode, short chunks): a tile of 4 weight rows x TT rows of x.
  // Each chunk of x is loaded once for the 4 rows and each chunk of a row once for the TT rows of x,
  // so the loop is bound by its FMAs, not its loads (gemv_row_bf16 loads x once per weight row); the
// rows are read with plain unaligned loads (after the first pass of x rows, from L1);
  // the even and odd products go to one accumulator, and the 4 rows' sums are folded at once.
  // A row's sum is still taken in an order fixed by element index.
  // Up to 4 rows of x, one weight row at a time streams faster (bench_kernels product/gemv/*).
  // Only a tile's first pass over its weight rows (kAhead) asks for the rows kGemvAhead bytes on,
  // once per 64 bytes of a row and without a branch (on AVX2 the loop takes two chunks a step):
  // before, every pass carried a test, a branch and address arithmetic per row and chunk for it.
  static constexpr int kTileRows = 4, kTileMinT = 5;
  template <int TT, bool kAhead>
  PTLLM_TARGET static void gemv_tile_bf16(const float* xd, const float* x, int K, const void* w, int r, float* y,
                                          int ldy, const float* bias) {
    constexpr int RT = kTileRows;
    constexpr int C = 2 * N;
    F acc[RT][TT];
    PTLLM_UNROLL for (int i = 0; i < RT; ++i) PTLLM_UNROLL for (int t = 0; t < TT; ++t) acc[i][t] = V::zero();
    const size_t row = size_t(r) * size_t(K);
    const auto chunk = [&](int k, bool ahead) PTLLM_TARGET {
      F xe[TT], xo[TT];
      PTLLM_UNROLL for (int t = 0; t < TT; ++t) {
        xe[t] = V::load(xd + size_t(t) * size_t(K) + size_t(k));
        xo[t] = V::load(xd + size_t(t) * size_t(K) + size_t(k + N));
      }
      PTLLM_UNROLL for (int i = 0; i < RT; ++i) {
        const size_t byte = 2 * (row + size_t(i) * size_t(K) + size_t(k));
        if (kAhead && ahead) gemv_ahead<64>(w, byte);  // one line a call
        F e, o;
        V::bf16_pairs(static_cast<const char*>(w) + byte, e, o);
        PTLLM_UNROLL for (int t = 0; t < TT; ++t) acc[i][t] = V::fma(xo[t], o, V::fma(xe[t], e, acc[i][t]));
      }
    };
    const int full = K / C * C;
    // Chunks of 2N bf16 are 4N bytes: a 64-byte line is 64 / (4N) chunks (2 on AVX2, 1 on AVX-512).
    constexpr int kPerLine = std::max(1, 64 / (4 * N));
    int k = 0;
    for (; k + kPerLine * C <= full; k += kPerLine * C)
      PTLLM_UNROLL for (int u = 0; u < kPerLine; ++u) chunk(k + u * C, u == 0);
    for (; k < full; k += C) chunk(k, true);
    for (int k = full; k < K; k += N) {  // the tail, in element order
      const int n = std::min(N, K - k);
      PTLLM_UNROLL for (int i = 0; i < RT; ++i) {
        const F wv = LdBF16::load_n(w, row + size_t(i) * size_t(K) + size_t(k), n);
        PTLLM_UNROLL for (int t = 0; t < TT; ++t)
          acc[i][t] = V::fma(V::load_n(x + size_t(t) * size_t(K) + size_t(k), n), wv, acc[i][t]);
      }
    }
    PTLLM_UNROLL for (int t = 0; t < TT; ++t) {
      float* yt = y + size_t(t) * size_t(ldy) + size_t(r);
      V::reduce_add4(acc[0][t], acc[1][t], acc[2][t], acc[3][t], yt);
      if (bias) PTLLM_UNROLL for (int i = 0; i < RT; ++i) yt[i] += bias[r + i];
    }
  }
  // BF16 rows [r0, r1) against T >= 2 rows of x: tiles of 4 rows, then the rows left one at a time.
  PTLLM_TARGET static void gemv_tiles_bf16(const float* x, const float* xd, int T, const WeightMatrix& w,
                                           const float* bias, float* y, int r0, int r1) {
    const int K = w.cols;
    int r = r0;
    for (; r + kTileRows <= r1; r += kTileRows) {
      int t = 0;
      const auto tile = [&]<int TT>() {
        const size_t xo = size_t(t) * size_t(K);
        float* yt = y + size_t(t) * size_t(w.rows);
        if (t == 0)
          gemv_tile_bf16<TT, true>(xd + xo, x + xo, K, w.data, r, yt, w.rows, bias);
        else
          gemv_tile_bf16<TT, false>(xd + xo, x + xo, K, w.data, r, yt, w.rows, bias);
        t += TT;
      };
      if constexpr (V::GT >= 4)
        while (t + 4 <= T) tile.template operator()<4>();
      while (t + 2 <= T) tile.template operator()<2>();
      if (t < T) tile.template operator()<1>();
    }
    for (; r < r1; ++r) {
      int t = 0;
      for (; t + 2 <= T; t += 2) gemv_group<LdBF16, 2>(x, xd, t, w, r, bias, y);
      for (; t < T; ++t) gemv_group<LdBF16, 1>(x, xd, t, w, r, bias, y);
    }
  }
  // Every row of x against weight rows [r0, r1); groups of rows of x share each weight row, read
  // from memory once and then from L1.
  template <class Ld>
  PTLLM_TARGET static void gemv_t(const float* x, const float* xd, int T, const WeightMatrix& w, const float* bias,
                                  float* y, int r0, int r1) {
    if constexpr (std::is_same_v<Ld, LdBF16>)
      if (!xd) {
        static thread_local Scratch buf;
        float* d = buf.get(size_t(T) * size_t(w.cols));
        deinterleave_bf16(x, T, w.cols, d);
        xd = d;
      }
    if constexpr (std::is_same_v<Ld, LdBF16>)
      if (T >= kTileMinT) return gemv_tiles_bf16(x, xd, T, w, bias, y, r0, r1);
    for (int r = r0; r < r1; ++r) {
      int t = 0;
      if constexpr (V::GT >= 4)
        for (; t + 4 <= T; t += 4) gemv_group<Ld, 4>(x, xd, t, w, r, bias, y);
      for (; t + 2 <= T; t += 2) gemv_group<Ld, 2>(x, xd, t, w, r, bias, y);
      for (; t < T; ++t) gemv_group<Ld, 1>(x, xd, t, w, r, bias, y);
    }
  }
  PTLLM_TARGET static void gemv(const float* x, const float* xd, int T, const WeightMatrix& w, const float* bias,
                                float* y, int r0, int r1) {
    switch (w.dtype) {
      case DType::BF16: gemv_t<LdBF16>(x, xd, T, w, bias, y, r0, r1); break;
      case DType::F16: gemv_t<LdF16>(x, nullptr, T, w, bias, y, r0, r1); break;
      default: gemv_t<LdF32>(x, nullptr, T, w, bias, y, r0, r1); break;
    }
  }

  // ---- gemm: packed tiles (Goto/BLIS): x in MR-row panels, W in NR-row panels converted to float32
  // and transposed so a k step of the micro-kernel is NRV vector loads and MR broadcasts ----------

  // The N x kn block of src's rows from element off (row i at off + i * stride; rows from n on read as
  // zeros), transposed in registers: its column kk goes to dst + kk * ld, the first w lanes of it.
  template <class Ld>
  PTLLM_TARGET static void pack_block(const void* src, size_t off, size_t stride, int n, int kn, int w, float* dst,
                                      size_t ld) {
    F blk[N];
    PTLLM_UNROLL for (int i = 0; i < N; ++i) {
      const size_t o = off + size_t(i) * stride;
      blk[i] = i >= n ? V::zero() : kn == N ? Ld::load(src, o) : Ld::load_n(src, o, kn);
    }
    V::transpose(blk);
    for (int kk = 0; kk < kn; ++kk) {
      float* d = dst + size_t(kk) * ld;
      if (w == N)
        V::store(d, blk[kk]);
      else
        V::store_n(d, blk[kk], w);
    }
  }
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
        // Rows past m are zeros.
        for (int k = 0; k < kc; k += N)
          for (int i0 = 0; i0 < MR; i0 += N) {
            const int w = std::min(N, MR - i0);
            pack_block<LdF32>(x, size_t(p * MR + i0) * size_t(K) + size_t(k0 + k), size_t(K),
                              std::clamp(m - i0, 0, w), std::min(N, kc - k), w, dst + size_t(k) * MR + size_t(i0), MR);
          }
      }
    }
  }
  // bp [kc][NR] <- weight rows [r, r + nr), columns [k0, k0 + kc), N x N blocks transposed in registers.
  template <class Ld>
  PTLLM_TARGET static void pack_b(const void* w, int K, int r, int nr, int k0, int kc, float* bp) {
    for (int j0 = 0; j0 < NR; j0 += N)
      for (int k = 0; k < kc; k += N)
        pack_block<Ld>(w, size_t(r + j0) * size_t(K) + size_t(k0 + k), size_t(K), std::clamp(nr - j0, 0, N),
                       std::min(N, kc - k), N, bp + size_t(k) * NR + size_t(j0), NR);
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
                     K::from_f16,     K::kivi_k_block,
                     K::kivi_v_block, k_spans_by_block<K::kivi_k_block>, v_spans_by_block<K::kivi_v_block>,
                     K::dense_k_block, K::dense_v_block, K::kivi_k_dequant,
                     K::max_of,      K::exp_sum,     K::rmsnorm,
                     K::silu_mul,
                     K::softmax,      K::rope_rotate, K::rope_rotate_one, K::deinterleave_bf16, K::gemv, K::pack_a,
                     K::gemm,         K::MR,          K::NR};
}

#undef PTLLM_UNROLL

}  // namespace
}  // namespace ptllm
