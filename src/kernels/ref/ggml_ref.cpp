// llama.cpp's block formats, the scalar reference: row dequantization and the reference quantizers
// (llama.cpp's quantize_row_*_ref, the ones llama-quantize uses without an importance matrix), as
// ggml-quants.c and ggml-common.h define them. Byte offsets inside each block are spelled out at
// each reader (ggml's structs are packed, f16 fields little-endian).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/ggml.h"

namespace ptllm {

namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}
void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}
uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ggml's nearest_int: round half to even (the magic-number trick in ggml-quants.c rounds in the
// default FPU mode, as lrint does).
int nearest(float v) { return int(std::lrint(v)); }

// ---- dequantization: one block each ------------------------------------------------------------

// Q4_0 (18 bytes): f16 d @0, qs[16] @2. Value j < 16 is the low nibble of qs[j], value j + 16 its
// high nibble; x = d * (nibble - 8).
void deq_q4_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(int(b[2 + j] & 0xf) - 8);
    y[j + 16] = d * float(int(b[2 + j] >> 4) - 8);
  }
}
// Q4_1 (20): f16 d @0, f16 m @2, qs[16] @4; x = d * nibble + m (nibble order as Q4_0).
void deq_q4_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(b[4 + j] & 0xf) + m;
    y[j + 16] = d * float(b[4 + j] >> 4) + m;
  }
}
// Q5_0 (22): f16 d @0, qh (u32) @2, qs[16] @6. Value j's fifth bit is bit j of qh; x = d * (q - 16).
void deq_q5_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const uint32_t qh = u32_at(b + 2);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b[6 + j] & 0xf) | int((qh >> j) & 1) << 4;
    const int hi = (b[6 + j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
    y[j] = d * float(lo - 16);
    y[j + 16] = d * float(hi - 16);
  }
}
// Q5_1 (24): f16 d @0, f16 m @2, qh @4, qs[16] @8; x = d * q + m.
void deq_q5_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  const uint32_t qh = u32_at(b + 4);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b[8 + j] & 0xf) | int((qh >> j) & 1) << 4;
    const int hi = (b[8 + j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
    y[j] = d * float(lo) + m;
    y[j + 16] = d * float(hi) + m;
  }
}
// Q8_0 (34): f16 d @0, int8 qs[32] @2; x = d * q.
void deq_q8_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < 32; ++j) y[j] = d * float(int8_t(b[2 + j]));
}

