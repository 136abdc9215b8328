#include "kernels/affine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/platform.h"
#include "core/thread_pool.h"
#include "kernels/affine_q8.h"
#include "kernels/ops.h"
#include "kernels/simd.h"

namespace ptllm {

namespace {
// Packed matrices (affine.h): bytes of one group of columns of a 16-row group, and where row i's
// scales and dword q of block b (of the group) lie in it.
size_t packed_group_bytes(const WeightMatrix& w) {
  return 2 * size_t(kAffinePackRows) * dtype_size(w.dtype) + size_t(w.group_size) * size_t(w.bits) * 2;
}
const uint8_t* packed_group(const WeightMatrix& w, int r, int g) {
  return static_cast<const uint8_t*>(w.data) +
         (size_t(r / kAffinePackRows) * size_t(w.cols / w.group_size) + size_t(g)) * packed_group_bytes(w);
}
size_t packed_dword(const WeightMatrix& w, int i, int b, int q) {
  return 2 * size_t(kAffinePackRows) * dtype_size(w.dtype) + size_t(64 * (b * w.bits + q) + 4 * i);
}
// 6 bits (affine.h): the column of a block that byte k of code register n (0..7) holds, in x's split
// order of 4 bits (position 4 n + k: even columns first, then odd).
int packed6_col(int n, int k) {
  const int pos = 4 * n + k;
  return pos < 16 ? 2 * pos : 2 * (pos - 16) + 1;
}
// Where the parts of code c of byte k of register n (0..7) lie (affine.h), j = n % 4: in byte k of
// dword j, c & 15 at bit 0 (n < 4) or c >> 2 at bit 4 (n >= 4); in byte k of dword 4 + j / 2, the
// other two bits (c >> 4, or c & 3) at bit packed6_shift(n).
int packed6_shift(int n) {
  const int j = n % 4;
  return n < 4 ? (j % 2 ? 0 : 4) : (j % 2 ? 6 : 2);
}
unsigned packed6_code(const uint8_t* p, const WeightMatrix& w, int i, int b, int n, int k) {
  const int j = n % 4;
  const unsigned lo = p[packed_dword(w, i, b, j) + size_t(k)], hi = p[packed_dword(w, i, b, 4 + j / 2) + size_t(k)];
  const unsigned two = (hi >> packed6_shift(n)) & 3u;
  return n < 4 ? (lo & 15u) | (two << 4) : ((lo >> 4) << 2) | two;
}

std::atomic<bool>& affine_pack_flag() {
  static std::atomic<bool> on{!env_switch("PTLLM_NO_AFFINE_PACK")};
  return on;
}
}  // namespace

bool affine_pack_fit(const WeightMatrix& w) {
  return w.format == WeightFormat::Affine && !w.affine_pack && (affine_fast(w) || (affine_unpacked(w) && w.bits == 6)) &&
         w.rows > 0 && w.rows % kAffinePackRows == 0 && w.group_size <= 512;
}

bool affine_pack_wanted() {
  const AffineKernel k = affine_active_kernel();
  return affine_pack_flag() && (k == AffineKernel::AVX512Vnni || k == AffineKernel::AVX2 || k == AffineKernel::AVX2Vnni) &&
         affine_active_table().packed != nullptr;
}

void set_affine_pack_enabled(bool on) { affine_pack_flag() = on; }

void affine_pack(const WeightMatrix& w, void* out, int g0, int g1) {
  PTLLM_CHECK(affine_pack_fit(w) && g0 >= 0 && g1 <= w.rows / kAffinePackRows);
  constexpr int R = kAffinePackRows;
  const int G = w.cols / w.group_size, nbg = w.group_size / kQ8Block, bits = w.bits;
  const size_t es = dtype_size(w.dtype), rb = w.row_bytes(), block = size_t(kQ8Block) * size_t(bits) / 8;
  const size_t gb = packed_group_bytes(w), head = 2 * size_t(R) * es;  // head: the scales and biases
  const auto* scales = static_cast<const uint8_t*>(w.scales);
  const auto* biases = static_cast<const uint8_t*>(w.biases);
  // 6 bits: the group's 16 rows unpacked to a byte a code first.
  std::vector<uint8_t> codes(bits == 6 ? size_t(R) * size_t(w.cols) : 0);
  for (int rg = g0; rg < g1; ++rg) {
    const size_t r0 = size_t(rg) * R;
    const uint8_t* rows = static_cast<const uint8_t*>(w.data) + r0 * rb;
    if (bits == 6)
      for (int i = 0; i < R; ++i) affine_unpack_codes(w, int(r0) + i, codes.data() + size_t(i) * size_t(w.cols));
    uint8_t* o = static_cast<uint8_t*>(out) + size_t(rg) * size_t(G) * gb;
    for (int g = 0; g < G; ++g, o += gb) {
      for (int i = 0; i < R; ++i) {
        const size_t at = (r0 + size_t(i)) * size_t(G) + size_t(g);
        std::memcpy(o + size_t(i) * es, scales + at * es, es);
        std::memcpy(o + size_t(R + i) * es, biases + at * es, es);
      }
      for (int b = 0; b < nbg; ++b) {
        uint8_t* ob = o + head + size_t(64) * size_t(b * bits);  // dword q of row i at 64 q + 4 i
        if (bits != 6) {
          const uint8_t* src = rows + size_t(g * nbg + b) * block;
          for (int q = 0; q < bits; ++q)
            for (int i = 0; i < R; ++i) std::memcpy(ob + 64 * q + 4 * i, src + size_t(i) * rb + 4 * size_t(q), 4);
          continue;
        }
        for (int i = 0; i < R; ++i) {
          const uint8_t* c = codes.data() + size_t(i) * size_t(w.cols) + size_t(g * nbg + b) * kQ8Block;
          uint8_t d[6][4] = {};  // the row's 6 dwords, built in registers (no aliasing stores)
          for (int n = 0; n < 8; ++n)
            for (int k = 0; k < 4; ++k) {
              const unsigned v = c[packed6_col(n, k)];
              d[n % 4][k] |= uint8_t(n < 4 ? v & 15u : (v >> 2) << 4);
              d[4 + n % 4 / 2][k] |= uint8_t((n < 4 ? v >> 4 : v & 3u) << packed6_shift(n));
            }
          for (int q = 0; q < 6; ++q) std::memcpy(ob + 64 * q + 4 * i, d[q], 4);
        }
      }
    }
  }
}

WeightMatrix affine_packed_matrix(const WeightMatrix& w, const void* data) {
  PTLLM_CHECK(affine_pack_fit(w));
  WeightMatrix p = w;
  p.data = data;
  p.scales = p.biases = nullptr;  // inside data
  p.affine_pack = kAffinePackRows;
  return p;
}

void affine_packed_rows_scalar(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0,
                               int r1, bool centred8) {
  PTLLM_CHECK(w.affine_pack == kAffinePackRows && x.chunk == kQ8Block && r0 % kAffinePackRows == 0 &&
              r1 % kAffinePackRows == 0);
  constexpr int KC = 512, L = kAffinePackRows;  // as affine_impl.h's packed_block
  const int K = w.cols, gs = w.group_size, nbg = gs / kQ8Block, kpb = 8 / w.bits;
  const size_t es = dtype_size(w.dtype);
  const unsigned mask = (1u << w.bits) - 1u;
  const bool centred = centred8 && w.bits == 8;
  const int mid = centred ? 128 : 0;
  for (int r = r0; r < r1; r += L)
    for (int k0 = 0; k0 < K; k0 += KC) {
      const int kc = std::min(KC, K - k0);
      for (int t = 0; t < x.T; ++t) {
        float acc[L] = {};
        for (int g = k0 / gs; g < (k0 + kc) / gs; ++g) {
          const uint8_t* p = packed_group(w, r, g);
          for (int b = 0; b < nbg; ++b) {
            const int kb = g * nbg + b;
            const int8_t* q = x.q + size_t(t) * x.ldq + size_t(kb) * kQ8Block;
            const float d = x.d[size_t(t) * x.ldd + size_t(kb)];
            for (int i = 0; i < L; ++i) {
              int isum = 0;
              if (w.bits == 6)  // register n meets x's bytes 4 n + k
                for (int n = 0; n < 8; ++n)
                  for (int k = 0; k < 4; ++k) isum += int(packed6_code(p, w, i, b, n, k)) * int(q[4 * n + k]);
              else
                for (int dw = 0; dw < w.bits; ++dw)
                  for (int k = 0; k < 4; ++k) {
                    const unsigned byte = p[packed_dword(w, i, b, dw) + size_t(k)];
                    for (int sc = 0; sc < kpb; ++sc)  // x's split order: bytes 4 (s * bits + q) + k
                      isum += (int((byte >> (sc * w.bits)) & mask) - mid) * int(q[4 * (sc * w.bits + dw) + k]);
                  }
              const float s = affine_param(p, w.dtype, size_t(i));
              acc[i] = std::fma(float(isum), s * d, acc[i]);
            }
          }
          const size_t xt = size_t(t) * x.ldg + size_t(g);
          for (int i = 0; i < L; ++i) {
            const float s = affine_param(p, w.dtype, size_t(i)), bi = affine_param(p + L * es, w.dtype, size_t(i));
            acc[i] = std::fma(s, centred ? 128.f * x.xs[xt] : x.xc[xt], std::fma(bi, x.xs[xt], acc[i]));
          }
        }
        float* yt = y + size_t(t) * size_t(w.rows) + size_t(r);
        for (int i = 0; i < L; ++i) {
          const float before = k0 > 0 ? yt[i] : bias ? bias[r + i] : 0.f;
          yt[i] = acc[i] + before;
        }
      }
    }
}

void affine_dequant_row(const WeightMatrix& w, int r, float* out) {
  if (w.affine_pack) {
    const int gs = w.group_size, kpb = 8 / w.bits, i = r % kAffinePackRows;
    const size_t es = dtype_size(w.dtype);
    const unsigned mask = (1u << w.bits) - 1u;
    for (int g = 0; g < w.cols / gs; ++g) {
      const uint8_t* p = packed_group(w, r, g);
      const float s = affine_param(p, w.dtype, size_t(i)), b = affine_param(p + kAffinePackRows * es, w.dtype, size_t(i));
      for (int k = 0; k < gs; ++k) {  // column k of the group: block k / 32, byte (k % 32) / kpb of it
        const int kb = k / kQ8Block, j = k % kQ8Block, byte = j / kpb;
        if (w.bits == 6) {  // position pos of x's split order: register pos / 4, byte pos % 4
          const int pos = j % 2 ? 16 + j / 2 : j / 2;
          out[g * gs + k] = s * float(packed6_code(p, w, i, kb, pos / 4, pos % 4)) + b;
          continue;
        }
        const unsigned v = p[packed_dword(w, i, kb, byte / 4) + size_t(byte % 4)];
        out[g * gs + k] = s * float((v >> ((j % kpb) * w.bits)) & mask) + b;
      }
    }
    return;
  }
  const auto* row = static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes();
  const size_t groups = size_t(w.cols / w.group_size);
  const uint32_t mask = (1u << w.bits) - 1u;
  for (int k = 0; k < w.cols; ++k) {
    const size_t bit = size_t(k) * size_t(w.bits);
    uint32_t v = 0;  // the (at most 16) bits from the code's first byte on
    std::memcpy(&v, row + bit / 8, std::min<size_t>(4, w.row_bytes() - bit / 8));
    const uint32_t code = (v >> (bit % 8)) & mask;
    const size_t g = size_t(r) * groups + size_t(k / w.group_size);
    out[k] = affine_param(w.scales, w.dtype, g) * float(code) + affine_param(w.biases, w.dtype, g);
  }
}

namespace {
// One block of x rounded to int8 (x * inv to nearest; NaN to 0), value i written to
// out[(i % KPB) * stride + i / KPB] (the split order of KPB codes a byte). Returns the values' sum.
template <int KPB>
int round_block(const float* xb, float inv, int8_t* out, int stride) {
  int8_t tq[kQ8Block];
  int s = 0;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < kQ8Block; ++i) {
    const float rq = std::nearbyint(xb[i] * inv);  // |rq| <= 127; NaN (xs carries it): 0
    const int v = rq == rq ? int(rq) : 0;
    tq[i] = int8_t(v);
    s += v;
  }
  if constexpr (KPB == 1) {
    std::memcpy(out, tq, kQ8Block);
  } else {
    for (int r = 0; r < KPB; ++r)
      for (int i = 0; i < kQ8Block / KPB; ++i) out[r * stride + i] = tq[i * KPB + r];
  }
  return s;
}
}  // namespace

