// The affine (MLX-layout) products written once over a traits type V and compiled once per SIMD
// target (affine_<target>.cpp define PTLLM_AFFINE_TARGET and V, then include this file; everything
// here has internal linkage). Layouts and error bound: kernels/affine.h.
//
// V provides: I (an integer register of RB bytes, L = RB / 4 int32 lanes), F (L floats); zero_i,
// load_i (any address), load_i_n (the first n bytes, zeros after), bcst32 (one dword to every lane),
// srl32 (shift right each lane), and_i, add_i, set1_u8; dot4 / dot8 (acc[l] += sum of the 4 byte
// products of lane l, unsigned codes below 64 / 256 times signed int8); with 8 or 16 lanes (the
// packed product) also sll32, sra32 (arithmetic) and or_i; cvt (int32 to float), zero_f,
// load_f(_n), store_f(_n), set1_f, mul, fma (a * b + c), perm (lanes of a picked by idx),
// reduce_add; load_bf16_n / load_f16_n (the first n of 16-bit floats, as float32); GTT (rows of x
// sharing each unpacked weight register); optionally transpose_dwords (the gemm's tile packing).
#ifndef PTLLM_AFFINE_TARGET
#error "define PTLLM_AFFINE_TARGET before including affine_impl.h"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "kernels/affine.h"
#include "kernels/affine_q8.h"
#include "kernels/stream.h"

namespace ptllm {
namespace {

#if defined(__clang__)
#define PTLLM_AFFINE_UNROLL _Pragma("unroll")
#else
#define PTLLM_AFFINE_UNROLL _Pragma("GCC unroll 16")
#endif

template <class V>
struct AffineKernels {
  using I = typename V::I;
  using F = typename V::F;
  static constexpr int RB = V::RB, L = RB / 4, GTT = V::GTT;
  // gemm: columns of a packed weight tile (a tile: L weight rows, one a lane).
  static constexpr int KC = 512;
  // The packed product (kernels/affine.h): a 16-row group's dwords q of its rows are a line of
  // kLine bytes, read in H registers of L rows (16 or 8 lanes; narrower registers take none).
  static constexpr int kLine = kAffinePackRows * 4, H = kAffinePackRows / L;
  static constexpr bool kPacked = L == kAffinePackRows || 2 * L == kAffinePackRows;
  // Decode's packed stream: each line asked for this far ahead (V::kPackedLineAhead; the targets
  // with packed products, AVX2 and AVX-512, set it: a touch alone left the 4-bit stream well below
  // the read rate), and with V::kPackedTouch the page past those touched too (kernels/stream.h).
  static constexpr size_t kPackedLineAhead = [] {
    if constexpr (requires { V::kPackedLineAhead; })
      return size_t(V::kPackedLineAhead);
    else
      return size_t(0);
  }();
  static constexpr bool kPackedTouch = [] {
    if constexpr (requires { V::kPackedTouch; })
      return V::kPackedTouch;
    else
      return false;
  }();
  static_assert(!kPacked || kPackedLineAhead > 0, "a packed product asks for its stream ahead");

  // Scales and biases of a row by group index, as float32.
  struct LdF32 {
    PTLLM_AFFINE_TARGET static F load_n(const void* p, size_t i, int n) {
      return V::load_f_n(static_cast<const float*>(p) + i, n);
    }
  };
  struct LdBF16 {
    PTLLM_AFFINE_TARGET static F load_n(const void* p, size_t i, int n) {
      return V::load_bf16_n(static_cast<const uint16_t*>(p) + i, n);
    }
  };
  struct LdF16 {
    PTLLM_AFFINE_TARGET static F load_n(const void* p, size_t i, int n) {
      return V::load_f16_n(static_cast<const uint16_t*>(p) + i, n);
    }
  };
  // A row's scales and biases (G groups from index o) as float32 into s and b, each followed by L
  // zeros: the gemv then loads L of them from any group with one plain load. Converting them in the
  // chunk loop went through a small copy on the stack each time, whose reload waited on the stores.
  static void row_params(const WeightMatrix& w, size_t o, int G, float* s, float* b) {
    const size_t es = dtype_size(w.dtype);
    convert_to_f32(w.dtype, static_cast<const uint8_t*>(w.scales) + o * es, s, size_t(G));
    convert_to_f32(w.dtype, static_cast<const uint8_t*>(w.biases) + o * es, b, size_t(G));
    std::fill_n(s + G, L, 0.f);
    std::fill_n(b + G, L, 0.f);
  }

