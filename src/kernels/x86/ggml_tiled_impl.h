// The product of Q4_0 and Q8_0 weights with any number of rows of x (decode, prefill, a speculative
// verification, the rows routed to one expert) on 512-bit vectors, included by ggml_kernels_impl.h
// for the AVX-512 targets. One row of x takes a fused one-row form of the same operations.
//
// Sixteen weight rows are unpacked once into a panel laid out for vpdpbusd: per 32-value block 8
// vectors, vector k holding in int32 lane r the codes 4k .. 4k + 3 of row r as unsigned bytes
// (Q4_0: the nibble, 0..15; Q8_0: the code + 128). A row of x meets a panel through 4 of its int8
// codes broadcast to every lane, so one vpdpbusd is 64 multiply-adds of 16 rows, and the block's
// scale is one float vector of the 16 rows' d. The offset is taken back in integers from x's sum
// over the block: sum (c + o) x = sum c x + o sum x, so each lane starts at -o sum x (o = 8 for
// Q4_0's stored nibbles, 128 for Q8_0). Per block the sum is exact, as the scalar twin's; the float
// accumulation is one FMA a block, in block order.
//
// Each y[t][r] is computed by the same operations in the same order whatever T, whichever rows of x
// share its register tile and whichever weight rows share its panel, and however rows are split over
// threads: a row's result does not depend on the batch, so a verification's rows equal the plain
// steps' bit for bit.

// Included inside ggml_kernels_impl.h's namespace, after its 512-bit helpers (Z, FZ, load128).

constexpr int kPanelRows = 16;  // weight rows of a panel: the int32 lanes of a zmm

// Whether the many-rows kernel takes weights of type t for T rows of x. Without VNNI, vpmaddubsw's
// int16 pairs would saturate on Q8_0's codes + 128; Q4_0's nibbles stay far below.
PTLLM_GGML_TARGET inline bool tiled_takes(GgmlType t, int T) {
  // Q8_0's one-row form is slower than the row-at-a-time kernel (decode 25 against 31 tok/s, 1B shape):
  // Q8_0 takes the panels above the rows whose results must equal a lone row's (ops.h).
  return t == GgmlType::Q4_0 || (PTLLM_GGML_VNNI && t == GgmlType::Q8_0 && T > kMatmulSmallRows);
}

PTLLM_GGML_TARGET inline Z dot_u8s8_z(Z acc, Z u, Z s) {
#if PTLLM_GGML_VNNI
  return _mm512_dpbusd_epi32(acc, u, s);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}

// In each 128-bit lane, the 4 x 4 transpose of int32s: a[j] <- (a[j], b[j], c[j], d[j]) for j = 0..3.
PTLLM_GGML_TARGET inline void transpose4(Z& a, Z& b, Z& c, Z& d) {
  const Z t0 = _mm512_unpacklo_epi32(a, b), t1 = _mm512_unpackhi_epi32(a, b);
  const Z t2 = _mm512_unpacklo_epi32(c, d), t3 = _mm512_unpackhi_epi32(c, d);
  a = _mm512_unpacklo_epi64(t0, t2);
  b = _mm512_unpackhi_epi64(t0, t2);
  c = _mm512_unpacklo_epi64(t1, t3);
  d = _mm512_unpackhi_epi64(t1, t3);
}

// Four 16-byte pieces at p[4j + i] + off into lane j of the i-th vector: after transpose4 vector k
// holds dword k of row 4j + i at lane 4j + i.
PTLLM_GGML_TARGET inline Z gather_rows(const uint8_t* const* p, int i, size_t off) {
  Z z = _mm512_castsi128_si512(load128(p[i] + off));
  z = _mm512_inserti32x4(z, load128(p[4 + i] + off), 1);
  z = _mm512_inserti32x4(z, load128(p[8 + i] + off), 2);
  return _mm512_inserti32x4(z, load128(p[12 + i] + off), 3);
}

