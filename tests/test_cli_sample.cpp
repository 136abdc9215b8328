// `posttrainllm sample` end to end, as a user runs it: text out, stats on stderr, exit codes.
#include <gtest/gtest.h>

#include <cstdio>

#include "test_util.h"

namespace ptllm {
namespace {

std::string sample_cmd(const std::string& args) { return test::binary() + " sample " + args; }

// The greedy golden text of kjv-tiny's first prompt, produced from the text prompt (tokenizer included).
TEST(CliSampleTest, GreedyTextMatchesGolden) {
  auto golden = test::read_json(test::repo_model("kjv-tiny") / "golden.json");
  const auto& p = golden["prompts"][0];
  auto r = test::run_command(sample_cmd("--prompt '" + p["text"].get<std::string>() +
                                        "' --tokens 48 --temperature 0 --ignore-eos --threads 2"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, p["greedy_text"].get<std::string>() + "\n");
  EXPECT_NE(r.err.find("prompt: 4 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kv cache: fp32, stored 51 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("time to first token"), std::string::npos);
}

TEST(CliSampleTest, NoCacheAndOnDemandBlocksGiveTheSameText) {
  const std::string base = sample_cmd(test::repo_model("qwen2-tiny").string() +
                                      " --prompt 'And God said' --tokens 30 --temperature 0 --ignore-eos");
  auto a = test::run_command(base);
  auto b = test::run_command(base + " --no-cache");
  auto c = test::run_command(base + " --no-kv-preallocate");
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_FALSE(a.out.empty());
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out, c.out);
  EXPECT_NE(c.err.find("on demand"), std::string::npos) << c.err;
}

TEST(CliSampleTest, SeedMakesSamplingReproducible) {
  const std::string base = sample_cmd("--prompt 'In the beginning' --tokens 40 --temperature 1.0 --top-k 0 --top-p 1");
  auto a = test::run_command(base + " --seed 11");
  auto b = test::run_command(base + " --seed 11");
  auto c = test::run_command(base + " --seed 12");
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

TEST(CliSampleTest, BadFlagValuesExitWithCode2) {
  EXPECT_EQ(test::run_command(sample_cmd("--prompt x --tokens abc")).code, 2);
  EXPECT_EQ(test::run_command(sample_cmd("--prompt x --temperature -1")).code, 2);
  EXPECT_EQ(test::run_command(sample_cmd("--prompt x --top-p 1.5")).code, 2);
  EXPECT_EQ(test::run_command(sample_cmd("--prompt x --ctx-size 0")).code, 2);
  EXPECT_EQ(test::run_command(sample_cmd("--prompt x --no-such-flag")).code, 2);
  EXPECT_EQ(test::run_command(sample_cmd("--tokens 3")).code, 2);  // --prompt is required
  EXPECT_EQ(test::run_command(sample_cmd("--prompt x --kv-preallocate --no-kv-preallocate")).code, 2);
  auto help = test::run_command(sample_cmd("--help"));
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("--ctx-size"), std::string::npos);
}

TEST(CliSampleTest, StreamingAndKiviFlagErrors) {
  auto r = test::run_command(sample_cmd("--prompt x --streaming-llm-sink 4 --streaming-llm-window 0"));
  EXPECT_EQ(r.code, 2);
  r = test::run_command(sample_cmd("--prompt x --streaming-llm-sink 4"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--streaming-llm-sink needs --streaming-llm-window"), std::string::npos) << r.err;
  r = test::run_command(sample_cmd("--prompt x --streaming-llm-sink 5000 --streaming-llm-window 8 --ctx-size 64"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("must be smaller than --ctx-size"), std::string::npos) << r.err;
  r = test::run_command(sample_cmd("--prompt x --streaming-llm-sink 4 --streaming-llm-window 16 --no-cache"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--no-cache"), std::string::npos) << r.err;
  r = test::run_command(sample_cmd("--prompt x --kv-quantize int4 --kv-residual 100"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(test::run_command(sample_cmd("--prompt x --kv-quantize int3")).code, 2);
  EXPECT_EQ(test::run_command(sample_cmd("--prompt x --streaming-positions relative")).code, 2);
}

// Past the cap the footer reports stored tokens against the position counter.
TEST(CliSampleTest, StreamingFooterReportsTheCap) {
  auto r = test::run_command(sample_cmd("--prompt 'In the beginning' --tokens 100 --temperature 0 --ignore-eos "
                                        "--streaming-llm-sink 4 --streaming-llm-window 24 --kv-quantize int4 "
                                        "--kv-group-size 8 --kv-residual 8"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("stored 28 of 103 (StreamingLLM cap)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("int4 g8 r8 sink4 w24 pos=cache"), std::string::npos) << r.err;
}

// A model whose every layer slides (mistral-swa-tiny, W = 64) has no context limit once --ctx-size
// holds the window: a generation longer than it runs, and the footer reports the window.
TEST(CliSampleTest, SlidingWindowModelRunsPastTheContextSize) {
  const auto dir = test::shared_model("mistral-swa-tiny");
  if (!std::filesystem::exists(dir / "model.safetensors")) GTEST_SKIP() << dir << " not found";
  auto r = test::run_command(sample_cmd(dir.string() + " --prompt 'In the beginning God created the heaven and the earth' "
                                        "--ctx-size 64 --tokens 200 --temperature 0 --ignore-eos"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("decode: 200 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" (sliding window)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stored 64 of "), std::string::npos) << r.err;
}

// A long generation reports its speed over the first and the last 500 steps (the StreamingLLM check:
// a bounded window keeps the two equal); a short one does not.
TEST(CliSampleTest, LongGenerationReportsFirstAndLastStepRates) {
  auto r = test::run_command(sample_cmd("--prompt 'In the beginning' --tokens 1201 --temperature 0 --ignore-eos "
                                        "--streaming-llm-sink 4 --streaming-llm-window 60"));
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t at = r.err.find("decode speed: steps 1-500 ");
  ASSERT_NE(at, std::string::npos) << r.err;
  double first = 0, last = 0;
  int from = 0, to = 0;
  ASSERT_EQ(std::sscanf(r.err.c_str() + at, "decode speed: steps 1-500 %lf tok/s, steps %d-%d %lf tok/s", &first,
                        &from, &to, &last),
            4)
      << r.err;
  EXPECT_EQ(from, 701);
  EXPECT_EQ(to, 1200);  // 1201 tokens sampled, 1200 fed back
  EXPECT_GT(first, 0);
  EXPECT_GT(last, 0);
  r = test::run_command(sample_cmd("--prompt 'In the beginning' --tokens 50 --temperature 0 --ignore-eos"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("decode speed:"), std::string::npos) << r.err;
}

TEST(CliSampleTest, BadModelExitsWithCode1AndNamesTheFile) {
  auto r = test::run_command(sample_cmd("/nonexistent/dir --prompt x"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("error: /nonexistent/dir: not a model directory"), std::string::npos) << r.err;

  test::TempDir tmp;
  std::filesystem::copy(test::repo_model("kjv-tiny"), tmp.path, std::filesystem::copy_options::recursive);
  std::filesystem::resize_file(tmp.path / "model.safetensors", 4096);
  r = test::run_command(sample_cmd(tmp.path.string() + " --prompt x"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("model.safetensors: tensor '"), std::string::npos) << r.err;
}

TEST(CliSampleTest, PromptLongerThanContextIsAClearError) {
  auto r = test::run_command(sample_cmd("--prompt 'In the beginning God created the heaven and the earth' --ctx-size 4"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("more than --ctx-size 4"), std::string::npos) << r.err;
  // Generation that reaches the capacity stops with a note instead of failing.
  r = test::run_command(sample_cmd("--prompt 'In the beginning' --ctx-size 10 --tokens 50 --temperature 0 --ignore-eos"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("stopped: the context is full (10 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stored 10 tokens"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ptllm
