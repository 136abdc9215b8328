// The draft-model drafter: greedy output equal to decoding without speculation (a draft model that
// agrees, one that mostly does not), in sample's loop and in the scheduler; its own cache follows the
// target's history by rewinding to the shared prefix, not by feeding it again; a draft model of
// another vocabulary is refused naming both.
#include <gtest/gtest.h>

#include <fstream>
#include <future>

#include "engine/drafter_model.h"
#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "engine/speculative.h"
#include "scripted_model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;

struct Models {
  std::unique_ptr<Model> tiny = Model::load(test::repo_model("kjv-tiny"));
  Tokenizer tok = Tokenizer::load(test::repo_model("kjv-tiny"));
  test::TempDir dir;
  std::unique_ptr<Model> scripted;  // same tokenizer, writes a fixed text: its drafts are mostly rejected
  Models() {
    test::ScriptedModelSpec spec;
    spec.scripts = {{"and the children of Israel went up out of the land of Egypt unto the mount", "", ""}};
    spec.prompt_tail = "\nAnswer:";
    test::write_scripted_model(spec, dir.path);
    scripted = Model::load(dir.path);
  }
};
Models& models() {
  static Models m;
  return m;
}

std::vector<int32_t> prompt_ids(const Tokenizer& tok) {
  return tok.encode("And the LORD said unto Moses, Speak unto the children of Israel, and say unto them,");
}

struct Output {
  std::vector<int32_t> ids;
  SpecStats stats;
};

Output generate(const Model& target, const Tokenizer& tok, const SessionOptions& so, int n, const SpecOptions& spec_o) {
  ThreadPool pool(2);
  Session s(target, so, pool);
  GeneratorOptions go;
  go.sampling.temperature = 0;
  go.ignore_eos = true;
  go.max_tokens = n;
  Generator gen(tok, go);
  SpecOptions o = spec_o;
  o.draft_pool = &pool;
  Speculator spec(o);
  const auto prompt = prompt_ids(tok);
  Generator::Step step = gen.next(s.feed(prompt), s.history(), s.fits(1));
  std::vector<Generator::Step> steps;
  while (!gen.done()) {
    steps.clear();
    spec.round(s, gen, step.id, steps);
    if (steps.empty()) break;
    step = steps.back();
  }
  return {gen.tokens(), spec.stats()};
}

SpecOptions draft_options(const Model& draft, bool adaptive = false) {
  SpecOptions o;
  o.type = SpecType::Draft;
  o.draft_model = &draft;
  o.draft_ctx = 1024;
  o.draft_max = 6;
  o.adaptive = adaptive;
  return o;
}

SessionOptions kv(const std::string& text) {
  SessionOptions o;
  KVCacheConfig base;
  base.ctx_size = 1024;
  base.preallocate = false;
  o.kv = text.empty() ? base : parse_kv_config(text, base);
  return o;
}

TEST(DraftModel, GreedySameTokensWithAgreeingAndDisagreeingDrafts) {
  Models& m = models();
  const int n = test::light_or(96, 40);
  for (const std::string kvs : {"fp32", "int4 r32"}) {
    const Output plain = generate(*m.tiny, m.tok, kv(kvs), n, SpecOptions{});
    // The target as its own draft model: its drafts are its own greedy tokens, nearly all kept.
    const Output self = generate(*m.tiny, m.tok, kv(kvs), n, draft_options(*m.tiny));
    EXPECT_EQ(self.ids, plain.ids) << kvs;
    EXPECT_GT(self.stats.drafted, 0) << kvs;
    EXPECT_GE(self.stats.acceptance(), 0.9) << kvs << ": " << self.stats.accepted << " of " << self.stats.drafted;
    // A draft model that writes something else: drafts rejected, the draft cache rewound each time.
    const Output other = generate(*m.tiny, m.tok, kv(kvs), n, draft_options(*m.scripted));
    EXPECT_EQ(other.ids, plain.ids) << kvs;
    EXPECT_GT(other.stats.drafted, other.stats.accepted) << kvs;
    // Adaptive: whatever it decides, the same text.
    const Output adaptive = generate(*m.tiny, m.tok, kv(kvs), n, draft_options(*m.scripted, true));
    EXPECT_EQ(adaptive.ids, plain.ids) << kvs;
  }
}

