// Reuse after an edit (engine/cache_reuse.h): the walk that finds the runs to shift, K/V shifted to
// new positions against a computation of the same tokens there, the pool left as it was (no block
// written that another sequence holds, none leaked), exact adoption never seeing a shifted block,
// and the scheduler's request field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/thread_pool.h"
#include "engine/cache_reuse.h"
#include "engine/session.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "test_scheduler_util.h"
#include "test_util.h"

namespace ptllm {
namespace {

std::vector<int32_t> ids(uint32_t seed, size_t n, int lo = 3, int hi = 1000) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(lo, hi);
  std::vector<int32_t> p(n);
  for (auto& x : p) x = id(rng);
  return p;
}

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(CacheReusePlan, FindsTheRunsAfterADroppedChunk) {
  // Distinct id ranges: no accidental match across parts.
  const auto sys = ids(1, 100, 3, 99), drop = ids(2, 50, 100, 199), rest = ids(3, 200, 200, 299),
             next = ids(4, 10, 300, 399);
  const auto cached = cat({sys, drop, rest});
  const auto prompt = cat({sys, rest, next});
  // From 96 (what exact adoption took): the 4 system tokens left, then the 200 that followed the drop.
  auto plan = plan_cache_reuse(cached, int64_t(cached.size()), prompt, 96, 32);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].src, 96);
  EXPECT_EQ(plan[0].dst, 96);
  EXPECT_EQ(plan[0].len, 4);  // the rest of the common prefix: a run of its own, not checked against min_len
  EXPECT_EQ(plan[1].src, 150);
  EXPECT_EQ(plan[1].dst, 100);
  EXPECT_EQ(plan[1].len, 200);
  // Only what the pool may hold counts; a run shorter than min_len is not taken.
  plan = plan_cache_reuse(cached, 150 + 20, prompt, 96, 32);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].len, 4);
  // The prompt's last token is never taken: its logits must be computed.
  const auto same = cat({sys, rest});
  plan = plan_cache_reuse(cached, int64_t(cached.size()), same, 96, 32);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[1].len, 199);
  // Nothing in common after the prompt's next token: nothing to shift.
  EXPECT_TRUE(plan_cache_reuse(cached, int64_t(cached.size()), cat({sys, next, rest}), 100, 32).empty());
}

// With gaps allowed, prompt tokens no run supplies (a summary in place of a dropped part) are left to
// compute and the walk goes on after them; without, the first of them ends it.
TEST(CacheReusePlan, GapsLetTheWalkGoOnPastInsertedTokens) {
  const auto sys = ids(1, 100, 3, 99), drop = ids(2, 50, 100, 199), rest = ids(3, 200, 200, 299),
             summary = ids(5, 12, 400, 499);
  const auto cached = cat({sys, drop, rest});
  const auto prompt = cat({sys, summary, rest});
  EXPECT_EQ(plan_cache_reuse(cached, int64_t(cached.size()), prompt, 96, 32).size(), 1u);  // the common rest only
  auto plan = plan_cache_reuse(cached, int64_t(cached.size()), prompt, 96, 32, 64);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[1].src, 150);
  EXPECT_EQ(plan[1].dst, 112);  // after the 12 summary tokens, computed
  EXPECT_EQ(plan[1].len, 199);
  // A gap longer than allowed ends the walk.
  EXPECT_EQ(plan_cache_reuse(cached, int64_t(cached.size()), prompt, 96, 32, 8).size(), 1u);
}

