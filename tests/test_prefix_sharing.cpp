// Prefix sharing on one KV pool: the block pool's references, keys and cache (mechanism), and
// sessions that take a common prefix's blocks instead of computing them, giving what a private
// computation gives, leaving no reference behind, and refusing a step the pool has no room for.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "core/thread_pool.h"
#include "engine/session.h"
#include "engine/spill.h"
#include "tokenizer/tokenizer.h"
#include "kv/block_pool.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "test_greedy.h"
#include "test_util.h"

namespace ptllm {
namespace {

TEST(BlockPoolKeys, ReferencesKeysAndTheCache) {
  BlockPool pool(64, 3, true, 4);
  const int32_t a = pool.acquire(), b = pool.acquire();
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  const std::vector<int32_t> ta{1, 2, 3, 4}, tb{5, 6, 7, 8};
  const BlockKey ka{11, 12, 0, false}, kb{21, 22, 0, false};
  EXPECT_TRUE(pool.publish(a, ka, ta));
  EXPECT_FALSE(pool.publish(b, ka, tb));  // one block per key
  EXPECT_TRUE(pool.publish(b, kb, tb));
  EXPECT_EQ(pool.find(ka, ta), a);  // a second reference
  EXPECT_EQ(pool.refs(a), 2);
  pool.release(a);
  pool.release(a);  // the last reference: a stays findable
  EXPECT_EQ(pool.in_use(), 1u);
  EXPECT_EQ(pool.cached(), 1u);
  EXPECT_EQ(pool.find(ka, ta), a);  // revived from the cache
  EXPECT_EQ(pool.cached(), 0u);
  pool.release(a);
  pool.release(b);
  // Three blocks, two cached: acquiring takes the free one first, then the least recently released.
  const int32_t c = pool.acquire();
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  EXPECT_EQ(pool.acquire(), a);
  EXPECT_EQ(pool.find(ka, ta), -1);  // a's content is forgotten
  EXPECT_EQ(pool.find(kb, tb), b);
  EXPECT_EQ(pool.acquire(), -1);     // every block referenced: a return value, not a crash
  EXPECT_EQ(pool.available(), 0u);
}

// Two different contents forced onto one key (what a hash collision would be) are a miss: the hit
// is decided by the block's own token ids, never by the hash alone.
TEST(BlockPoolKeys, ACollidingKeyWithOtherTokensIsAMiss) {
  BlockPool pool(64, 4, false, 4);
  const int32_t a = pool.acquire();
  const BlockKey k{7, 7, 3, false};
  ASSERT_TRUE(pool.publish(a, k, std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(pool.find(k, std::vector<int32_t>{1, 2, 3, 5}), -1);
  EXPECT_EQ(pool.find(k, std::vector<int32_t>{1, 2, 3}), -1);  // a shorter content is another one
  EXPECT_EQ(pool.find({7, 7, 2, false}, std::vector<int32_t>{1, 2, 3, 4}), -1);  // another layer
  EXPECT_EQ(pool.find({7, 7, 3, true}, std::vector<int32_t>{1, 2, 3, 4}), -1);   // its KIVI group
  EXPECT_EQ(pool.find(k, std::vector<int32_t>{1, 2, 3, 4}), a);  // a second reference
  pool.release(a);
  pool.unpublish(a);  // its one holder is about to write into it
  EXPECT_EQ(pool.find(k, std::vector<int32_t>{1, 2, 3, 4}), -1);
}

// The parent index: of the blocks published under a parent key (in one layer and form), find_child
// takes the one sharing the longest prefix with the tokens asked for (a shorter block's tokens
// included), with a reference; none sharing a first token, another layer, the other form or a
// forgotten block is a miss.
TEST(BlockPoolKeys, FindChildTakesTheLongestSharedPrefix) {
  BlockPool pool(64, 4, false, 4);
  const BlockHash parent{5, 6};
  const int32_t a = pool.acquire(), b = pool.acquire(), c = pool.acquire();
  ASSERT_TRUE(pool.publish(a, {1, 1, 0, false}, std::vector<int32_t>{1, 2, 3, 4}, Retention::User, &parent));
  ASSERT_TRUE(pool.publish(b, {2, 2, 0, false}, std::vector<int32_t>{1, 2, 5, 6}, Retention::User, &parent));
  ASSERT_TRUE(pool.publish(c, {3, 3, 0, false}, std::vector<int32_t>{1, 9}, Retention::User, &parent));
  for (int32_t id : {a, b, c}) pool.release(id);  // cached: found all the same
  size_t common = 0;
  EXPECT_EQ(pool.find_child(parent, 0, false, std::vector<int32_t>{1, 2, 5, 7}, &common), b);
  EXPECT_EQ(common, 3u);
  EXPECT_EQ(pool.refs(b), 1);
  EXPECT_EQ(pool.find_child(parent, 0, false, std::vector<int32_t>{1, 9, 9}, &common), c);
  EXPECT_EQ(common, 2u);  // the short block's two tokens, not past them
  EXPECT_EQ(pool.find_child(parent, 0, false, std::vector<int32_t>{1, 2, 3}, &common), a);
  EXPECT_EQ(common, 3u);
  EXPECT_EQ(pool.find_child(parent, 0, false, std::vector<int32_t>{7, 2}, &common), -1);
  EXPECT_EQ(common, 0u);
  EXPECT_EQ(pool.find_child(parent, 1, false, std::vector<int32_t>{1, 2}, &common), -1);
  EXPECT_EQ(pool.find_child(parent, 0, true, std::vector<int32_t>{1, 2}, &common), -1);
  EXPECT_EQ(pool.find_child({5, 7}, 0, false, std::vector<int32_t>{1, 2}, &common), -1);
  for (int32_t id : {a, b, c}) pool.release(id);
  // Four acquisitions: the free block, then the three cached ones, their keys forgotten.
  for (int i = 0; i < 4; ++i) EXPECT_GE(pool.acquire(), 0);
  EXPECT_EQ(pool.find_child(parent, 0, false, std::vector<int32_t>{1, 2}, &common), -1);
}

// Cached blocks go by retention class, lowest first (transient, then user, then system), least
// recently released first within a class; a revived block leaves its class's list.
TEST(BlockPoolKeys, EvictionGoesByRetentionClassThenRecency) {
  BlockPool pool(64, 6, false, 1);
  const Retention order[6] = {Retention::System, Retention::Transient, Retention::User,
                              Retention::Transient, Retention::System, Retention::User};
  std::vector<int32_t> ids;
  for (int i = 0; i < 6; ++i) {
    ids.push_back(pool.acquire());
    ASSERT_TRUE(pool.publish(ids.back(), {uint64_t(i + 1), 0, 0, false}, std::vector<int32_t>{i}, order[i]));
  }
  pool.set_retention(ids[5], Retention::Transient);  // a later holder's class (set while referenced)
  EXPECT_EQ(pool.retention(ids[5]), Retention::Transient);
  for (int i : {0, 1, 2, 3, 4, 5}) pool.release(ids[size_t(i)]);
  EXPECT_EQ(pool.cached(), 6u);
  EXPECT_EQ(pool.cached(Retention::Transient), 3u);
  EXPECT_EQ(pool.cached(Retention::User), 1u);
  EXPECT_EQ(pool.cached(Retention::System), 2u);
  EXPECT_EQ(pool.find({4, 0, 0, false}, std::vector<int32_t>{3}), ids[3]);  // revived: out of the lists
  EXPECT_EQ(pool.cached(Retention::Transient), 2u);
  // Transient in release order (1, 5), then user (2), then system (0, 4); 3 is referenced.
  for (int want : {1, 5, 2, 0, 4}) {
    EXPECT_EQ(pool.acquire(), ids[size_t(want)]) << want;
    EXPECT_EQ(pool.find({uint64_t(want + 1), 0, 0, false}, std::vector<int32_t>{want}), -1);  // forgotten
  }
  EXPECT_EQ(pool.acquire(), -1);
  EXPECT_EQ(pool.cached(), 0u);
  for (Retention r : {Retention::Transient, Retention::User, Retention::System}) EXPECT_EQ(pool.cached(r), 0u);
  EXPECT_EQ(pool.in_use(), 6u);
}

struct Case {
  KVPrecision precision;
  int sink, window;
  PositionMode positions;
};

class SharedPrefix : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(test::repo_model("kjv-tiny")).release(); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  SessionOptions options() const {
    SessionOptions o;
    o.kv.precision = GetParam().precision;
    o.kv.sink = GetParam().sink;
    o.kv.window = GetParam().window;
    o.kv.positions = GetParam().positions;
    o.kv.residual = 32;
    o.kv.ctx_size = 640;
    return o;
  }
  std::vector<int32_t> prompt(uint32_t seed, size_t n) const {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> id(3, model_->config().vocab_size - 1);
    std::vector<int32_t> p(n);
    for (auto& x : p) x = id(rng);
    return p;
  }
  static Model* model_;
};
Model* SharedPrefix::model_ = nullptr;

bool dense(KVPrecision p) { return !is_kivi(p); }

// Greedy continuation of `p` for `steps` tokens; returns the ids and the last logits.
std::pair<std::vector<int32_t>, std::vector<float>> continue_greedy(Session& s, const std::vector<int32_t>& p,
                                                                    int steps) {
  test::Greedy g = test::greedy(s, p, steps);
  return {std::move(g.ids), std::move(g.last_logits)};
}

TEST_P(SharedPrefix, SharedEqualsPrivateAndLeavesNoReference) {
  ThreadPool pool(2);
  KVPool kv(model_->kv_shape(), options().kv, 3);
  const std::vector<int32_t> first = prompt(1, 300);
  std::vector<int32_t> second(first.begin(), first.begin() + 230);
  const auto tail = prompt(2, 41);
  second.insert(second.end(), tail.begin(), tail.end());
  {
    Session a(*model_, options(), pool, &kv);
    continue_greedy(a, first, 20);
    EXPECT_EQ(a.reused_tokens(), 0);
    Session b(*model_, options(), pool, &kv);
    const auto [ids_b, logits_b] = continue_greedy(b, second, 30);
    Session priv(*model_, options(), pool);
    const auto [ids_p, logits_p] = continue_greedy(priv, second, 30);
    // Without sinks the common blocks are whole blocks of 32 within the 230 common tokens; with
    // StreamingLLM's 4 sinks a short first block shifts them.
    const int64_t want = GetParam().window ? 4 + (230 - 4) / 32 * 32 : 230 / 32 * 32;
    EXPECT_EQ(b.reused_tokens(), 0);  // counts the last feed (a decode step)
    EXPECT_EQ(ids_b, ids_p);
    if (dense(GetParam().precision)) {
      EXPECT_EQ(std::memcmp(logits_b.data(), logits_p.data(), logits_p.size() * sizeof(float)), 0);
    } else {
      double worst = 0;
      for (size_t i = 0; i < logits_p.size(); ++i) worst = std::max(worst, double(std::fabs(logits_b[i] - logits_p[i])));
      // KIVI's groups are quantized when the policy runs, after each chunk: the shared tail is
      // chunked from another start than the private prompt, so a query may see a group in the
      // other precision. The ids above agree; the logits within the quantization's own noise.
      EXPECT_LT(worst, GetParam().precision == KVPrecision::Int2 ? 0.5 : 5e-2);
    }
    // A third sequence with the whole first prompt takes every full block of it.
    Session c(*model_, options(), pool, &kv);
    c.feed(first);
    EXPECT_GE(c.reused_tokens(), want);
    EXPECT_GT(kv.shared_bytes(), 0u);
  }
  EXPECT_EQ(kv.dense().in_use(), 0u);
  EXPECT_EQ(kv.quant().in_use(), 0u);
}

// A prompt that diverges inside a block another sequence holds takes the tokens before the first
// difference by copying that block into one of its own (the holder's bytes unchanged); a prompt that
// goes on past a finished sequence's last, partly filled block takes its tokens the same way (those a
// prompt's batch computed, not a decode step's).
// Dense caches then give a private computation's logits bit for bit. Under KIVI a prefix ends on
// whole blocks (no partial block is taken). No reference is left behind.
TEST_P(SharedPrefix, PartialBlockIsCopiedUpToTheFirstDifference) {
  ThreadPool pool(2);
  KVPool kv(model_->kv_shape(), options().kv, 3);
  const bool kivi = !dense(GetParam().precision);
  const int64_t sinks = GetParam().window > 0 ? 4 : 0;
  const std::vector<int32_t> first = prompt(1, 300);
  std::vector<int32_t> second(first.begin(), first.begin() + 230);
  const auto tail = prompt(2, 41);
  second.insert(second.end(), tail.begin(), tail.end());
  ASSERT_NE(first[230], second[230]);
  // p fed to s (drawing from kv), then 12 greedy steps, against the same on a private session: the
  // tokens adopted, and every step's argmax and the last logits equal (bit for bit when dense).
  auto run_and_compare = [&](Session& s, const std::vector<int32_t>& p, const char* what) {
    SCOPED_TRACE(what);
    std::span<float> lg = s.feed(p);
    const int64_t reused = s.reused_tokens();
    Session priv(*model_, options(), pool);
    std::span<float> lp = priv.feed(p);
    for (int i = 0; i < 12; ++i) {
      if (!kivi) {
        EXPECT_EQ(std::memcmp(lg.data(), lp.data(), lp.size_bytes()), 0) << "step " << i;
      }
      const int32_t next = argmax(lg);
      EXPECT_EQ(next, argmax(lp)) << "step " << i;
      lg = s.feed({&next, 1});
      lp = priv.feed({&next, 1});
    }
    return reused;
  };
  std::vector<int32_t> a_history;
  {
    Session a(*model_, options(), pool, &kv);
    test::greedy(a, first, 10);  // 310 tokens: the last block partly filled
    a_history = a.history();
    const int D = model_->kv_shape().head_dim;
    std::vector<float> before(size_t(D) * 32), after(size_t(D) * 32);
    for (int t = 0; t < 32; ++t) a.cache().read_key(0, 224 + t, 0, before.data() + t * D);
    {
      Session b(*model_, options(), pool, &kv);
      const int64_t reused = run_and_compare(b, second, "diverging inside a block");
      if (kivi)
        EXPECT_TRUE(reused == 0 || (reused - sinks) % 32 == 0) << reused;  // whole blocks only
      else
        EXPECT_EQ(reused, 230);  // 7 blocks (6 and the sinks under StreamingLLM), the rest copied
    }
    // b wrote its copy from token 230 on: a's block of tokens 224..255 is as a computed it.
    for (int t = 0; t < 32; ++t) a.cache().read_key(0, 224 + t, 0, after.data() + t * D);
    EXPECT_EQ(before, after);
  }
  // a is gone: its last block (tokens 288..309; 292..309 after 4 sinks) was published up to the
  // tokens its decode steps computed (a one-row step computes a row another way than a prompt's
  // batch: computing them again gives the cold prompt's bits), and a prompt going on past a's whole
  // history copies the first 12 (8) of them.
  std::vector<int32_t> third = a_history;
  const auto more = prompt(3, 30);
  third.insert(third.end(), more.begin(), more.end());
  {
    Session c(*model_, options(), pool, &kv);
    const int64_t reused = run_and_compare(c, third, "past a finished sequence's last block");
    if (kivi)
      EXPECT_TRUE(reused == 0 || (reused - sinks) % 32 == 0) << reused;
    else
      EXPECT_EQ(reused, 300);
  }
  EXPECT_EQ(kv.dense().in_use(), 0u);
  EXPECT_EQ(kv.quant().in_use(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, SharedPrefix,
    ::testing::Values(Case{KVPrecision::F32, 0, 0, PositionMode::Absolute}, Case{KVPrecision::F16, 0, 0, PositionMode::Absolute},
                      Case{KVPrecision::BF16, 0, 0, PositionMode::Cache}, Case{KVPrecision::Int8, 0, 0, PositionMode::Absolute},
                      Case{KVPrecision::Int4, 0, 0, PositionMode::Absolute}, Case{KVPrecision::Int2, 0, 0, PositionMode::Cache},
                      Case{KVPrecision::F32, 4, 400, PositionMode::Cache}, Case{KVPrecision::Int4, 4, 400, PositionMode::Absolute}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::string(kv_precision_name(info.param.precision)) + (info.param.window ? "_streaming_" : "_") +
             std::string(position_mode_name(info.param.positions));
    });

// Sixteen sequences with a 1,000-token prefix in common hold one copy of its blocks.
TEST(SharedPrefixMemory, SixteenSequencesHoldThePrefixOnce) {
  auto model = Model::load(test::repo_model("kjv-tiny"));
  ThreadPool pool(2);
  SessionOptions o;
  o.kv.ctx_size = 1100;
  o.kv.preallocate = false;
  KVPool kv(model->kv_shape(), o.kv, 16);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> id(3, model->config().vocab_size - 1);
  std::vector<int32_t> prefix(1000);
  for (auto& x : prefix) x = id(rng);
  std::vector<std::unique_ptr<Session>> seqs;
  size_t one_sequence = 0;
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> p = prefix;
    for (int t = 0; t < 20; ++t) p.push_back(id(rng));
    seqs.push_back(std::make_unique<Session>(*model, o, pool, &kv));
    seqs.back()->feed(p);
    if (i == 0) one_sequence = kv.used_bytes();
    if (i > 0) {
      EXPECT_EQ(seqs.back()->reused_tokens(), 992);
    }
  }
  size_t logical = 0;
  for (const auto& s : seqs) logical += s->cache().logical_bytes();
  EXPECT_EQ(logical, 16 * seqs[0]->cache().logical_bytes());
  // One copy of the 31 common blocks per layer plus each sequence's own last block (its 28 tokens).
  const size_t block = kv.dense().block_bytes(), layers = size_t(model->config().n_layers);
  EXPECT_EQ(kv.used_bytes(), layers * (31 + 16) * block);
  EXPECT_LT(kv.used_bytes(), 2 * one_sequence);
  seqs.clear();
  EXPECT_EQ(kv.dense().in_use(), 0u);
}

// A model whose layers slide (mistral-swa-tiny, window 64): sequences on one pool sharing a prefix
// longer than the window give what each gives alone (bit for bit with a dense cache, within the
// quantization's noise with KIVI), a third sequence with the first one's whole prompt takes the
// blocks still in its window (and the ones left cached) instead of computing them, and no
// reference is left behind.
TEST(SharedPrefixSliding, SlidingLayersShareAndEqualPrivate) {
  const auto dir = test::shared_model("mistral-swa-tiny");
  if (!std::filesystem::exists(dir / "config.json")) GTEST_SKIP() << dir << " not present";
  auto model = Model::load(dir);
  ASSERT_EQ(model->kv_shape().layer_window.at(0), 64);
  ThreadPool pool(2);
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> id(3, model->config().vocab_size - 1);
  std::vector<int32_t> first(300);
  for (auto& x : first) x = id(rng);
  std::vector<int32_t> second(first.begin(), first.begin() + 230);
  for (int i = 0; i < 41; ++i) second.push_back(id(rng));
  for (KVPrecision p : {KVPrecision::F32, KVPrecision::Int4}) {
    SessionOptions o;
    o.kv.precision = p;
    o.kv.residual = 32;
    o.kv.ctx_size = 640;
    KVPool kv(model->kv_shape(), o.kv, 3);
    {
      Session a(*model, o, pool, &kv);
      continue_greedy(a, first, 20);
      Session b(*model, o, pool, &kv);
      const auto [ids_b, logits_b] = continue_greedy(b, second, 30);
      Session priv(*model, o, pool);
      const auto [ids_p, logits_p] = continue_greedy(priv, second, 30);
      EXPECT_EQ(ids_b, ids_p) << kv_precision_name(p);
      double worst = 0;
      for (size_t i = 0; i < logits_p.size(); ++i) worst = std::max(worst, double(std::fabs(logits_b[i] - logits_p[i])));
      EXPECT_LT(worst, dense(p) ? 1e-30 : 5e-2);
      Session c(*model, o, pool, &kv);
      const auto got = c.feed(first);
      EXPECT_GT(c.reused_tokens(), 0) << kv_precision_name(p);
      Session pc(*model, o, pool);
      const auto want = pc.feed(first);
      if (dense(p)) {
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size_bytes()), 0);
      }
      // A sliding layer holds its window, not the whole prompt.
      EXPECT_LE(c.cache().held_tokens(0), 64 + 2 * o.kv.group_size);
    }
    EXPECT_EQ(kv.dense().in_use() + kv.quant().in_use(), 0u) << kv_precision_name(p);
  }
}

// A pool with room for less than the batch: the step is refused before anything is written, the
// sequences are as they were, and a sequence that ends gives its blocks back for the others.
TEST(SharedPool, RunningOutIsRefusedCleanly) {
  auto model = Model::load(test::repo_model("kjv-tiny"));
  ThreadPool pool(1);
  SessionOptions o;
  o.kv.ctx_size = 256;
  const size_t dense_bytes = size_t(o.kv.group_size) * 2 * size_t(model->config().kv_dim()) * sizeof(float);
  const size_t layers = size_t(model->config().n_layers);
  KVPool kv(model->kv_shape(), o.kv, 1, layers * 10 * dense_bytes);  // 10 blocks a layer
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> id(3, model->config().vocab_size - 1);
  auto random = [&](size_t n) {
    std::vector<int32_t> p(n);
    for (auto& x : p) x = id(rng);
    return p;
  };
  auto a = std::make_unique<Session>(*model, o, pool, &kv);
  Session b(*model, o, pool, &kv);
  a->feed(random(200));  // 7 blocks a layer
  EXPECT_THROW(b.feed(random(100)), KVPoolFull);
  EXPECT_EQ(b.position(), 0);
  // a goes on unharmed, as a private sequence would.
  const int32_t next = argmax(a->last_logits());
  EXPECT_NO_THROW(a->feed({&next, 1}));
  a.reset();  // its blocks go back
  EXPECT_NO_THROW(b.feed(random(100)));
}

// A batch the pool cannot hold is refused whole, mid-generation, with nothing written. Spilling one
// sequence to disk gives its blocks back: the others go on, each exactly as it would alone, and the
// spilled one, restored when another ends, goes on as if it had never left.
TEST(SharedPool, RunningOutMidBatchSpillsASequence) {
  auto model = Model::load(test::repo_model("kjv-tiny"));
  const Tokenizer tok = Tokenizer::load(test::repo_model("kjv-tiny"));
  ThreadPool pool(2);
  SessionOptions o;
  o.kv.ctx_size = 256;
  const size_t block = size_t(o.kv.group_size) * 2 * size_t(model->config().kv_dim()) * sizeof(float);
  const size_t layers = size_t(model->config().n_layers);
  KVPool kv(model->kv_shape(), o.kv, 1, layers * 9 * block);  // 9 blocks a layer for 3 sequences
  test::TempDir dir;
  const PromptCacheIdentity id = prompt_cache_identity(*model, tok, o.kv);
  std::vector<std::unique_ptr<Session>> s;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) {
    prompts.push_back(std::vector<int32_t>(size_t(40 + 10 * i)));
    for (size_t t = 0; t < prompts.back().size(); ++t) prompts.back()[t] = int32_t(11 + 31 * i + 17 * t);
    s.push_back(std::make_unique<Session>(*model, o, pool, &kv));
    s.back()->feed(prompts.back());
  }
  std::vector<std::vector<int32_t>> ids(3);
  ForwardState st;
  std::vector<Session*> batch{s[0].get(), s[1].get(), s[2].get()};
  bool spilled = false;
  for (int step = 0; step < 60;) {
    std::vector<int32_t> next;
    std::vector<std::span<const int32_t>> feeds;
    for (Session* x : batch) next.push_back(argmax(x->last_logits()));
    for (size_t i = 0; i < batch.size(); ++i) feeds.emplace_back(&next[i], 1);
    try {
      Session::feed_batch(batch, feeds, st);
    } catch (const KVPoolFull&) {
      ASSERT_FALSE(spilled) << "refused again after a spill";
      spilled = true;
      spill_session(*s[2], id, dir.path / "s2.kvcache");
      s[2].reset();  // its blocks go back
      batch.pop_back();
      continue;
    }
    for (size_t i = 0; i < batch.size(); ++i) ids[i].push_back(next[i]);
    ++step;
  }
  ASSERT_TRUE(spilled) << "the budget was meant to run out";
  s[0].reset();  // one ends: the spilled one comes back
  s[2] = std::make_unique<Session>(*model, o, pool, &kv);
  restore_session(*s[2], id, dir.path / "s2.kvcache");
  while (ids[2].size() < 60) {
    ids[2].push_back(argmax(s[2]->last_logits()));
    s[2]->feed({&ids[2].back(), 1});
  }
  for (int i = 0; i < 3; ++i) {  // every sequence equals its private run
    Session alone(*model, o, pool);
    auto lg = alone.feed(prompts[size_t(i)]);
    for (size_t t = 0; t < ids[size_t(i)].size(); ++t) {
      ASSERT_EQ(argmax(lg), ids[size_t(i)][t]) << "sequence " << i << " step " << t;
      lg = alone.feed({&ids[size_t(i)][t], 1});
    }
  }
}

// A session rewound to an earlier point and fed again equals one that never went further, also
// when the rewind lands inside a block other sequences share (it is copied, never written).
TEST(SharedPool, RewindInsideASharedBlock) {
  auto model = Model::load(test::repo_model("kjv-tiny"));
  ThreadPool pool(1);
  SessionOptions o;
  o.kv.ctx_size = 256;
  KVPool kv(model->kv_shape(), o.kv, 3);
  std::vector<int32_t> p(100);
  for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t(5 + 7 * i % 4000);
  Session a(*model, o, pool, &kv), b(*model, o, pool, &kv);
  a.feed(p);
  b.feed(p);
  ASSERT_EQ(b.reused_tokens(), 96);
  b.truncate(50);  // inside the second block, which a holds too
  EXPECT_TRUE(b.last_logits().empty());
  std::vector<int32_t> other(p.begin(), p.begin() + 50);
  for (int i = 0; i < 30; ++i) other.push_back(int32_t(1000 + i));
  const auto got = b.feed(std::span(other).subspan(50));
  Session fresh(*model, o, pool);
  const auto want = fresh.feed(other);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size_bytes()), 0);
  // a's blocks were not written: it continues as a private run of p does.
  const int32_t next = 3;
  const auto ga = a.feed({&next, 1});
  Session pa(*model, o, pool);
  pa.feed(p);
  const auto wa = pa.feed({&next, 1});
  EXPECT_EQ(std::memcmp(ga.data(), wa.data(), wa.size_bytes()), 0);
  EXPECT_THROW(b.truncate(81), Error);
}

