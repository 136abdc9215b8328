// `serve --prompt-cache-dir` and `serve --kv-store redis://` under every KV setting (KIVI, StreamingLLM
// with and without it, a sliding-window model): a conversation's first turn, then, after a restart on
// the same directory or on a second server sharing the Redis, the conversation with a new turn: its
// history comes from the store (cached_tokens) and the reply is a cold server's.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "redis_server.h"
#include "serve_process.h"
#include "store/redis_store.h"
#include "test_util.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

const char* kHistory = test::kGenesis;

struct ServeSetting {
  const char* name;
  const char* model;
  bool shared;  // ../shared/models (skipped when absent)
  std::vector<std::string> flags;
};

fs::path model_of(const ServeSetting& s) { return s.shared ? test::shared_model(s.model) : test::repo_model(s.model); }

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

json completion(const std::string& prompt, int max_tokens) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

int cached(const json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(); }
std::string text(const json& r) { return r["choices"][0]["text"].get<std::string>(); }

// The second turn on a cold server (no store): the reference.
json cold_reply(const ServeSetting& st, const fs::path& dir, const json& body) {
  test::ServeProcess c(model_of(st), st.flags, dir / "cold.err");
  EXPECT_GT(c.port, 0) << c.log();
  json r = c.post_ok("/v1/completions", body);
  EXPECT_EQ(cached(r), 0);
  EXPECT_EQ(c.stop(), 0);
  return r;
}

class ExchangeServe : public ::testing::TestWithParam<ServeSetting> {};

TEST_P(ExchangeServe, ARestartOnTheDirectoryContinuesAsAColdServer) {
  const ServeSetting& st = GetParam();
  if (!fs::exists(model_of(st) / "config.json")) GTEST_SKIP() << model_of(st) << " not present";
  test::TempDir tmp;
  const auto flags = st.flags + std::vector<std::string>{"--prompt-cache-dir", (tmp.path / "cache").string()};
  std::string turn2;
  {
    test::ServeProcess a(model_of(st), flags, tmp.path / "a.err");
    ASSERT_GT(a.port, 0) << a.log();
    const json r1 = a.post_ok("/v1/completions", completion(kHistory, 16));
    turn2 = std::string(kHistory) + text(r1) + " And God said";
    EXPECT_EQ(a.stop(), 0);  // the queued blocks are written before the exit
  }
  const json body = completion(turn2, 12);
  test::ServeProcess b(model_of(st), flags, tmp.path / "b.err");
  ASSERT_GT(b.port, 0) << b.log();
  const json r2 = b.post_ok("/v1/completions", body);
  EXPECT_GT(cached(r2), 0) << b.log();
  EXPECT_GT(b.metric("ptllm_kv_store_hits_total"), 0);
  EXPECT_EQ(b.metric("ptllm_kv_store_rejected_total"), 0);
  EXPECT_EQ(b.stop(), 0);
  EXPECT_EQ(text(r2), text(cold_reply(st, tmp.path, body)));
}

TEST_P(ExchangeServe, TwoServersSharingARedisAnswerAsAColdServer) {
  const ServeSetting& st = GetParam();
  if (!fs::exists(model_of(st) / "config.json")) GTEST_SKIP() << model_of(st) << " not present";
  if (!store::redis_available()) GTEST_SKIP() << "built without hiredis (libhiredis-dev)";
  if (!test::RedisServer::available()) GTEST_SKIP() << "redis-server is not installed";
  test::RedisServer redis;
  test::TempDir tmp;
  const auto flags = st.flags + std::vector<std::string>{"--kv-store", redis.url()};
  test::ServeProcess a(model_of(st), flags, tmp.path / "a.err"), b(model_of(st), flags, tmp.path / "b.err");
  ASSERT_GT(a.port, 0) << a.log();
  ASSERT_GT(b.port, 0) << b.log();
  const json r1 = a.post_ok("/v1/completions", completion(kHistory, 16));
  // A's blocks reach Redis from its writer thread: wait until it wrote all it queued (a bound).
  for (int i = 0; i < 3000 && a.metric("ptllm_kv_store_writes_total") < a.metric("ptllm_kv_store_puts_total"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GT(a.metric("ptllm_kv_store_writes_total"), 0);
  const json body = completion(std::string(kHistory) + text(r1) + " And God said", 12);
  const json on_b = b.post_ok("/v1/completions", body);
  EXPECT_GT(cached(on_b), 0);
  EXPECT_GT(b.metric("ptllm_kv_store_hits_total"), 0);
  EXPECT_EQ(a.stop(), 0);
  EXPECT_EQ(b.stop(), 0);
  EXPECT_EQ(text(on_b), text(cold_reply(st, tmp.path, body)));
}

// The bytes of the block files under dir/blocks.
uint64_t block_file_bytes(const fs::path& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir / "blocks"))
    if (e.is_regular_file() && e.path().extension() == ".kvblock") n += e.file_size();
  return n;
}

