// `serve --prompt-cache-dir` and `serve --kv-store redis://` under every KV setting (KIVI, StreamingLLM
// with and without it, a sliding-window model): a conversation's first turn, then, after a restart on
// the same directory or on a second server sharing the Redis, the conversation with a new turn: its
// history comes from the store (cached_tokens) and the reply is a cold server's.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "redis_server.h"
#include "serve_process.h"
#include "store/redis_store.h"
#include "test_util.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

const char* kHistory =
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
    "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God "
    "said, Let there be light: and there was light. And God saw the light, that it was good: and God divided the "
    "light from the darkness. And God called the light Day, and the darkness he called Night. And the evening "
    "and the morning were the first day. And God said, Let there be a firmament in the midst of the waters, and "
    "let it divide the waters from the waters.";

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
