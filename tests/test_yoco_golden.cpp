// kjv-yoco (8 layers: 0-3 slide over 128, 4-7 full, 5-7 read layer 4's K/V) against the goldens of
// its PyTorch reference (modeling_yoco.py, float32): teacher-forced NLL and logits, the greedy ids of
// every golden prompt, golden_long's 2048 per-position NLL; the memory it holds; every KV precision x
// StreamingLLM x position scheme; the prefill shortcut; batched decode, prefix sharing and the prompt
// cache's key. The model is read from ../shared/models (skipped without it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/thread_pool.h"
#include "engine/prompt_cache.h"
#include "engine/session.h"
#include "kv/kv_cache.h"
#include "sample/sampler.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

using test::mean;
using test::nll_of;

class YocoGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto dir = test::shared_model("kjv-yoco");
    if (std::filesystem::exists(dir / "model.safetensors")) model_ = Model::load(dir).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    dir_ = test::shared_model("kjv-yoco");
    if (!model_) GTEST_SKIP() << dir_ << " not found (read from ../shared/models; skipped without it)";
    V_ = model_->config().vocab_size;
  }
  static SessionOptions opts() {
    SessionOptions o;
    o.kv.ctx_size = 2048;
    return o;
  }
  // All logits of ids, fed in pieces of `piece` tokens (0: one call).
  std::vector<float> logits_of(const std::vector<int32_t>& ids, size_t piece, ThreadPool& pool,
                               const SessionOptions& o = opts()) {
    Session s(*model_, o, pool);
    std::vector<float> all;
    if (piece == 0) piece = ids.size();
    for (size_t at = 0; at < ids.size(); at += piece) {
      const size_t n = std::min(piece, ids.size() - at);
      auto l = s.feed_all(std::span<const int32_t>(ids).subspan(at, n));
      all.insert(all.end(), l.begin(), l.end());
    }
    return all;
  }

  std::filesystem::path dir_;
  static Model* model_;
  int V_ = 0;
};
Model* YocoGolden::model_ = nullptr;

TEST_F(YocoGolden, LayoutMatchesTheGoldens) {
  auto golden = test::read_json(dir_ / "golden.json");
  const KVShape shape = model_->kv_shape();
  EXPECT_EQ(shape.kv_source, golden["kv_source_layer"].get<std::vector<int>>());
  std::vector<int> stored;
  for (int l = 0; l < shape.n_layers; ++l)
    if (shape.stores(l)) stored.push_back(l);
  EXPECT_EQ(stored, golden["kv_layers_stored"].get<std::vector<int>>());
  EXPECT_EQ(shape.layer_window, (std::vector<int>{128, 128, 128, 128, 0, 0, 0, 0}));
}

TEST_F(YocoGolden, TeacherForcedMatchesReference) {
  SafetensorsFile g(dir_ / "golden.safetensors");
  auto ids = test::tensor_values<int32_t>(g, "tf_ids");
  auto want = test::tensor_values<float>(g, "tf_nll");
  auto argmax_ref = test::tensor_values<int32_t>(g, "tf_argmax");
  auto pos = test::tensor_values<int32_t>(g, "tf_logits_pos");
  auto ref_logits = test::tensor_values<float>(g, "tf_logits");
  ThreadPool pool(2);
  for (size_t piece : {size_t(0), size_t(1), size_t(45)}) {
    const std::vector<float> logits = logits_of(ids, piece, pool);
    const std::vector<double> nll = nll_of(logits, ids, V_);
    ASSERT_EQ(nll.size(), want.size());
    double worst = 0;
    for (size_t t = 0; t < nll.size(); ++t) {
      EXPECT_NEAR(nll[t], want[t], 1e-3) << "position " << t << ", pieces of " << piece;
      worst = std::max(worst, std::fabs(nll[t] - want[t]));
    }
    for (size_t t = 0; t < ids.size(); ++t)
      EXPECT_EQ(argmax(std::span<const float>(logits.data() + t * size_t(V_), size_t(V_))), argmax_ref[t]) << t;
    double worst_rel = 0;
    for (size_t k = 0; k < pos.size(); ++k) {
      const float* mine = logits.data() + size_t(pos[k]) * size_t(V_);
      const float* ref = ref_logits.data() + k * size_t(V_);
      float max_abs = 0;
      for (int i = 0; i < V_; ++i) max_abs = std::max(max_abs, std::fabs(ref[i]));
      for (int i = 0; i < V_; ++i) {
        ASSERT_NEAR(mine[i], ref[i], 1e-3f * max_abs) << "logit " << i << " at " << pos[k];
        worst_rel = std::max(worst_rel, double(std::fabs(mine[i] - ref[i]) / max_abs));
      }
    }
    auto golden = test::read_json(dir_ / "golden.json");
    EXPECT_NEAR(mean(nll), golden["teacher_forced"]["mean_nll"].get<double>(), 1e-4);
    std::printf("teacher-forced, pieces of %zu: mean NLL %.6f (golden %.6f), largest per-position difference %.2e, "
                "largest logit difference %.2e of the largest logit\n",
                piece, mean(nll), golden["teacher_forced"]["mean_nll"].get<double>(), worst, worst_rel);
  }
}

