#include "kernels/panels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"
#include "core/platform.h"
#include "core/thread_pool.h"
#include "kernels/cpu/features.h"
#include "kernels/scratch.h"
#include "kernels/simd.h"
#include "kernels/stream.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/x86/transpose_avx512.h"
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC PR 105593, as kernels_avx512.cpp
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#if defined(__clang__)
#define PTLLM_PANELS_UNROLL _Pragma("unroll")
#else
#define PTLLM_PANELS_UNROLL _Pragma("GCC unroll 16")
#endif

namespace ptllm {

namespace {

// Fewest weights a thread's part holds (as the row-major gemv): below it, handing work to another
// thread costs more than it saves.
constexpr size_t kMinWeightsPerPart = 32 * 1024;
// A part's panels are taken this many at a time (their weights stay in L2) against rows of x this
// many at a time (prefill: x is read from L2 once per pair of panels, not from memory).
constexpr int kChunkPanels = 16, kChunkRows = 64;
// Column pairs (64-byte lines of a panel) decode asks for its weights ahead of their use: 4 KiB, as
// the row-major gemv. It also touches the page past those every kTouchPairs pairs (kernels/stream.h):
// over a 1B model's matrices, 1.2-1.5x the tokens a second of what decode asked before (Zen 5).
constexpr int kPrefetchPairs = 64;
constexpr int kTouchPairs = touch_every(2 * kPanelRows * sizeof(uint16_t));

const uint16_t* panel_at(const WeightMatrix& w, int p) {
  return static_cast<const uint16_t*>(w.data) + size_t(p) * size_t(w.cols) * kPanelRows;
}

// Any target: one output at a time, in the AVX-512 kernel's order (the even columns' fused sum plus
// the odd columns'), so both give the same bits.
void part_portable(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, int p0, int p1) {
  const int K = w.cols;
  for (int p = p0; p < p1; ++p) {
    const uint16_t* wp = panel_at(w, p);
    for (int t = 0; t < T; ++t) {
      const float* xt = x + size_t(t) * size_t(K);
      for (int i = 0; i < kPanelRows; ++i) {
        float e = 0.f, o = 0.f;
        for (int j = 0; j < K / 2; ++j) {
          const uint16_t* pair = wp + (size_t(j) * kPanelRows + size_t(i)) * 2;
          e = std::fma(bf16_to_f32(pair[0]), xt[2 * j], e);
          o = std::fma(bf16_to_f32(pair[1]), xt[2 * j + 1], o);
        }
        const int r = p * kPanelRows + i;
        float s = e + o;
        if (bias) s += bias[r];
        y[size_t(t) * size_t(w.rows) + size_t(r)] = s;
      }
    }
  }
}

// x rounded to bf16 (panels_bf16_x): x as pairs of bf16, xb[t][j] = bf16(x[t][2j]) | bf16(x[t][2j+1]) << 16,
// one sum a row, the odd column's product added before the even one's (AVX512_BF16 vdpbf16ps: the
// products of two bf16 are exact in float32, each addition rounds to nearest even). Bit for bit
// with the vdpbf16ps kernel away from subnormals (which vdpbf16ps reads and writes as zero).
void part_portable_bx(const uint32_t* xb, int T, const WeightMatrix& w, const float* bias, float* y, int p0, int p1) {
  const int J = w.cols / 2;
  for (int p = p0; p < p1; ++p) {
    const uint16_t* wp = panel_at(w, p);
    for (int t = 0; t < T; ++t) {
      const uint32_t* xt = xb + size_t(t) * size_t(J);
      for (int i = 0; i < kPanelRows; ++i) {
        float s = 0.f;
        for (int j = 0; j < J; ++j) {
          const uint16_t* pair = wp + (size_t(j) * kPanelRows + size_t(i)) * 2;
          s = std::fma(bf16_to_f32(pair[1]), bf16_to_f32(uint16_t(xt[j] >> 16)), s);
          s = std::fma(bf16_to_f32(pair[0]), bf16_to_f32(uint16_t(xt[j] & 0xffffu)), s);
        }
        const int r = p * kPanelRows + i;
        if (bias) s += bias[r];
        y[size_t(t) * size_t(w.rows) + size_t(r)] = s;
      }
    }
  }
}

// x as bf16 pairs (above), rounded to nearest even as vcvtne2ps2bf16 does: subnormal inputs as zero.
void round_pairs_portable(const float* x, int T, int K, uint32_t* xb) {
  const auto one = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    std::memcpy(&f, &u, 4);
    return uint32_t(f32_to_bf16(f));
  };
  for (size_t i = 0; i < size_t(T) * size_t(K) / 2; ++i) xb[i] = one(x[2 * i]) | one(x[2 * i + 1]) << 16;
}

#if defined(__x86_64__)
// Every pair of panels reads a chunk's rows of x again. Where those rows hold more bytes than this
// (half of a 1 MiB L2), they are taken in slices of columns, every panel of the chunk over one slice
// before the next: the slice stays in L2 while the panels pass, where whole rows (kChunkRows x 8192
// columns of float32: 2 MiB) came back from L3 for each pair.
constexpr size_t kSliceXBytes = 512 * 1024;

// Where a tile's columns end and its sums go between slices. Whole rows: k0 = 0, k1 = the row and
// no state. A slice that is not the last leaves the accumulators in st (panel p's row t at
// st + p * ld + t * the tile's floats a row and panel) and the next slice takes them back, so each
// output is the same operations in the same order as in one pass: the same bits.
struct Slice {
  int k0, k1;
  float* st = nullptr;
  size_t ld = 0;
};

// This thread's buffer for the accumulators of a chunk's outputs between slices.
float* slice_state(size_t floats) {
  thread_local Scratch state;
  return state.get(floats);
}

// Panels [p0, p1) of a K-column matrix against T rows of x (`bytes_per_col` bytes a value), chunk
// by chunk: rows(np, t0, t1, p, sl) for np = 1 or 2 panels from p, one at a time in decode (one
// weight stream: faster than 2 or 4 at once). Where a chunk's rows of x exceed kSliceXBytes, each
// slice of columns goes over every panel of the chunk before the next, the accumulators
// (`floats_per_output` an output) waiting in slice_state.
template <class Rows>
void walk_chunks(int T, int K, size_t bytes_per_col, size_t floats_per_output, int p0, int p1, Rows&& rows) {
  int cols = K;
  float* st = nullptr;
  if (T > 2) {
    const size_t n = size_t(std::min(T, kChunkRows));
    const int fit = int(std::max<size_t>(64, kSliceXBytes / (n * bytes_per_col) / 64 * 64));
    if (K > fit) {
      cols = fit;
      st = slice_state(size_t(kChunkPanels) * size_t(kChunkRows) * floats_per_output);
    }
  }
  const std::integral_constant<int, 1> one;
  const std::integral_constant<int, 2> two;
  for (int c0 = p0; c0 < p1; c0 += kChunkPanels) {
    const int c1 = std::min(p1, c0 + kChunkPanels);
    for (int t0 = 0; t0 < T; t0 += kChunkRows) {
      const int t1 = std::min(T, t0 + kChunkRows);
      const size_t ld = size_t(t1 - t0) * floats_per_output;  // state floats a panel
      for (int k0 = 0; k0 < K; k0 += cols) {
        const auto sl = [&](int p) { return Slice{k0, std::min(K, k0 + cols), st ? st + size_t(p - c0) * ld : nullptr, ld}; };
        int p = c0;
        if (t1 - t0 <= 2)
          for (; p < c1; ++p) rows(one, t0, t1, p, sl(p));
        for (; p + 2 <= c1; p += 2) rows(two, t0, t1, p, sl(p));
        for (; p < c1; ++p) rows(one, t0, t1, p, sl(p));
      }
    }
  }
}

#define PTLLM_PANELS_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

// What a tile asks for ahead of use: its own stream's lines (decode: kPrefetchPairs ahead, and a
// touch past them), or the same lines of the next panels, from pf (several tiles over these panels).
enum Prefetch { kAhead, kNextPanels };

// A tile's request for its panel's line of column pair `pair` (at `line`; the next panels' line at
// pf + at, pf null in kAhead mode): by the mode above.
template <Prefetch kPf>
inline void ask_for(const uint16_t* line, const uint16_t* pf, size_t at, int pair) {
  if constexpr (kPf == kNextPanels) {
    _mm_prefetch(reinterpret_cast<const char*>(pf + at), _MM_HINT_T1);
  } else {
    _mm_prefetch(reinterpret_cast<const char*>(line + kPrefetchPairs * 2 * kPanelRows), _MM_HINT_T0);
    if (pair % kTouchPairs == 0) touch_ahead(line + kPrefetchPairs * 2 * kPanelRows);
  }
}

// Calls rows.operator()<kPf, kSliced>() for a tile's modes: the next panels' lines where pf is set,
// else its own ahead; sliced where the accumulators wait in sl.st between slices.
template <class Rows>
void with_modes(const uint16_t* pf, const Slice& sl, const Rows& rows) {
  if (pf)
    sl.st ? rows.template operator()<kNextPanels, true>() : rows.template operator()<kNextPanels, false>();
  else
    sl.st ? rows.template operator()<kAhead, true>() : rows.template operator()<kAhead, false>();
}

// MT rows of x (row t at x + t * K) against NP consecutive panels from wp; outputs to y + t * ldy
// (the panels' first row's column), bias from the same first row.
template <int NP, int MT, Prefetch kPf, bool kSliced>
PTLLM_PANELS_TARGET void tile(const float* x, int K, const uint16_t* wp, const float* bias, float* y, size_t ldy,
                              const uint16_t* pf, Slice sl) {
  if constexpr (!kSliced) sl = Slice{0, K};  // whole rows: the loop's bounds known to the compiler
  __m512 ae[NP][MT], ao[NP][MT];
  PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t) {
    const bool resume = kSliced && sl.k0 > 0;
    ae[p][t] = resume ? _mm512_load_ps(sl.st + size_t(p) * sl.ld + size_t(t) * 32) : _mm512_setzero_ps();
    ao[p][t] = resume ? _mm512_load_ps(sl.st + size_t(p) * sl.ld + size_t(t) * 32 + 16) : _mm512_setzero_ps();
  }
  const size_t stride = size_t(K) * kPanelRows;  // uint16 values a panel
  const __m512i high = _mm512_set1_epi32(int(0xffff0000u));
  for (int k = sl.k0; k < sl.k1; k += 2) {
    __m512 we[NP], wo[NP];
    PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) {
      const uint16_t* line = wp + size_t(p) * stride + size_t(k) * kPanelRows;
      ask_for<kPf>(line, pf, size_t(p) * stride + size_t(k) * kPanelRows, k / 2);
      const __m512i v = _mm512_loadu_si512(line);
      we[p] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      wo[p] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
    }
    PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t) {
      const __m512 xe = _mm512_set1_ps(x[size_t(t) * size_t(K) + size_t(k)]);
      const __m512 xo = _mm512_set1_ps(x[size_t(t) * size_t(K) + size_t(k) + 1]);
      PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) {
        ae[p][t] = _mm512_fmadd_ps(we[p], xe, ae[p][t]);
        ao[p][t] = _mm512_fmadd_ps(wo[p], xo, ao[p][t]);
      }
    }
  }
  if (kSliced && sl.k1 < K) {
    PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t) {
      _mm512_store_ps(sl.st + size_t(p) * sl.ld + size_t(t) * 32, ae[p][t]);
      _mm512_store_ps(sl.st + size_t(p) * sl.ld + size_t(t) * 32 + 16, ao[p][t]);
    }
    return;
  }
  PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) {
    const __m512 b = bias ? _mm512_loadu_ps(bias + p * kPanelRows) : _mm512_setzero_ps();
    PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t) {
      __m512 s = _mm512_add_ps(ae[p][t], ao[p][t]);
      if (bias) s = _mm512_add_ps(s, b);
      _mm512_storeu_ps(y + size_t(t) * ldy + size_t(p) * kPanelRows, s);
    }
  }
}

