// The products over llama.cpp's block formats: x quantized once per call (shared by the threads),
// then one of the kernel variants (ggml.h) over each thread's rows. This file holds the scalar
// variant, the reference twin of the SIMD ones (ggml_kernels_impl.h): the same integer sums, per
// block, scaled in float in the same places.
#include "kernels/ggml.h"
#include "kernels/ggml_pack_layout.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/platform.h"
#include "core/thread_pool.h"
#include "kernels/cpu/features.h"
#include "kernels/ops.h"
#include "kernels/simd.h"

namespace ptllm {

namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Whether a type has integer kernels (the rest: Q2_K, Q3_K, go through the generic product).
bool has_int_kernel(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return true;
    default: return false;
  }
}

// ---- the scalar twin: one row of weights against one row of quantized x ------------------------

// The 32 codes of a 32-value block as stored integers (Q4/Q5: without the offset).
void codes_32(GgmlType t, const uint8_t* b, int* c) {
  switch (t) {
    case GgmlType::Q8_0:
      for (int j = 0; j < 32; ++j) c[j] = int8_t(b[2 + j]);
      return;
    case GgmlType::Q4_0:
    case GgmlType::Q4_1: {
      const uint8_t* qs = b + (t == GgmlType::Q4_0 ? 2 : 4);
      for (int j = 0; j < 16; ++j) c[j] = qs[j] & 0xf, c[j + 16] = qs[j] >> 4;
      return;
    }
    default: {  // Q5_0, Q5_1
      const int o = t == GgmlType::Q5_0 ? 2 : 4;
      uint32_t qh;
      std::memcpy(&qh, b + o, 4);
      const uint8_t* qs = b + o + 4;
      for (int j = 0; j < 16; ++j) {
        c[j] = (qs[j] & 0xf) | int((qh >> j) & 1) << 4;
        c[j + 16] = (qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
      }
    }
  }
}

// Q8_0, Q4_0, Q5_0 (signed codes: Q4_0 minus 8, Q5_0 minus 16): sum_b d_b d8_b dot(c, q).
// Q4_1, Q5_1: sum_b d8_b (d_b dot(c, q) + m_b sum(q)).
float dot_32(GgmlType t, const uint8_t* row, int nb, const int8_t* q, const float* d8, const int16_t* sums) {
  const GgmlTypeInfo info = ggml_type_info(t);
  const int offset = t == GgmlType::Q4_0 ? 8 : t == GgmlType::Q5_0 ? 16 : 0;
  const bool with_min = t == GgmlType::Q4_1 || t == GgmlType::Q5_1;
  float acc = 0.f;
  int c[32];
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = row + size_t(b) * size_t(info.block_bytes);
    codes_32(t, blk, c);
    int s = 0;
    for (int j = 0; j < 32; ++j) s += (c[j] - offset) * q[32 * b + j];
    acc += f16_at(blk) * d8[b] * float(s);
    if (with_min) acc += f16_at(blk + 2) * d8[b] * float(sums[2 * b] + sums[2 * b + 1]);
  }
  return acc;
}

// Q4_K, Q5_K: sum_b d8_b (d_b sum_j sc_j dot_j - dmin_b sum_j m_j sum_j(q)), j over 32-value
// sub-blocks, dot_j in integers.
float dot_k45(GgmlType t, const uint8_t* row, int nb, const int8_t* q, const float* d8, const int16_t* sums) {
  const bool five = t == GgmlType::Q5_K;
  const int bytes = five ? 176 : 144;
  float acc = 0.f;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = row + size_t(b) * size_t(bytes);
    const uint8_t* qh = blk + 16;
    const uint8_t* qs = blk + (five ? 48 : 16);
    const int8_t* qb = q + 256 * b;
    int isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      const GgmlScaleMin sm = ggml_k_scale_min(blk + 4, j);
      const uint8_t* p = qs + 32 * (j / 2);
      int s = 0;
      for (int l = 0; l < 32; ++l) {
        int c = j % 2 == 0 ? p[l] & 0xf : p[l] >> 4;
        if (five) c |= ((qh[l] >> j) & 1) << 4;
        s += c * qb[32 * j + l];
      }
      isum += int(sm.scale) * s;
      msum += int(sm.min) * (sums[16 * b + 2 * j] + sums[16 * b + 2 * j + 1]);
    }
    acc += d8[b] * f16_at(blk) * float(isum);
    acc += d8[b] * -f16_at(blk + 2) * float(msum);
  }
  return acc;
}

