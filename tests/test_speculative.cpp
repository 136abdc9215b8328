// Speculative decoding (engine/speculative.h): drafts, verification and rewind give the text decoding
// one token at a time gives, for every KV configuration; the pool keeps no block of a rejected
// draft; sampling keeps the target's distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>

#include "core/thread_pool.h"
#include "engine/drafter_suffix.h"
#include "engine/generator.h"
#include "engine/session.h"
#include "engine/speculative.h"
#include "kernels/affine.h"
#include "kv/config.h"
#include "model/model.h"
#include "model/quantize.h"
#include "scripted_model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using test::light_or;

struct Tiny {
  std::unique_ptr<Model> model = Model::load(test::repo_model("kjv-tiny"));
  Tokenizer tok = Tokenizer::load(test::repo_model("kjv-tiny"));
};
Tiny& tiny() {
  static Tiny t;
  return t;
}

struct Output {
  std::vector<int32_t> ids;
  SpecStats stats;
};

GeneratorOptions gen_options(int n, float temperature = 0, uint64_t seed = 1) {
  GeneratorOptions o;
  o.sampling.temperature = temperature;
  o.sampling.seed = seed;
  o.ignore_eos = true;
  o.max_tokens = n;
  return o;
}

SpecOptions ngram(int draft_max = 8, bool adaptive = false, SpecType type = SpecType::Ngram) {
  SpecOptions o;
  o.type = type;
  o.draft_max = draft_max;
  o.adaptive = adaptive;
  return o;
}

// n tokens after `prompt`, speculating with `so` (type None: one token at a time).
Output generate(Session& s, const Tokenizer& tok, std::span<const int32_t> prompt, GeneratorOptions go,
                const SpecOptions& so) {
  Generator gen(tok, std::move(go));
  Speculator spec(so);
  std::span<float> logits = s.feed(prompt);
  Generator::Step step = gen.next(logits, s.history(), s.fits(1));
  std::vector<Generator::Step> steps;
  while (!gen.done()) {
    steps.clear();
    spec.round(s, gen, step.id, steps);
    EXPECT_FALSE(steps.empty());
    if (steps.empty()) break;
    step = steps.back();
  }
  return {gen.tokens(), spec.stats()};
}

// A prompt whose continuation repeats (kjv-tiny, like kjv-small, falls into loops that drafts find).
std::vector<int32_t> prompt_ids(const Tokenizer& tok) {
  return tok.encode("And the LORD said unto Moses, Speak unto the children of Israel, and say unto them, "
                    "And the LORD said unto Moses");
}

SessionOptions kv_options(const std::string& text) {
  SessionOptions o;
  KVCacheConfig base;
  base.ctx_size = 1024;
  base.preallocate = false;
  o.kv = text.empty() ? base : parse_kv_config(text, base);
  return o;
}

// Greedy with and without speculation: the same ids; drafts were both kept and rejected (the rewind
// ran); the pool ends with the blocks the plain run holds.
void expect_same_greedy(const Model& model, const Tokenizer& tok, const SessionOptions& so, int n,
                        const std::string& what, int draft_max = 8, SpecType type = SpecType::Ngram) {
  ThreadPool pool(2);
  const auto prompt = prompt_ids(tok);
  KVPool pa(model.kv_shape(), so.kv, 1), pb(model.kv_shape(), so.kv, 1);
  Session a(model, so, pool, &pa), b(model, so, pool, &pb);
  const Output plain = generate(a, tok, prompt, gen_options(n), SpecOptions{});
  const Output spec = generate(b, tok, prompt, gen_options(n), ngram(draft_max, false, type));
  EXPECT_EQ(plain.ids, spec.ids) << what;
  EXPECT_EQ(plain.stats.verify_steps, 0) << what;
  EXPECT_GT(spec.stats.accepted, 0) << what;
  EXPECT_GT(spec.stats.drafted, spec.stats.accepted) << what << ": no draft was rejected";
  EXPECT_EQ(a.history(), b.history()) << what;
  EXPECT_EQ(pa.blocks_in_use(), pb.blocks_in_use()) << what;
  EXPECT_EQ(a.cache().n_stored(), b.cache().n_stored()) << what;
}

TEST(NgramDrafter, LongestRecentMatchAndItsLoop) {
  NgramDrafter d(1, 3);
  std::vector<int32_t> out;
  // "5 1 2" occurs once before: what followed it.
  const std::vector<int32_t> h = {5, 1, 2, 9, 9, 7, 1, 2, 3, 4, 5, 1, 2};
  EXPECT_EQ(d.draft(h, 4, out), 3);
  EXPECT_EQ(out, (std::vector<int32_t>{9, 9, 7, 1}));
  // Only "2" recurs: the most recent occurrence wins.
  const std::vector<int32_t> h2 = {2, 8, 0, 2, 6, 4, 2};
  EXPECT_EQ(d.draft(h2, 2, out), 1);
  EXPECT_EQ(out, (std::vector<int32_t>{6, 4}));
  // A loop of period 3 continues through the draft itself.
  const std::vector<int32_t> loop = {4, 7, 8, 9, 7, 8, 9};
  EXPECT_EQ(d.draft(loop, 7, out), 3);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 8, 9, 7, 8, 9, 7}));
  // Nothing recurs: no draft.
  const std::vector<int32_t> none = {1, 2, 3, 4};
  EXPECT_EQ(d.draft(none, 4, out), 0);
  EXPECT_TRUE(out.empty());
}

