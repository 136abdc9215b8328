// GPTQ (model/gptq.h): the factor of H^-1, the solve against a plain reference written here (no lazy
// blocks, its own inverse), its output error against RTN's and Search's, dead inputs, the
// calibration windows, a kjv-tiny checkpoint written with --method gptq, the mixed recipes and
// --embedding-bits, and the CLI's errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/session.h"
#include "kernels/ops.h"
#include "kv/kv_cache.h"
#include "model/affine_fit.h"
#include "model/gptq.h"
#include "model/model.h"
#include "model/quantize.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Inputs with the structure that makes GPTQ pay: column scales spread over two orders of magnitude
// and correlated columns (x = z A, A random). Returns H = X^T X, [n][n].
std::vector<double> make_hessian(int n, int samples, uint64_t seed, int dead_col = -1) {
  std::mt19937 rng{static_cast<uint32_t>(seed)};
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> a(size_t(n) * size_t(n));
  for (auto& v : a) v = nd(rng) / std::sqrt(float(n));
  for (int i = 0; i < n; ++i) a[size_t(i) * size_t(n) + size_t(i)] += 1.f;
  std::vector<float> scale(static_cast<size_t>(n));
  for (auto& s : scale) s = std::exp(2.3f * nd(rng));
  std::vector<double> h(size_t(n) * size_t(n), 0.0);
  std::vector<float> z(static_cast<size_t>(n)), x(static_cast<size_t>(n));
  for (int t = 0; t < samples; ++t) {
    for (auto& v : z) v = nd(rng);
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int k = 0; k < n; ++k) s += double(z[size_t(k)]) * a[size_t(k) * size_t(n) + size_t(j)];
      x[size_t(j)] = j == dead_col ? 0.f : float(s) * scale[size_t(j)];
    }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) h[size_t(i) * size_t(n) + size_t(j)] += double(x[size_t(i)]) * x[size_t(j)];
  }
  return h;
}

std::vector<float> make_weights(int rows, int cols, uint64_t seed) {
  std::mt19937 rng{static_cast<uint32_t>(seed)};
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::vector<float> w(size_t(rows) * size_t(cols));
  for (auto& v : w) v = nd(rng);
  return w;
}

// The values the runtime reads from codes, scales and biases [rows][cols].
std::vector<float> dequantize(const std::vector<uint32_t>& codes, const std::vector<float>& scales,
                              const std::vector<float>& biases, const AffineSpec& s, int rows, int cols) {
  const WeightMatrix m = affine_matrix(codes.data(), scales.data(), biases.data(), DType::F32, s.bits, s.group_size,
                                       rows, cols);
  std::vector<float> out(size_t(rows) * size_t(cols));
  for (int r = 0; r < rows; ++r) weight_row(m, r, out.data() + size_t(r) * size_t(cols));
  return out;
}

struct Solved {
  std::vector<uint32_t> codes;
  std::vector<float> scales, biases, q;  // q: the dequantized matrix
};

Solved solve_gptq(std::vector<float> w, int rows, int cols, const std::vector<double>& h, const AffineSpec& s,
                  ThreadPool& pool, int block = 128, bool act_order = false) {
  const GptqFactor f = gptq_factor(h, cols, 0.01, "test", pool, act_order);
  Solved out;
  out.codes.resize(size_t(rows) * size_t(cols) * size_t(s.bits) / 32);
  out.scales.resize(size_t(rows) * size_t(cols / s.group_size));
  out.biases.resize(out.scales.size());
  gptq_quantize_rows(w.data(), rows, cols, f, s, QuantMethod::Search, DType::F32, out.codes.data(), out.scales.data(),
                     out.biases.data(), pool, block);
  out.q = dequantize(out.codes, out.scales, out.biases, s, rows, cols);
  return out;
}

Solved solve_rows(const std::vector<float>& w, int rows, int cols, const AffineSpec& s, QuantMethod m) {
  Solved out;
  out.codes.resize(size_t(rows) * size_t(cols) * size_t(s.bits) / 32);
  out.scales.resize(size_t(rows) * size_t(cols / s.group_size));
  out.biases.resize(out.scales.size());
  affine_quantize_rows(w.data(), rows, cols, s, m, DType::F32, out.codes.data(), out.scales.data(), out.biases.data());
  out.q = dequantize(out.codes, out.scales, out.biases, s, rows, cols);
  return out;
}

