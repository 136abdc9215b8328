// mistral-swa-tiny (every layer slides over 64 tokens) against transformers' goldens: teacher-forced
// NLL, greedy ids and the 1024-token golden_long, fp32 KV, fed in one call, token by token and in
// chunks; and the same engine with the window taken away, which must miss them (README: mean NLL
// 4.7007 over the long text without the window, 3.7313 with it). The model is read from
// ../shared/models (skipped without it).
#include <gtest/gtest.h>

#include <cmath>

#include "core/thread_pool.h"
#include "engine/session.h"
#include "kv/kv_cache.h"
#include "sample/sampler.h"
#include "test_util.h"

namespace ptllm {
namespace {

using test::mean;
using test::nll_of;

class SlidingWindowModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::shared_model("mistral-swa-tiny");
    if (!std::filesystem::exists(dir_ / "model.safetensors"))
      GTEST_SKIP() << dir_ << " not found (read from ../shared/models; skipped without it)";
    model_ = Model::load(dir_);
    V_ = model_->config().vocab_size;
  }
  SessionOptions opts() const {
    SessionOptions o;
    o.kv.ctx_size = 1024;
    return o;
  }
  // All logits of ids, fed in pieces of `piece` tokens (0: one call).
  std::vector<float> logits_of(const std::vector<int32_t>& ids, size_t piece, ThreadPool& pool) {
    Session s(*model_, opts(), pool);
    std::vector<float> all;
    if (piece == 0) piece = ids.size();
    for (size_t at = 0; at < ids.size(); at += piece) {
      const size_t n = std::min(piece, ids.size() - at);
      auto l = s.feed_all(std::span<const int32_t>(ids).subspan(at, n));
      all.insert(all.end(), l.begin(), l.end());
    }
    // A sliding model holds its window, not the context.
    for (int layer = 0; layer < model_->config().n_layers; ++layer)
      EXPECT_LT(s.cache().held_tokens(layer), 64 + s.options().kv.group_size) << "layer " << layer;
    return all;
  }

  std::filesystem::path dir_;
  std::unique_ptr<Model> model_;
  int V_ = 0;
};

TEST_F(SlidingWindowModelTest, ConfigGivesEveryLayerTheWindow) {
  EXPECT_EQ(model_->kv_shape().layer_window, std::vector<int>(3, 64));
}

TEST_F(SlidingWindowModelTest, TeacherForcedMatchesTransformers) {
  SafetensorsFile g(dir_ / "golden.safetensors");
  auto ids = test::tensor_values<int32_t>(g, "tf_ids");
  auto want = test::tensor_values<float>(g, "tf_nll");
  auto argmax_ref = test::tensor_values<int32_t>(g, "tf_argmax");
  auto pos = test::tensor_values<int32_t>(g, "tf_logits_pos");
  auto ref_logits = test::tensor_values<float>(g, "tf_logits");
  ThreadPool pool(2);
  const std::vector<float> logits = logits_of(ids, 0, pool);
  const std::vector<double> nll = nll_of(logits, ids, V_);
  ASSERT_EQ(nll.size(), want.size());
  double worst = 0;
  for (size_t t = 0; t < nll.size(); ++t) {
    EXPECT_NEAR(nll[t], want[t], 1e-3) << "position " << t;
    worst = std::max(worst, std::fabs(nll[t] - want[t]));
  }
  for (size_t t = 0; t < ids.size(); ++t)
    EXPECT_EQ(argmax(std::span<const float>(logits.data() + t * size_t(V_), size_t(V_))), argmax_ref[t]) << t;
  for (size_t k = 0; k < pos.size(); ++k) {
    const float* mine = logits.data() + size_t(pos[k]) * size_t(V_);
    const float* ref = ref_logits.data() + k * size_t(V_);
    float max_abs = 0;
    for (int i = 0; i < V_; ++i) max_abs = std::max(max_abs, std::fabs(ref[i]));
    for (int i = 0; i < V_; ++i) ASSERT_NEAR(mine[i], ref[i], 1e-3f * max_abs) << "logit " << i << " at " << pos[k];
  }
  auto golden = test::read_json(dir_ / "golden.json");
  EXPECT_NEAR(mean(nll), golden["teacher_forced"]["mean_nll"].get<double>(), 1e-4);
  std::printf("teacher-forced: mean NLL %.6f (golden %.6f), largest per-position difference %.2e\n", mean(nll),
              golden["teacher_forced"]["mean_nll"].get<double>(), worst);
}

