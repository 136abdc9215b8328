// GGUF: the reader (every value type, bounds, errors naming the file and the field), the model built
// from it (the safetensors goldens through files written by our writer and by llama.cpp), the Q/K
// permutation, the embedded tokenizer against tokenizer.json, the quantizers and the writer.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <span>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/prompt_cache.h"
#include "engine/runtime.h"
#include "engine/session.h"
#include "kernels/ggml.h"
#include "kernels/ops.h"
#include "kernels/simd.h"
#include "model/gguf.h"
#include "model/gguf_mix.h"
#include "model/gguf_model.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "test_util.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

GgufFile parse(const std::string& bytes, const std::string& name = "t.gguf") {
  return GgufFile::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), name);
}

GgufValue scalar(GgufType t) {
  GgufValue v;
  v.type = t;
  return v;
}

// A builder holding one value of every type, nested arrays included, and two small tensors.
GgufBuilder every_type_builder(std::vector<float>& f32_data) {
  GgufBuilder b;
  auto add_int = [&](const char* k, GgufType t, int64_t x) {
    GgufValue v = scalar(t);
    v.i = x;
    v.u = uint64_t(x);
    b.add(k, v);
  };
  add_int("u8", GgufType::U8, 200);
  add_int("i8", GgufType::I8, -100);
  add_int("u16", GgufType::U16, 60000);
  add_int("i16", GgufType::I16, -30000);
  add_int("u32", GgufType::U32, 4000000000LL);
  add_int("i32", GgufType::I32, -2000000000);
  add_int("u64", GgufType::U64, int64_t(1) << 40);
  add_int("i64", GgufType::I64, -(int64_t(1) << 40));
  GgufValue f = scalar(GgufType::F32);
  f.f = 0.5;
  b.add("f32", f);
  GgufValue d = scalar(GgufType::F64);
  d.f = 1e100;
  b.add("f64", d);
  b.add_bool("bool", true);
  b.add_string("str", std::string("h\xc3\xa9llo\0x", 8));
  b.add_strings("strs", {"a", "", "ccc"});
  // [[1, 2], [], [3]] of int16
  GgufValue outer = scalar(GgufType::Array);
  outer.elem = GgufType::Array;
  for (std::vector<int> xs : {std::vector<int>{1, 2}, std::vector<int>{}, std::vector<int>{3}}) {
    GgufValue inner = scalar(GgufType::Array);
    inner.elem = GgufType::I16;
    for (int x : xs) {
      GgufValue e = scalar(GgufType::I16);
      e.i = x;
      inner.array.push_back(e);
    }
    outer.array.push_back(inner);
  }
  b.add("nested", outer);
  f32_data = {1.f, -2.f, 3.5f};
  b.add_tensor("vec", {3}, GgmlType::F32, [&f32_data](uint8_t* o) { std::memcpy(o, f32_data.data(), 12); });
  b.add_tensor("mat", {32, 2}, GgmlType::Q8_0, [](uint8_t* o) {
    for (int i = 0; i < 68; ++i) o[i] = uint8_t(i);
  });
  return b;
}

// The whole file the builder writes, as bytes.
std::string file_bytes(const GgufBuilder& b, const fs::path& tmp) {
  b.write(tmp);
  return read_whole_file(tmp, uint64_t(1) << 30, "test");
}

TEST(GgufReader, EveryValueTypeRoundTrips) {
  test::TempDir tmp;
  std::vector<float> data;
  const GgufBuilder b = every_type_builder(data);
  b.write(tmp.path / "all.gguf");
  const GgufFile f = GgufFile::open(tmp.path / "all.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.find("u8")->u, 200u);
  EXPECT_EQ(f.find("i8")->i, -100);
  EXPECT_EQ(f.find("u16")->u, 60000u);
  EXPECT_EQ(f.find("i16")->i, -30000);
  EXPECT_EQ(f.find("u32")->u, 4000000000u);
  EXPECT_EQ(f.find("i32")->i, -2000000000);
  EXPECT_EQ(f.find("u64")->u, uint64_t(1) << 40);
  EXPECT_EQ(f.find("i64")->i, -(int64_t(1) << 40));
  EXPECT_EQ(f.find("f32")->f, 0.5);
  EXPECT_EQ(f.find("f64")->f, 1e100);
  EXPECT_TRUE(*f.opt_bool("bool"));
  EXPECT_EQ(f.get_string("str"), std::string("h\xc3\xa9llo\0x", 8));
  const GgufValue* strs = f.opt_array("strs", {GgufType::String});
  ASSERT_NE(strs, nullptr);
  ASSERT_EQ(strs->array.size(), 3u);
  EXPECT_EQ(strs->array[2].str, "ccc");
  const GgufValue* nested = f.find("nested");
  ASSERT_EQ(nested->elem, GgufType::Array);
  ASSERT_EQ(nested->array.size(), 3u);
  EXPECT_EQ(nested->array[0].array[1].i, 2);
  EXPECT_TRUE(nested->array[1].array.empty());
  EXPECT_EQ(nested->array[2].array[0].i, 3);
  const GgufTensor* vec = f.find_tensor("vec");
  ASSERT_NE(vec, nullptr);
  float got[3];
  std::memcpy(got, vec->data, 12);
  EXPECT_EQ(got[1], -2.f);
  const GgufTensor* mat = f.find_tensor("mat");
  EXPECT_EQ(mat->dims_str(), "[32, 2]");
  EXPECT_EQ(mat->nbytes, 68u);
  EXPECT_EQ(mat->offset % 32, 0u);
  EXPECT_EQ(mat->data[67], 67);
  // Typed reads name the key and the problem.
  EXPECT_NE(error_of([&] { f.get_int("str", 0, 10); }).find("all.gguf: metadata 'str': expected an integer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.get_int("u8", 0, 10); }).find("200 is outside [0, 10]"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_string("absent"); }).find("metadata 'absent': missing"), std::string::npos);
  EXPECT_NE(error_of([&] { f.opt_array("strs", {GgufType::F32}); }).find("got an array of string"), std::string::npos);
}

TEST(GgufReader, EveryTruncationIsAnErrorNamingTheFile) {
  test::TempDir tmp;
  std::vector<float> data;
  const std::string bytes = file_bytes(every_type_builder(data), tmp.path / "t.gguf");
  const GgufFile whole = parse(bytes);
  const uint64_t need = whole.find_tensor("mat")->offset + 68 + whole.data_offset();
  for (size_t n = 0; n < need; ++n) {
    const std::string cut = bytes.substr(0, n);
    const std::string e = error_of([&] { parse(cut, "cut.gguf"); });
    ASSERT_EQ(e.rfind("cut.gguf: ", 0), 0u) << "length " << n << ": '" << e << "'";
  }
  EXPECT_NE(error_of([&] { parse(bytes.substr(0, size_t(need) - 1), "cut.gguf"); })
                .find("cut.gguf: tensor 'mat': data offset "),
            std::string::npos);
}

// Patches the little-endian uint64 or uint32 at `pos` of a copy.
template <class T>
std::string patched(std::string b, size_t pos, T v) {
  std::memcpy(b.data() + pos, &v, sizeof(T));
  return b;
}

TEST(GgufReader, LyingHeadersAreErrorsNamingTheField) {
  GgufBuilder b;
  b.add_string("general.architecture", "llama");
  b.add_strings("list", {"x", "y"});
  b.add_tensor("w", {32, 1}, GgmlType::Q8_0, [](uint8_t* o) { std::memset(o, 0, 34); });
  const std::string h = b.header();
  std::string good = h + std::string(64, '\0');
  ASSERT_NO_THROW(parse(good));
  // Offsets: magic 0, version 4, tensor count 8, kv count 16, first key length 24.
  EXPECT_NE(error_of([&] { parse(patched<uint32_t>(good, 0, 0x12345678)); }).find("not a GGUF file"), std::string::npos);
  EXPECT_NE(error_of([&] { parse(patched<uint32_t>(good, 4, 1)); }).find("GGUF version 1"), std::string::npos);
  EXPECT_NE(error_of([&] { parse(patched<uint64_t>(good, 8, uint64_t(1) << 60)); }).find("tensor count"), std::string::npos);
  EXPECT_NE(error_of([&] { parse(patched<uint64_t>(good, 16, uint64_t(1) << 60)); }).find("metadata count"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse(patched<uint64_t>(good, 24, ~uint64_t(0))); }).find("metadata entry 0 key"),
            std::string::npos);
  // The value of the first key: its string length (after key len 8 + "general.architecture" 20 + type 4).
  const size_t v0 = 24 + 8 + 20 + 4;
  EXPECT_NE(error_of([&] { parse(patched<uint64_t>(good, v0, uint64_t(1) << 62)); })
                .find("t.gguf: metadata 'general.architecture' (string of 4611686018427387904 bytes)"),
            std::string::npos);
  // Its type: 99 is no GGUF type.
  EXPECT_NE(error_of([&] { parse(patched<uint32_t>(good, v0 - 4, 99)); })
                .find("metadata 'general.architecture': value type 99 is not a GGUF type"),
            std::string::npos);
  // The array's length: "list" key at v0 + 8 + 5, then type 4, element type 4, length 8.
  const size_t a0 = v0 + 8 + 5 + 8 + 4 + 4 + 4;
  EXPECT_NE(error_of([&] { parse(patched<uint64_t>(good, a0, uint64_t(1) << 40)); })
                .find("metadata 'list': array of 1099511627776 string values cannot fit"),
            std::string::npos);
  // Tensor info: name "w" after the array (2 strings of 1 byte).
  const size_t t0 = a0 + 8 + 2 * 9;
  const size_t dims = t0 + 8 + 1 + 4, type = dims + 16, off = type + 4;
  EXPECT_NE(error_of([&] { parse(patched<uint32_t>(good, t0 + 9, 7)); }).find("tensor 'w': 7 dimensions"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse(patched<uint64_t>(good, dims, 33)); })
                .find("tensor 'w': type Q8_0 stores blocks of 32 values, but the rows are 33 long"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse(patched<uint32_t>(good, type, 77)); }).find("tensor 'w': unknown tensor type 77"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse(patched<uint64_t>(good, off, 4)); }).find("not a multiple of the alignment 32"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse(patched<uint64_t>(good, off, 1024)); })
                .find("t.gguf: tensor 'w': data offset 1024 + 34 bytes past the end of the file"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse(patched<uint64_t>(good, dims + 8, uint64_t(1) << 40)); }).find("dimension 1 is"),
            std::string::npos);
}