  template <int BITS>
  PTLLM_AFFINE_TARGET static I dot(I acc, I codes, I q) {
    if constexpr (BITS == 8)
      return V::dot8(acc, codes, q);
    else
      return V::dot4(acc, codes, q);
  }
  // Whether the gemv and gemm sum 8-bit codes minus m = 128 (V::dot8c, where V's unsigned-times-
  // signed byte products would take two steps for codes to 255): their group terms then add
  // s_g m xs_g in place of s_g xc_g, the same sum (affine_q8.h: xc_g = m (xs_g - sum_b d_b qsum_b)).
  static constexpr bool centred8() {
    if constexpr (requires { V::kCentred8; })
      return V::kCentred8;
    else
      return false;
  }
  static constexpr float kMid8 = 128.f;  // m of 8-bit codes
  // Whether V multiplies bytes into 16-bit sums of pairs (V::mul_pairs, add16, widen16; targets
  // without a byte dot product into 32 bits), so that several products are added before widening.
  static constexpr bool i16_sums() {
    return requires(I a) { V::widen16(V::add16(V::mul_pairs(a, a), a)); };
  }
  template <int BITS>
  PTLLM_AFFINE_TARGET static I dot_c(I acc, I codes, I q) {
    if constexpr (BITS == 8 && centred8())
      return V::dot8c(acc, codes, q);
    else
      return dot<BITS>(acc, codes, q);
  }
  // A register of packed codes -> KPB registers of one code a byte: u[s] holds the codes at bits
  // [s * BITS, (s + 1) * BITS) of each byte (affine_q8.h, "split order").
  template <int BITS>
  PTLLM_AFFINE_TARGET static void unpack(I z, I* u) {
    if constexpr (BITS == 8) {
      u[0] = z;
    } else {
      const I m = V::set1_u8(uint8_t((1u << BITS) - 1u));
      PTLLM_AFFINE_UNROLL for (int s = 0; s < 8 / BITS; ++s) u[s] = V::and_i(s == 0 ? z : V::srl32(z, BITS * s), m);
    }
  }
  // sum_g s_g xc_g + b_g xs_g over the row's groups, added lane-wise to acc (affine_q8.h).
  // s, b: the row's (row_params); kCentred: codes centred, kMid8 xs_g in xc_g's place.
  template <bool kCentred>
  PTLLM_AFFINE_TARGET static F group_terms(int G, const float* s, const float* b, const float* xs, const float* xc,
                                           F acc) {
    for (int g = 0; g < G; g += L) {
      const int n = std::min(L, G - g);
      const F xsv = V::load_f_n(xs + g, n);
      const F xcv = kCentred ? V::mul(V::set1_f(kMid8), xsv) : V::load_f_n(xc + g, n);
      acc = V::fma(V::load_f(s + g), xcv, V::fma(V::load_f(b + g), xsv, acc));
    }
    return acc;
  }