AffineX quantize_affine_x(const float* x, int T, int K, int bits, int group_size, int chunk, AffineXBuffers& buf,
                          ThreadPool* pool) {
  PTLLM_CHECK(K % kQ8Block == 0 && group_size % kQ8Block == 0 && K % group_size == 0);
  // 6 bits in chunks (packed, affine.h): the split order of 4 bits, that of the low nibbles.
  const int kpb = bits == 6 && chunk ? 2 : 8 / bits, G = K / group_size, nb = K / kQ8Block;
  const size_t ldq = chunk ? size_t((K + chunk - 1) / chunk * chunk) : size_t(K);
  const size_t ldd = ldq / kQ8Block + 16, ldg = size_t(G);
  buf.q.assign(size_t(T) * ldq, 0);
  buf.d.assign(size_t(T) * ldd, 0.f);
  buf.xs.resize(size_t(T) * ldg);
  buf.xc.resize(size_t(T) * ldg);
  buf.qsum.resize(size_t(T) * size_t(nb));
  buf.xsb.resize(size_t(T) * size_t(nb));
  const float m = float(1 << (bits - 1));
  PTLLM_CHECK(chunk == 0 || (chunk % kQ8Block == 0 && (chunk & (chunk - 1)) == 0) || kpb == 1);
  const int ks = kpb == 4 ? 2 : kpb == 2 ? 1 : 0, stride = chunk >> ks;  // split order: C / KPB bytes a run
  const int split = chunk == 0 ? 1 : kpb;
  const auto rows = [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) {
      const float* xt = x + t * size_t(K);
      int8_t* q = buf.q.data() + t * ldq;
      float* d = buf.d.data() + t * ldd;
      int* qsum = buf.qsum.data() + t * size_t(nb);
      float* xsb = buf.xsb.data() + t * size_t(nb);
      for (int b = 0; b < nb; ++b) {
        const int k = b * kQ8Block;
        const float* xb = xt + k;
        float amax = 0.f, sum = 0.f;
#pragma omp simd reduction(max : amax) reduction(+ : sum)
        for (int i = 0; i < kQ8Block; ++i) {
          const float a = std::fabs(xb[i]);
          amax = amax > a ? amax : a;
          sum += xb[i];
        }
        const bool some = amax > 0.f && std::isfinite(amax);
        const float inv = some ? 127.f / amax : 0.f;
        d[b] = some ? amax / 127.f : 0.f;
        // Column j of the chunk to (j % KPB) * (C / KPB) + j / KPB.
        int8_t* at = split == 1 ? q + k : q + (k & ~(chunk - 1)) + ((k & (chunk - 1)) >> ks);
        qsum[b] = split == 1   ? round_block<1>(xb, inv, at, stride)
                  : split == 2 ? round_block<2>(xb, inv, at, stride)
                               : round_block<4>(xb, inv, at, stride);
        xsb[b] = sum;
      }
      for (int g = 0; g < G; ++g) {
        float xs = 0.f, qs = 0.f;
        for (int b = g * group_size / kQ8Block; b < (g + 1) * group_size / kQ8Block; ++b) {
          xs += xsb[b];
          qs += d[b] * float(qsum[b]);
        }
        buf.xs[t * ldg + size_t(g)] = xs;
        buf.xc[t * ldg + size_t(g)] = m * (xs - qs);
      }
    }
  };
  if (pool)
    pool->parallel_for(size_t(T), rows, std::max<size_t>(1, size_t(16384 / std::max(K, 1))));
  else
    rows(0, size_t(T));
  return AffineX{T, K, bits, chunk, buf.q.data(), buf.d.data(), buf.xs.data(), buf.xc.data(), ldq, ldd, ldg};
}