TEST(GgufReader, AlignmentKeyDuplicatesAndOverlaps) {
  GgufBuilder b;
  b.add_u32("general.alignment", 64);
  b.add_tensor("a", {4}, GgmlType::F32, [](uint8_t*) {});
  b.add_tensor("b", {4}, GgmlType::F32, [](uint8_t*) {});
  const std::string h = b.header(64);
  const GgufFile f = parse(h + std::string(128, '\0'));
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.find_tensor("b")->offset, 64u);

  GgufBuilder bad;
  bad.add_u32("general.alignment", 48);
  EXPECT_NE(error_of([&] { parse(bad.header()); }).find("metadata 'general.alignment': 48 is not a power of two"),
            std::string::npos);
  GgufBuilder twice;
  twice.add_u32("k", 1);
  twice.add_u32("k", 2);
  EXPECT_NE(error_of([&] { parse(twice.header()); }).find("metadata 'k' appears twice"), std::string::npos);
  GgufBuilder same;
  same.add_tensor("x", {4}, GgmlType::F32, [](uint8_t*) {});
  same.add_tensor("x", {4}, GgmlType::F32, [](uint8_t*) {});
  EXPECT_NE(error_of([&] { parse(same.header() + std::string(64, '\0')); }).find("tensor 'x': appears twice"),
            std::string::npos);
}