// A turn moved earlier: with gaps the walk takes runs from before the last one in the history too
// (llama-server's walk, max_gap 0, only goes forward).
TEST(CacheReusePlan, RunsOutOfOrderAfterATurnMoved) {
  const auto sys = ids(1, 100, 3, 99), t1 = ids(2, 80, 100, 199), t2 = ids(3, 90, 200, 299),
             t3 = ids(4, 70, 300, 399), next = ids(5, 10, 400, 499);
  const auto cached = cat({sys, t1, t2, t3});
  const auto prompt = cat({sys, t3, t1, t2, next});
  auto plan = plan_cache_reuse(cached, int64_t(cached.size()), prompt, 96, 32, 64);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].len, 4);  // the rest of the common prefix
  EXPECT_EQ(plan[1].src, 270);  // t3, forward
  EXPECT_EQ(plan[1].dst, 100);
  EXPECT_EQ(plan[1].len, 70);
  EXPECT_EQ(plan[2].src, 100);  // t1 and t2, from before t3 in the history
  EXPECT_EQ(plan[2].dst, 170);
  EXPECT_EQ(plan[2].len, 170);
  // Forward only without gaps: t3, then nothing.
  plan = plan_cache_reuse(cached, int64_t(cached.size()), prompt, 96, 32);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[1].src, 270);
  // A run after the last one is preferred over an equal one before it.
  const auto twice = cat({sys, t1, t3, t2, t1}), gap = ids(6, 5, 500, 599);
  plan = plan_cache_reuse(twice, int64_t(twice.size()), cat({sys, t2, gap, t1, next}), 96, 32, 64);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[1].src, 250);  // t2
  EXPECT_EQ(plan[2].src, 340);  // the t1 after it, not the one at 100
  EXPECT_EQ(plan[2].dst, 195);
}

TEST(CacheReusePlan, BadMinimumsAreRefusedByName) {
  KVCacheConfig kv;
  EXPECT_EQ(cache_reuse_error(0, kv, "--cache-reuse"), "");
  EXPECT_EQ(cache_reuse_error(32, kv, "--cache-reuse"), "");
  EXPECT_NE(cache_reuse_error(16, kv, "--cache-reuse").find("--cache-reuse 16 is below the KV block size of 32"),
            std::string::npos);
  EXPECT_NE(cache_reuse_error(-1, kv, "n_cache_reuse").find("n_cache_reuse must not be negative"), std::string::npos);
  kv.window = 100;
  kv.sink = 4;
  EXPECT_NE(cache_reuse_error(64, kv, "n_cache_reuse").find("n_cache_reuse: StreamingLLM"), std::string::npos);
}

class ShiftedChunk : public ::testing::TestWithParam<KVPrecision> {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(test::repo_model("kjv-tiny")).release(); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static SessionOptions options() {
    SessionOptions o;
    o.kv.precision = GetParam();
    o.kv.residual = 64;
    o.kv.ctx_size = 512;
    return o;
  }
  static inline Model* model_ = nullptr;
};

// Worst |a - b| over every stored K (or V) of `n` tokens of every head and layer, relative to the
// largest |b|: a's tokens from a0, b's from b0.
double worst_relative(const KVCache& a, int64_t a0, const KVCache& b, int64_t b0, int64_t n, bool keys) {
  const KVShape& sh = a.shape();
  std::vector<float> x(size_t(sh.head_dim)), y(size_t(sh.head_dim));
  double worst = 0, scale = 0;
  for (int l = 0; l < sh.n_layers; ++l)
    for (int64_t i = 0; i < n; ++i)
      for (int g = 0; g < sh.n_kv_heads; ++g) {
        if (keys) {
          a.read_key(l, a0 + i, g, x.data());
          b.read_key(l, b0 + i, g, y.data());
        } else {
          a.read_value(l, a0 + i, g, x.data());
          b.read_value(l, b0 + i, g, y.data());
        }
        for (int d = 0; d < sh.head_dim; ++d) {
          worst = std::max(worst, double(std::fabs(x[size_t(d)] - y[size_t(d)])));
          scale = std::max(scale, double(std::fabs(y[size_t(d)])));
        }
      }
  return worst / scale;
}