TEST(SpeculativeGreedy, SameTokensForEveryKVConfiguration) {
  Tiny& t = tiny();
  for (const std::string kv : {"fp32", "fp16", "bf16", "int8 r32", "int4 r32", "int4 r0", "int2 r32", "int8 g16 r16",
                               "fp32 sink4 w48", "fp32 sink4 w48 pos=cache", "int4 r32 sink4 w80",
                               "int4 g16 r16 sink4 w80 pos=cache"})
    expect_same_greedy(*t.model, t.tok, kv_options(kv), light_or(160, 48), kv);
}

TEST(SuffixDrafter, MostFrequentContinuationOfTheLongestContext) {
  SuffixDrafter d(3, 0.1);
  std::vector<int32_t> out;
  // After "1 2": 3 twice, 4 once (the most recent); after "2 3": 5, after "3 5": 8, each twice.
  const std::vector<int32_t> h = {1, 2, 3, 5, 8, 1, 2, 3, 5, 8, 7, 1, 2, 4, 9, 1, 2};
  EXPECT_GT(d.draft(h, 3, out), 0);
  EXPECT_EQ(out, (std::vector<int32_t>{3, 5, 8}));
  // The confidence bound stops a draft: after "7" come four different tokens.
  SuffixDrafter strict(1, 0.5);
  const std::vector<int32_t> h2 = {7, 1, 7, 2, 7, 3, 7, 4, 7};
  EXPECT_EQ(strict.draft(h2, 4, out), 0);
  EXPECT_TRUE(out.empty());
  // The history rewritten (a chat turn re-rendered): counted again, nothing of the old one left.
  const std::vector<int32_t> h3 = {6, 6, 6};
  EXPECT_GT(d.draft(h3, 2, out), 0);
  EXPECT_EQ(out, (std::vector<int32_t>{6, 6}));
}

// The shared counts of a server's replies: a reply drafted again after its prompt, the oldest replies
// uncounted past the bound, nothing left once every reply is gone.
TEST(SuffixCache, DraftsEarlierRepliesAndStaysBounded) {
  SuffixCache cache(4, 20);
  std::vector<int32_t> out;
  int n = 0;
  const std::vector<int32_t> prompt = {50, 51, 52, 53, 54};
  const std::vector<int32_t> reply = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  EXPECT_EQ(cache.draft(prompt, 8, 0.1, out, n), 0.0);
  EXPECT_TRUE(out.empty());
  cache.add(prompt, reply);
  EXPECT_EQ(cache.tokens(), 10u);
  // After the prompt's tail: the reply from its first token, every continuation certain.
  EXPECT_DOUBLE_EQ(cache.draft(prompt, 8, 0.1, out, n), 8.0);
  EXPECT_EQ(out, std::vector<int32_t>(reply.begin(), reply.begin() + 8));
  EXPECT_EQ(n, 3);  // the prompt's last 3 tokens (N - 1) are the reply's first context
  // From the middle of the reply (a sequence that wrote its start already).
  cache.draft(std::vector<int32_t>{1, 2, 12, 13}, 3, 0.1, out, n);
  EXPECT_EQ(out, (std::vector<int32_t>{14, 15, 16}));
  // A second reply after the same prompt: the first token is now a coin flip, the draft stops
  // where the product of frequencies falls below the bound.
  const std::vector<int32_t> other = {10, 21, 22, 23, 24, 25, 26, 27, 28, 29};
  cache.add(prompt, other);
  EXPECT_EQ(cache.tokens(), 20u);
  cache.draft(prompt, 8, 0.6, out, n);
  EXPECT_EQ(out, (std::vector<int32_t>{10}));
  // Past the bound the oldest reply goes: its continuations are no longer drafted.
  const std::vector<int32_t> third = {30, 31, 32, 33, 34};
  cache.add(std::vector<int32_t>{60}, third);
  EXPECT_EQ(cache.tokens(), 15u);
  cache.draft(std::vector<int32_t>{9, 10}, 4, 0.1, out, n);
  EXPECT_EQ(out, (std::vector<int32_t>{21, 22, 23, 24}));
  cache.draft(std::vector<int32_t>{12, 13}, 4, 0.1, out, n);
  EXPECT_TRUE(out.empty());
  // Every reply replaced: only the last one's contexts are counted (no stale entry left behind).
  const std::vector<int32_t> big(20, 7);
  cache.add(std::vector<int32_t>{}, big);
  EXPECT_EQ(cache.tokens(), 20u);
  SuffixCounts only(4);
  only.count(big, 0, +1);
  EXPECT_EQ(cache.contexts(), only.contexts());
}

// A sequence's suffix drafter takes the shared replies' draft where it promises more than its own.
TEST(SuffixDrafter, DraftsFromTheSharedRepliesWhenItsOwnHistoryHasNothing) {
  SuffixCache cache(8, 1000);
  const std::vector<int32_t> prompt = {3, 4, 5, 6};
  cache.add(prompt, std::vector<int32_t>{40, 41, 42, 43, 44});
  SuffixDrafter alone(8, 0.1), shared(8, 0.1, &cache);
  std::vector<int32_t> out;
  EXPECT_EQ(alone.draft(prompt, 4, out), 0);
  EXPECT_TRUE(out.empty());
  EXPECT_GT(shared.draft(prompt, 4, out), 0);
  EXPECT_EQ(out, (std::vector<int32_t>{40, 41, 42, 43}));
  // Its own history's certain loop is kept over a shared draft that promises less.
  const std::vector<int32_t> loop = {3, 4, 5, 6, 9, 3, 4, 5, 6, 9, 3, 4, 5, 6};
  EXPECT_GT(shared.draft(loop, 4, out), 0);
  EXPECT_EQ(out, (std::vector<int32_t>{9, 3, 4, 5}));
}

