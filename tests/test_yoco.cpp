// YOCO / cross-layer KV sharing: config.json's num_kv_shared_layers into a KV source per
// layer, the loader's rules for k_proj / v_proj, the KV engine's shared layers (a view of the donor's
// blocks, nothing stored), and models built here from kjv-tiny's weights: with sharing switched off
// a YocoLlama config is plain Llama; with it, the prefill shortcut gives the full prefill's logits.
// The kjv-yoco goldens are in test_yoco_golden.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/session.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "test_util.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;

nlohmann::json tiny_config() { return test::read_json(test::repo_model("kjv-tiny") / "config.json"); }

// kjv-tiny (4 layers) rewritten as a YOCO model: `edit` changes its config.json; the k/v projections
// of the layers in `drop` are left out of model.safetensors.
void write_yoco_tiny(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit,
                     const std::vector<int>& drop) {
  nlohmann::json j = tiny_config();
  j["architectures"] = {"YocoLlamaForCausalLM"};
  j["model_type"] = "yoco_llama";
  edit(j);
  std::ofstream(dir / "config.json") << j.dump(2);
  std::vector<test::RawTensor> kept;
  for (auto& t : test::read_raw(test::repo_model("kjv-tiny") / "model.safetensors")) {
    bool dropped = false;
    for (int l : drop)
      for (const char* w : {".self_attn.k_proj.weight", ".self_attn.v_proj.weight"})
        dropped = dropped || t.name == "model.layers." + std::to_string(l) + w;
    if (!dropped) kept.push_back(std::move(t));
  }
  test::write_safetensors(dir / "model.safetensors", kept);
}