  // ---- gemv: rows [t0, t0 + TT) of x against weight rows [r0, r1), the codes read in place -----
  // A chunk is RB bytes of a row (C = RB * KPB columns, x in the gemv's split order): unpacked into
  // KPB registers, each dotted with its RB bytes of x; lane l then holds the sum of one block of x
  // (didx) within one group (sidx), scaled by both. NR weight rows are taken at a time (4 for one row
  // of x: decode), so each chunk of x's codes and block scales is loaded once for them; a row's sum
  // is taken in the same order whatever NR. gemv_chunk: chunk c of rows i < NR (codes z[i], the
  // float scales sc[i] of row_params), acc[i * TT + t].
  template <int BITS, int TT, int NR>
  PTLLM_AFFINE_TARGET static void gemv_chunk(const AffineX& x, int t0, const I* z, const float* const* sc, int c,
                                             int gsh, I didx, I sidx, F* acc) {
    constexpr int KPB = 8 / BITS, C = RB * KPB;
    I u[NR][KPB];
    F sl[NR];
    PTLLM_AFFINE_UNROLL for (int i = 0; i < NR; ++i) {
      unpack<BITS>(z[i], u[i]);
      sl[i] = V::perm(V::load_f(sc[i] + ((c * C) >> gsh)), sidx);
    }
    PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t) {
      const int8_t* q = x.q + size_t(t0 + t) * x.ldq + size_t(c) * C;
      I xq[KPB];
      PTLLM_AFFINE_UNROLL for (int s = 0; s < KPB; ++s) xq[s] = V::load_i(q + s * RB);
      const F dl = V::perm(V::load_f(x.d + size_t(t0 + t) * x.ldd + size_t(c * C / kQ8Block)), didx);
      PTLLM_AFFINE_UNROLL for (int i = 0; i < NR; ++i) {
        I ai = V::zero_i();
        PTLLM_AFFINE_UNROLL for (int s = 0; s < KPB; ++s) ai = dot_c<BITS>(ai, u[i][s], xq[s]);
        acc[i * TT + t] = V::fma(V::cvt(ai), V::mul(dl, sl[i]), acc[i * TT + t]);
      }
    }
  }
  // Rows [r0, r1) in steps of NR, the rows left one at a time.
  template <int BITS, int TT, int NR = 1>
  PTLLM_AFFINE_TARGET static void gemv_rows(const AffineX& x, int t0, const WeightMatrix& w, const float* bias,
                                            float* y, int r0, int r1) {
    constexpr int KPB = 8 / BITS;
    const size_t rb = w.row_bytes();
    const int full = int(rb / RB), gs = w.group_size, gsh = __builtin_ctz(unsigned(gs)), G = w.cols >> gsh;
    alignas(64) int32_t di[L], si[L];
    for (int l = 0; l < L; ++l) di[l] = 4 * KPB * l / kQ8Block, si[l] = (4 * KPB * l) >> gsh;
    const I didx = V::load_i(di), sidx = V::load_i(si);
    const int tail = int(rb - size_t(full) * RB);  // bytes of a last, narrower chunk
    const size_t pn = size_t(G + L);  // a row's floats in params: scales, then biases
    thread_local std::vector<float> params;
    if (params.size() < 2 * NR * pn) params.resize(2 * NR * pn);
    // NR rows are read side by side, so each row's stream goes on in the row NR further: asked for
    // there (at least kAhead on), not in the next rows, which are being read.
    const size_t ahead = std::max(kAhead, NR * rb);
    int r = r0;
    for (; r + NR <= r1; r += NR) {
      const uint8_t* row[NR];
      const float* sc[NR];
      PTLLM_AFFINE_UNROLL for (int i = 0; i < NR; ++i) {
        row[i] = static_cast<const uint8_t*>(w.data) + size_t(r + i) * rb;
        float* p = params.data() + 2 * size_t(i) * pn;
        row_params(w, size_t(r + i) * size_t(G), G, p, p + pn);
        sc[i] = p;
      }
      F acc[NR * TT];
      PTLLM_AFFINE_UNROLL for (int j = 0; j < NR * TT; ++j) acc[j] = V::zero_f();
      I z[NR];
      for (int c = 0; c < full; ++c) {
        PTLLM_AFFINE_UNROLL for (int i = 0; i < NR; ++i) {
          const uint8_t* p = row[i] + size_t(c) * RB;
          PTLLM_AFFINE_UNROLL for (int b = 0; b < RB; b += 64) __builtin_prefetch(p + b + ahead);
          z[i] = V::load_i(p);
        }
        gemv_chunk<BITS, TT, NR>(x, t0, z, sc, c, gsh, didx, sidx, acc);
      }
      if (tail > 0) {
        PTLLM_AFFINE_UNROLL for (int i = 0; i < NR; ++i) z[i] = V::load_i_n(row[i] + size_t(full) * RB, tail);
        gemv_chunk<BITS, TT, NR>(x, t0, z, sc, full, gsh, didx, sidx, acc);
      }
      PTLLM_AFFINE_UNROLL for (int i = 0; i < NR; ++i) PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t) {
        const size_t xt = size_t(t0 + t) * x.ldg;
        const F a = group_terms<BITS == 8 && centred8()>(G, sc[i], sc[i] + pn, x.xs + xt, x.xc + xt, acc[i * TT + t]);
        y[size_t(t0 + t) * size_t(w.rows) + size_t(r + i)] = V::reduce_add(a) + (bias ? bias[r + i] : 0.f);
      }
    }
    if constexpr (NR > 1)
      if (r < r1) gemv_rows<BITS, TT, 1>(x, t0, w, bias, y, r, r1);
  }
  template <int BITS>
  PTLLM_AFFINE_TARGET static void gemv_t(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0,
                                         int r1) {
    if (x.T == 1) return gemv_rows<BITS, 1, 4>(x, 0, w, bias, y, r0, r1);
    // A few rows of x: every tile of x over kGemvBlockRows weight rows before the next ones, so the
    // weights are read from memory once (a row's sum does not depend on the tiling).
    for (int rb = r0; rb < r1; rb += kGemvBlockRows) {
      const int re = std::min(r1, rb + kGemvBlockRows);
      int t = 0;
      for (; t + GTT <= x.T; t += GTT) gemv_rows<BITS, GTT>(x, t, w, bias, y, rb, re);
      for (; t + 2 <= x.T; t += 2) gemv_rows<BITS, 2>(x, t, w, bias, y, rb, re);
      if (t < x.T) gemv_rows<BITS, 1>(x, t, w, bias, y, rb, re);
    }
  }