// The 48 greedy ids of every golden prompt, and long_greedy's 400 (past the 128-token windows), through
// the prefill shortcut (feed) and decode steps.
TEST_F(YocoGolden, GreedyMatchesReference) {
  auto golden = test::read_json(dir_ / "golden.json");
  ThreadPool pool(2);
  ASSERT_FALSE(golden["prompts"].empty());
  nlohmann::json cases = golden["prompts"];
  cases.push_back(golden["long_greedy"]);
  ASSERT_EQ(cases.back()["greedy_ids"].size(), 400u);
  for (const auto& p : cases) {
    auto ids = p["ids"].get<std::vector<int32_t>>();
    auto want = p["greedy_ids"].get<std::vector<int32_t>>();
    Session s(*model_, opts(), pool);
    std::span<float> logits = s.feed(ids);
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      int32_t next = argmax(logits);
      got.push_back(next);
      if (i + 1 < want.size()) logits = s.feed({&next, 1});
    }
    EXPECT_EQ(got, want) << "prompt: " << p["text"];
    // Layers 0-3 hold their window, 5-7 nothing, 4 every token.
    for (int l = 0; l < 4; ++l) EXPECT_LT(s.cache().held_tokens(l), 128 + 64 + 32) << l;
    for (int l = 5; l < 8; ++l) EXPECT_EQ(s.cache().held_tokens(l), 0) << l;
    EXPECT_EQ(s.cache().held_tokens(4), s.cache().n_tokens());
  }
}

// golden_long: 2048 tokens, one call (in the cache's chunks) and token by token would take long;
// one call and uneven chunks.
TEST_F(YocoGolden, LongTextMatchesReference) {
  SafetensorsFile g(dir_ / "golden_long.safetensors");
  auto ids = test::tensor_values<int32_t>(g, "ids");
  auto want = test::tensor_values<float>(g, "nll");
  ASSERT_EQ(ids.size(), 2048u);
  ASSERT_EQ(want.size(), 2047u);
  auto golden = test::read_json(dir_ / "golden.json");
  ThreadPool pool(2);
  for (size_t piece : {size_t(0), size_t(301)}) {
    const std::vector<double> nll = nll_of(logits_of(ids, piece, pool), ids, V_);
    ASSERT_EQ(nll.size(), want.size());
    double worst = 0;
    for (size_t t = 0; t < nll.size(); ++t) {
      EXPECT_NEAR(nll[t], want[t], 1e-3) << "position " << t << ", pieces of " << piece;
      worst = std::max(worst, std::fabs(nll[t] - want[t]));
    }
    const double first512 = mean(std::vector<double>(nll.begin(), nll.begin() + 511));
    std::printf("golden_long, pieces of %zu: mean NLL %.6f, first 512 %.6f (long_dense %.6f), largest per-position "
                "difference %.2e\n",
                piece, mean(nll), first512, golden["long_dense"]["mean_nll_first_512"].get<double>(), worst);
  }
}