void affine_unpack_codes(const WeightMatrix& w, int r, uint8_t* out) {
  const auto* row = static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes();
  const uint64_t mask = (uint64_t(1) << w.bits) - 1;
  for (int k = 0; k < w.cols; k += 8) {  // 8 codes fill `bits` whole bytes (cols: whole groups of 32)
    uint64_t v = 0;
    std::memcpy(&v, row + size_t(k / 8) * size_t(w.bits), size_t(w.bits));
    for (int i = 0; i < 8; ++i) out[k + i] = uint8_t((v >> (i * w.bits)) & mask);
  }
}

void affine_unpacked_rows_portable(const AffineX& ax, const WeightMatrix& w, const float* bias, float* y, int r0,
                                   int r1) {
  thread_local std::vector<uint8_t> codes;
  if (codes.size() < size_t(w.cols)) codes.resize(size_t(w.cols));
  const int gs = w.group_size, G = w.cols / gs;
  for (int r = r0; r < r1; ++r) {
    affine_unpack_codes(w, r, codes.data());
    for (int t = 0; t < ax.T; ++t) {
      const int8_t* q = ax.q + size_t(t) * ax.ldq;
      const float* d = ax.d + size_t(t) * ax.ldd;
      float s = bias ? bias[r] : 0.f;
      for (int g = 0; g < G; ++g) {
        float blocks = 0.f;
        for (int k = g * gs; k < (g + 1) * gs; k += kQ8Block) {
          int isum = 0;
          for (int i = 0; i < kQ8Block; ++i) isum += int(codes[size_t(k + i)]) * int(q[k + i]);
          blocks += d[k / kQ8Block] * float(isum);
        }
        const size_t i = size_t(r) * size_t(G) + size_t(g), xt = size_t(t) * ax.ldg + size_t(g);
        s += affine_param(w.scales, w.dtype, i) * (blocks + ax.xc[xt]) + affine_param(w.biases, w.dtype, i) * ax.xs[xt];
      }
      y[size_t(t) * size_t(w.rows) + size_t(r)] = s;
    }
  }
}