// Q6_K: sum_b d_b d8_b sum_g sc_g (dot_g(c, q) - 32 sum_g(q)), g over 16-value groups.
float dot_q6k(const uint8_t* row, int nb, const int8_t* q, const float* d8, const int16_t* sums) {
  float acc = 0.f;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = row + size_t(b) * 210u;
    const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const int8_t* qb = q + 256 * b;
    int isum = 0;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = blk + 64 * half;
      const uint8_t* qh = blk + 128 + 32 * half;
      for (int s = 0; s < 4; ++s)
        for (int part = 0; part < 2; ++part) {
          const int g = 8 * half + 2 * s + part;
          int dot = 0;
          for (int l = 16 * part; l < 16 * part + 16; ++l) {
            const int lo = s < 2 ? ql[l + 32 * s] & 0xf : ql[l + 32 * (s - 2)] >> 4;
            dot += (lo | ((qh[l] >> (2 * s)) & 3) << 4) * qb[128 * half + 32 * s + l];
          }
          isum += int(sc[g]) * (dot - 32 * sums[16 * b + g]);
        }
    }
    acc += f16_at(blk + 208) * d8[b] * float(isum);
  }
  return acc;
}

void scalar_rows(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0, int r1) {
  const GgmlTypeInfo info = ggml_type_info(w.ggml);
  const int nb = w.cols / info.block_elems;
  const int nd = a.K / a.block;
  std::vector<uint8_t> unpacked(w.ggml_pack ? size_t(nb) * size_t(info.block_bytes) : 0);
  for (int r = r0; r < r1; ++r) {
    const uint8_t* row;
    if (w.ggml_pack) {
      ggml_unpack_row(w, r, unpacked.data());
      row = unpacked.data();
    } else {
      row = static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes();
    }
    for (int t = 0; t < a.T; ++t) {
      const int8_t* q = a.q + size_t(t) * size_t(a.K);
      const float* d8 = a.d + size_t(t) * size_t(nd);
      const int16_t* sums = a.sums + size_t(t) * size_t(a.K / 16);
      float v;
      switch (w.ggml) {
        case GgmlType::Q4_K: case GgmlType::Q5_K: v = dot_k45(w.ggml, row, nb, q, d8, sums); break;
        case GgmlType::Q6_K: v = dot_q6k(row, nb, q, d8, sums); break;
        default: v = dot_32(w.ggml, row, nb, q, d8, sums); break;
      }
      y[size_t(t) * size_t(w.rows) + size_t(r)] = v + (bias ? bias[r] : 0.f);
    }
  }
}



bool cpu_has_vnni() { return cpu_features().avx512vnni; }
bool cpu_has_dotprod() { return cpu_features().dotprod; }
bool cpu_has_i8mm() { return cpu_features().dotprod && cpu_features().i8mm; }

// Fewest weights a thread's share of a product holds (as ops.cpp's gemv): below it, handing work to
// another thread costs more than it saves.
constexpr size_t kMinWeightsPerThread = 32 * 1024;
// Rows of x at or below which the product is a gemv (each weight row read once, decoded in
// registers for all of them).
constexpr int kGemvMaxT = 4;
static_assert(kGemvMaxT <= kMatmulSmallRows);  // ops.h

// The generic product (types without integer kernels): each row dequantized once, then dotted with
// every x row.
void generic_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool) {
  pool.parallel_for(size_t(w.rows), [&](size_t b, size_t e) {
    std::vector<float> row(size_t(w.cols));
    for (size_t r = b; r < e; ++r) {
      ggml_dequant_row(w, int(r), row.data());
      for (int t = 0; t < T; ++t)
        y[size_t(t) * size_t(w.rows) + r] =
            dot(x + size_t(t) * size_t(w.cols), row.data(), w.cols) + (bias ? bias[r] : 0.f);
    }
  });
}

}  // namespace

