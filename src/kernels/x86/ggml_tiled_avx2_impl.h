// The panel product of ggml_tiled_impl.h on 256-bit vectors, for the AVX2 target: Q4_0 against any
// number of rows of x. Eight weight rows a panel (the int32 lanes of a ymm), the same layout per
// block (8 vectors, lane r = codes 4k .. 4k + 3 of row r, the stored nibbles) and the same integer
// start (-8 sum x). Without VNNI a product is vpmaddubsw (nibble x int8 pairs: at most
// 2 * 15 * 127, no saturation) then vpmaddwd by ones; Q8_0's codes + 128 would saturate the pairs,
// so Q8_0 in the file's layout keeps the row-at-a-time kernel (packed: packed_q8_0_tile below). It
// takes one row of x too, though the row-at-a-time kernel is as fast below 5 rows (one core of a
// Zen 4 under the AVX2 target, 2048 x 2048: 0.51 against 0.49 ms at T = 4, 0.56 against 0.67 at
// T = 5, 31 against 64 ms at T = 512): each
// y[t][r] comes from the same operations whatever the batch, its tile or its thread, so a
// speculative verification's rows equal the plain steps' bit for bit.
// Included inside ggml_kernels_impl.h's namespace, after its 256-bit helpers (I, F, load128).

constexpr int kPanelRows8 = 8;
constexpr int kTileX8 = 4;  // rows of x per register tile: 2 x 4 of the 16 vector registers

PTLLM_GGML_TARGET inline bool tiled_takes(GgmlType t, int T) { return T >= 1 && t == GgmlType::Q4_0; }

// In each 128-bit lane, the 4 x 4 transpose of int32s (as ggml_tiled_impl.h's transpose4).
PTLLM_GGML_TARGET inline void transpose4_256(I& a, I& b, I& c, I& d) {
  const I t0 = _mm256_unpacklo_epi32(a, b), t1 = _mm256_unpackhi_epi32(a, b);
  const I t2 = _mm256_unpacklo_epi32(c, d), t3 = _mm256_unpackhi_epi32(c, d);
  a = _mm256_unpacklo_epi64(t0, t2);
  b = _mm256_unpackhi_epi64(t0, t2);
  c = _mm256_unpacklo_epi64(t1, t3);
  d = _mm256_unpackhi_epi64(t1, t3);
}

// Rows p[0..7] of Q4_0 blocks into the panel: codes [nb][8] vectors of 32 bytes, scales [nb][8].
PTLLM_GGML_TARGET void pack_panel8(const uint8_t* const* p, int nb, uint8_t* codes, float* scales) {
  const I lo4 = bytes(0x0f);
  for (int b = 0; b < nb; ++b) {
    const size_t o = size_t(b) * 18;
    alignas(16) uint16_t h[kPanelRows8];
    for (int r = 0; r < kPanelRows8; ++r) std::memcpy(&h[r], p[r] + o, 2);
    _mm256_storeu_ps(scales + size_t(b) * kPanelRows8, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h))));
    I v[4], hi[4];
    PTLLM_GGML_UNROLL for (int i = 0; i < 4; ++i) {  // lane 0: row i, lane 1: row 4 + i
      const I z = _mm256_set_m128i(load128(p[4 + i] + o + 2), load128(p[i] + o + 2));
      v[i] = _mm256_and_si256(z, lo4);
      hi[i] = _mm256_and_si256(_mm256_srli_epi16(z, 4), lo4);
    }
    transpose4_256(v[0], v[1], v[2], v[3]);
    transpose4_256(hi[0], hi[1], hi[2], hi[3]);
    uint8_t* out = codes + size_t(b) * 256;
    PTLLM_GGML_UNROLL for (int k = 0; k < 4; ++k) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * k), v[k]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * (4 + k)), hi[k]);
    }
  }
}

