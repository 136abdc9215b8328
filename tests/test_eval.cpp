// posttrainllm eval: cache specs, statistics, teacher-forced scoring through the cached path against
// transformers' golden NLL, and the command end to end (tables, JSON, plot, llama.cpp chunks).
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/eval.h"
#include "test_util.h"

namespace ptllm {
namespace {

// The message of the UsageError that parsing `spec` throws ("" when it does not throw).
std::string spec_error(const std::string& spec) {
  try {
    parse_cache_specs(spec, KVCacheConfig{});
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(EvalSpecTest, TokensApplyOnTopOfTheBase) {
  KVCacheConfig base;
  base.ctx_size = 123;
  base.preallocate = false;
  base.residual = 64;
  CacheSpec s = parse_cache_spec(" int4\tg16 sink4  w508 pos=cache ", base);
  EXPECT_EQ(s.name, "int4 g16 sink4 w508 pos=cache");
  EXPECT_EQ(s.kv.precision, KVPrecision::Int4);
  EXPECT_EQ(s.kv.group_size, 16);
  EXPECT_EQ(s.kv.residual, 64);
  EXPECT_EQ(s.kv.sink, 4);
  EXPECT_EQ(s.kv.window, 508);
  EXPECT_EQ(s.kv.positions, PositionMode::Cache);
  EXPECT_EQ(s.kv.ctx_size, 123);
  EXPECT_FALSE(s.kv.preallocate);
  // describe() (the name of a configuration given by flags) parses back to the same settings.
  EXPECT_EQ(parse_cache_spec(s.kv.describe(), KVCacheConfig{}).kv.describe(), s.kv.describe());

  const auto list = parse_cache_specs("fp32; ;int2 r0;bf16 pos=absolute;", KVCacheConfig{});
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].kv.precision, KVPrecision::F32);
  EXPECT_EQ(list[1].kv.precision, KVPrecision::Int2);
  EXPECT_EQ(list[1].kv.residual, 0);
  EXPECT_EQ(list[2].name, "bf16 pos=absolute");
  EXPECT_EQ(list[2].kv.precision, KVPrecision::BF16);
}

TEST(EvalSpecTest, RejectsUnknownBadRepeatedAndInvalid) {
  const std::string unknown = spec_error("fp32 int3");
  EXPECT_NE(unknown.find("cache spec 'fp32 int3': unknown token 'int3'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("known: fp32 fp16 bf16 int8 int4 int2 g<N> r<N> sink<N> w<N> pos=absolute|cache"),
            std::string::npos)
      << unknown;
  EXPECT_NE(spec_error("gx").find("unknown token 'gx'"), std::string::npos);
  EXPECT_NE(spec_error("pos=relative").find("bad value in 'pos=relative' (expected pos=absolute|cache)"),
            std::string::npos);
  EXPECT_NE(spec_error("fp32 g99999999999").find("too large"), std::string::npos);
  EXPECT_NE(spec_error("fp32 int8").find("'int8' sets the precision already set by 'fp32'"), std::string::npos);
  EXPECT_NE(spec_error("fp32; int4 r100").find("cache spec 'int4 r100': --kv-residual (100) must be"),
            std::string::npos);
  EXPECT_NE(spec_error("sink4").find("needs --streaming-llm-window"), std::string::npos);
  EXPECT_NE(spec_error(" ; ").find("no cache configuration"), std::string::npos);
  EXPECT_THROW(parse_cache_spec("", KVCacheConfig{}), UsageError);
}

TEST(EvalStatsTest, BucketsDoubleFrom512AndHoldEndsInclusive) {
  const std::vector<int32_t> pos = {1, 511, 512, 1023, 1024, 2047, 2048, 5000};
  const std::vector<double> nll = {1, 3, 10, 20, 5, 7, 2, 4};
  auto b = nll_buckets(pos, nll);
  ASSERT_EQ(b.size(), 5u);
  const int ends[][2] = {{0, 511}, {512, 1023}, {1024, 2047}, {2048, 4095}, {4096, 8191}};
  const double means[] = {2, 15, 6, 2, 4};
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(b[i].start, ends[i][0]);
    EXPECT_EQ(b[i].end, ends[i][1]);
    EXPECT_DOUBLE_EQ(b[i].mean_nll, means[i]);
  }
  auto bins = nll_bins(pos, nll, 1000);
  ASSERT_EQ(bins.size(), 4u);
  EXPECT_EQ(bins[1].start, 1000);
  EXPECT_EQ(bins[1].end, 1999);
  EXPECT_EQ(bins[1].count, 2u);
  EXPECT_DOUBLE_EQ(bins[1].mean_nll, (20.0 + 5) / 2);
}

TEST(EvalStatsTest, QuantilesAsNumpyAndPrefixMatch) {
  const std::vector<double> v = {4, 1, 3, 2, 10};
  EXPECT_DOUBLE_EQ(quantile(v, 0.5), 3);
  EXPECT_DOUBLE_EQ(quantile(v, 0.99), 9.76);  // numpy.quantile([1,2,3,4,10], 0.99)
  EXPECT_DOUBLE_EQ(quantile(v, 1.0), 10);
  EXPECT_DOUBLE_EQ(quantile({7}, 0.99), 7);
  EXPECT_DOUBLE_EQ(mean(v), 4);
  const std::vector<int32_t> want = {5, 6, 7, 8};
  EXPECT_DOUBLE_EQ(prefix_match_pct(want, std::vector<int32_t>{5, 6, 9, 8}), 50);
  EXPECT_DOUBLE_EQ(prefix_match_pct(want, want), 100);
  EXPECT_DOUBLE_EQ(prefix_match_pct(want, std::vector<int32_t>{1, 6, 7, 8}), 0);
}

TEST(EvalDocumentsTest, SplitsOnRecordSeparatorLinesOnly) {
  auto d = split_documents("Genesis 1\nIn the beginning\n\x1e\nGenesis 2\x1e kept\n\x1e\n  \n\x1e\nlast");
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0], "Genesis 1\nIn the beginning\n");
  EXPECT_EQ(d[1], "Genesis 2\x1e kept\n");
  EXPECT_EQ(d[2], "last");
}

class EvalGoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = GetParam() == "kjv-small" ? test::shared_model(GetParam()) : test::repo_model(GetParam());
    if (!std::filesystem::exists(dir_ / "model.safetensors"))
      GTEST_SKIP() << dir_ << " not found (kjv-small is read from ../shared/models; skipped without it)";
    model_ = Model::load(dir_);
  }
  static CacheSpec fp32() { return parse_cache_spec("fp32", KVCacheConfig{.ctx_size = 0}); }

  std::filesystem::path dir_;
  std::unique_ptr<Model> model_;
};

// The fp32 cached path, one token per step, gives transformers' teacher-forced NLL, and scored
// against itself: delta 0, KL 0, agreement 100%. A prefill plus chunks gives the same NLL.
TEST_P(EvalGoldenTest, Fp32CachedPathGivesTfNllAndZeroDivergence) {
  SafetensorsFile g(dir_ / "golden.safetensors");
  const auto ids = test::tensor_values<int32_t>(g, "tf_ids");
  const auto tf_nll = test::tensor_values<float>(g, "tf_nll");
  ThreadPool pool(2);
  Evaluator ev(*model_, {fp32()}, pool);
  ev.score_stream(ids, FeedPlan{.prefill = 0, .chunk = 1});
  ASSERT_EQ(ev.positions().size(), ids.size() - 1);
  const ConfigRecord& c = ev.configs()[0];
  for (size_t t = 0; t < tf_nll.size(); ++t) {
    EXPECT_EQ(ev.positions()[t], int32_t(t + 1));
    EXPECT_NEAR(c.nll[t], tf_nll[t], 1e-3) << "position " << t + 1;
    EXPECT_EQ(c.nll[t], ev.baseline_nll()[t]);
  }
  const ConfigSummary s = summarize(c, ev);
  EXPECT_EQ(s.delta_nll, 0);
  EXPECT_EQ(s.delta_ppl_pct, 0);
  EXPECT_EQ(s.kl_mean, 0);
  EXPECT_EQ(s.kl_median, 0);
  EXPECT_EQ(s.kl_p99, 0);
  EXPECT_EQ(s.kl_max, 0);
  EXPECT_EQ(s.top1_agreement, 1);
  EXPECT_EQ(c.stored_tokens, int(ids.size()));
  EXPECT_GT(c.kv_logical_bytes, 0u);
  EXPECT_GE(c.kv_physical_bytes, c.kv_logical_bytes);
  auto golden = test::read_json(dir_ / "golden.json");
  EXPECT_NEAR(s.mean_nll, golden["teacher_forced"]["mean_nll"].get<double>(), 1e-4);

  // 100 prefilled, then chunks of 7 (the last one short): every position scored once, same NLL.
  Evaluator chunked(*model_, {fp32()}, pool);
  chunked.score_stream(ids, FeedPlan{.prefill = 100, .chunk = 7});
  ASSERT_EQ(chunked.positions(), ev.positions());
  for (size_t t = 0; t < tf_nll.size(); ++t) EXPECT_NEAR(chunked.configs()[0].nll[t], tf_nll[t], 1e-3);
}

