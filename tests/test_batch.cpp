// Sequences stepped together (Session::feed_batch: one forward pass, the weights read once for all)
// give what each gives run alone, for every KV precision, with and without StreamingLLM, under both
// position schemes; mixed batches (a prefill chunk beside decode tokens) too.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/thread_pool.h"
#include "engine/session.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "test_greedy.h"
#include "test_util.h"

namespace ptllm {
namespace {

struct Case {
  KVPrecision precision;
  int sink, window;
  PositionMode positions;
};

std::string name(const Case& c) {
  return std::string(kv_precision_name(c.precision)) + (c.window ? "_streaming" : "") + "_" +
         std::string(position_mode_name(c.positions));
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int32_t> id(3, vocab - 1);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& x : p) x = id(rng);
  return p;
}

class BatchEquivalence : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(test::repo_model("kjv-tiny")).release(); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  SessionOptions options() const {
    SessionOptions o;
    const Case& c = GetParam();
    o.kv.precision = c.precision;
    o.kv.sink = c.sink;
    o.kv.window = c.window;
    o.kv.positions = c.positions;
    o.kv.residual = 32;
    o.kv.ctx_size = 512;
    return o;
  }
  static Model* model_;
};
Model* BatchEquivalence::model_ = nullptr;

// Greedy decode of n sequences of different prompt lengths, alone and together: the same ids, logits
// within float tolerance (the batch's matrix products add in another order than one row's).
TEST_P(BatchEquivalence, TogetherEqualsAlone) {
  ThreadPool pool(2);
  const int n = 9, steps = 40, vocab = model_->config().vocab_size;  // 9 rows: past the gemv cut-off
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(random_prompt(rng, 5 + 13 * i, vocab));

  std::vector<std::vector<int32_t>> alone_ids(n);
  std::vector<std::vector<float>> alone_logits(n);
  for (int i = 0; i < n; ++i) {
    Session s(*model_, options(), pool);
    test::Greedy g = test::greedy(s, prompts[size_t(i)], steps);
    alone_ids[size_t(i)] = std::move(g.ids);
    alone_logits[size_t(i)] = std::move(g.last_logits);
  }

  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<Session*> ptrs;
  std::vector<int32_t> next(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    sessions.push_back(std::make_unique<Session>(*model_, options(), pool));
    ptrs.push_back(sessions.back().get());
    next[size_t(i)] = argmax(sessions.back()->feed(prompts[size_t(i)]));
  }
  std::vector<std::span<const int32_t>> feeds;
  for (int i = 0; i < n; ++i) feeds.emplace_back(&next[size_t(i)], 1);
  ForwardState st;
  for (int t = 0; t < steps; ++t) {
    for (int i = 0; i < n; ++i) ASSERT_EQ(next[size_t(i)], alone_ids[size_t(i)][size_t(t)]) << "seq " << i << " step " << t;
    Session::feed_batch(ptrs, feeds, st);
    for (int i = 0; i < n; ++i) next[size_t(i)] = argmax(sessions[size_t(i)]->last_logits());
  }
  for (int i = 0; i < n; ++i) {
    const auto got = sessions[size_t(i)]->last_logits();
    ASSERT_EQ(got.size(), alone_logits[size_t(i)].size());
    double worst = 0;
    for (size_t v = 0; v < got.size(); ++v) worst = std::max(worst, double(std::fabs(got[v] - alone_logits[size_t(i)][v])));
    // bf16 storage rounds K and V to 8 significant bits: a last-bit difference of the batch's
    // products can flip a rounding there, worth more than float noise.
    EXPECT_LT(worst, GetParam().precision == KVPrecision::BF16 ? 1e-2 : 2e-3) << "seq " << i;
    EXPECT_EQ(sessions[size_t(i)]->history().size(), prompts[size_t(i)].size() + steps);
  }
}

