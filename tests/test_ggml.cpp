// llama.cpp's block formats (kernels/ggml.h): blocks built byte by byte from the layouts of
// ggml-common.h dequantize to the values they encode; the reference quantizers round-trip within
// their formats' error; the products of every kernel variant agree with the scalar twin, and the
// twin with the float product within the bound of rounding x to int8.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/amx.h"
#include "kernels/ggml.h"
#include "kernels/ops.h"
#include "kernels/simd.h"
#include "shared_x_check.h"
#include "test_util.h"

namespace ptllm {
namespace {

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}
std::vector<float> dequant(GgmlType t, const std::vector<uint8_t>& b, int n) {
  std::vector<float> out(static_cast<size_t>(n));
  ggml_dequant_row(ggml_matrix(t, b.data(), 1, n), 0, out.data());
  return out;
}

// ---- layouts: hand-built blocks ---------------------------------------------------------------

// Q4_1: value = d * nibble + m; values 0-15 the low nibbles, 16-31 the high ones.
TEST(GgmlLayout, Q4_1) {
  std::vector<uint8_t> b(20);
  put_f16(b.data(), 0.25f);
  put_f16(b.data() + 2, -1.5f);
  for (int j = 0; j < 16; ++j) b[4 + size_t(j)] = uint8_t(j | (15 - j) << 4);
  const auto y = dequant(GgmlType::Q4_1, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_FLOAT_EQ(y[size_t(j)], 0.25f * float(j) - 1.5f) << j;
    EXPECT_FLOAT_EQ(y[size_t(j) + 16], 0.25f * float(15 - j) - 1.5f) << j;
  }
}

// Q5_0 / Q5_1: value j's fifth bit is bit j of the 32-bit qh (after d, and m for Q5_1).
TEST(GgmlLayout, Q5HighBits) {
  for (bool with_min : {false, true}) {
    const int o = with_min ? 4 : 2;
    std::vector<uint8_t> b(size_t(o) + 20, 0);
    put_f16(b.data(), 0.5f);
    if (with_min) put_f16(b.data() + 2, 2.0f);
    int q[32];
    uint32_t qh = 0;
    for (int e = 0; e < 32; ++e) {
      q[e] = (e * 11 + 3) % 32;
      qh |= uint32_t(q[e] >> 4) << e;
      uint8_t& byte = b[size_t(o) + 4 + size_t(e % 16)];
      byte |= uint8_t((q[e] & 0xf) << (e < 16 ? 0 : 4));
    }
    std::memcpy(b.data() + o, &qh, 4);
    const auto y = dequant(with_min ? GgmlType::Q5_1 : GgmlType::Q5_0, b, 32);
    for (int e = 0; e < 32; ++e) {
      const float want = with_min ? 0.5f * float(q[e]) + 2.0f : 0.5f * float(q[e] - 16);
      EXPECT_FLOAT_EQ(y[size_t(e)], want) << e << (with_min ? " Q5_1" : " Q5_0");
    }
  }
}

// Q4_K/Q5_K's 12 scale bytes: scales 0-3 and mins 0-3 in the low six bits of bytes 0-3 and 4-7;
// scales and mins 4-7 in the low and high nibbles of bytes 8-11, their top two bits in bits 6-7
// of bytes 0-3 (scales) and 4-7 (mins).
void pack_scales_by_hand(const int* sc, const int* mn, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = uint8_t(sc[j] | (sc[j + 4] >> 4) << 6);
    s[j + 4] = uint8_t(mn[j] | (mn[j + 4] >> 4) << 6);
    s[j + 8] = uint8_t((sc[j + 4] & 0xf) | (mn[j + 4] & 0xf) << 4);
  }
}

TEST(GgmlLayout, KScaleMinPacking) {
  const int sc[8] = {1, 17, 33, 63, 5, 21, 48, 63}, mn[8] = {62, 0, 31, 16, 63, 47, 15, 32};
  uint8_t s[12];
  pack_scales_by_hand(sc, mn, s);
  for (int j = 0; j < 8; ++j) {
    const GgmlScaleMin v = ggml_k_scale_min(s, j);
    EXPECT_EQ(int(v.scale), sc[j]) << j;
    EXPECT_EQ(int(v.min), mn[j]) << j;
  }
}

// Q4_K: value = d * sc_j * q - dmin * m_j over eight sub-blocks of 32; each 64 values read 32 bytes
// of qs, the first sub-block from the low nibbles. Q5_K adds qh[32] before qs: the fifth bit of
// value l of sub-block j is bit j of qh[l].
TEST(GgmlLayout, Q4_KAndQ5_K) {
  const int sc[8] = {1, 17, 33, 63, 5, 21, 48, 63}, mn[8] = {62, 0, 31, 16, 63, 47, 15, 32};
  for (bool five : {false, true}) {
    std::vector<uint8_t> b(five ? 176 : 144, 0);
    put_f16(b.data(), 0.5f);
    put_f16(b.data() + 2, 0.25f);
    pack_scales_by_hand(sc, mn, b.data() + 4);
    uint8_t* qh = b.data() + 16;
    uint8_t* qs = b.data() + (five ? 48 : 16);
    int q[256];
    for (int e = 0; e < 256; ++e) {
      const int j = e / 32, l = e % 32;
      q[e] = (e * 7 + j) % (five ? 32 : 16);
      qs[32 * (j / 2) + l] |= uint8_t((q[e] & 0xf) << (j % 2 ? 4 : 0));
      if (five) qh[l] |= uint8_t((q[e] >> 4) << j);
    }
    const auto y = dequant(five ? GgmlType::Q5_K : GgmlType::Q4_K, b, 256);
    for (int e = 0; e < 256; ++e)
      EXPECT_FLOAT_EQ(y[size_t(e)], 0.5f * float(sc[e / 32]) * float(q[e]) - 0.25f * float(mn[e / 32]))
          << e << (five ? " Q5_K" : " Q4_K");
  }
}

// Q6_K: ql[128], qh[64], int8 scales[16], f16 d. Value e = 128 h + 32 s + l: low four bits in
// ql[64 h + 32 (s % 2) + l] (low nibble for s < 2, high for s >= 2), high two bits at bits 2s, 2s + 1
// of qh[32 h + l]; value = d * scales[e / 16] * (q - 32).
TEST(GgmlLayout, Q6_K) {
  std::vector<uint8_t> b(210, 0);
  auto* scales = reinterpret_cast<int8_t*>(b.data() + 192);
  for (int g = 0; g < 16; ++g) scales[g] = int8_t(g * 17 - 128);  // -128 .. 127
  put_f16(b.data() + 208, 0.125f);
  int q[256];
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;
    q[e] = (e * 5 + 3) % 64;
    b[size_t(64 * h + 32 * (s % 2) + l)] |= uint8_t((q[e] & 0xf) << (s < 2 ? 0 : 4));
    b[size_t(128 + 32 * h + l)] |= uint8_t((q[e] >> 4) << (2 * s));
  }
  const auto y = dequant(GgmlType::Q6_K, b, 256);
  for (int e = 0; e < 256; ++e)
    EXPECT_FLOAT_EQ(y[size_t(e)], 0.125f * float(scales[e / 16]) * float(q[e] - 32)) << e;
}