// The paper's Algorithm 1 without the lazy batches, from scratch: dead inputs, dampening, H^-1 by
// Gauss-Jordan elimination, its upper Cholesky factor, then every column's error applied at once to
// all later columns. Returns the codes [rows][cols] and the dequantized matrix.
// act_order: the columns by decreasing H_ii (stable), each group's fit made first on the weights as
// given.
std::vector<float> reference_gptq(std::vector<float> w, int rows, int cols, std::vector<double> h,
                                  const AffineSpec& s, std::vector<uint8_t>* codes_out, bool act_order = false) {
  const size_t n = size_t(cols);
  double mean = 0;
  for (size_t i = 0; i < n; ++i) {
    if (h[i * n + i] == 0) {
      h[i * n + i] = 1;
      for (int r = 0; r < rows; ++r) w[size_t(r) * n + i] = 0;
    }
    mean += h[i * n + i];
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::vector<AffineGroupFit> fits(size_t(rows) * (n / size_t(s.group_size)));
  if (act_order) {
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return h[x * n + x] > h[y * n + y]; });
    for (size_t r = 0; r < size_t(rows); ++r)
      for (size_t k = 0; k < n / size_t(s.group_size); ++k)
        fits[r * (n / size_t(s.group_size)) + k] =
            affine_fit_group(w.data() + r * n + k * size_t(s.group_size), s.group_size, s.bits, QuantMethod::Search,
                             DType::F32);
    std::vector<double> hp(n * n);
    std::vector<float> wp(w.size());
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) hp[i * n + j] = h[order[i] * n + order[j]];
      for (size_t r = 0; r < size_t(rows); ++r) wp[r * n + i] = w[r * n + order[i]];
    }
    h = hp;
    w = wp;
  }
  const double damp = 0.01 * mean / double(n);
  for (size_t i = 0; i < n; ++i) h[i * n + i] += damp;
  // [h | I] -> [I | h^-1]
  std::vector<double> a(n * 2 * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) a[i * 2 * n + j] = h[i * n + j];
    a[i * 2 * n + n + i] = 1;
  }
  for (size_t c = 0; c < n; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::fabs(a[r * 2 * n + c]) > std::fabs(a[p * 2 * n + c])) p = r;
    for (size_t j = 0; j < 2 * n; ++j) std::swap(a[c * 2 * n + j], a[p * 2 * n + j]);
    const double d = a[c * 2 * n + c];
    for (size_t j = 0; j < 2 * n; ++j) a[c * 2 * n + j] /= d;
    for (size_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double m = a[r * 2 * n + c];
      for (size_t j = 0; j < 2 * n; ++j) a[r * 2 * n + j] -= m * a[c * 2 * n + j];
    }
  }
  // Upper Cholesky of h^-1: hinv = U^T U.
  std::vector<double> u(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    double d = a[i * 2 * n + n + i];
    for (size_t k = 0; k < i; ++k) d -= u[k * n + i] * u[k * n + i];
    u[i * n + i] = std::sqrt(d);
    for (size_t j = i + 1; j < n; ++j) {
      double v = a[i * 2 * n + n + j];
      for (size_t k = 0; k < i; ++k) v -= u[k * n + i] * u[k * n + j];
      u[i * n + j] = v / u[i * n + i];
    }
  }
  const int nmax = (1 << s.bits) - 1;
  std::vector<float> q(w.size());
  codes_out->assign(w.size(), 0);
  for (int r = 0; r < rows; ++r) {
    float* wr = w.data() + size_t(r) * n;
    AffineGroupFit g;
    for (size_t i = 0; i < n; ++i) {
      if (act_order)
        g = fits[size_t(r) * (n / size_t(s.group_size)) + order[i] / size_t(s.group_size)];
      else if (i % size_t(s.group_size) == 0)
        g = affine_fit_group(wr + i, s.group_size, s.bits, QuantMethod::Search, DType::F32);
      const uint8_t c = affine_code(wr[i], g.scale, g.bias, nmax);
      (*codes_out)[size_t(r) * n + order[i]] = c;
      const float qi = g.scale * float(c) + g.bias;
      q[size_t(r) * n + order[i]] = qi;
      const double e = (double(wr[i]) - double(qi)) / u[i * n + i];
      for (size_t j = i + 1; j < n; ++j) wr[j] = float(double(wr[j]) - e * u[i * n + j]);
    }
  }
  return q;
}

std::vector<uint8_t> unpack(const std::vector<uint32_t>& codes, int rows, int cols, int bits) {
  std::vector<uint8_t> out(size_t(rows) * size_t(cols));
  const size_t words = size_t(cols) * size_t(bits) / 32;
  for (size_t r = 0; r < size_t(rows); ++r)
    for (size_t j = 0; j < size_t(cols); ++j) {
      const size_t bit = j * size_t(bits);
      const uint32_t* wr = codes.data() + r * words;
      uint64_t v = wr[bit / 32];
      if (bit % 32 + size_t(bits) > 32) v |= uint64_t(wr[bit / 32 + 1]) << 32;
      out[r * size_t(cols) + j] = uint8_t((v >> (bit % 32)) & ((1u << bits) - 1));
    }
  return out;
}

