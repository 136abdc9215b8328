// Two `serve` replicas (in-process HTTP servers on two loopback ports, each with its own scheduler
// and pool) sharing one redis-server of the test's own: a conversation started on A and
// continued on B prefills only the new turn on B (usage.prompt_tokens_details.cached_tokens says
// so, on /v1/chat/completions and /v1/completions) with the answer of a single server; a corrupted
// value is a miss and the right answer; Redis killed mid-run: both keep answering correctly. And the
// same with two `posttrainllm serve` processes (the flags, the identity each process computes).
#include <fcntl.h>
#include <httplib.h>
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "chat/chat_template.h"
#include "persist/kv_store.h"
#include "engine/prompt_cache.h"
#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "redis_server.h"
#include "serve_process.h"
#include "server/http_server.h"
#include "server_thread.h"
#include "store/redis_store.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

using server::json;

const char* kSystem =
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
    "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God "
    "said, Let there be light: and there was light. And God saw the light, that it was good: and God divided the "
    "light from the darkness. And God called the light Day, and the darkness he called Night. And the evening "
    "and the morning were the first day.";

// One replica: a scheduler (with or without a store) and its HTTP server on a free port.
struct Replica : test::ServerThread {
  Replica(Runtime& rt, const chat::ChatTemplate& tmpl, const std::string& redis_url) {
    SchedulerConfig sc;
    sc.session.kv.ctx_size = 512;
    sc.parallel = 2;
    sc.prefill_chunk = 64;
    sc.eos_ids = {1};
    if (!redis_url.empty()) {
      store::RedisStoreOptions o;
      o.url = redis_url;
      o.timeout_ms = 200;
      store = store::open_redis_store(o);
      sc.store = store.get();
      sc.store_identity = prompt_cache_identity(rt.model(), rt.tokenizer(), sc.session.kv).config_key;
    }
    server::ServerConfig cfg;
    cfg.model_name = "kjv-tiny";
    cfg.render_chat = [&tmpl](const json& messages, const json&, const json&) { return test::render_chat(tmpl, messages); };
    serve(rt, sc, cfg);
    EXPECT_GT(port_, 0);
  }
  json post(const std::string& path, const json& body) const {
    const auto r = client().Post(path.c_str(), body.dump(), "application/json");
    if (!r) {
      ADD_FAILURE() << "no response from " << path;
      return json::object();
    }
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body, nullptr, false);
  }
  // A metric's value from /metrics (-1 when absent).
  double metric(const std::string& name) const {
    const auto r = client().Get("/metrics");
    if (!r) return -1;
    const std::string key = "\n" + name + " ";
    const size_t at = r->body.find(key);
    return at == std::string::npos ? -1 : std::stod(r->body.substr(at + key.size()));
  }
  void flush() const {
    if (store) {
      EXPECT_TRUE(store->flush(std::chrono::seconds(30)));
    }
  }

  ~Replica() { stop_serving(); }  // before the store goes
  Scheduler& scheduler() const { return *sch_; }
  int port() const { return port_; }
  std::unique_ptr<KVStore> store;
};

class KVStoreServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    rt_ = new Runtime({test::repo_model("kjv-tiny"), 2, true});
    tmpl_ = new chat::ChatTemplate(chat::ChatTemplate::from_string(test::kChatML));
  }
  static void TearDownTestSuite() {
    delete rt_;
    delete tmpl_;
  }
  void SetUp() override {
    if (!store::redis_available()) GTEST_SKIP() << "built without hiredis (libhiredis-dev)";
    if (!test::RedisServer::available()) GTEST_SKIP() << "redis-server is not installed";
  }
  static json chat(const json& messages, int max_tokens) {
    return {{"model", "kjv-tiny"}, {"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
  }
  static json first_turn() {
    return json::array({{{"role", "system"}, {"content", kSystem}},
                        {{"role", "user"}, {"content", "And God made the firmament"}}});
  }
  static json second_turn(const std::string& reply) {
    json m = first_turn();
    m.push_back({{"role", "assistant"}, {"content", reply}});
    m.push_back({{"role", "user"}, {"content", "And the evening and the morning were the second day"}});
    return m;
  }
  static std::string content(const json& r) { return r["choices"][0]["message"]["content"]; }
  static int cached(const json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"]; }
  static Runtime* rt_;
  static chat::ChatTemplate* tmpl_;
};
Runtime* KVStoreServerTest::rt_ = nullptr;
chat::ChatTemplate* KVStoreServerTest::tmpl_ = nullptr;

TEST_F(KVStoreServerTest, AConversationContinuedOnAnotherReplicaPrefillsOnlyTheNewTurn) {
  // A single server (no store), both turns: the reference.
  std::string reply1, reply2;
  int ref_cached = 0;
  std::string text1, text2;
  {
    Replica single(*rt_, *tmpl_, "");
    reply1 = content(single.post("/v1/chat/completions", chat(first_turn(), 24)));
    const json r2 = single.post("/v1/chat/completions", chat(second_turn(reply1), 16));
    reply2 = content(r2);
    ref_cached = cached(r2);
    text1 = single.post("/v1/completions", {{"prompt", kSystem}, {"max_tokens", 20}, {"temperature", 0}})["choices"][0]["text"];
    text2 = single.post("/v1/completions", {{"prompt", std::string(kSystem) + text1 + " And God said"},
                                            {"max_tokens", 12}, {"temperature", 0}})["choices"][0]["text"];
  }
  ASSERT_GT(ref_cached, 64);  // the first turn's blocks, from the single server's pool
  test::RedisServer redis;
  ASSERT_TRUE(redis.running());
  Replica a(*rt_, *tmpl_, redis.url()), b(*rt_, *tmpl_, redis.url());

  // Chat: turn 1 on A, turn 2 on B.
  const json a1 = a.post("/v1/chat/completions", chat(first_turn(), 24));
  EXPECT_EQ(content(a1), reply1);
  EXPECT_EQ(cached(a1), 0);
  a.flush();
  const json b2 = b.post("/v1/chat/completions", chat(second_turn(reply1), 16));
  EXPECT_EQ(content(b2), reply2);
  // The whole blocks of the history: only the new turn and the rest of the history's last block
  // computed (a store exchanges whole blocks; the single server also copied the tokens of the block
  // it shared partly from its own pool: docs/server.md).
  const int whole = ref_cached / 32 * 32;
  EXPECT_EQ(cached(b2), whole);
  const int prompt2 = b2["usage"]["prompt_tokens"];
  EXPECT_EQ(b.metric("ptllm_prefill_tokens_total"), prompt2 - whole);
  // Loaded up to the last block where an adoption would be exact (adoption_is_exact), adopted as far
  // as the blocks found go: the whole blocks the single server adopted from its pool.
  EXPECT_GE(b.metric("ptllm_kv_store_hits_total"), whole / 32);
  EXPECT_EQ(b.metric("ptllm_kv_store_prompt_tokens_total"), whole);
  EXPECT_EQ(b.metric("ptllm_kv_store_lookup_seconds_count"), 1);
  EXPECT_GT(b.metric("ptllm_kv_store_bytes_in_total"), 0);
  EXPECT_EQ(b.metric("ptllm_kv_store_errors_total"), 0);
  EXPECT_EQ(a.metric("ptllm_kv_store_writes_total"), a.metric("ptllm_kv_store_puts_total"));  // flushed, all written
  EXPECT_GT(a.metric("ptllm_kv_store_bytes_out_total"), 0);

  // Completions: the same the other way round (B first, A continues).
  const json c1 = b.post("/v1/completions", {{"prompt", kSystem}, {"max_tokens", 20}, {"temperature", 0}});
  EXPECT_EQ(c1["choices"][0]["text"], text1);
  b.flush();
  const json c2 = a.post("/v1/completions", {{"prompt", std::string(kSystem) + text1 + " And God said"},
                                             {"max_tokens", 12}, {"temperature", 0}});
  EXPECT_EQ(c2["choices"][0]["text"], text2);
  const int p1 = c1["usage"]["prompt_tokens"];
  // The first prompt's full blocks came from B, as far as an adoption is exact: the rest is computed
  // in chunks of more than 16 tokens, or ends with the cold prompt's last chunk (of 64) when that is
  // shorter (docs/server.md).
  EXPECT_GT(cached(c2), 0);
  EXPECT_LE(cached(c2), (p1 / 32) * 32);
  const int p2 = c2["usage"]["prompt_tokens"], rest = p2 - cached(c2), last = (p2 - 1) % 64 + 1;
  EXPECT_TRUE(last <= 16 ? rest == last || rest - last > 16 : rest > 16) << rest << " " << last;
  EXPECT_GT(a.metric("ptllm_kv_store_hits_total"), 0);
}

TEST_F(KVStoreServerTest, ACorruptedValueIsAMissAndTheRightAnswer) {
  std::string reply1, reply2;
  {
    Replica single(*rt_, *tmpl_, "");
    reply1 = content(single.post("/v1/chat/completions", chat(first_turn(), 24)));
    reply2 = content(single.post("/v1/chat/completions", chat(second_turn(reply1), 16)));
  }
  test::RedisServer redis;
  Replica a(*rt_, *tmpl_, redis.url());
  EXPECT_EQ(content(a.post("/v1/chat/completions", chat(first_turn(), 24))), reply1);
  a.flush();
  // The key of the conversation's first block, its value damaged in Redis.
  chat::ChatRequest req;
  req.messages = second_turn(reply1);
  req.add_generation_prompt = true;
  const std::string prompt = tmpl_->render(req);
  const auto ids = rt_->tokenizer().encode(prompt, {.add_special = false});
  std::vector<BlockHash> hashes;
  a.scheduler().pool().extend_block_hashes(ids, 1, hashes);
  const Digest identity = prompt_cache_identity(rt_->model(), rt_->tokenizer(), a.scheduler().config().session.kv).config_key;
  const std::vector<std::string> key = {kv_store_key("ptllm", identity, hashes[0])};
  store::RedisStoreOptions o;
  o.url = redis.url();
  auto raw = store::open_redis_store(o);
  auto v = raw->get(key);
  ASSERT_TRUE(v[0]) << "A did not put its first block";
  std::string bad(*v[0]);
  bad[bad.size() / 2] = char(bad[bad.size() / 2] ^ 0x10);
  raw->put(key[0], bad);
  ASSERT_TRUE(raw->flush(std::chrono::seconds(30)));

  Replica b(*rt_, *tmpl_, redis.url());
  const json b2 = b.post("/v1/chat/completions", chat(second_turn(reply1), 16));
  EXPECT_EQ(content(b2), reply2);
  EXPECT_EQ(cached(b2), 0);
  EXPECT_EQ(b.metric("ptllm_kv_store_rejected_total"), 1);
  EXPECT_EQ(b.metric("ptllm_kv_store_hits_total"), 0);
}

TEST_F(KVStoreServerTest, RedisKilledMidRunBothReplicasKeepAnswering) {
  std::string reply1, reply2, other;
  const json third = json::array({{{"role", "user"}, {"content", "And God called the firmament Heaven"}}});
  {
    Replica single(*rt_, *tmpl_, "");
    reply1 = content(single.post("/v1/chat/completions", chat(first_turn(), 24)));
    reply2 = content(single.post("/v1/chat/completions", chat(second_turn(reply1), 16)));
    other = content(single.post("/v1/chat/completions", chat(third, 16)));
  }
  test::RedisServer redis;
  Replica a(*rt_, *tmpl_, redis.url()), b(*rt_, *tmpl_, redis.url());
  EXPECT_EQ(content(a.post("/v1/chat/completions", chat(first_turn(), 24))), reply1);
  redis.kill();
  EXPECT_EQ(content(b.post("/v1/chat/completions", chat(second_turn(reply1), 16))), reply2);
  EXPECT_EQ(content(a.post("/v1/chat/completions", chat(second_turn(reply1), 16))), reply2);
  EXPECT_EQ(content(b.post("/v1/chat/completions", chat(third, 16))), other);
  EXPECT_EQ(content(a.post("/v1/chat/completions", chat(third, 16))), other);
  EXPECT_GE(b.metric("ptllm_kv_store_errors_total"), 1);
  httplib::Client c("127.0.0.1", a.port());
  const auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}


// `posttrainllm serve --kv-store URL` on kjv-tiny (tests/serve_process.h), its stderr in dir/name.
struct StoreServe : test::ServeProcess {
  StoreServe(const std::string& redis_url, const std::filesystem::path& dir, const char* name)
      : ServeProcess(test::repo_model("kjv-tiny"), {"--kv-store", redis_url, "--kv-store-prefix", "proc"}, dir / name) {}
  json post(const json& body) const { return post_ok("/v1/completions", body); }
};

TEST(KVStoreServeProcesses, TwoProcessesShareTheirBlocksThroughRedis) {
  if (!store::redis_available()) GTEST_SKIP() << "built without hiredis (libhiredis-dev)";
  if (!test::RedisServer::available()) GTEST_SKIP() << "redis-server is not installed";
  test::RedisServer redis;
  test::TempDir tmp;
  StoreServe a(redis.url(), tmp.path, "a.err"), b(redis.url(), tmp.path, "b.err");
  ASSERT_GT(a.port, 0) << a.log();
  ASSERT_GT(b.port, 0) << b.log();
  EXPECT_NE(a.log().find("kv store: redis://127.0.0.1:" + std::to_string(redis.port()) + "/0, keys proc:"), std::string::npos)
      << a.log();
  const json turn1 = {{"prompt", kSystem}, {"max_tokens", 16}, {"temperature", 0}};
  const json r1 = a.post(turn1);
  // A's blocks reach Redis from its writer thread: wait until it wrote all it queued (a bound).
  for (int i = 0; i < 3000 && a.metric("ptllm_kv_store_writes_total") < a.metric("ptllm_kv_store_puts_total"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GT(a.metric("ptllm_kv_store_writes_total"), 0);
  const std::string history = std::string(kSystem) + r1["choices"][0]["text"].get<std::string>() + " And God said";
  const json turn2 = {{"prompt", history}, {"max_tokens", 12}, {"temperature", 0}};
  const json on_b = b.post(turn2);
  const json on_a = a.post(turn2);  // A answers from its own pool: the single-server answer
  EXPECT_EQ(on_b["choices"][0]["text"], on_a["choices"][0]["text"]);
  const int p1 = r1["usage"]["prompt_tokens"];
  EXPECT_GE(on_b["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), (p1 / 32) * 32);
  // B takes A's whole blocks from Redis; A, from its own pool, also the tokens of the block it shares
  // partly (copied: a store exchanges whole blocks).
  EXPECT_EQ(on_b["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
            on_a["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>() / 32 * 32);
  EXPECT_GT(b.metric("ptllm_kv_store_hits_total"), 0);
  EXPECT_EQ(a.stop(), 0);
  EXPECT_EQ(b.stop(), 0);
}

TEST(KVStoreServeProcesses, BadStoreFlagsAreRefusedWithTheirNames) {
  const std::string serve = test::binary() + " serve " + test::repo_model("kjv-tiny").string() + " --port 0 ";
  const auto url = test::run_command(serve + "--kv-store http://127.0.0.1:6379");
  EXPECT_EQ(url.code, 2);
  EXPECT_NE(url.err.find("--kv-store http://127.0.0.1:6379: expected redis://"), std::string::npos) << url.err;
  const auto port = test::run_command(serve + "--kv-store redis://127.0.0.1:99999");
  EXPECT_EQ(port.code, 2);
  EXPECT_NE(port.err.find("the port '99999'"), std::string::npos) << port.err;
  const auto prefix = test::run_command(serve + "--kv-store-prefix 'a:b'");
  EXPECT_EQ(prefix.code, 2);
  EXPECT_NE(prefix.err.find("--kv-store-prefix"), std::string::npos) << prefix.err;
  // A build without hiredis says so.
  if (!store::redis_available()) {
    const auto none = test::run_command(serve + "--kv-store redis://127.0.0.1:1");
    EXPECT_EQ(none.code, 2);
    EXPECT_NE(none.err.find("no Redis client"), std::string::npos) << none.err;
  }
}

// A Redis that is not there at the start: a warning, and the server answers as without a store.
TEST(KVStoreServeProcesses, ARedisDownAtTheStartIsAWarningNotAnError) {
  if (!store::redis_available()) GTEST_SKIP() << "built without hiredis (libhiredis-dev)";
  test::TempDir tmp;
  StoreServe a("redis://127.0.0.1:" + std::to_string(test::free_port()), tmp.path, "a.err");
  ASSERT_GT(a.port, 0) << a.log();
  EXPECT_NE(a.log().find("warning: kv store: cannot connect to 127.0.0.1:"), std::string::npos) << a.log();
  const json r = a.post({{"prompt", kSystem}, {"max_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 8);
  EXPECT_GE(a.metric("ptllm_kv_store_errors_total"), 1);
  EXPECT_EQ(a.stop(), 0);
}

}  // namespace
}  // namespace ptllm