// Q2_K: scales[16] (low nibble scale, high nibble min, per 16 values), qs[64], d, dmin. Value
// e = 128 h + 32 p + 16 part + l: bits 2p, 2p + 1 of qs[32 h + 16 part + l], scale 8h + 2p + part.
TEST(GgmlLayout, Q2_K) {
  std::vector<uint8_t> b(84, 0);
  for (int i = 0; i < 16; ++i) b[size_t(i)] = uint8_t((i * 5 + 1) % 16 | ((15 - i) << 4));
  put_f16(b.data() + 80, 0.5f);
  put_f16(b.data() + 82, 0.125f);
  int q[256];
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, p = (e % 128) / 32, part = (e % 32) / 16, l = e % 16;
    q[e] = (e * 3 + h) % 4;
    b[size_t(16 + 32 * h + 16 * part + l)] |= uint8_t(q[e] << (2 * p));
  }
  const auto y = dequant(GgmlType::Q2_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, p = (e % 128) / 32, part = (e % 32) / 16;
    const int is = 8 * h + 2 * p + part;
    EXPECT_FLOAT_EQ(y[size_t(e)], 0.5f * float(b[size_t(is)] & 0xf) * float(q[e]) - 0.125f * float(b[size_t(is)] >> 4))
        << e;
  }
}

// Q3_K: hmask[32], qs[64], scales[12], d. Sixteen 6-bit scales (stored + 32): low four bits in the
// low nibbles of bytes 0-7 (scales 0-7) and their high nibbles (8-15); the top two bits of scale j
// at bits 2 (j / 4) of byte 8 + j % 4. Two low bits of a value as Q2_K, the third bit is bit 4h + p
// of hmask[16 part + l], clear meaning minus 4. value = d * (scale - 32) * q.
TEST(GgmlLayout, Q3_K) {
  std::vector<uint8_t> b(110, 0);
  int sc[16];
  for (int j = 0; j < 16; ++j) {
    sc[j] = (j * 13 + 5) % 64;
    b[size_t(96 + j % 8)] |= uint8_t((sc[j] & 0xf) << (j < 8 ? 0 : 4));
    b[size_t(96 + 8 + j % 4)] |= uint8_t((sc[j] >> 4) << (2 * (j / 4)));
  }
  put_f16(b.data() + 108, 0.25f);
  int q[256];
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, p = (e % 128) / 32, part = (e % 32) / 16, l = e % 16;
    q[e] = (e * 5 + 1) % 8 - 4;  // -4 .. 3
    const int low = (q[e] + 4) & 3, high = (q[e] + 4) >> 2;
    b[size_t(32 + 32 * h + 16 * part + l)] |= uint8_t(low << (2 * p));
    b[size_t(16 * part + l)] |= uint8_t(high << (4 * h + p));
  }
  const auto y = dequant(GgmlType::Q3_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, p = (e % 128) / 32, part = (e % 32) / 16;
    EXPECT_FLOAT_EQ(y[size_t(e)], 0.25f * float(sc[8 * h + 2 * p + part] - 32) * float(q[e])) << e;
  }
}

TEST(GgmlLayout, BadInputIsAnError) {
  std::vector<float> x(48, 1.f);
  std::vector<uint8_t> b(1024);
  try {
    ggml_quantize_row(GgmlType::Q4_K, x.data(), 48, b.data());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q4_K"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("48"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ggml_type_by_name("Q6_K"), GgmlType::Q6_K);
  EXPECT_EQ(ggml_type_by_name("Q8_0"), GgmlType::Q8_0);
  EXPECT_THROW(ggml_type_by_name("Q7_K"), Error);
  EXPECT_THROW(ggml_type_by_name(""), Error);
  EXPECT_THROW(ggml_quantize_row(GgmlType::Q2_K, x.data(), 256, b.data()), Error);
  EXPECT_THROW(ggml_dequant_blocks(GgmlType(99), b.data(), 32, x.data()), Error);
  ThreadPool pool(1);
  float y[1];
  EXPECT_THROW(matmul(x.data(), 1, ggml_matrix(GgmlType::Q8_1, b.data(), 1, 32), nullptr, y, pool), Error);
}

// ---- reference quantizers: round trips ---------------------------------------------------------

// Gaussian rows with a few outliers, as weight rows look.
std::vector<float> weight_like(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 0.02f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = g(rng);
  for (int i = 0; i < n / 97; ++i) x[rng() % size_t(n)] *= 8.f;
  return x;
}
std::vector<uint8_t> quantize(GgmlType t, const std::vector<float>& x) {
  const GgmlTypeInfo i = ggml_type_info(t);
  std::vector<uint8_t> b(x.size() / size_t(i.block_elems) * size_t(i.block_bytes));
  ggml_quantize_row(t, x.data(), int(x.size()), b.data());
  return b;
}

// The 32-value formats: each value within its block's rounding step (Q4_0/Q5_0: the code at +max
// clamps to 2^b - 1, a full step; f16 scales add their own rounding).
TEST(GgmlQuantize, BlockFormatsRoundTripWithinOneStep) {
  const int n = 32 * 40;
  const auto x = weight_like(n, 3);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1}) {
    const auto y = dequant(t, quantize(t, x), n);
    for (int b = 0; b < n / 32; ++b) {
      float lo = x[size_t(32 * b)], hi = lo, amax = 0;
      for (int i = 0; i < 32; ++i) {
        const float v = x[size_t(32 * b + i)];
        lo = std::min(lo, v), hi = std::max(hi, v), amax = std::max(amax, std::fabs(v));
      }
      float bound;
      switch (t) {
        case GgmlType::Q8_0: bound = 0.5f * amax / 127.f; break;
        case GgmlType::Q4_0: bound = amax / 8.f; break;
        case GgmlType::Q5_0: bound = amax / 16.f; break;
        case GgmlType::Q4_1: bound = 0.5f * (hi - lo) / 15.f; break;
        default: bound = 0.5f * (hi - lo) / 31.f; break;
      }
      bound = bound * 1.01f + amax * 1e-3f;  // f16 d and m
      for (int i = 0; i < 32; ++i)
        ASSERT_LE(std::fabs(y[size_t(32 * b + i)] - x[size_t(32 * b + i)]), bound)
            << ggml_type_info(t).name << " block " << b << " value " << i;
    }
  }
}

double rel_rms_error(const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) e += double(y[i] - x[i]) * (y[i] - x[i]), s += double(x[i]) * x[i];
  return std::sqrt(e / s);
}

// Every format's relative RMS error on weight-like rows (Gaussian, 1% outliers at 8 sigma), against
// bounds a little above what the formats give there (Q4_0 0.143, Q4_1 0.099, Q5_0 0.071, Q5_1
// 0.048, Q4_K 0.092, Q5_K 0.046, Q6_K 0.026, Q8_0 0.0088), and the K-quants beat the 32-value
// formats of the same width.
TEST(GgmlQuantize, RoundTripErrorsPerFormat) {
  const int n = 256 * 24;
  const auto x = weight_like(n, 11);
  auto err = [&](GgmlType t) { return rel_rms_error(x, dequant(t, quantize(t, x), n)); };
  const double q8 = err(GgmlType::Q8_0), q4 = err(GgmlType::Q4_0), q41 = err(GgmlType::Q4_1),
               q5 = err(GgmlType::Q5_0), q51 = err(GgmlType::Q5_1), q4k = err(GgmlType::Q4_K),
               q5k = err(GgmlType::Q5_K), q6k = err(GgmlType::Q6_K);
  EXPECT_LT(q8, 0.01);
  EXPECT_LT(q4, 0.16);
  EXPECT_LT(q41, 0.11);
  EXPECT_LT(q5, 0.08);
  EXPECT_LT(q51, 0.055);
  EXPECT_LT(q4k, 0.1);
  EXPECT_LT(q5k, 0.05);
  EXPECT_LT(q6k, 0.03);
  EXPECT_LT(q4k, q4);
  EXPECT_LT(q5k, q5);
  EXPECT_LT(q6k, q5k);
  EXPECT_LT(q8, q6k);
  // Not zero: the test would pass for a quantizer that stored nothing if dequant returned x.
  EXPECT_GT(q4k, 0.01);
}

