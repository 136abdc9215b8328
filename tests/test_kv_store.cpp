// The block store of `serve --kv-store`: the value format (anything that does not verify
// is a miss), pools exchanging token blocks through a store (what one scheduler computed, another
// loads instead of computing, with the same output), and the Redis client against a redis-server of
// the test's own: round trip, expiry, a Redis that is down, paused (slow) or back again.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>

#include <xxhash.h>

#include "core/checksum.h"
#include "persist/kv_store.h"
#include "engine/prompt_cache.h"
#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "redis_server.h"
#include "sample/sampler.h"
#include "store/redis_store.h"
#include "test_memory_store.h"
#include "test_scheduler_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

Digest digest_of(uint8_t seed) {
  Digest d{};
  for (size_t i = 0; i < d.size(); ++i) d[i] = uint8_t(seed + 7 * i);
  return d;
}

// ---------------------------------------------------------------------------------------------
// The value format.

struct ValueCase {
  Digest id = digest_of(3);
  BlockHash h{0x1234567890abcdefULL, 0xfedcba0987654321ULL};
  std::vector<int32_t> ids = std::vector<int32_t>(32);
  std::string payload;
  ValueCase() {
    std::mt19937 rng(5);
    for (auto& x : ids) x = int32_t(rng() % 8192);
    for (int i = 0; i < 1000; ++i) payload += char(rng());
  }
  std::string value() const { return encode_block_value(id, h, ids, payload); }
  std::optional<std::string_view> decode(std::string_view v, std::string* why = nullptr) const {
    return decode_block_value(v, id, h, ids, payload.size(), why);
  }
};

TEST(KVStoreValue, RoundTripGivesThePayloadBack) {
  ValueCase c;
  const std::string v = c.value();
  EXPECT_EQ(v.size(), 80 + 32 * 4 + c.payload.size() + 8);
  const auto p = c.decode(v);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, c.payload);
}

TEST(KVStoreValue, AnythingThatDoesNotVerifyIsAMiss) {
  ValueCase c;
  const std::string v = c.value();
  std::string why;
  // Every single flipped byte (header, ids, payload, checksum) is caught.
  for (size_t at = 0; at < v.size(); at += 7) {
    std::string bad = v;
    bad[at] = char(bad[at] ^ 0x40);
    EXPECT_FALSE(c.decode(bad, &why)) << "byte " << at;
  }
  EXPECT_FALSE(c.decode(v.substr(0, v.size() - 1), &why));
  EXPECT_NE(why.find("size"), std::string::npos) << why;
  EXPECT_FALSE(c.decode(v + "x"));
  EXPECT_FALSE(c.decode(""));
  EXPECT_FALSE(c.decode("hello world, not a block value at all, but long enough to have a header and more; ok"));
  // Wrong identity (another model, tokenizer, build or KV setting), block hash, token ids, size.
  EXPECT_FALSE(decode_block_value(v, digest_of(4), c.h, c.ids, c.payload.size(), &why));
  EXPECT_NE(why.find("another model"), std::string::npos) << why;
  EXPECT_FALSE(decode_block_value(v, c.id, {c.h.lo + 1, c.h.hi}, c.ids, c.payload.size(), &why));
  EXPECT_NE(why.find("hash"), std::string::npos) << why;
  std::vector<int32_t> other = c.ids;
  other[31] += 1;
  EXPECT_FALSE(decode_block_value(v, c.id, c.h, other, c.payload.size(), &why));
  EXPECT_NE(why.find("token ids"), std::string::npos) << why;
  EXPECT_FALSE(decode_block_value(v, c.id, c.h, c.ids, c.payload.size() + 4, &why));
  // A value of another version, its checksum right for its bytes (version 1's was XXH64, the next
  // one's unknown), is refused for its version.
  for (const uint32_t version : {kKVStoreVersion - 1, kKVStoreVersion + 1}) {
    std::string other_version = v;
    std::memcpy(other_version.data() + 8, &version, 4);
    const uint64_t sum = version == 1 ? XXH64(other_version.data(), other_version.size() - 8, 0)
                                      : checksum64(other_version.data(), other_version.size() - 8);
    std::memcpy(other_version.data() + other_version.size() - 8, &sum, 8);
    EXPECT_FALSE(c.decode(other_version, &why)) << version;
    EXPECT_NE(why.find("version"), std::string::npos) << why;
  }
}

TEST(KVStoreValue, TheChecksumIsXxh3OfEveryByteBeforeIt) {
  ValueCase c;
  const std::string v = c.value();
  uint64_t sum;
  std::memcpy(&sum, v.data() + v.size() - 8, 8);
  EXPECT_EQ(sum, XXH3_64bits(v.data(), v.size() - 8));  // the library's own, not core/checksum.h's dispatch
  EXPECT_EQ(checksum64(v.data(), v.size() - 8), sum);
}

