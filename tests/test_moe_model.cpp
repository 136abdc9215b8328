// A Qwen3-MoE checkpoint end to end: the same random weights in every layout a checkpoint uses (the
// hub's one module per expert, transformers 5's fused experts, mlx-lm's switch_mlp stacks, GGUF's
// *_exps written by `quantize --format gguf`) give the same logits; a decode step runs k experts per
// sparse layer and reads their bytes only; quantized experts (MLX affine, GGUF blocks) stay close.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "engine/session.h"
#include "kv/kv_cache.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "model/quantize.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace ptllm {
namespace {

constexpr int kVocab = 8192, kH = 64, kLayers = 3, kHeads = 4, kKv = 2, kHd = 32, kE = 8, kK = 2, kEI = 32, kI = 96;

enum class Layout { PerExpert, Fused, SwitchMlp };

nlohmann::json config() {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"vocab_size", kVocab},
          {"hidden_size", kH},
          {"intermediate_size", kI},
          {"num_hidden_layers", kLayers},
          {"num_attention_heads", kHeads},
          {"num_key_value_heads", kKv},
          {"head_dim", kHd},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},
          {"tie_word_embeddings", true},
          {"hidden_act", "silu"},
          {"max_position_embeddings", 2048},
          {"bos_token_id", 0},
          {"eos_token_id", 1},
          {"num_experts", kE},
          {"num_experts_per_tok", kK},
          {"moe_intermediate_size", kEI},
          {"norm_topk_prob", true},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", {1}},
          {"use_sliding_window", false},
          {"torch_dtype", "float32"}};
}

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// The model's random weights, written in `layout`. Experts' values are the same in every layout.
void write_model(const std::filesystem::path& dir, Layout layout) {
  std::filesystem::create_directories(dir);
  uint32_t seed = 1;
  std::vector<test::RawTensor> t;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float sd) {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    std::vector<float> v = sd > 0 ? test::normal(n, sd, seed++) : std::vector<float>(n, 1.f);
    if (sd < 0) v = test::normal(n, -sd, seed++), std::for_each(v.begin(), v.end(), [](float& x) { x = 1.f + x; });
    t.push_back({name, "F32", shape, f32_bytes(v)});
  };
  add("model.embed_tokens.weight", {kVocab, kH}, 0.5f);
  add("model.norm.weight", {kH}, -0.1f);
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {kH}, -0.1f);
    add(p + "post_attention_layernorm.weight", {kH}, -0.1f);
    add(p + "self_attn.q_proj.weight", {kHeads * kHd, kH}, 0.15f);
    add(p + "self_attn.k_proj.weight", {kKv * kHd, kH}, 0.15f);
    add(p + "self_attn.v_proj.weight", {kKv * kHd, kH}, 0.15f);
    add(p + "self_attn.o_proj.weight", {kH, kHeads * kHd}, 0.15f);
    add(p + "self_attn.q_norm.weight", {kHd}, -0.1f);
    add(p + "self_attn.k_norm.weight", {kHd}, -0.1f);
    if (l == 1) {  // mlp_only_layers
      add(p + "mlp.gate_proj.weight", {kI, kH}, 0.15f);
      add(p + "mlp.up_proj.weight", {kI, kH}, 0.15f);
      add(p + "mlp.down_proj.weight", {kH, kI}, 0.15f);
      continue;
    }
    add(p + "mlp.gate.weight", {kE, kH}, 0.5f);
    std::vector<std::vector<float>> g, u, d;
    for (int e = 0; e < kE; ++e) {
      g.push_back(test::normal(size_t(kEI) * kH, 0.2f, 1000 + uint32_t(100 * l + e)));
      u.push_back(test::normal(size_t(kEI) * kH, 0.2f, 2000 + uint32_t(100 * l + e)));
      d.push_back(test::normal(size_t(kH) * kEI, 0.2f, 3000 + uint32_t(100 * l + e)));
    }
    auto cat = [](const std::vector<std::vector<float>>& parts) {
      std::vector<float> all;
      for (const auto& x : parts) all.insert(all.end(), x.begin(), x.end());
      return all;
    };
    if (layout == Layout::PerExpert) {
      for (int e = 0; e < kE; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        t.push_back({x + "gate_proj.weight", "F32", {kEI, kH}, f32_bytes(g[size_t(e)])});
        t.push_back({x + "up_proj.weight", "F32", {kEI, kH}, f32_bytes(u[size_t(e)])});
        t.push_back({x + "down_proj.weight", "F32", {kH, kEI}, f32_bytes(d[size_t(e)])});
      }
    } else if (layout == Layout::Fused) {
      std::vector<std::vector<float>> gu;
      for (int e = 0; e < kE; ++e) {
        gu.push_back(g[size_t(e)]);
        gu.push_back(u[size_t(e)]);
      }
      t.push_back({p + "mlp.experts.gate_up_proj", "F32", {kE, 2 * kEI, kH}, f32_bytes(cat(gu))});
      t.push_back({p + "mlp.experts.down_proj", "F32", {kE, kH, kEI}, f32_bytes(cat(d))});
    } else {
      t.push_back({p + "mlp.switch_mlp.gate_proj.weight", "F32", {kE, kEI, kH}, f32_bytes(cat(g))});
      t.push_back({p + "mlp.switch_mlp.up_proj.weight", "F32", {kE, kEI, kH}, f32_bytes(cat(u))});
      t.push_back({p + "mlp.switch_mlp.down_proj.weight", "F32", {kE, kH, kEI}, f32_bytes(cat(d))});
    }
  }
  test::write_safetensors(dir / "model.safetensors", t);
  std::ofstream(dir / "config.json") << config().dump(2);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(test::repo_model("qwen2-tiny") / f, dir / f);
}