TEST(SpeculativeGreedy, SuffixDrafterSameTokens) {
  Tiny& t = tiny();
  for (const std::string kv : {"fp32", "int4 r32", "int8 g16 r0 sink4 w48"})
    expect_same_greedy(*t.model, t.tok, kv_options(kv), light_or(160, 48), "suffix " + kv, 8, SpecType::Suffix);
}

// A model whose layers slide (and one whose last layer reads another's K/V: YOCO).
void write_tiny_variant(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit,
                        const std::vector<int>& drop_kv) {
  nlohmann::json j = test::read_json(test::repo_model("kjv-tiny") / "config.json");
  edit(j);
  std::ofstream(dir / "config.json") << j.dump(2);
  std::vector<test::RawTensor> kept;
  for (auto& r : test::read_raw(test::repo_model("kjv-tiny") / "model.safetensors")) {
    bool dropped = false;
    for (int l : drop_kv)
      for (const char* w : {".self_attn.k_proj.weight", ".self_attn.v_proj.weight"})
        dropped = dropped || r.name == "model.layers." + std::to_string(l) + w;
    if (!dropped) kept.push_back(std::move(r));
  }
  test::write_safetensors(dir / "model.safetensors", kept);
}

TEST(SpeculativeGreedy, SameTokensWithSlidingLayersAndYoco) {
  Tiny& t = tiny();
  test::TempDir swa, yoco;
  write_tiny_variant(swa.path, [](nlohmann::json& j) {
    j["architectures"] = {"MistralForCausalLM"};
    j["model_type"] = "mistral";
    j["sliding_window"] = 24;
  }, {});
  write_tiny_variant(yoco.path, [](nlohmann::json& j) {
    j["architectures"] = {"YocoLlamaForCausalLM"};
    j["model_type"] = "yoco_llama";
    j["layer_types"] = {"sliding_attention", "sliding_attention", "full_attention", "full_attention"};
    j["sliding_window"] = 16;
    j["num_kv_shared_layers"] = 1;
  }, {3});
  const auto m_swa = Model::load(swa.path), m_yoco = Model::load(yoco.path);
  ASSERT_TRUE(m_swa->kv_shape().any_window());
  ASSERT_TRUE(m_yoco->kv_shape().any_shared());
  for (const std::string kv : {"fp32", "int4 g16 r16", "fp32 sink4 w20"}) {
    expect_same_greedy(*m_swa, t.tok, kv_options(kv), light_or(160, 48), "sliding " + kv);
    expect_same_greedy(*m_yoco, t.tok, kv_options(kv), light_or(160, 48), "yoco " + kv);
  }
}

// The newer architectures' reference models (QK-norm, MoE routing, Gemma 3's local layers and two
// RoPE bases, Phi-3's partial rotary, SmolLM3's NoPE layers): verification and rewind are exact there
// too, in full precision, under KIVI and under StreamingLLM.
TEST(SpeculativeGreedy, SameTokensOnTheNewerArchitectures) {
  for (const std::string name : {"qwen3-tiny", "qwen3moe-tiny", "gemma3-tiny", "phi3-tiny", "smollm3-tiny"}) {
    const fs::path dir = test::repo_dir() / "tests" / "data" / "models" / name;
    ASSERT_TRUE(fs::exists(dir / "config.json")) << dir;
    const auto model = Model::load(dir);
    const Tokenizer tok = Tokenizer::load(dir);
    for (const std::string kv : {"fp32", "int4 r32", "fp32 sink4 w48"})
      expect_same_greedy(*model, tok, kv_options(kv), light_or(96, 48), name + " " + kv);
  }
}

// llama.cpp's block formats: a verification's rows take the many-rows kernels while a plain step
// takes one row, and the two must give a row the same bits (kernels/ggml.h).
TEST(SpeculativeGreedy, SameTokensOnGgufBlockFormats) {
  struct File {
    fs::path gguf, tokenizer;
  };
  std::vector<File> files = {{test::repo_dir() / "tests" / "data" / "gguf" / "kjv-tiny-Q8_0.gguf", test::repo_model("kjv-tiny")}};
  const fs::path shared = test::shared_dir() / "models" / "gguf";
  if (fs::exists(shared / "kjv-tiny-Q4_0.gguf")) files.push_back({shared / "kjv-tiny-Q4_0.gguf", test::repo_model("kjv-tiny")});
  if (fs::exists(shared / "kjv-small-Q4_K_M.gguf"))
    files.push_back({shared / "kjv-small-Q4_K_M.gguf", test::shared_model("kjv-small")});
  for (const File& f : files) {
    const auto model = Model::load(f.gguf);
    const Tokenizer tok = Tokenizer::load(f.tokenizer);
    for (const std::string kv : {"fp32", "int4 r32"})
      expect_same_greedy(*model, tok, kv_options(kv), light_or(128, 48), f.gguf.filename().string() + " " + kv, 16);
  }
  if (files.size() < 3) GTEST_SKIP() << "Q4_0 and Q4_K_M files are in ../shared/models/gguf; ran Q8_0 only";
}