// Block b (at byte o) of rows p[0..15] in registers: the 8 code vectors of the panel layout.
template <GgmlType T>
PTLLM_GGML_TARGET inline void block_codes(const uint8_t* const* p, size_t o, Z* c) {
  if constexpr (T == GgmlType::Q4_0) {
    const Z lo4 = _mm512_set1_epi8(0x0f);
    PTLLM_GGML_UNROLL for (int i = 0; i < 4; ++i) {
      const Z z = gather_rows(p, i, o + 2);
      c[i] = _mm512_and_si512(z, lo4);
      c[4 + i] = _mm512_and_si512(_mm512_srli_epi16(z, 4), lo4);
    }
    transpose4(c[0], c[1], c[2], c[3]);
    transpose4(c[4], c[5], c[6], c[7]);
  } else {
    const Z flip = _mm512_set1_epi8(char(0x80));
    PTLLM_GGML_UNROLL for (int half = 0; half < 2; ++half) {
      PTLLM_GGML_UNROLL for (int i = 0; i < 4; ++i)
        c[4 * half + i] = _mm512_xor_si512(gather_rows(p, i, o + 2 + 16 * size_t(half)), flip);
      transpose4(c[4 * half], c[4 * half + 1], c[4 * half + 2], c[4 * half + 3]);
    }
  }
}

// Rows p[0..15] (blocks of type T) into the panel: codes [nb][8] vectors of 64 bytes, scales [nb][16].
template <GgmlType T>
PTLLM_GGML_TARGET void pack_panel(const uint8_t* const* p, int nb, uint8_t* codes, float* scales) {
  constexpr size_t bytes_per = T == GgmlType::Q8_0 ? 34 : 18;
  for (int b = 0; b < nb; ++b) {
    const size_t o = size_t(b) * bytes_per;
    alignas(32) uint16_t h[kPanelRows];
    for (int r = 0; r < kPanelRows; ++r) std::memcpy(&h[r], p[r] + o, 2);
    _mm512_storeu_ps(scales + size_t(b) * kPanelRows, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h))));
    Z c[8];
    block_codes<T>(p, o, c);
    PTLLM_GGML_UNROLL for (int k = 0; k < 8; ++k) _mm512_storeu_si512(codes + size_t(b) * 512 + 64 * k, c[k]);
  }
}

// One row of x against 16 weight rows p[0..15] (consecutive rows rb bytes apart), the panel
// unpacked block by block in registers and used at once (nothing to reuse it for): the 16 sums, in
// lane order. Reading 16 rows side by side defeats the hardware prefetchers (from memory this ran at
// 0.6x the one-row kernel), so the bytes of the panel kAheadPanels further on are asked for into
// L2, in address order, a few lines a block.
constexpr int kAheadPanels = 4;
template <GgmlType T>
PTLLM_GGML_TARGET FZ panel_gemv(const uint8_t* const* p, size_t rb, int nb, const int8_t* xq, const float* xd,
                                const int32_t* corr) {
  constexpr size_t bytes_per = T == GgmlType::Q8_0 ? 34 : 18;
  constexpr size_t lines = (kPanelRows * bytes_per + 63) / 64;  // a panel's bytes over its blocks
  const uint8_t* ahead = p[0] + size_t(kAheadPanels * kPanelRows) * rb;
  FZ acc = _mm512_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const size_t o = size_t(b) * bytes_per;
    PTLLM_GGML_UNROLL for (size_t j = 0; j < lines; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(ahead + (size_t(b) * lines + j) * 64), _MM_HINT_T1);
    Z c[8];
    block_codes<T>(p, o, c);
    alignas(32) uint16_t h[kPanelRows];
    for (int r = 0; r < kPanelRows; ++r) std::memcpy(&h[r], p[r] + o, 2);
    const FZ s = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h)));
    Z is = _mm512_set1_epi32(corr[b]);
    PTLLM_GGML_UNROLL for (int k = 0; k < 8; ++k) {
      int32_t x4;
      std::memcpy(&x4, xq + 32 * b + 4 * k, 4);
      is = dot_u8s8_z(is, c[k], _mm512_set1_epi32(x4));
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(s, _mm512_set1_ps(xd[b])), acc);
  }
  return acc;
}