const std::vector<int32_t> kPrompt = {0, 17, 923, 4001, 77, 5120, 8, 300, 2999, 64};

// Teacher-forced logits of kPrompt, every row.
std::vector<float> logits_of(const Model& m) {
  ThreadPool pool(2);
  SessionOptions o;
  o.kv.ctx_size = 64;
  Session s(m, o, pool);
  std::span<float> l = s.feed_all(kPrompt);
  return {l.begin(), l.end()};
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

class MoeModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new test::TempDir();
    write_model(tmp_->path / "hub", Layout::PerExpert);
    write_model(tmp_->path / "fused", Layout::Fused);
    write_model(tmp_->path / "switch", Layout::SwitchMlp);
    ref_ = new std::vector<float>(logits_of(*Model::load(tmp_->path / "hub")));
  }
  static void TearDownTestSuite() {
    delete ref_;
    delete tmp_;
  }
  static test::TempDir* tmp_;
  static std::vector<float>* ref_;
};
test::TempDir* MoeModel::tmp_ = nullptr;
std::vector<float>* MoeModel::ref_ = nullptr;

TEST_F(MoeModel, EveryCheckpointLayoutGivesTheSameLogits) {
  ASSERT_EQ(ref_->size(), kPrompt.size() * size_t(kVocab));
  double mx = 0;
  for (float v : *ref_) mx = std::max(mx, double(std::fabs(v)));
  EXPECT_GT(mx, 1.0);  // logits with something to compare
  for (const char* d : {"fused", "switch"}) {
    const auto m = Model::load(tmp_->path / d);
    EXPECT_EQ(logits_of(*m), *ref_) << d;  // the same bytes read through views: bit for bit
  }
}