// MLX affine 8, 6 and 4 bits: matrices repacked in 16-row groups take one product for every number of
// rows (kernels/affine.h), so a verification of 17 rows gives each row a plain step's bits; the
// file's layout keeps verifications within its small-T product (draft 7: 8 rows).
TEST(SpeculativeGreedy, SameTokensOnMlxAffineFormats) {
  test::TempDir tmp;
  ThreadPool pool(2);
  const Tokenizer tok = Tokenizer::load(test::repo_model("kjv-tiny"));
  for (auto [bits, gs] : {std::pair{8, 64}, std::pair{6, 32}, std::pair{4, 32}}) {
    const fs::path dir = tmp.path / ("q" + std::to_string(bits));
    QuantizeOptions o;
    o.spec = {bits, gs};
    quantize_checkpoint(test::repo_model("kjv-tiny"), dir, o, pool);
    const auto packed = Model::load(dir);
    set_affine_pack_enabled(false);
    const auto plain = Model::load(dir);
    set_affine_pack_enabled(true);
    EXPECT_EQ(plain->affine_packed_matrices(), 0u);
    if (affine_pack_wanted()) {
      EXPECT_EQ(packed->affine_packed_matrices(), size_t(7 * packed->config().n_layers + 1)) << "with the LM head";
    }
    for (const std::string kv : {"fp32", "int4 r32"}) {
      const std::string what = "q" + std::to_string(bits) + " " + kv;
      expect_same_greedy(*packed, tok, kv_options(kv), light_or(96, 48), what + " packed", 16);
      expect_same_greedy(*plain, tok, kv_options(kv), light_or(96, 48), what + " file's layout", 7);
    }
  }
}

// Sequences on one pool sharing a prompt's blocks, speculating in turns: each the plain run's ids; the
// shared blocks are never written (the first sequence's text is unchanged by the second's rewinds);
// every block comes back.
TEST(SpeculativeGreedy, SharedPrefixAndSeveralSequencesLeakNothing) {
  Tiny& t = tiny();
  for (const std::string kv : {"fp32", "int4 r32"}) {
    SessionOptions so = kv_options(kv);
    ThreadPool pool(2);
    KVPool shared(t.model->kv_shape(), so.kv, 4);
    std::vector<int32_t> prompt = prompt_ids(t.tok);
    const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 20);
    for (int i = 0; i < 4; ++i) prompt.insert(prompt.end(), head.begin(), head.end());  // over 2 blocks
    const int n = light_or(120, 40);
    Output plain;
    {
      Session ref(*t.model, so, pool);
      plain = generate(ref, t.tok, prompt, gen_options(n), SpecOptions{});
    }
    {
      std::vector<std::unique_ptr<Session>> seqs;
      std::vector<std::unique_ptr<Generator>> gens;
      std::vector<std::unique_ptr<Speculator>> specs;
      std::vector<Generator::Step> last(3);
      for (int i = 0; i < 3; ++i) {
        seqs.push_back(std::make_unique<Session>(*t.model, so, pool, &shared));
        gens.push_back(std::make_unique<Generator>(t.tok, gen_options(n)));
        specs.push_back(std::make_unique<Speculator>(ngram(6 + i)));
        std::span<float> lg = seqs[size_t(i)]->feed(prompt);
        if (i > 0) {
          EXPECT_GT(seqs[size_t(i)]->reused_tokens(), 0) << kv;
        }
        last[size_t(i)] = gens[size_t(i)]->next(lg, seqs[size_t(i)]->history(), true);
      }
      EXPECT_GT(shared.shared_bytes(), 0u);
      std::vector<Generator::Step> steps;
      for (bool any = true; any;) {
        any = false;
        for (size_t i = 0; i < 3; ++i) {
          if (gens[i]->done()) continue;
          any = true;
          steps.clear();
          specs[i]->round(*seqs[i], *gens[i], last[i].id, steps);
          last[i] = steps.back();
        }
      }
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(gens[i]->tokens(), plain.ids) << kv << " sequence " << i;
        EXPECT_GT(specs[i]->stats().drafted, specs[i]->stats().accepted) << kv;
      }
      // A fresh sequence still finds the prompt's blocks as computed: its logits equal a private run's.
      Session late(*t.model, so, pool, &shared), priv(*t.model, so, pool);
      const std::span<float> a = late.feed(prompt);
      const std::vector<float> la(a.begin(), a.end());
      const std::span<float> b = priv.feed(prompt);
      EXPECT_GT(late.reused_tokens(), 0);
      EXPECT_EQ(argmax(la), argmax(b)) << kv;
    }
    EXPECT_EQ(shared.blocks_in_use(), 0u) << kv << ": a block was leaked";
  }
}