// The drafter's cache follows the history it is given: kept drafts stay, the rest is rewound, and only
// what the target added since is fed; its drafts equal a fresh drafter's on the same history.
TEST(DraftModel, DraftCacheRewindsToTheSharedPrefix) {
  Models& m = models();
  ThreadPool pool(2);
  ModelDrafter d(*m.tiny, pool, 512);
  std::vector<int32_t> h = prompt_ids(m.tok);
  const int64_t L = int64_t(h.size());
  std::vector<int32_t> out;
  d.draft(h, 4, out);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(d.fed_tokens(), L + 3);  // the prompt, then a step for each draft but the last
  // The target kept two drafts and wrote its own token after them.
  h.insert(h.end(), out.begin(), out.begin() + 2);
  const int32_t own = out[2] == 5 ? 6 : 5;
  h.push_back(own);
  std::vector<int32_t> again;
  d.draft(h, 4, again);
  EXPECT_EQ(d.fed_tokens(), L + 3 + 1 + 3) << "the history was fed again instead of rewound";
  ModelDrafter fresh(*m.tiny, pool, 512);
  std::vector<int32_t> ref;
  fresh.draft(h, 4, ref);
  EXPECT_EQ(again, ref);
  // A history that ends inside what the drafter holds (every draft rejected): one token fed again.
  h.resize(size_t(L + 1));
  const int64_t before = d.fed_tokens();
  d.draft(h, 1, again);
  EXPECT_EQ(d.fed_tokens(), before + 1);
  fresh.draft(h, 1, ref);
  EXPECT_EQ(again, ref);
  // Drafts that would not fit the draft cache: none.
  EXPECT_EQ((d.draft(std::vector<int32_t>(510, 5), 4, again), again.size()), 0u);
}

TEST(DraftModel, SchedulerGreedySameTokens) {
  Runtime rt({test::repo_model("kjv-tiny"), 2, true});
  Models& m = models();
  auto run = [&](SpecOptions spec) {
    SchedulerConfig c;
    c.session.kv.ctx_size = 512;
    c.parallel = 3;
    c.prefill_chunk = 64;
    c.eos_ids = {1};
    spec.draft_pool = &rt.pool();
    c.spec = spec;
    Scheduler sch(rt, c);
    std::vector<std::future<RequestResult>> futs;
    for (const char* text : {"And the LORD said unto Moses, Speak", "In the beginning God", "And it came to pass"}) {
      auto done = std::make_shared<std::promise<RequestResult>>();
      futs.push_back(done->get_future());
      Request r;
      r.prompt = rt.tokenizer().encode(text);
      r.params.sampling.temperature = 0;
      r.params.max_tokens = 40;
      r.params.ignore_eos = true;
      r.on_done = [done](const RequestResult& res) { done->set_value(res); };
      sch.submit(std::move(r));
    }
    std::vector<RequestResult> out;
    for (auto& f : futs) out.push_back(f.get());
    EXPECT_EQ(sch.stats().blocks_used, 0u);
    return out;
  };
  const auto plain = run(SpecOptions{});
  const auto self = run(draft_options(rt.model()));
  const auto other = run(draft_options(*m.scripted));
  int64_t kept = 0, rejected = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(self[i].tokens, plain[i].tokens) << i;
    EXPECT_EQ(other[i].tokens, plain[i].tokens) << i;
    kept += self[i].draft_accepted;
    rejected += other[i].draft_n - other[i].draft_accepted;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(rejected, 0);
}