TEST(KVStoreValue, KeysSeparateIdentitiesAndBlocks) {
  const BlockHash h{1, 2};
  const std::string k = kv_store_key("ptllm", digest_of(1), h);
  EXPECT_EQ(k.rfind("ptllm:", 0), 0u);
  EXPECT_EQ(k.size(), 6 + 32 + 1 + 32);
  EXPECT_EQ(k.substr(k.size() - 32), "00000000000000020000000000000001");
  EXPECT_NE(k, kv_store_key("ptllm", digest_of(2), h));
  EXPECT_NE(k, kv_store_key("ptllm", digest_of(1), {1, 3}));
  EXPECT_NE(k, kv_store_key("other", digest_of(1), h));
}

TEST(KVStoreUrl, ParsesAndRefusesWithTheFlagsName) {
  const store::RedisAddress a = store::parse_redis_url("redis://cache.local:6380/3");
  EXPECT_EQ(a.host, "cache.local");
  EXPECT_EQ(a.port, 6380);
  EXPECT_EQ(a.db, 3);
  const store::RedisAddress b = store::parse_redis_url("redis://:pw@127.0.0.1");
  EXPECT_EQ(b.host, "127.0.0.1");
  EXPECT_EQ(b.port, 6379);
  EXPECT_EQ(b.password, "pw");
  EXPECT_EQ(store::parse_redis_url("redis://[::1]:7000/").host, "::1");
  for (const char* bad : {"http://x:1", "redis://", "redis://h:0", "redis://h:99999", "redis://h:12ab", "redis://h/x",
                          "redis://user@h"}) {
    try {
      store::parse_redis_url(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--kv-store"), std::string::npos) << e.what();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Schedulers exchanging blocks through a store (in memory here; Redis below).

class StoreSchedulerTest : public test::StoreSchedulerFixture {};

// A finished request's blocks stay held while the store still sends from them and come back as soon
// as it lets go (the store wakes the scheduler: nothing else need run); a scheduler that ends waits
// for the store first (the blocks' memory goes with it).
TEST_F(StoreSchedulerTest, BlocksTheStoreSendsFromComeBackOnceItLetsGo) {
  test::MemoryStore store;
  store.hold_pins(true);
  auto a = std::make_unique<Scheduler>(*rt_, config(&store));
  const size_t layers = a->pool().exchange_bytes() / a->pool().dense().block_bytes();
  const RequestResult r = test::run_greedy(*a, test::random_prompt(13, 200, vocab()), 20);
  EXPECT_EQ(r.reason, FinishReason::Length);
  a->drain();
  EXPECT_EQ(store.held_pins(), 6u);  // 219 tokens: six full blocks
  auto used_becomes = [&](size_t n) {
    for (int i = 0; i < 1000 && a->stats().blocks_used != n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return a->stats().blocks_used == n;
  };
  EXPECT_TRUE(used_becomes(6 * layers));
  store.release_pins();
  EXPECT_TRUE(used_becomes(0)) << a->stats().blocks_used;
  // Another scheduler, destroyed while the store holds its blocks: it returns once they are let go.
  auto b = std::make_unique<Scheduler>(*rt_, config(&store));
  const RequestResult r2 = test::run_greedy(*b, test::random_prompt(14, 200, vocab()), 20);
  EXPECT_EQ(r2.reason, FinishReason::Length);
  b->drain();
  EXPECT_EQ(store.held_pins(), 6u);
  std::atomic<bool> released{false};
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    released = true;
    store.release_pins();
  });
  b.reset();
  EXPECT_TRUE(released.load());
  later.join();
}

// A conversation's first turn on A, its second on B (another pool): B loads the history's blocks
// from the store, computes only the rest, and answers what one scheduler answers alone.
TEST_F(StoreSchedulerTest, SecondReplicaLoadsTheHistoryAndAnswersTheSame) {
  const auto turn1 = test::random_prompt(11, 200, vocab());
  // One scheduler alone, both turns: the reference.
  std::vector<int32_t> turn2 = turn1;
  RequestResult ref1, ref2;
  {
    Scheduler single(*rt_, config(nullptr));
    ref1 = test::run_greedy(single, turn1, 20);
    turn2.insert(turn2.end(), ref1.tokens.begin(), ref1.tokens.end());
    const auto more = test::random_prompt(12, 30, vocab());
    turn2.insert(turn2.end(), more.begin(), more.end());
    ref2 = test::run_greedy(single, turn2, 16);
  }
  // A fed turn1 and 19 of its 20 replies: 219 tokens, six full blocks of 32.
  EXPECT_EQ(ref2.cached_tokens, 192);
  test::MemoryStore store;
  Scheduler a(*rt_, config(&store)), b(*rt_, config(&store));
  const RequestResult a1 = test::run_greedy(a, turn1, 20);
  EXPECT_EQ(a1.tokens, ref1.tokens);
  EXPECT_EQ(a1.cached_tokens, 0);
  EXPECT_EQ(store.size(), 6u);  // every full block A computed
  const uint64_t lookups_before = store.stats().lookups;  // A's one, its blocks all absent
  EXPECT_EQ(lookups_before, 1u);
  const RequestResult b2 = test::run_greedy(b, turn2, 16);
  EXPECT_EQ(b2.tokens, ref2.tokens);
  EXPECT_EQ(b2.cached_tokens, 192);
  EXPECT_EQ(b2.store_tokens, 192);
  const SchedulerStats sb = b.stats();
  EXPECT_TRUE(sb.store);
  EXPECT_EQ(sb.store_hits, 6u);
  EXPECT_EQ(sb.store_misses, 1u);  // the seventh block (of the new turn) was asked for, absent
  EXPECT_EQ(sb.prefill_tokens, turn2.size() - 192);
  EXPECT_EQ(sb.store_io.lookups, lookups_before + 1);  // one round trip for B's prompt
  // B put only what it computed: the blocks of the new turn and its reply.
  EXPECT_EQ(sb.store_puts, (turn2.size() + 15) / 32 - 6);
  // Again on B: now from B's own pool, without asking the store for those blocks.
  const RequestResult b3 = test::run_greedy(b, turn2, 16);
  EXPECT_EQ(b3.tokens, ref2.tokens);
  EXPECT_EQ(b3.store_tokens, 0);
  EXPECT_GE(b3.cached_tokens, 192);
  EXPECT_EQ(b.stats().store_hits, 6u);
  a.drain();
  b.drain();
  EXPECT_EQ(a.pool().blocks_in_use(), 0u);
  EXPECT_EQ(b.pool().blocks_in_use(), 0u);
}

TEST_F(StoreSchedulerTest, ADamagedOrForeignValueIsAMissAndTheSameAnswer) {
  const auto prompt = test::random_prompt(21, 150, vocab());
  RequestResult ref;
  {
    Scheduler single(*rt_, config(nullptr));
    ref = test::run_greedy(single, prompt, 12);
  }
  for (int damage = 0; damage < 2; ++damage) {
    test::MemoryStore store;
    Scheduler a(*rt_, config(&store));
    EXPECT_EQ(test::run_greedy(a, prompt, 12).tokens, ref.tokens);
    ASSERT_GT(store.size(), 0u);
    if (damage == 0) {
      store.edit([](const std::string&, std::string& v) { v[v.size() / 2] = char(v[v.size() / 2] ^ 1); });
    } else {  // well-formed values of another identity (another build, say) under this one's keys
      store.edit([](const std::string&, std::string& v) {
        BlockHash h;
        std::memcpy(&h.lo, v.data() + 48, 8);
        std::memcpy(&h.hi, v.data() + 56, 8);
        std::vector<int32_t> ids(32);
        std::memcpy(ids.data(), v.data() + 80, 128);
        v = encode_block_value(digest_of(9), h, ids, std::string_view(v).substr(208, v.size() - 208 - 8));
      });
    }
    Scheduler b(*rt_, config(&store));
    const RequestResult r = test::run_greedy(b, prompt, 12);
    EXPECT_EQ(r.tokens, ref.tokens);
    EXPECT_EQ(r.cached_tokens, 0);
    EXPECT_EQ(b.stats().store_rejected, 1u);  // the first block fails; the chain stops there
    EXPECT_EQ(b.stats().store_hits, 0u);
  }
}

TEST_F(StoreSchedulerTest, AnotherIdentityNeverSeesTheBlocks) {
  const auto prompt = test::random_prompt(31, 150, vocab());
  test::MemoryStore store;
  Scheduler a(*rt_, config(&store));
  test::run_greedy(a, prompt, 4);
  SchedulerConfig other = config(&store);
  other.store_identity[0] ^= 1;  // another build or model
  Scheduler b(*rt_, other);
  const RequestResult r = test::run_greedy(b, prompt, 4);
  EXPECT_EQ(r.cached_tokens, 0);
  EXPECT_EQ(b.stats().store_hits, 0u);
  EXPECT_EQ(b.stats().store_rejected, 0u);  // other keys: absent, not refused
  EXPECT_GT(b.stats().store_misses, 0u);
}

SchedulerConfig with_kv(SchedulerConfig c, const char* kv, const Runtime& rt) {
  c.session.kv = parse_kv_config(kv, c.session.kv);
  c.store_identity = prompt_cache_identity(rt.model(), rt.tokenizer(), c.session.kv).config_key;
  return c;
}

// Every KV setting exchanges its blocks, and two settings never each other's: their identities
// differ (the keys), and so do their chained hashes (the values' and the pool's keys).
TEST_F(StoreSchedulerTest, AnotherKVSettingNeverSeesTheBlocks) {
  const auto prompt = test::random_prompt(33, 200, vocab());
  test::MemoryStore store;
  const SchedulerConfig int8 = with_kv(config(&store), "int8 r32", *rt_);
  SchedulerConfig int4 = with_kv(config(&store), "int4 r32", *rt_);
  ASSERT_NE(int8.store_identity, int4.store_identity);
  RequestResult first;
  {
    Scheduler a(*rt_, int8);
    first = test::run_greedy(a, prompt, 4);
  }
  ASSERT_GT(store.size(), 0u);
  for (bool same_identity : {false, true}) {
    if (same_identity) int4.store_identity = int8.store_identity;  // as if the keys could not tell them apart
    Scheduler b(*rt_, int4);
    const RequestResult r = test::run_greedy(b, prompt, 4);
    EXPECT_EQ(r.cached_tokens, 0) << same_identity;
    EXPECT_EQ(b.stats().store_hits, 0u) << same_identity;
    EXPECT_EQ(b.stats().store_rejected, 0u) << same_identity;  // other keys: absent, not refused
    EXPECT_GT(b.stats().store_misses, 0u);
  }
  // The same setting again (another replica): its blocks, on the prefill grid of 64.
  Scheduler c(*rt_, int8);
  const RequestResult r = test::run_greedy(c, prompt, 4);
  EXPECT_EQ(r.tokens, first.tokens);
  EXPECT_EQ(r.cached_tokens, 192);
  EXPECT_EQ(r.store_tokens, 192);
}

// What can never take a block from the store is refused, naming the flag and the setting.
TEST_F(StoreSchedulerTest, KiviSettingsThatNeverAdoptAreRefused) {
  test::MemoryStore store;
  SchedulerConfig small = with_kv(config(&store), "int4 r32", *rt_);
  small.prefill_chunk = 32;
  SchedulerConfig sinks = with_kv(config(&store), "int4 r32 sink4 w200", *rt_);
  for (const auto& [c, what] : {std::pair{small, "--prefill-chunk 32 is below it"},
                                std::pair{sinks, "give --streaming-llm-sink a multiple of 32"}}) {
    try {
      Scheduler s(*rt_, c);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--kv-store: under int4"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
  // The same without a store: served, nothing to refuse.
  Scheduler plain(*rt_, with_kv(config(nullptr), "int4 r32 sink4 w200", *rt_));
  EXPECT_EQ(test::run_greedy(plain, test::random_prompt(3, 40, vocab()), 2).reason, FinishReason::Length);
}

// A KIVI replica continuing another's conversation answers what a cold scheduler answers.
TEST_F(StoreSchedulerTest, KiviReplicasAnswerAsAColdScheduler) {
  const auto turn1 = test::random_prompt(13, 230, vocab());
  for (const char* kv : {"int4 r32", "int2 r64"}) {
    test::MemoryStore store;
    const SchedulerConfig c = with_kv(config(&store), kv, *rt_);
    Scheduler a(*rt_, c), b(*rt_, c);
    const RequestResult a1 = test::run_greedy(a, turn1, 20);
    std::vector<int32_t> turn2 = turn1;
    turn2.insert(turn2.end(), a1.tokens.begin(), a1.tokens.end());
    const auto more = test::random_prompt(14, 30, vocab());
    turn2.insert(turn2.end(), more.begin(), more.end());
    const RequestResult b2 = test::run_greedy(b, turn2, 16);
    RequestResult cold;
    {
      Scheduler fresh(*rt_, with_kv(config(nullptr), kv, *rt_));
      cold = test::run_greedy(fresh, turn2, 16);
    }
    EXPECT_EQ(b2.tokens, cold.tokens) << kv;
    EXPECT_GT(b2.store_tokens, 0) << kv;
    EXPECT_EQ(b2.cached_tokens % 64, 0) << kv;  // on the prefill grid
    // A, whose pool holds the history, also adopts on the grid and answers the same.
    EXPECT_EQ(test::run_greedy(a, turn2, 16).tokens, cold.tokens) << kv;
  }
}

// ---------------------------------------------------------------------------------------------
// The Redis client.

// A store's warnings, every one kept (no rate limit).
struct RecordedLog {
  RateLimitedLog log{std::chrono::milliseconds(0)};
  RecordedLog() {
    log.sink = [this](const std::string& l) {
      std::lock_guard lk(mu_);
      lines_.push_back(l);
    };
  }
  std::vector<std::string> lines() {
    std::lock_guard lk(mu_);
    return lines_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

class RedisStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!store::redis_available()) GTEST_SKIP() << "built without hiredis (libhiredis-dev)";
    if (!test::RedisServer::available()) GTEST_SKIP() << "redis-server is not installed";
  }
  static std::unique_ptr<KVStore> open(const std::string& url, RateLimitedLog* log = nullptr, int ttl = 0,
                                       uint64_t max_bytes = 0) {
    store::RedisStoreOptions o;
    o.url = url;
    o.timeout_ms = 200;
    o.ttl_s = ttl;
    o.max_bytes = max_bytes;
    return store::open_redis_store(o, log);
  }
};

TEST_F(RedisStoreTest, PutThenGetInOneRoundTrip) {
  test::RedisServer redis;
  ASSERT_TRUE(redis.running());
  auto s = open(redis.url());
  const std::string big(300000, 'x');
  s->put("t:a", "alpha");
  s->put("t:b", big);
  ASSERT_TRUE(s->flush(std::chrono::seconds(30)));
  const std::vector<std::string> keys = {"t:a", "t:none", "t:b"};
  const auto v = s->get(keys);
  ASSERT_EQ(v.size(), 3u);
  ASSERT_TRUE(v[0]);
  EXPECT_EQ(*v[0], "alpha");
  EXPECT_FALSE(v[1]);
  ASSERT_TRUE(v[2]);
  EXPECT_EQ(*v[2], big);
  const KVStoreStats st = s->stats();
  EXPECT_EQ(st.lookups, 1u);
  EXPECT_EQ(st.keys_looked_up, 3u);
  EXPECT_EQ(st.writes, 2u);
  EXPECT_EQ(st.bytes_out, 5 + big.size());
  EXPECT_EQ(st.bytes_in, 5 + big.size());
  EXPECT_EQ(st.errors, 0u);
  EXPECT_EQ(st.dropped_writes, 0u);
}

// A put's finish (BlockExchange: the checksum) runs on the writer's thread before the value is sent,
// not on the caller's; what it wrote is what arrives.
std::atomic<std::thread::id> finished_on{};
void finish_for_test(StoreValue& v) {
  finished_on = std::this_thread::get_id();
  v.tail.back() = '!';
}

TEST_F(RedisStoreTest, APutsFinishRunsOnTheWriterBeforeTheValueIsSent) {
  test::RedisServer redis;
  ASSERT_TRUE(redis.running());
  auto s = open(redis.url());
  std::string big(300000, 'x');
  StoreValue v(big.substr(0, 299999));
  v.tail = "x";
  s->put("t:f", std::move(v), finish_for_test);
  s->put("t:plain", "alpha.");
  ASSERT_TRUE(s->flush(std::chrono::seconds(30)));
  const std::vector<std::string> keys = {"t:f", "t:plain"};
  const auto got = s->get(keys);
  ASSERT_TRUE(got[0] && got[1]);
  big.back() = '!';
  EXPECT_EQ(*got[0], big);
  EXPECT_EQ(*got[1], "alpha.");
  EXPECT_NE(finished_on.load(), std::thread::id{});
  EXPECT_NE(finished_on.load(), std::this_thread::get_id());
}

// A value's body is sent from the putter's memory (head, body parts, tail, in order), and its pin is
// dropped once the store is done with it, on the writer's thread; a value the queue cannot take drops
// its pin in put.
struct PinForTest final : StoreValue::Pin {
  explicit PinForTest(std::atomic<int>& n) : dropped(n) {}
  ~PinForTest() override {
    dropped_on = std::this_thread::get_id();
    ++dropped;
  }
  std::atomic<int>& dropped;
  static inline std::atomic<std::thread::id> dropped_on{};
};

TEST_F(RedisStoreTest, AValueInPartsArrivesWholeAndItsPinIsDroppedOnceSent) {
  test::RedisServer redis;
  ASSERT_TRUE(redis.running());
  auto s = open(redis.url());
  std::vector<std::string> parts;
  for (int i = 0; i < 8; ++i) parts.emplace_back(size_t(40000 + i), char('a' + i));
  std::atomic<int> dropped{0};
  for (int k = 0; k < 20; ++k) {
    StoreValue v("head" + std::to_string(k) + ":");
    for (const std::string& p : parts) v.body.emplace_back(p);
    v.tail = ":tail";
    v.pin = std::make_unique<PinForTest>(dropped);
    s->put("t:parts" + std::to_string(k), std::move(v), nullptr);
  }
  ASSERT_TRUE(s->flush(std::chrono::seconds(30)));
  EXPECT_EQ(dropped.load(), 20);  // every pin dropped by the time the writes are done
  EXPECT_NE(PinForTest::dropped_on.load(), std::this_thread::get_id());
  std::string whole;
  for (const std::string& p : parts) whole += p;
  const std::vector<std::string> keys = {"t:parts0", "t:parts19"};
  const auto got = s->get(keys);
  ASSERT_TRUE(got[0] && got[1]);
  EXPECT_EQ(*got[0], "head0:" + whole + ":tail");
  EXPECT_EQ(*got[1], "head19:" + whole + ":tail");
  EXPECT_EQ(s->stats().bytes_out, 20 * (whole.size() + 5) + 10 * 6 + 10 * 7);
}

// A long lookup: the values come back in the keys' order, misses where they are, and the lookup
// counts once.
TEST_F(RedisStoreTest, ALongLookupComesBackInOrder) {
  test::RedisServer redis;
  ASSERT_TRUE(redis.running());
  auto s = open(redis.url());
  std::vector<std::string> keys;
  uint64_t stored = 0;
  for (int i = 0; i < 21; ++i) {
    keys.push_back("t:" + std::to_string(i));
    if (i % 5 == 3) continue;  // 3, 8, 13, 18: never written
    const std::string v(size_t(1000 + 7 * i), char('a' + i));
    s->put(keys.back(), v);
    stored += v.size();
  }
  ASSERT_TRUE(s->flush(std::chrono::seconds(30)));
  const auto v = s->get(keys);
  ASSERT_EQ(v.size(), keys.size());
  for (int i = 0; i < 21; ++i) {
    if (i % 5 == 3) {
      EXPECT_FALSE(v[size_t(i)]) << i;
      continue;
    }
    ASSERT_TRUE(v[size_t(i)]) << i;
    EXPECT_EQ(*v[size_t(i)], std::string(size_t(1000 + 7 * i), char('a' + i))) << i;
  }
  const KVStoreStats st = s->stats();
  EXPECT_EQ(st.lookups, 1u);
  EXPECT_EQ(st.keys_looked_up, 21u);
  EXPECT_EQ(st.bytes_in, stored);
  EXPECT_EQ(st.errors, 0u);
}

// An error answering a lookup (here: the user may no longer run MGET) is a miss, an error counted
// and a warning naming it; the connection stays, and the next lookup answered gets the values, as
// does one after it (the reader's buffer is kept from lookup to lookup).
TEST_F(RedisStoreTest, AnErrorReplyIsAMissAndTheNextLookupIsAnswered) {
  test::RedisServer redis;
  ASSERT_TRUE(redis.running());
  RecordedLog rec;
  auto s = open(redis.url(), &rec.log);
  const std::string big(300000, 'y'), small = "alpha";
  s->put("t:big", big);
  s->put("t:small", small);
  ASSERT_TRUE(s->flush(std::chrono::seconds(30)));
  const std::vector<std::string> keys = {"t:big", "t:small"};
  ASSERT_TRUE(s->get(keys)[0]);
  ASSERT_EQ(test::redis_reply(redis.port(), "ACL SETUSER default -mget"), "+OK");
  const auto refused = s->get(keys);
  EXPECT_FALSE(refused[0]);
  EXPECT_FALSE(refused[1]);
  EXPECT_EQ(s->stats().errors, 1u);
  {
    const auto lines = rec.lines();
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find("NOPERM"), std::string::npos) << lines[0];
  }
  ASSERT_EQ(test::redis_reply(redis.port(), "ACL SETUSER default +mget"), "+OK");
  for (int round = 0; round < 2; ++round) {
    const auto v = s->get(keys);
    ASSERT_TRUE(v[0] && v[1]) << round;
    EXPECT_EQ(*v[0], big) << round;
    EXPECT_EQ(*v[1], small) << round;
  }
  const std::vector<std::string> reversed = {"t:small", "t:none", "t:big"};
  const auto r = s->get(reversed);
  ASSERT_TRUE(r[0] && r[2]);
  EXPECT_FALSE(r[1]);
  EXPECT_EQ(*r[0], small);
  EXPECT_EQ(*r[2], big);
  EXPECT_EQ(s->stats().errors, 1u);
  EXPECT_EQ(s->stats().lookups, 4u);  // the refused one is counted as an error, not a lookup
}

// Writes go out as pipelined SETs written straight from the values (writev): batches far larger
// than the socket's buffer (32 values of 1 MiB) arrive whole, with their EX.
TEST_F(RedisStoreTest, BatchesLargerThanTheSocketBufferArriveWhole) {
  test::RedisServer redis;
  ASSERT_TRUE(redis.running());
  auto s = open(redis.url(), nullptr, /*ttl=*/600);
  std::vector<std::string> keys, values;
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) {
    keys.push_back("t:w" + std::to_string(i));
    std::string v(size_t(1 << 20) + size_t(i), '\0');
    for (char& ch : v) ch = char(rng());
    values.push_back(v);
    s->put(keys.back(), std::move(v));
  }
  ASSERT_TRUE(s->flush(std::chrono::seconds(60)));
  const KVStoreStats st = s->stats();
  EXPECT_EQ(st.writes, 40u);
  EXPECT_EQ(st.dropped_writes, 0u);
  EXPECT_EQ(st.errors, 0u);
  const auto got = s->get(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i]) << i;
    EXPECT_TRUE(*got[i] == values[i]) << i;
  }
  const std::string ttl = test::redis_reply(redis.port(), "TTL t:w39");
  EXPECT_TRUE(ttl == ":600" || ttl == ":599") << ttl;  // the EX of each SET
}