// Degenerate rows: zeros stay zeros (no NaN from 0 / 0); a constant row is exact where the format
// has an offset.
TEST(GgmlQuantize, ZeroAndConstantRows) {
  const std::vector<float> zeros(256, 0.f), ones(256, 0.75f);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                     GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    for (float v : dequant(t, quantize(t, zeros), 256)) ASSERT_EQ(v, 0.f) << ggml_type_info(t).name;
    const auto y = dequant(t, quantize(t, ones), 256);
    for (float v : y) ASSERT_NEAR(v, 0.75f, 0.75f / 16) << ggml_type_info(t).name;
  }
}

// ---- byte for byte against llama-quantize -------------------------------------------------------

// Just enough of GGUF (v3) to find tensors: name -> (type, dims, bytes). Test-only, bounds-checked.
struct GgufTensors {
  struct Tensor {
    GgmlType type;
    std::vector<uint64_t> dims;
    const uint8_t* data;
  };
  std::vector<uint8_t> bytes;
  std::map<std::string, Tensor> tensors;

  explicit GgufTensors(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
    size_t pos = 0;
    auto take = [&](size_t n) {
      if (pos + n > bytes.size()) throw Error(path.string() + ": truncated at byte " + std::to_string(pos));
      const uint8_t* p = bytes.data() + pos;
      pos += n;
      return p;
    };
    auto u32 = [&] { uint32_t v; std::memcpy(&v, take(4), 4); return v; };
    auto u64 = [&] { uint64_t v; std::memcpy(&v, take(8), 8); return v; };
    auto str = [&] { const uint64_t n = u64(); const auto* p = take(size_t(n)); return std::string(p, p + n); };
    if (std::string(reinterpret_cast<const char*>(take(4)), 4) != "GGUF") throw Error(path.string() + ": not GGUF");
    const uint32_t version = u32();
    if (version != 3) throw Error(path.string() + ": GGUF version " + std::to_string(version));
    const uint64_t n_tensors = u64(), n_kv = u64();
    uint64_t alignment = 32;
    const size_t scalar_size[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    auto skip_value = [&](uint32_t type, auto& self) -> void {
      if (type == 8) {
        str();
      } else if (type == 9) {
        const uint32_t et = u32();
        const uint64_t n = u64();
        for (uint64_t i = 0; i < n; ++i) self(et, self);
      } else if (type < 13) {
        take(scalar_size[type]);
      } else {
        throw Error(path.string() + ": metadata type " + std::to_string(type));
      }
    };
    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = str();
      const uint32_t type = u32();
      if (key == "general.alignment" && type == 4) alignment = u32();
      else skip_value(type, skip_value);
    }
    std::vector<std::pair<std::string, std::pair<Tensor, uint64_t>>> infos;
    for (uint64_t i = 0; i < n_tensors; ++i) {
      std::string name = str();
      Tensor t{};
      const uint32_t nd = u32();
      for (uint32_t d = 0; d < nd; ++d) t.dims.push_back(u64());
      t.type = GgmlType(u32());
      infos.push_back({std::move(name), {t, u64()}});
    }
    const size_t data = (pos + alignment - 1) / alignment * alignment;
    for (auto& [name, ti] : infos) {
      auto& [t, offset] = ti;
      const GgmlTypeInfo info = ggml_type_info(t.type);
      uint64_t n = 1;
      for (uint64_t d : t.dims) n *= d;
      const uint64_t nbytes = n / uint64_t(std::max(1, info.block_elems)) * uint64_t(info.block_bytes);
      if (info.name.empty() || data + offset + nbytes > bytes.size()) throw Error(path.string() + ": tensor " + name);
      t.data = bytes.data() + data + offset;
      tensors.emplace(name, t);
    }
  }
};

// llama-quantize (no importance matrix) writes what the reference quantizers write: every
// quantized tensor of kjv-tiny's Q8_0 and Q4_0 files, re-quantized here from the F32 file, byte
// for byte.
TEST(GgmlQuantize, SameBytesAsLlamaQuantize) {
  const auto dir = test::shared_model("gguf");
  if (!std::filesystem::exists(dir / "kjv-tiny-F32.gguf")) GTEST_SKIP() << "no " << dir << "/kjv-tiny-F32.gguf";
  const GgufTensors f32(dir / "kjv-tiny-F32.gguf");
  for (const char* file : {"kjv-tiny-Q8_0.gguf", "kjv-tiny-Q4_0.gguf"}) {
    const GgufTensors q(dir / file);
    int compared = 0;
    for (const auto& [name, t] : q.tensors) {
      if (!ggml_quantizable(t.type)) continue;
      const auto it = f32.tensors.find(name);
      ASSERT_NE(it, f32.tensors.end()) << name;
      ASSERT_EQ(it->second.type, GgmlType::F32) << name;
      ASSERT_EQ(it->second.dims, t.dims) << name;
      const int cols = int(t.dims[0]);
      size_t rows = 1;
      for (size_t d = 1; d < t.dims.size(); ++d) rows *= size_t(t.dims[d]);
      const WeightMatrix shape = ggml_matrix(t.type, nullptr, int(rows), cols);
      std::vector<float> x(static_cast<size_t>(cols));
      std::vector<uint8_t> mine(shape.row_bytes());
      for (size_t r = 0; r < rows; ++r) {
        std::memcpy(x.data(), it->second.data + r * size_t(cols) * 4, size_t(cols) * 4);
        ggml_quantize_row(t.type, x.data(), cols, mine.data());
        ASSERT_EQ(0, std::memcmp(mine.data(), t.data + r * shape.row_bytes(), mine.size()))
            << file << " " << name << " (" << ggml_type_info(t.type).name << ") row " << r;
      }
      ++compared;
    }
    EXPECT_GE(compared, 7) << file;  // the attention and MLP matrices of each layer at least
  }
}

// ggml's own quantizers (ggml_quantize_chunk of a llama.cpp build, no importance matrix: what
// llama-quantize runs per tensor) on 49 rows of 256 values, real weights of kjv-tiny, rows made for
// the corner cases (zeros, constants, one sign, an outlier, f16-subnormal and large scales, zero
// sub-blocks, values on the grid) and blocks of kjv-small (row 40: where summing the squared errors
// in another float order picked another Q5_K min): tests/data/gguf/ggml-quant-reference.gguf,
// written by scripts/make_ggml_quant_reference.c. Ours gives the same bytes for every type and row.
TEST(GgmlQuantize, SameBytesAsGgmlOnRealAndCornerCaseRows) {
  const GgufTensors f(test::repo_dir() / "tests/data/gguf/ggml-quant-reference.gguf");
  const auto& x = f.tensors.at("x");
  ASSERT_EQ(x.type, GgmlType::F32);
  ASSERT_EQ(x.dims.size(), 2u);
  const int cols = int(x.dims[0]), rows = int(x.dims[1]);
  ASSERT_EQ(cols, 256);
  ASSERT_EQ(rows, 49);
  int types = 0;
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K,
                     GgmlType::Q5_K, GgmlType::Q6_K}) {
    // ggml_type_name's spelling: "q4_0", "q4_K".
    const std::string name = "x.q" + std::string(ggml_type_info(t).name.substr(1));
    const auto it = f.tensors.find(name);
    ASSERT_NE(it, f.tensors.end()) << name;
    ASSERT_EQ(it->second.type, t) << name;
    const size_t row_bytes = ggml_matrix(t, nullptr, 1, cols).row_bytes();
    std::vector<uint8_t> mine(row_bytes);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int r = 0; r < rows; ++r) {
      std::memcpy(row.data(), x.data + size_t(r) * size_t(cols) * 4, size_t(cols) * 4);
      ggml_quantize_row(t, row.data(), cols, mine.data());
      const uint8_t* want = it->second.data + size_t(r) * row_bytes;
      size_t first = 0;
      while (first < row_bytes && mine[first] == want[first]) ++first;
      EXPECT_EQ(first, row_bytes) << name << " row " << r << ": first differing byte " << first << " of " << row_bytes;
    }
    ++types;
  }
  EXPECT_EQ(types, 8);
}

