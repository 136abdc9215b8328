#include "kernels/amx.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/simd.h"
#include "kernels/transpose_avx512.h"

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define PTLLM_HAVE_AMX 1
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC PR 105593, as kernels_avx512.cpp
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace ptllm {

namespace {

constexpr int kTileRows = 16;      // rows of a weight tile and of an output tile
constexpr int kTileK = 32;         // bf16 columns of the matrix a tile product takes
constexpr int kSlabRows = 8;       // rows of x a tile of packed x holds (as hi, then as lo)
constexpr int kTileWords = 256;    // dwords of a tile of packed x: 16 pairs of k x 16 columns
constexpr int kRowsPerThreadPart = 64;

#if defined(PTLLM_HAVE_AMX)

bool detect_amx() {
  if (const char* e = std::getenv("PTLLM_NO_AMX"); e && *e && std::strcmp(e, "0") != 0) return false;
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
  if (!amx_bf16 || !amx_tile) return false;
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512bf16"))
    return false;
  constexpr long kArchReqXcompPerm = 0x1023;  // Linux 5.16: ask for an extended state component
  constexpr long kXfeatureTileData = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureTileData) != 0) return false;
  uint32_t xlo, xhi;
  __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  return (xlo & (3u << 17)) == (3u << 17);  // TILECFG and TILEDATA enabled
}

bool amx_detected() {
  static const bool yes = detect_amx();
  return yes;
}

#define PTLLM_AMX \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: outputs (16 weight rows x 16 columns of packed x, float32); 4, 5: weights; 6, 7: packed
// x (7 holds weights in a one-slab pass of 3 or 4 weight tiles, which only full tiles take).
// `wrows`: rows of the weight and output tiles (16, or fewer for the matrix's last rows).
PTLLM_AMX void configure(int wrows) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = uint8_t(t >= 6 ? kTileRows : wrows);
  }
  _tile_loadconfig(&cfg);
}

// x's hi and lo as bf16 (round to nearest even; the instruction treats denormals as zero).
PTLLM_AMX inline void split32(const float* x, __m512i& hi, __m512i& lo) {
  const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  hi = __m512i(_mm512_cvtne2ps_pbh(v1, v0));
  const __m512 h0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi)), 16));
  const __m512 h1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hi, 1)), 16));
  lo = __m512i(_mm512_cvtne2ps_pbh(_mm512_sub_ps(v1, h1), _mm512_sub_ps(v0, h0)));
}

// Slabs [s0, s1) of packed x (amx.h amx_pack_x): each tile's 16 columns (8 rows of x as hi, then as
// lo) split in registers and transposed into its 16 rows of pairs of k.
PTLLM_AMX void pack_slabs(const float* x, int T, int K, int s0, int s1, uint32_t* out) {
  const int nkc = K / kTileK;
  for (int s = s0; s < s1; ++s) {
    uint32_t* slab = out + size_t(s) * size_t(nkc) * kTileWords;
    const int nt = std::min(kSlabRows, T - s * kSlabRows);
    for (int kc = 0; kc < nkc; ++kc) {
      __m512i cols[16];
      for (int c = 0; c < kSlabRows; ++c) {
        if (c < nt) {
          split32(x + size_t(s * kSlabRows + c) * size_t(K) + size_t(kc) * kTileK, cols[c], cols[kSlabRows + c]);
        } else {
          cols[c] = cols[kSlabRows + c] = _mm512_setzero_si512();
        }
      }
      transpose16_epi32(cols);  // now the tile's rows
      uint32_t* tile = slab + size_t(kc) * kTileWords;
      for (int p = 0; p < 16; ++p) _mm512_storeu_si512(tile + 16 * p, cols[p]);
    }
  }
}

// One output tile (16 x 16 floats, `nrows` weight rows) into y: y[t][r + o] = hi sum + lo sum (+
// the lo tile's two sums, for weights split in two, amx_rows_dequantized) + bias. The tile is
// transposed in registers so that each row of y takes one (masked) store of its 16 outputs.
PTLLM_AMX void write_tile(const float* cb, const float* lo_cb, int nrows, int r, int slab, int T, int ldy,
                          const float* bias, float* y) {
  const int nt = std::min(kSlabRows, T - slab * kSlabRows);
  const __mmask16 m = nrows >= 16 ? __mmask16(0xffff) : __mmask16((1u << nrows) - 1);
  __m512i cols[16], lo_cols[16];
  for (int o = 0; o < 16; ++o) cols[o] = _mm512_loadu_si512(cb + 16 * o);  // rows past nrows: unused lanes
  transpose16_epi32(cols);
  if (lo_cb) {
    for (int o = 0; o < 16; ++o) lo_cols[o] = _mm512_loadu_si512(lo_cb + 16 * o);
    transpose16_epi32(lo_cols);
  }
  const __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + r) : _mm512_setzero_ps();
  for (int c = 0; c < nt; ++c) {
    __m512 v = _mm512_add_ps(_mm512_castsi512_ps(cols[c]), _mm512_castsi512_ps(cols[kSlabRows + c]));
    if (lo_cb) {
      const __m512 l = _mm512_add_ps(_mm512_castsi512_ps(lo_cols[c]), _mm512_castsi512_ps(lo_cols[kSlabRows + c]));
      v = _mm512_add_ps(v, l);
    }
    if (bias) v = _mm512_add_ps(v, b);
    _mm512_mask_storeu_ps(y + size_t(slab * kSlabRows + c) * size_t(ldy) + size_t(r), m, v);
  }
}