  // ---- gemm: tiles of L weight rows x KC columns, one row a lane, reused by every row of x -------
  // The tile holds the packed codes as stored, transposed by dwords: tile[q][i] = dword q of the
  // tile's columns of row i (a thread's L1-sized buffer, never more). A block of 32 columns is
  // BITS dwords a row; each, unpacked, meets one dword of x broadcast (x in the per-block split
  // order, chunk 32), so lane i sums a whole block of row i: one scaling per block and row of x.
  struct alignas(64) Tile {
    uint32_t code[KC / kQ8Block * 8][L];  // [dword][row]
    float scale[KC / kQ8Block][L];        // [group][row]
    float bias[KC / kQ8Block][L];
  };
  // One tile a thread, whatever the bits and dtype (thread-local storage, no allocation).
  static Tile& tile_buffer() {
    static thread_local Tile t;
    return t;
  }
  // out[q][i] = dword q of rows[i] (null: 0), q < n: V::transpose_dwords where the target has
  // one (16 x 16 in registers), else one dword at a time.
  PTLLM_AFFINE_TARGET static void transpose_dwords(const uint8_t* const* rows, int n, uint32_t (*out)[L]) {
    if constexpr (requires { V::transpose_dwords(rows, n, out); }) {
      V::transpose_dwords(rows, n, out);
    } else {
      for (int i = 0; i < L; ++i)
        for (int q = 0; q < n; ++q) {
          uint32_t v = 0;
          if (rows[i]) std::memcpy(&v, rows[i] + 4 * q, 4);
          out[q][i] = v;
        }
    }
  }
  template <int BITS, class Ld>
  PTLLM_AFFINE_TARGET static void gemm_t(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0,
                                         int r1) {
    Tile& tile = tile_buffer();
    const size_t rb = w.row_bytes();
    const int K = w.cols, gsh = __builtin_ctz(unsigned(w.group_size)), G = K >> gsh;
    for (int jr = r0; jr < r1; jr += L) {
      const int nr = std::min(L, r1 - jr);
      for (int k0 = 0; k0 < K; k0 += KC) {
        const int kc = std::min(KC, K - k0), nq = kc / kQ8Block * BITS, ng = kc >> gsh;
        const uint8_t* rows[L];  // rows past nr: null (zeros)
        for (int i = 0; i < L; ++i)
          rows[i] = i < nr ? static_cast<const uint8_t*>(w.data) + size_t(jr + i) * rb + size_t(k0) * BITS / 8 : nullptr;
        transpose_dwords(rows, nq, tile.code);
        // Scales and biases: each row's as float32 (L groups at a time), then transposed the same way.
        for (int g = 0; g < ng; g += L) {
          const int n = std::min(L, ng - g);
          alignas(64) float s[L][L], b[L][L];
          const uint8_t *sr[L], *br[L];
          for (int i = 0; i < L; ++i) {
            const size_t at = size_t(jr + std::min(i, nr - 1)) * size_t(G) + size_t((k0 >> gsh) + g);
            V::store_f(s[i], Ld::load_n(w.scales, at, n));
            V::store_f(b[i], Ld::load_n(w.biases, at, n));
            sr[i] = i < nr ? reinterpret_cast<const uint8_t*>(s[i]) : nullptr;
            br[i] = i < nr ? reinterpret_cast<const uint8_t*>(b[i]) : nullptr;
          }
          transpose_dwords(sr, n, reinterpret_cast<uint32_t(*)[L]>(tile.scale[g]));
          transpose_dwords(br, n, reinterpret_cast<uint32_t(*)[L]>(tile.bias[g]));
        }
        int t = 0;
        for (; t + GTT <= x.T; t += GTT) gemm_block<BITS, GTT>(tile, x, t, w, bias, y, jr, nr, k0, kc);
        for (; t < x.T; ++t) gemm_block<BITS, 1>(tile, x, t, w, bias, y, jr, nr, k0, kc);
      }
    }
  }
  // Rows [t0, t0 + TT) of x against the packed tile (columns [k0, k0 + kc)): y's tile columns get
  // the block sums and the group terms, and, with the first columns, the bias.
  template <int BITS, int TT>
  PTLLM_AFFINE_TARGET static void gemm_block(const Tile& tile, const AffineX& x, int t0, const WeightMatrix& w,
                                             const float* bias, float* y, int jr, int nr, int k0, int kc) {
    constexpr int KPB = 8 / BITS, DPB = BITS;  // codes a byte, dwords a block
    const int gsh = __builtin_ctz(unsigned(w.group_size)), nb = kc / kQ8Block;
    F acc[TT];
    PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t) acc[t] = V::zero_f();
    for (int b = 0; b < nb; ++b) {
      I u[KPB * DPB];  // u[s * DPB + q]: dword q of the block, the codes at bit s * BITS of each byte
      PTLLM_AFFINE_UNROLL for (int q = 0; q < DPB; ++q) {
        I v[KPB];
        unpack<BITS>(V::load_i(tile.code[b * DPB + q]), v);
        PTLLM_AFFINE_UNROLL for (int s = 0; s < KPB; ++s) u[s * DPB + q] = v[s];
      }
      const F sv = V::load_f(tile.scale[(b * kQ8Block) >> gsh]);
      PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t) {
        const int8_t* q = x.q + size_t(t0 + t) * x.ldq + size_t(k0 + b * kQ8Block);
        I a0 = V::zero_i(), a1 = V::zero_i();  // two chains of 4
        PTLLM_AFFINE_UNROLL for (int j = 0; j < KPB * DPB; j += 2) {
          a0 = dot_c<BITS>(a0, u[j], V::bcst32(q + 4 * j));
          a1 = dot_c<BITS>(a1, u[j + 1], V::bcst32(q + 4 * j + 4));
        }
        const I ai = V::add_i(a0, a1);
        const float d = x.d[size_t(t0 + t) * x.ldd + size_t(k0 / kQ8Block + b)];
        acc[t] = V::fma(V::cvt(ai), V::mul(sv, V::set1_f(d)), acc[t]);
      }
    }
    const int g0 = k0 >> gsh;
    for (int g = 0; g < kc >> gsh; ++g) {
      const F sv = V::load_f(tile.scale[g]), bv = V::load_f(tile.bias[g]);
      PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t) {
        const size_t xt = size_t(t0 + t) * x.ldg + size_t(g0 + g);
        const float xc = BITS == 8 && centred8() ? kMid8 * x.xs[xt] : x.xc[xt];
        acc[t] = V::fma(sv, V::set1_f(xc), V::fma(bv, V::set1_f(x.xs[xt]), acc[t]));
      }
    }
    PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t) {
      float* yt = y + size_t(t0 + t) * size_t(w.rows) + size_t(jr);
      const F before = k0 > 0 ? V::load_f_n(yt, nr) : bias ? V::load_f_n(bias + jr, nr) : V::zero_f();
      const F a = V::add(acc[t], before);
      if (nr == L)
        V::store_f(yt, a);
      else
        V::store_f_n(yt, a, nr);
    }
  }

  // ---- packed: 16-row groups read in place (kernels/affine.h, affine_pack) -----------------------
  // 6 bits (affine.h): the 8 registers of codes of a packed block at cb, u[n] meeting x's bytes
  // 4 n .. 4 n + 3: for n < 4 the codes c (the low nibble of dword n, c >> 4 moved to bits 4-5), for
  // n >= 4 the codes times 4 (the high nibble of dword n - 4 holds c >> 2, c & 3 goes to bits 2-3),
  // so that no code nibble is shifted and each 2-bit register two of the 8 (as Q6_K's ql and qh).
  PTLLM_AFFINE_TARGET static void unpack6(const uint8_t* cb, I* u) {
    const I m_lo = V::set1_u8(0x0f), m_hi = V::set1_u8(0xf0), m45 = V::set1_u8(0x30), m23 = V::set1_u8(0x0c);
    PTLLM_AFFINE_UNROLL for (int h = 0; h < 2; ++h) {
      const I t = V::load_i(cb + (4 + h) * kLine);
      const I t_up = V::sll32(t, 4), t_down = V::srl32(t, 4);  // bits 0-1 to 4-5, bits 6-7 to 2-3
      PTLLM_AFFINE_UNROLL for (int e = 0; e < 2; ++e) {
        const int j = 2 * h + e;
        const I lo = V::load_i(cb + j * kLine);
        u[j] = V::or_i(V::and_i(lo, m_lo), V::and_i(e ? t_up : t, m45));
        u[4 + j] = V::or_i(V::and_i(lo, m_hi), V::and_i(e ? t_down : t, m23));
      }
    }
  }
  // Blocks b0 .. b0 + NB - 1 of 32 columns of one group of a packed 16-row group (codes: its first
  // block, plus RB h for the rows [L h, L h + L) of registers narrower than the group) against rows
  // qt / dt of x (pointers at the group's first block): acc[t] += d_b s_g (codes . q) a block.
  template <int BITS, int TT, int NB>
  [[gnu::always_inline]] PTLLM_AFFINE_TARGET static inline void packed_group_blocks(const uint8_t* codes, int b0,
                                                                                    const int8_t* const* qt,
                                                                                    const float* const* dt, F sv,
                                                                                    F* acc) {
    // NU registers of one code a byte per block, DPB dwords a row.
    constexpr int KPB = BITS == 6 ? 2 : 8 / BITS, DPB = BITS, NU = BITS == 6 ? 8 : KPB * DPB;
    PTLLM_AFFINE_UNROLL for (int b = b0; b < b0 + NB; ++b) {
      const uint8_t* cb = codes + size_t(b) * DPB * kLine;
      if constexpr (BITS == 8 && centred8()) {
        // Codes centred (V::dot8c; the group terms take kMid8 xs_g for xc_g), a dword of codes at a
        // time for every row of x: one int32 sum a row of x live.
        I a[TT];
        PTLLM_AFFINE_UNROLL for (int q = 0; q < DPB; ++q) {
          const I c = V::load_i(cb + q * kLine);
          PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t)
            a[t] = V::dot8c(q == 0 ? V::zero_i() : a[t], c, V::bcst32(qt[t] + b * kQ8Block + 4 * q));
        }
        PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t)
          acc[t] = V::fma(V::cvt(a[t]), V::mul(sv, V::set1_f(dt[t][b])), acc[t]);
        continue;
      }
      I u[NU];  // u[s * DPB + q]: dword q of the block, the codes at bit s * BITS of each byte (or unpack6)
      if constexpr (BITS == 6) {
        unpack6(cb, u);
      } else {
        PTLLM_AFFINE_UNROLL for (int q = 0; q < DPB; ++q) {
          I v[KPB];
          unpack<BITS>(V::load_i(cb + q * kLine), v);
          PTLLM_AFFINE_UNROLL for (int s = 0; s < KPB; ++s) u[s * DPB + q] = v[s];
        }
      }
      PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t) {
        const int8_t* q = qt[t] + b * kQ8Block;
        I a0 = V::zero_i(), a1 = V::zero_i();
        if constexpr (BITS == 6 && i16_sums()) {
          // 4 c shifted back to c (below 64): two products of pairs at most 2 * 2 * 63 * 127 < 2^15.
          PTLLM_AFFINE_UNROLL for (int j = 0; j < 4; j += 2) {
            a0 = V::add_i(a0, V::widen16(V::add16(V::mul_pairs(u[j], V::bcst32(q + 4 * j)),
                                                  V::mul_pairs(V::srl32(u[4 + j], 2), V::bcst32(q + 16 + 4 * j)))));
            a1 = V::add_i(a1, V::widen16(V::add16(V::mul_pairs(u[j + 1], V::bcst32(q + 4 * j + 4)),
                                                  V::mul_pairs(V::srl32(u[5 + j], 2), V::bcst32(q + 20 + 4 * j)))));
          }
        } else if constexpr (BITS == 6) {  // a1 sums 4 c q (codes times 4, below 256): exact after >> 2
          PTLLM_AFFINE_UNROLL for (int j = 0; j < 4; ++j) {
            a0 = V::dot4(a0, u[j], V::bcst32(q + 4 * j));
            a1 = V::dot8(a1, u[4 + j], V::bcst32(q + 16 + 4 * j));
          }
          a1 = V::sra32(a1, 2);
        } else if constexpr (BITS != 8 && i16_sums()) {
          // Codes below 16: a lane's NU products of pairs at most NU * 2 * 15 * 127 < 2^15 (2 bits:
          // 16 * 2 * 3 * 127), summed in 16 bits and widened once.
          I s0 = V::mul_pairs(u[0], V::bcst32(q)), s1 = V::mul_pairs(u[1], V::bcst32(q + 4));
          PTLLM_AFFINE_UNROLL for (int j = 2; j < NU; j += 2) {
            s0 = V::add16(s0, V::mul_pairs(u[j], V::bcst32(q + 4 * j)));
            s1 = V::add16(s1, V::mul_pairs(u[j + 1], V::bcst32(q + 4 * j + 4)));
          }
          a0 = V::widen16(V::add16(s0, s1));
        } else {
          PTLLM_AFFINE_UNROLL for (int j = 0; j < NU; j += 2) {
            a0 = dot<BITS>(a0, u[j], V::bcst32(q + 4 * j));
            a1 = dot<BITS>(a1, u[j + 1], V::bcst32(q + 4 * j + 4));
          }
        }
        acc[t] = V::fma(V::cvt(V::add_i(a0, a1)), V::mul(sv, V::set1_f(dt[t][b])), acc[t]);
      }
    }
  }
  // Both halves of a 16-row group at once where registers hold 8 rows (H = 2), 2-, 4- and centred
  // 8-bit codes: each broadcast of x serves 16 rows (half h of a line at + RB h). Each half's integer
  // sums and float operations are packed_group_blocks', so the same bits.
  template <int BITS, int TT, int NB>
  [[gnu::always_inline]] PTLLM_AFFINE_TARGET static inline void packed_group_blocks_both(const uint8_t* codes, int b0,
                                                                                         const int8_t* const* qt,
                                                                                         const float* const* dt,
                                                                                         const F* sv, F* acc) {
    static_assert(H == 2 && BITS != 6);
    constexpr int KPB = 8 / BITS, DPB = BITS;
    PTLLM_AFFINE_UNROLL for (int b = b0; b < b0 + NB; ++b) {
      const uint8_t* cb = codes + size_t(b) * DPB * kLine;
      I a[H][TT];  // 8 bits: int32 sums; 2, 4 bits: int16 sums of pairs (at most 8 * 2 * 15 * 127)
      PTLLM_AFFINE_UNROLL for (int q = 0; q < DPB; ++q) {
        I u[H][KPB];
        PTLLM_AFFINE_UNROLL for (int h = 0; h < H; ++h) unpack<BITS>(V::load_i(cb + q * kLine + h * RB), u[h]);
        PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t) {
          const int8_t* x = qt[t] + b * kQ8Block;
          PTLLM_AFFINE_UNROLL for (int k = 0; k < KPB; ++k) {
            const I xb = V::bcst32(x + 4 * (k * DPB + q));
            PTLLM_AFFINE_UNROLL for (int h = 0; h < H; ++h) {
              if constexpr (BITS == 8) {
                a[h][t] = V::dot8c(q == 0 ? V::zero_i() : a[h][t], u[h][0], xb);
              } else {
                const I p = V::mul_pairs(u[h][k], xb);
                a[h][t] = q == 0 && k == 0 ? p : V::add16(a[h][t], p);
              }
            }
          }
        }
      }
      PTLLM_AFFINE_UNROLL for (int h = 0; h < H; ++h) PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t) {
        const I sum = BITS == 8 ? a[h][t] : V::widen16(a[h][t]);
        acc[h * TT + t] = V::fma(V::cvt(sum), V::mul(sv[h], V::set1_f(dt[t][b])), acc[h * TT + t]);
      }
    }
  }
  // Blocks b0 .. b0 + NB - 1 of a group's H halves (sv[h], acc + h TT): both at once where
  // packed_group_blocks_both takes the codes, else half after half.
  template <int BITS, int TT, int NB>
  [[gnu::always_inline]] PTLLM_AFFINE_TARGET static inline void group_blocks(const uint8_t* codes, int b0,
                                                                             const int8_t* const* qt,
                                                                             const float* const* dt, const F* sv,
                                                                             F* acc) {
    if constexpr (H == 2 && BITS != 6 && (BITS == 8 ? centred8() : i16_sums()))
      packed_group_blocks_both<BITS, TT, NB>(codes, b0, qt, dt, sv, acc);
    else {
      PTLLM_AFFINE_UNROLL for (int h = 0; h < H; ++h)
        packed_group_blocks<BITS, TT, NB>(codes + h * RB, b0, qt, dt, sv[h], acc + h * TT);
    }
  }
  // Rows [t0, t0 + TT) of x against the 16 rows of the packed group at rg, the chunks of KC columns
  // from k0 to k1 (whole groups): each chunk's sum, from zero, is added to y's 16 columns from r (the
  // first chunk's to the bias). Registers of 8 lanes take the group as H = 2 halves of 8 rows (both
  // at once where group_blocks can). Several chunks a call (decode) keep that running sum in
  // registers: the same float operations a lane, in the order affine_packed_rows_scalar repeats. One
  // row of x (decode) streams the groups front to back, asked for ahead (kPackedLineAhead,
  // kPackedTouch).
  template <int BITS, class Ld, int TT>
  PTLLM_AFFINE_TARGET static void packed_block(const uint8_t* rg, size_t gb, const AffineX& x, int t0,
                                               const WeightMatrix& w, const float* bias, float* y, int r, int k0,
                                               int k1) {
    const int gsh = __builtin_ctz(unsigned(w.group_size)), nbg = w.group_size / kQ8Block;
    const size_t es = dtype_size(w.dtype);
    const int8_t* qt[TT];
    const float *dt[TT], *xs[TT], *xc[TT];
    F sum[H * TT];  // sum[h * TT + t]
    PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t) {
      qt[t] = x.q + size_t(t0 + t) * x.ldq + size_t(k0);
      dt[t] = x.d + size_t(t0 + t) * x.ldd + size_t(k0 / kQ8Block);
      xs[t] = x.xs + size_t(t0 + t) * x.ldg;
      xc[t] = x.xc + size_t(t0 + t) * x.ldg;
      PTLLM_AFFINE_UNROLL for (int h = 0; h < H; ++h) {
        const int rh = r + h * L;
        sum[h * TT + t] = k0 > 0 ? V::load_f(y + size_t(t0 + t) * size_t(w.rows) + size_t(rh))
                          : bias ? V::load_f(bias + rh)
                                 : V::zero_f();
      }
    }
    const int touch = touch_every(gb);
    int until_touch = 0;  // groups before the next touch (a count: no division a group)
    for (int c0 = k0; c0 < k1; c0 += KC) {
      F acc[H * TT];
      PTLLM_AFFINE_UNROLL for (int j = 0; j < H * TT; ++j) acc[j] = V::zero_f();
      for (int g = c0 >> gsh; g < std::min(c0 + KC, k1) >> gsh; ++g) {
        const uint8_t* p = rg + size_t(g) * gb;
        if constexpr (TT == 1 && kPackedLineAhead > 0)
          for (size_t o = 0; o < gb; o += 64) __builtin_prefetch(p + kPackedLineAhead + o);
        if (TT == 1 && kPackedTouch && --until_touch < 0) {
          touch_ahead(p + kPackedLineAhead);
          until_touch = touch - 1;
        }
        F sv[H], bv[H];
        PTLLM_AFFINE_UNROLL for (int h = 0; h < H; ++h) {
          sv[h] = Ld::load_n(p, size_t(h * L), L);
          bv[h] = Ld::load_n(p + kAffinePackRows * es, size_t(h * L), L);
        }
        const uint8_t* codes = p + 2 * kAffinePackRows * es;
        if (nbg == 2)  // groups of 64, mlx's default: both blocks unrolled
          group_blocks<BITS, TT, 2>(codes, 0, qt, dt, sv, acc);
        else
          for (int b = 0; b < nbg; ++b) group_blocks<BITS, TT, 1>(codes, b, qt, dt, sv, acc);
        PTLLM_AFFINE_UNROLL for (int h = 0; h < H; ++h) PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t) {
          const float c = BITS == 8 && centred8() ? kMid8 * xs[t][g] : xc[t][g];
          acc[h * TT + t] = V::fma(sv[h], V::set1_f(c), V::fma(bv[h], V::set1_f(xs[t][g]), acc[h * TT + t]));
        }
        PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t) {
          qt[t] += w.group_size;
          dt[t] += nbg;
        }
      }
      PTLLM_AFFINE_UNROLL for (int j = 0; j < H * TT; ++j) sum[j] = V::add(acc[j], sum[j]);
    }
    PTLLM_AFFINE_UNROLL for (int h = 0; h < H; ++h) PTLLM_AFFINE_UNROLL for (int t = 0; t < TT; ++t)
      V::store_f(y + size_t(t0 + t) * size_t(w.rows) + size_t(r + h * L), sum[h * TT + t]);
  }
  template <int BITS, class Ld>
  PTLLM_AFFINE_TARGET static void packed_t(const AffineX& x, const WeightMatrix& w, const float* bias, float* y,
                                           int r0, int r1) {
    if constexpr (kPacked) {
      const int K = w.cols, G = K / w.group_size;
      const size_t gb = 2 * size_t(kAffinePackRows) * dtype_size(w.dtype) + size_t(w.group_size) * BITS * 2;
      for (int r = r0; r < r1; r += kAffinePackRows) {
        const uint8_t* rg = static_cast<const uint8_t*>(w.data) + size_t(r / kAffinePackRows) * size_t(G) * gb;
        if (x.T < GTT) {  // decode: each row of x over all of K at once, its sum in registers
          for (int t = 0; t < x.T; ++t) packed_block<BITS, Ld, 1>(rg, gb, x, t, w, bias, y, r, 0, K);
          continue;
        }
        for (int k0 = 0; k0 < K; k0 += KC) {  // a chunk of the group's codes (L1) against every row of x
          const int k1 = std::min(K, k0 + KC);
          int t = 0;
          for (; t + GTT <= x.T; t += GTT) packed_block<BITS, Ld, GTT>(rg, gb, x, t, w, bias, y, r, k0, k1);
          for (; t < x.T; ++t) packed_block<BITS, Ld, 1>(rg, gb, x, t, w, bias, y, r, k0, k1);
        }
      }
    }
  }

  // By bits (2, 4, 8) and the scales' dtype.
  template <template <int, class> class Fn>
  PTLLM_AFFINE_TARGET static void by_format(const AffineX& x, const WeightMatrix& w, const float* bias, float* y,
                                            int r0, int r1) {
    switch (w.dtype) {
      case DType::BF16: return by_bits<Fn, LdBF16>(x, w, bias, y, r0, r1);
      case DType::F16: return by_bits<Fn, LdF16>(x, w, bias, y, r0, r1);
      default: return by_bits<Fn, LdF32>(x, w, bias, y, r0, r1);
    }
  }
  template <template <int, class> class Fn, class Ld>
  PTLLM_AFFINE_TARGET static void by_bits(const AffineX& x, const WeightMatrix& w, const float* bias, float* y,
                                          int r0, int r1) {
    switch (w.bits) {
      case 8: return Fn<8, Ld>::run(x, w, bias, y, r0, r1);
      case 4: return Fn<4, Ld>::run(x, w, bias, y, r0, r1);
      default: return Fn<2, Ld>::run(x, w, bias, y, r0, r1);
    }
  }
  template <int BITS, class Ld>
  struct Gemv {
    PTLLM_AFFINE_TARGET static void run(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0,
                                        int r1) {
      gemv_t<BITS>(x, w, bias, y, r0, r1);
    }
  };
  template <int BITS, class Ld>
  struct Gemm {
    PTLLM_AFFINE_TARGET static void run(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0,
                                        int r1) {
      gemm_t<BITS, Ld>(x, w, bias, y, r0, r1);
    }
  };
  template <int BITS, class Ld>
  struct Packed {
    PTLLM_AFFINE_TARGET static void run(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0,
                                        int r1) {
      packed_t<BITS, Ld>(x, w, bias, y, r0, r1);
    }
  };
  PTLLM_AFFINE_TARGET static void packed(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0,
                                         int r1) {
    if (w.bits != 6) return by_format<Packed>(x, w, bias, y, r0, r1);
    switch (w.dtype) {
      case DType::BF16: return packed_t<6, LdBF16>(x, w, bias, y, r0, r1);
      case DType::F16: return packed_t<6, LdF16>(x, w, bias, y, r0, r1);
      default: return packed_t<6, LdF32>(x, w, bias, y, r0, r1);
    }
  }
  PTLLM_AFFINE_TARGET static void gemv(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0,
                                       int r1) {
    by_format<Gemv>(x, w, bias, y, r0, r1);
  }
  PTLLM_AFFINE_TARGET static void gemm(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0,
                                       int r1) {
    by_format<Gemm>(x, w, bias, y, r0, r1);
  }
  static constexpr AffineKernelTable table(const char* name) {
    return AffineKernelTable{name, RB, L, gemv, gemm, kPacked ? packed : nullptr, kPacked && centred8()};
  }

  static constexpr size_t kAhead = 4096;  // the weight stream asked for this far ahead (as the bf16 gemv)
  static constexpr int kGemvBlockRows = 16;
};

#undef PTLLM_AFFINE_UNROLL

}  // namespace
}  // namespace ptllm