// Rows [t0, t1) of x against panels [p, p + NP): tiles of 4 rows (16 accumulators with 2 panels),
// then the rows left. With several tiles (batched decode, prefill) every tile asks for the next
// panels' weights: the last ones over these panels leave them in L2 for the next call. Otherwise its
// own lines ahead.
template <int NP>
PTLLM_PANELS_TARGET void panels_rows(const float* x, int t0, int t1, const WeightMatrix& w, const float* bias,
                                     float* y, int p, Slice sl) {
  const int K = w.cols;
  const size_t ldy = size_t(w.rows);
  const uint16_t* wp = panel_at(w, p);
  const float* b = bias ? bias + p * kPanelRows : nullptr;
  const uint16_t* pf = t1 - t0 > 2 && p + 2 * NP <= w.rows / kPanelRows ? wp + size_t(NP) * size_t(K) * kPanelRows
                                                                         : nullptr;
  const auto at = [&](int t) { return x + size_t(t) * size_t(K); };
  const auto out = [&](int t) { return y + size_t(t) * ldy + size_t(p) * kPanelRows; };
  const auto rows = [&]<Prefetch kPf, bool kSliced>() {
    const auto state = [&](int t) { return Slice{sl.k0, sl.k1, sl.st ? sl.st + size_t(t - t0) * 32 : nullptr, sl.ld}; };
    int t = t0;
    for (; t + 4 <= t1; t += 4) tile<NP, 4, kPf, kSliced>(at(t), K, wp, b, out(t), ldy, pf, state(t));
    for (; t + 2 <= t1; t += 2) tile<NP, 2, kPf, kSliced>(at(t), K, wp, b, out(t), ldy, pf, state(t));
    for (; t < t1; ++t) tile<NP, 1, kPf, kSliced>(at(t), K, wp, b, out(t), ldy, pf, state(t));
  };
  with_modes(pf, sl, rows);
}