TEST_F(MoeModel, DecodeRunsTopKExpertsPerSparseLayerAndCountsTheirBytes) {
  const auto m = Model::load(tmp_->path / "hub");
  const Model::ExpertBytes eb = m->expert_bytes();
  EXPECT_EQ(eb.all, size_t(2) * kE * 3 * kEI * kH * 4);  // layers 0 and 2
  EXPECT_EQ(eb.per_token, size_t(2) * kK * 3 * kEI * kH * 4);
  ThreadPool pool(2);
  KVCacheConfig kc;
  kc.ctx_size = 16;
  KVCache cache(m->kv_shape(), kc);
  ForwardState st;
  std::vector<float> logits(static_cast<size_t>(kVocab));
  m->forward(std::span(kPrompt).first(6), 0, cache, st, logits.data(), false, pool);
  MoeCounters n;
  n.passes_by_expert.assign(size_t(kLayers) * kE, 0);
  st.moe_counters = &n;
  const int32_t next = 5;
  m->forward({&next, 1}, 6, cache, st, logits.data(), false, pool);
  EXPECT_EQ(n.expert_passes, 2 * kK);  // k experts in each of the two sparse layers, none in the dense one
  EXPECT_EQ(n.expert_rows, 2 * kK);
  EXPECT_EQ(size_t(n.expert_bytes), eb.per_token);
  for (int e = 0; e < kE; ++e) EXPECT_EQ(n.passes_by_expert[size_t(kE) + size_t(e)], 0);  // layer 1: dense
}

TEST_F(MoeModel, GgufWriterStacksTheExpertsAndReadsBackTheSame) {
  const auto out = tmp_->path / "m-F32.gguf";
  const GgufWriteResult r = write_gguf_from_hf(tmp_->path / "hub", out, GgufMix::F32);
  EXPECT_GT(r.tensors, 0);
  {
    const GgufFile f = GgufFile::open(out);
    EXPECT_EQ(f.get_string("general.architecture"), "qwen3moe");
    EXPECT_EQ(f.get_int("qwen3moe.expert_count", 0, 1 << 20), kE);
    EXPECT_EQ(f.get_int("qwen3moe.expert_used_count", 0, 1 << 20), kK);
    EXPECT_EQ(f.get_int("qwen3moe.expert_feed_forward_length", 0, 1 << 20), kEI);
    const GgufTensor* g = f.find_tensor("blk.0.ffn_gate_exps.weight");
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->dims, (std::vector<uint64_t>{kH, kEI, kE}));
    const GgufTensor* d = f.find_tensor("blk.2.ffn_down_exps.weight");
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->dims, (std::vector<uint64_t>{kEI, kH, kE}));
    const GgufTensor* r0 = f.find_tensor("blk.0.ffn_gate_inp.weight");
    ASSERT_NE(r0, nullptr);
    EXPECT_EQ(r0->dims, (std::vector<uint64_t>{kH, kE}));
    EXPECT_NE(f.find_tensor("blk.1.ffn_gate.weight"), nullptr);  // the dense layer
    EXPECT_EQ(f.find_tensor("blk.1.ffn_gate_inp.weight"), nullptr);
    EXPECT_NE(f.find_tensor("blk.0.attn_q_norm.weight"), nullptr);
  }
  const auto m = Model::load(out);
  EXPECT_EQ(m->config().arch, Architecture::Qwen3Moe);
  EXPECT_EQ(m->config().moe.mlp_only_layers, std::vector<int>{1});
  EXPECT_LT(rel_err(logits_of(*m), *ref_), 1e-5);
}

TEST_F(MoeModel, QuantizedExpertsStayClose) {
  // GGUF blocks (Q8_0; Q4_K_M, whose K-quants fall back to 32-element blocks on these 64-wide rows)
  // and MLX affine at 8 bits. Random weights of this size amplify rounding through three layers and
  // the router (8 bits: 4-5% of the logits' norm, alike in both formats); a wrong expert or a
  // misread stack gives errors of order 1.
  for (const GgufMix mix : {GgufMix::Q8_0, GgufMix::Q4_K_M}) {
    const auto out = tmp_->path / ("m-" + std::string(gguf_mix_name(mix)) + ".gguf");
    write_gguf_from_hf(tmp_->path / "hub", out, mix);
    const double err = rel_err(logits_of(*Model::load(out)), *ref_);
    EXPECT_LT(err, mix == GgufMix::Q8_0 ? 0.1 : 0.4) << gguf_mix_name(mix);
  }
  ThreadPool pool(2);
  QuantizeOptions o;
  o.spec = {8, 32};
  o.keep_embeddings = true;
  const QuantizeReport rep = quantize_checkpoint(tmp_->path / "hub", tmp_->path / "q8", o, pool);
  EXPECT_GE(rep.matrices_quantized, 2 * kE * 3);  // every expert's three matrices
  const auto q = Model::load(tmp_->path / "q8");
  EXPECT_NE(q->weight_format().find("q8"), std::string::npos) << q->weight_format();
  EXPECT_LT(rel_err(logits_of(*q), *ref_), 0.1);
}

