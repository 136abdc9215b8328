// The HTTP server in-process on a free loopback port, driven by httplib's client: the OpenAI
// shapes (chat, completions, SSE streaming, usage), outputs equal to the engine's greedy run,
// OpenAI-shaped errors for bad input, the API key, the body limit, a client that disconnects
// mid-stream or while a non-streamed reply is generated (its request cancelled, its blocks freed),
// and a graceful shutdown.
#include <httplib.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <regex>
#include <sstream>
#include <thread>

#include "chat/chat_template.h"
#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "sample/sampler.h"
#include "server/http_server.h"
#include "serve_process.h"
#include "server_thread.h"
#include "test_greedy.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

using server::json;

using test::kChatML;

class ServerTest : public ::testing::Test, protected test::ServerThread {
 protected:
  static void SetUpTestSuite() {
    rt_ = new Runtime({test::repo_model("kjv-tiny"), 2, true});
    tmpl_ = new chat::ChatTemplate(chat::ChatTemplate::from_string(kChatML));
  }
  static void TearDownTestSuite() {
    delete rt_;
    delete tmpl_;
  }
  void start(const std::string& api_key = "", server::ContextOverflow overflow = server::ContextOverflow::Error,
             int keep = 4, size_t pin_bytes = 0) {
    SchedulerConfig sc;
    sc.pin_bytes = pin_bytes;
    sc.session.kv.ctx_size = 512;
    sc.parallel = 2;
    sc.prefill_chunk = 64;
    sc.eos_ids = {1};
    server::ServerConfig cfg;
    cfg.api_key = api_key;
    cfg.model_name = "kjv-tiny";
    cfg.max_body_bytes = 64 * 1024;
    cfg.context_overflow = overflow;
    cfg.keep = keep;
    cfg.render_chat = [](const json& messages, const json&, const json&) { return render(messages); };
    serve(*rt_, sc, cfg);
    ASSERT_GT(port_, 0);
  }
  void TearDown() override { stop_serving(); }
  static std::string render(const json& messages) { return test::render_chat(*tmpl_, messages); }
  httplib::Result post(const std::string& path, const std::string& body, const std::string& key = "") const {
    httplib::Client c = client();
    httplib::Headers h;
    if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
    return c.Post(path.c_str(), h, body, "application/json");
  }
  // The engine's greedy continuation of `ids`, decoded: what the server must answer at temperature 0.
  static std::string greedy_text(const std::vector<int32_t>& ids, int steps) {
    SessionOptions o;
    o.kv.ctx_size = 512;
    Session s(rt_->model(), o, rt_->pool());
    return rt_->tokenizer().decode(test::greedy(s, ids, steps, /*stop=*/1).ids);
  }
  static json chat_body(const std::string& user, int max_tokens) {
    return {{"model", "kjv-tiny"},
            {"messages", json::array({{{"role", "user"}, {"content", user}}})},
            {"max_tokens", max_tokens},
            {"temperature", 0}};
  }
  static Runtime* rt_;
  static chat::ChatTemplate* tmpl_;
};
Runtime* ServerTest::rt_ = nullptr;
chat::ChatTemplate* ServerTest::tmpl_ = nullptr;

// data: lines of an SSE body, in order.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  return out;
}

void expect_error(const httplib::Result& r, int status, const std::string& message_part, const std::string& param = "") {
  ASSERT_TRUE(r) << "no response";
  EXPECT_EQ(r->status, status) << r->body;
  const json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find(message_part), std::string::npos) << r->body;
  EXPECT_TRUE(j["error"]["type"].is_string());
  if (!param.empty()) {
    EXPECT_EQ(j["error"]["param"], param) << r->body;
  }
}

TEST_F(ServerTest, ChatCompletionEqualsTheEnginesGreedyRun) {
  start();
  const json body = chat_body("In the beginning God created", 24);
  const auto r = post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "kjv-tiny");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  const auto ids = rt_->tokenizer().encode(render(body["messages"]), {.add_special = false});
  EXPECT_EQ(j["choices"][0]["message"]["content"], greedy_text(ids, 24));
  EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());
  EXPECT_TRUE(j["usage"]["prompt_tokens_details"]["cached_tokens"].is_number_integer());
  const std::string reason = j["choices"][0]["finish_reason"];
  EXPECT_TRUE(reason == "length" || reason == "stop");
}