PTLLM_PANELS_TARGET void part_avx512(const float* x, int T, const WeightMatrix& w, const float* bias, float* y,
                                     int p0, int p1) {
  walk_chunks(T, w.cols, sizeof(float), 32, p0, p1, [&](auto np, int t0, int t1, int p, Slice sl) {
    panels_rows<decltype(np)::value>(x, t0, t1, w, bias, y, p, sl);
  });
}

#define PTLLM_PANELS_BF16_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))
// (The kDp = false instances run on AVX-512 CPUs without AVX512_BF16: they contain no instruction of it.)

// tile's twin for x rounded to bf16: one vdpbf16ps per panel, row of x and column pair (twice the
// multiply-adds of an FMA in one instruction, and no widening of the weights). Without AVX512_BF16
// (kDp false) the same sums from fused multiply-adds, odd column first: the same bits.
template <bool kDp, int NP, int MT, Prefetch kPf, bool kSliced>
PTLLM_PANELS_BF16_TARGET void tile_bx(const uint32_t* xb, int J, const uint16_t* wp, const float* bias, float* y,
                                      size_t ldy, const uint16_t* pf, Slice sl) {
  if constexpr (!kSliced) sl = Slice{0, 2 * J};
  __m512 acc[NP][MT];
  PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t)
      acc[p][t] = kSliced && sl.k0 > 0 ? _mm512_load_ps(sl.st + size_t(p) * sl.ld + size_t(t) * 16) : _mm512_setzero_ps();
  const size_t stride = size_t(J) * 2 * kPanelRows;  // uint16 values a panel
  const __m512i high = _mm512_set1_epi32(int(0xffff0000u));
  for (int j = sl.k0 / 2; j < sl.k1 / 2; ++j) {
    __m512i wv[NP];
    PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) {
      const uint16_t* line = wp + size_t(p) * stride + size_t(j) * 2 * kPanelRows;
      ask_for<kPf>(line, pf, size_t(p) * stride + size_t(j) * 2 * kPanelRows, j);
      wv[p] = _mm512_loadu_si512(line);
    }
    PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t) {
      const __m512i xv = _mm512_set1_epi32(int(xb[size_t(t) * size_t(J) + size_t(j)]));
      if constexpr (kDp) {
        PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p)
          acc[p][t] = _mm512_dpbf16_ps(acc[p][t], (__m512bh)wv[p], (__m512bh)xv);
      } else {
        const __m512 xe = _mm512_castsi512_ps(_mm512_slli_epi32(xv, 16));
        const __m512 xo = _mm512_castsi512_ps(_mm512_and_si512(xv, high));
        PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) {
          acc[p][t] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(wv[p], high)), xo, acc[p][t]);
          acc[p][t] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(wv[p], 16)), xe, acc[p][t]);
        }
      }
    }
  }
  if (kSliced && sl.k1 < 2 * J) {
    PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t)
        _mm512_store_ps(sl.st + size_t(p) * sl.ld + size_t(t) * 16, acc[p][t]);
    return;
  }
  PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) {
    const __m512 b = bias ? _mm512_loadu_ps(bias + p * kPanelRows) : _mm512_setzero_ps();
    PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t)
      _mm512_storeu_ps(y + size_t(t) * ldy + size_t(p) * kPanelRows, bias ? _mm512_add_ps(acc[p][t], b) : acc[p][t]);
  }
}

