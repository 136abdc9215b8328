// `posttrainllm make-model` and `posttrainllm bench` end to end: a random checkpoint of a tiny shape
// written to a temp dir, loaded, and benchmarked; every JSON field present and consistent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace ptllm {
namespace {

std::string cli(const std::string& args) { return test::binary() + " " + args; }

// The tiny shape (cmd_make_model.cpp): 2 layers, hidden 64, 2 KV heads of 16, vocab 512.
constexpr int kLayers = 2, kKvDim = 2 * 16, kHidden = 64, kInter = 160, kVocab = 512;

TEST(MakeModelTest, WritesALoadableCheckpointWithTheShapesOfItsConfig) {
  test::TempDir dir;
  auto r = test::run_command(cli("make-model --shape tiny --dtype bf16 " + dir.path.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const ModelConfig c = ModelConfig::load(dir.path / "config.json");
  EXPECT_EQ(c.n_layers, kLayers);
  EXPECT_EQ(c.hidden_size, kHidden);
  EXPECT_EQ(c.intermediate_size, kInter);
  EXPECT_EQ(c.kv_dim(), kKvDim);
  EXPECT_EQ(c.vocab_size, kVocab);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, "bfloat16");
  SafetensorsFile f(dir.path / "model.safetensors");
  const auto& t = f.tensors();
  ASSERT_TRUE(t.count("model.layers.1.mlp.down_proj.weight"));
  EXPECT_EQ(t.at("model.layers.1.mlp.down_proj.weight").shape, (std::vector<int64_t>{kHidden, kInter}));
  EXPECT_EQ(t.at("model.embed_tokens.weight").dtype, DType::BF16);
  EXPECT_FALSE(t.count("lm_head.weight"));  // tied
  // Random weights with std 0.02, norms exactly 1.
  auto w = test::tensor_values<uint16_t>(f, "model.layers.0.self_attn.q_proj.weight");
  double sum = 0, sq = 0;
  for (uint16_t h : w) {
    sum += bf16_to_f32(h);
    sq += double(bf16_to_f32(h)) * bf16_to_f32(h);
  }
  const double mean = sum / double(w.size()), sd = std::sqrt(sq / double(w.size()) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(sd, 0.02, 0.001);
  for (uint16_t h : test::tensor_values<uint16_t>(f, "model.norm.weight")) ASSERT_EQ(bf16_to_f32(h), 1.0f);
  EXPECT_FALSE(std::filesystem::exists(dir.path / "model.safetensors.tmp"));

  // The same seed gives the same bytes; another seed, others.
  test::TempDir again, other;
  ASSERT_EQ(test::run_command(cli("make-model --shape tiny --dtype bf16 --threads 1 " + again.path.string())).code, 0);
  ASSERT_EQ(test::run_command(cli("make-model --shape tiny --dtype bf16 --seed 9 " + other.path.string())).code, 0);
  auto bytes = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes(dir.path / "model.safetensors"), bytes(again.path / "model.safetensors"));
  EXPECT_NE(bytes(dir.path / "model.safetensors"), bytes(other.path / "model.safetensors"));
}

// The 135M shape: SmolLM2-135M's config values and exact parameter count (134,515,008).
TEST(MakeModelTest, SmolLM2ShapeHasTheRealModelsSizes) {
  test::TempDir dir;
  auto r = test::run_command(cli("make-model --shape smollm2-135m --dtype f16 " + dir.path.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const ModelConfig c = ModelConfig::load(dir.path / "config.json");
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope.theta, 100000.0);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  SafetensorsFile f(dir.path / "model.safetensors");
  int64_t params = 0;
  for (const auto& [name, t] : f.tensors()) {
    EXPECT_EQ(t.dtype, DType::F16) << name;
    params += t.numel();
  }
  EXPECT_EQ(params, 134515008);
}

TEST(MakeModelTest, BadArgumentsExitWithCode2) {
  test::TempDir dir;
  EXPECT_EQ(test::run_command(cli("make-model --shape no-such-model " + dir.path.string())).code, 2);
  EXPECT_EQ(test::run_command(cli("make-model --shape tiny --dtype int8 " + dir.path.string())).code, 2);
  EXPECT_EQ(test::run_command(cli("make-model --shape tiny")).code, 2);
}

TEST(BenchCliTest, JsonHasEveryFieldAndTheyAreConsistent) {
  test::TempDir dir;
  ASSERT_EQ(test::run_command(cli("make-model --shape tiny --dtype bf16 " + dir.path.string())).code, 0);
  const int P = 24, G = 8;
  auto r = test::run_command(cli("bench " + dir.path.string() + " --prompt-tokens " + std::to_string(P) +
                                 " --gen-tokens " + std::to_string(G) +
                                 " --repeat 3 --threads 2 --bandwidth-mib 16 --json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"prefill_tok_s", "decode_tok_s", "ttft_ms", "kv_logical_bytes", "kv_physical_bytes",
                          "peak_rss_mb", "bandwidth_gb_s", "decode_floor_tok_s", "decode_floor_fraction", "threads"})
    ASSERT_TRUE(j.contains(key)) << key << " missing in " << r.out;
  EXPECT_GT(j["prefill_tok_s"].get<double>(), 0);
  EXPECT_GT(j["decode_tok_s"].get<double>(), 0);
  EXPECT_GT(j["ttft_ms"].get<double>(), 0);
  EXPECT_EQ(j["threads"].get<int>(), 2);
  // The kernels: the target that "simd" names, then the affine and GGUF products and the CPU's features.
  ASSERT_TRUE(j.contains("kernels")) << r.out;
  EXPECT_EQ(j["kernels"].get<std::string>().rfind(j["simd"].get<std::string>() + " (affine ", 0), 0u) << r.out;
  EXPECT_NE(j["kernels"].get<std::string>().find(", gguf "), std::string::npos) << r.out;
  // fp32 K and V of every stored token (prompt and generated) in every layer.
  EXPECT_EQ(j["kv_logical_bytes"].get<size_t>(), size_t(kLayers) * size_t(P + G) * 2 * kKvDim * sizeof(float));
  EXPECT_GE(j["kv_physical_bytes"].get<size_t>(), j["kv_logical_bytes"].get<size_t>());
  EXPECT_GT(j["peak_rss_mb"].get<double>(), 1.0);
  EXPECT_LT(j["peak_rss_mb"].get<double>(), 1024.0);
  EXPECT_GT(j["bandwidth_gb_s"].get<double>(), 0.1);
  // The floor is bandwidth over the bytes a step reads (every weight: the embedding is tied, so it
  // is the LM head), and the fraction is decode speed over it.
  const size_t weights = size_t(kVocab) * kHidden + size_t(kLayers) * (2 * kHidden + 2 * kHidden * kHidden +
                                                                       2 * kKvDim * kHidden + 3 * kHidden * kInter) +
                         kHidden;
  // ... plus the K/V attention reads, averaged over the decode steps: (P + (P + G)) / 2 tokens.
  EXPECT_EQ(j["bytes_per_token"].get<size_t>(),
            weights * 2 + size_t(kLayers) * size_t(2 * P + G) * kKvDim * sizeof(float));
  EXPECT_NEAR(j["decode_floor_tok_s"].get<double>(),
              j["bandwidth_gb_s"].get<double>() * 1e9 / j["bytes_per_token"].get<double>(), 1e-6 * j["decode_floor_tok_s"].get<double>());
  ASSERT_EQ(j["runs"].size(), 3u);
  // The bandwidth is measured beside each run's decode (right before and right after it, the better
  // of the two), each run's fraction is its decode speed over its own floor, and the report gives
  // the medians (of 3 runs: the middle one).
  std::vector<double> bws, fractions;
  for (const auto& run : j["runs"]) {
    EXPECT_GE(run["ttft_ms"].get<double>(), run["prefill_ms"].get<double>());
    if (j["bandwidth_beside_decode"].get<bool>()) {
      EXPECT_EQ(run["bandwidth_gb_s"].get<double>(), std::max(run["bandwidth_before_decode_gb_s"].get<double>(),
                                                              run["bandwidth_after_decode_gb_s"].get<double>()));
    }
    const double tok_s = G / (run["decode_ms"].get<double>() / 1000);
    const double floor = run["bandwidth_gb_s"].get<double>() * 1e9 / j["bytes_per_token"].get<double>();
    EXPECT_NEAR(run["decode_floor_fraction"].get<double>(), tok_s / floor, 1e-9 * tok_s / floor);
    bws.push_back(run["bandwidth_gb_s"].get<double>());
    fractions.push_back(run["decode_floor_fraction"].get<double>());
  }
  std::sort(bws.begin(), bws.end());
  std::sort(fractions.begin(), fractions.end());
  EXPECT_EQ(j["bandwidth_gb_s"].get<double>(), bws[1]);
  EXPECT_EQ(j["decode_floor_fraction"].get<double>(), fractions[1]);
}

// A bandwidth buffer far larger than the model does not count in peak RSS: the peak is restarted
// after the first measurement and read before the second.
TEST(BenchCliTest, PeakRssCountsTheRunNotTheBandwidthBuffer) {
  test::TempDir dir;
  ASSERT_EQ(test::run_command(cli("make-model --shape tiny --dtype bf16 " + dir.path.string())).code, 0);
  auto r = test::run_command(cli("bench " + dir.path.string() +
                                 " --prompt-tokens 8 --gen-tokens 4 --repeat 1 --threads 1 --bandwidth-mib 768 --json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["runs"][0]["bandwidth_gb_s"].get<double>(), 0.1);
  EXPECT_LT(j["peak_rss_mb"].get<double>(), 256.0);
}

TEST(BenchCliTest, TextReportAndCacheFlags) {
  test::TempDir dir;
  ASSERT_EQ(test::run_command(cli("make-model --shape tiny --dtype f32 " + dir.path.string())).code, 0);
  auto r = test::run_command(cli("bench " + dir.path.string() +
                                 " -p 40 -n 30 -r 1 --context 20 --kv-quantize int8 --kv-group-size 16 "
                                 "--kv-residual 16 --bandwidth-mib 16"));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* line : {"prefill:", "decode:", "kv cache: int8 g16 r16, 90 tokens stored", "peak RSS:",
                           "memory bandwidth:", "decode floor:"})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " missing in\n" << r.out;
  // StreamingLLM keeps sink + window tokens.
  auto s = test::run_command(cli("bench " + dir.path.string() +
                                 " -p 40 -n 30 -r 1 --streaming-llm-sink 4 --streaming-llm-window 28 "
                                 "--bandwidth-mib 16 --json"));
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_EQ(nlohmann::json::parse(s.out)["kv_stored_tokens"].get<int>(), 32);
}

// --decode-at-context times decode from the --context depth (llama-bench's tg test): the prompt is
// prefilled and timed, then the cache goes back to the context before decode. The depth and the K/V
// bytes the floor counts are those of the cache decode read.
TEST(BenchCliTest, DecodeAtContextDecodesFromTheContextDepth) {
  test::TempDir dir;
  ASSERT_EQ(test::run_command(cli("make-model --shape tiny --dtype f32 " + dir.path.string())).code, 0);
  const int C = 20, P = 40, G = 8;
  const std::string run = "bench " + dir.path.string() + " --context " + std::to_string(C) + " -p " + std::to_string(P) +
                          " -n " + std::to_string(G) + " -r 2 -t 1 --bandwidth-mib 16 --json";
  auto after = test::run_command(cli(run));
  auto at = test::run_command(cli(run + " --decode-at-context"));
  ASSERT_EQ(after.code, 0) << after.err;
  ASSERT_EQ(at.code, 0) << at.err;
  const auto ja = nlohmann::json::parse(after.out), jc = nlohmann::json::parse(at.out);
  const size_t token = size_t(kLayers) * 2 * kKvDim * sizeof(float);  // fp32 K and V of one token
  EXPECT_EQ(ja["decode_mode"], "after_prompt");
  EXPECT_EQ(ja["decode_depth"].get<int64_t>(), C + P);
  EXPECT_EQ(ja["kv_logical_bytes"].get<size_t>(), size_t(C + P + G) * token);
  EXPECT_EQ(jc["decode_mode"], "at_context");
  EXPECT_EQ(jc["decode_depth"].get<int64_t>(), C);
  EXPECT_FALSE(jc["decode_cache_rebuilt"].get<bool>());  // an fp32 cache rewinds
  EXPECT_EQ(jc["kv_logical_bytes"].get<size_t>(), size_t(C + G) * token);
  EXPECT_EQ(jc["prompt_tokens"].get<int>(), P);
  // The floor's K/V: the mean over the decode steps of what attention read, from depth C + P without
  // the flag, from C with it (the weights are the same): (2 (C + P) + G) / 2 against (2 C + G) / 2 tokens.
  EXPECT_EQ(ja["bytes_per_token"].get<size_t>() - jc["bytes_per_token"].get<size_t>(), size_t(P) * token);
  EXPECT_NEAR(jc["decode_floor_tok_s"].get<double>(),
              jc["bandwidth_gb_s"].get<double>() * 1e9 / jc["bytes_per_token"].get<double>(),
              1e-6 * jc["decode_floor_tok_s"].get<double>());

  // KIVI quantizes the prompt's groups and StreamingLLM evicts them: the cache cannot rewind to the
  // context and is rebuilt; decode still starts at depth C.
  auto kivi = test::run_command(cli(run + " --decode-at-context --kv-quantize int8 --kv-group-size 16 --kv-residual 16"));
  ASSERT_EQ(kivi.code, 0) << kivi.err;
  const auto jk = nlohmann::json::parse(kivi.out);
  EXPECT_EQ(jk["decode_depth"].get<int64_t>(), C);
  EXPECT_TRUE(jk["decode_cache_rebuilt"].get<bool>());
  EXPECT_EQ(jk["kv_stored_tokens"].get<int>(), C + G);
  auto stream = test::run_command(
      cli(run + " --decode-at-context --streaming-llm-sink 4 --streaming-llm-window 20"));
  ASSERT_EQ(stream.code, 0) << stream.err;
  const auto js = nlohmann::json::parse(stream.out);
  EXPECT_EQ(js["decode_depth"].get<int64_t>(), C);
  EXPECT_TRUE(js["decode_cache_rebuilt"].get<bool>());
  EXPECT_EQ(js["kv_stored_tokens"].get<int>(), 24);  // sink 4 + window 20 of the C + G = 28 tokens

  // The text report says where decode started.
  auto text = test::run_command(cli("bench " + dir.path.string() + " --context 20 -p 40 -n 8 -r 1 -t 1 "
                                    "--bandwidth-mib 16 --decode-at-context"));
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("8 generated from depth 20 (the context's, the prompt rewound)"), std::string::npos)
      << text.out;
  // The context must hold the context with the prompt, and with the generated tokens, not all three.
  EXPECT_EQ(test::run_command(cli(run + " --decode-at-context --ctx-size 60")).code, 0);
  EXPECT_EQ(test::run_command(cli(run + " --ctx-size 60")).code, 2);
  // The modes that do not run the single-sequence speed test refuse it, naming it.
  auto bad = test::run_command(cli("bench " + dir.path.string() + " --parallel 2 -p 8 -n 2 --decode-at-context"));
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--decode-at-context"), std::string::npos) << bad.err;
  auto ctx = test::run_command(cli("bench " + dir.path.string() + " --parallel 2 -p 8 -n 2 --context 8"));
  EXPECT_EQ(ctx.code, 2);
  EXPECT_NE(ctx.err.find("--context"), std::string::npos) << ctx.err;
}

TEST(BenchCliTest, ErrorsAreReported) {
  test::TempDir dir;
  EXPECT_EQ(test::run_command(cli("bench " + (dir.path / "missing").string())).code, 1);
  ASSERT_EQ(test::run_command(cli("make-model --shape tiny " + dir.path.string())).code, 0);
  auto r = test::run_command(cli("bench " + dir.path.string() + " -p 100 -n 10 --ctx-size 64"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--ctx-size"), std::string::npos) << r.err;
  EXPECT_EQ(test::run_command(cli("bench " + dir.path.string() + " --gen-tokens 0")).code, 2);
}

// bench --cache-reuse --edit: one edit given as texts (a chunk of the history replaced by a summary):
// runs after it are shifted, exact reuse stays exact, and the JSON says what each way computed.
TEST(BenchCliTest, CacheReuseEditMeasuresOneEdit) {
  test::TempDir dir;
  auto words = [](int from, int n) {
    static const char* w[] = {"And", "the", "LORD", "said", "unto", "Moses", "land", "of", "Egypt", "people",
                              "went", "out", "came", "upon", "house", "children", "Israel", "king", "city", "God"};
    std::string t;
    for (int i = from; i < from + n; ++i) t += std::string(i > from ? " " : "") + w[(i * 7 + i / 20) % 20];
    return t;
  };
  const std::string a = words(0, 200), b = words(200, 150), c = words(350, 200);
  const std::filesystem::path h = dir.path / "h.txt", p = dir.path / "p.txt", k = dir.path / "c.txt";
  std::ofstream(h) << a << " " << b << " " << c;
  std::ofstream(p) << a << " In short: the land. " << c;
  std::ofstream(k) << " " << words(550, 30);
  const std::string model = test::repo_model("kjv-tiny").string();
  const std::string files = " --edit " + h.string() + " " + p.string() + " " + k.string();
  auto r = test::run_command(cli("bench " + model + " --cache-reuse 32 -n 16 -t 1 --json" + files));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
  EXPECT_GT(j["shifted_tokens"].get<int64_t>(), 64);
  EXPECT_LT(j["computed_reuse"].get<int64_t>(), j["computed_exact"].get<int64_t>());
  EXPECT_EQ(j["computed_reuse"].get<int64_t>() + j["shifted_tokens"].get<int64_t>() + j["adopted_tokens"].get<int64_t>(),
            j["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(j["scored_tokens"].get<int64_t>(), 16);
  EXPECT_EQ(j["kl_exact_max"].get<double>(), 0.0);  // exact reuse is the recompute
  EXPECT_GT(j["kl_max"].get<double>(), 0.0);        // shifting is not
  auto bad = test::run_command(cli("bench " + model + " -n 16" + files));
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--cache-reuse"), std::string::npos) << bad.err;
  EXPECT_EQ(test::run_command(cli("bench " + model + " --cache-reuse 32 --text " + h.string() + files)).code, 2);
}

}  // namespace
}  // namespace ptllm