std::string config_error(nlohmann::json j) {
  try {
    ModelConfig::from_json(j, "x/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

::testing::AssertionResult has(const std::string& msg, const std::string& part) {
  if (msg.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << msg << "' lacks '" << part << "'";
}

// ---------------------------------------------------------------------------------------------
// config.json

TEST(YocoConfig, DonorIsTheLastNonSharedLayerOfTheSameKind) {
  using K = AttentionKind;
  // kjv-yoco's layout: 4 sliding, 4 full, the last 3 shared: all read layer 4.
  nlohmann::json j = tiny_config();
  j["architectures"] = {"YocoLlamaForCausalLM"};
  j["num_hidden_layers"] = 8;
  j["layer_types"] = std::vector<std::string>(4, "sliding_attention");
  for (int i = 0; i < 4; ++i) j["layer_types"].push_back("full_attention");
  j["sliding_window"] = 128;
  j["num_kv_shared_layers"] = 3;
  ModelConfig c = ModelConfig::from_json(j, "config.json");
  EXPECT_EQ(c.arch, Architecture::YocoLlama);
  EXPECT_EQ(c.kv_source, (std::vector<int>{0, 1, 2, 3, 4, 4, 4, 4}));
  EXPECT_EQ(c.layer_windows(), (std::vector<int>{128, 128, 128, 128, 0, 0, 0, 0}));
  EXPECT_EQ(c.num_kv_shared_layers, 3);
  for (int l = 0; l < 8; ++l) EXPECT_EQ(c.stores_kv(l), l <= 4) << l;

  // Interleaved kinds: each shared layer reads the last non-shared one of its own kind.
  j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention",
                      "sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  j["num_kv_shared_layers"] = 4;
  c = ModelConfig::from_json(j, "config.json");
  EXPECT_EQ(c.kv_source, (std::vector<int>{0, 1, 2, 3, 2, 3, 2, 3}));
  EXPECT_EQ(c.layer_kinds[4], K::Sliding);

  // No key, or 0: every layer its own.
  j.erase("num_kv_shared_layers");
  EXPECT_EQ(ModelConfig::from_json(j, "config.json").kv_source, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  j["num_kv_shared_layers"] = 0;
  EXPECT_EQ(ModelConfig::from_json(j, "config.json").kv_source, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));

  // Any Llama-family config may carry it (a Llama layer never slides: the donor is the last own layer).
  nlohmann::json llama = tiny_config();
  llama["num_kv_shared_layers"] = 2;
  c = ModelConfig::from_json(llama, "config.json");
  EXPECT_EQ(c.arch, Architecture::Llama);
  EXPECT_EQ(c.kv_source, (std::vector<int>{0, 1, 1, 1}));
}

TEST(YocoConfig, ErrorsNameTheField) {
  nlohmann::json j = tiny_config();  // 4 layers
  j["architectures"] = {"YocoLlamaForCausalLM"};
  j["layer_types"] = {"sliding_attention", "sliding_attention", "full_attention", "full_attention"};
  j["sliding_window"] = 16;
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json k = j;
    edit(k);
    return config_error(k);
  };
  EXPECT_EQ(with([](auto& k) { k["num_kv_shared_layers"] = 1; }), "(no error)");
  // No earlier layer at all.
  EXPECT_TRUE(has(with([](auto& k) { k["num_kv_shared_layers"] = 4; }),
                  "x/config.json: field 'num_kv_shared_layers' must be an integer in [0, 3] (num_hidden_layers is 4), got 4"));
  EXPECT_TRUE(has(with([](auto& k) { k["num_kv_shared_layers"] = -1; }), "field 'num_kv_shared_layers' must be an integer"));
  EXPECT_TRUE(has(with([](auto& k) { k["num_kv_shared_layers"] = "2"; }), "field 'num_kv_shared_layers' must be an integer"));
  // No earlier non-shared layer of the same kind: the full layers are all shared.
  EXPECT_TRUE(has(with([](auto& k) { k["num_kv_shared_layers"] = 2; }),
                  "field 'num_kv_shared_layers' (2) makes layer 2 (full_attention) read K/V from an earlier non-shared "
                  "layer of the same kind, and layer_types has none"));
  EXPECT_TRUE(has(with([](auto& k) {
                    k["layer_types"] = {"full_attention", "full_attention", "full_attention", "sliding_attention"};
                    k["num_kv_shared_layers"] = 1;
                  }),
                  "makes layer 3 (sliding_attention) read K/V"));
  // Sliding layers need a window.
  EXPECT_TRUE(has(with([](auto& k) { k.erase("sliding_window"); }),
                  "x/config.json: field 'sliding_window' is missing (layer_types lists sliding_attention layers)"));
  EXPECT_TRUE(has(with([](auto& k) { k["sliding_window"] = 0; }), "field 'sliding_window' must be a positive integer"));
  EXPECT_TRUE(has(with([](auto& k) { k["layer_types"] = {"full_attention"}; }), "field 'layer_types' has 1 entries"));
}

TEST(YocoConfig, SharedLayersLoadNoKvWeightsAndRejectThem) {
  test::TempDir ok, extra, missing;
  auto share_last = [](nlohmann::json& j) { j["num_kv_shared_layers"] = 1; };
  write_yoco_tiny(ok.path, share_last, {3});
  const auto m = Model::load(ok.path);
  EXPECT_EQ(m->kv_shape().kv_source, (std::vector<int>{0, 1, 2, 2}));

  // The shared layer's weights present: an error naming the tensor.
  write_yoco_tiny(extra.path, share_last, {});
  std::string err = "(no error)";
  try {
    Model::load(extra.path);
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_TRUE(has(err, "model.safetensors: tensor 'model.layers.3.self_attn.k_proj.weight' exists, but layer 3 "
                       "reads layer 2's K/V (config.json num_kv_shared_layers 1)"));
  // A storing layer's missing: the usual missing-tensor error.
  write_yoco_tiny(missing.path, share_last, {2, 3});
  err = "(no error)";
  try {
    Model::load(missing.path);
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_TRUE(has(err, "model.layers.2.self_attn.k_proj.weight")) << err;
}

// ---------------------------------------------------------------------------------------------
// The KV engine: a shared layer is a view of its donor's blocks.

std::vector<float> random_floats(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Causal softmax attention of the last query over keys/values [n][kv_dim] (GQA), by hand.
std::vector<float> attend_by_hand(const std::vector<float>& q, int n_heads, const std::vector<float>& k,
                                  const std::vector<float>& v, int n, int H, int D) {
  std::vector<float> out(size_t(n_heads) * size_t(D), 0.0f);
  for (int h = 0; h < n_heads; ++h) {
    const int g = h / (n_heads / H);
    std::vector<double> s(static_cast<size_t>(n));
    double mx = -1e30;
    for (int j = 0; j < n; ++j) {
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += double(q[size_t(h * D + d)]) * k[size_t(j) * size_t(H * D) + size_t(g * D + d)];
      s[size_t(j)] = dot / std::sqrt(double(D));
      mx = std::max(mx, s[size_t(j)]);
    }
    double z = 0;
    for (auto& x : s) z += (x = std::exp(x - mx));
    for (int j = 0; j < n; ++j)
      for (int d = 0; d < D; ++d)
        out[size_t(h * D + d)] += float(s[size_t(j)] / z * v[size_t(j) * size_t(H * D) + size_t(g * D + d)]);
  }
  return out;
}

TEST(YocoKVCache, SharedLayerStoresNothingAndReadsItsDonor) {
  const int H = 2, D = 16, n_heads = 4, n = 45;
  KVShape shape{3, H, D, std::vector<float>(D / 2, 1.0f), {}, {0, 1, 1}};  // layer 2 reads layer 1
  KVCacheConfig cfg;
  cfg.ctx_size = 256;
  KVCache cache(shape, cfg), other(shape, cfg);
  EXPECT_EQ(cache.kv_layer(2), 1);
  EXPECT_FALSE(cache.stores(2));
  std::mt19937 rng(3);
  const auto k0 = random_floats(rng, size_t(n) * H * D), v0 = random_floats(rng, size_t(n) * H * D);
  const auto k1 = random_floats(rng, size_t(n) * H * D), v1 = random_floats(rng, size_t(n) * H * D);
  for (int l = 0; l < 2; ++l) {
    cache.append(l, (l ? k1 : k0).data(), (l ? v1 : v0).data(), n);
    other.append(l, k0.data(), v0.data(), n);  // layer 1 holds other K/V than `cache`'s
  }
  ThreadPool pool(1);
  const auto q = random_floats(rng, size_t(n_heads) * D);
  std::vector<float> got(q.size()), from_other(q.size());
  cache.attend(cache.kv_layer(2), q.data(), 1, n_heads, got.data(), pool);
  other.attend(other.kv_layer(2), q.data(), 1, n_heads, from_other.data(), pool);
  const auto want = attend_by_hand(q, n_heads, k1, v1, n, H, D);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4) << i;
  double moved = 0;
  for (size_t i = 0; i < got.size(); ++i) moved = std::max(moved, double(std::fabs(got[i] - from_other[i])));
  EXPECT_GT(moved, 0.05) << "the shared layer's output must follow its donor's K/V";

  cache.end_step(std::vector<int32_t>(size_t(n), 5));
  EXPECT_EQ(cache.n_tokens(), n);
  EXPECT_EQ(cache.held_tokens(2), 0);
  EXPECT_EQ(cache.held_tokens(1), n);
  EXPECT_EQ(cache.logical_bytes(2), 0u);
  EXPECT_EQ(cache.logical_bytes(), cache.logical_bytes(0) + cache.logical_bytes(1));
  EXPECT_EQ(cache.logical_bytes(1), size_t(n) * 2 * H * D * sizeof(float));
  // The pools are sized for the storing layers only: two thirds of a three-layer cache's.
  KVShape plain = shape;
  plain.kv_source.clear();
  KVCache full(plain, cfg);
  EXPECT_EQ(cache.physical_bytes() * 3, full.physical_bytes() * 2);
  // Serialized state: the storing layers only, back to the same bytes.
  std::string a, b;
  cache.serialize(a);
  KVCache back(shape, cfg);
  back.deserialize(a);
  back.serialize(b);
  EXPECT_EQ(a, b);
  EXPECT_EQ(back.n_tokens(), n);
  cache.truncate(20);
  EXPECT_EQ(cache.n_tokens(), 20);
}

// ---------------------------------------------------------------------------------------------
// Models built from kjv-tiny's weights.

std::vector<int32_t> random_ids(uint32_t seed, size_t n) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, 8191);
  std::vector<int32_t> p(n);
  for (auto& x : p) x = id(rng);
  return p;
}

std::vector<float> all_logits(const Model& m, const std::vector<int32_t>& ids, ThreadPool& pool) {
  SessionOptions o;
  o.kv.ctx_size = 512;
  Session s(m, o, pool);
  const auto l = s.feed_all(ids);
  return {l.begin(), l.end()};
}

// modeling_yoco.py: "With layer_types all full_attention and num_kv_shared_layers 0 this is exactly
// LlamaForCausalLM." The same weights through both configs give the same bits.
TEST(YocoModel, NoSharingAndAllFullEqualsLlama) {
  test::TempDir tmp;
  write_yoco_tiny(tmp.path, [](auto& j) {
    j["layer_types"] = std::vector<std::string>(4, "full_attention");
    j["sliding_window"] = 16;
    j["num_kv_shared_layers"] = 0;
  }, {});
  const auto yoco = Model::load(tmp.path);
  const auto llama = Model::load(test::repo_model("kjv-tiny"));
  EXPECT_FALSE(yoco->kv_shape().any_window());
  EXPECT_FALSE(yoco->kv_shape().any_shared());
  ThreadPool pool(2);
  const auto ids = random_ids(1, 150);
  const auto a = all_logits(*yoco, ids, pool), b = all_logits(*llama, ids, pool);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// A tiny YOCO: layers 0-1 sliding over 16, 2-3 full, layer 3 reads layer 2's K/V.
class TinyYoco : public ::testing::Test {
 protected:
  void SetUp() override {
    write_yoco_tiny(tmp_.path, [](auto& j) {
      j["layer_types"] = {"sliding_attention", "sliding_attention", "full_attention", "full_attention"};
      j["sliding_window"] = 16;
      j["num_kv_shared_layers"] = 1;
    }, {3});
    model_ = Model::load(tmp_.path);
  }
  SessionOptions opts(KVPrecision p = KVPrecision::F32) const {
    SessionOptions o;
    o.kv.ctx_size = 512;
    o.kv.precision = p;
    o.kv.residual = 32;
    return o;
  }
  test::TempDir tmp_;
  std::unique_ptr<Model> model_;
};

// The prefill shortcut (feed: only the last token's logits; layer 3 and the rest of layer 2 run for it
// alone) against computing every position (feed_all): the same last logits and next token, the same
// stored K/V, and the same continuation.
TEST_F(TinyYoco, PrefillShortcutEqualsFullPrefill) {
  ThreadPool pool(2);
  const int V = model_->config().vocab_size;
  for (KVPrecision p : {KVPrecision::F32, KVPrecision::Int4}) {
    for (size_t n : {size_t(1), size_t(7), size_t(150)}) {
      const auto ids = random_ids(uint32_t(n), n);
      Session fast(*model_, opts(p), pool), full(*model_, opts(p), pool);
      const auto lf = fast.feed(ids);
      const auto la = full.feed_all(ids);
      const std::span<const float> last = la.subspan(la.size() - size_t(V));
      EXPECT_EQ(argmax(lf), argmax(last)) << n;
      double worst = 0;
      for (int v = 0; v < V; ++v) worst = std::max(worst, double(std::fabs(lf[size_t(v)] - last[size_t(v)])));
      EXPECT_LT(worst, 1e-4) << "prompt of " << n << ", " << kv_precision_name(p);
      std::string a, b;
      fast.cache().serialize(a);
      full.cache().serialize(b);
      EXPECT_EQ(a, b) << "the shortcut stores the same K/V";
      int32_t next = argmax(lf);
      for (int t = 0; t < 5; ++t) {
        const auto x = fast.feed({&next, 1});
        const auto y = full.feed({&next, 1});
        ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size_bytes()), 0) << "step " << t;
        next = argmax(x);
      }
    }
  }
}

// On a shared pool, a prompt diverging inside a block another sequence holds copies the tokens before
// the difference in every storing layer (sliding, full; the shared layer stores none) and goes on as a
// private computation does, bit for bit; no reference is left behind.
TEST_F(TinyYoco, PartialBlockAdoptionEqualsPrivate) {
  ThreadPool pool(2);
  KVPool kv(model_->kv_shape(), opts().kv, 3);
  const auto first = random_ids(41, 100);
  std::vector<int32_t> second(first.begin(), first.begin() + 70);
  const auto tail = random_ids(42, 30);
  second.insert(second.end(), tail.begin(), tail.end());
  {
    Session a(*model_, opts(), pool, &kv);
    a.feed(first);
    Session b(*model_, opts(), pool, &kv), priv(*model_, opts(), pool);
    auto x = b.feed(second);
    EXPECT_EQ(b.reused_tokens(), 70);  // two blocks adopted, 6 tokens copied
    auto y = priv.feed(second);
    for (int t = 0; t < 6; ++t) {
      ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size_bytes()), 0) << "step " << t;
      const int32_t next = argmax(x);
      x = b.feed({&next, 1});
      y = priv.feed({&next, 1});
    }
  }
  EXPECT_EQ(kv.dense().in_use(), 0u);
}