// The greedy continuation through the cached path is transformers' greedy_ids: 100% prefix match.
TEST_P(EvalGoldenTest, GreedyTokensMatchGolden) {
  auto golden = test::read_json(dir_ / "golden.json");
  const auto& p = golden["prompts"][0];
  const auto want = p["greedy_ids"].get<std::vector<int32_t>>();
  ThreadPool pool(2);
  const auto got = greedy_tokens(*model_, fp32().kv, p["ids"].get<std::vector<int32_t>>(), int(want.size()), pool);
  EXPECT_EQ(got, want);
  EXPECT_EQ(prefix_match_pct(want, got), 100);
}

INSTANTIATE_TEST_SUITE_P(Models, EvalGoldenTest, ::testing::Values("kjv-tiny", "kjv-small"), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

// kjv-small over 2048 tokens (golden_long): the position buckets of transformers' long_dense.
TEST(EvalLongTest, KjvSmallLongDenseBuckets) {
  const auto dir = test::shared_model("kjv-small");
  if (!std::filesystem::exists(dir / "golden_long.safetensors")) GTEST_SKIP() << dir << " not found";
  auto model = Model::load(dir);
  SafetensorsFile g(dir / "golden_long.safetensors");
  const auto ids = test::tensor_values<int32_t>(g, "ids");
  ThreadPool pool(2);
  Evaluator ev(*model, {}, pool);  // the baseline alone: fp32, full cache (the fp32 configuration equals it, above)
  ev.score_stream(ids, FeedPlan{.prefill = 512, .chunk = 64});
  const auto b = nll_buckets(ev.positions(), ev.baseline_nll());
  const auto dense = test::read_json(dir / "golden.json")["long_dense"];
  ASSERT_EQ(dense["n"].get<size_t>(), ids.size());
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].start, 0);
  EXPECT_EQ(b[2].end, 2047);
  EXPECT_NEAR(b[0].mean_nll, dense["mean_nll_first_512"].get<double>(), 1e-2);
  EXPECT_NEAR(b[1].mean_nll, dense["mean_nll_512_1024"].get<double>(), 1e-2);
  EXPECT_NEAR(b[2].mean_nll, dense["mean_nll_1024_2048"].get<double>(), 1e-2);
  // Per position, against transformers' full-attention NLL (it rises past the 512-token training length).
  const auto ref = test::tensor_values<float>(g, "nll");
  ASSERT_EQ(ev.baseline_nll().size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(ev.baseline_nll()[i], ref[i], 1e-3) << "position " << i + 1;
}