// ---- products ----------------------------------------------------------------------------------

// A random matrix of type t: from the quantizer (realistic blocks), or raw random bytes with sane
// f16 scales (every code pattern, Q8_0's -128 included).
std::vector<uint8_t> random_matrix(GgmlType t, int rows, int cols, bool raw, uint32_t seed) {
  const GgmlTypeInfo info = ggml_type_info(t);
  if (!raw) return quantize(t, weight_like(rows * cols, seed));
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(size_t(rows) * size_t(cols / info.block_elems) * size_t(info.block_bytes));
  for (auto& v : b) v = uint8_t(rng());
  std::uniform_real_distribution<float> u(0.001f, 0.01f);
  for (size_t o = 0; o < b.size(); o += size_t(info.block_bytes)) {
    uint8_t* blk = b.data() + o;
    switch (t) {
      case GgmlType::Q6_K: put_f16(blk + 208, u(rng)); break;
      case GgmlType::Q4_K: case GgmlType::Q5_K: put_f16(blk, u(rng)), put_f16(blk + 2, u(rng)); break;
      case GgmlType::Q4_1: case GgmlType::Q5_1: put_f16(blk, u(rng)), put_f16(blk + 2, -u(rng)); break;
      default: put_f16(blk, u(rng)); break;
    }
  }
  return b;
}

struct ProductCase {
  GgmlType type;
  int rows, cols;
};

class GgmlProduct : public ::testing::TestWithParam<ProductCase> {};

// Every variant this CPU runs against the scalar twin (same integer sums, float order differs),
// over T = 1..20, rows not a multiple of the 16-row tile, whole and partial row ranges.
TEST_P(GgmlProduct, EveryVariantMatchesTheScalarTwin) {
  const ProductCase c = GetParam();
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.f, 1.f);
  int nk = 0;
  const GgmlKernel* const* ks = ggml_kernels(&nk);
  ASSERT_GE(nk, 1);
  ASSERT_STREQ(ks[0]->name, "scalar");
  const int block = ggml_act_block(c.type);
  for (bool raw : {false, true}) {
    const auto blocks = random_matrix(c.type, c.rows, c.cols, raw, 17);
    const WeightMatrix w = ggml_matrix(c.type, blocks.data(), c.rows, c.cols);
    std::vector<float> bias(size_t(c.rows));
    for (auto& v : bias) v = g(rng);
    for (int T = 1; T <= 20; ++T) {
      std::vector<float> x(size_t(T) * size_t(c.cols));
      for (auto& v : x) v = g(rng);
      std::vector<int8_t> q(x.size());
      std::vector<float> d(size_t(T) * size_t(c.cols / block));
      std::vector<int16_t> sums(size_t(T) * size_t(c.cols / 16));
      ggml_quantize_acts(x.data(), c.cols, block, 0, T, q.data(), d.data(), sums.data());
      const GgmlActs a{T, c.cols, block, q.data(), d.data(), sums.data()};
      std::vector<float> want(size_t(T) * size_t(c.rows)), got(want.size());
      ks[0]->rows(w, a, bias.data(), want.data(), 0, c.rows);
      // The float scale of each product: sum_k |w_k x_k|.
      std::vector<float> row(size_t(c.cols)), mag(want.size());
      for (int r = 0; r < c.rows; ++r) {
        ggml_dequant_row(w, r, row.data());
        for (int t = 0; t < T; ++t) {
          double s = 0;
          for (int k = 0; k < c.cols; ++k) s += std::fabs(double(row[size_t(k)]) * x[size_t(t) * size_t(c.cols) + size_t(k)]);
          mag[size_t(t) * size_t(c.rows) + size_t(r)] = float(s);
        }
      }
      for (int i = 1; i < nk; ++i) {
        std::fill(got.begin(), got.end(), NAN);
        const int split = c.rows / 3;  // two calls, the first range ending mid-tile
        ks[i]->rows(w, a, bias.data(), got.data(), 0, split);
        ks[i]->rows(w, a, bias.data(), got.data(), split, c.rows);
        for (size_t j = 0; j < got.size(); ++j)
          ASSERT_NEAR(got[j], want[j], 1e-5f * mag[j] + 1e-5f)
              << ks[i]->name << " " << ggml_type_info(c.type).name << (raw ? " raw" : "") << " T " << T << " at " << j;
      }
    }
  }
}

// ops.h's rule for batches above kMatmulSmallRows rows: a row of x gets the same bits whichever
// batch it is computed in, wherever it sits in it, and whichever thread takes its weight row
// (matmul splits the rows in whole 16-row tiles). Every variant; the many-rows kernels hold 8 rows
// of x in registers, so windows starting off that tile are the cases that could differ.
TEST_P(GgmlProduct, RowsAboveTheSmallBatchDoNotDependOnTheBatch) {
  const ProductCase c = GetParam();
  std::mt19937 rng(23);
  std::normal_distribution<float> g(0.f, 1.f);
  int nk = 0;
  const GgmlKernel* const* ks = ggml_kernels(&nk);
  const int block = ggml_act_block(c.type), T = 45;
  const auto blocks = random_matrix(c.type, c.rows, c.cols, false, 31);
  const WeightMatrix w = ggml_matrix(c.type, blocks.data(), c.rows, c.cols);
  std::vector<float> x(size_t(T) * size_t(c.cols)), bias(size_t(c.rows));
  for (auto& v : x) v = g(rng);
  for (auto& v : bias) v = g(rng);
  std::vector<int8_t> q(x.size());
  std::vector<float> d(size_t(T) * size_t(c.cols / block));
  std::vector<int16_t> sums(size_t(T) * size_t(c.cols / 16));
  ggml_quantize_acts(x.data(), c.cols, block, 0, T, q.data(), d.data(), sums.data());
  for (int i = 0; i < nk; ++i) {
    std::vector<float> all(size_t(T) * size_t(c.rows));
    ks[i]->rows(w, GgmlActs{T, c.cols, block, q.data(), d.data(), sums.data()}, bias.data(), all.data(), 0, c.rows);
    for (auto [t0, n] : {std::pair{0, kMatmulSmallRows + 1}, {3, 19}, {5, 40}, {26, 19}}) {
      const GgmlActs a{n, c.cols, block, q.data() + size_t(t0) * size_t(c.cols),
                       d.data() + size_t(t0) * size_t(c.cols / block), sums.data() + size_t(t0) * size_t(c.cols / 16)};
      std::vector<float> part(size_t(n) * size_t(c.rows), NAN);
      const int split = 16;
      ks[i]->rows(w, a, bias.data(), part.data(), 0, split);
      ks[i]->rows(w, a, bias.data(), part.data(), split, c.rows);
      for (int t = 0; t < n; ++t)
        for (int r = 0; r < c.rows; ++r) {
          const float want = all[size_t(t0 + t) * size_t(c.rows) + size_t(r)];
          const float got = part[size_t(t) * size_t(c.rows) + size_t(r)];
          ASSERT_EQ(std::memcmp(&got, &want, sizeof got), 0)
              << ks[i]->name << " row " << t0 + t << " in a batch of " << n << " from " << t0 << ", weight row " << r
              << ": " << got << " vs " << want;
        }
    }
  }
}