// The scripted model writes a given text after a prompt that quotes it: every draft is kept.
TEST(SpeculativeGreedy, ScriptedReplyAcceptsEveryDraft) {
  test::TempDir dir;
  const std::string text =
      "The verse reads: In the beginning God created the heaven and the earth. And the earth was without "
      "form, and void; and darkness was upon the face of the deep.";
  test::ScriptedModelSpec spec;
  spec.scripts = {{text, "", ""}};
  spec.prompt_tail = "\nAnswer:";
  test::write_scripted_model(spec, dir.path);
  const auto model = Model::load(dir.path);
  const Tokenizer tok = Tokenizer::load(dir.path);
  const std::vector<int32_t> prompt = tok.encode("Quote this: " + text + "\nAnswer:");
  ThreadPool pool(2);
  Session a(*model, kv_options("fp32"), pool), b(*model, kv_options("fp32"), pool);
  GeneratorOptions go = gen_options(400);
  go.ignore_eos = false;
  go.eos_ids = {1};
  const Output plain = generate(a, tok, prompt, go, SpecOptions{});
  // Every draft verified (whether a draft is verified under the adaptivity depends on this
  // machine's measured pass costs: SpecAdaptivity.* test those decisions).
  const Output fast = generate(b, tok, prompt, go, ngram(16, /*adaptive=*/false));
  Session c(*model, kv_options("fp32"), pool);
  const Output adaptive = generate(c, tok, prompt, go, ngram(16, /*adaptive=*/true));
  EXPECT_EQ(plain.ids, fast.ids);
  EXPECT_EQ(plain.ids, adaptive.ids);
  EXPECT_EQ(tok.decode(fast.ids), text);
  EXPECT_GT(fast.stats.drafted, 0);
  EXPECT_GE(fast.stats.tokens_per_verify(), 4.0);
  EXPECT_GE(fast.stats.acceptance(), 0.6) << fast.stats.accepted << " of " << fast.stats.drafted << ", "
                                          << fast.stats.verify_steps << " verifications, " << fast.stats.plain_steps
                                          << " plain steps";
}

// Sampling: with the same seed the text is the plain run's, token for token (the same draws from the
// same distributions), with penalties and logit_bias in the pipeline.
TEST(SpeculativeSampling, SameSeedSameTextWithPenaltiesAndBias) {
  Tiny& t = tiny();
  for (uint64_t seed : {1, 2, 3}) {
    GeneratorOptions go = gen_options(light_or(120, 40), 0.7f, seed);
    go.sampling.repeat_penalty = 1.1f;
    go.sampling.frequency_penalty = 0.2f;
    go.logit_bias = {{int32_t(t.tok.encode(" the").back()), -2.0f}};
    ThreadPool pool(2);
    Session a(*t.model, kv_options("fp32"), pool), b(*t.model, kv_options("fp32"), pool);
    const auto prompt = prompt_ids(t.tok);
    const Output plain = generate(a, t.tok, prompt, go, SpecOptions{});
    const Output spec = generate(b, t.tok, prompt, go, ngram(6));
    EXPECT_EQ(plain.ids, spec.ids) << seed;
    EXPECT_GT(spec.stats.drafted, 0) << seed;
  }
}

// Speculative sampling keeps the target's distribution. kjv-tiny with top-k 2 at temperature 1.5 (a
// vocabulary of two per position): the first three tokens (the first drawn from the prompt's logits,
// the next two from a verification's rows once drafts are offered) over many seeds, against their
// exact probabilities computed one token at a time; chi-square with 7 degrees of freedom.
TEST(SpeculativeSampling, ThreeTokensHaveTheTargetDistribution) {
  Tiny& t = tiny();
  ThreadPool pool(1);
  const std::vector<int32_t> prompt =
      t.tok.encode("And the LORD said unto Moses, saying, And the LORD said unto Moses, saying, And the LORD said unto");
  GeneratorOptions go = gen_options(3, 1.5f);
  go.sampling.top_k = 2;
  go.sampling.top_p = 1;
  go.sampling.min_p = 0;
  // The exact law: p(a) p(b | a) p(c | a b) over each position's two most likely tokens.
  auto top2 = [&](std::span<const int32_t> ids) {
    Session s(*t.model, kv_options("fp32"), pool);
    const std::span<float> lg = s.feed(ids);
    std::vector<std::pair<float, int32_t>> v;
    for (size_t i = 0; i < lg.size(); ++i) v.push_back({lg[i], int32_t(i)});
    std::partial_sort(v.begin(), v.begin() + 2, v.end(), [](auto x, auto y) { return x.first > y.first; });
    const double e = std::exp(double(v[1].first - v[0].first) / 1.5);
    return std::vector<std::pair<int32_t, double>>{{v[0].second, 1 / (1 + e)}, {v[1].second, e / (1 + e)}};
  };
  std::map<std::vector<int32_t>, double> law;
  for (auto [a, pa] : top2(prompt)) {
    std::vector<int32_t> ha = prompt;
    ha.push_back(a);
    for (auto [b, pb] : top2(ha)) {
      std::vector<int32_t> hb = ha;
      hb.push_back(b);
      for (auto [c, pc] : top2(hb)) law[{a, b, c}] = pa * pb * pc;
    }
  }
  ASSERT_EQ(law.size(), 8u);
  const int N = light_or(2000, 400);
  std::map<std::vector<int32_t>, int> count;
  int64_t drafted = 0, accepted = 0;
  for (int i = 0; i < N; ++i) {
    go.sampling.seed = uint64_t(i) + 1;
    Session s(*t.model, kv_options("fp32"), pool);
    const Output o = generate(s, t.tok, prompt, go, ngram(4));
    ++count[o.ids];
    drafted += o.stats.drafted;
    accepted += o.stats.accepted;
  }
  EXPECT_GT(drafted, N / 2) << "the rows verified drafts";
  EXPECT_GT(accepted, N / 10) << "drafts were kept";
  EXPECT_GT(drafted, accepted) << "drafts were rejected";
  // Cells expecting fewer than 5 draws are pooled into one (the chi-square approximation needs it).
  double chi2 = 0, rare_p = 0;
  int seen = 0, cells = 0, rare_n = 0;
  for (const auto& [ids, p] : law) {
    seen += count[ids];
    if (N * p < 5) {
      rare_p += p;
      rare_n += count[ids];
      continue;
    }
    chi2 += std::pow(count[ids] - N * p, 2) / (N * p);
    ++cells;
  }
  if (rare_p > 0) {
    chi2 += std::pow(rare_n - N * rare_p, 2) / (N * rare_p);
    ++cells;
  }
  EXPECT_EQ(seen, N) << "only the two most likely tokens are drawn";
  ASSERT_GE(cells, 3);
  const double q999[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};  // chi-square, p = 0.001
  EXPECT_LT(chi2, q999[cells - 1]) << "chi-square with " << cells - 1 << " degrees of freedom";
}