// Q2_K (84): scales[16] @0 (low nibble: scale, high: min, one pair per 16 values), qs[64] @16,
// f16 d @80, f16 dmin @82. Each 128-value half reads 32 bytes of qs four times, two bits at a time
// (bits 0-1 first); within a pass bytes 0-15 give 16 values and bytes 16-31 the next 16.
// x = d * sc * q - dmin * m.
void deq_q2_k(const uint8_t* b, float* y) {
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  const uint8_t* sc = b;
  const uint8_t* q = b + 16;
  int is = 0;
  for (int half = 0; half < 2; ++half, q += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int part = 0; part < 2; ++part, ++is) {
        const float dl = d * float(sc[is] & 0xf), ml = dmin * float(sc[is] >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * float((q[part * 16 + l] >> shift) & 3) - ml;
      }
}
// Q3_K (110): hmask[32] @0, qs[64] @32, scales[12] @96, f16 d @108. Sixteen 6-bit scales (stored
// minus 32): low nibbles of bytes 0-7 are scales 0-7, their high nibbles scales 8-15; bytes 8-11
// hold the top two bits, scale j's at bits 2 (j / 4) of byte 8 + j % 4. Two low bits of a value as
// Q2_K; the third is hmask bit (pass) of byte l (0 = subtract 4). x = d * (sc - 32) * q.
void q3k_scales(const uint8_t* s, int* out) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? s[j] & 0xf : s[j - 8] >> 4;
    const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = (low | high << 4) - 32;
  }
}
void deq_q3_k(const uint8_t* b, float* y) {
  const float d = f16_at(b + 108);
  int sc[16];
  q3k_scales(b + 96, sc);
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  int is = 0, bit = 0;
  for (int half = 0; half < 2; ++half, q += 32)
    for (int shift = 0; shift < 8; shift += 2, ++bit)
      for (int part = 0; part < 2; ++part, ++is) {
        const float dl = d * float(sc[is]);
        for (int l = 0; l < 16; ++l) {
          const int i = part * 16 + l;
          const int v = ((q[i] >> shift) & 3) - ((hm[i] >> bit) & 1 ? 0 : 4);
          *y++ = dl * float(v);
        }
      }
}
// Q4_K (144): f16 d @0, f16 dmin @2, scales[12] @4, qs[128] @16. Eight 32-value sub-blocks with a
// 6-bit scale and a 6-bit min each (ggml_k_scale_min); each 64 values read 32 bytes of qs, low
// nibbles first. x = d * sc * q - dmin * m.
void deq_q4_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t* q = b + 16;
  for (int j = 0; j < 8; j += 2, q += 32) {
    const GgmlScaleMin a = ggml_k_scale_min(b + 4, j), c = ggml_k_scale_min(b + 4, j + 1);
    const float d1 = d * float(a.scale), m1 = dmin * float(a.min);
    const float d2 = d * float(c.scale), m2 = dmin * float(c.min);
    for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0xf) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
  }
}
// Q5_K (176): as Q4_K with qh[32] @16 and qs[128] @48: value l of sub-block j takes its fifth bit
// from bit j of qh[l].
void deq_q5_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t* qh = b + 16;
  const uint8_t* q = b + 48;
  for (int j = 0; j < 8; j += 2, q += 32) {
    const GgmlScaleMin a = ggml_k_scale_min(b + 4, j), c = ggml_k_scale_min(b + 4, j + 1);
    const float d1 = d * float(a.scale), m1 = dmin * float(a.min);
    const float d2 = d * float(c.scale), m2 = dmin * float(c.min);
    for (int l = 0; l < 32; ++l) *y++ = d1 * float((q[l] & 0xf) | ((qh[l] >> j) & 1) << 4) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * float((q[l] >> 4) | ((qh[l] >> (j + 1)) & 1) << 4) - m2;
  }
}
// Q6_K (210): ql[128] @0, qh[64] @128, int8 scales[16] @192 (one per 16 values), f16 d @208. Each
// 128-value half reads 64 bytes of ql and 32 of qh: value l + 32 s (l < 32, s < 4) has low bits
// from ql[l + 32 (s % 2)] (low nibble for s < 2, high for s >= 2) and high bits 2s, 2s + 1 of
// qh[l]. x = d * sc * (q - 32).
void deq_q6_k(const uint8_t* b, float* y) {
  const float d = f16_at(b + 208);
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) {
        const int lo = s < 2 ? ql[l + 32 * s] & 0xf : ql[l + 32 * (s - 2)] >> 4;
        const int q = lo | ((qh[l] >> (2 * s)) & 3) << 4;
        y[32 * s + l] = d * float(sc[(32 * s + l) / 16]) * float(q - 32);
      }
}

// ---- reference quantizers -----------------------------------------------------------------------

// The value of largest magnitude, with its sign (ggml's "max" of the symmetric formats).
float signed_absmax(const float* x, int n) {
  float amax = 0.f, max = 0.f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  return max;
}