template <int NT>
PTLLM_GGML_TARGET void panel8_tile(const uint8_t* codes, const float* scales, int nb, const GgmlActs& a,
                                   const float* xs, const int32_t* corr, int t0, const float* bias, float* y, int ldy,
                                   int r, int nr) {
  const int8_t* xq[NT];
  F acc[NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
    xq[t] = a.q + size_t(t0 + t) * size_t(a.K);
    acc[t] = _mm256_setzero_ps();
  }
  const size_t T = size_t(a.T);
  const I ones = _mm256_set1_epi16(1);
  for (int b = 0; b < nb; ++b) {
    const uint8_t* w = codes + size_t(b) * 256;
    const int32_t* cb = corr + size_t(b) * T + size_t(t0);
    const float* db = xs + size_t(b) * T + size_t(t0);
    I is[NT];
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) is[t] = _mm256_set1_epi32(cb[t]);
    PTLLM_GGML_UNROLL for (int k = 0; k < 8; ++k) {
      const I wk = load(w + 32 * k);
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
        int32_t x4;
        std::memcpy(&x4, xq[t] + 32 * b + 4 * k, 4);
        is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(_mm256_maddubs_epi16(wk, _mm256_set1_epi32(x4)), ones));
      }
    }
    const F s = _mm256_loadu_ps(scales + size_t(b) * kPanelRows8);
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_mul_ps(s, _mm256_set1_ps(db[t])), acc[t]);
  }
  alignas(32) float out[kPanelRows8];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
    _mm256_store_ps(out, acc[t]);
    float* yt = y + size_t(t0 + t) * size_t(ldy) + size_t(r);
    for (int i = 0; i < nr; ++i) yt[i] = out[i] + (bias ? bias[r + i] : 0.f);
  }
}

PTLLM_GGML_TARGET void tiled_rows(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0,
                                  int r1) {
  const int nb = w.cols / 32;
  const size_t rb = w.row_bytes();
  const auto* data = static_cast<const uint8_t*>(w.data);
  thread_local std::vector<uint8_t> codes;
  thread_local std::vector<float> scales;
  if (codes.size() < size_t(nb) * 256) codes.resize(size_t(nb) * 256);
  if (scales.size() < size_t(nb) * kPanelRows8) scales.resize(size_t(nb) * kPanelRows8);
  const BlockTerms bt = block_terms(a, nb, 8);
  for (int r = r0; r < r1; r += kPanelRows8) {
    const int nr = std::min(kPanelRows8, r1 - r);
    const uint8_t* p[kPanelRows8];
    // A partial panel repeats its last row: lanes are independent, and the extra ones are not stored.
    for (int i = 0; i < kPanelRows8; ++i) p[i] = data + size_t(r + std::min(i, nr - 1)) * rb;
    pack_panel8(p, nb, codes.data(), scales.data());
    int t0 = 0;
    for (; t0 + kTileX8 <= a.T; t0 += kTileX8)
      panel8_tile<kTileX8>(codes.data(), scales.data(), nb, a, bt.xs, bt.corr, t0, bias, y, w.rows, r, nr);
    switch (a.T - t0) {
      case 3: panel8_tile<3>(codes.data(), scales.data(), nb, a, bt.xs, bt.corr, t0, bias, y, w.rows, r, nr); break;
      case 2: panel8_tile<2>(codes.data(), scales.data(), nb, a, bt.xs, bt.corr, t0, bias, y, w.rows, r, nr); break;
      case 1: panel8_tile<1>(codes.data(), scales.data(), nb, a, bt.xs, bt.corr, t0, bias, y, w.rows, r, nr); break;
      default: break;
    }
  }
}

// ---- Q4_0, Q5_0, Q4_1 and Q5_1 packed in 16-row groups (ggml.h, ggml_pack) -------------------------
// A group's 64-byte line c holds 16 rows' dwords: each 32-byte half is 8 rows' bytes 4c .. 4c + 3, so
// one load, a mask and a shift give pack_panel8's vectors c and 4 + c, and each half's 8 scales are
// 16 consecutive bytes of f16. A decode step streams the matrix once, front to back, each line asked
// for kAheadBytes ahead (as the K-quants; a touch every few KiB, kernels/stream.h, measured slower
// here). The products of a block (at most 8 x 2 x 15 x 127 in an int16 lane) are
// summed in int16, then once into int32: exact, so the integer sums and panel8_tile's float
// operations per block are unchanged, and packed and file layouts give the same bits at every count
// of rows of x. Rows [base + lo, base + hi) of the group are stored.
// A packed group's outputs from NT rows of x in two halves of 8 rows (acc[h][t]): y's rows
// [base + lo, base + hi), plus the bias.
// v, opaque to the compiler: a chain of integer adds kept in order. GCC otherwise reassociates a
// block's chains into a tree over all its products, which spills them to the stack.
PTLLM_GGML_TARGET inline I in_order(I v) {
  asm("" : "+x"(v));
  return v;
}