int ggml_act_block(GgmlType t) {
  switch (t) {
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return 256;
    default: return 32;
  }
}

void ggml_quantize_acts(const float* x, int K, int block, int t0, int t1, int8_t* q, float* d, int16_t* sums) {
  const int nd = K / block;
  for (int t = t0; t < t1; ++t) {
    const float* xt = x + size_t(t) * size_t(K);
    int8_t* qt = q + size_t(t) * size_t(K);
    for (int b = 0; b < nd; ++b) {
      const float* xb = xt + size_t(b) * size_t(block);
      float amax = 0.f;
      for (int i = 0; i < block; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float db = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
      d[size_t(t) * size_t(nd) + size_t(b)] = db;
      int8_t* qb = qt + size_t(b) * size_t(block);
      for (int i = 0; i < block; ++i) qb[i] = int8_t(std::clamp(int(std::lrint(xb[i] * id)), -127, 127));
    }
    int16_t* st = sums + size_t(t) * size_t(K / 16);
    for (int g = 0; g < K / 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += qt[16 * g + i];
      st[g] = int16_t(s);
    }
  }
}

namespace {
constexpr GgmlKernel kScalar{"scalar", scalar_rows, ggml_quantize_acts};
}  // namespace

const GgmlKernel* const* ggml_kernels(int* n) {
  static const std::vector<const GgmlKernel*> list = [] {
    std::vector<const GgmlKernel*> l{&kScalar};
    if (kernel_table(SimdTarget::AVX2) && detail::ggml_avx2_kernel()) l.push_back(detail::ggml_avx2_kernel());
    if (kernel_table(SimdTarget::AVX512)) {
      if (detail::ggml_avx512_kernel()) l.push_back(detail::ggml_avx512_kernel());
      if (cpu_has_vnni() && detail::ggml_avx512vnni_kernel()) l.push_back(detail::ggml_avx512vnni_kernel());
    }
    if (kernel_table(SimdTarget::NEON)) {
      if (detail::ggml_neon_kernel()) l.push_back(detail::ggml_neon_kernel());
      if (cpu_has_dotprod() && detail::ggml_neon_dotprod_kernel()) l.push_back(detail::ggml_neon_dotprod_kernel());
      if (cpu_has_i8mm() && detail::ggml_neon_i8mm_kernel()) l.push_back(detail::ggml_neon_i8mm_kernel());
    }
    return l;
  }();
  *n = int(list.size());
  return list.data();
}

const GgmlKernel& ggml_active_kernel() {
  switch (active_simd_target()) {
    case SimdTarget::NEON:
      if (cpu_has_i8mm() && detail::ggml_neon_i8mm_kernel()) return *detail::ggml_neon_i8mm_kernel();
      if (cpu_has_dotprod() && detail::ggml_neon_dotprod_kernel()) return *detail::ggml_neon_dotprod_kernel();
      if (detail::ggml_neon_kernel()) return *detail::ggml_neon_kernel();
      return kScalar;
    case SimdTarget::AVX512:
      if (cpu_has_vnni() && detail::ggml_avx512vnni_kernel()) return *detail::ggml_avx512vnni_kernel();
      if (detail::ggml_avx512_kernel()) return *detail::ggml_avx512_kernel();
      [[fallthrough]];
    case SimdTarget::AVX2:
      if (detail::ggml_avx2_kernel()) return *detail::ggml_avx2_kernel();
      [[fallthrough]];
    default: return kScalar;
  }
}

GgmlRowsFn ggml_panel_rows(GgmlType t) {
  const GgmlKernel& k = ggml_active_kernel();
  if (&k == detail::ggml_avx512vnni_kernel()) return detail::ggml_avx512vnni_panel_rows(t);
  if (&k == detail::ggml_avx512_kernel()) return detail::ggml_avx512_panel_rows(t);
  return nullptr;
}

bool ggml_int_kernel(GgmlType t) { return has_int_kernel(t); }

// ---- the 32-value types, Q4_K, Q5_K and Q6_K packed ------------------------------------------------------

namespace {
// Q4_K: value v is sub-block j = v / 32's code l = v % 32, the low (even j) or high (odd j)
// nibble of qs[32 (j / 2) + l]; Q5_K (qs at 48): bit j of qh[l] (at 16) its fifth bit.
void k45_set_code(uint8_t* blk, bool five, int v, int code) {
  const int j = v / 32, l = v % 32;
  uint8_t& b = blk[(five ? 48 : 16) + 32 * (j / 2) + l];
  b = j % 2 == 0 ? uint8_t((b & 0xf0) | (code & 0xf)) : uint8_t((b & 0x0f) | (code & 0xf) << 4);
  if (five) blk[16 + l] = uint8_t((blk[16 + l] & ~(1 << j)) | (code >> 4) << j);
}
int k45_code(const uint8_t* blk, bool five, int v) {
  const int j = v / 32, l = v % 32;
  const uint8_t q = blk[(five ? 48 : 16) + 32 * (j / 2) + l];
  return (j % 2 == 0 ? q & 0xf : q >> 4) | (five ? ((blk[16 + l] >> j) & 1) << 4 : 0);
}
// Q6_K: value v = 128 h + 32 s + l takes ql[64 h + 32 (s % 2) + l]'s low (s < 2) or high nibble and
// bits 2s, 2s + 1 of qh[32 h + l] (as dot_q6k above reads them).
void q6k_set_code(uint8_t* blk, int v, int code) {
  const int h = v / 128, s = v % 128 / 32, l = v % 32;
  uint8_t& q = blk[64 * h + 32 * (s % 2) + l];
  q = s < 2 ? uint8_t((q & 0xf0) | (code & 0xf)) : uint8_t((q & 0x0f) | (code & 0xf) << 4);
  uint8_t& hb = blk[128 + 32 * h + l];
  hb = uint8_t((hb & ~(3 << (2 * s))) | (code >> 4) << (2 * s));
}
std::atomic<bool>& ggml_pack_flag() {
  static std::atomic<bool> on{!env_switch("PTLLM_NO_GGML_PACK")};
  return on;
}
// A 32-value block's place in a packed unit (ggml.h): h of its two blocks, row i of the 16. The
// code bytes hold 4 values of a row a lane: Q4_0/Q5_0/Q4_1/Q5_1 a 64-byte line per 8 values
// (qs[4c + k]: the nibbles of values 4c + k and 16 + 4c + k), Q8_0 one per 4 values (stored + 128).
// The fifth bits of the values of line c go to bits c (low nibble's value) and 4 + c (high one's) of
// byte 4i + k of the 64 bytes before its lines. Q4_1/Q5_1 keep m after the unit's d.
struct Unit32 {
  int lines, codes;  // code lines a block; the block's first code byte from the unit's start
  uint32_t flip;
  bool min, fifth;
  int qh, qs;  // the file block's fifth bits and nibbles
};
Unit32 unit32(GgmlType t, int h) {
  using namespace ggml_layout;
  const int codes = head32_bytes(t) + block32_bytes(t) * h + (with_fifth(t) ? 64 : 0);
  if (t == GgmlType::Q8_0) return {8, codes, 0x80808080u, false, false, 0, 2};
  const bool min = with_min(t), fifth = with_fifth(t);
  const int scales = min ? 4 : 2;
  return {4, codes, 0, min, fifth, scales, scales + (fifth ? 4 : 0)};
}
void pack32_block(GgmlType t, const uint8_t* blk, uint8_t* o, int h, int i) {
  const Unit32 u = unit32(t, h);
  std::memcpy(o + 32 * h + 2 * i, blk, 2);
  if (u.min) std::memcpy(o + 64 + 32 * h + 2 * i, blk + 2, 2);
  const uint8_t* qs = blk + u.qs;
  for (int k = 0; k < u.lines; ++k) {
    uint32_t v;
    std::memcpy(&v, qs + 4 * k, 4);
    v ^= u.flip;
    std::memcpy(o + u.codes + 64 * k + 4 * i, &v, 4);
  }
  if (!u.fifth) return;
  uint32_t qh;
  std::memcpy(&qh, blk + u.qh, 4);
  for (int k = 0; k < 4; ++k) {
    uint8_t b = 0;
    for (int c = 0; c < 4; ++c) b |= uint8_t(((qh >> (4 * c + k)) & 1) << c | ((qh >> (16 + 4 * c + k)) & 1) << (4 + c));
    o[u.codes - 64 + 4 * i + k] = b;
  }
}
void unpack32_block(GgmlType t, const uint8_t* o, int h, int i, uint8_t* blk) {
  const Unit32 u = unit32(t, h);
  std::memcpy(blk, o + 32 * h + 2 * i, 2);
  if (u.min) std::memcpy(blk + 2, o + 64 + 32 * h + 2 * i, 2);
  uint8_t* qs = blk + u.qs;
  for (int k = 0; k < u.lines; ++k) {
    uint32_t v;
    std::memcpy(&v, o + u.codes + 64 * k + 4 * i, 4);
    v ^= u.flip;
    std::memcpy(qs + 4 * k, &v, 4);
  }
  if (!u.fifth) return;
  uint32_t qh = 0;
  for (int k = 0; k < 4; ++k) {
    const uint8_t b = o[u.codes - 64 + 4 * i + k];
    for (int c = 0; c < 4; ++c) qh |= uint32_t((b >> c) & 1) << (4 * c + k) | uint32_t((b >> (4 + c)) & 1) << (16 + 4 * c + k);
  }
  std::memcpy(blk + u.qh, &qh, 4);
}
// Sub-block j's bytes in a packed Q4_K / Q5_K block: Q4_K's four code lines, Q5_K's 64 bytes of
// fifth bits before them (ggml.h).
int k45_sub_block(bool five, int j) { return ggml_layout::k45_lines(five, j) - (five ? 64 : 0); }
const uint8_t* packed_block(const WeightMatrix& w, int g, int b) {
  return static_cast<const uint8_t*>(w.data) +
         (size_t(g) * size_t(w.cols / ggml_pack_block_elems(w.ggml)) + size_t(b)) * size_t(ggml_pack_block_bytes(w.ggml));
}
}  // namespace

int ggml_pack_block_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
      return ggml_layout::unit32_bytes(t);
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: return ggml_layout::k_block_bytes(t);
    default: return 0;
  }
}