TEST(GgufReader, DeepNestingAndFifoAreRefused) {
  // 9 nested arrays, each with one element.
  std::string h;
  auto put32 = [&](uint32_t v) { h.append(reinterpret_cast<const char*>(&v), 4); };
  auto put64 = [&](uint64_t v) { h.append(reinterpret_cast<const char*>(&v), 8); };
  put32(0x46554747);
  put32(3);
  put64(0);
  put64(1);
  put64(1);
  h += "k";
  put32(9);
  for (int i = 0; i < 9; ++i) {
    put32(9);
    put64(1);
  }
  put32(0);
  put64(0);
  EXPECT_NE(error_of([&] { parse(h); }).find("metadata 'k': arrays nested deeper than 8 levels"), std::string::npos);

  test::TempDir tmp;
  const fs::path fifo = tmp.path / "pipe.gguf";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(error_of([&] { GgufFile::open(fifo); }).find("is a FIFO, not a regular file"), std::string::npos);
  EXPECT_NE(error_of([&] { Model::load(tmp.path / "absent.gguf"); }).find("absent.gguf: cannot open"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// The Q/K permutation

TEST(GgufModel, UnpermutingProjectedRowsUndoesTheConvertersRowOrder) {
  const int heads = 3, D = 8, cols = 32, rows = heads * D, T = 2;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> w(size_t(rows * cols)), x(size_t(T * cols));
  for (auto& v : w) v = nd(rng);
  for (auto& v : x) v = nd(rng);
  const std::vector<int> src = gguf_permuted_rows(rows, D);
  // The converter's order, spelled out: destination row h*D + 2j + i holds source row h*D + i*D/2 + j.
  EXPECT_EQ(src[size_t(1 * D + 2 * 1 + 1)], 1 * D + 1 * D / 2 + 1);
  std::vector<float> wp(w.size());
  for (int r = 0; r < rows; ++r) std::copy_n(&w[size_t(src[size_t(r)] * cols)], cols, &wp[size_t(r * cols)]);
  std::vector<float> y(size_t(T * rows)), yp(size_t(T * rows));
  matmul_ref(x.data(), T, dense_matrix(DType::F32, w.data(), rows, cols), nullptr, y.data());
  matmul_ref(x.data(), T, dense_matrix(DType::F32, wp.data(), rows, cols), nullptr, yp.data());
  EXPECT_NE(y, yp);
  gguf_unpermute_heads(yp.data(), T, heads, D);
  EXPECT_EQ(y, yp);
}

// ---------------------------------------------------------------------------------------------
// Models: the goldens through GGUF files

struct Golden {
  std::vector<int32_t> tf_ids;
  std::vector<float> tf_nll;
  double mean_nll;
  nlohmann::json prompts;
};
Golden golden_of(const fs::path& dir) {
  SafetensorsFile g(dir / "golden.safetensors");
  const auto j = test::read_json(dir / "golden.json");
  return {test::tensor_values<int32_t>(g, "tf_ids"), test::tensor_values<float>(g, "tf_nll"),
          j["teacher_forced"]["mean_nll"].get<double>(), j["prompts"]};
}

SessionOptions f32_opts() {
  SessionOptions o;  // the default cache: float32, as the goldens' test
  o.kv.ctx_size = 1024;
  return o;
}

// Mean NLL of the teacher-forced ids; per-position NLLs compared when `per_position_tol` > 0.
double teacher_forced(const Model& m, const Golden& g, double per_position_tol) {
  ThreadPool pool(2);
  Session s(m, f32_opts(), pool);
  std::span<float> logits = s.feed_all(g.tf_ids);
  const int V = m.config().vocab_size;
  double sum = 0;
  for (size_t t = 0; t + 1 < g.tf_ids.size(); ++t) {
    const float* row = logits.data() + t * size_t(V);
    const float mx = *std::max_element(row, row + V);
    double lse = 0;
    for (int i = 0; i < V; ++i) lse += std::exp(double(row[i]) - mx);
    const double nll = std::log(lse) + mx - row[g.tf_ids[t + 1]];
    if (per_position_tol > 0) {
      EXPECT_NEAR(nll, g.tf_nll[t], per_position_tol) << "position " << t;
    }
    sum += nll;
  }
  return sum / double(g.tf_ids.size() - 1);
}

std::vector<int32_t> greedy(const Model& m, std::vector<int32_t> ids, int n) {
  ThreadPool pool(2);
  Session s(m, f32_opts(), pool);
  std::span<float> logits = s.feed(ids);
  std::vector<int32_t> out = ids;
  for (int i = 0; i < n; ++i) {
    const int32_t next = argmax(logits);
    out.push_back(next);
    logits = s.feed({&next, 1});
  }
  return out;
}

void expect_goldens(const Model& m, const fs::path& dir) {
  const Golden g = golden_of(dir);
  EXPECT_NEAR(teacher_forced(m, g, 1e-3), g.mean_nll, 1e-4);
  for (const auto& p : g.prompts) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    const auto want = p["greedy_ids"].get<std::vector<int32_t>>();
    auto got = greedy(m, ids, int(want.size()));
    EXPECT_EQ(std::vector<int32_t>(got.begin() + std::ptrdiff_t(ids.size()), got.end()), want) << p["text"];
  }
}

class GgufWrittenModel : public ::testing::TestWithParam<std::string> {};

// Our writer at F32 (Q/K permuted for llama, llama3 RoPE as rope_freqs, biases for qwen2), read back:
// the transformers goldens, greedy ids identical.
TEST_P(GgufWrittenModel, F32FileGivesTheSafetensorsGoldens) {
  test::TempDir tmp;
  const fs::path dir = test::repo_model(GetParam());
  const fs::path out = tmp.path / (GetParam() + ".gguf");
  const GgufWriteResult r = write_gguf_from_hf(dir, out, GgufMix::F32);
  EXPECT_GT(r.tensors, 10);
  auto m = Model::load(out);
  ASSERT_NE(m->gguf(), nullptr);
  const ModelConfig& c = m->config(), s = ModelConfig::load(dir / "config.json");
  EXPECT_EQ(c.n_layers, s.n_layers);
  EXPECT_EQ(c.n_kv_heads, s.n_kv_heads);
  EXPECT_EQ(c.tie_word_embeddings, s.tie_word_embeddings);
  EXPECT_EQ(c.qkv_bias, s.qkv_bias);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, s.rms_norm_eps);
  auto ref = Model::load(dir);
  for (size_t i = 0; i < ref->kv_shape().rope_inv_freq.size(); ++i)
    EXPECT_NEAR(m->kv_shape().rope_inv_freq[i], ref->kv_shape().rope_inv_freq[i],
                1e-6 * ref->kv_shape().rope_inv_freq[i]);
  expect_goldens(*m, dir);
}

INSTANTIATE_TEST_SUITE_P(Models, GgufWrittenModel,
                         ::testing::Values("kjv-tiny", "qwen2-tiny", "mistral-tiny", "llama-mha-ropescaled-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// llama.cpp's own F32 conversion of kjv-tiny (../shared): the same goldens.
TEST(GgufReference, LlamaCppF32FileGivesTheGoldens) {
  const fs::path f = test::shared_model("gguf") / "kjv-tiny-F32.gguf";
  if (!fs::exists(f)) GTEST_SKIP() << f << " not found (read from ../shared/models/gguf)";
  auto m = Model::load(f);
  expect_goldens(*m, test::repo_model("kjv-tiny"));
}

// Quantized files: near the goldens (not equal): llama.cpp's Q8_0 of kjv-tiny shipped in tests/data,
// and ../shared's files when present.
TEST(GgufReference, QuantizedFilesStayNearTheGoldens) {
  struct Case {
    fs::path file;
    std::string model;
    double tol;
  };
  std::vector<Case> cases = {{test::repo_dir() / "tests/data/gguf/kjv-tiny-Q8_0.gguf", "kjv-tiny", 0.01}};
  const fs::path g = test::shared_model("gguf");
  for (const Case& c : {Case{g / "kjv-tiny-Q4_0.gguf", "kjv-tiny", 0.08},
                        Case{g / "mistral-tiny-Q8_0.gguf", "mistral-tiny", 0.01},
                        Case{g / "llama-mha-ropescaled-tiny-Q8_0.gguf", "llama-mha-ropescaled-tiny", 0.01}})
    if (fs::exists(c.file)) cases.push_back(c);
  for (const Case& c : cases) {
    auto m = Model::load(c.file);
    const Golden gold = golden_of(test::repo_model(c.model));
    const double nll = teacher_forced(*m, gold, 0);
    EXPECT_NEAR(nll, gold.mean_nll, c.tol) << c.file;
    EXPECT_NE(m->config().dtype.find("GGUF"), std::string::npos);
  }
}

// Every mix of the writer on kjv-tiny, read back in place: the types of the mix (kjv-tiny's rows, 128
// and 352 wide, are too narrow for the K-quants: their mixes fall back to 32-value blocks), and the
// goldens' mean NLL within the mix's error.
TEST(GgufModel, WriterQuantizedFileLoadsInPlaceAndStaysNear) {
  test::TempDir tmp;
  const fs::path dir = test::repo_model("kjv-tiny");
  struct Case {
    GgufMix mix;
    GgmlType attn_q, token_embd;
    int fallback;
    double tol;
  };
  for (const Case& c : {Case{GgufMix::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0, 0, 0.01},
                        Case{GgufMix::Q4_0, GgmlType::Q4_0, GgmlType::Q8_0, 1, 0.1},  // embd: Q6_K -> Q8_0
                        Case{GgufMix::F16, GgmlType::F16, GgmlType::F16, 0, 0.003},
                        Case{GgufMix::BF16, GgmlType::BF16, GgmlType::BF16, 0, 0.003},
                        Case{GgufMix::Q4_K_M, GgmlType::Q5_0, GgmlType::Q8_0, 28, 0.05},
                        Case{GgufMix::Q5_K_M, GgmlType::Q5_1, GgmlType::Q8_0, 28, 0.03},
                        Case{GgufMix::Q6_K, GgmlType::Q8_0, GgmlType::Q8_0, 28, 0.01}}) {
    const std::string mix(gguf_mix_name(c.mix));
    const fs::path out = tmp.path / "k.gguf";
    const GgufWriteResult r = write_gguf_from_hf(dir, out, c.mix);
    auto m = Model::load(out);
    const GgufFile& f = *m->gguf();
    EXPECT_EQ(f.find_tensor("blk.0.attn_q.weight")->type, c.attn_q) << mix;
    EXPECT_EQ(f.find_tensor("token_embd.weight")->type, c.token_embd) << mix;
    EXPECT_EQ(f.find_tensor("blk.0.attn_norm.weight")->type, GgmlType::F32) << mix;
    EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied
    EXPECT_EQ(f.get_int("general.file_type", 0, 1000), gguf_mix_file_type(c.mix)) << mix;
    EXPECT_EQ(r.fallback, c.fallback) << mix;
    const Golden gold = golden_of(dir);
    EXPECT_NEAR(teacher_forced(*m, gold, 0), gold.mean_nll, c.tol) << mix;
    EXPECT_LT(m->weight_bytes(), fs::file_size(dir / "model.safetensors"));
  }
}

// llama-quantize's choice, rule by rule (llama.cpp src/llama-quant.cpp, llama_tensor_get_type).
TEST(GgufMix, LlamaQuantizeRules) {
  auto type = [](GgufMix m, GgufRole role, int layer, int n_layers, int64_t cols, bool tied = true,
                 bool b70 = false) { return gguf_mix_tensor_type(m, {role, layer, n_layers, cols, tied, b70}).type; };
  // use_more_bits over 32 layers: 0-3, 28-31 and every third from 6: attn_v and ffn_down Q6_K.
  std::vector<int> more;
  for (int i = 0; i < 32; ++i)
    if (type(GgufMix::Q4_K_M, GgufRole::AttnV, i, 32, 4096) == GgmlType::Q6_K) more.push_back(i);
  EXPECT_EQ(more, (std::vector<int>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}));
  for (int i = 0; i < 32; ++i) {
    const bool m = std::find(more.begin(), more.end(), i) != more.end();
    EXPECT_EQ(type(GgufMix::Q4_K_M, GgufRole::FfnDown, i, 32, 11008), m ? GgmlType::Q6_K : GgmlType::Q4_K) << i;
    EXPECT_EQ(type(GgufMix::Q5_K_M, GgufRole::AttnV, i, 32, 4096), m ? GgmlType::Q6_K : GgmlType::Q5_K) << i;
    EXPECT_EQ(type(GgufMix::Q4_K_M, GgufRole::AttnQ, i, 32, 4096), GgmlType::Q4_K) << i;
    EXPECT_EQ(type(GgufMix::Q4_K_M, GgufRole::FfnUp, i, 32, 4096), GgmlType::Q4_K) << i;
  }
  // The output matrix, and the embeddings when tied to it: Q6_K; untied embeddings: the base type.
  EXPECT_EQ(type(GgufMix::Q4_K_M, GgufRole::Output, 0, 32, 4096, false), GgmlType::Q6_K);
  EXPECT_EQ(type(GgufMix::Q4_K_M, GgufRole::TokenEmbd, 0, 32, 4096, true), GgmlType::Q6_K);
  EXPECT_EQ(type(GgufMix::Q4_K_M, GgufRole::TokenEmbd, 0, 32, 4096, false), GgmlType::Q4_K);
  EXPECT_EQ(type(GgufMix::Q4_0, GgufRole::Output, 0, 32, 4096, false), GgmlType::Q6_K);
  EXPECT_EQ(type(GgufMix::Q4_0, GgufRole::TokenEmbd, 0, 32, 4096, false), GgmlType::Q4_0);
  EXPECT_EQ(type(GgufMix::Q8_0, GgufRole::Output, 0, 32, 4096, false), GgmlType::Q8_0);
  EXPECT_EQ(type(GgufMix::Q6_K, GgufRole::AttnV, 0, 32, 4096), GgmlType::Q6_K);
  // Rows that are not a whole number of super-blocks: Q5_0 / Q5_1 / Q8_0; the output Q8_0; F16
  // where not even 32 divides the row.
  EXPECT_EQ(type(GgufMix::Q4_K_M, GgufRole::FfnDown, 1, 8, 1376), GgmlType::Q5_0);
  EXPECT_EQ(type(GgufMix::Q4_K_M, GgufRole::FfnDown, 0, 8, 1376), GgmlType::Q8_0);
  EXPECT_EQ(type(GgufMix::Q5_K_M, GgufRole::AttnQ, 0, 8, 1376), GgmlType::Q5_1);
  EXPECT_EQ(type(GgufMix::Q4_K_M, GgufRole::Output, 0, 8, 1376, false), GgmlType::Q8_0);
  EXPECT_EQ(type(GgufMix::Q4_K_M, GgufRole::AttnQ, 0, 8, 100), GgmlType::F16);
  EXPECT_EQ(type(GgufMix::Q4_0, GgufRole::AttnQ, 0, 8, 100), GgmlType::F16);
  EXPECT_TRUE(gguf_mix_tensor_type(GgufMix::Q4_K_M, {GgufRole::AttnQ, 0, 8, 1376, true, false}).fell_back);
  EXPECT_FALSE(gguf_mix_tensor_type(GgufMix::Q4_K_M, {GgufRole::AttnQ, 0, 8, 1024, true, false}).fell_back);
  // Llama 70B (80 layers, GQA): attn_v of the layers without more bits Q5_K.
  EXPECT_EQ(type(GgufMix::Q4_K_M, GgufRole::AttnV, 11, 80, 8192, true, true), GgmlType::Q5_K);
  EXPECT_EQ(type(GgufMix::Q4_K_M, GgufRole::AttnV, 0, 80, 8192, true, true), GgmlType::Q6_K);
  // Float mixes: every matrix in the type.
  EXPECT_EQ(type(GgufMix::BF16, GgufRole::Output, 0, 8, 100), GgmlType::BF16);
  EXPECT_EQ(gguf_mix_file_type(GgufMix::Q4_K_M), 15u);
  EXPECT_EQ(gguf_mix_file_type(GgufMix::Q5_K_M), 17u);
  EXPECT_EQ(gguf_mix_file_type(GgufMix::Q6_K), 18u);
  EXPECT_EQ(parse_gguf_mix("Q4_K_M"), GgufMix::Q4_K_M);
  EXPECT_THROW(parse_gguf_mix("Q4_K"), UsageError);
}

std::string sha256_of(const uint8_t* p, size_t n) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(p, n, md, &len, EVP_sha256(), nullptr) != 1) throw Error("SHA-256 failed");
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < len; ++i) s += hex[md[i] >> 4], s += hex[md[i] & 15];
  return s;
}

