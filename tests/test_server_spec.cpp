// Speculative decoding in the scheduler and the server: several concurrent sequences drafting, their
// drafts verified in the batched pass beside the others' rows, give the text of speculation off
// (greedy, and sampling with a seed); the pool holds no block once they end; the responses carry
// llama-server's timings.draft_n / draft_n_accepted, /metrics the counters; a per-request field the
// server cannot honour is refused by name.
#include <httplib.h>
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "engine/drafter_suffix.h"
#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "scripted_model.h"
#include "server/http_server.h"
#include "server_thread.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

using server::json;

class SpecSchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { rt_ = new Runtime({test::repo_model("kjv-tiny"), 2, true}); }
  static void TearDownTestSuite() {
    delete rt_;
    rt_ = nullptr;
  }
  static SchedulerConfig config(SpecType type, bool adaptive = false, int parallel = 4) {
    SchedulerConfig c;
    c.session.kv.ctx_size = 512;
    c.parallel = parallel;
    c.prefill_chunk = 64;
    c.eos_ids = {1};
    c.spec.type = type;
    c.spec.draft_max = 8;
    c.spec.adaptive = adaptive;
    return c;
  }
  // Copy-heavy prompts (a passage, then its start again) of different lengths.
  static std::vector<std::vector<int32_t>> prompts() {
    const Tokenizer& tok = rt_->tokenizer();
    std::vector<std::vector<int32_t>> out;
    for (const char* text : {"And the LORD said unto Moses, Speak unto the children of Israel",
                             "In the beginning God created the heaven and the earth",
                             "And God said, Let there be light: and there was light",
                             "The LORD is my shepherd; I shall not want"}) {
      std::vector<int32_t> p = tok.encode(text);
      const std::vector<int32_t> again = tok.encode(std::string(text).substr(0, 20), {.add_special = false});
      p.insert(p.end(), again.begin(), again.end());
      out.push_back(std::move(p));
    }
    return out;
  }
  // Every prompt submitted at once; the results in the prompts' order.
  static std::vector<RequestResult> run_all(Scheduler& sch, const std::vector<std::vector<int32_t>>& ps, int n,
                                            float temperature = 0, int draft_max = -1) {
    std::vector<std::future<RequestResult>> futs;
    for (size_t i = 0; i < ps.size(); ++i) {
      auto done = std::make_shared<std::promise<RequestResult>>();
      futs.push_back(done->get_future());
      Request r;
      r.prompt = ps[i];
      r.params.sampling.temperature = temperature;
      r.params.sampling.seed = 100 + i;
      r.params.max_tokens = n;
      r.params.ignore_eos = true;
      r.params.spec_draft_max = draft_max;
      r.on_done = [done](const RequestResult& res) { done->set_value(res); };
      sch.submit(std::move(r));
    }
    std::vector<RequestResult> out;
    for (auto& f : futs) {
      // A bound so that a bug fails the test instead of hanging it (not a timing assertion).
      if (f.wait_for(std::chrono::minutes(5)) != std::future_status::ready) {
        ADD_FAILURE() << "request did not finish";
        out.emplace_back();
        continue;
      }
      out.push_back(f.get());
    }
    return out;
  }
  static inline Runtime* rt_ = nullptr;
};

TEST_F(SpecSchedulerTest, ConcurrentGreedyAndSeededSamplingEqualSpeculationOff) {
  const auto ps = prompts();
  const int n = test::kLightTests ? 48 : 120;
  for (const float temperature : {0.0f, 0.8f}) {
    std::vector<RequestResult> off;
    {
      Scheduler sch(*rt_, config(SpecType::None));
      off = run_all(sch, ps, n, temperature);
      EXPECT_EQ(sch.stats().spec_drafted, 0u);
    }
    for (const SpecType type : {SpecType::Ngram, SpecType::Suffix}) {
      for (const bool adaptive : {false, true}) {
        const std::string what = std::string(spec_type_name(type)) + (adaptive ? " adaptive" : " fixed") +
                                 " T=" + std::to_string(temperature);
        Scheduler sch(*rt_, config(type, adaptive));
        const std::vector<RequestResult> on = run_all(sch, ps, n, temperature);
        int64_t drafted = 0, accepted = 0;
        for (size_t i = 0; i < ps.size(); ++i) {
          EXPECT_EQ(on[i].reason, FinishReason::Length) << what << " " << on[i].error;
          EXPECT_EQ(on[i].tokens, off[i].tokens) << what << ", sequence " << i;
          EXPECT_EQ(on[i].text, off[i].text) << what << ", sequence " << i;
          EXPECT_EQ(on[i].completion_tokens, n) << what;
          EXPECT_TRUE(on[i].speculative);
          EXPECT_LE(on[i].draft_accepted, on[i].draft_n);
          drafted += on[i].draft_n;
          accepted += on[i].draft_accepted;
        }
        const SchedulerStats st = sch.stats();
        EXPECT_EQ(st.spec_drafted, uint64_t(drafted)) << what;
        EXPECT_EQ(st.spec_accepted, uint64_t(accepted)) << what;
        EXPECT_EQ(st.generated_tokens, uint64_t(n) * ps.size()) << what;
        if (!adaptive) {
          // Every draft offered is verified: kjv-tiny loops on these prompts, so drafts are kept, and
          // some are rejected (rewound in the pool).
          EXPECT_GT(accepted, 0) << what;
          EXPECT_GT(drafted, accepted) << what;
        }
        EXPECT_EQ(st.blocks_used, 0u) << what << ": a block was leaked";
        EXPECT_EQ(sch.pool().blocks_in_use(), 0u) << what;
      }
    }
  }
}

