#include "kernels/amx.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/features.h"
#include "kernels/ops.h"
#include "kernels/panels.h"
#include "kernels/simd.h"

#if defined(__x86_64__) && defined(__linux__)
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

constexpr int kTileRows = 16;   // rows of a tile of x (a slab) and of an output tile; outputs of a panel
constexpr int kTileK = 32;      // bf16 columns of the matrix a tile product takes
constexpr int kSlabRows = 8;    // rows of x a slab holds (as hi, then as lo)
constexpr size_t kTileBytes = size_t(kTileK) * kTileRows * 2;  // a tile of x or of weights: 1 KiB
// A call's panels are cut into kPartsPerThread parts a thread (not the pool's default eight): each
// part configures and releases the tiles and claims its range. kjv-small's matrices at T = 16, two
// threads: two parts a thread 2.02-2.03 ms a step against 2.24-2.27 ms for parts of 4 panels; in a
// later run two parts 1.945-1.948 ms, one part 1.931-1.946 (the same within noise; two keep a late
// worker's share takeable by the caller).
constexpr size_t kMinPanelsPerPart = 4, kPartsPerThread = 2;
// From this many slabs (prefill) the threads share the packing of x; fewer (batched decode) are a
// few KiB, packed by the caller without a second hand-over to the pool.
constexpr int kSharedPackSlabs = 4;

#if defined(PTLLM_HAVE_AMX)

bool detect_amx() {
  if (const char* e = std::getenv("PTLLM_NO_AMX"); e && *e && std::strcmp(e, "0") != 0) return false;
  const CpuFeatures& f = cpu_features();
  if (!f.amx_bf16 || !f.avx512 || !f.avx512bf16) return false;
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

// Tiles 0-3: outputs (16 rows of a slab x 16 outputs of a panel, float32); 4, 5: weights (a panel's
// 32 columns: 16 pairs of k x 16 outputs); 6, 7: slabs of x (7 holds weights in a one-slab pass of
// 3 or 4 panels). Every tile is full: slabs are padded with zero rows, panels hold 16 outputs.
PTLLM_AMX void configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = kTileRows;
  }
  // GCC's _tile_loadconfig tells the compiler it reads 8 bytes: without this the stores above are dead.
  asm volatile("" : : "r"(&cfg) : "memory");
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

// A row of K floats split into a row of hi and a row of lo (K a multiple of 32).
PTLLM_AMX void split_row(const float* x, int K, uint16_t* hi, uint16_t* lo) {
  for (int k = 0; k < K; k += kTileK) {
    __m512i h, l;
    split32(x + k, h, l);
    _mm512_storeu_si512(hi + k, h);
    _mm512_storeu_si512(lo + k, l);
  }
}

// Slabs [s0, s1) of packed x (amx.h amx_pack_x): a slab is K / 32 tiles of 16 rows x 32 bf16 values
// (1 KiB, x's 8 rows as hi, then as lo).
PTLLM_AMX void pack_slabs(const float* x, int T, int K, int s0, int s1, uint16_t* out) {
  const int nkc = K / kTileK;
  for (int s = s0; s < s1; ++s) {
    uint16_t* slab = out + size_t(s) * kTileRows * size_t(K);
    for (int c = 0; c < kSlabRows; ++c) {
      const int t = s * kSlabRows + c;
      for (int kc = 0; kc < nkc; ++kc) {
        __m512i hi = _mm512_setzero_si512(), lo = hi;
        if (t < T) split32(x + size_t(t) * size_t(K) + size_t(kc) * kTileK, hi, lo);
        uint16_t* tile = slab + size_t(kc) * kTileRows * kTileK;
        _mm512_storeu_si512(tile + c * kTileK, hi);
        _mm512_storeu_si512(tile + (kSlabRows + c) * kTileK, lo);
      }
    }
  }
}