// mlx-lm's layout of quantized experts: the per-expert codes, scales and biases of `quantize`'s output
// stacked into switch_mlp.{gate,up,down}_proj.{weight,scales,biases} [E, rows, ...]: the same model.
TEST_F(MoeModel, MlxSwitchMlpStacksReadAsThePerExpertModules) {
  ThreadPool pool(2);
  QuantizeOptions o;
  o.spec = {4, 32};
  o.keep_embeddings = true;
  const auto q4 = tmp_->path / "q4", sw = tmp_->path / "q4-switch";
  quantize_checkpoint(tmp_->path / "hub", q4, o, pool);
  std::filesystem::create_directories(sw);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(q4 / f, sw / f);
  auto raw = test::read_raw(q4 / "model.safetensors");
  std::map<std::string, test::RawTensor> by_name;
  for (auto& t : raw) by_name[t.name] = t;
  std::vector<test::RawTensor> out;
  for (auto& t : raw)
    if (t.name.find(".mlp.experts.") == std::string::npos) out.push_back(t);
  for (int l : {0, 2})
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
      for (const char* part : {"weight", "scales", "biases"}) {
        test::RawTensor st;
        const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
        st.name = p + "switch_mlp." + proj + "." + part;
        for (int e = 0; e < kE; ++e) {
          const test::RawTensor& x = by_name.at(p + "experts." + std::to_string(e) + "." + proj + "." + part);
          st.dtype = x.dtype;
          st.shape = {kE, x.shape[0], x.shape[1]};
          st.bytes += x.bytes;
        }
        out.push_back(st);
      }
  test::write_safetensors(sw / "model.safetensors", out);
  const auto a = Model::load(q4), b = Model::load(sw);
  EXPECT_NE(b->weight_format().find("q4 g32"), std::string::npos) << b->weight_format();
  EXPECT_EQ(logits_of(*b), logits_of(*a));
}

TEST_F(MoeModel, AMissingExpertIsAnErrorNamingTheTensor) {
  test::TempDir d;
  std::filesystem::copy(tmp_->path / "hub", d.path);
  auto t = test::read_raw(d.path / "model.safetensors");
  t.erase(std::remove_if(t.begin(), t.end(), [](const test::RawTensor& x) {
            return x.name == "model.layers.2.mlp.experts.5.up_proj.weight";
          }),
          t.end());
  test::write_safetensors(d.path / "model.safetensors", t);
  try {
    Model::load(d.path);
    ADD_FAILURE() << "loaded without an expert";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2.mlp.experts.5.up_proj.weight"), std::string::npos) << e.what();
  }
}