void quant_q4_0(const float* x, uint8_t* b) {
  const float d = signed_absmax(x, 32) / -8.f, id = d != 0.f ? 1.f / d : 0.f;
  put_f16(b, d);
  for (int j = 0; j < 16; ++j) {
    // (int8_t)(v + 8.5f) truncates; v >= -8 so the sum is positive.
    const int lo = std::min(15, int(int8_t(x[j] * id + 8.5f)));
    const int hi = std::min(15, int(int8_t(x[j + 16] * id + 8.5f)));
    b[2 + j] = uint8_t(lo | hi << 4);
  }
}
void minmax(const float* x, int n, float& lo, float& hi) {
  lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
}
void quant_q4_1(const float* x, uint8_t* b) {
  float lo, hi;
  minmax(x, 32, lo, hi);
  const float d = (hi - lo) / 15.f, id = d != 0.f ? 1.f / d : 0.f;
  put_f16(b, d);
  put_f16(b + 2, lo);
  for (int j = 0; j < 16; ++j) {
    const int q0 = std::min(15, int(int8_t((x[j] - lo) * id + 0.5f)));
    const int q1 = std::min(15, int(int8_t((x[j + 16] - lo) * id + 0.5f)));
    b[4 + j] = uint8_t(q0 | q1 << 4);
  }
}
void quant_q5_0(const float* x, uint8_t* b) {
  const float d = signed_absmax(x, 32) / -16.f, id = d != 0.f ? 1.f / d : 0.f;
  put_f16(b, d);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int q0 = std::min(31, int(int8_t(x[j] * id + 16.5f)));
    const int q1 = std::min(31, int(int8_t(x[j + 16] * id + 16.5f)));
    b[6 + j] = uint8_t((q0 & 0xf) | (q1 & 0xf) << 4);
    qh |= uint32_t(q0 >> 4) << j | uint32_t(q1 >> 4) << (j + 16);
  }
  std::memcpy(b + 2, &qh, 4);
}
void quant_q5_1(const float* x, uint8_t* b) {
  float lo, hi;
  minmax(x, 32, lo, hi);
  const float d = (hi - lo) / 31.f, id = d != 0.f ? 1.f / d : 0.f;
  put_f16(b, d);
  put_f16(b + 2, lo);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int q0 = uint8_t((x[j] - lo) * id + 0.5f);
    const int q1 = uint8_t((x[j + 16] - lo) * id + 0.5f);
    b[8 + j] = uint8_t((q0 & 0xf) | (q1 & 0xf) << 4);
    qh |= uint32_t((q0 >> 4) & 1) << j | uint32_t((q1 >> 4) & 1) << (j + 16);
  }
  std::memcpy(b + 4, &qh, 4);
}
void quant_q8_0(const float* x, uint8_t* b) {
  float amax = 0.f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
  put_f16(b, d);
  for (int j = 0; j < 32; ++j) b[2 + j] = uint8_t(int8_t(std::round(x[j] * id)));
}

// ggml's make_qkx2_quants: codes 0..nmax and (scale, min) for x ~ scale * L - min, minimizing the
// weighted squared error over a grid of nstep + 1 trial scales around nmax / (max - min), each
// refined by weighted least squares. Returns the scale; *the_min receives min (>= 0).
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* the_min, float rmin,
                    float rdelta, int nstep) {
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -lo;
    return 0.f;
  }
  float iscale = float(nmax) / (hi - lo), scale = 1.f / iscale, best = 0.f;
  for (int i = 0; i < n; ++i) {
    L[i] = uint8_t(std::clamp(nearest(iscale * (x[i] - lo)), 0, nmax));
    const float diff = scale * float(L[i]) + lo - x[i];
    best += w[i] * (diff * diff);  // ggml's order: the square first (float rounding decides ties)
  }
  uint8_t aux[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * float(is) + float(nmax)) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest(iscale * (x[i] - lo)), 0, nmax);
      aux[i] = uint8_t(l);
      sum_l += w[i] * float(l);
      sum_l2 += w[i] * float(l) * float(l);
      sum_xl += w[i] * float(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * float(aux[i]) + this_min - x[i];
        err += w[i] * (diff * diff);
      }
      if (err < best) {
        std::memcpy(L, aux, size_t(n));
        best = err;
        scale = this_scale;
        lo = this_min;
      }
    }
  }
  *the_min = -lo;
  return scale;
}

// The 12-byte scales of Q4_K/Q5_K from eight 6-bit scales and mins (the inverse of ggml_k_scale_min).
void pack_k_scales(const uint8_t* ls, const uint8_t* lm, uint8_t* s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] = ls[j];
      s[j + 4] = lm[j];
    } else {
      s[j + 4] = uint8_t((ls[j] & 0xf) | (lm[j] & 0xf) << 4);
      s[j - 4] |= uint8_t((ls[j] >> 4) << 6);
      s[j] |= uint8_t((lm[j] >> 4) << 6);
    }
  }
}