// One output tile (a slab's 16 rows x 16 outputs, `nout` of them kept) into y: y[t][r + o] = hi row
// + lo row (+ the lo panel's two rows, for weights split in two, amx_rows_dequantized) + bias.
PTLLM_AMX void write_tile(const float* cb, const float* lo_cb, int nout, int r, int slab, int T, int ldy,
                          const float* bias, float* y) {
  const int nt = std::min(kSlabRows, T - slab * kSlabRows);
  const __mmask16 m = nout >= 16 ? __mmask16(0xffff) : __mmask16((1u << nout) - 1);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + r) : _mm512_setzero_ps();
  for (int c = 0; c < nt; ++c) {
    __m512 v = _mm512_add_ps(_mm512_loadu_ps(cb + 16 * c), _mm512_loadu_ps(cb + 16 * (kSlabRows + c)));
    if (lo_cb) {
      const __m512 l = _mm512_add_ps(_mm512_loadu_ps(lo_cb + 16 * c), _mm512_loadu_ps(lo_cb + 16 * (kSlabRows + c)));
      v = _mm512_add_ps(v, l);
    }
    if (bias) v = _mm512_add_ps(v, b);
    _mm512_mask_storeu_ps(y + size_t(slab * kSlabRows + c) * size_t(ldy) + size_t(r), m, v);
  }
}

// The weights of a pass: consecutive panels from wp, panel p's tile kc at (p * nkc + kc) KiB. Panels
// and slabs of x are both read in order, 1 KiB a tile: the hardware prefetcher follows these streams
// (software prefetch measured no faster; the row-major layout's 16 strided rows a tile streamed
// 1.24x slower).
struct Pass {
  const char* wp;
  int nkc;
  const char* w(int p, int kc) const { return wp + (size_t(p) * size_t(nkc) + size_t(kc)) * kTileBytes; }
};

// NP (1-4) panels against one slab: out tiles [NP][16][16].
template <int NP>
PTLLM_AMX void tiles_one_slab(const Pass& ps, const char* xs, float* out) {
  if constexpr (NP > 0) _tile_zero(0);
  if constexpr (NP > 1) _tile_zero(1);
  if constexpr (NP > 2) _tile_zero(2);
  if constexpr (NP > 3) _tile_zero(3);
  for (int kc = 0; kc < ps.nkc; ++kc) {
    _tile_loadd(6, xs + size_t(kc) * kTileBytes, 64);
    _tile_loadd(4, ps.w(0, kc), 64);
    _tile_dpbf16ps(0, 6, 4);
    if constexpr (NP > 1) {
      _tile_loadd(5, ps.w(1, kc), 64);
      _tile_dpbf16ps(1, 6, 5);
    }
    if constexpr (NP > 2) {
      _tile_loadd(7, ps.w(2, kc), 64);
      _tile_dpbf16ps(2, 6, 7);
    }
    if constexpr (NP > 3) {
      _tile_loadd(4, ps.w(3, kc), 64);
      _tile_dpbf16ps(3, 6, 4);
    }
  }
  if constexpr (NP > 0) _tile_stored(0, out, 64);
  if constexpr (NP > 1) _tile_stored(1, out + 256, 64);
  if constexpr (NP > 2) _tile_stored(2, out + 512, 64);
  if constexpr (NP > 3) _tile_stored(3, out + 768, 64);
}

// NP (1-2) panels against two slabs: out tiles [NP][2][16][16] (panel, slab).
template <int NP>
PTLLM_AMX void tiles_two_slabs(const Pass& ps, const char* xs0, const char* xs1, float* out) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (NP > 1) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int kc = 0; kc < ps.nkc; ++kc) {
    _tile_loadd(6, xs0 + size_t(kc) * kTileBytes, 64);
    _tile_loadd(7, xs1 + size_t(kc) * kTileBytes, 64);
    _tile_loadd(4, ps.w(0, kc), 64);
    _tile_dpbf16ps(0, 6, 4);
    _tile_dpbf16ps(1, 7, 4);
    if constexpr (NP > 1) {
      _tile_loadd(5, ps.w(1, kc), 64);
      _tile_dpbf16ps(2, 6, 5);
      _tile_dpbf16ps(3, 7, 5);
    }
  }
  _tile_stored(0, out, 64);
  _tile_stored(1, out + 256, 64);
  if constexpr (NP > 1) {
    _tile_stored(2, out + 512, 64);
    _tile_stored(3, out + 768, 64);
  }
}

void run_one_slab(int np, const Pass& ps, const char* xs, float* out) {
  switch (np) {
    case 1: return tiles_one_slab<1>(ps, xs, out);
    case 2: return tiles_one_slab<2>(ps, xs, out);
    case 3: return tiles_one_slab<3>(ps, xs, out);
    default: return tiles_one_slab<4>(ps, xs, out);
  }
}