// y[t0 + t][r + i] for t < NT, i < 16 NP (the first lanes of `keep`): NP consecutive panels
// against NT rows of x. xs [nb][T]: x's scales, and corr [nb][T]: -o sum x, per block (block-major,
// so a tile's values are adjacent). Each broadcast of x's codes serves the NP panels.
template <int NP, int NT>
PTLLM_GGML_TARGET void panel_tile(const uint8_t* codes, const float* scales, int nb, const GgmlActs& a,
                                  const float* xs, const int32_t* corr, int t0, const float* bias, float* y, int ldy,
                                  int r, const __mmask16* keep) {
  const int8_t* xq[NT];
  FZ acc[NP][NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
    xq[t] = a.q + size_t(t0 + t) * size_t(a.K);
    PTLLM_GGML_UNROLL for (int p = 0; p < NP; ++p) acc[p][t] = _mm512_setzero_ps();
  }
  const size_t T = size_t(a.T), panel_bytes = size_t(nb) * 512, panel_scales = size_t(nb) * kPanelRows;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* w = codes + size_t(b) * 512;
    const int32_t* cb = corr + size_t(b) * T + size_t(t0);
    const float* db = xs + size_t(b) * T + size_t(t0);
    Z is[NP][NT];
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
      const Z c = _mm512_set1_epi32(cb[t]);
      PTLLM_GGML_UNROLL for (int p = 0; p < NP; ++p) is[p][t] = c;
    }
    PTLLM_GGML_UNROLL for (int k = 0; k < 8; ++k) {
      Z wk[NP];
      PTLLM_GGML_UNROLL for (int p = 0; p < NP; ++p) wk[p] = _mm512_loadu_si512(w + size_t(p) * panel_bytes + 64 * k);
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
        int32_t x4;
        std::memcpy(&x4, xq[t] + 32 * b + 4 * k, 4);
        const Z xb = _mm512_set1_epi32(x4);
        PTLLM_GGML_UNROLL for (int p = 0; p < NP; ++p) is[p][t] = dot_u8s8_z(is[p][t], wk[p], xb);
      }
    }
    PTLLM_GGML_UNROLL for (int p = 0; p < NP; ++p) {
      const FZ s = _mm512_loadu_ps(scales + size_t(p) * panel_scales + size_t(b) * kPanelRows);
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
        acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[p][t]), _mm512_mul_ps(s, _mm512_set1_ps(db[t])), acc[p][t]);
    }
  }
  PTLLM_GGML_UNROLL for (int p = 0; p < NP; ++p) {
    const int rp = r + kPanelRows * p;
    const FZ bv = bias ? _mm512_maskz_loadu_ps(keep[p], bias + rp) : _mm512_setzero_ps();
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
      _mm512_mask_storeu_ps(y + size_t(t0 + t) * size_t(ldy) + size_t(rp), keep[p], _mm512_add_ps(acc[p][t], bv));
  }
}

// The last n < N rows of x from t0 on (n >= 1).
template <int NP, int N>
PTLLM_GGML_TARGET void panel_tail(int n, const uint8_t* codes, const float* scales, int nb, const GgmlActs& a,
                                  const float* xs, const int32_t* corr, int t0, const float* bias, float* y, int ldy,
                                  int r, const __mmask16* keep) {
  if constexpr (N > 1) {
    if (n == N - 1) return panel_tile<NP, N - 1>(codes, scales, nb, a, xs, corr, t0, bias, y, ldy, r, keep);
    return panel_tail<NP, N - 1>(n, codes, scales, nb, a, xs, corr, t0, bias, y, ldy, r, keep);
  }
}

// Rows of x per register tile: NP panels x kTileX[NP - 1] rows of x take 2 NP NT of the 32 vector
// registers (the integer and float sums).
constexpr int kTileX[2] = {8, 6};