// NH < 2: the halves h0 .. h0 + NH - 1 alone.
template <int NT, int NH = 2>
PTLLM_GGML_TARGET inline void store_halves(const F (&acc)[NH][NT], float* y, int ldy, const float* bias, int t0, int base,
                                           int lo, int hi, int h0 = 0) {
  alignas(32) float out[kPanelRows8];
  PTLLM_GGML_UNROLL for (int hh = 0; hh < NH; ++hh) PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
    const int h = h0 + hh;
    _mm256_store_ps(out, acc[hh][t]);
    float* yt = y + size_t(t0 + t) * size_t(ldy) + size_t(base);
    for (int i = std::max(lo, 8 * h); i < std::min(hi, 8 * h + 8); ++i) yt[i] = out[i - 8 * h] + (bias ? bias[base + i] : 0.f);
  }
}

// acc[h][t] += the block's integer sums is[h][t] times its 8 rows' f16 scales (s16: 16 of them,
// half h from s16 + 8 h) times x's block scale dx[t]: a packed block's one FMA.
template <int NT>
PTLLM_GGML_TARGET inline void scale_halves(F (&acc)[2][NT], const I (&is)[2][NT], const uint8_t* s16, const float* dx) {
  PTLLM_GGML_UNROLL for (int h = 0; h < 2; ++h) {
    const F s = _mm256_cvtph_ps(load128(s16 + 16 * h));
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
      acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[h][t]), _mm256_mul_ps(s, _mm256_set1_ps(dx[t])), acc[h][t]);
  }
}

// tile(grp, base, lo, hi) for each 16-row group of a packed matrix (gb bytes a group) that meets rows
// [r0, r1): its rows [base + lo, base + hi) are those.
template <class Tile>
PTLLM_GGML_TARGET inline void for_packed_groups(const WeightMatrix& w, size_t gb, int r0, int r1, Tile&& tile) {
  for (int g = r0 / kGgmlPackRows; g * kGgmlPackRows < r1; ++g) {
    const int base = g * kGgmlPackRows;
    tile(static_cast<const uint8_t*>(w.data) + size_t(g) * gb, base, std::max(r0, base) - base,
         std::min(r1, base + kGgmlPackRows) - base);
  }
}