int ggml_pack_block_elems(GgmlType t) {
  return ggml_type_info(t).block_elems == 32 ? 64 : 256;
}

bool ggml_pack_fit(const WeightMatrix& w) {
  return w.format == WeightFormat::Ggml && ggml_pack_block_bytes(w.ggml) > 0 && !w.ggml_pack && w.rows > 0 &&
         w.rows % kGgmlPackRows == 0 && w.cols > 0 && w.cols % ggml_pack_block_elems(w.ggml) == 0;
}

bool ggml_pack_wanted(GgmlType t) {
  if (!ggml_pack_flag() || ggml_pack_block_bytes(t) == 0) return false;
  const GgmlKernel& k = ggml_active_kernel();
  return &k == detail::ggml_avx512vnni_kernel() || &k == detail::ggml_avx2_kernel();
}

bool ggml_pack_wanted() { return ggml_pack_wanted(GgmlType::Q4_0); }

void set_ggml_pack_enabled(bool on) { ggml_pack_flag() = on; }

size_t ggml_packed_bytes(const WeightMatrix& w) {
  return size_t(w.rows / kGgmlPackRows) * size_t(w.cols / ggml_pack_block_elems(w.ggml)) *
         size_t(ggml_pack_block_bytes(w.ggml));
}

void ggml_pack(const WeightMatrix& w, void* out, int g0, int g1) {
  PTLLM_CHECK(ggml_pack_fit(w) && g0 >= 0 && g1 <= w.rows / kGgmlPackRows);
  const size_t rb = w.row_bytes();
  if (ggml_pack_block_elems(w.ggml) == 64) {
    // Two blocks of 16 rows: their d (and m), then per block its code bytes 4 a lane (Q8_0's + 128),
    // after the Q5 types' fifth bits (ggml.h).
    const int nu = w.cols / 64, in_bytes = ggml_type_info(w.ggml).block_bytes;
    const size_t unit = size_t(ggml_pack_block_bytes(w.ggml));
    for (int g = g0; g < g1; ++g)
      for (int u = 0; u < nu; ++u) {
        uint8_t* o = static_cast<uint8_t*>(out) + (size_t(g) * size_t(nu) + size_t(u)) * unit;
        for (int i = 0; i < kGgmlPackRows; ++i)
          for (int h = 0; h < 2; ++h) {
            const uint8_t* row = static_cast<const uint8_t*>(w.data) + size_t(16 * g + i) * rb;
            pack32_block(w.ggml, row + size_t(2 * u + h) * size_t(in_bytes), o, h, i);
          }
      }
    return;
  }
  const int nb = w.cols / 256, bytes = ggml_pack_block_bytes(w.ggml), in_bytes = ggml_type_info(w.ggml).block_bytes;
  const bool six = w.ggml == GgmlType::Q6_K;
  for (int g = g0; g < g1; ++g)
    for (int b = 0; b < nb; ++b) {
      uint8_t* o = static_cast<uint8_t*>(out) + (size_t(g) * size_t(nb) + size_t(b)) * size_t(bytes);
      for (int i = 0; i < kGgmlPackRows; ++i) {
        const uint8_t* blk = static_cast<const uint8_t*>(w.data) + size_t(16 * g + i) * rb + size_t(b) * size_t(in_bytes);
        // The block's codes first (one pass over its bytes), then placed.
        uint8_t codes[256];
        if (six) {
          for (int h = 0; h < 2; ++h)
            for (int l = 0; l < 32; ++l) {
              const uint8_t q0 = blk[64 * h + l], q1 = blk[64 * h + 32 + l], qh = blk[128 + 32 * h + l];
              codes[128 * h + l] = uint8_t((q0 & 0xf) | (qh & 3) << 4);
              codes[128 * h + 32 + l] = uint8_t((q1 & 0xf) | ((qh >> 2) & 3) << 4);
              codes[128 * h + 64 + l] = uint8_t((q0 >> 4) | ((qh >> 4) & 3) << 4);
              codes[128 * h + 96 + l] = uint8_t((q1 >> 4) | ((qh >> 6) & 3) << 4);
            }
          std::memcpy(o + 2 * i, blk + 208, 2);
          for (int gs = 0; gs < 16; ++gs) {
            o[32 + 16 * gs + i] = blk[192 + gs];
            uint8_t* c = o + 288 + 192 * gs + 4 * i;
            const uint8_t* v = codes + 16 * gs;
            for (int k = 0; k < 4; ++k) {
              c[k] = uint8_t((v[k] & 0xf) | (v[k + 4] & 0xf) << 4);
              c[64 + k] = uint8_t((v[k + 8] & 0xf) | (v[k + 12] & 0xf) << 4);
              c[128 + k] = uint8_t(v[k] >> 4 | (v[k + 4] >> 4) << 2 | (v[k + 8] >> 4) << 4 | (v[k + 12] >> 4) << 6);
            }
          }
          continue;
        }
        const bool five = w.ggml == GgmlType::Q5_K;
        for (int v = 0; v < 256; ++v) codes[v] = uint8_t(k45_code(blk, five, v));
        std::memcpy(o + 2 * i, blk, 2);
        std::memcpy(o + 32 + 2 * i, blk + 2, 2);
        for (int j = 0; j < 8; ++j) {
          const GgmlScaleMin sm = ggml_k_scale_min(blk + 4, j);
          o[64 + 16 * j + i] = sm.scale;
          o[192 + 32 * (j / 2) + 2 * i + j % 2] = sm.min;
        }
        for (int j = 0; j < 8; ++j) {
          uint8_t* sub = o + k45_sub_block(five, j);
          uint8_t fifth[4] = {};
          for (int c = 0; c < 4; ++c) {
            const uint8_t* v = codes + 32 * j + 8 * c;
            uint8_t* dst = sub + (five ? 64 : 0) + 64 * c + 4 * i;
            for (int k = 0; k < 4; ++k) {
              dst[k] = uint8_t((v[k] & 0xf) | (v[k + 4] & 0xf) << 4);
              fifth[k] |= uint8_t((v[k] >> 4) << c | (v[k + 4] >> 4) << (4 + c));
            }
          }
          if (five) std::memcpy(sub + 4 * i, fifth, 4);
        }
      }
    }
}