// Panels [p0, p1) of y, one thread's share, tiles configured; xp: packed x. Up to 8 rows of x: 4
// panels a pass over the one slab; more: 2 panels against two slabs at a time.
PTLLM_AMX void amx_rows(const uint16_t* xp, int T, const WeightMatrix& w, const float* bias, float* y, int p0,
                        int p1) {
  const int K = w.cols, nslabs = (T + kSlabRows - 1) / kSlabRows;
  const size_t slab_bytes = size_t(kTileRows) * size_t(K) * 2, panel_bytes = size_t(kPanelRows) * size_t(K) * 2;
  const char* x0 = reinterpret_cast<const char*>(xp);
  const char* base = static_cast<const char*>(w.data);
  alignas(64) float cb[4 * 256];
  for (int p = p0; p < p1;) {
    const int np = std::min(nslabs == 1 ? 4 : 2, p1 - p);
    const Pass ps{base + size_t(p) * panel_bytes, K / kTileK};
    const auto write = [&](int i, int s, const float* tile) {
      write_tile(tile, nullptr, kPanelRows, (p + i) * kPanelRows, s, T, w.rows, bias, y);
    };
    int s = 0;
    for (; s + 2 <= nslabs; s += 2) {
      const char* xs = x0 + size_t(s) * slab_bytes;
      if (np == 2) tiles_two_slabs<2>(ps, xs, xs + slab_bytes, cb);
      else tiles_two_slabs<1>(ps, xs, xs + slab_bytes, cb);
      for (int i = 0; i < np; ++i)
        for (int j = 0; j < 2; ++j) write(i, s + j, cb + (i * 2 + j) * 256);
    }
    if (s < nslabs) {
      run_one_slab(np, ps, x0 + size_t(s) * slab_bytes, cb);
      for (int i = 0; i < np; ++i) write(i, s, cb + i * 256);
    }
    p += np;
  }
}

// Rows of weights converted to bf16 lose up to 2^-9 of each weight, more than some formats' own
// rounding (Q8_0, 8-bit affine) and enough to move a 4-bit model's NLL by 1e-2: so a converted
// weight is split as x is, w = hi + lo (amx.h). The same as amx_rows for a matrix stored in another
// format (amx_takes_dequantized), tiles configured (weight_row, the split and the packing run no
// tile code, so one configuration serves a part): each 16 rows are dequantized once (weight_row),
// split, and packed as two panels of this thread (their hi, then their lo), which a pass reads as
// two panels of a bf16 matrix; the output tile adds the two.
PTLLM_AMX void amx_rows_dequantized(const uint16_t* xp, int T, const WeightMatrix& w, const float* bias, float* y,
                                    int g0, int g1) {
  const int K = w.cols, nslabs = (T + kSlabRows - 1) / kSlabRows;
  const size_t slab_bytes = size_t(kTileRows) * size_t(K) * 2, panel_values = size_t(kPanelRows) * size_t(K);
  thread_local std::vector<float> row;
  thread_local std::vector<uint16_t> rows, stage;  // 16 rows of hi, 16 of lo; their two panels
  if (row.size() < size_t(K)) row.resize(size_t(K));
  if (rows.size() < 2 * panel_values) rows.resize(2 * panel_values), stage.resize(2 * panel_values);
  const Pass ps{reinterpret_cast<const char*>(stage.data()), K / kTileK};
  const char* x0 = reinterpret_cast<const char*>(xp);
  alignas(64) float cb[4 * 256];
  for (int g = g0; g < g1; ++g) {
    const int r = g * kPanelRows, nr = std::min(kPanelRows, w.rows - r);
    for (int i = 0; i < kPanelRows; ++i) {
      uint16_t* hi = rows.data() + size_t(i) * size_t(K);
      uint16_t* lo = hi + panel_values;
      if (i < nr) {
        weight_row(w, r + i, row.data());
        split_row(row.data(), K, hi, lo);
      } else {
        std::memset(hi, 0, size_t(K) * 2);
        std::memset(lo, 0, size_t(K) * 2);
      }
    }
    pack_panel(rows.data(), size_t(K) * 2, K, stage.data());
    pack_panel(rows.data() + panel_values, size_t(K) * 2, K, stage.data() + panel_values);
    int s = 0;
    for (; s + 2 <= nslabs; s += 2) {  // tiles: (hi, slab s), (hi, s + 1), (lo, s), (lo, s + 1)
      const char* xs = x0 + size_t(s) * slab_bytes;
      tiles_two_slabs<2>(ps, xs, xs + slab_bytes, cb);
      for (int j = 0; j < 2; ++j) write_tile(cb + j * 256, cb + (2 + j) * 256, nr, r, s + j, T, w.rows, bias, y);
    }
    if (s < nslabs) {  // tiles: hi, lo
      tiles_one_slab<2>(ps, x0 + size_t(s) * slab_bytes, cb);
      write_tile(cb, cb + 256, nr, r, s, T, w.rows, bias, y);
    }
  }
}