// A chunk computed first at positions 0.. by one sequence, then shifted by another to positions
// 64..: its K and V in every layer equal those of the same tokens computed with the same context at
// positions 64.. (Model::forward from pos0 64 on an empty cache: RoPE attention depends on relative
// positions only, so only K's rotation differs). Exact in full precision up to float rounding; under
// KIVI the group is dequantized, rotated and quantized again.
TEST_P(ShiftedChunk, EqualsTheSameTokensComputedAtTheNewPositions) {
  ThreadPool threads(2);
  const SessionOptions o = options();
  KVPool pool(model_->kv_shape(), o.kv, 3);
  const int V = model_->config().vocab_size;
  const auto chunk = ids(11, 256, 3, V - 1), head = ids(12, 64, 3, V - 1), tail = ids(13, 5, 3, V - 1);
  const auto cached = cat({chunk, tail});
  CachedHistory hist;
  std::string before;  // the cached history's published blocks, as bytes
  std::vector<BlockHash> hashes;
  {
    Session a(*model_, o, threads, &pool);
    a.feed(cached);
    hist = cached_history(a);
  }
  EXPECT_EQ(pool.blocks_in_use(), 0u);  // a's blocks are cached, referenced by no one
  pool.extend_block_hashes(hist.tokens, 8, hashes);
  const bool kivi = is_kivi(o.kv.precision);
  for (size_t j = 0; j < 8; ++j) {
    const auto span = std::span<const int32_t>(hist.tokens).subspan(j * 32, 32);
    if (!pool.read_block(hashes[j], span, before)) {
      ASSERT_TRUE(kivi && pool.read_block(hashes[j], span, before, true));
    }
  }
  const auto prompt = cat({head, chunk, tail});
  Session b(*model_, o, threads, &pool);
  b.feed(head);
  const auto plan = plan_cache_reuse(hist.tokens, 256, prompt, 64, 32);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].src, 0);
  EXPECT_EQ(plan[0].dst, 64);
  EXPECT_EQ(apply_cache_reuse(b, pool, hist, prompt, plan, 7, 0), 256);
  EXPECT_EQ(b.position(), 320);  // the shifted tokens take positions 64..319
  EXPECT_EQ(b.cache().n_tokens(), 320);
  EXPECT_EQ(b.cache().shifted_from(), 64);

  // The same tokens, the same context (none before them), at positions 64..
  KVCache fresh(model_->kv_shape(), o.kv);
  ForwardState st;
  for (size_t done = 0; done < chunk.size();) {
    const size_t n = std::min(chunk.size() - done, size_t(fresh.max_append()));
    model_->forward(std::span<const int32_t>(chunk).subspan(done, n), 64 + int64_t(done), fresh, st, nullptr, false,
                    threads);
    fresh.end_step(std::span<const int32_t>(chunk).first(done + n));
    done += n;
  }
  const double k_err = worst_relative(b.cache(), 64, fresh, 0, 256, true);
  const double v_err = worst_relative(b.cache(), 64, fresh, 0, 256, false);
  std::printf("%s: shifted K worst relative error %.3g, V %.3g\n", std::string(kv_precision_name(o.kv.precision)).c_str(),
              k_err, v_err);
  if (!kivi) {
    EXPECT_LT(k_err, 1e-4);
    EXPECT_LT(v_err, 1e-6);  // V has no position: copied as it is
  } else {
    // The source groups were quantized once already; the shifted K is quantized again after its
    // rotation (per channel, so rotation moves error between channel pairs).
    const double bound = o.kv.precision == KVPrecision::Int8 ? 0.02 : 0.15;
    EXPECT_LT(k_err, bound);
    EXPECT_LT(v_err, bound);
  }

  // The cached history's blocks are as they were: nothing was written into a block b does not own.
  std::string after;
  for (size_t j = 0; j < 8; ++j) {
    const auto span = std::span<const int32_t>(hist.tokens).subspan(j * 32, 32);
    if (!pool.read_block(hashes[j], span, after)) {
      ASSERT_TRUE(pool.read_block(hashes[j], span, after, true));
    }
  }
  EXPECT_TRUE(before == after);

  // The rest of the prompt is computed after the shifted tokens; exact adoption never takes them.
  b.feed(std::span<const int32_t>(prompt).subspan(320));
  const CachedHistory bh = cached_history(b);
  EXPECT_EQ(bh.shifted.from_block, 2u);
  {
    Session c(*model_, o, threads, &pool);
    const int64_t adopted = c.adopt_prefix(prompt);
    EXPECT_LE(adopted, 64);  // the head's blocks, never the shifted ones after them
  }
  if (!kivi) {  // (under KIVI those tokens are quantized: no rewind)
    b.truncate(32);  // a rewind before the shifted tokens: what is left is exact again
    EXPECT_EQ(b.cache().shifted_from(), -1);
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, ShiftedChunk, ::testing::Values(KVPrecision::F32, KVPrecision::Int8, KVPrecision::Int4),
                         [](const auto& info) { return std::string(kv_precision_name(info.param)); });