// Q4_K and Q5_K (nmax 15 / 31): per 32 values a (scale, min) fit weighted by |x| + rms (llama.cpp's
// choice), both quantized to 6 bits against the block's largest, then every value re-rounded
// against the quantized pair.
void quant_k45(const float* x, uint8_t* b, int nmax) {
  uint8_t L[256];
  float scales[8], mins[8], w[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xj = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xj[l] * xj[l];
    const float av = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) w[l] = av + std::fabs(xj[l]);
    scales[j] = nmax == 15 ? fit_scale_min(32, 15, xj, w, L + 32 * j, &mins[j], -1.f, 0.1f, 20)
                           : fit_scale_min(32, 31, xj, w, L + 32 * j, &mins[j], -0.5f, 0.1f, 15);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    // ggml stores nearest_int's result in a uint8_t before the clamp to 63.
    ls[j] = std::min<uint8_t>(63, uint8_t(nearest(inv_scale * scales[j])));
    lm[j] = std::min<uint8_t>(63, uint8_t(nearest(inv_min * mins[j])));
  }
  pack_k_scales(ls, lm, b + 4);
  put_f16(b, max_scale / 63.f);
  put_f16(b + 2, max_min / 63.f);
  const float d = f16_at(b), dmin = f16_at(b + 2);
  for (int j = 0; j < 8; ++j) {
    const GgmlScaleMin sm = ggml_k_scale_min(b + 4, j);
    const float dj = d * float(sm.scale);
    if (dj == 0.f) continue;
    const float mj = dmin * float(sm.min);
    for (int l = 0; l < 32; ++l) L[32 * j + l] = uint8_t(std::clamp(nearest((x[32 * j + l] + mj) / dj), 0, nmax));
  }
  if (nmax == 15) {
    uint8_t* q = b + 16;
    for (int j = 0; j < 256; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = uint8_t(L[j + l] | L[j + l + 32] << 4);
  } else {
    uint8_t* qh = b + 16;
    uint8_t* q = b + 48;
    std::memset(qh, 0, 32);
    for (int j = 0; j < 256; j += 64, q += 32) {
      const int bit = j / 32;  // sub-block of the low nibbles
      for (int l = 0; l < 32; ++l) {
        const int a = L[j + l], c = L[j + l + 32];
        q[l] = uint8_t((a & 0xf) | (c & 0xf) << 4);
        qh[l] |= uint8_t((a >> 4) << bit | (c >> 4) << (bit + 1));
      }
    }
  }
}