// Memory after a 2048-token prompt: 4 windows of 128 (plus the blocks a chunk and alignment leave) and
// one full-length layer, against 8 full-length layers; int4 keeps the windows in the residual.
TEST_F(YocoGolden, MemoryIsFourWindowsAndOneFullLayer) {
  SafetensorsFile g(dir_ / "golden_long.safetensors");
  auto ids = test::tensor_values<int32_t>(g, "ids");
  ThreadPool pool(2);
  const size_t token_bytes = 2 * size_t(model_->kv_shape().kv_dim()) * sizeof(float);  // K and V, fp32
  for (KVPrecision p : {KVPrecision::F32, KVPrecision::Int4}) {
    SessionOptions o = opts();
    o.kv.precision = p;
    Session s(*model_, o, pool);
    s.feed(ids);
    const KVCache& kv = s.cache();
    for (int l = 0; l < 4; ++l) EXPECT_EQ(kv.logical_bytes(l), 128 * token_bytes) << l;  // the window, full precision
    for (int l = 5; l < 8; ++l) EXPECT_EQ(kv.logical_bytes(l), 0u) << l;
    // kjv-small (the same shape, 8 full layers) holds 8 times layer 4's bytes under the same settings.
    const double small = 8.0 * double(kv.logical_bytes(4));
    const double ratio = double(kv.logical_bytes()) / small;
    if (p == KVPrecision::F32) {
      EXPECT_EQ(kv.logical_bytes(4), 2048 * token_bytes);
      EXPECT_NEAR(ratio, (4.0 * 128 + 2048) / (8.0 * 2048), 1e-9);
    } else {
      EXPECT_LT(kv.logical_bytes(4), 2048 * token_bytes / 4);  // quantized but its 128-159 residual tokens
    }
    EXPECT_LE(ratio, p == KVPrecision::F32 ? 0.17 : 0.30);
    std::printf("%s: logical KV %zu bytes after 2048 tokens, %.4f of kjv-small's (8 x layer 4's %zu)\n",
                std::string(kv_precision_name(p)).c_str(), kv.logical_bytes(), ratio, kv.logical_bytes(4));
  }
}

// Every precision x StreamingLLM x position scheme runs on kjv-yoco: teacher-forced NLL over the golden
// ids stays near the fp32 golden (StreamingLLM with a window shorter than the text evicts), the
// shortcut's next token equals the full prefill's.
TEST_F(YocoGolden, EveryPrecisionStreamingAndPositionSchemeRuns) {
  SafetensorsFile g(dir_ / "golden.safetensors");
  auto ids = test::tensor_values<int32_t>(g, "tf_ids");
  const double ref = test::read_json(dir_ / "golden.json")["teacher_forced"]["mean_nll"].get<double>();
  ThreadPool pool(2);
  for (KVPrecision p : {KVPrecision::F32, KVPrecision::F16, KVPrecision::BF16, KVPrecision::Int8, KVPrecision::Int4,
                        KVPrecision::Int2})
    for (bool streaming : {false, true})
      for (PositionMode pos : {PositionMode::Absolute, PositionMode::Cache}) {
        SessionOptions o = opts();
        o.kv.precision = p;
        o.kv.residual = 64;
        o.kv.positions = pos;
        if (streaming) {
          o.kv.sink = 4;
          o.kv.window = 156;  // shorter than the 256 ids: the full layers evict
        }
        const std::string what = o.kv.describe();
        const std::vector<double> nll = nll_of(logits_of(ids, 0, pool, o), ids, V_);
        const double m = mean(nll);
        EXPECT_TRUE(std::isfinite(m)) << what;
        // fp32-like storage and no eviction: the golden; otherwise within what quantization and
        // eviction cost (int2 is the coarsest).
        const double tol = !streaming && !is_kivi(p) ? (p == KVPrecision::F32 ? 1e-4 : 2e-3)
                           : p == KVPrecision::Int2                        ? 2e-2
                                                                           : 1e-2;
        EXPECT_NEAR(m, ref, tol) << what;
        Session fast(*model_, o, pool), full(*model_, o, pool);
        const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 200);
        const auto lf = fast.feed(prompt);
        const auto la = full.feed_all(prompt);
        EXPECT_EQ(argmax(lf), argmax(la.subspan(la.size() - size_t(V_)))) << what;
        std::printf("%-28s mean NLL %.4f (golden %.4f), held tokens layer 4: %lld\n", what.c_str(), m, ref,
                    static_cast<long long>(fast.cache().held_tokens(4)));
      }
}