TEST(GptqFactorTest, IsTheUpperCholeskyFactorOfTheDampedInverse) {
  ThreadPool pool(2);
  const int n = 77;
  const std::vector<double> h = make_hessian(n, 200, 3);
  const GptqFactor f = gptq_factor(h, n, 0.01, "test", pool);
  double mean = 0;
  for (int i = 0; i < n; ++i) mean += h[size_t(i) * n + size_t(i)];
  EXPECT_NEAR(f.damp, 0.01 * mean / n, 1e-9 * mean);
  // (H + damp I) U^T U = I
  double worst = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int k = 0; k < n; ++k) {
        double utu = 0;  // (U^T U)[k][j]
        for (int m = 0; m <= std::min(k, j); ++m) utu += double(f.u[size_t(m) * n + size_t(k)]) * f.u[size_t(m) * n + size_t(j)];
        s += (h[size_t(i) * n + size_t(k)] + (i == k ? f.damp : 0)) * utu;
      }
      worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
    }
  EXPECT_LT(worst, 1e-4);
  for (int i = 0; i < n; ++i) {
    EXPECT_GT(f.u[size_t(i) * n + size_t(i)], 0.f);
    for (int j = 0; j < i; ++j) EXPECT_EQ(f.u[size_t(i) * n + size_t(j)], 0.f);
  }
  // Not positive definite at any dampening: all of H's diagonal NaN.
  std::vector<double> bad(size_t(n) * n, std::nan(""));
  try {
    gptq_factor(bad, n, 0.01, "layer 3's q/k/v", pool);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "layer 3's q/k/v")) << e.what();
  }
}

// 24 rows, 256 inputs (two blocks of 128: the lazy update between them is exercised; block 64 too),
// 4 bits in groups of 64. Measured (this H): output error rtn 1.403e5, search 1.159e5, gptq 9.458e4
// (0.82 of search's; the bound is 0.9: search's extra refit brought it closer to GPTQ, and GPTQ's
// groups, fitted by search on the updated weights, from 8.905e4 to 9.458e4 here); gptq's codes were
// all but 4 the reference's, which float rounding may flip in rare ties (>= 99% asked), the output
// errors within 2%.
TEST(GptqSolveTest, BeatsRtnAndSearchAndMatchesThePlainAlgorithm) {
  ThreadPool pool(2);
  const int rows = 24, cols = 256;
  const AffineSpec s{4, 64};
  const std::vector<double> h = make_hessian(cols, 600, 7);
  const std::vector<float> w = make_weights(rows, cols, 11);
  const Solved rtn = solve_rows(w, rows, cols, s, QuantMethod::Rtn);
  const Solved search = solve_rows(w, rows, cols, s, QuantMethod::Search);
  const Solved g = solve_gptq(w, rows, cols, h, s, pool);
  const double e_rtn = gptq_output_error(w.data(), rtn.q.data(), rows, cols, h.data());
  const double e_search = gptq_output_error(w.data(), search.q.data(), rows, cols, h.data());
  const double e_gptq = gptq_output_error(w.data(), g.q.data(), rows, cols, h.data());
  std::printf("output error: rtn %.5g, search %.5g, gptq %.5g\n", e_rtn, e_search, e_gptq);
  EXPECT_LT(e_gptq, 0.9 * e_search);
  EXPECT_LT(e_search, e_rtn);

  std::vector<uint8_t> ref_codes;
  const std::vector<float> ref = reference_gptq(w, rows, cols, h, s, &ref_codes);
  const double e_ref = gptq_output_error(w.data(), ref.data(), rows, cols, h.data());
  for (int block : {128, 64}) {
    const Solved b = block == 128 ? g : solve_gptq(w, rows, cols, h, s, pool, block);
    const std::vector<uint8_t> codes = unpack(b.codes, rows, cols, s.bits);
    size_t same = 0;
    for (size_t i = 0; i < codes.size(); ++i) same += codes[i] == ref_codes[i];
    const double e = gptq_output_error(w.data(), b.q.data(), rows, cols, h.data());
    std::printf("block %d: %zu of %zu codes as the reference's, output error %.6g (reference %.6g)\n", block, same,
                codes.size(), e, e_ref);
    EXPECT_GE(double(same), 0.99 * double(codes.size())) << block;
    EXPECT_NEAR(e, e_ref, 0.02 * e_ref) << block;
  }

  // Act-order with static groups: the same against the reference run so; block 96 is no multiple
  // of the group (allowed: the groups are fitted up front).
  std::vector<uint8_t> ref_ao_codes;
  const std::vector<float> ref_ao = reference_gptq(w, rows, cols, h, s, &ref_ao_codes, true);
  const double e_ref_ao = gptq_output_error(w.data(), ref_ao.data(), rows, cols, h.data());
  for (int block : {128, 96}) {
    const Solved b = solve_gptq(w, rows, cols, h, s, pool, block, true);
    const std::vector<uint8_t> codes = unpack(b.codes, rows, cols, s.bits);
    size_t same = 0;
    for (size_t i = 0; i < codes.size(); ++i) same += codes[i] == ref_ao_codes[i];
    const double e = gptq_output_error(w.data(), b.q.data(), rows, cols, h.data());
    std::printf("act-order, block %d: %zu of %zu codes as the reference's, output error %.6g (reference %.6g)\n",
                block, same, codes.size(), e, e_ref_ao);
    EXPECT_GE(double(same), 0.99 * double(codes.size())) << block;
    EXPECT_NEAR(e, e_ref_ao, 0.02 * e_ref_ao) << block;
    EXPECT_LT(e, e_search) << block;
  }
}