// A request's speculative.n_max 0 turns it off for that request alone.
TEST_F(SpecSchedulerTest, PerRequestDraftMaxZeroDraftsNothing) {
  Scheduler sch(*rt_, config(SpecType::Ngram));
  const std::vector<RequestResult> r = run_all(sch, prompts(), 32, 0, /*draft_max=*/0);
  for (const RequestResult& x : r) {
    EXPECT_FALSE(x.speculative);
    EXPECT_EQ(x.draft_n, 0);
  }
  EXPECT_EQ(sch.stats().spec_drafted, 0u);
}

// A wide batch: the measured pass times decide; whatever they decide, the text is the same and no
// block stays taken.
TEST_F(SpecSchedulerTest, WideBatchAdaptiveSameText) {
  std::vector<std::vector<int32_t>> ps;
  for (int copy = 0; copy < 3; ++copy)
    for (const auto& p : prompts()) ps.push_back(p);
  std::vector<RequestResult> off, on;
  {
    Scheduler sch(*rt_, config(SpecType::None, false, 12));
    off = run_all(sch, ps, 40);
  }
  Scheduler sch(*rt_, config(SpecType::Ngram, true, 12));
  on = run_all(sch, ps, 40);
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(on[i].tokens, off[i].tokens) << i;
  EXPECT_EQ(sch.stats().blocks_used, 0u);
}

// The suffix drafter's counts of the server's replies: a request repeating an earlier request's reply
// (a scripted model writing a text that its prompt does not quote, so a sequence's own history drafts
// little of it) gets that reply drafted and kept from its first token; without the shared counts it
// drafts as little as the first request did. Greedy text unchanged, no block left in use.
TEST(SpecSuffixCache, SecondRequestRepeatingAReplyHasItsDraftsKept) {
  test::TempDir dir;
  const std::string text =
      "Moses went up from the plains of Moab unto the mountain of Nebo, to the top of Pisgah, that is over "
      "against Jericho. And the LORD shewed him all the land of Gilead, unto Dan.";
  test::ScriptedModelSpec spec;
  spec.scripts = {{text, "", ""}};
  spec.prompt_tail = "\nAnswer:";
  test::write_scripted_model(spec, dir.path);
  Runtime rt({dir.path, 2, true});
  const std::vector<int32_t> prompt = rt.tokenizer().encode("Where did Moses die?\nAnswer:");
  const auto ask = [&](Scheduler& sch) {
    auto done = std::make_shared<std::promise<RequestResult>>();
    auto fut = done->get_future();
    Request r;
    r.prompt = prompt;
    r.params.sampling.temperature = 0;
    r.params.max_tokens = 200;
    r.on_done = [done](const RequestResult& res) { done->set_value(res); };
    sch.submit(std::move(r));
    // A bound so that a bug fails the test instead of hanging it (not a timing assertion).
    EXPECT_EQ(fut.wait_for(std::chrono::minutes(5)), std::future_status::ready);
    return fut.get();
  };
  for (const size_t cache : {size_t(0), size_t(4096)}) {
    SchedulerConfig c;
    c.session.kv.ctx_size = 512;
    c.parallel = 2;
    c.prefill_chunk = 64;
    c.eos_ids = {1};
    c.spec.type = SpecType::Suffix;
    c.spec.draft_max = 8;
    c.spec.adaptive = false;  // every draft offered is verified: the counts, not the timings, decide
    c.spec_suffix_cache = cache;
    Scheduler sch(rt, c);
    const RequestResult first = ask(sch), second = ask(sch);
    const std::string what = "shared cache of " + std::to_string(cache) + " tokens";
    EXPECT_EQ(first.text, text) << what;
    EXPECT_EQ(second.text, text) << what;
    EXPECT_EQ(second.tokens, first.tokens) << what;
    const int64_t n = int64_t(first.tokens.size());
    if (cache == 0) {
      // Nothing shared: the second request drafts exactly what the first did.
      EXPECT_EQ(second.draft_n, first.draft_n) << what;
      EXPECT_EQ(second.draft_accepted, first.draft_accepted) << what;
      EXPECT_LT(first.draft_accepted, n / 2) << what << ": the prompt does not quote the reply";
    } else {
      EXPECT_LT(first.draft_accepted, n / 2) << what;
      // Nearly the whole reply (all but the tokens the verifications add themselves) kept from drafts.
      EXPECT_GE(second.draft_accepted, n * 3 / 4) << what << ": " << second.draft_accepted << " of "
                                                  << second.draft_n << " drafts kept, " << n << " tokens";
      // Drafts past the reply's end (its EOS) come from the sequence's own history and miss.
      EXPECT_GE(double(second.draft_accepted), 0.8 * double(second.draft_n))
          << what << ": " << second.draft_accepted << " of " << second.draft_n << " kept; the first request "
          << first.draft_accepted << " of " << first.draft_n;
    }
    EXPECT_EQ(sch.pool().blocks_in_use(), 0u) << what;
  }
}