// The 16 rows of the weight tile kPrefetchTiles tiles to the right (1 KiB further along each row),
// asked for while this one is read: 16-64 rows a matrix row apart are more streams than the
// hardware prefetcher follows. Measured: 2.61-2.69 ms for kjv-small's matrices at T = 16
// from L3, against 2.85-3.86 ms without (two threads, three runs each, this VM).
constexpr int kPrefetchTiles = 16;
PTLLM_AMX inline void prefetch_tile(const char* w, size_t ldw) {
  for (int i = 0; i < kTileRows; ++i) _mm_prefetch(w + size_t(i) * ldw + kPrefetchTiles * 64, _MM_HINT_T0);
}

// NO (1-4) tiles of 16 weight rows from w0 against one slab of packed x: out tiles [NO][16][16].
template <int NO>
PTLLM_AMX void tiles_one_slab(const char* w0, size_t ldw, const uint32_t* xs, int nkc, float* out) {
  if constexpr (NO > 0) _tile_zero(0);
  if constexpr (NO > 1) _tile_zero(1);
  if constexpr (NO > 2) _tile_zero(2);
  if constexpr (NO > 3) _tile_zero(3);
  for (int kc = 0; kc < nkc; ++kc) {
    const char* w = w0 + size_t(kc) * kTileK * 2;
    _tile_loadd(6, xs + size_t(kc) * kTileWords, 64);
    prefetch_tile(w, ldw);
    _tile_loadd(4, w, ldw);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NO > 1) {
      prefetch_tile(w + 16 * ldw, ldw);
      _tile_loadd(5, w + 16 * ldw, ldw);
      _tile_dpbf16ps(1, 5, 6);
    }
    if constexpr (NO > 2) {
      prefetch_tile(w + 32 * ldw, ldw);
      _tile_loadd(7, w + 32 * ldw, ldw);
      _tile_dpbf16ps(2, 7, 6);
    }
    if constexpr (NO > 3) {
      prefetch_tile(w + 48 * ldw, ldw);
      _tile_loadd(4, w + 48 * ldw, ldw);
      _tile_dpbf16ps(3, 4, 6);
    }
  }
  if constexpr (NO > 0) _tile_stored(0, out, 64);
  if constexpr (NO > 1) _tile_stored(1, out + 256, 64);
  if constexpr (NO > 2) _tile_stored(2, out + 512, 64);
  if constexpr (NO > 3) _tile_stored(3, out + 768, 64);
}

// NO (1-2) tiles of weight rows against two slabs: out tiles [NO][2][16][16] (weight tile, slab).
template <int NO>
PTLLM_AMX void tiles_two_slabs(const char* w0, size_t ldw, const uint32_t* xs0, const uint32_t* xs1, int nkc,
                               float* out) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (NO > 1) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int kc = 0; kc < nkc; ++kc) {
    const char* w = w0 + size_t(kc) * kTileK * 2;
    _tile_loadd(6, xs0 + size_t(kc) * kTileWords, 64);
    _tile_loadd(7, xs1 + size_t(kc) * kTileWords, 64);
    prefetch_tile(w, ldw);
    _tile_loadd(4, w, ldw);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (NO > 1) {
      prefetch_tile(w + 16 * ldw, ldw);
      _tile_loadd(5, w + 16 * ldw, ldw);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, out, 64);
  _tile_stored(1, out + 256, 64);
  if constexpr (NO > 1) {
    _tile_stored(2, out + 512, 64);
    _tile_stored(3, out + 768, 64);
  }
}

void run_one_slab(int no, const char* w0, size_t ldw, const uint32_t* xs, int nkc, float* out) {
  switch (no) {
    case 1: return tiles_one_slab<1>(w0, ldw, xs, nkc, out);
    case 2: return tiles_one_slab<2>(w0, ldw, xs, nkc, out);
    case 3: return tiles_one_slab<3>(w0, ldw, xs, nkc, out);
    default: return tiles_one_slab<4>(w0, ldw, xs, nkc, out);
  }
}

