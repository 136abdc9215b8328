// One `--prompt-cache-dir` format for `sample`, `chat` and `serve`: a directory `sample` wrote gives
// `serve` its prefix blocks and the reverse, under dense and KIVI settings. A hit computes only the
// tail the directory lacks, and the continuation is a cold run's, token for token.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "serve_process.h"
#include "test_util.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

const std::string kHistory = test::kGenesis;
const std::string kTurn = kHistory + " And God made the firmament, and divided the waters";

struct Setting {
  const char* name;
  std::vector<std::string> kv;
};
void PrintTo(const Setting& s, std::ostream* os) { *os << s.name; }

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += " " + x;
  return s;
}

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

test::RunResult sample(const std::string& prompt, const std::string& flags) {
  return test::run_command(test::binary() + " sample " + test::repo_model("kjv-tiny").string() + " -p '" + prompt +
                           "' -n 16 --ignore-eos --temperature 0 -t 1" + flags);
}

json completion(const std::string& prompt) {
  return {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}, {"ignore_eos", true}};
}
std::string text(const json& r) { return r["choices"][0]["text"].get<std::string>(); }
int64_t cached(const json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(); }
int64_t prompt_tokens(const json& r) { return r["usage"]["prompt_tokens"].get<int64_t>(); }

// "prompt cache: hit, R of N tokens reused from ...": R, or -1 when the line is absent.
int64_t reused_of(const std::string& err) {
  std::smatch m;
  if (!std::regex_search(err, m, std::regex("prompt cache: hit, (\\d+) of (\\d+) tokens reused from"))) return -1;
  return std::stoll(m[1]);
}

class SharedDir : public ::testing::TestWithParam<Setting> {};

TEST_P(SharedDir, ADirectoryWrittenBySampleGivesServeItsPrefix) {
  const Setting& st = GetParam();
  test::TempDir tmp;
  const std::string dir = (tmp.path / "cache").string();
  const auto miss = sample(kHistory, joined(st.kv) + " --prompt-cache-dir " + dir);
  ASSERT_EQ(miss.code, 0) << miss.err;
  EXPECT_NE(miss.err.find("prompt cache: miss"), std::string::npos) << miss.err;
  EXPECT_NE(miss.err.find("prompt cache: saved"), std::string::npos) << miss.err;

  json hot, cold;
  {
    test::ServeProcess s(test::repo_model("kjv-tiny"), st.kv + std::vector<std::string>{"--prompt-cache-dir", dir},
                         tmp.path / "hot.err");
    ASSERT_GT(s.port, 0) << s.log();
    hot = s.post_ok("/v1/completions", completion(kTurn));
    EXPECT_GT(cached(hot), 0) << s.log();
    EXPECT_GT(s.metric("ptllm_kv_store_hits_total"), 0);
    EXPECT_EQ(s.metric("ptllm_kv_store_rejected_total"), 0);
    // Only the tail the directory lacks is computed.
    EXPECT_EQ(s.metric("ptllm_prefill_tokens_total"), prompt_tokens(hot) - cached(hot));
    EXPECT_EQ(s.stop(), 0);
  }
  {
    test::ServeProcess c(test::repo_model("kjv-tiny"), st.kv, tmp.path / "cold.err");
    ASSERT_GT(c.port, 0) << c.log();
    cold = c.post_ok("/v1/completions", completion(kTurn));
    EXPECT_EQ(cached(cold), 0);
    EXPECT_EQ(c.stop(), 0);
  }
  EXPECT_EQ(text(hot), text(cold));
}

TEST_P(SharedDir, ADirectoryWrittenByServeGivesSampleItsPrefix) {
  const Setting& st = GetParam();
  test::TempDir tmp;
  const std::string dir = (tmp.path / "cache").string();
  {
    test::ServeProcess s(test::repo_model("kjv-tiny"), st.kv + std::vector<std::string>{"--prompt-cache-dir", dir},
                         tmp.path / "a.err");
    ASSERT_GT(s.port, 0) << s.log();
    s.post_ok("/v1/completions", completion(kHistory));
    EXPECT_EQ(s.stop(), 0);  // the queued blocks are written before the exit
  }
  const auto hot = sample(kTurn, joined(st.kv) + " --prompt-cache-dir " + dir);
  const auto cold = sample(kTurn, joined(st.kv));
  ASSERT_EQ(hot.code, 0) << hot.err;
  ASSERT_EQ(cold.code, 0) << cold.err;
  const int64_t reused = reused_of(hot.err);
  EXPECT_GT(reused, 0) << hot.err;
  EXPECT_EQ(hot.err.find("warning"), std::string::npos) << hot.err;
  EXPECT_EQ(hot.out, cold.out);
  // The footer's prompt line counts the whole prompt; the hit line names the tail computed.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(hot.err, m, std::regex("of (\\d+) tokens reused from .*, (\\d+) prefilled")));
  EXPECT_EQ(std::stoll(m[2]), std::stoll(m[1]) - reused);
}

// Another precision reads none of the blocks (they are keyed by the KV settings): a plain miss, and
// the cold output.
TEST(SharedDirMismatch, AnotherPrecisionIsAMiss) {
  test::TempDir tmp;
  const std::string dir = " --prompt-cache-dir " + (tmp.path / "cache").string();
  ASSERT_EQ(sample(kHistory, " --kv-quantize int4" + dir).code, 0);
  const auto other = sample(kHistory, " --kv-quantize fp16" + dir);
  ASSERT_EQ(other.code, 0) << other.err;
  EXPECT_NE(other.err.find("prompt cache: miss"), std::string::npos) << other.err;
  EXPECT_EQ(other.out, sample(kHistory, " --kv-quantize fp16").out);
}

INSTANTIATE_TEST_SUITE_P(Settings, SharedDir,
                         ::testing::Values(Setting{"fp32", {}}, Setting{"fp16", {"--kv-quantize", "fp16"}},
                                           Setting{"int4", {"--kv-quantize", "int4", "--kv-group-size", "8",
                                                            "--kv-residual", "16"}}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ptllm