// Our writer's files of `model_dir` against a manifest of llama-quantize's (mix -> tensor -> type,
// dims, SHA-256 of the data; scripts/gguf_tensor_manifest.py): the same tensors, types and bytes.
void expect_manifest(const fs::path& model_dir, const fs::path& manifest, size_t mixes) {
  test::TempDir tmp;
  const nlohmann::json want = test::read_json(manifest);
  ASSERT_EQ(want.size(), mixes);
  for (const auto& [mix_name, tensors] : want.items()) {
    const fs::path out = tmp.path / (mix_name + ".gguf");
    write_gguf_from_hf(model_dir, out, parse_gguf_mix(mix_name));
    const GgufFile f = GgufFile::open(out);
    EXPECT_EQ(f.tensors().size(), tensors.size()) << mix_name;
    for (const auto& [name, w] : tensors.items()) {
      const GgufTensor* t = f.find_tensor(name);
      ASSERT_NE(t, nullptr) << mix_name << " " << name;
      EXPECT_EQ(ggml_type_info(t->type).name, w["type"].get<std::string>()) << mix_name << " " << name;
      EXPECT_EQ(t->dims, w["dims"].get<std::vector<uint64_t>>()) << mix_name << " " << name;
      EXPECT_EQ(sha256_of(t->data, size_t(t->nbytes)), w["sha256"].get<std::string>()) << mix_name << " " << name;
    }
  }
}