// The 48 greedy ids of every golden prompt (these stay within the first window), and long_greedy's
// 400 (past six windows; transformers generated them with its sliding-window cache).
TEST_F(SlidingWindowModelTest, GreedyMatchesTransformers) {
  auto golden = test::read_json(dir_ / "golden.json");
  ThreadPool pool(2);
  ASSERT_FALSE(golden["prompts"].empty());
  nlohmann::json cases = golden["prompts"];
  cases.push_back(golden["long_greedy"]);
  ASSERT_EQ(cases.back()["greedy_ids"].size(), 400u);
  for (const auto& p : cases) {
    auto ids = p["ids"].get<std::vector<int32_t>>();
    auto want = p["greedy_ids"].get<std::vector<int32_t>>();
    Session s(*model_, opts(), pool);
    std::span<float> logits = s.feed(ids);
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      int32_t next = argmax(logits);
      got.push_back(next);
      if (i + 1 < want.size()) logits = s.feed({&next, 1});
    }
    EXPECT_EQ(got, want) << "prompt: " << p["text"];
  }
}

// The reference path (recompute everything each step, through a fresh cache) agrees.
TEST_F(SlidingWindowModelTest, NoCacheEqualsCachedPath) {
  auto golden = test::read_json(dir_ / "golden.json");
  auto want = golden["prompts"][0]["greedy_ids"].get<std::vector<int32_t>>();
  ThreadPool pool(2);
  SessionOptions o = opts();
  o.use_cache = false;
  Session s(*model_, o, pool);
  std::span<float> logits = s.feed(golden["prompts"][0]["ids"].get<std::vector<int32_t>>());
  for (size_t i = 0; i < want.size(); ++i) {
    const int32_t next = argmax(logits);
    ASSERT_EQ(next, want[i]) << "token " << i;
    if (i + 1 < want.size()) logits = s.feed({&next, 1});
  }
}

// golden_long: 1024 tokens, 16 windows long, in one call, token by token and in uneven chunks.
TEST_F(SlidingWindowModelTest, LongTextMatchesTransformersHoweverItIsFed) {
  SafetensorsFile g(dir_ / "golden_long.safetensors");
  auto ids = test::tensor_values<int32_t>(g, "ids");
  auto want = test::tensor_values<float>(g, "nll");
  ASSERT_EQ(ids.size(), 1024u);
  ASSERT_EQ(want.size(), 1023u);
  ThreadPool pool(2);
  for (size_t piece : {size_t(0), size_t(1), size_t(37)}) {
    const std::vector<double> nll = nll_of(logits_of(ids, piece, pool), ids, V_);
    ASSERT_EQ(nll.size(), want.size());
    double worst = 0;
    for (size_t t = 0; t < nll.size(); ++t) {
      EXPECT_NEAR(nll[t], want[t], 1e-3) << "position " << t << ", fed in pieces of " << piece;
      worst = std::max(worst, std::fabs(nll[t] - want[t]));
    }
    EXPECT_NEAR(mean(nll), 3.7313, 1e-3);
    std::printf("golden_long, pieces of %zu: mean NLL %.6f, largest per-position difference %.2e\n", piece, mean(nll),
                worst);
  }
}

// The same weights through a cache that ignores the window (every layer full): transformers' number
// for sliding_window None, and far from the goldens, so the tests above can fail.
TEST_F(SlidingWindowModelTest, IgnoringTheWindowMissesTheGoldens) {
  SafetensorsFile g(dir_ / "golden_long.safetensors");
  auto ids = test::tensor_values<int32_t>(g, "ids");
  auto want = test::tensor_values<float>(g, "nll");
  ThreadPool pool(2);
  KVShape shape = model_->kv_shape();
  shape.layer_window.clear();
  KVCacheConfig kv;
  kv.ctx_size = 1024;
  KVCache cache(shape, kv);
  ForwardState st;
  std::vector<float> logits(ids.size() * size_t(V_));
  model_->forward(ids, 0, cache, st, logits.data(), true, pool);
  const std::vector<double> nll = nll_of(logits, ids, V_);
  int off = 0;
  for (size_t t = 0; t < nll.size(); ++t) off += std::fabs(nll[t] - want[t]) > 1e-3;
  auto golden = test::read_json(dir_ / "golden.json");
  EXPECT_NEAR(mean(nll), golden["window_check"]["long1024_mean_nll_window_None"].get<double>(), 1e-3);
  EXPECT_GT(mean(nll) - 3.7313, 0.5);
  EXPECT_GT(off, 500) << "positions off by more than 1e-3";
  // Within the first window both agree (no key has left it yet).
  for (size_t t = 0; t < 63; ++t) EXPECT_NEAR(nll[t], want[t], 1e-3) << t;
  std::printf("without the window: mean NLL %.6f, %d of %zu positions off by more than 1e-3\n", mean(nll), off,
              nll.size());
}

}  // namespace
}  // namespace ptllm