// panels_rows for bf16 x: one accumulator an output, so tiles of 8 rows of x against 2 panels.
template <bool kDp, int NP>
PTLLM_PANELS_BF16_TARGET void panels_rows_bx(const uint32_t* xb, int t0, int t1, const WeightMatrix& w,
                                             const float* bias, float* y, int p, Slice sl) {
  const int J = w.cols / 2;
  const size_t ldy = size_t(w.rows);
  const uint16_t* wp = panel_at(w, p);
  const float* b = bias ? bias + p * kPanelRows : nullptr;
  const uint16_t* pf = t1 - t0 > 2 && p + 2 * NP <= w.rows / kPanelRows ? wp + size_t(NP) * size_t(w.cols) * kPanelRows
                                                                         : nullptr;
  const auto at = [&](int t) { return xb + size_t(t) * size_t(J); };
  const auto out = [&](int t) { return y + size_t(t) * ldy + size_t(p) * kPanelRows; };
  const auto rows = [&]<Prefetch kPf, bool kSliced>() {
    const auto state = [&](int t) { return Slice{sl.k0, sl.k1, sl.st ? sl.st + size_t(t - t0) * 16 : nullptr, sl.ld}; };
    int t = t0;
    for (; t + 8 <= t1; t += 8) tile_bx<kDp, NP, 8, kPf, kSliced>(at(t), J, wp, b, out(t), ldy, pf, state(t));
    for (; t + 4 <= t1; t += 4) tile_bx<kDp, NP, 4, kPf, kSliced>(at(t), J, wp, b, out(t), ldy, pf, state(t));
    for (; t + 2 <= t1; t += 2) tile_bx<kDp, NP, 2, kPf, kSliced>(at(t), J, wp, b, out(t), ldy, pf, state(t));
    for (; t < t1; ++t) tile_bx<kDp, NP, 1, kPf, kSliced>(at(t), J, wp, b, out(t), ldy, pf, state(t));
  };
  with_modes(pf, sl, rows);
}

template <bool kDp>
PTLLM_PANELS_BF16_TARGET void part_avx512_bx(const uint32_t* xb, int T, const WeightMatrix& w, const float* bias,
                                             float* y, int p0, int p1) {
  walk_chunks(T, w.cols, sizeof(uint16_t), 16, p0, p1, [&](auto np, int t0, int t1, int p, Slice sl) {
    panels_rows_bx<kDp, decltype(np)::value>(xb, t0, t1, w, bias, y, p, sl);
  });
}

// round_pairs_portable with vcvtne2ps2bf16, 32 values at a time.
PTLLM_PANELS_BF16_TARGET void round_pairs_avx512(const float* x, int T, int K, uint32_t* xb) {
  const size_t n = size_t(T) * size_t(K);
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    _mm512_storeu_si512(xb + i / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i)));
  if (i < n) round_pairs_portable(x + i, 1, int(n - i), xb + i / 2);
}

#define PTLLM_PANELS_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