// The prefill shortcut: the same next token and logits as computing every position, on the golden
// prompts and a long one.
TEST_F(YocoGolden, PrefillShortcutEqualsFullPrefill) {
  auto golden = test::read_json(dir_ / "golden.json");
  SafetensorsFile g(dir_ / "golden_long.safetensors");
  auto long_ids = test::tensor_values<int32_t>(g, "ids");
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : golden["prompts"]) prompts.push_back(p["ids"].get<std::vector<int32_t>>());
  prompts.emplace_back(long_ids.begin(), long_ids.begin() + 1000);
  ThreadPool pool(2);
  for (const auto& ids : prompts) {
    Session fast(*model_, opts(), pool), full(*model_, opts(), pool);
    const auto lf = fast.feed(ids);
    const auto la = full.feed_all(ids);
    const auto last = la.subspan(la.size() - size_t(V_));
    EXPECT_EQ(argmax(lf), argmax(last));
    float max_abs = 0;
    double worst = 0;
    for (int v = 0; v < V_; ++v) max_abs = std::max(max_abs, std::fabs(last[size_t(v)]));
    for (int v = 0; v < V_; ++v) worst = std::max(worst, double(std::fabs(lf[size_t(v)] - last[size_t(v)])));
    EXPECT_LT(worst, 1e-5 * max_abs) << ids.size() << " tokens";
    std::string a, b;
    fast.cache().serialize(a);
    full.cache().serialize(b);
    EXPECT_EQ(a, b) << "the same K/V stored";
  }
}

// Sequences stepped together equal each alone; a shared pool's prefix sharing equals a private cache.
TEST_F(YocoGolden, BatchedDecodeAndPrefixSharing) {
  auto golden = test::read_json(dir_ / "golden.json");
  ThreadPool pool(2);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : golden["prompts"]) prompts.push_back(p["ids"].get<std::vector<int32_t>>());
  const size_t n = prompts.size();
  const int steps = 48;
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<Session*> ptrs;
  std::vector<int32_t> next(n);
  for (size_t i = 0; i < n; ++i) {
    sessions.push_back(std::make_unique<Session>(*model_, opts(), pool));
    ptrs.push_back(sessions.back().get());
    next[i] = argmax(sessions.back()->feed(prompts[i]));
  }
  std::vector<std::vector<int32_t>> got(n);
  ForwardState st;
  for (int t = 0; t < steps; ++t) {
    std::vector<std::span<const int32_t>> feeds;
    for (size_t i = 0; i < n; ++i) {
      got[i].push_back(next[i]);
      feeds.emplace_back(&next[i], 1);
    }
    if (t + 1 == steps) break;
    Session::feed_batch(ptrs, feeds, st);
    for (size_t i = 0; i < n; ++i) next[i] = argmax(sessions[i]->last_logits());
  }
  for (size_t i = 0; i < n; ++i)
    EXPECT_EQ(got[i], golden["prompts"][i]["greedy_ids"].get<std::vector<int32_t>>()) << "sequence " << i;

  // Prefix sharing: a second sequence with the first's 100-token prefix takes its blocks (the first
  // holds 120 tokens, within the 128-token windows: nothing of it is evicted yet).
  SafetensorsFile g(dir_ / "golden_long.safetensors");
  auto long_ids = test::tensor_values<int32_t>(g, "ids");
  const std::vector<int32_t> first(long_ids.begin(), long_ids.begin() + 120);
  std::vector<int32_t> second(long_ids.begin(), long_ids.begin() + 100);
  second.insert(second.end(), long_ids.begin() + 400, long_ids.begin() + 440);
  KVPool kv(model_->kv_shape(), opts().kv, 3);
  {
    Session a(*model_, opts(), pool, &kv);
    a.feed(first);
    Session b(*model_, opts(), pool, &kv);
    const auto lb = b.feed(second);
    const int64_t reused = b.reused_tokens();
    // The private run computes what b took (96 tokens) and then what b computed, in the same
    // pieces: products of different row counts may round differently (matmul picks its kernel by
    // the count), so only the same pieces give the same bits.
    Session priv(*model_, opts(), pool);
    priv.feed(std::span(second).first(96));
    const auto lp = priv.feed(std::span(second).subspan(96));
    EXPECT_EQ(std::memcmp(lb.data(), lp.data(), lp.size_bytes()), 0);
    EXPECT_EQ(reused, 96) << "three whole blocks of 32 of the 100 common tokens";
    int32_t tok = argmax(lb);
    for (int t = 0; t < 20; ++t) {
      const auto x = b.feed({&tok, 1});
      const auto y = priv.feed({&tok, 1});
      ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size_bytes()), 0) << "step " << t;
      tok = argmax(x);
    }
  }
  EXPECT_EQ(kv.dense().in_use(), 0u);
}