// An input that is always 0 (H's row and column 0): flagged dead, its weights set to 0 before the
// solve (they cost nothing whatever they are), nothing non-finite, and the rest still beats RTN.
TEST(GptqSolveTest, ADeadInputIsZeroedAndHarmless) {
  ThreadPool pool(2);
  const int rows = 8, cols = 128, dead = 37;
  const AffineSpec s{4, 32};
  const std::vector<double> h = make_hessian(cols, 300, 5, dead);
  ASSERT_EQ(h[size_t(dead) * cols + dead], 0.0);
  const GptqFactor f = gptq_factor(h, cols, 0.01, "test", pool);
  EXPECT_EQ(f.dead[size_t(dead)], 1);
  EXPECT_EQ(std::count(f.dead.begin(), f.dead.end(), uint8_t(1)), 1);
  const std::vector<float> w = make_weights(rows, cols, 9);
  const Solved g = solve_gptq(w, rows, cols, h, s, pool);
  for (float v : g.q) ASSERT_TRUE(std::isfinite(v));
  for (int r = 0; r < rows; ++r) {
    // 0 is representable up to half a step: the dead weight's value is within one of the group's steps of 0.
    EXPECT_LE(std::fabs(g.q[size_t(r) * cols + dead]), std::fabs(g.scales[size_t(r) * (cols / 32) + dead / 32]) * 0.5f + 1e-7f);
  }
  const Solved rtn = solve_rows(w, rows, cols, s, QuantMethod::Rtn);
  EXPECT_LT(gptq_output_error(w.data(), g.q.data(), rows, cols, h.data()),
            gptq_output_error(w.data(), rtn.q.data(), rows, cols, h.data()));
}

// The forward pass's observer: every matrix input in order with its width, the logits unchanged by
// an observer that lets the pass go on, and a pass ended where the observer says.
TEST(ForwardObserverTest, SeesEveryMatrixInputInOrderAndChangesNothing) {
  const auto m = Model::load(test::repo_model("kjv-tiny"));
  const ModelConfig& c = m->config();
  struct Log final : ForwardObserver {
    std::vector<std::tuple<int, MatmulInput, int, int>> seen;  // layer, site, T, width
    int stop_layer = -1;
    bool observe(int layer, MatmulInput site, const float* x, int T, int width) override {
      EXPECT_TRUE(std::isfinite(x[0]) && std::isfinite(x[size_t(T) * size_t(width) - 1]));
      seen.emplace_back(layer, site, T, width);
      return !(layer == stop_layer && site == MatmulInput::Mlp);
    }
  };
  ThreadPool pool(2);
  const std::vector<int32_t> ids = {0, 15, 27, 99, 4, 1000, 7};
  auto run = [&](ForwardObserver* obs) {
    KVCacheConfig kc;
    kc.ctx_size = 16;
    KVCache cache(m->kv_shape(), kc);
    ForwardState st;
    st.observer = obs;
    std::vector<float> logits(ids.size() * size_t(c.vocab_size), -1.f);
    m->forward(ids, 0, cache, st, logits.data(), true, pool);
    return logits;
  };
  Log log;
  EXPECT_EQ(run(&log), run(nullptr));
  ASSERT_EQ(log.seen.size(), size_t(4 * c.n_layers + 1));
  const int T = int(ids.size());
  for (int l = 0; l < c.n_layers; ++l) {
    EXPECT_EQ(log.seen[size_t(4 * l)], std::make_tuple(l, MatmulInput::Attention, T, c.hidden_size));
    EXPECT_EQ(log.seen[size_t(4 * l + 1)], std::make_tuple(l, MatmulInput::AttentionOutput, T, c.q_dim()));
    EXPECT_EQ(log.seen[size_t(4 * l + 2)], std::make_tuple(l, MatmulInput::Mlp, T, c.hidden_size));
    EXPECT_EQ(log.seen[size_t(4 * l + 3)], std::make_tuple(l, MatmulInput::MlpDown, T, c.intermediate_size));
  }
  EXPECT_EQ(log.seen.back(), std::make_tuple(c.n_layers, MatmulInput::LmHead, T, c.hidden_size));
  Log stop;
  stop.stop_layer = 1;
  const std::vector<float> untouched = run(&stop);
  EXPECT_EQ(stop.seen.size(), 4u + 3u);  // layer 0, then layer 1 up to its MLP input
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](float v) { return v == -1.f; }));
}