// The panel products (Q4_0 and Q8_0 under AVX-512) give a row of x alone the bits it gets in any
// batch, and match the scalar twin (one row: the fused kernel; several: the packed panels).
TEST_P(GgmlProduct, PanelRowsGiveOneRowItsBitsInABatch) {
  const ProductCase c = GetParam();
  const GgmlRowsFn panel = ggml_panel_rows(c.type);
  if (!panel) GTEST_SKIP() << "no panel product for " << ggml_type_info(c.type).name << " under this CPU's kernels";
  std::mt19937 rng(41);
  std::normal_distribution<float> g(0.f, 1.f);
  const int block = ggml_act_block(c.type), T = 9;
  for (bool raw : {false, true}) {
    const auto blocks = random_matrix(c.type, c.rows, c.cols, raw, 43);
    const WeightMatrix w = ggml_matrix(c.type, blocks.data(), c.rows, c.cols);
    std::vector<float> x(size_t(T) * size_t(c.cols)), bias(size_t(c.rows));
    for (auto& v : x) v = g(rng);
    for (auto& v : bias) v = g(rng);
    std::vector<int8_t> q(x.size());
    std::vector<float> d(size_t(T) * size_t(c.cols / block));
    std::vector<int16_t> sums(size_t(T) * size_t(c.cols / 16));
    ggml_quantize_acts(x.data(), c.cols, block, 0, T, q.data(), d.data(), sums.data());
    std::vector<float> all(size_t(T) * size_t(c.rows)), want(all.size());
    const GgmlActs a{T, c.cols, block, q.data(), d.data(), sums.data()};
    panel(w, a, bias.data(), all.data(), 0, c.rows);
    int nk = 0;
    ggml_kernels(&nk)[0]->rows(w, a, bias.data(), want.data(), 0, c.rows);
    for (int t = 0; t < T; ++t) {
      const GgmlActs one{1, c.cols, block, q.data() + size_t(t) * size_t(c.cols),
                         d.data() + size_t(t) * size_t(c.cols / block), sums.data() + size_t(t) * size_t(c.cols / 16)};
      std::vector<float> y(size_t(c.rows), NAN);
      panel(w, one, bias.data(), y.data(), 0, 5);  // a range ending mid-panel, then the rest
      panel(w, one, bias.data(), y.data(), 5, c.rows);
      for (int r = 0; r < c.rows; ++r) {
        const size_t i = size_t(t) * size_t(c.rows) + size_t(r);
        ASSERT_EQ(std::memcmp(&y[size_t(r)], &all[i], sizeof(float)), 0)
            << (raw ? "raw " : "") << "row " << t << " weight row " << r << ": " << y[size_t(r)] << " vs " << all[i];
        ASSERT_NEAR(all[i], want[i], 1e-4f * (1.f + std::fabs(want[i]))) << "row " << t << " weight row " << r;
      }
    }
  }
}

// x's quantization: every variant gives the scalar's bytes, scales and sums exactly, on rows with
// rounding ties, a zero block and large magnitudes.
TEST(GgmlActs, EveryVariantQuantizesXAsTheScalar) {
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.f, 3.f);
  int nk = 0;
  const GgmlKernel* const* ks = ggml_kernels(&nk);
  for (int block : {32, 256}) {
    const int K = 768, T = 5;
    std::vector<float> x(size_t(T) * K);
    for (auto& v : x) v = g(rng);
    for (int i = 0; i < 32; ++i) x[size_t(i)] = 0.f;  // a zero block
    // A block of max 127 (scale 1) holding half-integers: ties, rounded to even.
    for (int i = 0; i < 32; ++i) x[size_t(K + 256 + i)] = float(i) - 15.5f;
    x[size_t(K + 256)] = 127.f;
    x[size_t(2 * K + 5)] = 1e6f;
    std::vector<int8_t> q0(x.size()), q1(x.size());
    std::vector<float> d0(size_t(T) * (K / block)), d1(d0.size());
    std::vector<int16_t> s0(size_t(T) * (K / 16)), s1(s0.size());
    ks[0]->quantize(x.data(), K, block, 0, T, q0.data(), d0.data(), s0.data());
    int nonzero = 0;
    for (int8_t v : q0) nonzero += v != 0;
    EXPECT_GT(nonzero, int(x.size()) / 2);
    for (int i = 1; i < nk; ++i) {
      ks[i]->quantize(x.data(), K, block, 0, 2, q1.data(), d1.data(), s1.data());
      ks[i]->quantize(x.data(), K, block, 2, T, q1.data(), d1.data(), s1.data());
      EXPECT_EQ(q1, q0) << ks[i]->name << " block " << block;
      EXPECT_EQ(d1, d0) << ks[i]->name << " block " << block;
      EXPECT_EQ(s1, s0) << ks[i]->name << " block " << block;
    }
  }
}

// The scalar twin against the float product (matmul_ref over dequantized rows): off by no more than
// rounding x to int8 per block, sum_k |w_k| d_b(k) / 2, plus float rounding.
TEST_P(GgmlProduct, ScalarTwinWithinTheActivationRoundingBound) {
  const ProductCase c = GetParam();
  std::mt19937 rng(9);
  std::normal_distribution<float> g(0.f, 1.f);
  const int T = 3, block = ggml_act_block(c.type);
  const auto blocks = random_matrix(c.type, c.rows, c.cols, false, 23);
  const WeightMatrix w = ggml_matrix(c.type, blocks.data(), c.rows, c.cols);
  std::vector<float> x(size_t(T) * size_t(c.cols));
  for (auto& v : x) v = g(rng);
  std::vector<int8_t> q(x.size());
  std::vector<float> d(size_t(T) * size_t(c.cols / block));
  std::vector<int16_t> sums(size_t(T) * size_t(c.cols / 16));
  ggml_quantize_acts(x.data(), c.cols, block, 0, T, q.data(), d.data(), sums.data());
  const GgmlActs a{T, c.cols, block, q.data(), d.data(), sums.data()};
  std::vector<float> got(size_t(T) * size_t(c.rows)), want(got.size());
  int nk = 0;
  ggml_kernels(&nk)[0]->rows(w, a, nullptr, got.data(), 0, c.rows);
  matmul_ref(x.data(), T, w, nullptr, want.data());
  std::vector<float> row(size_t(c.cols));
  double worst = 0;
  for (int r = 0; r < c.rows; ++r) {
    ggml_dequant_row(w, r, row.data());
    for (int t = 0; t < T; ++t) {
      double bound = 0, mag = 0;
      for (int k = 0; k < c.cols; ++k) {
        bound += std::fabs(row[size_t(k)]) * d[size_t(t) * size_t(c.cols / block) + size_t(k / block)] / 2;
        mag += std::fabs(row[size_t(k)] * x[size_t(t) * size_t(c.cols) + size_t(k)]);
      }
      const size_t i = size_t(t) * size_t(c.rows) + size_t(r);
      const double err = std::fabs(double(got[i]) - want[i]);
      ASSERT_LE(err, bound + 1e-5 * mag) << ggml_type_info(c.type).name << " row " << r << " t " << t;
      worst = std::max(worst, err / mag);
    }
  }
  EXPECT_GT(worst, 0.0);  // x really was quantized
}