namespace {

const AffineKernelTable* affine_table(AffineKernel k) {
  switch (k) {
    case AffineKernel::Portable: return affine_portable_kernels();
    case AffineKernel::AVX2: return kernel_table(SimdTarget::AVX2) ? affine_avx2_kernels() : nullptr;
    case AffineKernel::AVX2Vnni: return kernel_table(SimdTarget::AVX2) ? affine_avx2_vnni_kernels() : nullptr;
    case AffineKernel::AVX512: return kernel_table(SimdTarget::AVX512) ? affine_avx512_kernels() : nullptr;
    case AffineKernel::AVX512Vnni: return kernel_table(SimdTarget::AVX512) ? affine_avx512_vnni_kernels() : nullptr;
    case AffineKernel::NEON: return kernel_table(SimdTarget::NEON) ? affine_neon_kernels() : nullptr;
    case AffineKernel::NEONDotprod: return kernel_table(SimdTarget::NEON) ? affine_neon_dotprod_kernels() : nullptr;
    case AffineKernel::NEONI8mm: return kernel_table(SimdTarget::NEON) ? affine_neon_i8mm_kernels() : nullptr;
  }
  return nullptr;
}

AffineKernel default_kernel() {
  switch (active_simd_target()) {
    case SimdTarget::AVX512: return affine_table(AffineKernel::AVX512Vnni) ? AffineKernel::AVX512Vnni : AffineKernel::AVX512;
    case SimdTarget::AVX2: return affine_table(AffineKernel::AVX2Vnni) ? AffineKernel::AVX2Vnni : AffineKernel::AVX2;
    case SimdTarget::NEON:
      return affine_table(AffineKernel::NEONI8mm)      ? AffineKernel::NEONI8mm
             : affine_table(AffineKernel::NEONDotprod) ? AffineKernel::NEONDotprod
                                                       : AffineKernel::NEON;
    default: return AffineKernel::Portable;
  }
}

// As ops.cpp's matmul: a gemv share holds at least this many weights (tiny models do not
// over-split); a gemm share whole tiles, about two a thread, at most kGemmMaxPartRows rows.
constexpr size_t kGemvMinWeightsPerThread = 32 * 1024;
constexpr size_t kGemmMaxPartRows = 512;

// The generic product (group sizes the integer products do not take): each row dequantized once, then
// dotted with every x row.
void generic_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool) {
  pool.parallel_for(size_t(w.rows), [&](size_t b, size_t e) {
    thread_local std::vector<float> row;  // a thread's, grown once
    if (row.size() < size_t(w.cols)) row.resize(size_t(w.cols));
    for (size_t r = b; r < e; ++r) {
      affine_dequant_row(w, int(r), row.data());
      for (int t = 0; t < T; ++t)
        y[size_t(t) * size_t(w.rows) + r] =
            dot(x + size_t(t) * size_t(w.cols), row.data(), w.cols) + (bias ? bias[r] : 0.f);
    }
  });
}

}  // namespace