TEST(GptqCalibrationTest, WindowsAreSeededAndStartWithBos) {
  std::vector<int32_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i + 10);
  const auto a = calibration_windows(ids, 1000, 128, 42, 0), b = calibration_windows(ids, 1000, 128, 42, 0);
  const auto c = calibration_windows(ids, 1000, 128, 43, std::nullopt);
  ASSERT_EQ(a.size(), 8u);  // ceil(1000 / 128)
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (const auto& s : a) {
    ASSERT_EQ(s.size(), 128u);
    EXPECT_EQ(s[0], 0);  // BOS
    for (size_t i = 2; i < s.size(); ++i) EXPECT_EQ(s[i], s[i - 1] + 1);  // a window of the stream
  }
  for (const auto& s : c) EXPECT_EQ(s[1], s[0] + 1);  // no BOS: the stream's own first token
  const auto short_stream = calibration_windows(std::span(ids).first(50), 300, 128, 1, 0);
  ASSERT_EQ(short_stream.size(), 3u);
  EXPECT_EQ(short_stream[0].size(), 50u);
  EXPECT_TRUE(calibration_windows({}, 300, 128, 1, 0).empty());
}

// ---------------------------------------------------------------------------------------------
// kjv-tiny, calibrated on tests/data/gptq_calib.txt (5 KB of Deuteronomy from the training text).

const char* const kText =
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
    "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God "
    "said, Let there be light: and there was light.";

std::vector<std::vector<int32_t>> tiny_calibration(const std::string& model = "kjv-tiny") {
  const Tokenizer tok = Tokenizer::load(test::repo_model(model));
  std::ifstream in(test::repo_dir() / "tests" / "data" / "gptq_calib.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<int32_t> ids = tok.encode(text, {.add_special = false, .parse_special = false});
  EXPECT_GT(ids.size(), 900u);
  return calibration_windows(ids, 4096, 256, 42, tok.bos_id());
}

double mean_nll(const Model& m, const std::vector<int32_t>& ids) {
  ThreadPool pool(2);
  SessionOptions o;
  o.kv.ctx_size = int(ids.size());
  Session s(m, o, pool);
  return test::mean(test::nll_of(s.feed_all(ids), ids, m.config().vocab_size));
}

double mean_kl(const Model& src, const Model& q, const std::vector<int32_t>& ids);

// Measured for kText (59 tokens): mean NLL f32 3.67292, q4 g64 rtn 3.75646, gptq 3.69138 on an
// AVX-512 CPU and 3.78981 on an AVX2 one (Zen 3): 59 tokens' NLL moves with the products' last
// bits by more than the two fits differ, so it does not rank them (as for mistral-tiny below). The
// mean KL against the source does: rtn 0.09259, gptq 0.06939 (AVX2). The bound asks gptq's KL to be
// at most 0.9 of rtn's (a broken solve, or one no better than RTN, fails), and the result to load
// with the layout and config of --method rtn.
TEST(GptqCheckpointTest, KjvTinyLoadsAndLosesLessThanRtn) {
  ThreadPool pool(2);
  test::TempDir tmp;
  QuantizeOptions o;
  o.spec = {4, 64};
  const QuantizeReport rr = quantize_checkpoint(test::repo_model("kjv-tiny"), tmp.path / "rtn", o, pool);
  o.method = QuantMethod::Gptq;
  o.calibration = tiny_calibration();
  const QuantizeReport rg = quantize_checkpoint(test::repo_model("kjv-tiny"), tmp.path / "gptq", o, pool);
  EXPECT_EQ(rg.weight_format, rr.weight_format);
  EXPECT_EQ(rg.output_bytes, rr.output_bytes);
  EXPECT_EQ(test::read_json(tmp.path / "gptq" / "config.json")["quantization"],
            test::read_json(tmp.path / "rtn" / "config.json")["quantization"]);
  const Tokenizer tok = Tokenizer::load(test::repo_model("kjv-tiny"));
  const std::vector<int32_t> ids = tok.encode(kText);
  const auto f32 = Model::load(test::repo_model("kjv-tiny"));
  const auto rtn = Model::load(tmp.path / "rtn"), gptq = Model::load(tmp.path / "gptq");
  std::printf("mean NLL over %zu tokens: f32 %.5f, q4 g64 rtn %.5f, gptq %.5f\n", ids.size(), mean_nll(*f32, ids),
              mean_nll(*rtn, ids), mean_nll(*gptq, ids));
  const double kl_rtn = mean_kl(*f32, *rtn, ids), kl_gptq = mean_kl(*f32, *gptq, ids);
  std::printf("mean KL: q4 g64 rtn %.5f, gptq %.5f\n", kl_rtn, kl_gptq);
  EXPECT_LT(kl_gptq, 0.9 * kl_rtn);

  // No calibration: an error, not a silent RTN.
  o.calibration.clear();
  try {
    quantize_checkpoint(test::repo_model("kjv-tiny"), tmp.path / "none", o, pool);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "calibration")) << e.what();
  }
}