// An int4 server (default residual of 128) restarted on its directory restores the whole quantized
// history of a 2,000-token conversation, not only what fits its full-precision pool: the restarted
// server adopts as many tokens as the server that computed them adopts from its own pool, the reply is
// an uninterrupted server's, and the directory holds the int4 groups, not their float32 form.
TEST(ExchangeServeKivi, ARestartedInt4ServerRestoresTheWholeHistory) {
  const fs::path model = test::repo_model("kjv-tiny");
  std::ifstream in(test::repo_dir() / "tests" / "data" / "gptq_calib.txt");
  const std::string calib((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(calib.size(), 5000u);
  const std::string history = (calib + "\n" + calib).substr(0, 7600);
  test::TempDir tmp;
  const std::vector<std::string> kv = {"--kv-quantize", "int4", "-np", "1", "-c", "2048"};
  const auto flags = kv + std::vector<std::string>{"--prompt-cache-dir", (tmp.path / "cache").string()};
  json r1;
  {
    test::ServeProcess a(model, flags, tmp.path / "a.err");
    ASSERT_GT(a.port, 0) << a.log();
    r1 = a.post_ok("/v1/completions", completion(history, 16));
    EXPECT_EQ(a.stop(), 0);
  }
  const uint64_t bytes = block_file_bytes(tmp.path / "cache");  // the first turn's blocks
  const int history_tokens = r1["usage"]["prompt_tokens"].get<int>();
  ASSERT_GE(history_tokens, 1900);
  ASSERT_LE(history_tokens, 2000);
  const json body = completion(history + text(r1) + " And the LORD", 8);
  // The reference: one server that keeps its pool, the conversation's two turns.
  json uninterrupted;
  {
    test::ServeProcess c(model, kv, tmp.path / "c.err");
    ASSERT_GT(c.port, 0) << c.log();
    EXPECT_EQ(text(c.post_ok("/v1/completions", completion(history, 16))), text(r1));
    uninterrupted = c.post_ok("/v1/completions", body);
    EXPECT_EQ(c.stop(), 0);
  }
  test::ServeProcess b(model, flags, tmp.path / "b.err");
  ASSERT_GT(b.port, 0) << b.log();
  const json r2 = b.post_ok("/v1/completions", body);
  EXPECT_EQ(b.metric("ptllm_kv_store_rejected_total"), 0);
  EXPECT_EQ(b.stop(), 0);
  // Every block the uninterrupted server adopted (the history on the prefill grid of 64, the last
  // token computed) came from the directory.
  EXPECT_GE(cached(uninterrupted), history_tokens - 64) << b.log();
  EXPECT_EQ(cached(r2), cached(uninterrupted)) << b.log();
  EXPECT_EQ(text(r2), text(uninterrupted));
  // The float32 form of the history's blocks, as values: what the directory held before groups
  // travelled quantized (kjv-tiny: 4 layers of 32 tokens x 2 heads x 32 dims, K and V).
  const uint64_t blocks = uint64_t(history_tokens) / 32;
  const uint64_t fp32_bytes = blocks * (80 + 32 * 4 + 4 * 32 * 2 * 32 * 2 * 4 + 8);
  std::printf("int4 history of %d tokens: %d cached after a restart (uninterrupted %d); %llu bytes on disk, %.3fx "
              "the float32 form's %llu\n",
              history_tokens, cached(r2), cached(uninterrupted), static_cast<unsigned long long>(bytes),
              double(bytes) / double(fp32_bytes), static_cast<unsigned long long>(fp32_bytes));
  EXPECT_LE(double(bytes), 0.3 * double(fp32_bytes));
}

// The same through Redis: a second int4 replica continues the 2,000-token history another computed,
// every block the first would adopt from its own pool loaded, the first's answer, and int4 bytes
// written (the writer's byte count against the float32 form's).
TEST(ExchangeServeKivi, AnInt4ReplicaLoadsTheWholeHistoryFromRedis) {
  if (!store::redis_available()) GTEST_SKIP() << "built without hiredis (libhiredis-dev)";
  if (!test::RedisServer::available()) GTEST_SKIP() << "redis-server is not installed";
  const fs::path model = test::repo_model("kjv-tiny");
  std::ifstream in(test::repo_dir() / "tests" / "data" / "gptq_calib.txt");
  const std::string calib((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string history = (calib + "\n" + calib).substr(0, 7600);
  test::RedisServer redis;
  test::TempDir tmp;
  const auto flags = std::vector<std::string>{"--kv-quantize", "int4", "-np", "1", "-c", "2048", "--kv-store", redis.url()};
  test::ServeProcess a(model, flags, tmp.path / "a.err"), b(model, flags, tmp.path / "b.err");
  ASSERT_GT(a.port, 0) << a.log();
  ASSERT_GT(b.port, 0) << b.log();
  const json r1 = a.post_ok("/v1/completions", completion(history, 16));
  for (int i = 0; i < 3000 && a.metric("ptllm_kv_store_writes_total") < a.metric("ptllm_kv_store_puts_total"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double written = a.metric("ptllm_kv_store_bytes_out_total");
  const json body = completion(history + text(r1) + " And the LORD", 8);
  const json on_a = a.post_ok("/v1/completions", body);  // A's own pool: the reference
  const json on_b = b.post_ok("/v1/completions", body);
  const int history_tokens = r1["usage"]["prompt_tokens"].get<int>();
  EXPECT_GE(cached(on_a), history_tokens - 64);
  EXPECT_EQ(cached(on_b), cached(on_a)) << b.log();
  EXPECT_EQ(text(on_b), text(on_a));
  EXPECT_EQ(b.metric("ptllm_kv_store_rejected_total"), 0);
  const double fp32_bytes = double(history_tokens / 32) * (80 + 32 * 4 + 4 * 32 * 2 * 32 * 2 * 4 + 8);
  std::printf("int4 history of %d tokens through Redis: %d cached on the other replica (%d on the first); %.0f bytes "
              "written, %.3fx the float32 form's\n",
              history_tokens, cached(on_b), cached(on_a), written, written / fp32_bytes);
  EXPECT_GT(written, 0);
  EXPECT_LE(written, 0.3 * fp32_bytes);
  EXPECT_EQ(a.stop(), 0);
  EXPECT_EQ(b.stop(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Settings, ExchangeServe,
    ::testing::Values(
        ServeSetting{"int8", "kjv-tiny", false, {"--kv-quantize", "int8", "--kv-residual", "32"}},
        ServeSetting{"int4", "kjv-tiny", false, {"--kv-quantize", "int4", "--kv-residual", "32"}},
        ServeSetting{"streaming", "kjv-tiny", false, {"--streaming-llm-sink", "4", "--streaming-llm-window", "96"}},
        ServeSetting{"streaming_int4",
                     "kjv-tiny",
                     false,
                     {"--kv-quantize", "int4", "--kv-residual", "32", "--streaming-llm-sink", "32", "--streaming-llm-window", "96"}},
        ServeSetting{"sliding", "mistral-swa-tiny", true, {}}),
    [](const ::testing::TestParamInfo<ServeSetting>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ptllm