// The rows that go past the donor: the last token of a prompt, none of a chunk before it, every row
// when all logits are wanted, one per decoding sequence of a batch.
TEST_F(TinyYoco, ShortcutKeepsOnlyTheWantedRows) {
  ThreadPool pool(2);
  const int V = model_->config().vocab_size;
  KVCacheConfig kv;
  kv.ctx_size = 512;
  KVCache a(model_->kv_shape(), kv), b(model_->kv_shape(), kv);
  ForwardState st;
  const auto ids = random_ids(5, 40);
  std::vector<float> logits(ids.size() * size_t(V));
  model_->forward(ids, 0, a, st, nullptr, false, pool);
  EXPECT_EQ(st.cross_rows, 0);
  model_->forward(ids, 0, b, st, logits.data(), false, pool);
  EXPECT_EQ(st.cross_rows, 1);
  a.end_step(ids);
  b.end_step(ids);
  std::vector<int32_t> more(ids.begin(), ids.begin() + 20);
  model_->forward(more, 40, a, st, logits.data(), true, pool);
  EXPECT_EQ(st.cross_rows, 20);
  const int32_t t1 = 7, t2 = 9;
  std::vector<float> l1(static_cast<size_t>(V)), l2(static_cast<size_t>(V));
  const SequenceBatch batch[] = {{&a, {&t1, 1}, 60, l1.data(), false}, {&b, {&t2, 1}, 40, l2.data(), false}};
  model_->forward(batch, st, pool);
  EXPECT_EQ(st.cross_rows, 2);
  // A model without shared layers has no shortcut.
  const auto llama = Model::load(test::repo_model("kjv-tiny"));
  KVCache c(llama->kv_shape(), kv);
  ForwardState st2;
  llama->forward(ids, 0, c, st2, logits.data(), false, pool);
  EXPECT_EQ(st2.cross_rows, -1);
}