// Q5_0: Q4_0's lines with each block's fifth bits before them (ggml.h). Line c's
// low nibbles take bit c of the bits' byte at bit 4, its high nibbles bit 4 + c (16-bit shifts: the
// bit moved stays in its byte). Codes 0..31 times x in int16 pairs (at most 2 * 31 * 127), two
// lines summed (31496) before vpmaddwd, where Q4_0 sums all four; -16 sum x from block_terms.
// Q4_1 and Q5_1: Q4_0's and Q5_0's codes without an offset, and the rows' m times x's block scale
// and sum (block_terms' xm) in a second FMA. A block's integer sum is the AVX-512 VNNI packed
// product's, and so are its float operations: the same bits.
template <GgmlType Ty, int NT>
PTLLM_GGML_TARGET void packed_nibble_tile(const uint8_t* grp, int nb, const GgmlActs& a, const BlockTerms& bt, int t0,
                                          const float* bias, float* y, int ldy, int base, int lo, int hi) {
  constexpr bool kQ5 = with_fifth(Ty), kMin = with_min(Ty);
  constexpr int kLines = kQ5 ? 2 : 4;  // lines summed in int16
  constexpr size_t kUnit = unit32_bytes(Ty);
  const int8_t* xq[NT];
  F acc[2][NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
    xq[t] = a.q + size_t(t0 + t) * size_t(a.K);
    acc[0][t] = acc[1][t] = _mm256_setzero_ps();
  }
  const size_t T = size_t(a.T);
  const I lo4 = bytes(0x0f), b4 = bytes(0x10), ones = _mm256_set1_epi16(1);
  for (int b = 0; b < nb; ++b) {
    const uint8_t* unit = grp + size_t(b / 2) * kUnit;
    const uint8_t* fifth = unit + head32_bytes(Ty) + block32_bytes(Ty) * size_t(b % 2);  // Q5's fifth bits
    const uint8_t* codes = kQ5 ? fifth + 64 : fifth;
    if (NT == 1) ask_ahead<kUnit / 2>(unit + head32_bytes(Ty) + kUnit / 2 * size_t(b % 2));
    const int32_t* cb = bt.corr + size_t(b) * T + size_t(t0);
    I is[2][NT];
    PTLLM_GGML_UNROLL for (int h = 0; h < 2; ++h) PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
      is[h][t] = _mm256_set1_epi32(cb[t]);
    PTLLM_GGML_UNROLL for (int c0 = 0; c0 < 4; c0 += kLines) {
      I s16[2][NT];
      PTLLM_GGML_UNROLL for (int c = c0; c < c0 + kLines; ++c) {
        I wl[2], wh[2];
        PTLLM_GGML_UNROLL for (int h = 0; h < 2; ++h) {
          const I v = load(codes + 64 * c + 32 * h);
          wl[h] = _mm256_and_si256(v, lo4);
          wh[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
          if constexpr (kQ5) {
            const I f = load(fifth + 32 * h);
            wl[h] = _mm256_or_si256(wl[h], _mm256_and_si256(_mm256_slli_epi16(f, 4 - c), b4));
            wh[h] = _mm256_or_si256(wh[h], _mm256_and_si256(_mm256_srli_epi16(f, c), b4));
          }
        }
        PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
          int32_t xl, xh;
          std::memcpy(&xl, xq[t] + 32 * b + 4 * c, 4);
          std::memcpy(&xh, xq[t] + 32 * b + 16 + 4 * c, 4);
          const I bl = _mm256_set1_epi32(xl), bh = _mm256_set1_epi32(xh);
          PTLLM_GGML_UNROLL for (int h = 0; h < 2; ++h) {
            const I p = _mm256_adds_epi16(_mm256_maddubs_epi16(wl[h], bl), _mm256_maddubs_epi16(wh[h], bh));
            s16[h][t] = c == c0 ? p : _mm256_adds_epi16(s16[h][t], p);
          }
        }
      }
      PTLLM_GGML_UNROLL for (int h = 0; h < 2; ++h) PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
        is[h][t] = _mm256_add_epi32(is[h][t], _mm256_madd_epi16(s16[h][t], ones));
    }
    scale_halves<NT>(acc, is, unit + 32 * (b % 2), bt.xs + size_t(b) * T + size_t(t0));
    if constexpr (kMin) {
      const float* mb = bt.xm + size_t(b) * T + size_t(t0);
      PTLLM_GGML_UNROLL for (int h = 0; h < 2; ++h) {
        const F m = _mm256_cvtph_ps(load128(unit + 64 + 32 * (b % 2) + 16 * h));
        PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) acc[h][t] = _mm256_fmadd_ps(m, _mm256_set1_ps(mb[t]), acc[h][t]);
      }
    }
  }
  store_halves<NT>(acc, y, ldy, bias, t0, base, lo, hi);
}

// Rows [r0, r1) of a packed Q4_0, Q5_0, Q4_1 or Q5_1 matrix: a group at a time against pairs of rows
// of x (the group's bytes, 16 x 18 to 24 a block, read from memory once and then from L1/L2).
template <GgmlType Ty>
PTLLM_GGML_TARGET void packed_nibble_rows(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0,
                                          int r1) {
  const int nb = w.cols / 32;
  const size_t gb = size_t(nb / 2) * unit32_bytes(Ty);
  const BlockTerms bt = block_terms(a, nb, code_offset(Ty), with_min(Ty));
  for_packed_groups(w, gb, r0, r1, [&](const uint8_t* grp, int base, int lo, int hi) {
    int t0 = 0;
    for (; t0 + 2 <= a.T; t0 += 2) packed_nibble_tile<Ty, 2>(grp, nb, a, bt, t0, bias, y, w.rows, base, lo, hi);
    if (t0 < a.T) packed_nibble_tile<Ty, 1>(grp, nb, a, bt, t0, bias, y, w.rows, base, lo, hi);
  });
}