// kjv-tiny, every mix (tests/data/gguf/llama-quantize-kjv-tiny.json: llama-quantize's Q4_K_M,
// Q5_K_M, Q6_K, Q4_0 and Q8_0 of llama.cpp's F32 conversion).
TEST(GgufWriter, EveryMixGivesLlamaQuantizesTensorsOnKjvTiny) {
  expect_manifest(test::repo_model("kjv-tiny"), test::repo_dir() / "tests/data/gguf/llama-quantize-kjv-tiny.json", 5);
}

// kjv-small (../shared), Q5_K_M and Q6_K: real Q5_K and Q6_K blocks (tests/data/gguf/
// llama-quantize-kjv-small.json: llama-quantize of our F32 file of kjv-small, whose values are the
// checkpoint's bf16 ones widened exactly, as the converter's bf16 file holds them). Q4_K_M is the
// next test, against ../shared's file itself.
TEST(GgufWriter, Q5_K_MAndQ6_KGiveLlamaQuantizesTensorsOnKjvSmall) {
  const fs::path dir = test::shared_model("kjv-small");
  if (!fs::exists(dir / "model.safetensors")) GTEST_SKIP() << dir << " not found (../shared)";
  expect_manifest(dir, test::repo_dir() / "tests/data/gguf/llama-quantize-kjv-small.json", 2);
}

// The untied models (output.weight beside token_embd; llama-mha-ropescaled-tiny with rope_freqs):
// our Q4_K_M has the tensor types llama-quantize chose for them (tests/data/gguf/
// llama-quantize-Q4_K_M-types.json: `llama-quantize --allow-requantize` of ../shared's Q8_0 files,
// types and shapes only, the bytes being those of a requantization).
TEST(GgufWriter, UntiedModelsGetLlamaQuantizesTypes) {
  test::TempDir tmp;
  const nlohmann::json want = test::read_json(test::repo_dir() / "tests/data/gguf/llama-quantize-Q4_K_M-types.json");
  ASSERT_EQ(want.size(), 2u);
  for (const auto& [model, tensors] : want.items()) {
    const fs::path out = tmp.path / (model + ".gguf");
    write_gguf_from_hf(test::repo_model(model), out, GgufMix::Q4_K_M);
    const GgufFile f = GgufFile::open(out);
    EXPECT_EQ(f.tensors().size(), tensors.size()) << model;
    ASSERT_TRUE(tensors.contains("output.weight")) << model;
    for (const auto& [name, w] : tensors.items()) {
      const GgufTensor* t = f.find_tensor(name);
      ASSERT_NE(t, nullptr) << model << " " << name;
      EXPECT_EQ(ggml_type_info(t->type).name, w["type"].get<std::string>()) << model << " " << name;
      EXPECT_EQ(t->dims, w["dims"].get<std::vector<uint64_t>>()) << model << " " << name;
    }
  }
}

// kjv-small (512-wide rows: Q4_K and Q6_K blocks) as Q4_K_M against llama.cpp's own Q4_K_M of it
// (../shared: convert_hf_to_gguf.py --outtype bf16, then llama-quantize): every tensor of the same
// type and shape and byte for byte the same, and both files give the goldens' NLL alike.
TEST(GgufWriter, KjvSmallQ4_K_MIsLlamaQuantizesFile) {
  const fs::path ref_path = test::shared_model("gguf") / "kjv-small-Q4_K_M.gguf";
  const fs::path dir = test::shared_model("kjv-small");
  if (!fs::exists(ref_path) || !fs::exists(dir / "model.safetensors"))
    GTEST_SKIP() << ref_path << " or " << dir << " not found (../shared)";
  test::TempDir tmp;
  const fs::path out = tmp.path / "kjv-small-Q4_K_M.gguf";
  const GgufWriteResult r = write_gguf_from_hf(dir, out, GgufMix::Q4_K_M);
  EXPECT_EQ(r.by_type.at("Q4_K"), 8 * 6 - 4);  // q, k, output, gate, up of 8 layers; v of 4
  EXPECT_EQ(r.by_type.at("Q6_K"), 4 + 1);     // v of layers 0, 3, 6, 7; the tied embeddings
  const GgufFile ref = GgufFile::open(ref_path), ours = GgufFile::open(out);
  ASSERT_EQ(ours.tensors().size(), ref.tensors().size());
  int same_bytes = 0;
  for (const GgufTensor& t : ref.tensors()) {
    const GgufTensor* o = ours.find_tensor(t.name);
    ASSERT_NE(o, nullptr) << t.name;
    EXPECT_EQ(ggml_type_info(o->type).name, ggml_type_info(t.type).name) << t.name;
    EXPECT_EQ(o->dims, t.dims) << t.name;
    if (o->type == t.type && o->nbytes == t.nbytes && std::memcmp(o->data, t.data, size_t(t.nbytes)) == 0)
      ++same_bytes;
    else
      ADD_FAILURE() << t.name << ": bytes differ from llama-quantize's";
  }
  EXPECT_EQ(same_bytes, int(ref.tensors().size()));
  const Golden gold = golden_of(dir);
  const double nll_ours = teacher_forced(*Model::load(out), gold, 0);
  const double nll_ref = teacher_forced(*Model::load(ref_path), gold, 0);
  EXPECT_NEAR(nll_ours, nll_ref, 1e-6);
  EXPECT_NEAR(nll_ours, gold.mean_nll, 0.03);
}