// Values are handed as they arrive, in the keys' order, each once, views of the reader's buffer
// (a value of 300,000 bytes comes in many reads); a caller that wants no more is handed no more,
// and the rest of the answer is still read: the next lookup on the connection gets its own values.
TEST_F(RedisStoreTest, ALookupHandsValuesInOrderUntilTheCallerStops) {
  test::RedisServer redis;
  ASSERT_TRUE(redis.running());
  auto s = open(redis.url());
  const std::string big(300000, 'b'), big2(300001, 'c');
  s->put("t:small", "alpha");
  s->put("t:big", big);
  s->put("t:big2", big2);
  ASSERT_TRUE(s->flush(std::chrono::seconds(30)));
  const std::vector<std::string> keys = {"t:big", "t:none", "t:small", "t:big2"};
  std::vector<std::pair<size_t, std::optional<std::string>>> seen;
  s->lookup(keys, [&](size_t i, std::optional<std::string_view> v) {
    seen.emplace_back(i, v ? std::optional<std::string>(*v) : std::nullopt);
    return true;
  });
  ASSERT_EQ(seen.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(seen[i].first, i);
  EXPECT_EQ(seen[0].second, big);
  EXPECT_FALSE(seen[1].second);
  EXPECT_EQ(seen[2].second, "alpha");
  EXPECT_EQ(seen[3].second, big2);

  size_t handed = 0;
  s->lookup(keys, [&](size_t i, std::optional<std::string_view> v) {
    ++handed;
    EXPECT_EQ(i, 0u);
    EXPECT_EQ(v, std::optional<std::string_view>(big));
    return false;
  });
  EXPECT_EQ(handed, 1u);
  const std::vector<std::string> next = {"t:small", "t:big2"};
  const auto v = s->get(next);
  EXPECT_EQ(v[0], "alpha");
  EXPECT_EQ(v[1], big2);
  const KVStoreStats st = s->stats();
  EXPECT_EQ(st.lookups, 3u);
  EXPECT_EQ(st.errors, 0u);
  EXPECT_EQ(st.bytes_in, 2 * (big.size() + 5 + big2.size()) + 5 + big2.size());  // what came, handed or not
}

// What the caller throws comes back from lookup() once the answer is read (it never crosses
// hiredis's frames), and the connection stays in step.
TEST_F(RedisStoreTest, AnExceptionOfTheCallerComesBackAndTheConnectionStaysInStep) {
  test::RedisServer redis;
  ASSERT_TRUE(redis.running());
  auto s = open(redis.url());
  const std::string big(300000, 'e');
  s->put("t:a", big);
  s->put("t:b", "beta");
  ASSERT_TRUE(s->flush(std::chrono::seconds(30)));
  const std::vector<std::string> keys = {"t:a", "t:b"};
  size_t handed = 0;
  EXPECT_THROW(s->lookup(keys,
                         [&](size_t, std::optional<std::string_view>) -> bool {
                           ++handed;
                           throw std::runtime_error("the caller failed");
                         }),
               std::runtime_error);
  EXPECT_EQ(handed, 1u);
  const std::vector<std::string> swapped = {"t:b", "t:a"};
  const auto v = s->get(swapped);
  EXPECT_EQ(v[0], "beta");
  EXPECT_EQ(v[1], big);
  EXPECT_EQ(s->stats().errors, 0u);
}

TEST_F(RedisStoreTest, ValuesExpireAfterTheirTtl) {
  test::RedisServer redis;
  auto s = open(redis.url(), nullptr, /*ttl=*/2);
  s->put("t:ttl", "v");
  ASSERT_TRUE(s->flush(std::chrono::seconds(30)));
  const std::vector<std::string> keys = {"t:ttl"};
  EXPECT_TRUE(s->get(keys)[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(3200));  // Redis expires by its clock
  EXPECT_FALSE(s->get(keys)[0]);
}

TEST_F(RedisStoreTest, ARedisThatIsDownIsAMissAndAWarning) {
  RecordedLog rec;
  auto s = open("redis://127.0.0.1:" + std::to_string(test::free_port()), &rec.log);
  const std::vector<std::string> keys = {"t:a", "t:b"};
  const auto v = s->get(keys);
  EXPECT_FALSE(v[0]);
  EXPECT_FALSE(v[1]);
  s->put("t:a", "alpha");
  EXPECT_TRUE(s->flush(std::chrono::seconds(30)));
  const KVStoreStats st = s->stats();
  EXPECT_GE(st.errors, 1u);
  EXPECT_EQ(st.dropped_writes, 1u);
  EXPECT_EQ(st.writes, 0u);
  EXPECT_EQ(st.lookups, 0u);
  const auto lines = rec.lines();
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("cannot connect to 127.0.0.1"), std::string::npos) << lines[0];
}

TEST_F(RedisStoreTest, APausedRedisTimesOutAsAMissThenItIsUsedAgain) {
  test::RedisServer redis;
  auto s = open(redis.url());
  s->put("t:a", "alpha");
  ASSERT_TRUE(s->flush(std::chrono::seconds(30)));
  const std::vector<std::string> keys = {"t:a"};
  ASSERT_TRUE(s->get(keys)[0]);
  redis.pause();
  EXPECT_FALSE(s->get(keys)[0]);  // the 200 ms read timeout
  EXPECT_FALSE(s->get(keys)[0]);  // the backoff: a miss without waiting
  EXPECT_GE(s->stats().errors, 1u);
  redis.resume();
  // Reconnected after the backoff (100 ms after the first failure, then doubling).
  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    back = s->get(keys)[0].has_value();
  }
  EXPECT_TRUE(back);
}