// tile and tile_bx for AVX2: a panel's 64-byte line read as two registers of 8 rows (h = 0, 1), each
// lane the AVX-512 kernels' operations in their order, so every target gives the same bits. One
// panel at a time (16 registers: 2 rows of x hold 8 accumulators with float32 x, 4 rows with bf16 x).
template <int MT, Prefetch kPf, bool kSliced>
PTLLM_PANELS_AVX2_TARGET void tile_avx2(const float* x, int K, const uint16_t* wp, const float* bias, float* y,
                                        size_t ldy, const uint16_t* pf, Slice sl) {
  if constexpr (!kSliced) sl = Slice{0, K};
  __m256 ae[2][MT], ao[2][MT];  // state of row t: ae at t * 32 + 8 h, ao at t * 32 + 16 + 8 h
  PTLLM_PANELS_UNROLL for (int h = 0; h < 2; ++h) PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t) {
    const bool resume = kSliced && sl.k0 > 0;
    ae[h][t] = resume ? _mm256_load_ps(sl.st + size_t(t) * 32 + 8 * h) : _mm256_setzero_ps();
    ao[h][t] = resume ? _mm256_load_ps(sl.st + size_t(t) * 32 + 16 + 8 * h) : _mm256_setzero_ps();
  }
  const __m256i high = _mm256_set1_epi32(int(0xffff0000u));
  for (int k = sl.k0; k < sl.k1; k += 2) {
    const uint16_t* line = wp + size_t(k) * kPanelRows;
    ask_for<kPf>(line, pf, size_t(k) * kPanelRows, k / 2);
    __m256 we[2], wo[2];
    PTLLM_PANELS_UNROLL for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 16 * h));
      we[h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      wo[h] = _mm256_castsi256_ps(_mm256_and_si256(v, high));
    }
    PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t) {
      const __m256 xe = _mm256_set1_ps(x[size_t(t) * size_t(K) + size_t(k)]);
      const __m256 xo = _mm256_set1_ps(x[size_t(t) * size_t(K) + size_t(k) + 1]);
      PTLLM_PANELS_UNROLL for (int h = 0; h < 2; ++h) {
        ae[h][t] = _mm256_fmadd_ps(we[h], xe, ae[h][t]);
        ao[h][t] = _mm256_fmadd_ps(wo[h], xo, ao[h][t]);
      }
    }
  }
  if (kSliced && sl.k1 < K) {
    PTLLM_PANELS_UNROLL for (int h = 0; h < 2; ++h) PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t) {
      _mm256_store_ps(sl.st + size_t(t) * 32 + 8 * h, ae[h][t]);
      _mm256_store_ps(sl.st + size_t(t) * 32 + 16 + 8 * h, ao[h][t]);
    }
    return;
  }
  PTLLM_PANELS_UNROLL for (int h = 0; h < 2; ++h) {
    const __m256 b = bias ? _mm256_loadu_ps(bias + 8 * h) : _mm256_setzero_ps();
    PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t) {
      __m256 s = _mm256_add_ps(ae[h][t], ao[h][t]);
      if (bias) s = _mm256_add_ps(s, b);
      _mm256_storeu_ps(y + size_t(t) * ldy + 8 * h, s);
    }
  }
}

template <int NP, int MT, Prefetch kPf, bool kSliced>
PTLLM_PANELS_AVX2_TARGET void tile_bx_avx2(const uint32_t* xb, int J, const uint16_t* wp, const float* bias, float* y,
                                           size_t ldy, const uint16_t* pf, Slice sl) {
  if constexpr (!kSliced) sl = Slice{0, 2 * J};
  __m256 acc[NP][2][MT];  // state of panel p's row t at p * ld + t * 16 + 8 h
  PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) PTLLM_PANELS_UNROLL for (int h = 0; h < 2; ++h)
      PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t) acc[p][h][t] = kSliced && sl.k0 > 0
          ? _mm256_load_ps(sl.st + size_t(p) * sl.ld + size_t(t) * 16 + 8 * h) : _mm256_setzero_ps();
  const size_t stride = size_t(J) * 2 * kPanelRows;  // uint16 values a panel
  const __m256i high = _mm256_set1_epi32(int(0xffff0000u));
  for (int j = sl.k0 / 2; j < sl.k1 / 2; ++j) {
    __m256 we[NP][2], wo[NP][2];
    PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) {
      const uint16_t* line = wp + size_t(p) * stride + size_t(j) * 2 * kPanelRows;
      ask_for<kPf>(line, pf, size_t(p) * stride + size_t(j) * 2 * kPanelRows, j);
      PTLLM_PANELS_UNROLL for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 16 * h));
        we[p][h] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        wo[p][h] = _mm256_castsi256_ps(_mm256_and_si256(v, high));
      }
    }
    PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t) {
      const __m256i xv = _mm256_set1_epi32(int(xb[size_t(t) * size_t(J) + size_t(j)]));
      const __m256 xe = _mm256_castsi256_ps(_mm256_slli_epi32(xv, 16));
      const __m256 xo = _mm256_castsi256_ps(_mm256_and_si256(xv, high));
      PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) PTLLM_PANELS_UNROLL for (int h = 0; h < 2; ++h) {
        acc[p][h][t] = _mm256_fmadd_ps(wo[p][h], xo, acc[p][h][t]);
        acc[p][h][t] = _mm256_fmadd_ps(we[p][h], xe, acc[p][h][t]);
      }
    }
  }
  if (kSliced && sl.k1 < 2 * J) {
    PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) PTLLM_PANELS_UNROLL for (int h = 0; h < 2; ++h)
        PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t)
            _mm256_store_ps(sl.st + size_t(p) * sl.ld + size_t(t) * 16 + 8 * h, acc[p][h][t]);
    return;
  }
  PTLLM_PANELS_UNROLL for (int p = 0; p < NP; ++p) PTLLM_PANELS_UNROLL for (int h = 0; h < 2; ++h) {
    const __m256 b = bias ? _mm256_loadu_ps(bias + p * kPanelRows + 8 * h) : _mm256_setzero_ps();
    PTLLM_PANELS_UNROLL for (int t = 0; t < MT; ++t)
      _mm256_storeu_ps(y + size_t(t) * ldy + size_t(p) * kPanelRows + 8 * h,
                       bias ? _mm256_add_ps(acc[p][h][t], b) : acc[p][h][t]);
  }
}

