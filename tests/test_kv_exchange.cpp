// Token blocks exchanged through a block store under every KV setting: one pool
// computes a prompt and puts its blocks, a fresh pool (another replica, or the same server after a
// restart) loads them, adopts them and continues: the tokens and the logits are bit for bit those of a
// cold computation. KIVI's groups travel as they are (int codes, scales and zeros), the residual in
// full precision; StreamingLLM's sink blocks (shorter when the group does not divide the sinks)
// and stream blocks, and sliding-window layers, adopt no more than their rings hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <random>

#include "core/thread_pool.h"
#include "persist/kv_store.h"
#include "engine/session.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "test_greedy.h"
#include "test_memory_store.h"
#include "test_scheduler_util.h"
#include "test_util.h"

namespace ptllm {
namespace {

struct Setting {
  const char* name;
  const char* model;  // under models/ (or ../shared/models: skipped when absent)
  bool shared;
  const char* kv;     // parse_kv_config's text
};

std::filesystem::path model_dir(const Setting& s) {
  return s.shared ? test::shared_model(s.model) : test::repo_model(s.model);
}

// The prefixes a fresh session may adopt of an n-token prompt and give a cold computation's output
// (Scheduler::exact): Session::feed cuts the rest into appends of max_chunk() tokens.
std::function<bool(int64_t)> exact_for(const Session& s, size_t n) {
  const int64_t chunk = s.max_chunk(), grid = s.cache().cut_dependent() ? s.max_chunk() : 1;
  return [=](int64_t a) { return a < int64_t(n) && adoption_is_exact(int64_t(n), a, chunk, grid); };
}

// Feeds `prompt` in the appends a cold prompt is cut into, putting its blocks after each step as the
// scheduler does (BlockExchange::save_progress: under KIVI a block goes as its quantized groups once
// the policy quantized it, and after the last step the residual's blocks in full precision).
void compute_and_put(Session& s, KVPool& pool, BlockExchange& ex, std::span<const int32_t> prompt) {
  std::vector<BlockHash> hashes;
  size_t saved = 0;
  for (size_t done = 0; done < prompt.size();) {
    const size_t n = std::min(prompt.size() - done, size_t(s.max_chunk()));
    s.feed(prompt.subspan(done, n));
    done += n;
    const size_t blocks = std::min(pool.complete_blocks(int64_t(s.history().size())), pool.adoptable_limit());
    pool.extend_block_hashes(s.history(), blocks, hashes);
    ex.save_progress(pool, s.history(), hashes, &saved, blocks, done == prompt.size());
  }
}

// The options of every session here: room for the prompts, the setting's KV configuration.
SessionOptions options(const char* kv) {
  SessionOptions o;
  o.kv.ctx_size = 640;
  o.kv = parse_kv_config(kv, o.kv);
  return o;
}

// `prompt` computed on a pool of its own (for `parallel` sequences) and its blocks put to `ex`.
void put_computed(const Model& m, const SessionOptions& o, ThreadPool& tp, BlockExchange& ex,
                  std::span<const int32_t> prompt, int parallel = 1) {
  KVPool pool(m.kv_shape(), o.kv, parallel);
  Session s(m, o, tp, &pool);
  compute_and_put(s, pool, ex, prompt);
}

// The reference: `prompt` and `steps` greedy tokens computed cold, on a fresh pool.
test::Greedy cold_greedy(const Model& m, const SessionOptions& o, ThreadPool& tp, std::span<const int32_t> prompt,
                         int steps, int parallel = 1) {
  KVPool pool(m.kv_shape(), o.kv, parallel);
  Session s(m, o, tp, &pool);
  return test::greedy(s, prompt, steps);
}

// The same tokens and the same logits, bit for bit.
::testing::AssertionResult same_bits(const test::Greedy& got, const test::Greedy& want) {
  if (got.ids != want.ids) return ::testing::AssertionFailure() << "other tokens";
  if (got.last_logits.size() != want.last_logits.size() ||
      std::memcmp(got.last_logits.data(), want.last_logits.data(), want.last_logits.size() * sizeof(float)) != 0)
    return ::testing::AssertionFailure() << "other logits";
  return ::testing::AssertionSuccess();
}

struct Continued {
  test::Greedy g;
  int64_t adopted = 0;
  size_t hits = 0;
};

// A fresh session on `pool`: loads `prompt`'s blocks from the store, adopts them, feeds the rest and
// decodes `steps` greedy tokens. after_load: called once the blocks are in.
Continued load_and_continue(const Model& m, const SessionOptions& o, ThreadPool& tp, KVPool& pool, BlockExchange& ex,
                            const std::vector<int32_t>& prompt, int steps,
                            const std::function<void()>& after_load = {}) {
  Continued c;
  Session s(m, o, tp, &pool);
  const auto exact = exact_for(s, prompt.size());
  size_t n = std::min(pool.complete_blocks(int64_t(prompt.size()) - 1), pool.adoptable_limit());
  while (n > 0 && !exact(pool.token_block(n - 1).start + pool.token_block(n - 1).len)) --n;
  std::vector<BlockHash> hashes;
  pool.extend_block_hashes(prompt, n, hashes);
  std::vector<int32_t> held;
  c.hits = ex.load(pool, prompt, hashes, 0, n, 0, held).hits;
  if (after_load) after_load();
  c.adopted = s.adopt_prefix(prompt, exact);
  pool.release_held(held);
  if (c.adopted == 0) {
    // Nothing exact to adopt: the prompt is computed (Session::feed would adopt on its own, without
    // the scheduler's rule; a private pool has nothing to adopt).
    Session cold(m, o, tp);
    c.g = test::greedy(cold, prompt, steps);
    return c;
  }
  c.g = test::greedy(s, std::span(prompt).subspan(size_t(c.adopted)), steps);
  return c;
}

// Each setting's model (skipped where it is not present), its options and two threads.
class ExchangeEverySetting : public ::testing::TestWithParam<Setting> {
 protected:
  void SetUp() override {
    const auto dir = model_dir(GetParam());
    if (!std::filesystem::exists(dir / "config.json")) GTEST_SKIP() << dir << " not present";
    model = Model::load(dir);
    o = options(GetParam().kv);
  }
  std::unique_ptr<Model> model;
  SessionOptions o;
  ThreadPool tp{2};
};

TEST_P(ExchangeEverySetting, LoadedBlocksContinueExactlyAsAColdComputation) {
  o.kv.validate();
  const int vocab = model->config().vocab_size;
  // A conversation: a first turn, then it again with a reply and a new turn.
  const std::vector<int32_t> turn1 = test::random_prompt(1, 300, vocab);
  std::vector<int32_t> turn2 = turn1;
  const auto more = test::random_prompt(2, 45, vocab);
  turn2.insert(turn2.end(), more.begin(), more.end());

  test::MemoryStore store;
  BlockExchange ex(store, Digest{}, "t");
  put_computed(*model, o, tp, ex, turn1, 2);
  ASSERT_GT(store.size(), 0u);
  KVPool b_pool(model->kv_shape(), o.kv, 2);
  const Continued got = load_and_continue(*model, o, tp, b_pool, ex, turn2, 12);
  EXPECT_GT(got.hits, 0u);
  EXPECT_GT(got.adopted, 0);
  EXPECT_LE(size_t(got.adopted), size_t(b_pool.token_block(b_pool.adoptable_limit() - 1).start +
                                        b_pool.token_block(b_pool.adoptable_limit() - 1).len));
  EXPECT_TRUE(same_bits(got.g, cold_greedy(*model, o, tp, turn2, 12, 2)))
      << "after " << got.adopted << " adopted tokens";
  EXPECT_EQ(b_pool.dense().in_use() + b_pool.quant().in_use(), 0u);
}

// A pool that runs out while importing stops there: a shorter adoption, the same output.
TEST_P(ExchangeEverySetting, APoolWithoutRoomImportsLessAndAnswersTheSame) {
  const std::vector<int32_t> prompt = test::random_prompt(5, 330, model->config().vocab_size);
  test::MemoryStore store;
  BlockExchange ex(store, Digest{}, "t");
  put_computed(*model, o, tp, ex, prompt);
  // Room for three token blocks and a few more in each of the pool's kinds, then nothing: the rest
  // is computed.
  KVPool full(model->kv_shape(), o.kv, 1);
  std::vector<int32_t> taken, taken_quant;
  while (full.dense().available() > 3 * size_t(model->config().n_layers) + 2)
    taken.push_back(full.dense().acquire());
  while (full.quant().available() > 3 * size_t(model->config().n_layers) + 2)
    taken_quant.push_back(full.quant().acquire());
  // The other blocks come back once the import stopped, for the rest of the prompt.
  const Continued got = load_and_continue(*model, o, tp, full, ex, prompt, 4, [&] {
    for (int32_t id : taken) full.dense().release(id);
    for (int32_t id : taken_quant) full.quant().release(id);
  });
  EXPECT_LE(got.hits, full.has_quantized_form() ? 6u : 3u);
  EXPECT_TRUE(same_bits(got.g, cold_greedy(*model, o, tp, prompt, 4)));
}

INSTANTIATE_TEST_SUITE_P(
    Settings, ExchangeEverySetting,
    ::testing::Values(Setting{"fp16", "kjv-tiny", false, "fp16"}, Setting{"int8", "kjv-tiny", false, "int8 r32"},
                      Setting{"int4", "kjv-tiny", false, "int4 r32"}, Setting{"int2", "kjv-tiny", false, "int2 r64 pos=cache"},
                      Setting{"streaming", "kjv-tiny", false, "sink4 w200 pos=cache"},
                      Setting{"streaming_int4", "kjv-tiny", false, "int4 r32 sink32 w200"},
                      Setting{"sliding", "mistral-swa-tiny", true, "fp32"},
                      Setting{"sliding_int4", "mistral-swa-tiny", true, "int4 r32"}),
    [](const ::testing::TestParamInfo<Setting>& info) { return std::string(info.param.name); });

// Under KIVI a block goes to the store as its quantized groups once the policy quantized it (int4
// bytes, never its float32 form first), the last blocks of the history in full precision as well; a
// loading pool takes the groups as they are and the residual in full precision, and a prefix adopted
// under KIVI ends on the prefill grid.
TEST(ExchangeKivi, GroupsTravelQuantizedAndAdoptionEndsOnTheGrid) {
  auto model = Model::load(test::repo_model("kjv-tiny"));
  ThreadPool tp(2);
  const SessionOptions o = options("int4 r32");
  const size_t layers = size_t(model->config().n_layers);
  const std::vector<int32_t> prompt = test::random_prompt(7, 250, model->config().vocab_size);
  test::MemoryStore store;
  BlockExchange ex(store, Digest{}, "t");
  put_computed(*model, o, tp, ex, prompt);
  KVPool b_pool(model->kv_shape(), o.kv, 2);
  Session b(*model, o, tp, &b_pool);
  ASSERT_TRUE(b.cache().cut_dependent());
  std::vector<BlockHash> hashes;
  const size_t n = b_pool.complete_blocks(int64_t(prompt.size()) - 1);  // 7 blocks of 32
  ASSERT_EQ(n, 7u);
  b_pool.extend_block_hashes(prompt, n, hashes);
  // 250 tokens with a residual of 32 leave groups 0-5 quantized: those went as int4 groups; block 6
  // and the residual tail (residual_tail: 1 + 2 blocks) in full precision.
  ASSERT_EQ(BlockExchange::residual_tail(b_pool), 3u);
  for (size_t j = 0; j < n; ++j) {
    const auto ids = std::span(prompt).subspan(32 * j, 32);
    const auto v = store.get(std::vector<std::string>{kv_store_key("t", Digest{}, hashes[j], true),
                                                      kv_store_key("t", Digest{}, hashes[j])});
    EXPECT_EQ(bool(v[0]), j < 6) << "block " << j;
    EXPECT_EQ(bool(v[1]), j >= 4) << "block " << j;
    if (v[0]) {
      EXPECT_EQ(v[0]->size(), 80 + 32 * 4 + b_pool.exchange_bytes(true) + 8);
      EXPECT_TRUE(decode_block_value(*v[0], Digest{}, hashes[j], ids, b_pool.exchange_bytes(true), nullptr,
                                     {KVPrecision::Int4, true}));
      // Another precision or form of the same bytes is a miss, never read as this one.
      std::string why;
      EXPECT_FALSE(decode_block_value(*v[0], Digest{}, hashes[j], ids, b_pool.exchange_bytes(true), &why,
                                      {KVPrecision::Int8, true}));
      EXPECT_NE(why.find("precision"), std::string::npos) << why;
      EXPECT_FALSE(decode_block_value(*v[0], Digest{}, hashes[j], ids, b_pool.exchange_bytes(true), &why,
                                      {KVPrecision::Int4, false}));
    }
  }
  std::vector<int32_t> held;
  EXPECT_EQ(ex.load(b_pool, prompt, hashes, 0, n, 0, held).hits, 7u);
  EXPECT_EQ(b_pool.quant().in_use(), 6 * layers);  // the groups came in as they are
  EXPECT_EQ(b_pool.dense().in_use(), 3 * layers);  // blocks 4-6 in full precision
  // Seven blocks end at 224, off the grid of 64: six are taken (192 tokens).
  EXPECT_EQ(b.adopt_prefix(prompt, exact_for(b, prompt.size())), 192);
  b_pool.release_held(held);
  // The adopted sequence holds what computing 192 tokens leaves quantized (192 - 32 residual).
  EXPECT_EQ(b_pool.quant().in_use(), layers * 5);
  const test::Greedy got = test::greedy(b, std::span(prompt).subspan(192), 6);
  EXPECT_TRUE(same_bits(got, cold_greedy(*model, o, tp, prompt, 6, 2)));
}

// The value of a block carries its length: a StreamingLLM sink block shorter than the group has the
// slots past its tokens zeroed, and it loads back as that block.
TEST(ExchangeStreaming, ShortSinkBlocksTravelWithTheirLength) {
  auto model = Model::load(test::repo_model("kjv-tiny"));
  ThreadPool tp(1);
  const SessionOptions o = options("sink4 w200");
  KVPool pool(model->kv_shape(), o.kv, 1);
  EXPECT_EQ(pool.token_block(0).start, 0);
  EXPECT_EQ(pool.token_block(0).len, 4);
  EXPECT_EQ(pool.token_block(1).start, 4);
  EXPECT_EQ(pool.token_block(1).len, 32);
  EXPECT_EQ(pool.complete_blocks(3), 0u);
  EXPECT_EQ(pool.complete_blocks(4), 1u);
  EXPECT_EQ(pool.complete_blocks(35), 1u);
  EXPECT_EQ(pool.complete_blocks(36), 2u);
  const std::vector<int32_t> prompt = test::random_prompt(8, 100, model->config().vocab_size);
  Session s(*model, o, tp, &pool);
  s.feed(prompt);
  std::vector<BlockHash> hashes;
  pool.extend_block_hashes(prompt, 2, hashes);
  std::string bytes;
  ASSERT_TRUE(pool.read_block(hashes[0], std::span(prompt).first(4), bytes));
  ASSERT_EQ(bytes.size(), pool.exchange_bytes());
  // Layer 0, K of head 0: slots 4..31 are zero; slots 0..3 hold the keys.
  const size_t row = size_t(model->kv_shape().head_dim) * sizeof(float);
  EXPECT_TRUE(std::all_of(bytes.begin() + std::ptrdiff_t(4 * row), bytes.begin() + std::ptrdiff_t(32 * row),
                          [](char c) { return c == 0; }));
  EXPECT_FALSE(std::all_of(bytes.begin(), bytes.begin() + std::ptrdiff_t(4 * row), [](char c) { return c == 0; }));
  // The same block asked for with 32 ids (another content) is not there.
  std::string other;
  EXPECT_FALSE(pool.read_block(hashes[0], std::span(prompt).first(32), other));
}

// save() sends a value from the pool's blocks themselves: they stay held (no other sequence can take
// them) until the store lets go of the value and reclaim() gives them back; the value is byte for
// byte the copied one.
// kjv-tiny's fp32 pool for one sequence, and a store that keeps the pins of what is put.
struct PinTest : ::testing::Test {
  void SetUp() override { store.hold_pins(true); }
  std::unique_ptr<Model> model = Model::load(test::repo_model("kjv-tiny"));
  ThreadPool tp{1};
  const SessionOptions o = options("fp32");
  KVPool pool{model->kv_shape(), o.kv, 1};
  const size_t layers = pool.exchange_bytes() / pool.dense().block_bytes();
  test::MemoryStore store;
};

TEST_F(PinTest, SavedBlocksAreHeldUntilTheStoreLetsGoOfThem) {
  const std::vector<int32_t> prompt = test::random_prompt(9, 100, model->config().vocab_size);
  {
    BlockExchange ex(store, Digest{}, "t");
    std::vector<BlockHash> hashes;
    {
      Session s(*model, o, tp, &pool);
      s.feed(prompt);
      pool.extend_block_hashes(prompt, 3, hashes);
      EXPECT_EQ(ex.save(pool, prompt, hashes, 0, 3), 3u);
    }
    EXPECT_EQ(store.held_pins(), 3u);
    EXPECT_EQ(pool.dense().available(), pool.dense().capacity() - 3 * layers);  // the session is gone
    for (size_t j = 0; j < 3; ++j) {
      const auto ids = std::span(prompt).subspan(32 * j, 32);
      std::string bytes;
      ASSERT_TRUE(pool.read_block(hashes[j], ids, bytes));
      const auto v = store.get(std::vector<std::string>{kv_store_key("t", Digest{}, hashes[j])});
      ASSERT_TRUE(v[0]);
      EXPECT_EQ(*v[0], encode_block_value(Digest{}, hashes[j], ids, bytes));
    }
    EXPECT_FALSE(ex.has_returns());
    store.release_pins();
    EXPECT_TRUE(ex.has_returns());
    EXPECT_EQ(pool.dense().available(), pool.dense().capacity() - 3 * layers);  // not before reclaim
    EXPECT_EQ(ex.reclaim(pool), 3 * layers);
    EXPECT_FALSE(ex.has_returns());
    EXPECT_EQ(pool.dense().available(), pool.dense().capacity());
  }
}

// At most a quarter of the pool is pinned: the blocks past it are copied into their values.
TEST_F(PinTest, AtMostAQuarterOfThePoolIsPinned) {
  const size_t most = pool.dense().capacity() / 4 / layers;
  const size_t n = most + 3;
  ASSERT_LE(32 * n, size_t(o.kv.ctx_size));
  const std::vector<int32_t> prompt = test::random_prompt(10, int(32 * n), model->config().vocab_size);
  BlockExchange ex(store, Digest{}, "t");
  Session s(*model, o, tp, &pool);
  s.feed(prompt);
  std::vector<BlockHash> hashes;
  pool.extend_block_hashes(prompt, n, hashes);
  EXPECT_EQ(ex.save(pool, prompt, hashes, 0, n), n);
  EXPECT_EQ(store.held_pins(), most);
  EXPECT_EQ(store.size(), n);
  for (size_t j = 0; j < n; ++j) {
    const auto ids = std::span(prompt).subspan(32 * j, 32);
    const auto v = store.get(std::vector<std::string>{kv_store_key("t", Digest{}, hashes[j])});
    ASSERT_TRUE(v[0]);
    EXPECT_TRUE(decode_block_value(*v[0], Digest{}, hashes[j], ids, pool.exchange_bytes())) << "block " << j;
  }
  store.release_pins();
  EXPECT_EQ(ex.reclaim(pool), most * layers);
}

// A prompt whose last few tokens would be left to compute after the prefix (a batch small enough for
// matmul's other path) adopts less: the prompt's last append is then as a cold one's, and so is
// every logit. Over pools with room for fewer or more blocks (shorter or longer adoptions).
TEST(ExchangeTail, AShortTailIsNeverLeftToAdoption) {
  auto model = Model::load(test::repo_model("kjv-tiny"));
  ThreadPool tp(2);
  for (const char* kv : {"fp32", "sink4 w200 pos=cache"})
    for (size_t len : {322u, 328u}) {
      const SessionOptions o = options(kv);
      const std::vector<int32_t> prompt = test::random_prompt(5, int(len), model->config().vocab_size);
      test::MemoryStore store;
      BlockExchange ex(store, Digest{}, "t");
      put_computed(*model, o, tp, ex, prompt);
      const test::Greedy want = cold_greedy(*model, o, tp, prompt, 3);
      for (size_t room : {1u, 2u, 3u, 12u}) {
        KVPool pool(model->kv_shape(), o.kv, 1);
        std::vector<int32_t> taken;
        while (pool.dense().available() > room * size_t(model->config().n_layers))
          taken.push_back(pool.dense().acquire());
        const Continued got = load_and_continue(*model, o, tp, pool, ex, prompt, 3, [&] {
          for (int32_t id : taken) pool.dense().release(id);
        });
        // With room: fp32 feeds a cold prompt in one append, so 288 tokens are adopted (320 would
        // leave 2 or 8). Under StreamingLLM the cold prompt's last append of 64 holds 2 or 8 tokens,
        // which the rest after a prefix of 4 + 32k tokens never ends with: nothing is adopted.
        if (room == 12) {
          EXPECT_EQ(got.adopted, std::string(kv) == "fp32" ? 288 : 0) << kv << " " << len;
        }
        EXPECT_TRUE(same_bits(got.g, want))
            << kv << ": a prompt of " << len << " tokens, " << got.adopted << " adopted";
      }
    }
}

}  // namespace
}  // namespace ptllm