// Several sequences of different lengths drafting with a draft model in one server: the draft model's
// steps run as one batched pass per draft position, the replies are the same token for token as
// drafting one sequence at a time and as no speculation; a reply that ends inside a verification and
// one cancelled mid-generation leave no draft-model KV behind.
TEST(DraftModel, SchedulerBatchedDraftingSameTokens) {
  Runtime rt({test::repo_model("kjv-tiny"), 2, true});
  Models& m = models();
  struct Run {
    std::vector<RequestResult> out;
    uint64_t draft_passes = 0;
    size_t peak_draft_blocks = 0;
  };
  const std::vector<std::pair<std::string, int>> requests = {
      {"And the LORD said unto Moses, Speak unto the children of Israel, and say unto them,", 45},
      {"In the beginning God", 23},
      {"And it came to pass", 61},
      {"Blessed are the poor in spirit: for theirs is the kingdom of heaven. Blessed are they", 37},
      {"And God said", 200},  // cancelled after 12 tokens
  };
  const size_t cancelled = 4;
  auto run = [&](SpecOptions spec, bool batch, bool cancel = true) {
    SchedulerConfig c;
    c.session.kv.ctx_size = 512;
    c.parallel = int(requests.size()) + 1;  // and the gate below
    c.prefill_chunk = 32;  // the longer prompts prefill over several steps while others decode
    c.eos_ids = {1};
    spec.draft_pool = &rt.pool();
    c.spec = spec;
    c.spec_draft_batch = batch;
    Scheduler sch(rt, c);
    Run r;
    // A one-token request first, whose on_done holds the scheduler until the others are all queued:
    // they are admitted in one step in every run, so the count of draft passes does not depend on
    // how fast this thread submits.
    std::promise<void> queued;
    std::shared_future<void> all_queued = queued.get_future().share();
    Request gate;
    gate.prompt = rt.tokenizer().encode("Amen");
    gate.params.sampling.temperature = 0;
    gate.params.max_tokens = 1;
    gate.on_done = [all_queued](const RequestResult&) { all_queued.wait(); };
    sch.submit(std::move(gate));
    std::vector<std::future<RequestResult>> futs;
    for (size_t i = 0; i < requests.size(); ++i) {
      auto done = std::make_shared<std::promise<RequestResult>>();
      futs.push_back(done->get_future());
      Request q;
      q.prompt = rt.tokenizer().encode(requests[i].first);
      q.params.sampling.temperature = 0;
      q.params.max_tokens = requests[i].second;
      q.params.ignore_eos = true;
      q.on_done = [done](const RequestResult& res) { done->set_value(res); };
      if (i == cancelled && cancel) {
        auto flag = std::make_shared<std::atomic<bool>>(false);
        auto n = std::make_shared<int>(0);
        q.cancel = flag;
        q.on_text = [flag, n](std::string_view) {
          if (++*n >= 12) flag->store(true);
        };
      }
      sch.submit(std::move(q));
    }
    queued.set_value();
    for (auto& f : futs) {
      while (f.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready)
        r.peak_draft_blocks = std::max(r.peak_draft_blocks, sch.stats().spec_draft_blocks);
      r.out.push_back(f.get());
    }
    const SchedulerStats st = sch.stats();
    EXPECT_EQ(st.blocks_used, 0u);
    EXPECT_EQ(st.spec_draft_blocks, 0u) << "draft-model KV held after every request ended";
    r.draft_passes = st.spec_draft_passes;
    return r;
  };
  const Run plain = run(SpecOptions{}, true, false);
  for (const Model* draft : {&rt.model(), static_cast<const Model*>(m.scripted.get())}) {
    const Run batched = run(draft_options(*draft), true);
    const Run single = run(draft_options(*draft), false);
    int64_t drafted = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (i == cancelled) {
        for (const Run* r : {&batched, &single}) {
          const RequestResult& x = r->out[i];
          EXPECT_EQ(x.reason, FinishReason::Cancelled);
          EXPECT_GE(x.tokens.size(), 12u);
          ASSERT_LE(x.tokens.size(), plain.out[i].tokens.size());
          EXPECT_TRUE(std::equal(x.tokens.begin(), x.tokens.end(), plain.out[i].tokens.begin())) << "cancelled reply";
        }
        continue;
      }
      EXPECT_EQ(plain.out[i].tokens.size(), size_t(requests[i].second)) << i;
      EXPECT_EQ(batched.out[i].tokens, plain.out[i].tokens) << i;
      EXPECT_EQ(single.out[i].tokens, plain.out[i].tokens) << i;
      EXPECT_EQ(batched.out[i].text, plain.out[i].text) << i;
      drafted += batched.out[i].draft_n;
    }
    EXPECT_GT(drafted, 0);
    EXPECT_GT(batched.peak_draft_blocks, 0u);
    // One pass per draft position for all the sequences, not one per sequence.
    EXPECT_GT(batched.draft_passes, 0u);
    EXPECT_LT(double(batched.draft_passes), 0.6 * double(single.draft_passes))
        << batched.draft_passes << " batched passes against " << single.draft_passes;
  }
}