WeightMatrix ggml_packed_matrix(GgmlType t, const void* data, int rows, int cols) {
  WeightMatrix w = ggml_matrix(t, data, rows, cols);
  PTLLM_CHECK(ggml_pack_block_bytes(t) > 0 && rows % kGgmlPackRows == 0 && cols % ggml_pack_block_elems(t) == 0);
  w.ggml_pack = kGgmlPackRows;
  return w;
}

void ggml_unpack_row(const WeightMatrix& w, int r, uint8_t* blocks) {
  PTLLM_CHECK(w.ggml_pack == kGgmlPackRows && ggml_pack_block_bytes(w.ggml) > 0 && r >= 0 && r < w.rows);
  const int g = r / kGgmlPackRows, i = r % kGgmlPackRows;
  const int out_bytes = ggml_type_info(w.ggml).block_bytes;
  if (ggml_pack_block_elems(w.ggml) == 64) {
    for (int u = 0; u < w.cols / 64; ++u)
      for (int h = 0; h < 2; ++h)
        unpack32_block(w.ggml, packed_block(w, g, u), h, i, blocks + size_t(2 * u + h) * size_t(out_bytes));
    return;
  }
  const int nb = w.cols / 256;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* o = packed_block(w, g, b);
    uint8_t* blk = blocks + size_t(b) * size_t(out_bytes);
    if (w.ggml == GgmlType::Q6_K) {
      std::memcpy(blk + 208, o + 2 * i, 2);
      for (int gs = 0; gs < 16; ++gs) {
        blk[192 + gs] = o[32 + 16 * gs + i];
        const uint8_t* c = o + 288 + 192 * gs + 4 * i;
        for (int k = 0; k < 4; ++k)
          for (int cc = 0; cc < 4; ++cc) {
            const uint8_t nib = c[64 * (cc / 2) + k];
            const int low = cc % 2 == 0 ? nib & 0xf : nib >> 4;
            q6k_set_code(blk, 16 * gs + 4 * cc + k, low | ((c[128 + k] >> (2 * cc)) & 3) << 4);
          }
      }
      continue;
    }
    std::memcpy(blk, o + 2 * i, 2);
    std::memcpy(blk + 2, o + 32 + 2 * i, 2);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) sc[j] = o[64 + 16 * j + i], mn[j] = o[192 + 32 * (j / 2) + 2 * i + j % 2];
    uint8_t* s12 = blk + 4;  // the packing ggml_k_scale_min reads (ggml.h)
    for (int j = 0; j < 4; ++j) {
      s12[j] = uint8_t((sc[j] & 0x3f) | (sc[j + 4] >> 4) << 6);
      s12[j + 4] = uint8_t((mn[j] & 0x3f) | (mn[j + 4] >> 4) << 6);
      s12[j + 8] = uint8_t((sc[j + 4] & 0xf) | (mn[j + 4] & 0xf) << 4);
    }
    const bool five = w.ggml == GgmlType::Q5_K;
    for (int j = 0; j < 8; ++j) {
      const uint8_t* sub = o + k45_sub_block(five, j);
      for (int c = 0; c < 4; ++c)
        for (int k = 0; k < 8; ++k) {
          const uint8_t byte = sub[(five ? 64 : 0) + 64 * c + 4 * i + k % 4];
          const int fifth = five ? (sub[4 * i + k % 4] >> (k < 4 ? c : 4 + c)) & 1 : 0;
          k45_set_code(blk, five, 32 * j + 8 * c + k, (k < 4 ? byte & 0xf : byte >> 4) | fifth << 4);
        }
    }
  }
}