// One pass holding a prefill chunk of one sequence and decode tokens of two others gives each what
// it gets alone.
TEST_P(BatchEquivalence, PrefillChunkBesideDecodeTokens) {
  ThreadPool pool(2);
  const int vocab = model_->config().vocab_size;
  std::mt19937 rng(11);
  const auto a = random_prompt(rng, 20, vocab), b = random_prompt(rng, 33, vocab);
  Session sa(*model_, options(), pool), sb(*model_, options(), pool), sc(*model_, options(), pool);
  const int32_t na = argmax(sa.feed(a)), nb = argmax(sb.feed(b));
  const int chunk = std::min(sc.max_chunk(), 40);
  const auto c = random_prompt(rng, chunk, vocab);
  std::vector<Session*> ptrs{&sa, &sb, &sc};
  std::vector<std::span<const int32_t>> feeds{{&na, 1}, {&nb, 1}, {c.data(), c.size()}};
  ForwardState st;
  Session::feed_batch(ptrs, feeds, st);

  auto alone = [&](const std::vector<int32_t>& prompt, std::span<const int32_t> more) {
    Session s(*model_, options(), pool);
    s.feed(prompt);
    const auto lg = s.feed(more);
    return std::vector<float>(lg.begin(), lg.end());
  };
  const auto la = alone(a, {&na, 1}), lb = alone(b, {&nb, 1});
  Session s(*model_, options(), pool);
  const auto lc_span = s.feed(c);
  const std::vector<float> lc(lc_span.begin(), lc_span.end());
  const std::vector<const std::vector<float>*> want{&la, &lb, &lc};
  for (size_t i = 0; i < 3; ++i) {
    const auto got = ptrs[i]->last_logits();
    double worst = 0;
    for (size_t v = 0; v < got.size(); ++v) worst = std::max(worst, double(std::fabs(got[v] - (*want[i])[v])));
    EXPECT_LT(worst, 2e-3) << "sequence " << i;
    EXPECT_EQ(argmax(got), argmax(*want[i])) << "sequence " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllPrecisions, BatchEquivalence,
    ::testing::Values(Case{KVPrecision::F32, 0, 0, PositionMode::Absolute}, Case{KVPrecision::F16, 0, 0, PositionMode::Absolute},
                      Case{KVPrecision::BF16, 0, 0, PositionMode::Absolute}, Case{KVPrecision::Int8, 0, 0, PositionMode::Absolute},
                      Case{KVPrecision::Int4, 0, 0, PositionMode::Absolute}, Case{KVPrecision::Int2, 0, 0, PositionMode::Absolute},
                      Case{KVPrecision::F32, 4, 60, PositionMode::Cache}, Case{KVPrecision::F32, 4, 60, PositionMode::Absolute},
                      Case{KVPrecision::Int4, 4, 92, PositionMode::Cache}, Case{KVPrecision::Int4, 4, 92, PositionMode::Absolute},
                      Case{KVPrecision::Int8, 0, 0, PositionMode::Cache}, Case{KVPrecision::F16, 4, 60, PositionMode::Cache}),
    [](const ::testing::TestParamInfo<Case>& info) { return name(info.param); });

// A batch whose sequence would overflow its context is refused whole: nothing fed to any of them.
TEST(Batch, ContextFullRefusedWhole) {
  auto model = Model::load(test::repo_model("kjv-tiny"));
  ThreadPool pool(1);
  SessionOptions o;
  o.kv.ctx_size = 16;
  Session a(*model, o, pool), b(*model, o, pool);
  std::vector<int32_t> full(16, 5), one{7};
  a.feed(std::vector<int32_t>(4, 5));
  b.feed(full);
  std::vector<Session*> ptrs{&a, &b};
  std::vector<std::span<const int32_t>> feeds{{one.data(), 1}, {one.data(), 1}};
  ForwardState st;
  EXPECT_THROW(Session::feed_batch(ptrs, feeds, st), Error);
  EXPECT_EQ(a.position(), 4);
  EXPECT_EQ(b.position(), 16);
}

}  // namespace
}  // namespace ptllm