// A sequence spilled to disk gives its blocks back; restored on the same pool it goes on exactly as
// if it had never left.
TEST(SharedPool, SpilledSequenceResumesExactly) {
  auto model = Model::load(test::repo_model("kjv-tiny"));
  const Tokenizer tok = Tokenizer::load(test::repo_model("kjv-tiny"));
  ThreadPool pool(2);
  for (KVPrecision p : {KVPrecision::F32, KVPrecision::Int4}) {
    SessionOptions o;
    o.kv.precision = p;
    o.kv.residual = 32;
    o.kv.ctx_size = 512;
    KVPool kv(model->kv_shape(), o.kv, 2);
    const std::vector<int32_t> prompt = tok.encode("In the beginning God created the heaven and the earth.");
    auto run = [&](Session& s, int steps, std::vector<int32_t>& ids) {
      for (int i = 0; i < steps; ++i) {
        ids.push_back(argmax(s.last_logits()));
        s.feed({&ids.back(), 1});
      }
    };
    std::vector<int32_t> straight, resumed;
    {
      Session s(*model, o, pool, &kv);
      s.feed(prompt);
      run(s, 80, straight);
    }
    test::TempDir dir;
    const auto file = dir.path / "seq.kvcache";
    const PromptCacheIdentity id = prompt_cache_identity(*model, tok, o.kv);
    {
      Session s(*model, o, pool, &kv);
      s.feed(prompt);
      run(s, 40, resumed);
      EXPECT_GT(spill_session(s, id, file), 0u);
    }
    EXPECT_EQ(kv.dense().in_use() + kv.quant().in_use(), 0u);  // spilled: nothing held
    Session back(*model, o, pool, &kv);
    restore_session(back, id, file);
    run(back, 40, resumed);
    EXPECT_EQ(resumed, straight) << kv_precision_name(p);
    // A file from other KV settings is refused by name, and the session stays empty.
    SessionOptions other = o;
    other.kv.residual = 64;
    Session wrong(*model, other, pool);
    try {
      restore_session(wrong, prompt_cache_identity(*model, tok, other.kv), file);
      ADD_FAILURE() << "restored a state saved with other settings";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
    }
    EXPECT_EQ(wrong.position(), 0);
  }
}

}  // namespace
}  // namespace ptllm