// Rows [t0, t1) of x against panel p (the AVX2 tiles; walk_chunks hands one or two panels, each
// taken alone), float32 x or (kBx) bf16 pairs.
template <bool kBx>
PTLLM_PANELS_AVX2_TARGET void panel_rows_avx2(const void* xv, int t0, int t1, const WeightMatrix& w, const float* bias,
                                              float* y, int p, Slice sl) {
  const int K = w.cols;
  const size_t ldy = size_t(w.rows), xl = kBx ? size_t(K) / 2 : size_t(K);  // x's elements a row
  const uint16_t* wp = panel_at(w, p);
  const float* b = bias ? bias + p * kPanelRows : nullptr;
  const uint16_t* pf = t1 - t0 > 2 && p + 2 <= w.rows / kPanelRows ? wp + size_t(K) * kPanelRows : nullptr;
  const auto out = [&](int t) { return y + size_t(t) * ldy + size_t(p) * kPanelRows; };
  const auto rows = [&]<Prefetch kPf, bool kSliced>() {
    constexpr size_t kState = kBx ? 16 : 32;  // floats a row of x in the slice state
    const auto state = [&](int t) {
      return Slice{sl.k0, sl.k1, sl.st ? sl.st + size_t(t - t0) * kState : nullptr, sl.ld};
    };
    int t = t0;
    if constexpr (kBx) {
      const auto at = [&](int t) { return static_cast<const uint32_t*>(xv) + size_t(t) * xl; };
      for (; t + 4 <= t1; t += 4) tile_bx_avx2<1, 4, kPf, kSliced>(at(t), K / 2, wp, b, out(t), ldy, pf, state(t));
      for (; t + 2 <= t1; t += 2) tile_bx_avx2<1, 2, kPf, kSliced>(at(t), K / 2, wp, b, out(t), ldy, pf, state(t));
      for (; t < t1; ++t) tile_bx_avx2<1, 1, kPf, kSliced>(at(t), K / 2, wp, b, out(t), ldy, pf, state(t));
    } else {
      const auto at = [&](int t) { return static_cast<const float*>(xv) + size_t(t) * xl; };
      for (; t + 2 <= t1; t += 2) tile_avx2<2, kPf, kSliced>(at(t), K, wp, b, out(t), ldy, pf, state(t));
      for (; t < t1; ++t) tile_avx2<1, kPf, kSliced>(at(t), K, wp, b, out(t), ldy, pf, state(t));
    }
  };
  with_modes(pf, sl, rows);
}

// Panels [p0, p1): float32 x (part_avx2) or bf16 pairs (part_avx2_bx), chunk by chunk (walk_chunks
// hands one or two panels; each taken alone). Decode with bf16 x takes two panels at a time instead:
// each lane's chain of FMAs beside three others.
template <bool kBx>
PTLLM_PANELS_AVX2_TARGET void part_avx2_t(const void* x, int T, const WeightMatrix& w, const float* bias, float* y,
                                          int p0, int p1) {
  if constexpr (kBx) {
    if (T <= 2) {
      const int J = w.cols / 2;
      const size_t ldy = size_t(w.rows);
      const auto* xb = static_cast<const uint32_t*>(x);
      for (int p = p0; p < p1; p += 2) {
        const float* b = bias ? bias + p * kPanelRows : nullptr;
        for (int t = 0; t < T; ++t) {
          float* out = y + size_t(t) * ldy + size_t(p) * kPanelRows;
          if (p + 2 <= p1)
            tile_bx_avx2<2, 1, kAhead, false>(xb + size_t(t) * J, J, panel_at(w, p), b, out, ldy, nullptr, Slice{});
          else
            tile_bx_avx2<1, 1, kAhead, false>(xb + size_t(t) * J, J, panel_at(w, p), b, out, ldy, nullptr, Slice{});
        }
      }
      return;
    }
  }
  walk_chunks(T, w.cols, kBx ? sizeof(uint16_t) : sizeof(float), kBx ? 16 : 32, p0, p1,
              [&](auto np, int t0, int t1, int p, Slice sl) {
                for (int q = 0; q < decltype(np)::value; ++q) {
                  Slice s = sl;
                  if (s.st) s.st += size_t(q) * s.ld;
                  panel_rows_avx2<kBx>(x, t0, t1, w, bias, y, p + q, s);
                }
              });
}
void part_avx2(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, int p0, int p1) {
  part_avx2_t<false>(x, T, w, bias, y, p0, p1);
}
void part_avx2_bx(const uint32_t* xb, int T, const WeightMatrix& w, const float* bias, float* y, int p0, int p1) {
  part_avx2_t<true>(xb, T, w, bias, y, p0, p1);
}