namespace {
// x quantized once a call, into buffers reused by every call of this thread (the pool's workers
// only read them).
GgmlActs quantize_x(const float* x, int T, int K, int block, const GgmlKernel& k, ThreadPool& pool) {
  PTLLM_CHECK(K % block == 0);
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> d;
  thread_local std::vector<int16_t> sums;
  if (q.size() < size_t(T) * size_t(K)) q.resize(size_t(T) * size_t(K));
  if (d.size() < size_t(T) * size_t(K / block)) d.resize(size_t(T) * size_t(K / block));
  if (sums.size() < size_t(T) * size_t(K / 16)) sums.resize(size_t(T) * size_t(K / 16));
  // Pointers taken here: inside the workers' lambdas `q` would name each worker's own thread_local.
  int8_t* const qp = q.data();
  float* const dp = d.data();
  int16_t* const sp = sums.data();
  const size_t t_grain = std::max<size_t>(1, 64 * 1024 / size_t(K));
  pool.parallel_for(
      size_t(T), [&](size_t b, size_t e) { k.quantize(x, K, block, int(b), int(e), qp, dp, sp); }, t_grain);
  return GgmlActs{T, K, block, qp, dp, sp};
}

// Parts of whole 16-row tiles (the kernels' row tile): a gemv's at least kMinWeightsPerThread
// weights, a gemm's about two per thread (each part walks all of x once).
size_t row_grain(int T, size_t rows, int K, const ThreadPool& pool) {
  size_t grain;
  if (T <= kGemvMaxT) {
    grain = std::max<size_t>(16, kMinWeightsPerThread / size_t(K));
  } else {
    const size_t per = (rows + 2 * size_t(pool.size()) - 1) / (2 * size_t(pool.size()));
    grain = std::min<size_t>(512, per);
  }
  return std::max<size_t>(16, (grain + 15) / 16 * 16);
}
}  // namespace