// ---- Q8_0 packed in 16-row groups --------------------------------------------------------------
// The same 64-byte lines (ggml.h: a block's line k holds the 16 rows' values 4k .. 4k + 3, stored
// + 128), read as two halves of 8 rows. The codes turn signed again (xor 0x80) and meet x as
// llama.cpp's AVX2 Q8_0 product does: |c| times x with c's sign, vpmaddubsw (pairs at most
// 2 * 128 * 127), vpmaddwd by ones. A block's integer sum is the AVX-512 packed product's (there:
// corr + the sum of the stored codes times x), and so are its float operations: the same bits.
template <int NT>
PTLLM_GGML_TARGET void packed_q8_0_tile(const uint8_t* grp, int nb, const GgmlActs& a, int t0, const float* bias,
                                        float* y, int ldy, int base, int lo, int hi) {
  constexpr size_t kUnit = unit32_bytes(GgmlType::Q8_0);
  const Rows<NT> x(a, t0);  // x's codes x.q[t], block scales x.d[t][b]
  F acc[2][NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) acc[0][t] = acc[1][t] = _mm256_setzero_ps();
  const I flip = bytes(char(0x80)), ones = _mm256_set1_epi16(1);
  for (int b = 0; b < nb; ++b) {
    const uint8_t* unit = grp + size_t(b / 2) * kUnit;
    const uint8_t* codes = unit + 64 + 512 * size_t(b % 2);
    if (NT == 1) ask_ahead<kUnit / 2>(unit + kUnit / 2 * size_t(b % 2));  // the whole unit, in halves
    I is[2][NT];
    PTLLM_GGML_UNROLL for (int k = 0; k < 8; ++k) {
      I c[2], ac[2];
      PTLLM_GGML_UNROLL for (int h = 0; h < 2; ++h) {
        c[h] = _mm256_xor_si256(load(codes + 64 * k + 32 * h), flip);
        ac[h] = _mm256_sign_epi8(c[h], c[h]);
      }
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
        int32_t x4;
        std::memcpy(&x4, x.q[t] + 32 * b + 4 * k, 4);
        const I xb = _mm256_set1_epi32(x4);
        PTLLM_GGML_UNROLL for (int h = 0; h < 2; ++h) {
          const I p = _mm256_madd_epi16(_mm256_maddubs_epi16(ac[h], _mm256_sign_epi8(xb, c[h])), ones);
          is[h][t] = k == 0 ? p : in_order(_mm256_add_epi32(is[h][t], p));
        }
      }
    }
    float dx[NT];
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) dx[t] = x.d[t][b];
    scale_halves<NT>(acc, is, unit + 32 * (b % 2), dx);
  }
  store_halves<NT>(acc, y, ldy, bias, t0, base, lo, hi);
}

// Rows [r0, r1) of a packed Q8_0 matrix: a group at a time against tiles of 4 rows of x (the group's
// bytes, 16 x 34 a block, read from memory once and then from L1/L2).
PTLLM_GGML_TARGET void packed_q8_0_rows(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0,
                                        int r1) {
  const int nb = w.cols / 32;
  const size_t gb = size_t(nb / 2) * unit32_bytes(GgmlType::Q8_0);
  for_packed_groups(w, gb, r0, r1, [&](const uint8_t* grp, int base, int lo, int hi) {
    int t0 = 0;
    for (; t0 + 4 <= a.T; t0 += 4) packed_q8_0_tile<4>(grp, nb, a, t0, bias, y, w.rows, base, lo, hi);
    switch (a.T - t0) {
      case 3: packed_q8_0_tile<3>(grp, nb, a, t0, bias, y, w.rows, base, lo, hi); break;
      case 2: packed_q8_0_tile<2>(grp, nb, a, t0, bias, y, w.rows, base, lo, hi); break;
      case 1: packed_q8_0_tile<1>(grp, nb, a, t0, bias, y, w.rows, base, lo, hi); break;
      default: break;
    }
  });
}