// A rewound draft cache gives its blocks back: it holds what a fresh drafter fed the same history
// holds.
TEST(DraftModel, DraftCacheRewindGivesBlocksBack) {
  Models& m = models();
  ThreadPool pool(2);
  ModelDrafter d(*m.tiny, pool, 512);
  std::vector<int32_t> h = prompt_ids(m.tok), out;
  const size_t L = h.size();
  for (int i = 0; i < 12; ++i) {  // every draft kept: the history grows by 8 a round
    d.draft(h, 8, out);
    h.insert(h.end(), out.begin(), out.end());
  }
  const size_t grown = d.kv_blocks();
  h.resize(L + 1);  // the target rejected everything after the prompt's next token
  d.draft(h, 2, out);
  ModelDrafter fresh(*m.tiny, pool, 512);
  std::vector<int32_t> ref;
  fresh.draft(h, 2, ref);
  EXPECT_EQ(out, ref);
  EXPECT_EQ(d.kv_blocks(), fresh.kv_blocks());
  EXPECT_LT(d.kv_blocks(), grown);
}

// A draft model whose tokenizer maps two ids the other way round: refused, naming both models.
TEST(DraftModel, AnotherVocabularyIsRefusedNamingBoth) {
  test::TempDir dir;
  const fs::path src = test::repo_model("kjv-tiny");
  for (const auto& e : fs::directory_iterator(src)) fs::copy(e.path(), dir.path / e.path().filename());
  nlohmann::json tj = test::read_json(dir.path / "tokenizer.json");
  auto& vocab = tj["model"]["vocab"];
  std::string a, b;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (it.value() == 100) a = it.key();
    if (it.value() == 101) b = it.key();
  }
  ASSERT_FALSE(a.empty() || b.empty());
  vocab[a] = 101;
  vocab[b] = 100;
  std::ofstream(dir.path / "tokenizer.json") << tj.dump();
  const auto r = test::run_command(test::binary() + " sample " + src.string() + " -p 'And' -n 2 --model-draft " +
                                   dir.path.string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--model-draft " + dir.path.string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(src.string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tokenizer"), std::string::npos) << r.err;
  // The same model as its own draft model is taken; the footer reports the drafts.
  const auto ok = test::run_command(test::binary() + " sample " + src.string() +
                                    " -p 'And the LORD said' -n 24 --temperature 0 --json --model-draft " + src.string());
  ASSERT_EQ(ok.code, 0) << ok.err;
  const nlohmann::json j = nlohmann::json::parse(ok.out);
  EXPECT_EQ(j["speculative"]["type"], "draft");
  // --spec-type draft alone is a usage error naming the missing flag.
  const auto bad = test::run_command(test::binary() + " sample " + src.string() + " -p x -n 2 --spec-type draft 2>&1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--model-draft"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace ptllm

namespace ptllm {
namespace {

// bench --spec-type: both decodes in one run, the same tokens, the drafts counted; refused with --parallel.
TEST(SpecBench, DecodeWithAndWithoutSpeculationInOneRun) {
  const std::string m = test::repo_model("kjv-tiny").string();
  for (const std::string& flags : {std::string("--spec-type ngram"), "--model-draft " + m}) {
    const auto r = test::run_command(test::binary() + " bench " + m + " -p 8 -n 48 -r 2 -t 2 --json " + flags);
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["same_tokens"], true) << flags;
    EXPECT_GT(j["decode_tok_s"].get<double>(), 0) << flags;
    EXPECT_GT(j["spec_decode_tok_s"].get<double>(), 0) << flags;
    EXPECT_GT(j["speculative"]["verify_steps"].get<int64_t>() + j["speculative"]["plain_steps"].get<int64_t>(), 0) << flags;
    EXPECT_LE(j["speculative"]["accepted"].get<int64_t>(), j["speculative"]["drafted"].get<int64_t>()) << flags;
  }
  const auto bad = test::run_command(test::binary() + " bench " + m + " --parallel 2 --spec-type ngram");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--spec-type with --parallel"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace ptllm