// --- The HTTP server ---------------------------------------------------------------------------

class SpecServerTest : public SpecSchedulerTest, protected test::ServerThread {
 protected:
  void start(SpecType type) {
    server::ServerConfig cfg;
    cfg.model_name = "kjv-tiny";
    cfg.render_chat = [](const json& messages, const json&, const json&) {
      std::string s;
      for (const auto& m : messages) s += m["content"].get<std::string>() + "\n";
      return s;
    };
    serve(*rt_, config(type), cfg);
    ASSERT_GT(port_, 0);
  }
  void TearDown() override { stop_serving(); }
  httplib::Result post(const json& body) const {
    return client().Post("/v1/completions", body.dump(), "application/json");
  }
  std::string get(const char* path) const {
    httplib::Client c("127.0.0.1", port_);
    auto r = c.Get(path);
    return r ? r->body : "";
  }
  static json body(const std::string& prompt) {
    return {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}};
  }
  // The texts of the prompts, asked at once, and the responses' timings.
  std::vector<json> ask_all(const std::vector<std::string>& prompts) {
    std::vector<std::future<json>> futs;
    for (const std::string& p : prompts)
      futs.push_back(std::async(std::launch::async, [this, p] {
        const auto r = post(body(p));
        return r && r->status == 200 ? json::parse(r->body) : json();
      }));
    std::vector<json> out;
    for (auto& f : futs) out.push_back(f.get());
    return out;
  }
};

const std::vector<std::string> kPrompts = {"And the LORD said unto Moses, Speak unto the children of Israel. And the LORD",
                                          "In the beginning God created the heaven and the earth. In the beginning",
                                          "The LORD is my shepherd; I shall not want. The LORD is"};

TEST_F(SpecServerTest, ConcurrentRepliesEqualSpeculationOffWithTimingsAndMetrics) {
  start(SpecType::None);
  const std::vector<json> off = ask_all(kPrompts);
  for (const json& r : off) {
    ASSERT_TRUE(r.is_object());
    EXPECT_FALSE(r.contains("timings"));  // a server that does not speculate reports no drafts
  }
  // Without a drafter, asking for drafts is refused by name; n_max 0 asks for nothing.
  json b = body("x");
  b["speculative.n_max"] = 4;
  auto r = post(b);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "speculative.n_max") << r->body;
  b["speculative.n_max"] = 0;
  r = post(b);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  TearDown();

  start(SpecType::Ngram);
  const std::vector<json> on = ask_all(kPrompts);
  int64_t drafted = 0, accepted = 0;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_TRUE(on[i].is_object());
    EXPECT_EQ(on[i]["choices"][0]["text"], off[i]["choices"][0]["text"]) << i;
    ASSERT_TRUE(on[i].contains("timings")) << on[i].dump();
    const json& t = on[i]["timings"];
    EXPECT_LE(t["draft_n_accepted"].get<int64_t>(), t["draft_n"].get<int64_t>());
    drafted += t["draft_n"].get<int64_t>();
    accepted += t["draft_n_accepted"].get<int64_t>();
  }
  EXPECT_GT(accepted, 0);
  const std::string m = get("/metrics");
  EXPECT_NE(m.find("ptllm_spec_drafted_tokens_total " + std::to_string(drafted) + "\n"), std::string::npos) << m;
  EXPECT_NE(m.find("ptllm_spec_accepted_tokens_total " + std::to_string(accepted) + "\n"), std::string::npos) << m;
  EXPECT_NE(m.find("ptllm_kv_blocks_used 0\n"), std::string::npos) << m;

  // Streamed: the last chunk carries the timings.
  json sb = body(kPrompts[0]);
  sb["stream"] = true;
  httplib::Client c("127.0.0.1", port_);
  const auto s = c.Post("/v1/completions", sb.dump(), "application/json");
  ASSERT_TRUE(s);
  EXPECT_NE(s->body.find("\"timings\":{\"draft_n\":"), std::string::npos) << s->body;

  // Refused by name: a field not implemented, n_min above n_max; the server keeps serving.
  json bad = body("x");
  bad["speculative.p_min"] = 0.5;
  r = post(bad);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "speculative.p_min") << r->body;
  bad = body("x");
  bad["speculative.n_max"] = 2;
  bad["speculative.n_min"] = 3;
  r = post(bad);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "speculative.n_min") << r->body;
  bad["speculative.n_max"] = "4";
  r = post(bad);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "speculative.n_max") << r->body;
  const auto ok = post(body(kPrompts[1]));
  ASSERT_TRUE(ok);
  EXPECT_EQ(json::parse(ok->body)["choices"][0]["text"], off[1]["choices"][0]["text"]);
}

}  // namespace
}  // namespace ptllm