// pack_words_avx512 for AVX2: 8 x 8 blocks of words from each half of the panel's rows, transposed,
// stored as the halves of 8 lines. Returns the pairs done.
PTLLM_PANELS_AVX2_TARGET size_t pack_words_avx2(const uint8_t* rows, size_t row_bytes, size_t pairs, uint8_t* dst) {
  size_t j = 0;
  for (; j + 8 <= pairs; j += 8)
    for (int h = 0; h < 2; ++h) {
      __m256i r[8];
      PTLLM_PANELS_UNROLL for (int i = 0; i < 8; ++i)
        r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + size_t(8 * h + i) * row_bytes + j * 4));
      __m256i a[8], b[8];
      PTLLM_PANELS_UNROLL for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        a[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
      }
      PTLLM_PANELS_UNROLL for (int i = 0; i < 8; i += 4) {
        b[i] = _mm256_unpacklo_epi64(a[i], a[i + 2]);
        b[i + 1] = _mm256_unpackhi_epi64(a[i], a[i + 2]);
        b[i + 2] = _mm256_unpacklo_epi64(a[i + 1], a[i + 3]);
        b[i + 3] = _mm256_unpackhi_epi64(a[i + 1], a[i + 3]);
      }
      // b[c] (c < 4): words c and 4 + c of rows 0-3 (low lane) / ... of rows 4-7 in b[4 + c].
      PTLLM_PANELS_UNROLL for (int c = 0; c < 4; ++c) {
        const __m256i lo = _mm256_permute2x128_si256(b[c], b[4 + c], 0x20);  // word c of rows 0-7
        const __m256i hi = _mm256_permute2x128_si256(b[c], b[4 + c], 0x31);  // word 4 + c
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (j + size_t(c)) * kPanelRows * 4 + 32 * size_t(h)), lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (j + 4 + size_t(c)) * kPanelRows * 4 + 32 * size_t(h)), hi);
      }
    }
  return j;
}

// Pairs [0, 16 * (pairs / 16)) of a panel: 16 x 16 blocks of 32-bit words (column pairs) loaded from
// its 16 rows, transposed, stored as 16 lines. Returns the pairs done.
PTLLM_PANELS_TARGET size_t pack_words_avx512(const uint8_t* rows, size_t row_bytes, size_t pairs, uint8_t* dst) {
  size_t j = 0;
  for (; j + 16 <= pairs; j += 16) {
    __m512i r[16];
    PTLLM_PANELS_UNROLL for (int i = 0; i < kPanelRows; ++i)
      r[i] = _mm512_loadu_si512(rows + size_t(i) * row_bytes + j * 4);
    transpose16_epi32(r);
    PTLLM_PANELS_UNROLL for (int c = 0; c < 16; ++c)
      _mm512_storeu_si512(dst + (j + size_t(c)) * kPanelRows * 4, r[c]);
  }
  return j;
}
#endif

// Panels [p0, p1) of row-major w (pack_panel each).
void pack_rows(const WeightMatrix& w, uint16_t* out, int p0, int p1) {
  const auto* src = static_cast<const uint8_t*>(w.data);
  const size_t row_bytes = size_t(w.cols) * 2;
  for (int p = p0; p < p1; ++p)
    pack_panel(src + size_t(p) * kPanelRows * row_bytes, row_bytes, w.cols, out + size_t(p) * kPanelRows * w.cols);
}

}  // namespace

// A column pair is one 32-bit word, so a panel is the 16 x (cols/2) word matrix of its rows
// transposed; AVX-512 transposes it 16 x 16 words at a time.
void pack_panel(const void* rows, size_t row_bytes, int cols, uint16_t* out) {
  const auto* src = static_cast<const uint8_t*>(rows);
  auto* dst = reinterpret_cast<uint8_t*>(out);
  const size_t pairs = size_t(cols) / 2;
  size_t j = 0;
#if defined(__x86_64__)
  if (active_kernels().target == SimdTarget::AVX512) j = pack_words_avx512(src, row_bytes, pairs, dst);
  if (active_kernels().target == SimdTarget::AVX2) j = pack_words_avx2(src, row_bytes, pairs, dst);
#endif
  for (; j < pairs; ++j)
    for (int i = 0; i < kPanelRows; ++i)
      std::memcpy(dst + (j * kPanelRows + size_t(i)) * 4, src + size_t(i) * row_bytes + j * 4, 4);
}