// A thread's part: groups [b, e) of the outputs' groups in turn.
PTLLM_AMX void amx_part(const uint16_t* xp, int T, std::span<const MatmulOutput> outs, size_t b, size_t e) {
  configure();
  for_each_share(outs, kPanelRows, b, e, [&](const MatmulOutput& o, int g0, int g1) {
    if (o.w->format == WeightFormat::Panels) amx_rows(xp, T, *o.w, o.bias, o.y, g0, g1);
    else amx_rows_dequantized(xp, T, *o.w, o.bias, o.y, g0, g1);
  });
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
  return w.format == WeightFormat::Panels && w.cols % kTileK == 0 && w.cols > 0 && amx_active();
}

bool amx_takes_dequantized(const WeightMatrix& w) {
  // Packed K-quants (kernels/ggml.h) keep their own product: their rows are not stored whole.
  return w.format == WeightFormat::Ggml && !w.ggml_pack && w.cols % kTileK == 0 && w.cols > 0 && amx_active();
}

size_t amx_packed_values(int T, int K) { return size_t((T + kSlabRows - 1) / kSlabRows) * kTileRows * size_t(K); }

void amx_pack_x(const float* x, int T, int K, uint16_t* out) {
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
  float v[kTileK] = {x};
  uint16_t packed[kTileRows * kTileK] = {};
  pack_slabs(v, 1, kTileK, 0, 1, packed);
  hi = packed[0];
  lo = packed[kSlabRows * kTileK];
#else
  (void)x, (void)hi, (void)lo;
  PTLLM_CHECK(!"amx_split: no AMX in this build");
#endif
}

void amx_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool) {
  const MatmulOutput out{&w, bias, y};
  amx_matmul(x, T, std::span<const MatmulOutput>(&out, 1), pool);
}

void amx_matmul(const float* x, int T, std::span<const MatmulOutput> outs, ThreadPool& pool) {
#if defined(PTLLM_HAVE_AMX)
  PTLLM_CHECK(!outs.empty());
  const int K = outs[0].w->cols;
  for (const MatmulOutput& o : outs) PTLLM_CHECK(o.w->cols == K && (amx_takes(*o.w) || amx_takes_dequantized(*o.w)));
  const size_t groups = groups_of(outs, kPanelRows);  // panels, or 16 rows of another format, of every output
  thread_local std::vector<uint16_t> packed;  // reused by every call of this thread
  const size_t need = amx_packed_values(T, K);
  if (packed.size() < need) packed.resize(need);
  uint16_t* xp = packed.data();
  const int nslabs = (T + kSlabRows - 1) / kSlabRows;
  if (nslabs < kSharedPackSlabs) {
    pack_slabs(x, T, K, 0, nslabs, xp);
  } else {
    pool.parallel_for(size_t(nslabs), [&](size_t b, size_t e) { pack_slabs(x, T, K, int(b), int(e), xp); });
  }
  const size_t parts = kPartsPerThread * size_t(pool.size());
  pool.parallel_for(
      groups, [&](size_t b, size_t e) { amx_part(xp, T, outs, b, e); },
      std::max(kMinPanelsPerPart, (groups + parts - 1) / parts));
#else
  (void)x, (void)T, (void)outs, (void)pool;
  PTLLM_CHECK(!"amx_matmul: no AMX in this build");
#endif
}

}  // namespace ptllm