// ---- Q4_K, Q5_K and Q6_K packed in 16-row groups --------------------------------------------------
// The AVX-512 VNNI packed layouts (ggml.h) read by halves of 8 rows. Each block's integer sums are
// the AVX-512 kernels' (exact, in another order) and so are its float operations: the same bits,
// whatever the count of rows of x. NH halves per pass from h0: decode streams both, prefill one at a
// time against more rows of x (16 registers). Sub-block and group loops are not unrolled: a block's
// whole code spilled the sums to the stack. Saturating int16 adds (the sums stay below 2^15) are
// not reassociated: kept in order, as in_order's.

// Q4_K (per block the 16 rows' d, dmin, sub-block scales, mins in pairs, then per sub-block j four
// 64-byte lines, line c holding in row i's dword the nibbles of values 32j + 8c .. + 7): acc gets
// - dmin d8 sum_j m_j sum_j(x) first (as the AVX-512 kernel), isum the codes' sums. A sub-block's
// nibble x int8 products are summed in int16 (8 vpmaddubsw pairs of at most 2 * 15 * 127: 30480),
// then once into int32 times its scale (vpmaddwd). Q5_K: each line's fifth bits (the 64 bytes before
// the sub-block's lines) ORed in at bit 4, codes 0..31: two lines' pairs (at most 31496) a vpmaddwd.
template <bool kFive, int NT, int NH>
[[gnu::always_inline]] PTLLM_GGML_TARGET inline void k45_block(const uint8_t* blk, const Rows<NT>& x, int b, int h0,
                                                               F (&acc)[NH][NT], I (&isum)[NH][NT]) {
  constexpr int kBytes = kFive ? kQ5KPacked : kQ4KPacked, kLines = kFive ? 2 : 4;
  const I lo4 = bytes(0x0f), b4 = bytes(0x10);
  // x's sums of 32 as int16 pairs (sub-blocks 2p, 2p + 1) in dword p (p < 2) or 2 + p (vphaddw keeps
  // 128-bit lanes), against each row's pair of mins.
  I s32[NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
    const I s = load(x.s[t] + 16 * b);
    s32[t] = _mm256_hadd_epi16(s, s);
  }
  PTLLM_GGML_UNROLL for (int h = 0; h < NH; ++h) {
    I mp[4];
    PTLLM_GGML_UNROLL for (int p = 0; p < 4; ++p) mp[p] = _mm256_cvtepu8_epi16(load128(blk + 192 + 32 * p + 16 * (h0 + h)));
    const F dm = _mm256_cvtph_ps(load128(blk + 32 + 16 * (h0 + h)));
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
      I m = _mm256_setzero_si256();
      PTLLM_GGML_UNROLL for (int p = 0; p < 4; ++p)
        m = _mm256_add_epi32(m, _mm256_madd_epi16(mp[p], _mm256_permutevar8x32_epi32(s32[t], _mm256_set1_epi32(p % 2 + 4 * (p / 2)))));
      acc[h][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dm, _mm256_set1_ps(x.d[t][b])), acc[h][t]);
      isum[h][t] = _mm256_setzero_si256();
    }
  }
  _Pragma("GCC unroll 1") for (int j = 0; j < 8; ++j) {
    if (NT == 1) ask_ahead<kBytes / 8>(blk + kBytes / 8 * j);
    const uint8_t* lines = blk + k45_lines(kFive, j);
    I scp[NH];
    PTLLM_GGML_UNROLL for (int h = 0; h < NH; ++h) {
      const I sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 64 + 16 * j + 8 * (h0 + h))));
      scp[h] = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));  // the scale in both int16 halves
    }
    PTLLM_GGML_UNROLL for (int c0 = 0; c0 < 4; c0 += kLines) {
      I s16[NH][NT];
      PTLLM_GGML_UNROLL for (int c = c0; c < c0 + kLines; ++c) {
        I w0[NH], w1[NH];
        PTLLM_GGML_UNROLL for (int h = 0; h < NH; ++h) {
          const I w = load(lines + 64 * c + 32 * (h0 + h));
          w0[h] = _mm256_and_si256(w, lo4);
          w1[h] = _mm256_and_si256(_mm256_srli_epi16(w, 4), lo4);
          if constexpr (kFive) {
            const I f = load(lines - 64 + 32 * (h0 + h));
            w0[h] = _mm256_or_si256(w0[h], _mm256_and_si256(_mm256_slli_epi16(f, 4 - c), b4));
            w1[h] = _mm256_or_si256(w1[h], _mm256_and_si256(_mm256_srli_epi16(f, c), b4));
          }
        }
        PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
          int32_t q0, q1;
          std::memcpy(&q0, x.q[t] + 256 * b + 32 * j + 8 * c, 4);
          std::memcpy(&q1, x.q[t] + 256 * b + 32 * j + 8 * c + 4, 4);
          const I x0 = _mm256_set1_epi32(q0), x1 = _mm256_set1_epi32(q1);
          PTLLM_GGML_UNROLL for (int h = 0; h < NH; ++h) {
            const I p = _mm256_adds_epi16(_mm256_maddubs_epi16(w0[h], x0), _mm256_maddubs_epi16(w1[h], x1));
            s16[h][t] = c == c0 ? p : _mm256_adds_epi16(s16[h][t], p);
          }
        }
      }
      PTLLM_GGML_UNROLL for (int h = 0; h < NH; ++h) PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
        isum[h][t] = _mm256_add_epi32(isum[h][t], _mm256_madd_epi16(s16[h][t], scp[h]));
    }
  }
}