// ggml's make_qx_quants with rmse_type 1 (weights x^2) and no importance: codes -nmax..nmax-1
// (stored + nmax) and the scale, the best of 19 trial scales around -nmax / max by weighted least
// squares.
float fit_symmetric(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  if (amax < 1e-15f) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  auto code = [&](float iscale, int i) { return std::clamp(nearest(iscale * x[i]), -nmax, nmax - 1); };
  float iscale = -float(nmax) / max, sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = code(iscale, i);
    L[i] = int8_t(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  float scale = suml2 != 0.f ? sumlx / suml2 : 0.f, best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(float(nmax) + 0.1f * float(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = code(iscale, i);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * float(l);
      suml2 += w * float(l) * float(l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = int8_t(nmax + code(iscale, i));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void quant_q6_k(const float* x, uint8_t* b) {
  int8_t L[256];
  float scales[16];
  float max_scale = 0, max_abs = 0;
  for (int g = 0; g < 16; ++g) {
    scales[g] = fit_symmetric(16, 32, x + 16 * g, L + 16 * g);
    if (std::fabs(scales[g]) > max_abs) max_abs = std::fabs(scales[g]), max_scale = scales[g];
  }
  std::memset(b, 0, 210);
  if (max_abs < 1e-15f) return;  // all zero: d = 0
  const float iscale = -128.f / max_scale;
  put_f16(b + 208, 1.f / iscale);
  auto* sc = reinterpret_cast<int8_t*>(b + 192);
  for (int g = 0; g < 16; ++g) sc[g] = int8_t(std::min(127, nearest(iscale * scales[g])));
  const float d = f16_at(b + 208);
  for (int g = 0; g < 16; ++g) {
    const float dg = d * float(sc[g]);
    if (dg == 0.f) continue;
    for (int l = 0; l < 16; ++l) L[16 * g + l] = int8_t(std::clamp(nearest(x[16 * g + l] / dg), -32, 31) + 32);
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int j = 0; j < 256; j += 128, ql += 64, qh += 32)
    for (int l = 0; l < 32; ++l) {
      const int q0 = L[j + l], q1 = L[j + l + 32], q2 = L[j + l + 64], q3 = L[j + l + 96];
      ql[l] = uint8_t((q0 & 0xf) | (q2 & 0xf) << 4);
      ql[l + 32] = uint8_t((q1 & 0xf) | (q3 & 0xf) << 4);
      qh[l] = uint8_t((q0 >> 4) | (q1 >> 4) << 2 | (q2 >> 4) << 4 | (q3 >> 4) << 6);
    }
}

[[noreturn]] void unsupported(GgmlType t, const char* what) {
  const std::string_view name = ggml_type_info(t).name;
  throw Error("GGML tensor type " + (name.empty() ? "id " + std::to_string(uint32_t(t)) : std::string(name)) + ": " +
              what);
}

}  // namespace

GgmlScaleMin ggml_k_scale_min(const uint8_t* s, int j) {
  if (j < 4) return {uint8_t(s[j] & 63), uint8_t(s[j + 4] & 63)};
  return {uint8_t((s[j + 4] & 0xf) | (s[j - 4] >> 6) << 4), uint8_t((s[j + 4] >> 4) | (s[j] >> 6) << 4)};
}

GgmlType ggml_type_by_name(std::string_view name) {
  for (uint32_t id = 0; id <= 40; ++id)
    if (!name.empty() && ggml_type_info(GgmlType(id)).name == name) return GgmlType(id);
  throw Error("GGML tensor type \"" + std::string(name) + "\": unknown");
}

bool ggml_supported(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return true;
    default: return false;
  }
}

bool ggml_quantizable(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return true;
    default: return false;
  }
}

void ggml_dequant_blocks(GgmlType t, const void* blocks, int n, float* out) {
  const GgmlTypeInfo info = ggml_type_info(t);
  if (!ggml_supported(t)) unsupported(t, "not supported by the kernels");
  PTLLM_CHECK(n % info.block_elems == 0);
  void (*f)(const uint8_t*, float*) = nullptr;
  switch (t) {
    case GgmlType::Q4_0: f = deq_q4_0; break;
    case GgmlType::Q4_1: f = deq_q4_1; break;
    case GgmlType::Q5_0: f = deq_q5_0; break;
    case GgmlType::Q5_1: f = deq_q5_1; break;
    case GgmlType::Q8_0: f = deq_q8_0; break;
    case GgmlType::Q2_K: f = deq_q2_k; break;
    case GgmlType::Q3_K: f = deq_q3_k; break;
    case GgmlType::Q4_K: f = deq_q4_k; break;
    case GgmlType::Q5_K: f = deq_q5_k; break;
    case GgmlType::Q6_K: f = deq_q6_k; break;
    default: unsupported(t, "not supported by the kernels");
  }
  const auto* b = static_cast<const uint8_t*>(blocks);
  for (int i = 0; i < n / info.block_elems; ++i)
    f(b + size_t(i) * size_t(info.block_bytes), out + size_t(i) * size_t(info.block_elems));
}

void ggml_dequant_row(const WeightMatrix& w, int r, float* out) {
  if (w.ggml_pack) {
    thread_local std::vector<uint8_t> blocks;  // an embedding lookup a token: no allocation each
    const GgmlTypeInfo info = ggml_type_info(w.ggml);
    blocks.resize(size_t(w.cols / info.block_elems) * size_t(info.block_bytes));
    ggml_unpack_row(w, r, blocks.data());
    return ggml_dequant_blocks(w.ggml, blocks.data(), w.cols, out);
  }
  ggml_dequant_blocks(w.ggml, static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes(), w.cols, out);
}

void ggml_quantize_row(GgmlType t, const float* x, int n, void* blocks) {
  const GgmlTypeInfo info = ggml_type_info(t);
  if (!ggml_quantizable(t)) unsupported(t, "no quantizer");
  if (n % info.block_elems != 0)
    throw Error("quantizing to " + std::string(info.name) + ": a row of " + std::to_string(n) +
                " values is not a whole number of " + std::to_string(info.block_elems) + "-value blocks");
  auto* b = static_cast<uint8_t*>(blocks);
  for (int i = 0; i < n / info.block_elems; ++i) {
    const float* xi = x + size_t(i) * size_t(info.block_elems);
    uint8_t* bi = b + size_t(i) * size_t(info.block_bytes);
    switch (t) {
      case GgmlType::Q4_0: quant_q4_0(xi, bi); break;
      case GgmlType::Q4_1: quant_q4_1(xi, bi); break;
      case GgmlType::Q5_0: quant_q5_0(xi, bi); break;
      case GgmlType::Q5_1: quant_q5_1(xi, bi); break;
      case GgmlType::Q8_0: quant_q8_0(xi, bi); break;
      case GgmlType::Q4_K: quant_k45(xi, bi, 15); break;
      case GgmlType::Q5_K: quant_k45(xi, bi, 31); break;
      case GgmlType::Q6_K: quant_q6_k(xi, bi); break;
      default: unsupported(t, "no quantizer");
    }
  }
}

}  // namespace ptllm