std::string_view affine_kernel_name(AffineKernel k) {
  switch (k) {
    case AffineKernel::Portable: return "portable";
    case AffineKernel::AVX2: return "avx2";
    case AffineKernel::AVX2Vnni: return "avx2-vnni";
    case AffineKernel::AVX512: return "avx512";
    case AffineKernel::AVX512Vnni: return "avx512-vnni";
    case AffineKernel::NEON: return "neon";
    case AffineKernel::NEONDotprod: return "neon-dotprod";
    case AffineKernel::NEONI8mm: return "neon-i8mm";
  }
  return "?";
}

std::vector<AffineKernel> available_affine_kernels() {
  std::vector<AffineKernel> out;
  for (AffineKernel k : {AffineKernel::Portable, AffineKernel::AVX2, AffineKernel::AVX2Vnni, AffineKernel::AVX512,
                         AffineKernel::AVX512Vnni, AffineKernel::NEON, AffineKernel::NEONDotprod, AffineKernel::NEONI8mm})
    if (affine_table(k)) out.push_back(k);
  return out;
}

AffineKernel affine_active_kernel() { return default_kernel(); }

const AffineKernelTable& affine_active_table() { return *affine_table(default_kernel()); }

bool affine_packed_centred8(AffineKernel k) {
  const AffineKernelTable* kt = affine_table(k);
  return kt && kt->packed && kt->packed_centred8;
}