// A conversation longer than the context (512 tokens): by default a 400 context_length_exceeded;
// under --context-overflow shift the oldest turns go whole (a user message and its reply), the system
// prompt stays, and the reply is the engine's greedy run on the messages kept.
TEST_F(ServerTest, ContextOverflowShiftDropsTheOldestTurnsWhole) {
  json messages = json::array({{{"role", "system"}, {"content", "Thou art a scribe of the LORD; answer in His words."}}});
  const std::string verse =
      "And God said, Let the waters under the heaven be gathered together unto one place, and let the dry land "
      "appear: and it was so. And God called the dry land Earth; and the gathering together of the waters called "
      "he Seas: and God saw that it was good. ";
  for (int t = 0; t < 6; ++t) {
    messages.push_back({{"role", "user"}, {"content", "Turn " + std::to_string(t) + ": " + verse}});
    messages.push_back({{"role", "assistant"}, {"content", verse}});
  }
  messages.push_back({{"role", "user"}, {"content", "And the evening and the morning were"}});
  const json body = {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}};
  ASSERT_GT(rt_->tokenizer().encode(render(messages), {.add_special = false}).size(), 512u);
  start();
  expect_error(post("/v1/chat/completions", body.dump()), 400, "the context holds 512", "messages");
  TearDown();
  start("", server::ContextOverflow::Shift);
  const auto r = post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string note = r->get_header_value("X-Context-Overflow");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(note, m, std::regex("^shift; dropped_messages=(\\d+); dropped_tokens=(\\d+)$"))) << note;
  const int dropped = std::stoi(m[1]);
  EXPECT_GT(dropped, 0);
  EXPECT_EQ(dropped % 2, 0);  // whole turns
  json kept = json::array({messages[0]});
  for (size_t i = 1 + size_t(dropped); i < messages.size(); ++i) kept.push_back(messages[i]);
  const auto ids = rt_->tokenizer().encode(render(kept), {.add_special = false});
  EXPECT_LE(ids.size(), 512u - 8u);
  // One turn fewer dropped would not have fitted: no more was dropped than needed.
  json one_more = json::array({messages[0], messages[size_t(dropped) - 1], messages[size_t(dropped)]});
  for (size_t i = 1 + size_t(dropped); i < messages.size(); ++i) one_more.push_back(messages[i]);
  EXPECT_GT(rt_->tokenizer().encode(render(one_more), {.add_special = false}).size(), 512u - 8u);
  const json j = json::parse(r->body);
  EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(j["choices"][0]["message"]["content"], greedy_text(ids, 8));
  // A completion prompt has no turns: shift refuses it, naming the way out.
  const json completion = {{"prompt", std::string(3000, 'x')}, {"max_tokens", 4}};
  expect_error(post("/v1/completions", completion.dump()), 400, "shift drops whole chat turns", "prompt");
}