template <GgmlType T>
PTLLM_GGML_TARGET void tiled_rows_t(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0,
                                    int r1) {
  const int nb = w.cols / 32;
  const size_t rb = w.row_bytes();
  const auto* data = static_cast<const uint8_t*>(w.data);
  // x's scales and -o sum x per block, block-major, and two panels: this thread's, reused across calls.
  thread_local std::vector<uint8_t> codes;
  thread_local std::vector<float> scales;
  if (codes.size() < 2 * size_t(nb) * 512) codes.resize(2 * size_t(nb) * 512);
  if (scales.size() < 2 * size_t(nb) * kPanelRows) scales.resize(2 * size_t(nb) * kPanelRows);
  const BlockTerms bt = block_terms(a, nb, T == GgmlType::Q8_0 ? 128 : 8);
  for (int r = r0; r < r1; r += 2 * kPanelRows) {
    const int nr = std::min(2 * kPanelRows, r1 - r);
    const int np = nr > kPanelRows ? 2 : 1;
    __mmask16 keep[2];
    for (int q = 0; q < np; ++q) {
      const int n = std::min(kPanelRows, nr - q * kPanelRows);
      const uint8_t* p[kPanelRows];
      // A partial panel repeats its last row: lanes are independent, and the extra ones are not stored.
      for (int i = 0; i < kPanelRows; ++i) p[i] = data + size_t(r + q * kPanelRows + std::min(i, n - 1)) * rb;
      pack_panel<T>(p, nb, codes.data() + size_t(q) * size_t(nb) * 512, scales.data() + size_t(q) * size_t(nb) * kPanelRows);
      keep[q] = __mmask16((1u << n) - 1);
    }
    auto run = [&](auto np_tag) {
      constexpr int NP = decltype(np_tag)::value, NT = kTileX[NP - 1];
      int t0 = 0;
      for (; t0 + NT <= a.T; t0 += NT)
        panel_tile<NP, NT>(codes.data(), scales.data(), nb, a, bt.xs, bt.corr, t0, bias, y, w.rows, r, keep);
      if (t0 < a.T)
        panel_tail<NP, NT>(a.T - t0, codes.data(), scales.data(), nb, a, bt.xs, bt.corr, t0, bias, y, w.rows, r,
                           keep);
    };
    if (np == 2)
      run(std::integral_constant<int, 2>{});
    else
      run(std::integral_constant<int, 1>{});
  }
}

template <GgmlType T>
PTLLM_GGML_TARGET void gemv_rows_t(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0,
                                   int r1) {
  const int nb = w.cols / 32;
  const size_t rb = w.row_bytes();
  const auto* data = static_cast<const uint8_t*>(w.data);
  thread_local std::vector<int32_t> corr;
  if (corr.size() < size_t(nb)) corr.resize(size_t(nb));
  constexpr int32_t o = T == GgmlType::Q8_0 ? 128 : 8;
  for (int b = 0; b < nb; ++b) corr[size_t(b)] = -o * (int32_t(a.sums[2 * b]) + int32_t(a.sums[2 * b + 1]));
  for (int r = r0; r < r1; r += kPanelRows) {
    const int n = std::min(kPanelRows, r1 - r);
    const uint8_t* p[kPanelRows];
    for (int i = 0; i < kPanelRows; ++i) p[i] = data + size_t(r + std::min(i, n - 1)) * rb;
    const FZ acc = panel_gemv<T>(p, rb, nb, a.q, a.d, corr.data());
    const __mmask16 keep = __mmask16((1u << n) - 1);
    const FZ bv = bias ? _mm512_maskz_loadu_ps(keep, bias + r) : _mm512_setzero_ps();
    _mm512_mask_storeu_ps(y + size_t(r), keep, _mm512_add_ps(acc, bv));
  }
}

PTLLM_GGML_TARGET void tiled_rows(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0,
                                  int r1) {
  if (a.T == 1) {
    if (w.ggml == GgmlType::Q8_0)
      gemv_rows_t<GgmlType::Q8_0>(w, a, bias, y, r0, r1);
    else
      gemv_rows_t<GgmlType::Q4_0>(w, a, bias, y, r0, r1);
    return;
  }
  if (w.ggml == GgmlType::Q8_0)
    tiled_rows_t<GgmlType::Q8_0>(w, a, bias, y, r0, r1);
  else
    tiled_rows_t<GgmlType::Q4_0>(w, a, bias, y, r0, r1);
}