// Mean KL(source || quantized) of the next-token distributions over ids.
double mean_kl(const Model& src, const Model& q, const std::vector<int32_t>& ids) {
  ThreadPool pool(2);
  SessionOptions o;
  o.kv.ctx_size = int(ids.size());
  Session a(src, o, pool), b(q, o, pool);
  const std::span<float> la = a.feed_all(ids), lb = b.feed_all(ids);
  const size_t V = size_t(src.config().vocab_size);
  double total = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    auto log_softmax = [&](const float* x) {
      double mx = x[0], sum = 0;
      for (size_t i = 0; i < V; ++i) mx = std::max(mx, double(x[i]));
      for (size_t i = 0; i < V; ++i) sum += std::exp(double(x[i]) - mx);
      std::vector<double> out(V);
      for (size_t i = 0; i < V; ++i) out[i] = double(x[i]) - mx - std::log(sum);
      return out;
    };
    const std::vector<double> pa = log_softmax(la.data() + t * V), pb = log_softmax(lb.data() + t * V);
    for (size_t i = 0; i < V; ++i) total += std::exp(pa[i]) * (pa[i] - pb[i]);
  }
  return total / double(ids.size());
}

// An untied LM head (mistral-tiny, F16: F16 scales; its embedding takes the search fit, the head
// GPTQ) and q/k/v biases (qwen2-tiny), q4 g32. On 59 tokens the NLL is too noisy to rank them
// (mistral-tiny's RTN copy scored below its source); the KL against the source is not. Measured,
// mean KL rtn / gptq: mistral-tiny 0.04848 / 0.02449, qwen2-tiny 0.05850 / 0.03119 (and with
// train.txt calibration and 10 chunks of val.txt, mistral-tiny: rtn +6.03% PPL, KL 0.0502; gptq
// +3.20%, KL 0.0270). The bound: gptq's KL at most 0.9 of rtn's.
TEST(GptqCheckpointTest, UntiedHeadAndBiasedModelsQuantize) {
  for (const char* name : {"mistral-tiny", "qwen2-tiny"}) {
    ThreadPool pool(2);
    test::TempDir tmp;
    QuantizeOptions o;
    o.spec = {4, 32};
    quantize_checkpoint(test::repo_model(name), tmp.path / "rtn", o, pool);
    o.method = QuantMethod::Gptq;
    o.calibration = tiny_calibration(name);
    const QuantizeReport r = quantize_checkpoint(test::repo_model(name), tmp.path / "gptq", o, pool);
    EXPECT_EQ(r.matrices_dense, 0) << name;
    const Tokenizer tok = Tokenizer::load(test::repo_model(name));
    const std::vector<int32_t> ids = tok.encode(kText);
    const auto src = Model::load(test::repo_model(name));
    const double rtn = mean_kl(*src, *Model::load(tmp.path / "rtn"), ids);
    const double gptq = mean_kl(*src, *Model::load(tmp.path / "gptq"), ids);
    std::printf("%s: mean KL over %zu tokens: q4 g32 rtn %.5f, gptq %.5f\n", name, ids.size(), rtn, gptq);
    EXPECT_LT(gptq, 0.9 * rtn) << name;
  }
}

