// The Scheduler (continuous batching over one shared KV pool): requests stepped together give what
// each gives alone; a cancelled request gives its blocks back; a pool too small for all requests
// queues and preempts them and every one completes; a repeated prompt is served from the pool.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <random>

#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "sample/sampler.h"
#include "test_greedy.h"
#include "test_scheduler_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

// The reference: one private Session, greedy, every step fed alone.
std::vector<int32_t> alone(Runtime& rt, const SessionOptions& o, const std::vector<int32_t>& prompt, int steps) {
  Session s(rt.model(), o, rt.pool());
  return test::greedy(s, prompt, steps, -1, /*feed_last=*/false).ids;
}

GenerationParams greedy(int max_tokens) {
  GenerationParams g;
  g.sampling.temperature = 0;
  g.max_tokens = max_tokens;
  g.ignore_eos = true;
  return g;
}

// A submitted request and the future of its result.
struct Pending {
  std::shared_ptr<std::promise<RequestResult>> done = std::make_shared<std::promise<RequestResult>>();
  std::future<RequestResult> result = done->get_future();
  std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
};

Pending submit(Scheduler& sch, std::vector<int32_t> prompt, GenerationParams g,
               std::function<void(std::string_view)> on_text = {}, Pending p = {}) {
  Request r;
  r.prompt = std::move(prompt);
  r.params = std::move(g);
  r.cancel = p.cancel;
  r.on_text = std::move(on_text);
  r.on_done = [d = p.done](const RequestResult& res) { d->set_value(res); };
  sch.submit(std::move(r));
  return p;
}

RequestResult wait(Pending& p) {
  // A bound so that a scheduler bug fails the test instead of hanging it (not a timing assertion).
  if (p.result.wait_for(std::chrono::minutes(5)) != std::future_status::ready) {
    ADD_FAILURE() << "request did not finish";
    return {};
  }
  return p.result.get();
}

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { rt_ = new Runtime({test::repo_model("kjv-tiny"), 2, true}); }
  static void TearDownTestSuite() {
    delete rt_;
    rt_ = nullptr;
  }
  static SchedulerConfig config(int parallel) {
    SchedulerConfig c;
    c.session.kv.ctx_size = 512;
    c.parallel = parallel;
    c.prefill_chunk = 64;  // prompts below are longer: prefill is cut into chunks between decodes
    c.eos_ids = {1};
    return c;
  }
  int vocab() const { return rt_->config().vocab_size; }
  static Runtime* rt_;
};
Runtime* SchedulerTest::rt_ = nullptr;

void expect_batched_equals_alone(Runtime& rt, SchedulerConfig cfg, int n, int steps) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(test::random_prompt(uint32_t(100 + i), 7 + 37 * i, rt.config().vocab_size));
  Scheduler sch(rt, cfg);
  std::vector<Pending> pending;
  for (const auto& p : prompts) pending.push_back(submit(sch, p, greedy(steps)));
  for (int i = 0; i < n; ++i) {
    const RequestResult r = wait(pending[size_t(i)]);
    EXPECT_EQ(r.reason, FinishReason::Length);
    EXPECT_EQ(r.completion_tokens, steps);
    EXPECT_EQ(r.tokens, alone(rt, cfg.session, prompts[size_t(i)], steps)) << "request " << i;
    EXPECT_EQ(r.text, rt.tokenizer().decode(r.tokens)) << "request " << i;
  }
  sch.drain();
  EXPECT_EQ(sch.pool().blocks_in_use(), 0u);
  EXPECT_EQ(sch.stats().finished, uint64_t(n));
}