TEST_F(RedisStoreTest, ARestartedRedisIsReconnected) {
  test::RedisServer redis;
  auto s = open(redis.url());
  const std::vector<std::string> keys = {"t:a"};
  redis.kill();
  EXPECT_FALSE(s->get(keys)[0]);
  ASSERT_TRUE(redis.start());  // empty again: no persistence
  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    s->put("t:a", "again");
    ASSERT_TRUE(s->flush(std::chrono::seconds(30)));
    back = s->get(keys)[0].has_value();
    if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(back);
}

TEST_F(RedisStoreTest, OverMaxBytesWritesAreSkipped) {
  test::RedisServer redis;
  auto s = open(redis.url(), nullptr, 0, /*max_bytes=*/1);  // Redis always uses more than a byte
  s->put("t:a", "alpha");
  s->put("t:b", "beta");
  ASSERT_TRUE(s->flush(std::chrono::seconds(30)));
  const std::vector<std::string> keys = {"t:a", "t:b"};
  const auto v = s->get(keys);
  EXPECT_FALSE(v[0]);
  EXPECT_FALSE(v[1]);
  EXPECT_EQ(s->stats().dropped_writes, 2u);
  EXPECT_EQ(s->stats().writes, 0u);
}

TEST_F(RedisStoreTest, APutBeyondTheQueueIsDroppedNotWaitedFor) {
  test::RedisServer redis;
  store::RedisStoreOptions o;
  o.url = redis.url();
  o.queue_bytes = 64;  // key and value bytes waiting at most
  auto s = store::open_redis_store(o);
  s->put("t:big", std::string(100, 'b'));  // more than the whole queue: dropped at once
  std::atomic<int> dropped{0};
  StoreValue pinned("p");
  const std::string body(100, 'p');
  pinned.body.emplace_back(body);
  pinned.pin = std::make_unique<PinForTest>(dropped);
  s->put("t:pinned", std::move(pinned), nullptr);  // its pin too, in put
  EXPECT_EQ(dropped.load(), 1);
  EXPECT_EQ(PinForTest::dropped_on.load(), std::this_thread::get_id());
  s->put("t:small", "s");
  ASSERT_TRUE(s->flush(std::chrono::seconds(30)));
  const std::vector<std::string> keys = {"t:big", "t:small"};
  const auto v = s->get(keys);
  EXPECT_FALSE(v[0]);
  ASSERT_TRUE(v[1]);
  EXPECT_EQ(*v[1], "s");
  EXPECT_EQ(s->stats().dropped_writes, 2u);
  EXPECT_EQ(s->stats().writes, 1u);
}