// 8 rows' int8 scales from p and from q as int16 pairs (p[i], q[i]), one a dword.
PTLLM_GGML_TARGET inline I scale_pairs(const uint8_t* p, const uint8_t* q) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}

// Q6_K (per block the 16 rows' d and 16 scales, then per 16-value group three 64-byte lines: the
// low nibbles of values 0-3 and 4-7, of 8-11 and 12-15, and their top two bits): isum gets the
// block's sum. Codes 0..63 times x in int16 pairs (at most 2 * 63 * 127), two pairs summed (32004)
// before vpmaddwd by the group's scale; the -32 offset from x's sums of 16, groups by pairs.
template <int NT, int NH>
[[gnu::always_inline]] PTLLM_GGML_TARGET inline void q6k_block(const uint8_t* blk, const Rows<NT>& x, int b, int h0,
                                                               I (&isum)[NH][NT]) {
  const I lo4 = bytes(0x0f), hi2 = bytes(0x30);
  PTLLM_GGML_UNROLL for (int h = 0; h < NH; ++h) PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
    isum[h][t] = _mm256_setzero_si256();
  PTLLM_GGML_UNROLL for (int p = 0; p < 8; ++p) PTLLM_GGML_UNROLL for (int h = 0; h < NH; ++h) {
    const uint8_t* sc = blk + 32 + 32 * p + 8 * (h0 + h);
    const I sp = scale_pairs(sc, sc + 16);
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
      int32_t s2;
      std::memcpy(&s2, x.s[t] + 16 * b + 2 * p, 4);
      isum[h][t] = _mm256_add_epi32(isum[h][t], _mm256_madd_epi16(sp, _mm256_set1_epi32(s2)));
    }
  }
  PTLLM_GGML_UNROLL for (int h = 0; h < NH; ++h) PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
    isum[h][t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(isum[h][t], 5));
  _Pragma("GCC unroll 1") for (int g = 0; g < 16; ++g) {
    if (NT == 1) ask_ahead<kQ6KPacked / 16>(blk + kQ6KPacked / 16 * g);
    I w[NH][4], scp[NH];
    PTLLM_GGML_UNROLL for (int h = 0; h < NH; ++h) {
      const uint8_t* c = blk + 288 + 192 * g + 32 * (h0 + h);
      const I A = load(c), B = load(c + 64), H = load(c + 128);
      w[h][0] = _mm256_or_si256(_mm256_and_si256(A, lo4), _mm256_and_si256(_mm256_slli_epi16(H, 4), hi2));
      w[h][1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), lo4), _mm256_and_si256(_mm256_slli_epi16(H, 2), hi2));
      w[h][2] = _mm256_or_si256(_mm256_and_si256(B, lo4), _mm256_and_si256(H, hi2));
      w[h][3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), lo4), _mm256_and_si256(_mm256_srli_epi16(H, 2), hi2));
      const uint8_t* sc = blk + 32 + 16 * g + 8 * (h0 + h);
      scp[h] = scale_pairs(sc, sc);
    }
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
      I xb[4];
      PTLLM_GGML_UNROLL for (int k = 0; k < 4; ++k) {
        int32_t x4;
        std::memcpy(&x4, x.q[t] + 256 * b + 16 * g + 4 * k, 4);
        xb[k] = _mm256_set1_epi32(x4);
      }
      PTLLM_GGML_UNROLL for (int h = 0; h < NH; ++h) {
        const I p01 = _mm256_adds_epi16(_mm256_maddubs_epi16(w[h][0], xb[0]), _mm256_maddubs_epi16(w[h][1], xb[1]));
        const I p23 = _mm256_adds_epi16(_mm256_maddubs_epi16(w[h][2], xb[2]), _mm256_maddubs_epi16(w[h][3], xb[3]));
        isum[h][t] = _mm256_add_epi32(_mm256_add_epi32(isum[h][t], _mm256_madd_epi16(p01, scp[h])),
                                      _mm256_madd_epi16(p23, scp[h]));
      }
    }
  }
}