// Session::adopt_prefix (what the scheduler calls before feeding a prompt in chunks) takes the
// pool's full blocks of the prompt, leaves the rest to feed_batch, and the result is what a private
// session computes; a private session adopts nothing.
TEST_F(SchedulerTest, SessionAdoptPrefixThenFeedBatch) {
  SessionOptions o = config(1).session;
  KVPool pool(rt_->model().kv_shape(), o.kv, 2);
  const auto p = test::random_prompt(70, 150, vocab());
  {
    Session first(rt_->model(), o, rt_->pool(), &pool);
    first.feed(p);
    Session second(rt_->model(), o, rt_->pool(), &pool);
    EXPECT_EQ(second.adopt_prefix(p), 128);  // four full blocks of 32; the last 22 tokens are computed
    EXPECT_EQ(second.position(), 128);
    std::vector<Session*> ss{&second};
    std::vector<std::span<const int32_t>> feeds{std::span<const int32_t>(p).subspan(128)};
    ForwardState st;
    Session::feed_batch(ss, feeds, st);
    Session priv(rt_->model(), o, rt_->pool());
    EXPECT_EQ(priv.adopt_prefix(p), 0);
    EXPECT_EQ(argmax(second.last_logits()), argmax(priv.feed(p)));
  }
  EXPECT_EQ(pool.blocks_in_use(), 0u);
}

// Seven requests over three slots: queued, admitted at step boundaries, prefilled in chunks beside
// the others' decode steps; each gets exactly the ids it gets alone.
TEST_F(SchedulerTest, BatchedRequestsEqualEachAlone) { expect_batched_equals_alone(*rt_, config(3), 7, 24); }

TEST(SchedulerSmall, BatchedRequestsEqualEachAloneOnKjvSmall) {
  if (!std::filesystem::exists(test::shared_model("kjv-small") / "config.json"))
    GTEST_SKIP() << "kjv-small not found under " << test::shared_dir() << " (set PTLLM_SHARED)";
  Runtime rt({test::shared_model("kjv-small"), 2, true});
  SchedulerConfig c;
  c.session.kv.ctx_size = 512;
  c.parallel = 4;
  c.prefill_chunk = 64;
  expect_batched_equals_alone(rt, c, 5, 16);
}

// A long prompt arriving while another request decodes is prefilled in chunks, each step beside the
// other's next token: the running stream keeps getting tokens while the prompt is prefilled.
TEST_F(SchedulerTest, LongPromptDoesNotFreezeARunningStream) {
  Scheduler sch(*rt_, config(2));
  std::mutex mu;
  int a_pieces = 0, a_pieces_at_b = -1;
  std::promise<void> a_started;
  bool signalled = false;
  Pending a = submit(sch, test::random_prompt(50, 20, vocab()), greedy(120), [&](std::string_view) {
    std::lock_guard lk(mu);
    ++a_pieces;
    if (!signalled) a_started.set_value(), signalled = true;
  });
  a_started.get_future().wait();
  // 448 tokens in chunks of 64: seven steps, each with one of a's tokens beside it.
  Pending b = submit(sch, test::random_prompt(51, 448, vocab()), greedy(4), [&](std::string_view) {
    std::lock_guard lk(mu);
    if (a_pieces_at_b < 0) a_pieces_at_b = a_pieces;
  });
  EXPECT_EQ(wait(b).reason, FinishReason::Length);
  EXPECT_EQ(wait(a).reason, FinishReason::Length);
  std::lock_guard lk(mu);
  EXPECT_GE(a_pieces_at_b, 1 + 6);  // a's first piece, then (at least) one for each of b's first six chunks
}

// A request cancelled while it generates ends at the next step and gives its blocks back; the one
// beside it is unaffected.
TEST_F(SchedulerTest, CancelledRequestFreesItsBlocks) {
  Scheduler sch(*rt_, config(2));
  const auto pa = test::random_prompt(1, 90, vocab()), pb = test::random_prompt(2, 50, vocab());
  // The flag exists before the request starts: its callbacks run on the scheduler's thread.
  Pending a0;
  const std::shared_ptr<std::atomic<bool>> flag = a0.cancel;
  std::atomic<int> pieces{0};
  Pending a = submit(sch, pa, greedy(300), [&pieces, flag](std::string_view) {
    if (++pieces == 3) flag->store(true);  // the client goes away after three pieces of text
  }, std::move(a0));
  Pending b = submit(sch, pb, greedy(30));
  const RequestResult ra = wait(a), rb = wait(b);
  EXPECT_EQ(ra.reason, FinishReason::Cancelled);
  EXPECT_LT(ra.completion_tokens, 300);
  EXPECT_GE(ra.completion_tokens, 3);
  EXPECT_EQ(rb.reason, FinishReason::Length);
  EXPECT_EQ(rb.tokens, alone(*rt_, config(2).session, pb, 30));
  sch.drain();
  EXPECT_EQ(sch.pool().blocks_in_use(), 0u);
  EXPECT_EQ(sch.stats().cancelled, 1u);
}