// Weight rows [r0, r1) of y, one thread's share; xp: packed x.
PTLLM_AMX void amx_rows(const uint32_t* xp, int T, const WeightMatrix& w, const float* bias, float* y, int r0,
                        int r1) {
  const int K = w.cols, nkc = K / kTileK, nslabs = (T + kSlabRows - 1) / kSlabRows;
  const size_t ldw = size_t(K) * 2, slab_words = size_t(nkc) * kTileWords;
  const char* base = static_cast<const char*>(w.data);
  alignas(64) float cb[4 * 256];
  configure(kTileRows);
  int r = r0;
  while (r1 - r >= kTileRows) {
    const char* w0 = base + size_t(r) * ldw;
    if (nslabs == 1) {
      const int no = std::min(4, (r1 - r) / kTileRows);
      run_one_slab(no, w0, ldw, xp, nkc, cb);
      for (int i = 0; i < no; ++i)
        write_tile(cb + i * 256, nullptr, kTileRows, r + i * kTileRows, 0, T, w.rows, bias, y);
      r += no * kTileRows;
      continue;
    }
    const int no = std::min(2, (r1 - r) / kTileRows);
    int s = 0;
    for (; s + 2 <= nslabs; s += 2) {
      if (no == 2) tiles_two_slabs<2>(w0, ldw, xp + size_t(s) * slab_words, xp + size_t(s + 1) * slab_words, nkc, cb);
      else tiles_two_slabs<1>(w0, ldw, xp + size_t(s) * slab_words, xp + size_t(s + 1) * slab_words, nkc, cb);
      for (int i = 0; i < no; ++i)
        for (int j = 0; j < 2; ++j)
          write_tile(cb + (i * 2 + j) * 256, nullptr, kTileRows, r + i * kTileRows, s + j, T, w.rows, bias, y);
    }
    if (s < nslabs) {
      run_one_slab(no, w0, ldw, xp + size_t(s) * slab_words, nkc, cb);
      for (int i = 0; i < no; ++i)
        write_tile(cb + i * 256, nullptr, kTileRows, r + i * kTileRows, s, T, w.rows, bias, y);
    }
    r += no * kTileRows;
  }
  if (r < r1) {  // the matrix's last rows: tiles of fewer rows
    configure(r1 - r);
    const char* w0 = base + size_t(r) * ldw;
    for (int s = 0; s < nslabs; ++s) {
      tiles_one_slab<1>(w0, ldw, xp + size_t(s) * slab_words, nkc, cb);
      write_tile(cb, nullptr, r1 - r, r, s, T, w.rows, bias, y);
    }
  }
  _tile_release();
}

// Rows of weights converted to bf16 lose up to 2^-9 of each weight, more than some formats' own
// rounding (Q8_0, 8-bit affine) and enough to move a 4-bit model's NLL by 1e-2: so a converted
// weight is split as x is, w = hi + lo, and the tiles of the 16 rows' hi and of their lo are two
// weight tiles of one pass (amx.h).
PTLLM_AMX void split_row(const float* w, int K, uint16_t* hi, uint16_t* lo) {
  for (int k = 0; k < K; k += kTileK) {
    __m512i h, l;
    split32(w + k, h, l);
    _mm512_storeu_si512(hi + k, h);
    _mm512_storeu_si512(lo + k, l);
  }
}

// The same as amx_rows for a matrix stored in another format (amx_takes_dequantized): each 16 rows
// dequantized once (weight_row) and split into hi and lo rows, in a buffer of this thread laid out
// as 32 rows (hi, then lo), which the two-weight-tile passes read as they read a bf16 matrix.
PTLLM_AMX void amx_rows_dequantized(const uint32_t* xp, int T, const WeightMatrix& w, const float* bias, float* y,
                                    int r0, int r1) {
  const int K = w.cols, nkc = K / kTileK, nslabs = (T + kSlabRows - 1) / kSlabRows;
  const size_t ldw = size_t(K) * 2, slab_words = size_t(nkc) * kTileWords;
  thread_local std::vector<float> row;
  thread_local std::vector<uint16_t> stage;
  if (row.size() < size_t(K)) row.resize(size_t(K));
  if (stage.size() < size_t(2 * kTileRows) * size_t(K)) stage.resize(size_t(2 * kTileRows) * size_t(K));
  const char* w0 = reinterpret_cast<const char*>(stage.data());
  alignas(64) float cb[4 * 256];
  configure(kTileRows);  // weight_row and the split run no tile code: one configuration for the part
  for (int r = r0; r < r1; r += kTileRows) {
    const int nr = std::min(kTileRows, r1 - r);
    for (int i = 0; i < kTileRows; ++i) {
      uint16_t* hi = stage.data() + size_t(i) * size_t(K);
      uint16_t* lo = hi + size_t(kTileRows) * size_t(K);
      if (i < nr) {
        weight_row(w, r + i, row.data());
        split_row(row.data(), K, hi, lo);
      } else {
        std::memset(hi, 0, size_t(K) * 2);
        std::memset(lo, 0, size_t(K) * 2);
      }
    }
    int s = 0;
    for (; s + 2 <= nslabs; s += 2) {  // tiles: (hi, slab s), (hi, s + 1), (lo, s), (lo, s + 1)
      tiles_two_slabs<2>(w0, ldw, xp + size_t(s) * slab_words, xp + size_t(s + 1) * slab_words, nkc, cb);
      for (int j = 0; j < 2; ++j) write_tile(cb + j * 256, cb + (2 + j) * 256, nr, r, s + j, T, w.rows, bias, y);
    }
    if (s < nslabs) {  // tiles: hi, lo
      tiles_one_slab<2>(w0, ldw, xp + size_t(s) * slab_words, nkc, cb);
      write_tile(cb, cb + 256, nr, r, s, T, w.rows, bias, y);
    }
  }
  _tile_release();
}