// matmul (ops.h) under every SIMD target, through a pool: the same as the scalar twin. The block
// kernels alone: AMX, which takes T = 17 where the CPU has it, is tested in test_amx.cpp.
TEST_P(GgmlProduct, MatmulUnderEverySimdTarget) {
  const ProductCase c = GetParam();
  struct NoAmx {
    NoAmx() { set_amx_enabled(false); }
    ~NoAmx() { set_amx_enabled(true); }
  } no_amx;
  std::mt19937 rng(13);
  std::normal_distribution<float> g(0.f, 1.f);
  const auto blocks = random_matrix(c.type, c.rows, c.cols, false, 29);
  const WeightMatrix w = ggml_matrix(c.type, blocks.data(), c.rows, c.cols);
  ThreadPool pool(3);
  const SimdTarget saved = active_simd_target();
  for (int T : {1, 6, 17}) {
    std::vector<float> x(size_t(T) * size_t(c.cols)), bias(size_t(c.rows));
    for (auto& v : x) v = g(rng);
    for (auto& v : bias) v = g(rng);
    std::vector<float> want(size_t(T) * size_t(c.rows)), got(want.size());
    set_simd_target(SimdTarget::Portable);
    EXPECT_STREQ(ggml_active_kernel().name, "scalar");
    matmul(x.data(), T, w, bias.data(), want.data(), pool);
    for (SimdTarget s : available_simd_targets()) {
      set_simd_target(s);
      std::fill(got.begin(), got.end(), NAN);
      matmul(x.data(), T, w, bias.data(), got.data(), pool);
      for (size_t j = 0; j < got.size(); ++j)
        ASSERT_NEAR(got[j], want[j], 1e-4f * (1.f + std::fabs(want[j])))
            << simd_target_name(s) << " (" << ggml_active_kernel().name << ") T " << T << " at " << j;
    }
  }
  set_simd_target(saved);
}

INSTANTIATE_TEST_SUITE_P(
    Types, GgmlProduct,
    ::testing::Values(ProductCase{GgmlType::Q4_K, 37, 768}, ProductCase{GgmlType::Q6_K, 37, 768},
                      ProductCase{GgmlType::Q5_K, 19, 512}, ProductCase{GgmlType::Q8_0, 37, 160},
                      ProductCase{GgmlType::Q4_0, 37, 160}, ProductCase{GgmlType::Q4_1, 21, 96},
                      ProductCase{GgmlType::Q5_0, 21, 96}, ProductCase{GgmlType::Q5_1, 21, 96}),
    [](const ::testing::TestParamInfo<ProductCase>& i) { return std::string(ggml_type_info(i.param.type).name); });

// Real blocks: one tensor of each quantized type in kjv-small's Q4_K_M file (Q4_K, Q6_K, and the
// Q8_0 / Q5_0 llama-quantize falls back to for 1376-wide rows), every variant against the float
// product within the activation-rounding bound.
TEST(GgmlProductReal, KjvSmallQ4_K_MTensors) {
  const auto path = test::shared_model("gguf") / "kjv-small-Q4_K_M.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  const GgufTensors f(path);
  std::map<GgmlType, std::string> first;
  for (const auto& [name, t] : f.tensors)
    if (ggml_supported(t.type) && t.dims.size() == 2) first.emplace(t.type, name);
  for (GgmlType want : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q5_0})
    EXPECT_TRUE(first.count(want)) << ggml_type_info(want).name;
  std::mt19937 rng(41);
  std::normal_distribution<float> g(0.f, 1.f);
  int nk = 0;
  const GgmlKernel* const* ks = ggml_kernels(&nk);
  for (const auto& [type, name] : first) {
    const auto& t = f.tensors.at(name);
    const int cols = int(t.dims[0]), rows = int(t.dims[1]), T = 2, block = ggml_act_block(type);
    const WeightMatrix w = ggml_matrix(type, t.data, rows, cols);
    std::vector<float> x(size_t(T) * size_t(cols));
    for (auto& v : x) v = g(rng);
    std::vector<int8_t> q(x.size());
    std::vector<float> d(size_t(T) * size_t(cols / block));
    std::vector<int16_t> sums(size_t(T) * size_t(cols / 16));
    ggml_quantize_acts(x.data(), cols, block, 0, T, q.data(), d.data(), sums.data());
    const GgmlActs a{T, cols, block, q.data(), d.data(), sums.data()};
    std::vector<float> want(size_t(T) * size_t(rows)), bound(want.size()), got(want.size());
    matmul_ref(x.data(), T, w, nullptr, want.data());
    std::vector<float> row(static_cast<size_t>(cols));
    for (int r = 0; r < rows; ++r) {
      ggml_dequant_row(w, r, row.data());
      for (int tt = 0; tt < T; ++tt) {
        double b = 0, mag = 0;
        for (int k = 0; k < cols; ++k) {
          b += std::fabs(row[size_t(k)]) * d[size_t(tt) * size_t(cols / block) + size_t(k / block)] / 2;
          mag += std::fabs(row[size_t(k)] * x[size_t(tt) * size_t(cols) + size_t(k)]);
        }
        bound[size_t(tt) * size_t(rows) + size_t(r)] = float(b + 1e-5 * mag);
      }
    }
    for (int i = 0; i < nk; ++i) {
      ks[i]->rows(w, a, nullptr, got.data(), 0, rows);
      for (size_t j = 0; j < got.size(); ++j)
        ASSERT_NEAR(got[j], want[j], bound[j]) << ks[i]->name << " " << name << " (" << ggml_type_info(type).name << ")";
    }
    if (!ggml_pack_fit(w)) continue;
    std::vector<uint8_t> packed(ggml_packed_bytes(w));  // the layout the loader makes (ggml_pack)
    ggml_pack(w, packed.data(), 0, rows / kGgmlPackRows);
    const WeightMatrix pw = ggml_packed_matrix(type, packed.data(), rows, cols);
    for (int i = 0; i < nk; ++i) {
      ks[i]->rows(pw, a, nullptr, got.data(), 0, rows);
      for (size_t j = 0; j < got.size(); ++j)
        ASSERT_NEAR(got[j], want[j], bound[j]) << ks[i]->name << " packed " << name;
    }
  }
}

// ---- the 32-value types, Q4_K, Q5_K and Q6_K packed in 16-row groups (ggml.h, ggml_pack) --------

constexpr GgmlType kPackedTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                     GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

// A packed copy of a row-major matrix of one of kPackedTypes, with its bytes.
struct Packed {
  std::vector<uint8_t> bytes;
  WeightMatrix w;
  explicit Packed(const WeightMatrix& src) : bytes(ggml_packed_bytes(src)) {
    const int groups = src.rows / kGgmlPackRows;
    ggml_pack(src, bytes.data(), 0, groups / 2);  // in two calls, as the loader's threads do
    ggml_pack(src, bytes.data(), groups / 2, groups);
    w = ggml_packed_matrix(src.ggml, bytes.data(), src.rows, src.cols);
  }
};