// A request cancelled before it starts never takes a block.
TEST_F(SchedulerTest, CancelledWhileQueued) {
  Scheduler sch(*rt_, config(1));
  Pending a = submit(sch, test::random_prompt(3, 40, vocab()), greedy(40));
  Pending b;
  b.cancel->store(true);
  Request r;
  r.prompt = test::random_prompt(4, 40, vocab());
  r.params = greedy(40);
  r.cancel = b.cancel;
  r.on_done = [d = b.done](const RequestResult& res) { d->set_value(res); };
  sch.submit(std::move(r));
  EXPECT_EQ(wait(b).reason, FinishReason::Cancelled);
  EXPECT_EQ(wait(a).reason, FinishReason::Length);
  sch.drain();
  EXPECT_EQ(sch.pool().blocks_in_use(), 0u);
}

// Room for about two of the five sequences at once (40 blocks; each ends holding 4 layers x 5
// blocks): the others wait, the youngest is preempted when the pool runs out, and all complete
// with the ids they get alone.
TEST_F(SchedulerTest, PoolTooSmallQueuesAndAllComplete) {
  SchedulerConfig c = config(4);
  const size_t block = size_t(c.session.kv.group_size) * 2 * size_t(rt_->model().kv_shape().kv_dim()) * sizeof(float);
  c.kv_budget_bytes = 40 * block;
  Scheduler sch(*rt_, c);
  ASSERT_LE(sch.pool().dense().capacity(), 40u);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Pending> pending;
  for (int i = 0; i < 5; ++i) {
    prompts.push_back(test::random_prompt(uint32_t(20 + i), 100, vocab()));
    pending.push_back(submit(sch, prompts.back(), greedy(40)));
  }
  for (int i = 0; i < 5; ++i) {
    const RequestResult r = wait(pending[size_t(i)]);
    EXPECT_EQ(r.reason, FinishReason::Length) << r.error;
    EXPECT_EQ(r.tokens, alone(*rt_, c.session, prompts[size_t(i)], 40)) << "request " << i;
  }
  sch.drain();
  EXPECT_EQ(sch.pool().blocks_in_use(), 0u);
}

// A prompt no pool of this size can hold is an error, not a hang.
TEST_F(SchedulerTest, PromptLargerThanThePoolFails) {
  SchedulerConfig c = config(2);
  const size_t block = size_t(c.session.kv.group_size) * 2 * size_t(rt_->model().kv_shape().kv_dim()) * sizeof(float);
  c.kv_budget_bytes = 8 * block;  // two blocks per layer: 64 tokens
  Scheduler sch(*rt_, c);
  Pending p = submit(sch, test::random_prompt(5, 200, vocab()), greedy(4));
  const RequestResult r = wait(p);
  EXPECT_EQ(r.reason, FinishReason::Error);
  EXPECT_NE(r.error.find("--kv-budget-mb"), std::string::npos) << r.error;
  sch.drain();
  EXPECT_EQ(sch.pool().blocks_in_use(), 0u);
}