TEST(GgufModel, UnsupportedArchitectureAndBadShapesAreErrors) {
  test::TempDir tmp;
  auto model_file = [&](const std::function<void(GgufBuilder&)>& edit) {
    GgufBuilder b;
    b.add_string("general.architecture", "llama");
    b.add_u32("llama.block_count", 1);
    b.add_u32("llama.embedding_length", 64);
    b.add_u32("llama.feed_forward_length", 64);
    b.add_u32("llama.attention.head_count", 2);
    edit(b);
    b.write(tmp.path / "m.gguf");
    return error_of([&] { Model::load(tmp.path / "m.gguf"); });
  };
  GgufBuilder gpt;
  gpt.add_string("general.architecture", "gpt2");
  gpt.write(tmp.path / "m.gguf");
  EXPECT_NE(error_of([&] { Model::load(tmp.path / "m.gguf"); })
                 .find("m.gguf: metadata 'general.architecture': unsupported architecture 'gpt2' (supported: llama, "
                       "qwen2, qwen3, qwen3moe, gemma3, phi3, smollm3)"),
            std::string::npos);
  EXPECT_NE(model_file([](GgufBuilder&) {}).find("tensor 'token_embd.weight' is missing"), std::string::npos);
  EXPECT_NE(model_file([](GgufBuilder& b) {
              b.add_tensor("token_embd.weight", {32, 10}, GgmlType::F32, [](uint8_t* o) { std::memset(o, 0, 1280); });
            }).find("tensor 'token_embd.weight' has dims [32, 10], expected [64, n_vocab] "
                    "([llama.embedding_length, tokens])"),
            std::string::npos);
  // Swapped dims are named as such, not as a vocabulary of 64 tokens.
  EXPECT_NE(model_file([](GgufBuilder& b) {
              b.add_tensor("token_embd.weight", {10, 64}, GgmlType::F32, [](uint8_t* o) { std::memset(o, 0, 2560); });
            }).find("tensor 'token_embd.weight' has dims [10, 64], expected [64, n_vocab] "
                    "([llama.embedding_length, tokens]): its two dims are swapped"),
            std::string::npos);
  EXPECT_NE(model_file([](GgufBuilder& b) { b.add_u32("llama.attention.head_count_kv", 3); })
                .find("metadata 'llama.attention.head_count_kv': (3) must divide"),
            std::string::npos);
  EXPECT_NE(model_file([](GgufBuilder& b) { b.add_string("llama.rope.scaling.type", "yarn"); })
                .find("metadata 'llama.rope.scaling.type': 'yarn' is not supported"),
            std::string::npos);
  // A block type the kernels do not read (Q8_1, ggml's activation type) is named at load, not at
  // the first matmul.
  EXPECT_NE(model_file([](GgufBuilder& b) {
              b.add_tensor("token_embd.weight", {64, 10}, GgmlType::Q8_1,
                           [](uint8_t* o) { std::memset(o, 0, 36 * 20); });
            }).find("tensor 'token_embd.weight' has type Q8_1, which this build's kernels do not read"),
            std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// The embedded tokenizer

std::vector<std::string> varied_texts() {
  std::vector<std::string> t = {
      "In the beginning God created the heaven and the earth.",
      "  leading spaces, trailing  \n\n\ttabs\tand\r\nCRLF  ",
      "Numbers 1234567 and 3.14159, dates 2024-07-01; it's we'll they'd I'M",
      "Unicode: caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 emoji, \xce\xb1\xce\xb2\xce\xb3",
      "<s>special</s> in text <pad> and </s>",
      "",
      "a",
      "!!!???...---___",
  };
  const fs::path corpus = test::shared_dir() / "corpus" / "val.txt";
  if (fs::exists(corpus)) {
    const std::string all = read_whole_file(corpus, uint64_t(1) << 30, "val.txt");
    for (size_t k = 0; k < 6; ++k) t.push_back(all.substr(k * 7919 % (all.size() - 3000), 3000));
  }
  return t;
}

void expect_same_ids(const Tokenizer& a, const Tokenizer& b, const std::vector<std::string>& texts, const std::string& what) {
  for (const std::string& s : texts) {
    for (bool special : {true, false}) {
      EncodeOptions o;
      o.add_special = special;
      o.parse_special = special;
      const auto ia = a.encode(s, o);
      ASSERT_EQ(ia, b.encode(s, o)) << what << ": '" << s.substr(0, 80) << "' add_special " << special;
      EXPECT_EQ(a.decode(ia), b.decode(ia)) << what;
    }
  }
  EXPECT_EQ(a.vocab_size(), b.vocab_size()) << what;
  // A fixture without tokenizer_config.json names no BOS/EOS; the GGUF form names the template's.
  if (b.bos_id()) {
    EXPECT_EQ(a.bos_id(), b.bos_id()) << what;
  }
  if (b.eos_id()) {
    EXPECT_EQ(a.eos_id(), b.eos_id()) << what;
  }
}

// Writes a tokenizer.json as a GGUF file's vocabulary keys (our writer's), reads the file back.
Tokenizer through_gguf_file(const fs::path& tokenizer_json, const fs::path& tmp) {
  const nlohmann::json tok = test::read_json(tokenizer_json);
  const fs::path cfg_path = tokenizer_json.parent_path() / "tokenizer_config.json";
  const nlohmann::json cfg = tokenizer_json.filename() == "tokenizer.json" && fs::exists(cfg_path)
                                 ? test::read_json(cfg_path)
                                 : nlohmann::json::object();
  const GgufVocab v = gguf_vocab_from_tokenizer_json(tok, cfg, tokenizer_json.string());
  GgufBuilder b;
  b.add_string("general.architecture", "llama");
  b.add_string("tokenizer.ggml.model", v.model);
  if (!v.pre.empty()) b.add_string("tokenizer.ggml.pre", v.pre);
  b.add_strings("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) b.add_f32s("tokenizer.ggml.scores", v.scores);
  b.add_i32s("tokenizer.ggml.token_type", v.types);
  if (!v.merges.empty()) b.add_strings("tokenizer.ggml.merges", v.merges);
  if (v.bos) b.add_u32("tokenizer.ggml.bos_token_id", uint32_t(*v.bos));
  if (v.eos) b.add_u32("tokenizer.ggml.eos_token_id", uint32_t(*v.eos));
  if (v.unk) b.add_u32("tokenizer.ggml.unknown_token_id", uint32_t(*v.unk));
  if (v.add_bos) b.add_bool("tokenizer.ggml.add_bos_token", *v.add_bos);
  if (v.add_space_prefix) b.add_bool("tokenizer.ggml.add_space_prefix", *v.add_space_prefix);
  const fs::path out = tmp / (tokenizer_json.stem().string() + ".gguf");
  b.write(out);
  return load_tokenizer(out);
}

// The reference files' vocabularies (llama.cpp's converter wrote them): the tokenizer.json ids.
TEST(GgufTokenizer, ReferenceFilesMatchTokenizerJson) {
  const Tokenizer json_tok = Tokenizer::load(test::repo_model("kjv-tiny"));
  const auto texts = varied_texts();
  expect_same_ids(load_tokenizer(test::repo_dir() / "tests/data/gguf/kjv-tiny-Q8_0.gguf"), json_tok, texts,
                  "kjv-tiny-Q8_0.gguf");
  const fs::path g = test::shared_model("gguf");
  if (!fs::exists(g)) GTEST_SKIP() << g << " not found: the shipped file alone was checked";
  for (const auto& e : fs::directory_iterator(g))
    if (e.path().extension() == ".gguf") expect_same_ids(load_tokenizer(e.path()), json_tok, texts, e.path().string());
}

// Real tokenizer layouts of other families, through our writer's keys and back: tokenizer.json's
// ids, and HF tokenizers' own ids (cases.json).
TEST(GgufTokenizer, OtherFamiliesRoundTripThroughGguf) {
  test::TempDir tmp;
  const fs::path data = test::repo_dir() / "tests/data/tokenizers";
  const auto cases = test::read_json(data / "cases.json")["cases"];
  std::vector<std::string> texts = varied_texts();
  for (const auto& c : cases) texts.push_back(c["text"].get<std::string>());
  for (const char* name : {"llama3_style.json", "qwen_style.json", "smollm_style.json", "sentencepiece_bpe.json"}) {
    const Tokenizer mine = through_gguf_file(data / name, tmp.path);
    const Tokenizer ref = Tokenizer::load(data / name);
    expect_same_ids(mine, ref, texts, name);
    int checked = 0;
    for (const auto& c : cases) {
      if (c["tokenizer"] != name) continue;
      EXPECT_EQ(mine.encode(c["text"].get<std::string>()), c["ids"].get<std::vector<int32_t>>()) << name << c["text"];
      ++checked;
    }
    EXPECT_GT(checked, 0) << name;
  }
  for (const std::string m : {"kjv-tiny", "qwen2-tiny"})
    expect_same_ids(through_gguf_file(test::repo_model(m) / "tokenizer.json", tmp.path),
                    Tokenizer::load(test::repo_model(m)), texts, m);
}

TEST(GgufTokenizer, PreTokenizerNamesMapAndUnknownOnesAreErrors) {
  GgufVocab v;
  v.source = "v.gguf";
  v.model = "gpt2";
  v.tokens = {"a", "b", "ab"};
  v.merges = {"a b"};
  for (const std::string& pre : gguf_pre_tokenizer_names()) {
    v.pre = pre;
    const Tokenizer t = tokenizer_from_gguf_vocab(v);
    EXPECT_EQ(t.encode("ab", {false, false}), std::vector<int32_t>({2})) << pre;
  }
  v.pre = "falcon";
  EXPECT_NE(error_of([&] { tokenizer_from_gguf_vocab(v); }).find("v.gguf: metadata 'tokenizer.ggml.pre': 'falcon' is not supported"),
            std::string::npos);
  v.pre = "gpt-2";
  v.model = "bert";
  EXPECT_NE(error_of([&] { tokenizer_from_gguf_vocab(v); }).find("'tokenizer.ggml.model': 'bert' is not supported"),
            std::string::npos);
  v.model = "gpt2";
  v.bos = 7;
  EXPECT_NE(error_of([&] { tokenizer_from_gguf_vocab(v); }).find("'tokenizer.ggml.bos_token_id': 7 is not a token id"),
            std::string::npos);
  v.bos.reset();
  v.types = {1, 1};
  EXPECT_NE(error_of([&] { tokenizer_from_gguf_vocab(v); }).find("2 entries for 3 tokens"), std::string::npos);
}

TEST(GgufTokenizer, ChatTemplateAndSpecialTokensComeFromTheFile) {
  test::TempDir tmp;
  const fs::path dir = tmp.path / "m";
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"})
    fs::copy_file(test::repo_model("kjv-tiny") / f, dir / f);
  nlohmann::json cfg = test::read_json(test::repo_model("kjv-tiny") / "tokenizer_config.json");
  cfg["chat_template"] = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}";
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
  write_gguf_from_hf(dir, tmp.path / "c.gguf", GgufMix::Q8_0);
  const GgufFile f = GgufFile::open(tmp.path / "c.gguf");
  EXPECT_EQ(f.get_string("tokenizer.chat_template"), cfg["chat_template"].get<std::string>());
  const GgufTokenizerJson j = gguf_vocab_to_json(gguf_vocab(f));
  EXPECT_EQ(j.config["bos_token"], "<s>");
  EXPECT_EQ(j.config["eos_token"], "</s>");
  EXPECT_EQ(j.config["chat_template"], cfg["chat_template"]);
}

// ---------------------------------------------------------------------------------------------
// The prompt cache's key covers the file

TEST(GgufPromptCache, KeyCoversTheFile) {
  test::TempDir tmp;
  const fs::path a = tmp.path / "a.gguf", b = tmp.path / "b.gguf";
  write_gguf_from_hf(test::repo_model("kjv-tiny"), a, GgufMix::Q8_0);
  write_gguf_from_hf(test::repo_model("kjv-tiny"), b, GgufMix::Q4_0);
  KVCacheConfig kv;
  auto key = [&](const fs::path& p) {
    auto m = Model::load(p);
    const Tokenizer t = load_tokenizer(p);
    return prompt_cache_identity(*m, t, kv);
  };
  const PromptCacheIdentity ia = key(a), ib = key(b);
  EXPECT_EQ(ia.model_name, "a.gguf");
  EXPECT_NE(ia.config_key, ib.config_key);
  EXPECT_EQ(key(a).config_key, ia.config_key);
  // Rewritten (same bytes, a new mtime): another key.
  fs::last_write_time(a, fs::last_write_time(a) + std::chrono::seconds(5));
  EXPECT_NE(key(a).config_key, ia.config_key);
  auto dir_model = Model::load(test::repo_model("kjv-tiny"));
  EXPECT_NE(prompt_cache_identity(*dir_model, Tokenizer::load(test::repo_model("kjv-tiny")), kv).config_key,
            ia.config_key);
}

}  // namespace
}  // namespace ptllm