// The prompt cache's key covers the sharing layout: a file written for kjv-small is refused here.
TEST_F(YocoGolden, PromptCacheOfKjvSmallIsRefused) {
  const auto small_dir = test::shared_model("kjv-small");
  if (!std::filesystem::exists(small_dir / "model.safetensors")) GTEST_SKIP() << small_dir << " not found";
  const auto small = Model::load(small_dir);
  const Tokenizer tok = Tokenizer::load(dir_);
  test::TempDir tmp;
  ThreadPool pool(2);
  const auto ids = tok.encode("In the beginning God created the heaven and the earth.");
  PromptCacheOptions po;
  po.file = tmp.path / "state.kvcache";
  {
    Session s(*small, opts(), pool);
    PromptCache pc(po, prompt_cache_identity(*small, tok, opts().kv));
    pc.prefill(s, ids);
    ASSERT_FALSE(pc.finish().saved.empty());
  }
  Session s(*model_, opts(), pool);
  PromptCache pc(po, prompt_cache_identity(*model_, tok, opts().kv));
  const PromptCacheLoad load = pc.prefill(s, ids);
  EXPECT_EQ(load.outcome, PromptCacheOutcome::Miss);
  EXPECT_EQ(load.reused, 0);
  ASSERT_EQ(load.warnings.size(), 1u);
  EXPECT_NE(load.warnings[0].find("written for model kjv-small"), std::string::npos) << load.warnings[0];
  // The state of kjv-yoco saved and loaded back continues exactly.
  PromptCacheOptions own;
  own.file = tmp.path / "own.kvcache";
  std::vector<float> cold;
  {
    PromptCache w(own, prompt_cache_identity(*model_, tok, opts().kv));
    Session a(*model_, opts(), pool);
    w.prefill(a, ids);
    ASSERT_FALSE(w.finish().saved.empty());
    const int32_t t = 5;
    const auto l = a.feed({&t, 1});
    cold.assign(l.begin(), l.end());
  }
  PromptCache r(own, prompt_cache_identity(*model_, tok, opts().kv));
  Session b(*model_, opts(), pool);
  EXPECT_EQ(r.prefill(b, ids).outcome, PromptCacheOutcome::Hit);
  const int32_t t = 5;
  const auto l = b.feed({&t, 1});
  EXPECT_EQ(std::memcmp(l.data(), cold.data(), l.size_bytes()), 0);
}

}  // namespace
}  // namespace ptllm