// Compression through the cached path: KIVI's KL grows as bits shrink; StreamingLLM is exact
// while the text fits in sink + window, then diverges, and holds only sink + window tokens.
TEST(EvalQualityTest, KiviAndStreamingOnKjvTiny) {
  const auto dir = test::repo_model("kjv-tiny");
  auto model = Model::load(dir);
  SafetensorsFile g(dir / "golden.safetensors");
  const auto ids = test::tensor_values<int32_t>(g, "tf_ids");
  ThreadPool pool(2);
  Evaluator ev(*model,
               parse_cache_specs("int8 r0; int4 r0; int2 r0; sink4 w60 pos=absolute; sink4 w60 pos=cache", KVCacheConfig{.ctx_size = 0}),
               pool);
  ev.score_stream(ids, FeedPlan{.prefill = 16, .chunk = 1});
  std::vector<ConfigSummary> s;
  for (const auto& c : ev.configs()) s.push_back(summarize(c, ev));
  EXPECT_GT(s[0].kl_mean, 0);
  EXPECT_LT(s[0].kl_mean, s[1].kl_mean);
  EXPECT_LT(s[1].kl_mean, s[2].kl_mean);
  EXPECT_GT(s[0].top1_agreement, 0.9);
  EXPECT_LT(s[2].top1_agreement, s[0].top1_agreement);
  for (size_t k = 3; k < 5; ++k) {
    const ConfigRecord& c = ev.configs()[k];
    double kl_inside = 0, kl_after = 0;
    for (size_t i = 0; i < c.kl.size(); ++i) (ev.positions()[i] <= 64 ? kl_inside : kl_after) += c.kl[i];
    EXPECT_LT(kl_inside, 1e-6) << c.spec.name;  // positions 1..64: the context is at most 64 tokens
    EXPECT_GT(kl_after, 1e-3) << c.spec.name;
    EXPECT_EQ(c.stored_tokens, 64) << c.spec.name;
  }
}

// A configuration whose capacity is smaller than the stream fails naming itself.
TEST(EvalErrorTest, ContextFullNamesTheConfiguration) {
  auto model = Model::load(test::repo_model("kjv-tiny"));
  ThreadPool pool(1);
  Evaluator ev(*model, {parse_cache_spec("fp32", KVCacheConfig{.ctx_size = 8})}, pool);
  const std::vector<int32_t> ids(20, 5);
  try {
    ev.score_stream(ids, FeedPlan{});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("configuration 'fp32': context full"), std::string::npos) << e.what();
  }
}

// ---- the command -------------------------------------------------------------------------------

struct EvalCliTest : ::testing::Test {
  void SetUp() override {
    text_ = tmp_.path / "text.txt";
    std::ofstream(text_) << "Genesis 1\nIn the beginning God created the heaven and the earth.\n"
                            "And the earth was without form, and void.\n\x1e\n"
                            "Exodus 1\nNow these are the names of the children of Israel, which came into Egypt.\n\x1e\n";
    prompts_ = tmp_.path / "prompts.txt";
    std::ofstream(prompts_) << "In the beginning\nAnd the LORD said unto Moses,\n";
  }
  std::string cmd(const std::string& args) { return test::binary() + " eval --text " + text_.string() + " " + args; }

  test::TempDir tmp_;
  std::filesystem::path text_, prompts_;
};