// Layer 3 has no K/V: overwriting layer 2's stored K/V (through the state bytes) moves the logits of
// a model whose layer 3 reads it; the shared layer holds nothing.
TEST_F(TinyYoco, SharedLayerReadsItsDonorsStoredKV) {
  ThreadPool pool(2);
  const auto ids = random_ids(9, 40);
  Session s(*model_, opts(), pool);
  s.feed(ids);
  EXPECT_EQ(s.cache().held_tokens(3), 0);
  EXPECT_EQ(s.cache().held_tokens(2), 40);
  EXPECT_EQ(s.cache().logical_bytes(3), 0u);
  std::string state;
  s.cache().serialize(state);
  // The state: layers 0, 1, 2 (3 stores nothing); layer 2's last block (tokens 32-39) is the last
  // bytes. Scale its V (the second half of the block) so that attention's output changes.
  const size_t block = size_t(32) * 2 * size_t(model_->kv_shape().kv_dim()) * sizeof(float);
  std::string changed = state;
  char* vals = changed.data() + changed.size() - block / 2;  // not float-aligned: copied in and out
  for (size_t i = 0; i < block / 2 / sizeof(float); ++i) {
    float v;
    std::memcpy(&v, vals + i * sizeof(float), sizeof v);
    v *= -3.0f;
    std::memcpy(vals + i * sizeof(float), &v, sizeof v);
  }
  auto next_logits = [&](const std::string& kv) {
    Session t(*model_, opts(), pool);
    const auto last = s.last_logits();
    t.restore(ids, kv, last);
    const int32_t tok = 77;
    const auto l = t.feed({&tok, 1});
    return std::vector<float>(l.begin(), l.end());
  };
  const auto same = next_logits(state), moved = next_logits(changed);
  {
    Session ref(*model_, opts(), pool);
    ref.feed(ids);
    const int32_t tok = 77;
    const auto l = ref.feed({&tok, 1});
    ASSERT_EQ(std::memcmp(l.data(), same.data(), l.size_bytes()), 0) << "restoring the bytes unchanged is exact";
  }
  double diff = 0;
  for (size_t i = 0; i < same.size(); ++i) diff = std::max(diff, double(std::fabs(same[i] - moved[i])));
  EXPECT_GT(diff, 0.1);
}