// Every row comes back as the file's bytes (Q4_K's 6-bit scale packing, the Q5 types' fifth bits,
// Q4_1's and Q5_1's m, Q6_K's ql/qh split included), on raw random blocks (every bit pattern) and
// quantizer output; packed Q4_K and Q5_K are 4 bytes a block larger, the others the same size.
TEST(GgmlPack, RowsRoundTripBitForBit) {
  for (GgmlType type : kPackedTypes)
    for (bool raw : {true, false}) {
      const int rows = 48, cols = 768;
      const auto blocks = random_matrix(type, rows, cols, raw, 7);
      const WeightMatrix w = ggml_matrix(type, blocks.data(), rows, cols);
      ASSERT_TRUE(ggml_pack_fit(w));
      const Packed p(w);
      const bool k45 = type == GgmlType::Q4_K || type == GgmlType::Q5_K;
      EXPECT_EQ(p.bytes.size(), k45 ? w.nbytes() + size_t(rows) * (cols / 256) * 4u : w.nbytes());
      EXPECT_EQ(p.w.nbytes(), p.bytes.size());
      EXPECT_FALSE(ggml_pack_fit(p.w));  // packed once
      std::vector<uint8_t> row(w.row_bytes());
      std::vector<float> a(static_cast<size_t>(cols)), b(static_cast<size_t>(cols));
      for (int r = 0; r < rows; ++r) {
        ggml_unpack_row(p.w, r, row.data());
        ASSERT_EQ(0, std::memcmp(row.data(), blocks.data() + size_t(r) * w.row_bytes(), row.size()))
            << ggml_type_info(type).name << " row " << r;
        ggml_dequant_row(w, r, a.data());
        ggml_dequant_row(p.w, r, b.data());
        ASSERT_EQ(a, b) << ggml_type_info(type).name << " row " << r;
      }
    }
  // Only matrices of whole groups and whole units (the 32-value types: 64 values), not Q2_K/Q3_K.
  struct Unfit {
    GgmlType type;
    int rows, cols;
  };
  for (Unfit u : {Unfit{GgmlType::Q4_K, 24, 256}, {GgmlType::Q5_K, 24, 256}, {GgmlType::Q3_K, 16, 256},
                  {GgmlType::Q4_0, 16, 96}, {GgmlType::Q4_1, 16, 96}, {GgmlType::Q5_0, 16, 96},
                  {GgmlType::Q5_1, 16, 96}, {GgmlType::Q8_0, 16, 96}}) {
    const auto blocks = random_matrix(u.type, u.rows, u.cols, true, 1);
    EXPECT_FALSE(ggml_pack_fit(ggml_matrix(u.type, blocks.data(), u.rows, u.cols))) << ggml_type_info(u.type).name;
  }
}

// Packed Q4_0 and Q8_0 take the unpacked panels' operations in their order: under the variants with
// packed kernels (AVX-512 VNNI: both; AVX2: Q4_0, against its 8-row panels), each output is the same bits as
// from the file's layout, for T = 1..15 (every tile and tail of 1 and 2 groups) and up to 20, ranges
// ending mid-group and an odd number of groups. The file's Q8_0 takes the panels only above
// kMatmulSmallRows rows of x (one-row kernels below): packed, every row of x gets the bits those
// panels give it, whatever the count of rows. The packed products without a panel twin (Q4_1, Q5_0,
// Q5_1, AVX2's Q8_0 and the K-quants) give every row the bits of all rows at once, and the AVX-512
// VNNI packed product's where the CPU has both. (The other variants unpack the rows for their one-row
// kernels: EveryVariantMatchesTheScalarTwin.)
TEST(GgmlPack, PackedProductsAreBitForBitTheirPanelsOrAllRowsAtOnce) {
  int n = 0;
  const GgmlKernel* const* all = ggml_kernels(&n);
  std::vector<std::pair<const GgmlKernel*, GgmlType>> cases;
  const GgmlKernel* vnni = nullptr;
  for (int i = 0; i < n; ++i) {
    const std::string name = all[i]->name;
    if (name == "avx512vnni")
      for (GgmlType t : kPackedTypes)
        if (ggml_type_info(t).block_elems == 32) cases.push_back({all[i], t}), vnni = all[i];
    if (name == "avx2")
      for (GgmlType t : kPackedTypes) cases.push_back({all[i], t});
  }
  if (cases.empty()) GTEST_SKIP() << "no AVX2: no packed kernels on this CPU";
  std::mt19937 rng(41);
  std::normal_distribution<float> g(0.f, 1.f);
  const int rows = 80, cols = 768, most = 20;
  static_assert(most > kMatmulSmallRows);
  for (auto [k, type] : cases) {
    SCOPED_TRACE(std::string(k->name) + " " + std::string(ggml_type_info(type).name));
    const bool avx2 = std::string(k->name) == "avx2", with_panels = type == GgmlType::Q4_0 || (!avx2 && type == GgmlType::Q8_0);
    const int block = ggml_act_block(type);
    const auto blocks = random_matrix(type, rows, cols, false, 43);
    const WeightMatrix w = ggml_matrix(type, blocks.data(), rows, cols);
    const Packed p(w);
    std::vector<float> bias(static_cast<size_t>(rows));
    for (auto& v : bias) v = g(rng);
    std::vector<float> x(size_t(most) * size_t(cols));
    for (auto& v : x) v = g(rng);
    std::vector<int8_t> q(x.size());
    std::vector<float> d(size_t(most) * size_t(cols / block));
    std::vector<int16_t> sums(size_t(most) * size_t(cols / 16));
    ggml_quantize_acts(x.data(), cols, block, 0, most, q.data(), d.data(), sums.data());
    // All `most` rows at once: Q8_0's panels (AVX-512 VNNI), or the packed product (by the AVX-512
    // VNNI kernel where there is one); Q4_0's panels are its reference at each T.
    std::vector<float> at_once(size_t(most) * size_t(rows));
    const GgmlActs all_rows{most, cols, block, q.data(), d.data(), sums.data()};
    if (!with_panels)
      (vnni ? vnni : k)->rows(p.w, all_rows, bias.data(), at_once.data(), 0, rows);
    else
      k->rows(w, all_rows, bias.data(), at_once.data(), 0, rows);
    for (int T = 1; T <= most; ++T) {
      const GgmlActs a{T, cols, block, q.data(), d.data(), sums.data()};
      std::vector<float> want(size_t(T) * size_t(rows)), got(want.size());
      if (type == GgmlType::Q4_0)
        k->rows(w, a, bias.data(), want.data(), 0, rows);
      else
        std::copy_n(at_once.begin(), want.size(), want.begin());
      std::fill(got.begin(), got.end(), NAN);
      for (auto [r0, r1] : {std::pair{0, 21}, {21, 48}, {48, rows}}) k->rows(p.w, a, bias.data(), got.data(), r0, r1);
      for (size_t j = 0; j < got.size(); ++j) ASSERT_EQ(got[j], want[j]) << "T " << T << " at " << j;
    }
  }
}