bool panels_fit(const WeightMatrix& w) {
  return w.format == WeightFormat::Dense && w.dtype == DType::BF16 && w.rows > 0 && w.rows % kPanelRows == 0 &&
         w.cols > 0 && w.cols % 2 == 0;
}

namespace {
std::atomic<bool>& panels_enabled_flag() {
  static std::atomic<bool> on{!env_switch("PTLLM_NO_PANELS")};
  return on;
}
}  // namespace

void set_panels_enabled(bool on) { panels_enabled_flag() = on; }

namespace {
std::atomic<bool>& bf16_x_flag() {
  static std::atomic<bool> on{env_switch("PTLLM_PANELS_BF16_X")};
  return on;
}
}  // namespace

void set_panels_bf16_x(bool on) { bf16_x_flag() = on; }

bool panels_bf16_x() { return bf16_x_flag(); }

namespace {
std::atomic<bool> g_bf16_dp{true};
}
void detail::set_panels_bf16_dp(bool on) { g_bf16_dp = on; }
bool detail::g_bf16_dp_on() { return g_bf16_dp; }

bool panels_wanted() {
  return panels_enabled_flag() &&
         (active_kernels().target == SimdTarget::AVX512 || active_kernels().target == SimdTarget::AVX2);
}

size_t panels_bytes(const WeightMatrix& w) { return size_t(w.rows) * size_t(w.cols) * sizeof(uint16_t); }

void pack_panels(const WeightMatrix& w, void* out, ThreadPool& pool) {
  PTLLM_CHECK(panels_fit(w));
  pool.parallel_for(size_t(w.rows / kPanelRows), [&](size_t b, size_t e) {
    pack_rows(w, static_cast<uint16_t*>(out), int(b), int(e));
  });
}

WeightMatrix panels_matrix(const void* data, int rows, int cols) {
  PTLLM_CHECK(rows % kPanelRows == 0 && cols % 2 == 0);
  WeightMatrix w = dense_matrix(DType::BF16, data, rows, cols);
  w.format = WeightFormat::Panels;
  return w;
}

void panels_row(const WeightMatrix& w, int r, float* out) {
  const uint16_t* wp = panel_at(w, r / kPanelRows) + size_t(r % kPanelRows) * 2;
  for (int j = 0; j < w.cols / 2; ++j) {
    out[2 * j] = bf16_to_f32(wp[size_t(j) * kPanelRows * 2]);
    out[2 * j + 1] = bf16_to_f32(wp[size_t(j) * kPanelRows * 2 + 1]);
  }
}

void panels_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool) {
  const MatmulOutput out{&w, bias, y};
  panels_matmul(x, T, std::span<const MatmulOutput>(&out, 1), pool);
}

void panels_matmul(const float* x, int T, std::span<const MatmulOutput> outs, ThreadPool& pool) {
  PTLLM_CHECK(!outs.empty());
  const int K = outs[0].w->cols;
  for (const MatmulOutput& o : outs) PTLLM_CHECK(o.w->format == WeightFormat::Panels && o.w->cols == K);
  const size_t panels = groups_of(outs, kPanelRows);  // of every output in turn
  const size_t per_panel = size_t(K) * kPanelRows;
  const size_t grain = std::max<size_t>(4, (kMinWeightsPerPart / per_panel + 3) / 4 * 4);
  if (panels_bf16_x()) {
    // x rounded once here for every part (T * K / 2 words: a few KiB for decode).
    thread_local Scratch rounded;
    auto* xb = reinterpret_cast<uint32_t*>(rounded.get(size_t(T) * size_t(K) / 2));
    auto round = &round_pairs_portable;
    auto part = &part_portable_bx;
#if defined(__x86_64__)
    if (active_kernels().target == SimdTarget::AVX512 && cpu_features().avx512bf16 && detail::g_bf16_dp_on()) {
      round = &round_pairs_avx512;
      part = &part_avx512_bx<true>;
    } else if (active_kernels().target == SimdTarget::AVX512) {
      part = &part_avx512_bx<false>;
    } else if (active_kernels().target == SimdTarget::AVX2) {
      part = &part_avx2_bx;
    }
#endif
    round(x, T, K, xb);
    pool.parallel_for(
        panels,
        [&](size_t b, size_t e) {
          for_each_share(outs, kPanelRows, b, e, [&](const MatmulOutput& o, int p0, int p1) {
            part(xb, T, *o.w, o.bias, o.y, p0, p1);
          });
        },
        grain);
    return;
  }
  auto part = &part_portable;
#if defined(__x86_64__)
  if (active_kernels().target == SimdTarget::AVX512) part = &part_avx512;
  if (active_kernels().target == SimdTarget::AVX2) part = &part_avx2;
#endif
  pool.parallel_for(
      panels,
      [&](size_t b, size_t e) {
        for_each_share(outs, kPanelRows, b, e, [&](const MatmulOutput& o, int p0, int p1) {
          part(x, T, *o.w, o.bias, o.y, p0, p1);
        });
      },
      grain);
}

}  // namespace ptllm