// The reference path (--no-cache: the whole sequence again each step, through a fresh cache) past the
// sliding layers' windows: the cached path's logits.
TEST_F(TinyYoco, NoCacheEqualsCachedPastTheWindows) {
  ThreadPool pool(2);
  const auto ids = random_ids(31, 300);
  SessionOptions o = opts();
  o.use_cache = false;
  Session ref(*model_, o, pool), cached(*model_, opts(), pool);
  const auto a = ref.feed(ids);
  const auto b = cached.feed(ids);
  double worst = 0;
  for (size_t v = 0; v < a.size(); ++v) worst = std::max(worst, double(std::fabs(a[v] - b[v])));
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(argmax(a), argmax(b));
}

// Several sequences stepped together equal each alone (the shortcut drops rows per sequence).
TEST_F(TinyYoco, BatchEqualsAlone) {
  ThreadPool pool(2);
  const int n = 5, steps = 12;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(random_ids(uint32_t(20 + i), size_t(3 + 14 * i)));  // within one chunk
  std::vector<std::vector<int32_t>> alone(n);
  for (int i = 0; i < n; ++i) {
    Session s(*model_, opts(), pool);
    auto lg = s.feed(prompts[size_t(i)]);
    for (int t = 0; t < steps; ++t) {
      alone[size_t(i)].push_back(argmax(lg));
      lg = s.feed({&alone[size_t(i)].back(), 1});
    }
  }
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<Session*> ptrs;
  for (int i = 0; i < n; ++i) {
    sessions.push_back(std::make_unique<Session>(*model_, opts(), pool));
    ptrs.push_back(sessions.back().get());
  }
  // The prompts together in one pass, then the decode steps.
  std::vector<std::span<const int32_t>> feeds;
  for (int i = 0; i < n; ++i) feeds.emplace_back(prompts[size_t(i)]);
  ForwardState st;
  Session::feed_batch(ptrs, feeds, st);
  std::vector<int32_t> next(n);
  for (int t = 0; t < steps; ++t) {
    feeds.clear();
    for (int i = 0; i < n; ++i) {
      next[size_t(i)] = argmax(sessions[size_t(i)]->last_logits());
      ASSERT_EQ(next[size_t(i)], alone[size_t(i)][size_t(t)]) << "seq " << i << " step " << t;
      feeds.emplace_back(&next[size_t(i)], 1);
    }
    Session::feed_batch(ptrs, feeds, st);
  }
}