// The adaptivity's decisions from injected costs and acceptance (no timing): the costs are the CPU
// times of passes measured by a server on kjv-small's Q4_K_M GGUF (cache-resident: a further row
// costs over half a step) and shapes of the two extremes.
PassCosts costs_of(std::initializer_list<std::pair<int, double>> c) {
  PassCosts p;
  for (auto [t, ms] : c) p.set(t, ms * 1e-3);
  return p;
}
const PassCosts& q4_costs() {  // widths 1..8, ms
  static const PassCosts c = costs_of({{1, 1.27}, {2, 1.68}, {3, 2.41}, {4, 3.16}, {5, 3.90}, {6, 4.71}, {7, 5.08}, {8, 7.49}});
  return c;
}

TEST(SpecAdaptivity, DraftCountFromMeasuredCostsAndAcceptance) {
  // Gains (1 + a + ... + a^k) / (cost(k + 1) / cost(1)) at a = 0.92: 1.451, 1.458, 1.425, 1.388, ...
  EXPECT_EQ(best_draft_count(0.92, 7, 1, q4_costs(), 0.0), 2);
  EXPECT_EQ(best_draft_count(0.92, 1, 1, q4_costs(), 0.0), 1);
  EXPECT_EQ(best_draft_count(0.92, 7, 3, q4_costs(), 0.0), 3) << "at least --spec-draft-min";
  // At a = 0.3 one draft yields 1.3 tokens for 1.32 steps: speculation off.
  EXPECT_EQ(best_draft_count(0.3, 7, 1, q4_costs(), 0.0), 0);
  // Every row a full step: no acceptance below 1 pays.
  PassCosts full;
  for (int t = 1; t <= 17; ++t) full.set(t, 1e-3 * t);
  for (double a : {0.5, 0.9, 0.98}) EXPECT_EQ(best_draft_count(a, 16, 1, full, 0.0), 0) << a;
  // Memory-bound (a further row costs 5% of a step): the longest draft.
  PassCosts flat;
  for (int t = 1; t <= 9; ++t) flat.set(t, 1e-3 * (1 + 0.05 * (t - 1)));
  EXPECT_EQ(best_draft_count(0.9, 8, 1, flat, 0.0), 8);
  // Drafts that cost half a step each (a draft model): 3 (gains 1.226, 1.291, 1.298, 1.280).
  EXPECT_EQ(best_draft_count(0.9, 8, 1, flat, 0.5), 3);
}

TEST(SpecAdaptivity, SpeculatorChoosesFromItsInjectedMeasurements) {
  Speculator s(ngram(8, /*adaptive=*/true));
  s.costs() = q4_costs();
  s.set_acceptance(3, 0.92);
  s.set_acceptance(1, 0.3);
  EXPECT_EQ(s.choose(7, 3), 2);
  EXPECT_EQ(s.choose(7, 1), 0);
  Speculator forced(ngram(8, /*adaptive=*/false));
  forced.costs() = q4_costs();
  forced.set_acceptance(1, 0.3);
  EXPECT_EQ(forced.choose(7, 1), 7) << "--spec-fixed verifies every draft";
}

TEST(SpecAdaptivity, BatchTakesDraftsOnlyWhereTheyRaiseTheRate) {
  // One sequence on the Q4_K_M costs: its first two drafts (rate 2.766 tokens / 2.41 ms).
  std::vector<double> one;
  for (int j = 1; j <= 7; ++j) one.push_back(std::pow(0.92, j));
  EXPECT_EQ(best_batch_drafts(1, 1, one, q4_costs()), 2u);
  // Eight decoding sequences at a = 0.92 on the step costs a server measured there (ms per width):
  // a row costs 0.7 ms against the batch's 0.81 ms a token, no set of drafts beats the plain step by 3%.
  const PassCosts c8 = costs_of({{8, 6.512}, {9, 7.238}, {10, 8.003}, {11, 8.676}, {12, 9.410}, {13, 10.117},
                                 {14, 10.848}, {15, 11.768}, {16, 12.286}, {18, 13.756}});
  std::vector<double> eight;
  for (int j = 1; j <= 3; ++j)
    for (int s = 0; s < 8; ++s) eight.push_back(std::pow(0.92, j));
  EXPECT_EQ(best_batch_drafts(8, 8, eight, c8), 0u);
  // Compute-bound rows decline every draft; memory-bound ones take them all.
  PassCosts full, flat;
  for (int t = 1; t <= 40; ++t) {
    full.set(t, 1e-3 * t);
    flat.set(t, 1e-3 * (1 + 0.02 * (t - 1)));
  }
  EXPECT_EQ(best_batch_drafts(8, 8, eight, full), 0u);
  EXPECT_EQ(best_batch_drafts(8, 8, eight, flat), eight.size());
  EXPECT_EQ(best_batch_drafts(0, 8, eight, flat), 0u) << "nothing decoding";
}