// mlx-lm's mixed_4_6 on kjv-tiny (4 layers: eighth 0, so layers 3 (>= 7 * 4 / 8 = 3) and 2 ((2 - 0)
// % 3 == 2) take 6 bits for v_proj and down_proj) and the tied embedding (the LM head) at 6; and
// --embedding-bits alone.
TEST(GptqCheckpointTest, MixedRecipeAndEmbeddingBitsWritePerModuleEntries) {
  EXPECT_TRUE(recipe_uses_more_bits(0, 8) && recipe_uses_more_bits(3, 8) && recipe_uses_more_bits(6, 8) &&
              recipe_uses_more_bits(7, 8));
  for (int l : {1, 2, 4, 5}) EXPECT_FALSE(recipe_uses_more_bits(l, 8)) << l;
  ThreadPool pool(2);
  test::TempDir tmp;
  QuantizeOptions o;
  o.spec = {4, 64};
  o.recipe = QuantRecipe::Mixed_4_6;
  const QuantizeReport r = quantize_checkpoint(test::repo_model("kjv-tiny"), tmp.path / "mixed", o, pool);
  const json q = test::read_json(tmp.path / "mixed" / "config.json")["quantization"];
  const json want = {{"group_size", 64},
                     {"bits", 4},
                     {"model.embed_tokens", {{"group_size", 64}, {"bits", 6}}},
                     {"model.layers.0.mlp.down_proj", {{"group_size", 32}, {"bits", 4}}},
                     {"model.layers.1.mlp.down_proj", {{"group_size", 32}, {"bits", 4}}},
                     {"model.layers.2.mlp.down_proj", {{"group_size", 32}, {"bits", 6}}},
                     {"model.layers.2.self_attn.v_proj", {{"group_size", 64}, {"bits", 6}}},
                     {"model.layers.3.mlp.down_proj", {{"group_size", 32}, {"bits", 6}}},
                     {"model.layers.3.self_attn.v_proj", {{"group_size", 64}, {"bits", 6}}}};
  EXPECT_EQ(q, want);
  EXPECT_TRUE(has(r.weight_format, "q6 g64")) << r.weight_format;

  o.recipe = QuantRecipe::None;
  o.embedding_bits = 8;
  const QuantizeReport e = quantize_checkpoint(test::repo_model("kjv-tiny"), tmp.path / "emb8", o, pool);
  EXPECT_EQ(test::read_json(tmp.path / "emb8" / "config.json")["quantization"]["model.embed_tokens"],
            (json{{"group_size", 64}, {"bits", 8}}));
  EXPECT_TRUE(has(e.weight_format, "q8 g64 (F32 scales) (1 of 29 matrices)")) << e.weight_format;
  const auto m = Model::load(tmp.path / "emb8");
  const Tokenizer tok = Tokenizer::load(test::repo_model("kjv-tiny"));
  EXPECT_TRUE(std::isfinite(mean_nll(*m, tok.encode(kText))));
}

TEST(GptqCliTest, BadCalibrationFlagsAreErrorsNamingTheFlag) {
  test::TempDir tmp;
  const std::string q = test::binary() + " quantize " + test::repo_model("kjv-tiny").string() + " " +
                        (tmp.path / "out").string() + " --threads 2";
  const auto missing = test::run_command(q + " --method gptq");
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(has(missing.err, "--method gptq needs --calib")) << missing.err;
  const auto unreadable = test::run_command(q + " --method gptq --calib " + (tmp.path / "nope.txt").string());
  EXPECT_EQ(unreadable.code, 2);
  EXPECT_TRUE(has(unreadable.err, "nope.txt: cannot read the file given to --calib")) << unreadable.err;
  const auto zero = test::run_command(q + " --method gptq --calib tests/data/gptq_calib.txt --calib-tokens 0");
  EXPECT_EQ(zero.code, 2);
  EXPECT_TRUE(has(zero.err, "--calib-tokens")) << zero.err;
  const auto not_gptq = test::run_command(q + " --method search --calib " +
                                          (test::repo_dir() / "tests/data/gptq_calib.txt").string());
  EXPECT_EQ(not_gptq.code, 2);
  EXPECT_TRUE(has(not_gptq.err, "--calib is read by --method gptq only")) << not_gptq.err;
  const auto both = test::run_command(q + " --embedding-bits 8 --keep-embeddings");
  EXPECT_EQ(both.code, 2);
  EXPECT_TRUE(has(both.err, "--embedding-bits")) << both.err;
  EXPECT_FALSE(fs::exists(tmp.path / "out" / "model.safetensors"));

  // A run that works: the calibration line and what was written.
  const auto ok = test::run_command(q + " --method gptq --calib " +
                                    (test::repo_dir() / "tests/data/gptq_calib.txt").string() +
                                    " --calib-tokens 1024 --calib-seq 128 --embedding-bits 8");
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_TRUE(has(ok.err, "gptq: 8 calibration sequences of 128 tokens (1024 tokens)")) << ok.err;
  EXPECT_TRUE(has(ok.err, "bits a weight")) << ok.err;
  EXPECT_TRUE(has(ok.err, "model.embed_tokens: q8 g32")) << ok.err;
  EXPECT_TRUE(has(ok.err, "expected quality: llama.cpp Q4_K_M's class")) << ok.err;

  // --calib without --method: GPTQ.
  const auto implied = test::run_command(q + " --calib " + (test::repo_dir() / "tests/data/gptq_calib.txt").string() +
                                         " --calib-tokens 512 --calib-seq 128");
  ASSERT_EQ(implied.code, 0) << implied.err;
  EXPECT_TRUE(has(implied.err, "gptq: 4 calibration sequences")) << implied.err;
  EXPECT_TRUE(has(implied.err, ", gptq,")) << implied.err;
}

// ---------------------------------------------------------------------------------------------
// The defaults of `quantize` (resolve_quantize_options) and what they write.