// The scheduler over a real Redis that dies mid-run: every answer stays right.
TEST_F(RedisStoreTest, SchedulersKeepAnsweringWhenRedisDies) {
  Runtime rt({test::repo_model("kjv-tiny"), 2, true});
  SchedulerConfig c;
  c.session.kv.ctx_size = 512;
  c.parallel = 2;
  c.prefill_chunk = 64;
  c.store_identity = prompt_cache_identity(rt.model(), rt.tokenizer(), c.session.kv).config_key;
  const auto p1 = test::random_prompt(41, 170, rt.config().vocab_size), p2 = test::random_prompt(42, 120, rt.config().vocab_size);
  RequestResult ref1, ref2;
  {
    Scheduler single(rt, c);
    ref1 = test::run_greedy(single, p1, 8);
    ref2 = test::run_greedy(single, p2, 8);
  }
  test::RedisServer redis;
  auto sa = open(redis.url()), sb = open(redis.url());
  SchedulerConfig ca = c, cb = c;
  ca.store = sa.get();
  cb.store = sb.get();
  Scheduler a(rt, ca), b(rt, cb);
  EXPECT_EQ(test::run_greedy(a, p1, 8).tokens, ref1.tokens);
  ASSERT_TRUE(sa->flush(std::chrono::seconds(30)));
  const RequestResult hit = test::run_greedy(b, p1, 8);
  EXPECT_EQ(hit.tokens, ref1.tokens);
  EXPECT_EQ(hit.store_tokens, 128);  // 160 would leave a last chunk of 10, not the cold one's 42
  redis.kill();
  EXPECT_EQ(test::run_greedy(a, p2, 8).tokens, ref2.tokens);
  EXPECT_EQ(test::run_greedy(b, p2, 8).tokens, ref2.tokens);
  EXPECT_EQ(test::run_greedy(a, p1, 8).tokens, ref1.tokens);  // from A's own pool
  EXPECT_GE(b.stats().store_io.errors, 1u);
}

}  // namespace
}  // namespace ptllm