TEST(SpecAdaptivity, PassCostsSkipTheFirstWidePassAndInterpolate) {
  PassCosts c;
  c.record(1, 5e-3);  // the first pass grows buffers
  EXPECT_FALSE(c.measured(1));
  c.record(1, 1e-3, 7);
  EXPECT_TRUE(c.measured(1));
  EXPECT_EQ(c.measured_at(1), 7u);
  EXPECT_DOUBLE_EQ(c.cost(1), 1e-3);
  c.record(1, 100e-3);  // one outlier moves the average at most to double
  EXPECT_NEAR(c.cost(1), 1e-3 + 0.15 * 1e-3, 1e-12);
  c.record(1, 0.55e-3);  // a lower one moves it half the way (CPU time errs upwards)
  EXPECT_NEAR(c.cost(1), (1.15e-3 + 0.575e-3) / 2, 1e-12);
  c.record(5, 3e-3);  // wider than any before: not counted
  EXPECT_FALSE(c.measured(5));
  c.record(5, 3e-3);
  EXPECT_NEAR(c.cost(3), c.cost(1) + (3e-3 - c.cost(1)) / 2, 1e-12) << "between measured widths";
  EXPECT_NEAR(c.cost(7), 3e-3 * 1.2, 1e-12) << "past the widest measured: a tenth of it a row";
}

TEST(Speculator, AdaptivityDeclinesDraftsThatAreRejected) {
  SpecOptions o = ngram(8, /*adaptive=*/true);
  Speculator s(o);
  // The prior (half of the drafts kept, a further row costing a tenth of a step) pays.
  EXPECT_GT(s.choose(8, 2), 0);
  SpecOptions forced = ngram(8, /*adaptive=*/false);
  EXPECT_EQ(Speculator(forced).choose(5, 0), 5);
  forced.draft_min = 6;
  EXPECT_EQ(Speculator(forced).choose(5, 0), 0);
}

// Where drafting never pays, a draft is still verified now and then (the text may change), but each
// probe that leaves it unprofitable doubles the wait for the next: 32, 64, 128 rounds with drafts on
// offer, so a long reply of prose pays for a few probes, not one every 32 tokens.
TEST(Speculator, ProbesThatDoNotPayComeLessOften) {
  Tiny& t = tiny();
  ThreadPool pool(2);
  Session s(*t.model, kv_options("fp32"), pool);
  Generator gen(t.tok, gen_options(400));
  Speculator spec(ngram(8, /*adaptive=*/true));
  // A verification of two or more rows costs a thousand one-token steps: no draft ever pays. (The
  // measured steps pull these down by at most half a pass, not far enough to matter.)
  for (int T = 1; T <= 9; ++T) spec.costs().set(T, T == 1 ? 1e-3 : 1e3);
  const auto prompt = prompt_ids(t.tok);
  Generator::Step step = gen.next(s.feed(prompt), s.history(), s.fits(1));
  std::vector<Generator::Step> steps;
  while (!gen.done()) {
    steps.clear();
    spec.round(s, gen, step.id, steps);
    ASSERT_FALSE(steps.empty());
    step = steps.back();
  }
  // kjv-tiny loops, so n-gram drafts are on offer at nearly every step: 400 tokens hold the probes
  // after 32, 32 + 64 and 32 + 64 + 128 such rounds (every 64th round is a plain step regardless),
  // where a fixed interval would probe about 12 times.
  EXPECT_GE(spec.stats().verify_steps, 2);
  EXPECT_LE(spec.stats().verify_steps, 4);
}

}  // namespace
}  // namespace ptllm

namespace ptllm {
namespace {

std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') v.push_back(nlohmann::json::parse(line));
  return v;
}

// sample and chat: the same ids with --spec-type ngram, the counters in --json and on the footer.
TEST(SpeculativeCli, SampleAndChatGiveTheSameTokens) {
  const std::string model = test::repo_model("kjv-tiny").string();
  const std::string sample = test::binary() + " sample " + model +
                             " -p 'And the LORD said unto Moses, and the LORD said' -n 120 --temperature 0 "
                             "--ignore-eos -t 2 --json";
  const auto off = test::run_command(sample);
  const auto on = test::run_command(sample + " --spec-type ngram --spec-draft-max 6 --spec-fixed");
  ASSERT_EQ(off.code, 0) << off.err;
  ASSERT_EQ(on.code, 0) << on.err;
  const auto a = nlohmann::json::parse(off.out), b = nlohmann::json::parse(on.out);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_TRUE(a["speculative"].is_null());
  EXPECT_EQ(b["speculative"]["type"], "ngram");
  EXPECT_EQ(b["speculative"]["adaptive"], false);
  EXPECT_GT(b["speculative"]["accepted"].get<int>(), 0);
  EXPECT_LE(b["speculative"]["accepted"].get<int>(), b["speculative"]["drafted"].get<int>());
  EXPECT_NE(on.err.find("speculation: ngram (fixed), drafted "), std::string::npos) << on.err;

  // chat: two turns through a template, the KV kept between them.
  test::TempDir dir;
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"})
    fs::copy_file(test::repo_model("kjv-tiny") / f, dir.path / f);
  nlohmann::json cfg = test::read_json(test::repo_model("kjv-tiny") / "tokenizer_config.json");
  cfg["chat_template"] =
      "{% for m in messages %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}And the LORD said{% endif %}";
  std::ofstream(dir.path / "tokenizer_config.json") << cfg.dump(2);
  std::ofstream(dir.path / "turns.txt") << "And the LORD spake unto Moses\nAnd Moses said unto the LORD\n";
  const std::string chat = test::binary() + " chat " + dir.path.string() + " -f " + (dir.path / "turns.txt").string() +
                           " --temperature 0 -n 60 -t 2 --json --no-history";
  const auto c_off = test::run_command(chat);
  const auto c_on = test::run_command(chat + " --spec-type ngram");
  ASSERT_EQ(c_off.code, 0) << c_off.err;
  ASSERT_EQ(c_on.code, 0) << c_on.err;
  const auto t_off = json_lines(c_off.out), t_on = json_lines(c_on.out);
  ASSERT_EQ(t_off.size(), 2u);
  ASSERT_EQ(t_on.size(), 2u);
  int64_t drafted = 0;
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(t_off[i]["tokens"], t_on[i]["tokens"]) << "turn " << i;
    EXPECT_EQ(t_off[i]["reused_tokens"], t_on[i]["reused_tokens"]) << "the reply's tokens were all fed";
    drafted += t_on[i]["speculative"]["drafted"].get<int64_t>();
  }
  EXPECT_GT(drafted, 0);