// The same prompt twice: the second time its full blocks come from the pool (cached_tokens), and
// the reply is the same.
TEST_F(SchedulerTest, RepeatedPromptReportsCachedTokens) {
  Scheduler sch(*rt_, config(2));
  const auto p = test::random_prompt(6, 100, vocab());
  Pending first = submit(sch, p, greedy(12));
  const RequestResult r1 = wait(first);
  Pending second = submit(sch, p, greedy(12));
  const RequestResult r2 = wait(second);
  EXPECT_EQ(r1.cached_tokens, 0);
  // Two full blocks of 32 and 18 tokens of the third, copied: more would leave kMatmulSmallRows (17)
  // tokens or fewer to compute, which a batch matmul computes another way than the cold prompt's last
  // chunk of 36 (adoption_is_exact); the rest is computed.
  static_assert(kMatmulSmallRows == 17);
  EXPECT_EQ(r2.cached_tokens, 100 - (kMatmulSmallRows + 1));
  EXPECT_EQ(r2.tokens, r1.tokens);
  EXPECT_EQ(sch.stats().cached_tokens, 82u);
}

// Exact reuse goes up to the first differing token, as llama-server's does: a prompt diverging inside
// a block takes the tokens before the difference (copied from the block that holds them), and one
// going on past a finished request's history takes the whole history, its last block partly filled.
// Replies are those of a cold computation; no block is left held.
TEST_F(SchedulerTest, ExactReuseGoesUpToTheFirstDifferentToken) {
  Scheduler sch(*rt_, config(1));
  const auto p = test::random_prompt(8, 150, vocab());
  const RequestResult r1 = test::run_greedy(sch, p, 5);
  ASSERT_EQ(r1.tokens.size(), 5u);
  // Diverging at 140 (inside the block of tokens 128..159): 4 blocks adopted, 12 tokens copied.
  std::vector<int32_t> p2(p.begin(), p.begin() + 140);
  const auto other = test::random_prompt(9, 40, vocab());
  p2.insert(p2.end(), other.begin(), other.end());
  const RequestResult r2 = test::run_greedy(sch, p2, 8);
  EXPECT_EQ(r2.cached_tokens, 140);
  EXPECT_EQ(r2.tokens, alone(*rt_, config(1).session, p2, 8));
  // Going on past r1's history (its prompt and the 4 generated tokens it fed): the 150 tokens of its
  // prompt (its last block's 22 copied); the 4 a decode step computed are computed again.
  std::vector<int32_t> p3 = p;
  p3.insert(p3.end(), r1.tokens.begin(), r1.tokens.begin() + 4);
  const auto next = test::random_prompt(10, 30, vocab());
  p3.insert(p3.end(), next.begin(), next.end());
  const RequestResult r3 = test::run_greedy(sch, p3, 8);
  EXPECT_EQ(r3.cached_tokens, 150);
  EXPECT_EQ(r3.tokens, alone(*rt_, config(1).session, p3, 8));
  // Diverging at 110 with 66 tokens after it (64 + 2): the rest is cut 49 + 17, never leaving a
  // chunk of 16 tokens or fewer (the cold prompt's last chunk is 48): all 110 are taken.
  std::vector<int32_t> p4(p.begin(), p.begin() + 110);
  const auto after = test::random_prompt(11, 66, vocab());
  p4.insert(p4.end(), after.begin(), after.end());
  const RequestResult r4 = test::run_greedy(sch, p4, 8);
  EXPECT_EQ(r4.cached_tokens, 110);
  EXPECT_EQ(r4.tokens, alone(*rt_, config(1).session, p4, 8));
  sch.drain();
  EXPECT_EQ(sch.pool().blocks_in_use(), 0u);
}

// Requests arriving together over one long common prefix (a system prompt): prompts are prefilled
// one at a time, so each later one adopts the prefix the first computed, and replies are unchanged.
TEST_F(SchedulerTest, SimultaneousRequestsComputeASharedPrefixOnce) {
  Scheduler sch(*rt_, config(3));
  const auto system = test::random_prompt(60, 300, vocab());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Pending> pending;
  for (int i = 0; i < 3; ++i) {
    prompts.push_back(system);
    const auto tail = test::random_prompt(uint32_t(61 + i), 20, vocab());
    prompts.back().insert(prompts.back().end(), tail.begin(), tail.end());
    pending.push_back(submit(sch, prompts.back(), greedy(8)));
  }
  int64_t cached = 0;
  for (int i = 0; i < 3; ++i) {
    const RequestResult r = wait(pending[size_t(i)]);
    EXPECT_EQ(r.tokens, alone(*rt_, config(3).session, prompts[size_t(i)], 8)) << "request " << i;
    cached += r.cached_tokens;
  }
  EXPECT_EQ(cached, 2 * 300);  // two of the three take the prefix: nine full blocks of 32, 12 tokens copied
}