// --context-overflow shift after a turn that fitted: the turns that follow the dropped ones are taken
// from that turn's history by shifting their positions (runs of at least a block), not computed;
// a request asking n_cache_reuse 0 computes them (exact). A bad n_cache_reuse is a 400 naming it.
TEST_F(ServerTest, ContextOverflowShiftShiftsTheTurnsAfterTheDroppedOnes) {
  json turns = json::array();
  const std::string verse =
      "And God said, Let the waters under the heaven be gathered together unto one place, and let the dry land "
      "appear: and it was so. And God called the dry land Earth. ";
  for (int t = 0; t < 6; ++t) {
    turns.push_back({{"role", "user"}, {"content", "Turn " + std::to_string(t) + ": " + verse}});
    turns.push_back({{"role", "assistant"}, {"content", verse}});
  }
  const json system = {{"role", "system"}, {"content", "Thou art a scribe of the LORD; answer in His words."}};
  const json last = {{"role", "user"}, {"content", "And the evening and the morning were"}};
  auto conversation = [&](size_t n_turns) {
    json m = json::array({system});
    for (size_t i = 0; i < 2 * n_turns; ++i) m.push_back(turns[i]);
    m.push_back(last);
    return m;
  };
  start("", server::ContextOverflow::Shift);
  auto usage_of = [&](const json& body) {
    const auto r = post("/v1/chat/completions", body.dump());
    EXPECT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    return std::make_pair(json::parse(r->body)["usage"], r->get_header_value("X-Context-Overflow"));
  };
  const auto [u1, note1] = usage_of({{"messages", conversation(3)}, {"max_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(note1, "");  // three turns fit, four do not
  const json four = conversation(4);
  const auto [u2, note2] = usage_of({{"messages", four}, {"max_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(note2.rfind("shift; dropped_messages=", 0), 0u) << note2;
  // The first turn is dropped; the next two (over 200 tokens) come from the first request's history,
  // shifted.
  const int64_t shifted = u2["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(shifted, 192) << u2.dump();
  const auto m = client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->body.find("\nptllm_prompt_tokens_shifted_total 0\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("\nptllm_prompt_tokens_shifted_total "), std::string::npos) << m->body;
  const auto [u3, note3] =
      usage_of({{"messages", four}, {"max_tokens", 8}, {"temperature", 0}, {"n_cache_reuse", 0}});
  EXPECT_EQ(note3, note2);
  EXPECT_LT(int64_t(u3["prompt_tokens_details"]["cached_tokens"]), 64) << u3.dump();  // exact: only whole common blocks
  expect_error(post("/v1/chat/completions", json({{"messages", four}, {"n_cache_reuse", 16}}).dump()), 400,
               "n_cache_reuse 16 is below the KV block size of 32", "n_cache_reuse");
}

// --context-overflow stream: the first --keep tokens of a completion prompt and its most recent ones,
// the middle dropped, leaving max_tokens for the reply.
TEST_F(ServerTest, ContextOverflowStreamKeepsThePrefixAndTheMostRecentTokens) {
  start("", server::ContextOverflow::Stream, 6);
  std::string text;
  for (int i = 0; i < 40; ++i) text += "And God saw every thing that he had made, and, behold, it was very good. ";
  const auto all = rt_->tokenizer().encode(text);
  ASSERT_GT(all.size(), 512u);
  const json body = {{"prompt", text}, {"max_tokens", 10}, {"temperature", 0}};
  const auto r = post("/v1/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::vector<int32_t> ids(all.begin(), all.begin() + 6);
  ids.insert(ids.end(), all.end() - (512 - 10 - 6), all.end());
  EXPECT_EQ(r->get_header_value("X-Context-Overflow"),
            "stream; kept_prefix=6; dropped_tokens=" + std::to_string(all.size() - ids.size()));
  const json j = json::parse(r->body);
  EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(j["choices"][0]["text"], greedy_text(ids, 10));
}

// --kv-pin-mb: a chat request's system message is what is pinned (the tokens it renders to, here
// 3 full blocks of 32), once, however many requests share it; /metrics shows it.
TEST_F(ServerTest, ChatSystemPromptIsPinned) {
  start("", server::ContextOverflow::Error, 4, size_t(1) << 20);  // of the 2 MiB pool
  std::string system;
  for (int i = 0; i < 6; ++i) system += "Thou art a scribe of the LORD, and thou shalt answer in the words of the book. ";
  const json sys = {{"role", "system"}, {"content", system}};
  // The pinned prefix: what the prompt shares with the rendering of the system message alone.
  const auto alone = rt_->tokenizer().encode(render(json::array({sys})), {.add_special = false});
  const auto full = rt_->tokenizer().encode(render(json::array({sys, {{"role", "user"}, {"content", "In the beginning"}}})),
                                            {.add_special = false});
  size_t shared = 0;
  while (shared < std::min(alone.size(), full.size()) && alone[shared] == full[shared]) ++shared;
  ASSERT_GE(shared, 96u);
  for (const char* user : {"In the beginning", "And the earth was"}) {
    const json body = {{"messages", json::array({sys, {{"role", "user"}, {"content", user}}})}, {"max_tokens", 2}};
    const auto r = post("/v1/chat/completions", body.dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
  }
  const auto m = client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("\nptllm_kv_pinned_prefixes 1\n"), std::string::npos) << m->body;
  // Its full blocks of 32 tokens, in each of kjv-tiny's 4 layers.
  EXPECT_NE(m->body.find("\nptllm_kv_blocks_pinned " + std::to_string(shared / 32 * 4) + "\n"), std::string::npos)
      << m->body;
}

// A chat's blocks are cached by role: the system prompt's System, the user turns' User, the
// assistant's and the tool's Transient (a block takes the lowest role it touches), on /metrics.
TEST_F(ServerTest, ChatBlocksAreCachedByRole) {
  start();
  auto text = [](const char* words, int times) {
    std::string t;
    for (int i = 0; i < times; ++i) t += words;
    return t;
  };
  const json messages = json::array(
      {{{"role", "system"}, {"content", text("Thou art a scribe of the LORD, and thou shalt answer in the words of the book. ", 5)}},
       {{"role", "user"}, {"content", text("What saith the book of the light? ", 3)}},
       {{"role", "assistant"},
        {"content", "Let me look it up."},
        {"tool_calls", json::array({{{"id", "call_1"},
                                     {"type", "function"},
                                     {"function", {{"name", "lookup_verse"}, {"arguments", "{\"verse\": 3}"}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", text("And God said, Let there be light: and there was light. ", 8)}},
       {{"role", "user"}, {"content", "And the darkness?"}}});
  const json body = {{"messages", messages}, {"max_tokens", 2}, {"temperature", 0}};
  const auto r = post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  // Where each message begins in tokens: the rendering of the messages before it shares that much.
  const Tokenizer& tok = rt_->tokenizer();
  const auto full = tok.encode(render(messages), {.add_special = false});
  std::vector<size_t> begins = {0};
  for (size_t k = 1; k < messages.size(); ++k) {
    const auto part = tok.encode(render(json(std::vector<json>(messages.begin(), messages.begin() + std::ptrdiff_t(k)))),
                                 {.add_special = false});
    begins.push_back(size_t(std::mismatch(part.begin(), part.end(), full.begin(), full.end()).first - part.begin()));
  }
  const int cls_of_message[5] = {2, 1, 0, 0, 1};  // system, user, transient
  size_t want[3] = {0, 0, 0};
  const size_t fed = full.size() + 1;  // the prompt and the first generated token
  for (size_t b = 0; b + 32 <= fed; b += 32) {
    int low = b + 32 > full.size() ? 0 : 2;  // a block with a generated token: transient
    for (size_t k = 0; k < begins.size(); ++k) {
      const size_t end = k + 1 < begins.size() ? begins[k + 1] : full.size();
      if (begins[k] < b + 32 && end > b) low = std::min(low, cls_of_message[k]);
    }
    want[low] += 4;  // kjv-tiny's 4 layers
  }
  // The last, partly filled block is cached too, with the prompt's tokens the last prefill chunk (of
  // 64) computed in a batch of more than 16 rows (not the generated token's: docs/server.md).
  const size_t tail = fed / 32 * 32, last_chunk = (full.size() - 1) % 64 + 1;
  const size_t tail_end = last_chunk > 16 ? full.size() : std::max(full.size() - last_chunk, tail);
  if (tail_end > tail) {
    int low = 2;
    for (size_t k = 0; k < begins.size(); ++k) {
      const size_t end = k + 1 < begins.size() ? begins[k + 1] : full.size();
      if (begins[k] < tail_end && end > tail) low = std::min(low, cls_of_message[k]);
    }
    want[low] += 4;
  }
  ASSERT_GT(want[0], 0u);
  ASSERT_GT(want[1], 0u);
  ASSERT_GT(want[2], 0u);
  const auto m = client().Get("/metrics");
  ASSERT_TRUE(m);
  for (const auto& [role, n] : {std::pair{"transient", want[0]}, std::pair{"user", want[1]}, std::pair{"system", want[2]}})
    EXPECT_NE(m->body.find(std::string("\nptllm_kv_blocks_cached_by_role{role=\"") + role + "\"} " + std::to_string(n) + "\n"),
              std::string::npos)
        << role << " " << n << "\n" << m->body;
}

TEST_F(ServerTest, StreamedChunksAddUpToTheReplyAndCarryUsage) {
  start();
  // Long enough for a full block to be adopted with more than 16 tokens left to compute
  // (adoption_is_exact).
  json body = chat_body("And God said, Let there be light: and there was light. And God saw the light, that it was "
                        "good: and God divided the light from the darkness. And God called the light Day",
                        20);
  const auto plain = post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(plain);
  const json whole = json::parse(plain->body);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const auto r = post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  const auto events = sse_events(r->body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (i == 0) {
      EXPECT_EQ(c["choices"][0]["delta"]["role"], "assistant");
    }
    text += c["choices"][0]["delta"].value("content", "");
  }
  EXPECT_EQ(text, whole["choices"][0]["message"]["content"]);
  const json last = json::parse(events[events.size() - 3]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"]);
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
  // The same conversation again: its prompt's full blocks come from the pool.
  EXPECT_GT(usage["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
}

// A request that ends before its HTTP thread looks (one token, the prompt's blocks from the pool)
// is still answered as a stream when it asked for one (it once came back as one JSON object).
TEST_F(ServerTest, AStreamThatEndsAtOnceIsStillAStream) {
  start();
  json body = chat_body("And God said, Let there be light: and there was light. And God saw the light, that it was "
                        "good: and God divided the light from the darkness.",
                        1);
  body["stream"] = true;
  for (int i = 0; i < 12; ++i) {
    const auto r = post("/v1/chat/completions", body.dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    ASSERT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos) << "request " << i;
    const auto events = sse_events(r->body);
    ASSERT_GE(events.size(), 3u) << "request " << i;
    EXPECT_EQ(events.back(), "[DONE]");
    EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
  }
}

TEST_F(ServerTest, CompletionWithAStopString) {
  start();
  const std::string prompt = "And God said";
  const std::string full = greedy_text(rt_->tokenizer().encode(prompt), 30);
  ASSERT_GT(full.size(), 12u);
  const std::string stop = full.substr(full.size() / 2, 3);
  const json body = {{"prompt", prompt}, {"max_tokens", 30}, {"temperature", 0}, {"stop", stop}};
  const auto r = post("/v1/completions", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], full.substr(0, full.find(stop)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST_F(ServerTest, BadRequestsGetOpenAIErrors) {
  start();
  expect_error(post("/v1/chat/completions", "{\"messages\": ["), 400, "not valid JSON");
  expect_error(post("/v1/chat/completions", "[1, 2]"), 400, "must be a JSON object");
  expect_error(post("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}"), 400,
               "ill-formed UTF-8");
  expect_error(post("/v1/chat/completions", R"({"messages": []})"), 400, "at least one message", "messages");
  expect_error(post("/v1/chat/completions", R"({"messages": "hi"})"), 400, "expected an array", "messages");
  expect_error(post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": 5}]})"), 400,
               "messages[0].content", "messages[0].content");
  expect_error(post("/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})"), 400, "unknown role");
  json body = chat_body("x", 4);
  body["temperature"] = "hot";
  expect_error(post("/v1/chat/completions", body.dump()), 400, "temperature: expected a number", "temperature");
  body = chat_body("x", 4);
  body["n"] = 2;
  expect_error(post("/v1/chat/completions", body.dump()), 400, "n = 1", "n");
  std::string words;
  for (int i = 0; i < 400; ++i) words += "light and darkness ";
  expect_error(post("/v1/completions", json({{"prompt", words}}).dump()), 400, "the context holds 512", "prompt");
  expect_error(post("/v1/completions", std::string(70 * 1024, ' ')), 413, "larger than the limit");
  expect_error(post("/v1/completions", R"({"prompt": [1, 99999]})"), 400, "outside the vocabulary");
  httplib::Client c = client();
  expect_error(c.Get("/v1/nothing"), 404, "unknown endpoint");
}

TEST_F(ServerTest, ApiKeyIsRequiredButNotForHealth) {
  start("s3cret");
  const json body = chat_body("x", 2);
  expect_error(post("/v1/chat/completions", body.dump()), 401, "missing API key");
  expect_error(post("/v1/chat/completions", body.dump(), "s3cre"), 401, "invalid API key");
  expect_error(post("/v1/chat/completions", body.dump(), "s3cret!"), 401, "invalid API key");
  const auto ok = post("/v1/chat/completions", body.dump(), "s3cret");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  httplib::Client c = client();
  const auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  expect_error(c.Get("/v1/models"), 401, "missing API key");
}

TEST_F(ServerTest, ModelsTokenizeAndMetrics) {
  start();
  httplib::Client c = client();
  const auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "kjv-tiny");
  const auto tok = post("/tokenize", R"({"content": "And God said"})");
  ASSERT_TRUE(tok);
  const json ids = json::parse(tok->body)["tokens"];
  EXPECT_EQ(ids.get<std::vector<int32_t>>(), rt_->tokenizer().encode("And God said", {.add_special = false}));
  const auto detok = post("/detokenize", json({{"tokens", ids}}).dump());
  ASSERT_TRUE(detok);
  EXPECT_EQ(json::parse(detok->body)["content"], "And God said");
  expect_error(post("/detokenize", R"({"tokens": [-1]})"), 400, "not a token id");
  ASSERT_TRUE(post("/v1/completions", R"({"prompt": "In the beginning", "max_tokens": 3})"));
  const auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("# TYPE ptllm_requests_total counter\nptllm_requests_total 1\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("ptllm_kv_blocks_used 0\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("ptllm_generated_tokens_total 3\n"), std::string::npos) << m->body;
}

// The client reads two chunks and hangs up: the server's next write fails, the request is cancelled
// and its blocks go back; the server keeps serving.
TEST_F(ServerTest, ClientDisconnectMidStreamCancelsTheRequest) {
  start();
  json body = chat_body("In the beginning", 480);
  body["stream"] = true;
  {
    httplib::Client c = client();
    int chunks = 0;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };
    c.send(req);
    EXPECT_EQ(chunks, 2);
  }
  // Bounded wait for the scheduler to see the cancel (a few steps; no timing is asserted).
  for (int i = 0; i < 3000 && sch_->stats().cancelled == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(sch_->stats().cancelled, 1u);
  EXPECT_EQ(sch_->stats().finished, 0u);
  for (int i = 0; i < 3000 && sch_->stats().blocks_used != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(sch_->stats().blocks_used, 0u);
  const auto after = post("/v1/chat/completions", chat_body("x", 2).dump());
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200);
}

// A non-streamed request whose client hangs up right after sending it: the server notices the
// closed socket while the reply is generated, the request is cancelled (counted on /metrics as a
// streamed one is) and its blocks go back long before 480 tokens could have been generated.
TEST_F(ServerTest, ClientDisconnectOfANonStreamedRequestCancelsIt) {
  start();
  const std::string body = chat_body("In the beginning", 480).dump();
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    const std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    ASSERT_EQ(::send(fd, req.data(), req.size(), 0), ssize_t(req.size()));
    // Closed once the scheduler runs it (so that the test sees a running request end, not a queued one).
    for (int i = 0; i < 3000 && sch_->stats().running == 0 && sch_->stats().finished == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ::close(fd);
  }
  // Bounded waits (no timing is asserted): the cancel, then the blocks.
  for (int i = 0; i < 3000 && sch_->stats().cancelled == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const SchedulerStats st = sch_->stats();
  EXPECT_EQ(st.cancelled, 1u);
  EXPECT_EQ(st.finished, 0u);
  EXPECT_LT(st.generated_tokens, 480u);
  for (int i = 0; i < 3000 && sch_->stats().blocks_used != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(sch_->stats().blocks_used, 0u);
  httplib::Client c = client();
  const auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("\nptllm_requests_cancelled_total 1\n"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("\nptllm_kv_blocks_used 0\n"), std::string::npos) << metrics->body;
  // A client that stays gets its answer (the watch does not cancel a live connection), and the server serves on.
  const auto after = post("/v1/chat/completions", chat_body("x", 40).dump());
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200);
  EXPECT_EQ(sch_->stats().finished, 1u);
  EXPECT_EQ(sch_->stats().cancelled, 1u);
}

// shutdown() while a reply streams: the reply runs to its end (finish reason, [DONE]), then the
// server stops.
TEST_F(ServerTest, ShutdownFinishesTheStreamInFlight) {
  start();
  json body = chat_body("In the beginning", 200);
  body["stream"] = true;
  std::promise<void> first_chunk;
  std::string got;
  std::thread reader([&] {
    httplib::Client c = client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    bool signalled = false;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      got.append(data, n);
      if (!signalled) first_chunk.set_value(), signalled = true;
      return true;
    };
    c.send(req);
    if (!signalled) first_chunk.set_value();
  });
  first_chunk.get_future().wait();
  srv_->shutdown(std::chrono::seconds(60));
  reader.join();
  thread_.join();
  const auto events = sse_events(got);
  ASSERT_GE(events.size(), 3u) << got;
  EXPECT_EQ(events.back(), "[DONE]");
  const json last = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(last["choices"][0]["finish_reason"].is_string()) << got;
  sch_->stop();  // the scheduler's last snapshot of its counters
  EXPECT_EQ(sch_->stats().cancelled, 0u);
  EXPECT_EQ(sch_->stats().finished, 1u);
}

// shutdown(): run() returns, the port closes, and a request after it gets no answer.
TEST_F(ServerTest, ShutdownStopsServing) {
  start();
  ASSERT_TRUE(post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})"));
  srv_->shutdown(std::chrono::seconds(5));
  thread_.join();
  httplib::Client c = client();
  c.set_connection_timeout(2, 0);
  EXPECT_FALSE(c.Get("/health"));
}

TEST(ServeCommand, RefusesNoCacheAndBadFlags) {
  const auto r = test::run_command(test::binary() + " serve --no-cache --port 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--no-cache: the server batches sequences"), std::string::npos) << r.err;
  const auto np = test::run_command(test::binary() + " serve -np 0");
  EXPECT_EQ(np.code, 2);
  EXPECT_NE(np.err.find("--parallel"), std::string::npos) << np.err;
}

// The real binary: --port 0 prints the port, it answers, and SIGTERM ends it with exit code 0.
TEST(ServeCommand, PortZeroAnswersAndSigtermExitsZero) {
  test::TempDir tmp;
  const std::string err = (tmp.path / "err").string(), bin = test::binary();
  const std::string model = test::repo_model("kjv-tiny").string();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const pid_t pid = test::spawn({bin, "serve", model, "--port", "0", "-t", "1", "-np", "2"}, &fa);
  ASSERT_GT(pid, 0);
  posix_spawn_file_actions_destroy(&fa);
  int port = 0;
  const std::regex listening("listening on http://127\\.0\\.0\\.1:(\\d+)");
  for (int i = 0; i < 6000 && port == 0; ++i) {  // a bound, not a timing assertion
    std::ifstream in(err);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    std::smatch m;
    if (std::regex_search(text, m, listening)) port = std::stoi(m[1]);
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GT(port, 0) << "the server printed no port";
  httplib::Client c("127.0.0.1", port);
  const auto r = c.Post("/v1/completions", R"({"prompt": "In the beginning", "max_tokens": 4, "temperature": 0})",
                        "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  // No chat template in the shipped model: the chat endpoint uses ChatML, with a warning at start.
  const auto chat = c.Post("/v1/chat/completions",
                           R"({"messages": [{"role": "user", "content": "In the beginning"}], "max_tokens": 4, "temperature": 0})",
                           "application/json");
  ASSERT_TRUE(chat);
  ASSERT_EQ(chat->status, 200) << chat->body;
  const json answer = json::parse(chat->body);
  EXPECT_EQ(answer["choices"][0]["message"]["role"], "assistant");
  EXPECT_GT(answer["usage"]["completion_tokens"].get<int>(), 0);
  const auto prompt = c.Post("/apply-template", R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]})",
                             "application/json");
  ASSERT_TRUE(prompt);
  EXPECT_EQ(json::parse(prompt->body)["prompt"], "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
  {
    std::ifstream in(err);
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_NE(ss.str().find("has no chat template; using the built-in chatml"), std::string::npos) << ss.str();
    EXPECT_NE(ss.str().find("chat template: built-in chatml"), std::string::npos) << ss.str();
  }
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A SIGTERM that comes the moment the port is printed, before the accept loop runs, still stops
// the server. stderr is a pipe, so the signal follows the line by microseconds; each exit is
// awaited for at most 60 s, then the process is killed and the test fails.
TEST(ServeCommand, SigtermJustAfterTheBindStops) {
  const std::string bin = test::binary(), model = test::repo_model("kjv-tiny").string();
  for (int round = 0; round < 8; ++round) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    const pid_t pid = test::spawn({bin, "serve", model, "--port", "0", "-t", "1", "-np", "1"}, &fa);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    ASSERT_GT(pid, 0);
    std::string text;
    char buf[4096];
    for (ssize_t n; text.find("listening on") == std::string::npos && (n = read(fds[0], buf, sizeof buf)) > 0;)
      text.append(buf, size_t(n));
    // No port line: the server ended or failed; SIGTERM (or the kill past the bound) ends it either way.
    const bool listened = text.find("listening on") != std::string::npos;
    kill(pid, SIGTERM);
    int status = 0;
    const bool exited = test::wait_exit(pid, status);
    close(fds[0]);
    ASSERT_TRUE(listened) << text;
    ASSERT_TRUE(exited) << "round " << round << ": still running 60 s after SIGTERM";
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
}

}  // namespace
}  // namespace ptllm