namespace {
bool integer_groups(const WeightMatrix& w) {
  const bool pow2 = w.group_size > 0 && (w.group_size & (w.group_size - 1)) == 0;  // mlx: 32, 64, 128
  return pow2 && w.group_size >= kQ8Block && w.cols % w.group_size == 0;
}
}  // namespace

bool affine_fast(const WeightMatrix& w) { return (w.bits == 2 || w.bits == 4 || w.bits == 8) && integer_groups(w); }
bool affine_unpacked(const WeightMatrix& w) { return (w.bits == 3 || w.bits == 5 || w.bits == 6) && integer_groups(w); }

namespace {
// Packed matrices of the same bits, group size and cols against x rounded once: the 16-row groups
// of every output in turn, a part of at least kGemvMinWeightsPerThread weights (it may cross from
// one matrix into the next).
void packed_matmul(const float* x, int T, std::span<const MatmulOutput> outs, ThreadPool& pool,
                   const AffineKernelTable& kt) {
  const WeightMatrix& w0 = *outs[0].w;
  thread_local AffineXBuffers buf;
  const AffineX ax = quantize_affine_x(x, T, w0.cols, w0.bits, w0.group_size, kQ8Block, buf, &pool);
  const auto rows = [&kt](const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0, int r1) {
    if (kt.packed) return kt.packed(x, w, bias, y, r0, r1);
    affine_packed_rows_scalar(x, w, bias, y, r0, r1);
  };
  const size_t min_groups = kGemvMinWeightsPerThread / size_t(std::max(1, w0.cols)) / kAffinePackRows;
  pool.parallel_for(
      groups_of(outs, kAffinePackRows),
      [&](size_t b, size_t e) {
        for_each_share(outs, kAffinePackRows, b, e, [&](const MatmulOutput& o, int g0, int g1) {
          rows(ax, *o.w, o.bias, o.y, g0 * kAffinePackRows, g1 * kAffinePackRows);
        });
      },
      std::max<size_t>(1, min_groups));
}
}  // namespace