// A stop string ends the reply where it begins, with finish reason stop.
TEST_F(SchedulerTest, StopStringEndsTheReply) {
  const auto p = test::random_prompt(7, 30, vocab());
  const std::string full = rt_->tokenizer().decode(alone(*rt_, config(1).session, p, 40));
  ASSERT_GT(full.size(), 20u);
  const std::string stop = full.substr(full.size() / 2, 3);
  Scheduler sch(*rt_, config(1));
  GenerationParams g = greedy(40);
  g.stops = {stop};
  Pending pr = submit(sch, p, g);
  const RequestResult r = wait(pr);
  EXPECT_EQ(r.reason, FinishReason::Stop);
  EXPECT_EQ(r.stop_string, stop);
  EXPECT_EQ(r.text, full.substr(0, full.find(stop)));
}

TEST_F(SchedulerTest, BadRequestsFailAtOnce) {
  Scheduler sch(*rt_, config(1));
  Pending longer = submit(sch, test::random_prompt(8, 600, vocab()), greedy(4));
  const RequestResult r = wait(longer);
  EXPECT_EQ(r.reason, FinishReason::Error);
  EXPECT_NE(r.error.find("more than the context of 512"), std::string::npos) << r.error;
  Pending empty = submit(sch, {}, greedy(4));
  EXPECT_EQ(wait(empty).error, "the prompt is empty");
  Pending zero = submit(sch, test::random_prompt(9, 5, vocab()), greedy(0));
  EXPECT_EQ(wait(zero).reason, FinishReason::Error);
}

// stop() ends what is queued and running as cancelled, and later requests fail at once.
TEST_F(SchedulerTest, StopCancelsEverything) {
  auto sch = std::make_unique<Scheduler>(*rt_, config(1));
  std::vector<Pending> pending;
  for (int i = 0; i < 3; ++i) pending.push_back(submit(*sch, test::random_prompt(uint32_t(30 + i), 20, vocab()), greedy(400)));
  sch->stop();
  for (auto& p : pending) {
    const RequestResult r = wait(p);
    EXPECT_TRUE(r.reason == FinishReason::Cancelled || r.reason == FinishReason::Length);
  }
  Pending late = submit(*sch, test::random_prompt(40, 20, vocab()), greedy(4));
  const RequestResult r = wait(late);
  EXPECT_EQ(r.reason, FinishReason::Cancelled);
  EXPECT_EQ(r.error, "the server is shutting down");
  EXPECT_EQ(sch->pool().blocks_in_use(), 0u);
}

}  // namespace
}  // namespace ptllm