TEST_F(EvalCliTest, JsonHasEveryFieldAndFp32MatchesItself) {
  const auto svg = tmp_.path / "nll.svg";
  auto r = test::run_command(cmd("--documents --configs 'fp32; fp32' --greedy-prompts " + prompts_.string() +
                                 " --greedy-tokens 20 --json --threads 2 --plot " + svg.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["streams"], 2);
  EXPECT_EQ(j["mode"], "documents");
  const size_t tokens = j["tokens"];
  EXPECT_EQ(j["tokens_fed"].get<size_t>(), tokens + 2);  // one unscored first token per document
  EXPECT_GT(tokens, 20u);
  ASSERT_EQ(j["configs"].size(), 2u);
  for (const auto& c : j["configs"]) {
    for (const char* f : {"name", "mean_nll", "ppl", "delta_ppl_pct", "kl_mean", "kl_median", "kl_p99", "kl_max",
                          "top1_agreement", "buckets", "kv_logical_bytes", "kv_physical_bytes", "stored_tokens",
                          "greedy_match_pct"})
      EXPECT_TRUE(c.contains(f)) << f;
    EXPECT_EQ(c["name"], "fp32");
    EXPECT_EQ(c["delta_ppl_pct"], 0.0);
    EXPECT_EQ(c["kl_mean"], 0.0);
    EXPECT_EQ(c["kl_max"], 0.0);
    EXPECT_EQ(c["top1_agreement"], 1.0);
    EXPECT_EQ(c["greedy_match_pct"], 100.0);
    EXPECT_EQ(c["greedy_match_pct_per_prompt"].size(), 2u);
    EXPECT_DOUBLE_EQ(c["ppl"].get<double>(), std::exp(c["mean_nll"].get<double>()));
    EXPECT_DOUBLE_EQ(c["mean_nll"].get<double>(), j["baseline"]["mean_nll"].get<double>());
    ASSERT_EQ(c["buckets"].size(), 1u);
    EXPECT_EQ(c["buckets"][0]["start"], 0);
    EXPECT_EQ(c["buckets"][0]["end"], 511);
    EXPECT_EQ(c["buckets"][0]["count"].get<size_t>(), tokens);
    EXPECT_GT(c["stored_tokens"].get<int>(), 0);  // the last document, fed whole
    EXPECT_GT(c["kv_logical_bytes"].get<size_t>(), 0u);
    EXPECT_GT(c["mean_nll"].get<double>(), 0.0);
  }
  std::ifstream in(svg);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string plot = ss.str();
  EXPECT_EQ(plot.rfind("<svg", 0), 0u);
  size_t lines = 0;
  for (size_t p = plot.find("<polyline"); p != std::string::npos; p = plot.find("<polyline", p + 1)) ++lines;
  EXPECT_EQ(lines, 3u);  // the baseline and two configurations
}

TEST_F(EvalCliTest, MaxTokensAndTableOutput) {
  auto r = test::run_command(cmd("--max-tokens 17 --prefill 5 --chunk 3"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("over 17 predictions in 1 stream"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fp32"), std::string::npos);
  EXPECT_NE(r.out.find("+0.000%"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("100.00%"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mean NLL by position"), std::string::npos);
  EXPECT_NE(r.err.find("tokens fed per configuration"), std::string::npos) << r.err;
}

// llama.cpp's protocol: chunks of N, N/2 - 1 predictions each (positions N/2 + 1 .. N - 1).
TEST_F(EvalCliTest, PplChunksScoreSecondHalves) {
  auto r = test::run_command(cmd("--ppl-chunks 16 --max-chunks 2 --json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["mode"], "ppl-chunks");
  EXPECT_EQ(j["streams"], 2);
  EXPECT_EQ(j["tokens"], 2 * 7);
  EXPECT_EQ(j["configs"][0]["stored_tokens"], 16);
  EXPECT_EQ(j["configs"][0]["kl_max"], 0.0);
}

TEST_F(EvalCliTest, BadUsageExitsWith2AndSaysWhy) {
  auto r = test::run_command(cmd("--configs 'fp32; int4 g32 r100'"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("cache spec 'int4 g32 r100': --kv-residual (100) must be"), std::string::npos) << r.err;
  EXPECT_EQ(test::run_command(cmd("--no-cache")).code, 2);
  EXPECT_EQ(test::run_command(cmd("--ppl-chunks 16 --max-tokens 10")).code, 2);
  EXPECT_EQ(test::run_command(cmd("--max-chunks 2")).code, 2);
  EXPECT_EQ(test::run_command(cmd("--chunk 0")).code, 2);
  r = test::run_command(cmd("--ppl-chunks 100000"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("fewer than one chunk of 100000"), std::string::npos) << r.err;
  r = test::run_command(test::binary() + " eval --text /nonexistent.txt");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("/nonexistent.txt: cannot read"), std::string::npos) << r.err;
}

TEST_F(EvalCliTest, ContextSmallerThanTheTextIsAClearError) {
  auto r = test::run_command(cmd("--ctx-size 8"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("configuration 'fp32': context full"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ptllm