// Every variant's product over the packed copy against the scalar twin over the file's rows, for
// T = 1..9 (every count of x rows a group takes at once, and more) and ranges ending mid-group.
TEST(GgmlPack, EveryVariantMatchesTheScalarTwin) {
  std::mt19937 rng(19);
  std::normal_distribution<float> g(0.f, 1.f);
  int nk = 0;
  const GgmlKernel* const* ks = ggml_kernels(&nk);
  for (GgmlType type : kPackedTypes)
  for (bool raw : {false, true}) {
    const int rows = 64, cols = 1024, block = ggml_act_block(type);
    const auto blocks = random_matrix(type, rows, cols, raw, 3);
    const WeightMatrix w = ggml_matrix(type, blocks.data(), rows, cols);
    const Packed p(w);
    std::vector<float> bias(static_cast<size_t>(rows));
    for (auto& v : bias) v = g(rng);
    for (int T = 1; T <= 9; ++T) {
      std::vector<float> x(size_t(T) * size_t(cols));
      for (auto& v : x) v = g(rng);
      std::vector<int8_t> q(x.size());
      std::vector<float> d(size_t(T) * size_t(cols / block));
      std::vector<int16_t> sums(size_t(T) * size_t(cols / 16));
      ggml_quantize_acts(x.data(), cols, block, 0, T, q.data(), d.data(), sums.data());
      const GgmlActs a{T, cols, block, q.data(), d.data(), sums.data()};
      std::vector<float> want(size_t(T) * size_t(rows)), got(want.size()), mag(want.size());
      ks[0]->rows(w, a, bias.data(), want.data(), 0, rows);
      std::vector<float> row(static_cast<size_t>(cols));
      for (int r = 0; r < rows; ++r) {
        ggml_dequant_row(w, r, row.data());
        for (int t = 0; t < T; ++t) {
          double m = 0;
          for (int k = 0; k < cols; ++k) m += std::fabs(double(row[size_t(k)]) * x[size_t(t) * size_t(cols) + size_t(k)]);
          mag[size_t(t) * size_t(rows) + size_t(r)] = float(m);
        }
      }
      for (int i = 0; i < nk; ++i) {
        std::fill(got.begin(), got.end(), NAN);
        ks[i]->rows(p.w, a, bias.data(), got.data(), 0, 21);  // ends mid-group
        ks[i]->rows(p.w, a, bias.data(), got.data(), 21, 40);
        ks[i]->rows(p.w, a, bias.data(), got.data(), 40, rows);
        for (size_t j = 0; j < got.size(); ++j)
          ASSERT_NEAR(got[j], want[j], 1e-5f * mag[j] + 1e-5f)
              << ks[i]->name << " " << ggml_type_info(type).name << (raw ? " raw" : "") << " T " << T << " at " << j;
      }
    }
  }
}

// matmul over the packed copy under every SIMD target: the row-major product's values, and a row of
// x gets the same bits alone as in a batch.
TEST(GgmlPack, MatmulUnderEverySimdTarget) {
  struct NoAmx {
    NoAmx() { set_amx_enabled(false); }
    ~NoAmx() { set_amx_enabled(true); }
  } no_amx;
  std::mt19937 rng(23);
  std::normal_distribution<float> g(0.f, 1.f);
  const int rows = 80, cols = 512;
  ThreadPool pool(3);
  const SimdTarget saved = active_simd_target();
  for (GgmlType type : kPackedTypes)
  for (int T : {1, 6, 17}) {
    const auto blocks = random_matrix(type, rows, cols, false, 29);
    const WeightMatrix w = ggml_matrix(type, blocks.data(), rows, cols);
    const Packed p(w);
    std::vector<float> x(size_t(T) * size_t(cols));
    for (auto& v : x) v = g(rng);
    std::vector<float> want(size_t(T) * size_t(rows)), got(want.size()), one(static_cast<size_t>(rows));
    for (SimdTarget s : available_simd_targets()) {
      set_simd_target(s);
      matmul(x.data(), T, w, nullptr, want.data(), pool);
      std::fill(got.begin(), got.end(), NAN);
      matmul(x.data(), T, p.w, nullptr, got.data(), pool);
      for (size_t j = 0; j < got.size(); ++j)
        ASSERT_NEAR(got[j], want[j], 1e-4f * (1.f + std::fabs(want[j])))
            << simd_target_name(s) << " (" << ggml_active_kernel().name << ") T " << T << " at " << j;
      matmul(x.data() + size_t(T - 1) * size_t(cols), 1, p.w, nullptr, one.data(), pool);
      for (int r = 0; r < rows; ++r)
        ASSERT_EQ(one[size_t(r)], got[size_t(T - 1) * size_t(rows) + size_t(r)]) << simd_target_name(s) << " T " << T;
    }
  }
  set_simd_target(saved);
}

// Several matrices of one x (q, k and v; gate and up: ops.h matmul_shared_x) in one call: each gets
// the bits of its own product, packed or in the file's layout, whichever matrices a thread's part
// crosses (decode) and in prefill; types whose x is quantized otherwise (Q8_0 beside Q4_K) take
// separate calls.
TEST(GgmlPack, SeveralMatricesInOneCallGetTheirOwnBits) {
  struct NoAmx {
    NoAmx() { set_amx_enabled(false); }
    ~NoAmx() { set_amx_enabled(true); }
  } no_amx;
  const int cols = 512;
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<std::unique_ptr<Packed>> packed;
  const auto file = [&](GgmlType t, int rows) {
    blocks.push_back(random_matrix(t, rows, cols, false, uint32_t(40 + blocks.size())));
    return ggml_matrix(t, blocks.back().data(), rows, cols);
  };
  const auto pack = [&](const WeightMatrix& w) {
    packed.push_back(std::make_unique<Packed>(w));
    return packed.back()->w;
  };
  const WeightMatrix q40 = file(GgmlType::Q4_0, 80), k40 = file(GgmlType::Q4_0, 16), v80 = file(GgmlType::Q8_0, 48);
  const WeightMatrix q4k = file(GgmlType::Q4_K, 48), k4k = file(GgmlType::Q4_K, 16), v6k = file(GgmlType::Q6_K, 32);
  const std::vector<test::SharedXSet> sets = {
      {"Q4_0, Q4_0, Q8_0 packed", {pack(q40), pack(k40), pack(v80)}, true},
      {"Q4_K, Q4_K, Q6_K packed", {pack(q4k), pack(k4k), pack(v6k)}, true},
      {"Q4_0, Q4_0, Q8_0 in the file's layout, 40 rows among them", {q40, file(GgmlType::Q4_0, 40), v80}, true},
      {"Q4_K packed beside Q6_K in the file's layout", {pack(q4k), v6k}, true},
      {"Q8_0 and Q4_K: x quantized otherwise", {pack(v80), q4k}, false},
  };
  test::expect_sets_share_x(sets, [](std::span<const MatmulOutput> outs) { return ggml_matmul_shares(outs); });
}

// Q2_K and Q3_K have no integer kernels: the generic product, still equal to the float reference.
TEST(GgmlProductGeneric, Q2_KAndQ3_K) {
  std::mt19937 rng(31);
  std::normal_distribution<float> g(0.f, 1.f);
  ThreadPool pool(2);
  for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K}) {
    const int rows = 9, cols = 512, T = 3;
    const GgmlTypeInfo info = ggml_type_info(t);
    std::vector<uint8_t> b(size_t(rows) * (cols / 256) * size_t(info.block_bytes));
    for (auto& v : b) v = uint8_t(rng());
    for (size_t o = 0; o < b.size(); o += size_t(info.block_bytes)) {
      if (t == GgmlType::Q2_K) put_f16(b.data() + o + 80, 0.01f), put_f16(b.data() + o + 82, 0.005f);
      else put_f16(b.data() + o + 108, 0.01f);
    }
    const WeightMatrix w = ggml_matrix(t, b.data(), rows, cols);
    std::vector<float> x(size_t(T) * cols), y(size_t(T) * rows), want(y.size());
    for (auto& v : x) v = g(rng);
    matmul(x.data(), T, w, nullptr, y.data(), pool);
    matmul_ref(x.data(), T, w, nullptr, want.data());
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], want[i], 1e-4f * (1 + std::fabs(want[i]))) << info.name;
  }
}

}  // namespace
}  // namespace ptllm