void ggml_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool) {
  if (!ggml_supported(w.ggml))
    throw Error("GGML tensor type " + std::string(ggml_type_info(w.ggml).name) + ": not supported by the kernels");
  if (!has_int_kernel(w.ggml)) return generic_matmul(x, T, w, bias, y, pool);
  const MatmulOutput out{&w, bias, y};
  ggml_matmul(x, T, std::span(&out, 1), pool);
}

bool ggml_matmul_shares(std::span<const MatmulOutput> outs) {
  return !outs.empty() && std::all_of(outs.begin(), outs.end(), [&](const MatmulOutput& o) {
    return o.w->format == WeightFormat::Ggml && ggml_supported(o.w->ggml) && has_int_kernel(o.w->ggml) &&
           o.w->cols == outs[0].w->cols && ggml_act_block(o.w->ggml) == ggml_act_block(outs[0].w->ggml);
  });
}

void ggml_matmul(const float* x, int T, std::span<const MatmulOutput> outs, ThreadPool& pool) {
  PTLLM_CHECK(ggml_matmul_shares(outs));
  const GgmlKernel& k = ggml_active_kernel();
  const int K = outs[0].w->cols;
  const GgmlActs a = quantize_x(x, T, K, ggml_act_block(outs[0].w->ggml), k, pool);
  if (T > kGemvMaxT) {  // prefill: each matrix's own parts (a gemm's tiles walk all of x once a part)
    for (const MatmulOutput& o : outs)
      pool.parallel_for(
          size_t(o.w->rows), [&](size_t b, size_t e) { k.rows(*o.w, a, o.bias, o.y, int(b), int(e)); },
          row_grain(T, size_t(o.w->rows), K, pool));
    return;
  }
  // Decode: the tiles of every output in turn, one call; a part may cross from one matrix into the next.
  constexpr int kTile = 16;
  pool.parallel_for(
      groups_of(outs, kTile),
      [&](size_t b, size_t e) {
        for_each_share(outs, kTile, b, e, [&](const MatmulOutput& o, int g0, int g1) {
          k.rows(*o.w, a, o.bias, o.y, g0 * kTile, std::min(g1 * kTile, o.w->rows));
        });
      },
      row_grain(T, 0, K, pool) / kTile);
}

}  // namespace ptllm