namespace ptllm {
namespace {

// A quantized file loaded with its Q4_0, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K matrices repacked (kernels/ggml.h,
// ggml_pack) and in the file's layout answers alike: the integer sums are the same, only the float
// order of adding blocks differs (Q4_K, Q5_K, Q6_K; Q8_0 against the file's one-row kernels, which the
// logits of the last token take; packed Q4_0 and Q8_0 keep the panels' order, bit for bit: the
// GgmlPack tests). The activations
// are rounded to int8 per block, so a float difference can flip a code and moves the logits further
// than float noise; the yardstick is another float order of the same layout (the AVX2 kernels against
// the AVX-512 ones; on a CPU without AVX-512 the portable kernels against AVX2) or, given the F32
// source, the quantization's own error (the plain layout against it), whichever is larger; a wrong
// row would be far outside it, and the packed layout is no further from the source.
// The file loaded with packing on and off, and a prompt of 40 random ids.
struct PackedAndPlain {
  std::unique_ptr<Model> packed, plain;
  std::vector<int32_t> prompt;
  PackedAndPlain(const fs::path& path, unsigned seed) : packed(Model::load(path)) {
    set_ggml_pack_enabled(false);
    plain = Model::load(path);
    set_ggml_pack_enabled(true);
    EXPECT_GT(packed->ggml_packed_matrices(), 0u);
    EXPECT_EQ(plain->ggml_packed_matrices(), 0u);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> id(3, packed->config().vocab_size - 1);
    prompt.resize(40);
    for (auto& t : prompt) t = id(rng);
  }
};

void expect_packed_answers_alike(const fs::path& path, const fs::path& source = {}) {
  ThreadPool pool(2);
  PackedAndPlain m(path, 5);
  const auto& packed = m.packed;
  const auto& plain = m.plain;
  std::vector<int32_t> prompt = m.prompt;
  const SimdTarget saved = active_simd_target();
  Session a(*packed, f32_opts(), pool), b(*plain, f32_opts(), pool), c(*plain, f32_opts(), pool);
  const auto worst = [](std::span<const float> x, std::span<const float> y) {
    double w = 0;
    for (size_t v = 0; v < x.size(); ++v) w = std::max(w, double(std::fabs(x[v] - y[v])));
    return w;
  };
  const auto f32 = source.empty() ? nullptr : Model::load(source);
  std::optional<Session> d;
  if (f32) d.emplace(*f32, f32_opts(), pool);
  double packed_worst = 0, other_worst = 0, packed_err = 0, plain_err = 0;
  const SimdTarget other = saved == SimdTarget::AVX2 ? SimdTarget::Portable : SimdTarget::AVX2;
  for (int step = 0; step < 12; ++step) {
    const auto sa = a.feed(prompt);
    std::vector<float> la(sa.begin(), sa.end());
    const auto sb = b.feed(prompt);
    std::vector<float> lb(sb.begin(), sb.end());
    set_simd_target(other);
    const auto sc = c.feed(prompt);
    set_simd_target(saved);
    packed_worst = std::max(packed_worst, worst(la, lb));
    other_worst = std::max(other_worst, worst(sc, lb));
    if (d) {
      const auto sd = d->feed(prompt);
      packed_err = std::max(packed_err, worst(la, sd));
      plain_err = std::max(plain_err, worst(lb, sd));
    }
    prompt.assign(1, int32_t(std::max_element(lb.begin(), lb.end()) - lb.begin()));  // all three follow one path
  }
  std::printf("%s: logits packed vs plain %.3g, %s vs plain %.3g, plain vs F32 %.3g, packed vs F32 %.3g\n",
              path.filename().c_str(), packed_worst, std::string(simd_target_name(other)).c_str(), other_worst, plain_err,
              packed_err);
  EXPECT_GT(packed_worst, 0.0) << "the same bits: were both layouts used?";
  EXPECT_GT(other_worst, 0.0) << "the same bits under " << simd_target_name(other) << ": was another kernel used?";
  EXPECT_LT(packed_worst, std::max(2 * other_worst + 1e-3, plain_err))
      << "another float order moved the logits by " << other_worst << ", the quantization by " << plain_err;
  if (d) {
    EXPECT_LT(packed_err, 1.25 * plain_err) << "the packed layout is further from the F32 source";
  }
}

TEST(GgufPackedModel, Q4_K_MAnswersAsTheFilesLayout) {
  const fs::path path = test::shared_model("gguf") / "kjv-small-Q4_K_M.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << "no " << path;
  if (!ggml_pack_wanted(GgmlType::Q4_K)) GTEST_SKIP() << "this CPU's kernels read Q4_K in the file's layout";
  expect_packed_answers_alike(path);
}

// kjv-small written as Q5_K_M: Q5_K where its rows hold whole super-blocks (512 columns), Q6_K and
// the fallbacks of 1376-wide rows beside it.
void expect_q5_k_m_answers_alike(const fs::path& source) {
  test::TempDir tmp;
  const fs::path out = tmp.path / "kjv-small-Q5_K_M.gguf";
  const GgufWriteResult r = write_gguf_from_hf(source, out, GgufMix::Q5_K_M);
  EXPECT_GT(r.by_type.count("Q5_K") ? r.by_type.at("Q5_K") : 0, 0);
  expect_packed_answers_alike(out, source);
}

TEST(GgufPackedModel, Q5_K_MAnswersAsTheFilesLayout) {
  const fs::path source = test::shared_model("kjv-small");
  if (!fs::exists(source / "model.safetensors")) GTEST_SKIP() << "no " << source;
  if (!ggml_pack_wanted(GgmlType::Q5_K)) GTEST_SKIP() << "this CPU's kernels read Q5_K in the file's layout";
  expect_q5_k_m_answers_alike(source);
}

// kjv-tiny written as Q4_0, as Q8_0, as Q4_K_M and as Q5_K_M (whose rows of 128 values take Q5_0 and
// Q5_1, as llama-quantize falls back below a K-quant block): the attention, gate and up matrices and
// the output (Q8_0 in all four) are packed, the down projection (352 columns, not whole 64-value
// units) stays in the file's layout.
void expect_small_mixes_answer_alike() {
  for (GgufMix mix : {GgufMix::Q4_0, GgufMix::Q8_0, GgufMix::Q4_K_M, GgufMix::Q5_K_M}) {
    SCOPED_TRACE(std::string(gguf_mix_name(mix)));
    test::TempDir tmp;
    const fs::path out = tmp.path / "kjv-tiny.gguf";
    write_gguf_from_hf(test::repo_model("kjv-tiny"), out, mix);
    expect_packed_answers_alike(out, test::repo_model("kjv-tiny"));
  }
}

TEST(GgufPackedModel, KjvTinyMixesAnswerAsTheFilesLayout) {
  if (!ggml_pack_wanted(GgmlType::Q8_0)) GTEST_SKIP() << "this CPU's kernels read Q8_0 in the file's layout";
  expect_small_mixes_answer_alike();
}

// The same under the AVX2 kernels (on any x86 CPU): there every packed type is read by halves of
// 8 rows (Q4_0 as the file layout's 8-row panels: the same bits, the GgmlPack tests), kjv-small's
// Q4_K_M (Q4_K and Q6_K) and Q5_K_M too where ../shared has them.
TEST(GgufPackedModel, UnderAvx2AnswerAsTheFilesLayout) {
  const auto targets = available_simd_targets();
  if (std::find(targets.begin(), targets.end(), SimdTarget::AVX2) == targets.end()) GTEST_SKIP() << "no AVX2";
  const SimdTarget saved = active_simd_target();
  set_simd_target(SimdTarget::AVX2);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
    EXPECT_TRUE(ggml_pack_wanted(t)) << ggml_type_info(t).name;
  expect_small_mixes_answer_alike();
  const fs::path q4_k_m = test::shared_model("gguf") / "kjv-small-Q4_K_M.gguf";
  if (fs::exists(q4_k_m)) expect_packed_answers_alike(q4_k_m);
  const fs::path small = test::shared_model("kjv-small");
  if (fs::exists(small / "model.safetensors")) expect_q5_k_m_answers_alike(small);
  set_simd_target(saved);
}

}  // namespace
}  // namespace ptllm