// Sessions gone, nothing referenced: no block leaked by a shift.
TEST_P(ShiftedChunk, LeavesNoReferenceBehind) {
  ThreadPool threads(2);
  const SessionOptions o = options();
  KVPool pool(model_->kv_shape(), o.kv, 3);
  const int V = model_->config().vocab_size;
  const auto a_ids = cat({ids(21, 100, 3, V - 1), ids(22, 200, 3, V - 1)});
  CachedHistory hist;
  {
    Session a(*model_, o, threads, &pool);
    a.feed(a_ids);
    hist = cached_history(a);
  }
  {
    // The first 100 tokens dropped.
    const auto prompt = cat({std::vector<int32_t>(a_ids.begin() + 100, a_ids.end()), ids(23, 9, 3, V - 1)});
    Session b(*model_, o, threads, &pool);
    const auto plan = plan_cache_reuse(hist.tokens, 288, prompt, 0, 32);
    ASSERT_FALSE(plan.empty());
    const int64_t n = apply_cache_reuse(b, pool, hist, prompt, plan, 9, 0);
    EXPECT_GE(n, 128);
    b.feed(std::span<const int32_t>(prompt).subspan(size_t(n)));
    EXPECT_GT(pool.blocks_in_use(), 0u);
  }
  EXPECT_EQ(pool.blocks_in_use(), 0u);
}

// Through the scheduler: a request with n_cache_reuse after one whose history had a chunk more in
// the middle computes only what is new, and says how many tokens it shifted; without the field, the
// same request computes everything after the drop. A bad value is an error naming the field.
class CacheReuseScheduler : public test::StoreSchedulerFixture {};

TEST_F(CacheReuseScheduler, ARequestShiftsWhatFollowsADroppedChunk) {
  SchedulerConfig c = config(nullptr);
  Scheduler sch(*rt_, c);
  const int V = vocab();
  const auto sys = test::random_prompt(31, 96, V), drop = test::random_prompt(32, 80, V),
             rest = test::random_prompt(33, 200, V);
  const auto first = cat({sys, drop, rest});
  const RequestResult r1 = test::run_greedy(sch, first, 4);
  ASSERT_EQ(r1.reason, FinishReason::Length) << r1.error;
  const auto second = cat({sys, rest, test::random_prompt(34, 7, V)});
  auto run = [&](int reuse) {
    auto done = std::make_shared<std::promise<RequestResult>>();
    auto fut = done->get_future();
    Request r;
    r.prompt = second;
    r.params.sampling.temperature = 0;
    r.params.max_tokens = 4;
    r.params.ignore_eos = true;
    r.cache_reuse = reuse;
    r.on_done = [done](const RequestResult& res) { done->set_value(res); };
    sch.submit(std::move(r));
    return fut.get();
  };
  const RequestResult shifted = run(64);
  ASSERT_EQ(shifted.reason, FinishReason::Length) << shifted.error;
  // Exact reuse is unchanged: without the field only whole blocks of the common 96 tokens are taken
  // (as many as keep the prefill cut a cold run's), never the shifted sequence's blocks (published
  // under its own salted chain).
  const RequestResult exact = run(0);
  EXPECT_EQ(exact.shifted_tokens, 0);
  EXPECT_GT(exact.cached_tokens, 0);
  EXPECT_LE(exact.cached_tokens, 96);
  // With it: the rest of the common prefix, then the rest's tokens from the first history. That one
  // fed 376 + 3 tokens: its 11 full blocks hold its first 352, so tokens 176..351 (176 of the rest's
  // 200) are shifted from there to 96..271.
  EXPECT_EQ(shifted.cached_tokens, 96 + 176);
  EXPECT_EQ(shifted.shifted_tokens, 96 + 176 - exact.cached_tokens);
  EXPECT_EQ(sch.stats().shifted_tokens, uint64_t(shifted.shifted_tokens));
  // A summary in place of the dropped part: its tokens are computed, the rest shifted after them.
  const auto summary = test::random_prompt(35, 12, V);
  const auto third = cat({sys, summary, rest, test::random_prompt(36, 7, V)});
  {
    auto done = std::make_shared<std::promise<RequestResult>>();
    auto fut = done->get_future();
    Request r;
    r.prompt = third;
    r.params.sampling.temperature = 0;
    r.params.max_tokens = 4;
    r.params.ignore_eos = true;
    r.cache_reuse = 64;
    r.on_done = [done](const RequestResult& res) { done->set_value(res); };
    sch.submit(std::move(r));
    const RequestResult res = fut.get();
    ASSERT_EQ(res.reason, FinishReason::Length) << res.error;
    EXPECT_GE(res.shifted_tokens, 176);  // the rest's tokens in the first history's full blocks
  }
  const RequestResult bad = run(8);
  EXPECT_EQ(bad.reason, FinishReason::Error);
  EXPECT_NE(bad.error.find("n_cache_reuse 8 is below the KV block size"), std::string::npos) << bad.error;
  EXPECT_TRUE(sch.drain(std::chrono::seconds(60)));
  EXPECT_EQ(sch.pool().blocks_in_use(), 0u);
}

}  // namespace
}  // namespace ptllm

