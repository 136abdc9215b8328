#pragma once
// The int8 activations of the affine products (kernels/affine.h) and the kernels each SIMD target
// provides over them; internal to kernels/ (affine.cpp, affine_ref.cpp, affine_<target>.cpp).
//
// x row t is rounded once per call, per block of kQ8Block = 32 columns b:
//   d_b = max_{k in b} |x_k| / 127,  q_k = round(x_k / d_b) in [-127, 127]  (d_b = 0: q = 0),
// and per weight group g (group_size columns, whole blocks):
//   xs_g = sum_{k in g} x_k                      (float sums by block, for the bias term)
//   xc_g = m (xs_g - sum_{b in g} d_b sum_{k in b} q_k),   m = 2^(bits - 1) the middle code,
// so that  sum_{k in g} (s_g c_k + b_g) x_k  ~=  s_g (sum_{b in g} d_b sum_{k in b} c_k q_k + xc_g) + b_g xs_g,
// which is the exact sum with x_k replaced by d_b q_k in the centred term s_g (c_k - m) x_k only:
// the integer sums sum c_k q_k are exact (unsigned codes times signed bytes: vpdpbusd).
//
// The bytes q of a row are stored in a kernel's "split order" over chunks of C columns: column
// j of a chunk at (j % KPB) * (C / KPB) + j / KPB, KPB = 8 / bits codes a byte, so that the codes
// at bit s * bits of RB consecutive code bytes (a shift and a mask) meet RB consecutive bytes of q.
// C = 0: plain order. The row is padded with zeros to a multiple of C.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/weights.h"

namespace ptllm {

class ThreadPool;

constexpr int kQ8Block = 32;

// x quantized for one product.
struct AffineX {
  int T = 0, K = 0, bits = 0, chunk = 0;
  const int8_t* q = nullptr;   // [T][ldq]  split order, zeros past K
  const float* d = nullptr;    // [T][ldd]  d_b, zeros past K / 32 (16 more, for whole-register reads)
  const float* xs = nullptr;   // [T][ldg]
  const float* xc = nullptr;   // [T][ldg]
  size_t ldq = 0, ldd = 0, ldg = 0;
};

// The buffers behind an AffineX (one per calling thread, grown, never shrunk).
struct AffineXBuffers {
  std::vector<int8_t> q;
  std::vector<float> d, xs, xc;
  std::vector<int> qsum;  // [T][K / 32] sum_{k in b} q_k
  std::vector<float> xsb;  // [T][K / 32] sum_{k in b} x_k
};
// Quantizes x [T][K] for weights of `bits` bits and groups of group_size columns, in the split
// order of chunk C (0: plain); rows split over the pool (null: this thread).
AffineX quantize_affine_x(const float* x, int T, int K, int bits, int group_size, int chunk, AffineXBuffers& buf,
                          ThreadPool* pool);

// A scale or bias (stored as F32, BF16 or F16) by index.
inline float affine_param(const void* p, DType t, size_t i) {
  const auto* b = static_cast<const uint8_t*>(p);
  if (t == DType::F32) {
    float f;
    std::memcpy(&f, b + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, b + 2 * i, 2);
  return t == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// One SIMD target's affine products: output columns [r0, r1) of y[T][w.rows] (bits 2, 4, 8).
struct AffineKernelTable {
  const char* name;
  int reg_bytes;  // RB: the gemv's split order has chunk RB * 8 / bits; the gemm's 32
  int tile_rows;  // the gemm's tile: thread shares are multiples of it
  void (*gemv)(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0, int r1);
  void (*gemm)(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0, int r1);
  // Packed matrices (kernels/affine.h, affine_pack), x in chunk 32, rows [r0, r1) whole 16-row
  // groups; nullptr where the registers hold fewer than 8 lanes.
  void (*packed)(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0, int r1);
  // Whether `packed` sums 8-bit codes centred (affine_packed_rows_scalar's centred8).
  bool packed_centred8;
};
// nullptr where the target is not compiled in or this CPU lacks it.
const AffineKernelTable* affine_portable_kernels();
const AffineKernelTable* affine_avx2_kernels();
const AffineKernelTable* affine_avx2_vnni_kernels();    // and AVX-VNNI
const AffineKernelTable* affine_avx512_kernels();       // AVX-512 F/BW/VL/DQ, no VNNI
const AffineKernelTable* affine_avx512_vnni_kernels();  // and VNNI
const AffineKernelTable* affine_neon_kernels();          // AArch64 NEON
const AffineKernelTable* affine_neon_dotprod_kernels();  // and dotprod (sdot)
const AffineKernelTable* affine_neon_i8mm_kernels();     // and i8mm (usdot)

// Bits 3, 5 and 6 (codes that straddle bytes): a row's codes unpacked to one byte each, then the same
// integer sums over x in plain order (chunk 0). Rows [r0, r1) of y[T][w.rows].
using AffineUnpackedRows = void (*)(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0,
                                    int r1);
void affine_unpacked_rows_portable(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0, int r1);
// AVX-512 VNNI with VBMI (vpmultishiftqb unpacks 6-bit codes): nullptr where the CPU lacks them.
AffineUnpackedRows affine_unpacked_rows_avx512vbmi();
// AVX2 (the x86 kernels without VBMI): nullptr where the CPU lacks it.
AffineUnpackedRows affine_unpacked_rows_avx2();
// Row r's codes, one a byte: out[w.cols].
void affine_unpack_codes(const WeightMatrix& w, int r, uint8_t* out);

}  // namespace ptllm