  // Refusals name the flag.
  const auto nc = test::run_command(test::binary() + " sample " + model + " -p x --spec-type ngram --no-cache");
  EXPECT_EQ(nc.code, 2);
  EXPECT_NE(nc.err.find("--spec-type ngram verifies drafts against the KV cache"), std::string::npos) << nc.err;
  const auto mm = test::run_command(test::binary() + " sample " + model + " -p x --spec-type ngram --spec-draft-min 9 --spec-draft-max 4");
  EXPECT_EQ(mm.code, 2);
  EXPECT_NE(mm.err.find("--spec-draft-min 9 is more than --spec-draft-max 4"), std::string::npos) << mm.err;
  const auto sc = test::run_command(test::binary() + " serve " + model + " --port 0 --spec-type ngram --spec-suffix-cache 100");
  EXPECT_EQ(sc.code, 2);
  EXPECT_NE(sc.err.find("--spec-suffix-cache: the shared reply counts are the suffix drafter's"), std::string::npos) << sc.err;
  const auto nb = test::run_command(test::binary() + " serve " + model + " --port 0 --spec-type ngram --no-spec-draft-batch");
  EXPECT_EQ(nb.code, 2);
  EXPECT_NE(nb.err.find("--no-spec-draft-batch: only a draft model's drafting is batched"), std::string::npos) << nb.err;
  const auto vc = test::run_command(test::binary() + " bench " + model + " --spec-verify-cost --spec-type ngram");
  EXPECT_EQ(vc.code, 2);
  EXPECT_NE(vc.err.find("--spec-verify-cost times verification passes alone"), std::string::npos) << vc.err;
}

// bench --spec-verify-cost: a pass of 1, ..., K + 1 rows each round; the one-row pass is the unit.
TEST(SpeculativeCli, BenchVerifyCostTimesEveryWidth) {
  const std::string model = test::repo_model("kjv-tiny").string();
  const auto r = test::run_command(test::binary() + " bench " + model +
                                   " --spec-verify-cost --spec-draft-max 3 -p 16 -r 2 -t 1 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["verify"].size(), 4u);
  for (int k = 0; k <= 3; ++k) {
    const auto& row = j["verify"][size_t(k)];
    EXPECT_EQ(row["k"], k);
    EXPECT_EQ(row["rows"], k + 1);
    EXPECT_GT(row["ms"].get<double>(), 0);
    EXPECT_GT(row["ratio"].get<double>(), 0);
  }
  EXPECT_DOUBLE_EQ(j["verify"][0]["ratio"].get<double>(), 1.0);
}

// Adaptivity: drafts of sampled prose at temperature 1.5 are mostly rejected; the adaptive sequence
// declines some of them, the fixed one keeps paying for them. Both give the same text. How many it
// declines depends on this machine's measured pass costs (a row that costs a tenth of a step pays
// at a = 0.3), so only the direction is checked here; SpecAdaptivity.* check the decisions
// themselves on injected costs.
TEST(SpeculativeAdaptivity, StopsVerifyingDraftsThatAreRejected) {
  Tiny& t = tiny();
  ThreadPool pool(2);
  const std::vector<int32_t> prompt = t.tok.encode("For wisdom is better than rubies; and all the things that may be desired");
  GeneratorOptions go = gen_options(light_or(300, 100), 1.5f, 9);
  go.sampling.top_k = 0;
  go.sampling.top_p = 1;
  go.sampling.min_p = 0;
  Session a(*t.model, kv_options("fp32"), pool), b(*t.model, kv_options("fp32"), pool);
  const Output fixed = generate(a, t.tok, prompt, go, ngram(8, /*adaptive=*/false));
  const Output adaptive = generate(b, t.tok, prompt, go, ngram(8, /*adaptive=*/true));
  EXPECT_EQ(fixed.ids, adaptive.ids);
  EXPECT_LT(fixed.stats.acceptance(), 0.3) << "the workload rejects drafts";
  EXPECT_GT(fixed.stats.verify_steps, 50);
  EXPECT_LT(adaptive.stats.verify_steps, fixed.stats.verify_steps)
      << adaptive.stats.verify_steps << " verifications against " << fixed.stats.verify_steps;
  EXPECT_GT(adaptive.stats.plain_steps, fixed.stats.plain_steps);
}

}  // namespace
}  // namespace ptllm