// A packed Q4_K, Q5_K or Q6_K group against NT rows of x from t0: per block the type's integer sums, then
// one FMA by the rows' d (the first 32 bytes of either block) and x's block scale.
template <GgmlType Ty, int NT, int NH>
PTLLM_GGML_TARGET void packed_k_tile(const uint8_t* grp, int nb, const GgmlActs& a, int t0, int h0, const float* bias,
                                     float* y, int ldy, int base, int lo, int hi) {
  const Rows<NT> x(a, t0);
  F acc[NH][NT];
  PTLLM_GGML_UNROLL for (int h = 0; h < NH; ++h) PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
    acc[h][t] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = grp + size_t(b) * size_t(k_block_bytes(Ty));
    I isum[NH][NT];
    if constexpr (Ty == GgmlType::Q6_K)
      q6k_block<NT, NH>(blk, x, b, h0, isum);
    else
      k45_block<Ty == GgmlType::Q5_K, NT, NH>(blk, x, b, h0, acc, isum);
    PTLLM_GGML_UNROLL for (int h = 0; h < NH; ++h) {
      const F dv = _mm256_cvtph_ps(load128(blk + 16 * (h0 + h)));
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
        acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[h][t]), _mm256_mul_ps(dv, _mm256_set1_ps(x.d[t][b])), acc[h][t]);
    }
  }
  store_halves<NT, NH>(acc, y, ldy, bias, t0, base, lo, hi, h0);
}

// Rows [r0, r1) of a packed Q4_K, Q5_K or Q6_K matrix: decode reads a group's two halves in one pass (one
// stream), prefill each half against tiles of 4 rows of x (a group's blocks read from memory once,
// then from L1/L2).
template <GgmlType Ty>
PTLLM_GGML_TARGET void packed_k_rows(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0,
                                     int r1) {
  const int nb = w.cols / 256;
  const size_t gb = size_t(nb) * size_t(k_block_bytes(Ty));
  for_packed_groups(w, gb, r0, r1, [&](const uint8_t* grp, int base, int lo, int hi) {
    if (a.T == 1) return packed_k_tile<Ty, 1, 2>(grp, nb, a, 0, 0, bias, y, w.rows, base, lo, hi);
    for (int h = lo / 8; h < (hi + 7) / 8; ++h) {
      int t0 = 0;
      for (; t0 + 4 <= a.T; t0 += 4) packed_k_tile<Ty, 4, 1>(grp, nb, a, t0, h, bias, y, w.rows, base, lo, hi);
      switch (a.T - t0) {
        case 3: packed_k_tile<Ty, 3, 1>(grp, nb, a, t0, h, bias, y, w.rows, base, lo, hi); break;
        case 2: packed_k_tile<Ty, 2, 1>(grp, nb, a, t0, h, bias, y, w.rows, base, lo, hi); break;
        case 1: packed_k_tile<Ty, 1, 1>(grp, nb, a, t0, h, bias, y, w.rows, base, lo, hi); break;
        default: break;
      }
    }
  });
}