TEST(QuantizeDefaultsTest, ChooseGroupsEmbeddingBitsAndMethod) {
  const QuantizeOptions d4 = resolve_quantize_options({});
  EXPECT_EQ(d4.spec, (AffineSpec{4, 32}));
  EXPECT_EQ(d4.embedding_bits, 6);
  EXPECT_EQ(d4.embedding_group_size, 0);  // the other matrices' groups of 32
  EXPECT_EQ(d4.method, QuantMethod::Search);
  EXPECT_FALSE(d4.keep_embeddings);

  QuantizeRequest r;
  r.calibration = true;
  EXPECT_EQ(resolve_quantize_options(r).method, QuantMethod::Gptq);
  r.method = QuantMethod::Rtn;  // given: kept (the CLI then refuses --calib with it)
  EXPECT_EQ(resolve_quantize_options(r).method, QuantMethod::Rtn);

  r = {};
  r.bits = 8;
  const QuantizeOptions d8 = resolve_quantize_options(r);
  EXPECT_EQ(d8.spec, (AffineSpec{8, 64}));
  EXPECT_EQ(d8.embedding_bits, 0);  // the embedding at 8 bits like the rest
  EXPECT_EQ(d8.embedding_group_size, 0);

  r = {};
  r.keep_embeddings = true;
  EXPECT_EQ(resolve_quantize_options(r).embedding_bits, 0);
  r = {};
  r.group_size = 64;
  r.embedding_bits = 4;
  const QuantizeOptions given = resolve_quantize_options(r);
  EXPECT_EQ(given.spec, (AffineSpec{4, 64}));
  EXPECT_EQ(given.embedding_bits, 4);
  EXPECT_EQ(given.embedding_group_size, 0);  // a given group size is every matrix's
  r = {};
  r.group_size = 32;
  EXPECT_EQ(resolve_quantize_options(r).embedding_group_size, 0);

  r = {};
  r.recipe = QuantRecipe::Mixed_3_6;
  EXPECT_EQ(resolve_quantize_options(r).spec, (AffineSpec{3, 32}));

  EXPECT_TRUE(has(quality_class(d4), "Q4_K_M")) << quality_class(d4);
  EXPECT_TRUE(has(quality_class(d4), "in fewer bytes")) << quality_class(d4);  // 16.74 MiB against 16.94
  QuantizeOptions e8 = d4;
  e8.embedding_bits = 8;
  EXPECT_TRUE(has(quality_class(e8), "Q4_K_M's class")) << quality_class(e8);
  EXPECT_TRUE(has(quality_class(e8), "in more bytes")) << quality_class(e8);
  EXPECT_TRUE(has(quality_class(d8), "near-lossless")) << quality_class(d8);
  QuantizeOptions old;  // mlx-lm's convert -q: 4 bits, groups of 64, rtn, the embedding at 4 bits
  old.spec = {4, 64};
  EXPECT_TRUE(has(quality_class(old), "below llama.cpp Q4_0")) << quality_class(old);
}

// The default 4-bit file of kjv-tiny against mlx-lm's default (q4 g64 rtn, the embedding at 4 bits):
// its mean KL against the F32 source over kText must be at most 0.6 of that one's (measured: 0.04804
// against 0.09259 on AVX-512), in at most 1.45x its bytes (1.40x measured: the 8192 x 128 embedding,
// at 6 bits, is more than half of kjv-tiny's parameters).
TEST(QuantizeDefaultsTest, KjvTinyDefaultLosesLessThanMlxDefault) {
  ThreadPool pool(2);
  test::TempDir tmp;
  QuantizeOptions mlx;
  mlx.spec = {4, 64};
  const QuantizeReport rm = quantize_checkpoint(test::repo_model("kjv-tiny"), tmp.path / "mlx", mlx, pool);
  const QuantizeReport rd =
      quantize_checkpoint(test::repo_model("kjv-tiny"), tmp.path / "def", resolve_quantize_options({}), pool);
  const auto cfg = test::read_json(tmp.path / "def" / "config.json")["quantization"];
  EXPECT_EQ(cfg["group_size"], 32);
  EXPECT_EQ(cfg["bits"], 4);
  EXPECT_EQ(cfg["model.embed_tokens"]["bits"], 6);
  EXPECT_EQ(cfg["model.embed_tokens"]["group_size"], 32);
  const Tokenizer tok = Tokenizer::load(test::repo_model("kjv-tiny"));
  const std::vector<int32_t> ids = tok.encode(kText);
  const auto f32 = Model::load(test::repo_model("kjv-tiny"));
  const auto m = Model::load(tmp.path / "mlx"), d = Model::load(tmp.path / "def");
  const double kl_mlx = mean_kl(*f32, *m, ids), kl_def = mean_kl(*f32, *d, ids);
  std::printf("mean KL: q4 g64 rtn %.5f (%zu bytes), defaults %.5f (%zu bytes)\n", kl_mlx, rm.output_bytes, kl_def,
              rd.output_bytes);
  EXPECT_LT(kl_def, 0.6 * kl_mlx);
  EXPECT_LE(double(rd.output_bytes), 1.45 * double(rm.output_bytes));
}

}  // namespace
}  // namespace ptllm