bool affine_matmul_shares(std::span<const MatmulOutput> outs) {
  return !outs.empty() && std::all_of(outs.begin(), outs.end(), [&](const MatmulOutput& o) {
    const WeightMatrix &w = *o.w, &w0 = *outs[0].w;
    return w.format == WeightFormat::Affine && w.affine_pack && w.bits == w0.bits &&
           w.group_size == w0.group_size && w.cols == w0.cols;
  });
}

void affine_matmul(const float* x, int T, std::span<const MatmulOutput> outs, ThreadPool& pool) {
  PTLLM_CHECK(affine_matmul_shares(outs));
  packed_matmul(x, T, outs, pool, *affine_table(default_kernel()));
}

void affine_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool,
                   AffineKernel k, AffinePath path) {
  const AffineKernelTable* kt = affine_table(k);
  if (!kt) throw Error("affine kernel " + std::string(affine_kernel_name(k)) + " is not available on this CPU");
  if (w.affine_pack) {
    const MatmulOutput out{&w, bias, y};
    return packed_matmul(x, T, std::span(&out, 1), pool, *kt);
  }
  if (affine_unpacked(w)) {
    AffineUnpackedRows rows = affine_unpacked_rows_portable;
    if (k == AffineKernel::AVX512Vnni && affine_unpacked_rows_avx512vbmi())
      rows = affine_unpacked_rows_avx512vbmi();
    else if (k != AffineKernel::Portable && affine_unpacked_rows_avx2())  // null off x86
      rows = affine_unpacked_rows_avx2();
    thread_local AffineXBuffers buf;
    const AffineX ax = quantize_affine_x(x, T, w.cols, w.bits, w.group_size, 0, buf, &pool);
    const size_t min_rows = kGemvMinWeightsPerThread / size_t(std::max(1, w.cols));
    pool.parallel_for(size_t(w.rows), [&](size_t b, size_t e) { rows(ax, w, bias, y, int(b), int(e)); },
                      std::max<size_t>(4, min_rows));
    return;
  }
  if (!affine_fast(w)) return generic_matmul(x, T, w, bias, y, pool);
  static_assert(kAffineGemvMaxT == kMatmulSmallRows);  // ops.h
  const bool gemv = path == AffinePath::Gemv || (path == AffinePath::Auto && T <= kAffineGemvMaxT);
  // x rounded once per call, shared by the threads.
  thread_local AffineXBuffers buf;
  const int chunk = gemv ? kt->reg_bytes * 8 / w.bits : kQ8Block;
  const AffineX ax = quantize_affine_x(x, T, w.cols, w.bits, w.group_size, chunk, buf, &pool);
  if (gemv) {
    const size_t min_rows = kGemvMinWeightsPerThread / size_t(std::max(1, w.cols));
    const size_t grain = std::max<size_t>(4, (min_rows + 3) / 4 * 4);
    pool.parallel_for(size_t(w.rows), [&](size_t b, size_t e) { kt->gemv(ax, w, bias, y, int(b), int(e)); }, grain);
  } else {
    const size_t tr = size_t(kt->tile_rows);
    const size_t per = std::min(kGemmMaxPartRows, (size_t(w.rows) + 2 * pool.size() - 1) / (2 * pool.size()));
    pool.parallel_for(size_t(w.rows), [&](size_t b, size_t e) { kt->gemm(ax, w, bias, y, int(b), int(e)); },
                      std::max(tr, (per + tr - 1) / tr * tr));
  }
}

void affine_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool) {
  affine_matmul(x, T, w, bias, y, pool, default_kernel());
}

}  // namespace ptllm