#endif  // PTLLM_HAVE_AMX

std::atomic<int> g_enabled{-1};
  // -1: not decided yet

}  // namespace

bool amx_available() {
#if defined(PTLLM_HAVE_AMX)
  int e = g_enabled.load(std::memory_order_relaxed);
  if (e < 0) {
    e = amx_detected() ? 1 : 0;
    g_enabled.store(e, std::memory_order_relaxed);
  }
  return e == 1;
#else
  return false;
#endif
}

void set_amx_enabled(bool on) {
#if defined(PTLLM_HAVE_AMX)
  g_enabled.store(on && amx_detected() ? 1 : 0);
#else
  (void)on;
#endif
}

bool amx_active() { return amx_available() && active_simd_target() == SimdTarget::AVX512; }

bool amx_takes(const WeightMatrix& w) {
  return w.format == WeightFormat::Dense && w.dtype == DType::BF16 && w.cols % kTileK == 0 && w.cols > 0 &&
         amx_active();
}

bool amx_takes_dequantized(const WeightMatrix& w) {
  return w.format == WeightFormat::Ggml && w.cols % kTileK == 0 && w.cols > 0 && amx_active();
}

size_t amx_packed_words(int T, int K) {
  return size_t((T + kSlabRows - 1) / kSlabRows) * size_t(K / kTileK) * kTileWords;
}

void amx_pack_x(const float* x, int T, int K, uint32_t* out) {
#if defined(PTLLM_HAVE_AMX)
  PTLLM_CHECK(amx_available() && K % kTileK == 0);
  pack_slabs(x, T, K, 0, (T + kSlabRows - 1) / kSlabRows, out);
#else
  (void)x, (void)T, (void)K, (void)out;
  PTLLM_CHECK(!"amx_pack_x: no AMX in this build");
#endif
}

void amx_split(float x, uint16_t& hi, uint16_t& lo) {
#if defined(PTLLM_HAVE_AMX)
  PTLLM_CHECK(amx_available());
  float v[32] = {x};
  uint32_t packed[kTileWords * 1] = {};
  pack_slabs(v, 1, kTileK, 0, 1, packed);
  hi = uint16_t(packed[0] & 0xffff);
  lo = uint16_t(packed[kSlabRows] & 0xffff);
#else
  (void)x, (void)hi, (void)lo;
  PTLLM_CHECK(!"amx_split: no AMX in this build");
#endif
}

void amx_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool) {
#if defined(PTLLM_HAVE_AMX)
  const bool direct = amx_takes(w);
  PTLLM_CHECK(direct || amx_takes_dequantized(w));
  thread_local std::vector<uint32_t> packed;  // reused by every call of this thread
  const size_t need = amx_packed_words(T, w.cols);
  if (packed.size() < need) packed.resize(need);
  uint32_t* xp = packed.data();
  const int nslabs = (T + kSlabRows - 1) / kSlabRows;
  if (nslabs == 1) {
    pack_slabs(x, T, w.cols, 0, 1, xp);
  } else {
    pool.parallel_for(size_t(nslabs), [&](size_t b, size_t e) { pack_slabs(x, T, w.cols, int(b), int(e), xp); });
  }
  pool.parallel_for(
      size_t(w.rows),
      [&](size_t b, size_t e) {
        if (direct) amx_rows(xp, T, w, bias, y, int(b), int(e));
        else amx_rows_dequantized(xp, T, w, bias, y, int(b), int(e));
      },
      kRowsPerThreadPart);
#else
  (void)x, (void)T, (void)w, (void)bias, (void)y, (void)pool;
  PTLLM_CHECK(!"amx_matmul: no AMX in this build");
#endif
}

}  // namespace ptllm