namespace ptllm {
namespace {

// A system prompt marked for pinning (Request::pin_tokens), then a burst of unrelated long prompts
// through a pool that holds about two sequences: with --kv-pin-mb the next request over the system
// prompt adopts it as before the burst (cached_tokens equal), without it the burst took its blocks.
// The reply is the same either way, and no block stays held but the pin's.
TEST_F(SchedulerTest, PinnedSystemPromptSurvivesABurstOfOtherPrompts) {
  const auto system = test::random_prompt(70, 200, vocab());
  auto with_user = [&](uint32_t seed) {
    std::vector<int32_t> p = system;
    const auto u = test::random_prompt(seed, 40, vocab());
    p.insert(p.end(), u.begin(), u.end());
    return p;
  };
  auto pinned = [&](std::vector<int32_t> prompt, Scheduler& sch) {
    Pending p;
    Request r;
    r.prompt = std::move(prompt);
    r.params = greedy(4);
    r.pin_tokens = int64_t(system.size());
    r.on_done = [d = p.done](const RequestResult& res) { d->set_value(res); };
    sch.submit(std::move(r));
    return wait(p);
  };
  const size_t block = size_t(32) * 2 * size_t(rt_->model().kv_shape().kv_dim()) * sizeof(float);
  int64_t cached_after[2] = {0, 0};
  std::vector<int32_t> reply[2];
  for (int pin = 0; pin < 2; ++pin) {
    SchedulerConfig c = config(2);
    c.kv_budget_bytes = 2 * 4 * 12 * block;  // 12 blocks a layer for two sequences
    c.pin_bytes = pin ? 4 * 7 * block : 0;    // the system prompt's 6 full blocks fit
    Scheduler sch(*rt_, c);
    const RequestResult first = pinned(with_user(1), sch);
    EXPECT_EQ(first.cached_tokens, 0);
    const RequestResult before = pinned(with_user(2), sch);
    EXPECT_EQ(before.cached_tokens, 200) << "pin " << pin;  // the system prompt: 6 full blocks, 8 tokens copied
    std::vector<Pending> burst;
    for (int i = 0; i < 12; ++i) burst.push_back(submit(sch, test::random_prompt(uint32_t(200 + i), 300, vocab()), greedy(2)));
    for (auto& b : burst) EXPECT_EQ(wait(b).reason, FinishReason::Length);
    const RequestResult after = pinned(with_user(3), sch);
    cached_after[pin] = after.cached_tokens;
    reply[pin] = after.tokens;
    sch.drain();
    const SchedulerStats st = sch.stats();
    EXPECT_EQ(st.pinned_prefixes, pin ? 1u : 0u);
    EXPECT_EQ(st.blocks_pinned, pin ? 6u * 4u : 0u);
    EXPECT_EQ(sch.pool().blocks_in_use(), st.blocks_pinned);  // nothing leaked beside the pin
  }
  EXPECT_EQ(cached_after[1], 192);  // pinned: as before the burst
  EXPECT_EQ(cached_after[0], 0);    // not pinned: the burst evicted it
  EXPECT_EQ(reply[0], reply[1]);
}

// The pins give way before a request fails: a pin budget as large as the pool still lets a prompt
// that needs the whole pool run (the pin released), and a budget above the pool is refused.
TEST_F(SchedulerTest, PinsGiveWayAndABudgetAboveThePoolIsRefused) {
  const size_t block = size_t(32) * 2 * size_t(rt_->model().kv_shape().kv_dim()) * sizeof(float);
  SchedulerConfig c = config(1);
  c.kv_budget_bytes = 4 * 16 * block;  // 16 blocks a layer: 512 tokens
  c.pin_bytes = 4 * 16 * block;
  {
    Scheduler sch(*rt_, c);
    const auto system = test::random_prompt(80, 300, vocab());
    for (size_t i = 0; i < 2; ++i) {  // the second request over a prefix pins it
      Pending p;
      Request r;
      r.prompt = system;
      r.params = greedy(2);
      r.pin_tokens = 300;
      r.on_done = [d = p.done](const RequestResult& res) { d->set_value(res); };
      sch.submit(std::move(r));
      EXPECT_EQ(wait(p).reason, FinishReason::Length);
      EXPECT_EQ(sch.stats().pinned_prefixes, i);
    }
    Pending big = submit(sch, test::random_prompt(81, 480, vocab()), greedy(4));
    const RequestResult rb = wait(big);
    EXPECT_EQ(rb.reason, FinishReason::Length) << rb.error;
    sch.drain();
    EXPECT_EQ(sch.stats().pinned_prefixes, 0u);
    EXPECT_EQ(sch.pool().blocks_in_use(), 0u);
  }
  c.pin_bytes = 4 * 17 * block + (size_t(2) << 20);
  try {
    Scheduler sch(*rt_, c);
    ADD_FAILURE() << "a pin budget above the pool was taken";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-pin-mb"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("more than the KV pool"), std::string::npos) << e.what();
  }
}

// Eviction by role: a history of a system prompt (6 blocks), a user turn (4) and a tool output (5)
// in a pool of 24 blocks a layer; bursts of unrelated prompts take the tool output's blocks first,
// then the user turn's (before the burst's own, released later), never the system prompt's while
// anything else is cached. Without roles (every block User) the least recently released go first:
// the history's first blocks, and with them every prefix.
TEST_F(SchedulerTest, EvictionTakesToolOutputsThenUserTurnsThenTheSystemPrompt) {
  const size_t block = size_t(32) * 2 * size_t(rt_->model().kv_shape().kv_dim()) * sizeof(float);
  const auto history = test::random_prompt(90, 480, vocab());
  const std::vector<RetentionSpan> roles = {
      {192, Retention::System}, {320, Retention::User}, {480, Retention::Transient}};
  auto run = [&](Scheduler& sch, std::vector<RetentionSpan> spans) {
    Pending p;
    Request r;
    r.prompt = history;
    r.params = greedy(2);
    r.retention = std::move(spans);
    r.on_done = [d = p.done](const RequestResult& res) { d->set_value(res); };
    sch.submit(std::move(r));
    return wait(p);
  };
  // bursts: prompts of 300 tokens (10 blocks a layer each, with their reply), one after another.
  auto scenario = [&](bool with_roles, int bursts, int64_t* adopted, SchedulerStats* after_burst) {
    SchedulerConfig c = config(1);
    c.kv_budget_bytes = 4 * 24 * block;
    Scheduler sch(*rt_, c);
    const RequestResult first = run(sch, with_roles ? roles : std::vector<RetentionSpan>{});
    EXPECT_EQ(first.cached_tokens, 0);
    const SchedulerStats st = sch.stats();  // taken before a reply goes out (finish)
    EXPECT_EQ(st.blocks_cached, 15u * 4u);  // 481 tokens fed: 15 full blocks in each of 4 layers
    if (with_roles) {
      EXPECT_EQ(st.blocks_cached_by[int(Retention::System)], 6u * 4u);
      EXPECT_EQ(st.blocks_cached_by[int(Retention::User)], 4u * 4u);
      EXPECT_EQ(st.blocks_cached_by[int(Retention::Transient)], 5u * 4u);
    }
    for (int i = 0; i < bursts; ++i) {
      Pending b = submit(sch, test::random_prompt(uint32_t(300 + i), 300, vocab()), greedy(2));
      EXPECT_EQ(wait(b).reason, FinishReason::Length);
    }
    *after_burst = sch.stats();
    EXPECT_EQ(after_burst->blocks_used, 0u);  // nothing leaked
    *adopted = run(sch, with_roles ? roles : std::vector<RetentionSpan>{}).cached_tokens;
    sch.drain();
    EXPECT_EQ(sch.pool().blocks_in_use(), 0u);
  };
  int64_t adopted = -1;
  SchedulerStats st;
  // A burst takes 40 blocks (301 tokens fed: 10 a layer) and leaves them cached (its last, partial
  // block published with the 12 tokens its prompt's chunk computed).
  // One burst: 36 free blocks, then 4 of the tool output's (layer 0's first four of it).
  scenario(true, 1, &adopted, &st);
  EXPECT_EQ(st.blocks_cached_by[int(Retention::Transient)], 16u);
  EXPECT_EQ(st.blocks_cached_by[int(Retention::User)], 16u + 40u);  // the history's and the burst's
  EXPECT_EQ(st.blocks_cached_by[int(Retention::System)], 24u);
  EXPECT_EQ(adopted, 320);  // the system prompt and the user turn
  // Two bursts: the second takes the 16 left of the tool output, the user turn's 16 (released before
  // the first burst's), then 8 of the first burst's.
  scenario(true, 2, &adopted, &st);
  EXPECT_EQ(st.blocks_cached_by[int(Retention::Transient)], 0u);
  EXPECT_EQ(st.blocks_cached_by[int(Retention::User)], 32u + 40u);
  EXPECT_EQ(st.blocks_cached_by[int(Retention::System)], 24u);
  EXPECT_EQ(adopted, 192);  // the system prompt
  // Without roles, one burst takes the least recently released: the history's first blocks.
  scenario(false, 1, &adopted, &st);
  EXPECT_EQ(adopted, 0);
}

}  // namespace
}  // namespace ptllm