// The GGUF of the transformers-made reference model decodes the goldens' greedy ids
// (test_golden.cpp checks the safetensors model against the logits and NLL): llama.cpp's converter's
// file where the test data has one, else `quantize --format gguf --type BF16`'s.
TEST(MoeGolden, GgufGivesTheGreedyIdsOfTransformers) {
  const auto dir = test::repo_dir() / "tests" / "data" / "models";
  auto gguf = dir / "gguf" / "qwen3moe-tiny-BF16.gguf";
  const auto golden = dir / "qwen3moe-tiny" / "golden.json";
  if (!std::filesystem::exists(golden)) GTEST_SKIP() << golden << " not found";
  test::TempDir tmp;
  if (!std::filesystem::exists(gguf)) {
    gguf = tmp.path / "qwen3moe-tiny-BF16.gguf";
    write_gguf_from_hf(dir / "qwen3moe-tiny", gguf, GgufMix::BF16);
  }
  const auto m = Model::load(gguf);
  EXPECT_EQ(m->config().moe.mlp_only_layers, std::vector<int>{1});
  const nlohmann::json g = test::read_json(golden);
  ThreadPool pool(2);
  for (const auto& p : g["prompts"]) {
    const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = p["greedy_ids"].get<std::vector<int32_t>>();
    SessionOptions o;
    o.kv.ctx_size = 256;
    Session s(*m, o, pool);
    std::span<float> logits = s.feed(ids);
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      got.push_back(next);
      if (i + 1 < want.size()) logits = s.feed({&next, 1});
    }
    EXPECT_EQ(got, want) << p["text"];
  }
}

// transformers' float32 logits within 1e-4 of the row's largest, per-token NLL within 1e-3, over the
// 256-token teacher-forced window and the 1024-token one (prefill in chunks through the KV cache).
TEST(MoeGolden, LogitsWithin1e4AndNllWithin1e3) {
  const auto dir = test::repo_dir() / "tests" / "data" / "models" / "qwen3moe-tiny";
  if (!std::filesystem::exists(dir / "golden_long.safetensors")) GTEST_SKIP() << dir << " has no goldens";
  const auto m = Model::load(dir);
  const int V = m->config().vocab_size;
  ThreadPool pool(2);
  for (const auto& [file, prefix] : {std::pair{"golden.safetensors", "tf_"}, std::pair{"golden_long.safetensors", ""}}) {
    SafetensorsFile g(dir / file);
    const std::string p = prefix;
    const auto ids = test::tensor_values<int32_t>(g, p + "ids");
    const auto nll = test::tensor_values<float>(g, p + "nll");
    const auto pos = test::tensor_values<int32_t>(g, p + "logits_pos");
    const auto ref = test::tensor_values<float>(g, p + "logits");
    SessionOptions o;
    o.kv.ctx_size = 2048;
    Session s(*m, o, pool);
    std::vector<float> logits;
    for (size_t c = 0; c < ids.size(); c += 200) {  // chunks: later ones attend over the cache
      const size_t n = std::min<size_t>(200, ids.size() - c);
      std::span<float> l = s.feed_all(std::span(ids).subspan(c, n));
      logits.insert(logits.end(), l.begin(), l.end());
    }
    ASSERT_EQ(logits.size(), ids.size() * size_t(V));
    double worst_nll = 0, worst_logit = 0;
    for (size_t t = 0; t + 1 < ids.size(); ++t) {
      const float* row = logits.data() + t * size_t(V);
      const float mx = *std::max_element(row, row + V);
      double lse = 0;
      for (int i = 0; i < V; ++i) lse += std::exp(double(row[i]) - mx);
      worst_nll = std::max(worst_nll, std::fabs(std::log(lse) + mx - row[ids[t + 1]] - nll[t]));
    }
    for (size_t k = 0; k < pos.size(); ++k) {
      const float* mine = logits.data() + size_t(pos[k]) * size_t(V);
      const float* r = ref.data() + k * size_t(V);
      float max_abs = 0;
      for (int i = 0; i < V; ++i) max_abs = std::max(max_abs, std::fabs(r[i]));
      for (int i = 0; i < V; ++i) worst_logit = std::max(worst_logit, double(std::fabs(mine[i] - r[i]) / max_abs));
    }
    EXPECT_LT(worst_nll, 1e-3) << file;
    EXPECT_LT(worst_logit, 1e-4) << file;
    std::printf("%s: worst NLL difference %.2e, worst logit difference %.2e of the row's largest\n", file, worst_nll,
                worst_logit);
  }
}

}  // namespace
}  // namespace ptllm
