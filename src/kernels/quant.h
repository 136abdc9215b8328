#pragma once
// KIVI affine quantization (Liu et al., 2024): codes c in [0, 2^bits - 1], x ~= c * scale + zero.
// (The seed's signed form q = c + qmin with qmin from the table below is the same code shifted.)
// K is quantized per channel over a group of tokens, V per token over its channels. Codes are
// packed along head_dim: int8 one a byte, int4 two (low nibble first), int2 four (low bits first).
// Scales and zeros are stored as float16 and used as float32 (the seed's bug class 2).
#include <cstddef>
#include <cstdint>

#include "kernels/layout.h"

namespace ptllm {

struct QuantRange {
  int bits;
  int qmin;  // signed range of the seed's formula, from one table (bug class 3)
  int qmax;
  int levels() const { return qmax - qmin; }  // 2^bits - 1
};
// bits must be 8, 4 or 2.
const QuantRange& quant_range(int bits);

// Smallest scale stored: float16's smallest normal, so a scale never underflows to 0 or loses bits
// as a subnormal (the seed's bug classes 1 and 2: constant channels, f16 underflow).
constexpr float kMinScale = 0x1p-14f;

// kivi_k_block: a query head whose scaled channels are all below this in magnitude scores 0 on the
// code term (127 / amax stays finite).
constexpr float kMinQueryMax = 1e-30f;

// Keys [j0, j0 + n) of a K group, as the kernels take them.
struct KRows {
  const uint8_t* group;  // the group's codes as stored (k_code_offset)
  int G;                 // keys in the group
  int j0;                // the first key read
};
// Rows [j0, j0 + n) of a stored K group to plain rows [n][pk].
void k_rows_from_group(KRows k, int n, size_t pk, uint8_t* rows);

// K group: x [G][D] (row stride x_stride floats) -> codes as stored (k_code_offset), scale/zero [D] f16 bits.
void quantize_k_group(const float* x, size_t x_stride, int G, int D, int bits, uint8_t* codes, uint16_t* scale,
                      uint16_t* zero);
// V token: x [D] -> codes [packed_bytes(D)], one scale and zero.
void quantize_v_token(const float* x, int D, int bits, uint8_t* codes, uint16_t* scale, uint16_t* zero);

// Unpacked code i of a packed row.
inline int code_at(const uint8_t* codes, int i, int bits) {
  switch (bits) {
    case 8: return codes[i];
    case 4: return (codes[i >> 1] >> ((i & 1) * 4)) & 0xf;
    default: return (codes[i >> 2] >> ((i & 3) * 2)) & 0x3;
  }
}

// Fused attention pieces (never a dequantized copy):
// A block of nk tokens for the nq query heads sharing a KV head (GQA): each code row is unpacked
// once for all of them. K codes: keys [j0, j0 + nk) of a stored group (KRows); V codes: [nk][pk]
// rows; scales and zeros as stored (f16 bits), a scale read as max(kMinScale, scale), as
// dequantization reads it.
// K, per-channel scale s, zero z [D]: out[h][j] ~= sum_i q[h][i] * (s[i] * qscale * c_j[i] + z[i] * qscale)
//   q: [nq][D], out: [nq][ld_out]. The query is scaled once per block and quantized per head to
//   int8, so the code term is an integer dot product (AVX-512 VNNI where the CPU has it):
//   qs[i] = q[h][i] * (s[i] * qscale), amax = max_i |qs[i]|, a = amax / 127,
//   q8[i] = round(qs[i] * (127 / amax)) (to nearest even; amax < kMinQueryMax: a = 0, q8 = 0),
//   m = (2^bits - 1) / 2 the middle code,
//   out[h][j] = a * (sum_i q8[i] * c_j[i] - m * sum_i q8[i]) + sum_i q[h][i] * (z[i] + m * s[i]) * qscale,
//   i.e. the rounded query multiplies the centered codes c - m only (half the error of c). Every
//   target and the twin compute exactly these q8 and integer sums (only the float sum of the last
//   term may round differently); the int8 query adds an error of at most max_i |qs[i]| / 254 per
//   channel, times |c - m|, to a score.
// next (optional, here and in kivi_v_block): the codes attention reads after these, laid out the same
// (K: another stored group of G keys), prefetched a few lines at a time while these are read (as
// dense_k_block, ops.h).
void kivi_k_block(const float* q, int nq, KRows codes, const uint16_t* scale, const uint16_t* zero, float qscale,
                  int nk, int D, int bits, float* out, int ld_out, const void* next = nullptr);
// V, per-token scale s, zero z [nk]: acc[h][i] += sum_j p[h][j] * s[j] * c_j[i] and
// zacc[h] += sum_j p[h][j] * z[j] (the zero-point term, the same for every channel).
//   p: [nq][ld_p], acc: [nq][D], zacc: [nq].
// A target may round each weight w_j = p[h][j] * s[j] to bf16 (relative error at most 2^-8: AVX-512
// BF16, int4 and int2) or to a 16-bit integer on the scale max_j w_j / 32767 of the call (absolute error at
// most max_j w_j / 65534: AVX-512 VNNI, int8), two keys per multiply-add; both far below the codes'
// own rounding (s / 2 a channel).
void kivi_v_block(const float* p, int ld_p, int nq, const uint8_t* codes, const uint16_t* scale, const uint16_t* zero,
                  int nk, int D, int bits, float* acc, float* zacc, const void* next = nullptr);
// Several blocks of one KV head in one call (attention's walk over a part's quantized blocks):
// the keys [a0, b0) of a block, as kivi_k_block and kivi_v_block read them.
struct KiviSpan {
  const uint8_t* k;             // the block's K codes as stored (a group of G keys, G a kivi_k_spans argument)
  int k0;                       // the first key read
  const uint8_t* v;             // V codes of the first key (rows of packed_bytes(D, bits))
  const uint16_t *ks, *kz;      // K scale and zero per channel [D]
  const uint16_t *vs, *vz;      // V scale and zero of the first key [n]
  int n;                        // keys
  int col;                      // column of the first key in out (K) or p (V)
  const void *k_next, *v_next;  // asked for while this span's K (V) rows are read (may be null)
};
// out[h][col + j] for every span as kivi_k_block(q, nq, {s.k, G, s.k0}, s.ks, s.kz, qscale, s.n, ...) writes
// it; acc and zacc as kivi_v_block over the spans in order leaves them (the same sums, in the same
// order: bit for bit). The kernels ask for scales ahead of their use (kernels_impl.h,
// ask_span_scales); the codes through k_next and v_next.
void kivi_k_spans(const float* q, int nq, const KiviSpan* s, int ns, int G, float qscale, int D, int bits,
                  float* out, int ld_out);
void kivi_v_spans(const float* p, int ld_p, int nq, const KiviSpan* s, int ns, int D, int bits, float* acc,
                  float* zacc);
// Asks for the cache lines of n f16 values (scales or zeros read soon); nothing for null. Always
// inlined (kernels/stream.h, touch_ahead).
[[gnu::always_inline]] inline void prefetch_f16(const uint16_t* p, int n) {
  if (p)
    for (int j = 0; j < n; j += 32) __builtin_prefetch(p + j);  // 32 f16 a cache line
}
// A K group dequantized to float32, out [nk][D] (attention at cache positions rotates keys, so it
// needs them as floats); its scalar twin is dequantize_k_group.
void kivi_k_dequant(KRows codes, const uint16_t* scale, const uint16_t* zero, int nk, int D, int bits, float* out);
// Scalar reference twins (the SIMD versions dispatch through kernels/simd.h).
void kivi_k_block_ref(const float* q, int nq, KRows codes, const uint16_t* scale, const uint16_t* zero, float qscale,
                      int nk, int D, int bits, float* out, int ld_out);
void kivi_v_block_ref(const float* p, int ld_p, int nq, const uint8_t* codes, const uint16_t* scale,
                      const uint16_t* zero, int nk, int D, int bits, float* acc, float* zacc);

// Reference twins (tests): dequantize a stored K group or a V token to float32.
void dequantize_k_group(const uint8_t* codes, const uint16_t* scale, const uint16_t* zero, int G, int D, int bits,
                        float* out);
void dequantize_v_token(const uint8_t* codes, uint16_t scale, uint16_t zero, int D, int bits, float* out);

}  // namespace ptllm