namespace ptllm {
namespace {

// A served conversation's reuse compounds: turn 2 shifts what followed a dropped chunk; turn 3
// extends turn 2's prompt and reply, so an exact server adopts all of it, but the reuse chain's
// history is turn 2's shifted K/V, which it carries on (shifted again, by 0): turn 3's reply still
// differs from a recompute. A one-edit measurement from an exact history sees none of it.
TEST(CacheReuseTrace, TheApproximationCarriesOverToTheNextTurn) {
  const auto model = Model::load(test::repo_model("kjv-tiny"));
  ThreadPool threads(2);
  SessionOptions o;
  o.kv.ctx_size = 1024;
  const auto sys = ids(1, 100, 3, 99), drop = ids(2, 64, 100, 199), rest = ids(3, 300, 200, 299),
             reply1 = ids(4, 20, 300, 399), user2 = ids(5, 40, 400, 499), reply2 = ids(6, 20, 500, 599),
             user3 = ids(7, 40, 600, 699), reply3 = ids(8, 20, 700, 799);
  std::vector<TraceTurn> turns = {{cat({sys, drop, rest}), reply1},
                                  {cat({sys, rest, user2}), reply2},
                                  {cat({sys, rest, user2, reply2, user3}), reply3}};
  const auto ms = measure_cache_reuse_trace(*model, o, threads, turns, 64, 256);
  ASSERT_EQ(ms.size(), 3u);
  EXPECT_EQ(ms[0].shifted, 0);  // nothing held before the first turn: exact
  EXPECT_EQ(ms[0].kl_max, 0.0);
  EXPECT_EQ(ms[0].computed_reuse, int64_t(turns[0].prompt.size()));
  EXPECT_GE(ms[1].shifted, 256);  // the rest after the dropped chunk
  EXPECT_GT(ms[1].kl_mean, 0.0);
  // Turn 3: an exact server adopts turn 2's whole blocks (what both share, up to the reply's end).
  EXPECT_LE(ms[2].computed_exact, 32 + 40);
  EXPECT_GE(ms[2].shifted, 256);  // the reuse server takes turn 2's shifted K/V again
  EXPECT_GT(ms[2].kl_mean, 0.0);
  for (const ReuseMeasurement& m : ms) EXPECT_LT(m.kl_exact_max, 1e-6);  // exact reuse is exact
  // The same turn measured from an exact history: no shift, the recompute's distribution.
  const std::vector<int32_t> held2 = cat({sys, rest, user2, reply2});
  const ReuseMeasurement one = measure_cache_reuse(*model, o, threads, held2, turns[2].prompt, reply3, 64, 256);
  EXPECT_LT(one.kl_max, 1e-6);
}

}  // namespace
}  // namespace ptllm