// The memory reports say which layers store K/V and the bytes: sample's footer and --json, bench
// --json, eval --json.
TEST_F(TinyYoco, ReportsNameTheStoringLayers) {
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(test::repo_model("kjv-tiny") / f, tmp_.path / f);
  const std::string bin = test::binary() + " ";
  const std::string dir = tmp_.path.string();
  auto sample = test::run_command(bin + "sample " + dir +
                                  " --prompt 'In the beginning' --tokens 8 --temperature 0 --ignore-eos --threads 2");
  ASSERT_EQ(sample.code, 0) << sample.err;
  EXPECT_TRUE(has(sample.err, "kv layers: 3 of 4 store K/V; logical by layer: 0 "));
  EXPECT_TRUE(has(sample.err, "; layers 3 read layer 2's"));

  auto bench = test::run_command(bin + "bench " + dir + " -p 40 -n 4 -r 1 --threads 2 --bandwidth-mib 16 --json");
  ASSERT_EQ(bench.code, 0) << bench.err;
  const auto b = nlohmann::json::parse(bench.out);
  EXPECT_EQ(b["kv_layers"]["stored_layers"], nlohmann::json({0, 1, 2}));
  EXPECT_EQ(b["kv_layers"]["source_layer"], nlohmann::json({0, 1, 2, 2}));
  const auto bytes = b["kv_layers"]["logical_bytes"].get<std::vector<size_t>>();
  ASSERT_EQ(bytes.size(), 4u);
  EXPECT_EQ(bytes[3], 0u);
  const size_t token = 2 * size_t(model_->kv_shape().kv_dim()) * sizeof(float);
  EXPECT_EQ(bytes[2], 44 * token);  // the full layer: 40 prompt tokens and 4 generated
  EXPECT_EQ(bytes[0], 16 * token);  // a sliding layer: its window
  EXPECT_EQ(bytes[0] + bytes[1] + bytes[2], b["kv_logical_bytes"].get<size_t>());

  const auto text = tmp_.path / "text.txt";
  std::ofstream(text) << "In the beginning God created the heaven and the earth. And the earth was without form.\n";
  auto eval = test::run_command(bin + "eval " + dir + " --text " + text.string() + " --configs 'fp32; int8' --json");
  ASSERT_EQ(eval.code, 0) << eval.err;
  const auto e = nlohmann::json::parse(eval.out);
  ASSERT_EQ(e["configs"].size(), 2u);
  for (const auto& c : e["configs"]) {
    EXPECT_EQ(c["kv_layers"]["stored_layers"], nlohmann::json({0, 1, 2})) << c["name"];
    EXPECT_EQ(c["kv_layers"]["logical_bytes"][3], 0) << c["name"];
  }
}

}  // namespace
}  // namespace ptllm
