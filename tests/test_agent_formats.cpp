// Tool calls and reasoning through the real server, one real chat template per format: a scripted
// model (scripted_model.h) writes what such a model writes; /v1/chat/completions returns the calls
// parsed, streamed and not, and the streamed pieces add up to the whole response.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "scripted_model.h"
#include "serve_process.h"
#include "test_util.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

std::string read_template(const std::string& name) {
  std::ifstream in(test::repo_dir() / "tests" / "data" / "chat_templates" / name, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])");

struct Served {
  test::TempDir dir;
  std::unique_ptr<test::ServeProcess> server;
  Served(const std::string& template_file, const std::string& tail, const std::string& script,
         const std::vector<std::string>& flags = {}) {
    test::ScriptedModelSpec spec;
    spec.scripts = {{script, "", ""}};
    spec.prompt_tail = tail;
    spec.chat_template = read_template(template_file);
    test::write_scripted_model(spec, dir.path / "model");
    server = std::make_unique<test::ServeProcess>(dir.path / "model", flags, dir.path / "serve.err");
  }
};

json chat_body(bool stream = false) {
  return {{"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}},
          {"tools", kTools}, {"temperature", 0}, {"max_tokens", 300}, {"stream", stream}};
}

// The streamed response put together as a client does: content, reasoning, calls by index.
json collect_stream(const std::string& sse) {
  json msg = {{"content", ""}, {"reasoning_content", ""}, {"tool_calls", json::array()}, {"finish_reason", nullptr}};
  std::istringstream in(sse);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("data: ") || line == "data: [DONE]") continue;
    const json chunk = json::parse(line.substr(6));
    if (chunk["choices"].empty()) continue;
    const json& c = chunk["choices"][0];
    if (!c["finish_reason"].is_null()) msg["finish_reason"] = c["finish_reason"];
    const json& d = c["delta"];
    if (d.contains("content") && d["content"].is_string()) msg["content"] = msg["content"].get<std::string>() + d["content"].get<std::string>();
    if (d.contains("reasoning_content"))
      msg["reasoning_content"] = msg["reasoning_content"].get<std::string>() + d["reasoning_content"].get<std::string>();
    for (const json& tc : d.value("tool_calls", json::array())) {
      const size_t i = tc["index"];
      if (i == msg["tool_calls"].size())
        msg["tool_calls"].push_back({{"id", tc["id"]}, {"name", tc["function"]["name"]}, {"arguments", ""}});
      EXPECT_LT(i, msg["tool_calls"].size()) << line;
      if (tc["function"].contains("arguments"))
        msg["tool_calls"][i]["arguments"] =
            msg["tool_calls"][i]["arguments"].get<std::string>() + tc["function"]["arguments"].get<std::string>();
    }
  }
  return msg;
}

// Non-streamed and streamed: the same content, reasoning, calls and finish reason.
json ask(const test::ServeProcess& server, json body = chat_body()) {
  body["stream"] = false;
  const json whole = server.post_ok("/v1/chat/completions", body);
  if (!whole.contains("choices")) {
    ADD_FAILURE() << "no response";
    return json::object({{"message", json::object()}});
  }
  body["stream"] = true;
  const auto r = server.post("/v1/chat/completions", body.dump());
  EXPECT_TRUE(r && r->status == 200);
  const json streamed = collect_stream(r ? r->body : "");
  const json& m = whole["choices"][0]["message"];
  EXPECT_EQ(streamed["finish_reason"], whole["choices"][0]["finish_reason"]);
  EXPECT_EQ(streamed["content"], m["content"].is_null() ? json("") : m["content"]);
  EXPECT_EQ(streamed["reasoning_content"], m.value("reasoning_content", json("")));
  const json calls = m.value("tool_calls", json::array());
  EXPECT_EQ(streamed["tool_calls"].size(), calls.size());
  for (size_t i = 0; i < std::min(calls.size(), streamed["tool_calls"].size()); ++i) {
    EXPECT_EQ(streamed["tool_calls"][i]["name"], calls[i]["function"]["name"]);
    EXPECT_EQ(json::parse(streamed["tool_calls"][i]["arguments"].get<std::string>()),
              json::parse(calls[i]["function"]["arguments"].get<std::string>()));
  }
  return whole["choices"][0];
}

void expect_call(const json& choice, size_t i, const json& args) {
  ASSERT_GT(choice["message"]["tool_calls"].size(), i) << choice.dump();
  const json& c = choice["message"]["tool_calls"][i];
  EXPECT_EQ(c["type"], "function");
  EXPECT_EQ(c["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(c["function"]["arguments"].get<std::string>()), args);
}

const char kQwenTail[] = "<|im_start|>assistant\n";

TEST(AgentFormats, HermesTextThenParallelCalls) {
  Served s("Qwen-Qwen2.5-7B-Instruct.jinja", kQwenTail,
           "Let me look that up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
           "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\", \"days\": 3}}\n</tool_call>");
  ASSERT_GT(s.server->port, 0) << s.server->log();
  const json c = ask(*s.server);
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["message"]["content"], "Let me look that up.");
  expect_call(c, 0, {{"city", "Paris"}});
  expect_call(c, 1, {{"city", "Lyon"}, {"days", 3}});
  EXPECT_NE(c["message"]["tool_calls"][0]["id"], c["message"]["tool_calls"][1]["id"]);
  json one = chat_body();
  one["parallel_tool_calls"] = false;
  const json single = ask(*s.server, one);
  EXPECT_EQ(single["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(single["finish_reason"], "tool_calls");
  EXPECT_EQ(s.server->stop(), 0);
}

TEST(AgentFormats, Llama3Json) {
  Served s("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|start_header_id|>assistant<|end_header_id|>\n\n",
           "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}");
  ASSERT_GT(s.server->port, 0) << s.server->log();
  const json c = ask(*s.server);
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_TRUE(c["message"]["content"].is_null());
  expect_call(c, 0, {{"city", "Paris"}});
  EXPECT_EQ(s.server->stop(), 0);
}

TEST(AgentFormats, MistralArrayWithNineCharacterIds) {
  Served s("mistralai-Mistral-7B-Instruct-v0.3.jinja", "[/INST]",
           "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]");
  ASSERT_GT(s.server->port, 0) << s.server->log();
  const json c = ask(*s.server);
  expect_call(c, 0, {{"city", "Paris"}});
  const std::string id = c["message"]["tool_calls"][0]["id"];
  EXPECT_EQ(id.size(), 9u);
  // The id goes back into the history and the template (which checks it) renders it.
  json body = chat_body();
  body["messages"].push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {{{"id", id}, {"type", "function"},
      {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}});
  body["messages"].push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", "sunny"}});
  const auto r = s.server->post("/apply-template", body.dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->body.find(id), std::string::npos);
  EXPECT_EQ(s.server->stop(), 0);
}

TEST(AgentFormats, MistralNameArgs) {
  // Its template's default system prompt is long: a larger context.
  Served s("Mistral-Small-3.2-24B-Instruct-2506.jinja", "[/INST]", "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
           {"-c", "4096"});
  ASSERT_GT(s.server->port, 0) << s.server->log();
  const json c = ask(*s.server);
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  expect_call(c, 0, {{"city", "Paris"}});
  EXPECT_EQ(s.server->stop(), 0);
}

TEST(AgentFormats, Qwen3CoderXmlByFlag) {
  Served s("Qwen-Qwen2.5-7B-Instruct.jinja", kQwenTail,
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
           "</parameter>\n</function>\n</tool_call>",
           {"--tool-call-format", "qwen3-coder"});
  ASSERT_GT(s.server->port, 0) << s.server->log();
  const json c = ask(*s.server);
  expect_call(c, 0, {{"city", "Paris"}, {"days", 2}});
  EXPECT_EQ(s.server->stop(), 0);
}

TEST(AgentFormats, Qwen3ReasoningThenCall) {
  Served s("Qwen-Qwen3-0.6B.jinja", kQwenTail,
           "<think>\nThe user wants the weather in Paris.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
           "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  ASSERT_GT(s.server->port, 0) << s.server->log();
  const json c = ask(*s.server);
  EXPECT_EQ(c["message"]["reasoning_content"], "\nThe user wants the weather in Paris.\n");
  EXPECT_TRUE(c["message"]["content"].is_null());
  expect_call(c, 0, {{"city", "Paris"}});
  // reasoning_format none: the thinking stays in the content.
  json body = chat_body();
  body["reasoning_format"] = "none";
  body.erase("tools");
  const json raw = ask(*s.server, body);
  EXPECT_TRUE(raw["message"]["content"].get<std::string>().starts_with("<think>"));
  EXPECT_FALSE(raw["message"].contains("reasoning_content"));
  EXPECT_EQ(s.server->stop(), 0);
}

TEST(AgentFormats, MalformedCallIsText) {
  const std::string bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }}\n</tool_call>";
  Served s("Qwen-Qwen2.5-7B-Instruct.jinja", kQwenTail, bad);
  ASSERT_GT(s.server->port, 0) << s.server->log();
  const json c = ask(*s.server);
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(c["message"]["content"], bad);
  EXPECT_FALSE(c["message"].contains("tool_calls"));
  // Cut by max_tokens inside the call: text, "length".
  json body = chat_body();
  body["max_tokens"] = 8;
  const json cut = ask(*s.server, body);
  EXPECT_EQ(cut["finish_reason"], "length");
  EXPECT_FALSE(cut["message"].contains("tool_calls"));
  EXPECT_TRUE(cut["message"]["content"].get<std::string>().starts_with("<tool_call>"));
  EXPECT_EQ(s.server->stop(), 0);
}

}  // namespace
}  // namespace ptllm

namespace ptllm {
namespace {

// logit_bias goes through the generator's processors: +100 on a token makes it the first one; a
// token outside the vocabulary is a 400.
TEST(AgentFormats, LogitBias) {
  Served s("Qwen-Qwen2.5-7B-Instruct.jinja", kQwenTail, "It is sunny.");
  ASSERT_GT(s.server->port, 0) << s.server->log();
  json body = chat_body();
  body.erase("tools");
  EXPECT_EQ(s.server->post_ok("/v1/chat/completions", body)["choices"][0]["message"]["content"], "It is sunny.");
  const json ids = s.server->post_ok("/tokenize", {{"content", " gold"}});
  ASSERT_EQ(ids["tokens"].size(), 1u);
  body["logit_bias"] = {{std::to_string(ids["tokens"][0].get<int>()), 100}};
  body["max_tokens"] = 3;
  const std::string biased = s.server->post_ok("/v1/chat/completions", body)["choices"][0]["message"]["content"];
  EXPECT_TRUE(biased.starts_with(" gold")) << biased;
  body["logit_bias"] = {{"8192", 1}};
  const auto r = s.server->post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("logit_bias"), std::string::npos);
  EXPECT_EQ(s.server->stop(), 0);
}

// Log-probabilities: one entry per token, its text adding up to the reply; the scripted model's
// choice is its top alternative with a probability near 1; streamed, the same entries.
TEST(AgentFormats, Logprobs) {
  Served s("Qwen-Qwen2.5-7B-Instruct.jinja", kQwenTail, "It is sunny in Paris.");
  ASSERT_GT(s.server->port, 0) << s.server->log();
  json body = chat_body();
  body.erase("tools");
  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  const json whole = s.server->post_ok("/v1/chat/completions", body);
  const json& content = whole["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), whole["usage"]["completion_tokens"].get<size_t>() - 1);  // the EOS has none
  std::string text;
  for (const json& e : content) {
    text += e["token"].get<std::string>();
    EXPECT_GT(e["logprob"].get<double>(), -1e-3);
    ASSERT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);
    EXPECT_LT(e["top_logprobs"][1]["logprob"].get<double>(), -20);
  }
  EXPECT_EQ(text, "It is sunny in Paris.");
  body["stream"] = true;
  const auto r = s.server->post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(r && r->status == 200);
  std::istringstream in(r->body);
  std::string line, streamed;
  size_t entries = 0;
  while (std::getline(in, line)) {
    if (!line.starts_with("data: {")) continue;
    const json c = json::parse(line.substr(6));
    if (c["choices"].empty() || c["choices"][0]["logprobs"].is_null()) continue;
    for (const json& e : c["choices"][0]["logprobs"]["content"]) streamed += e["token"].get<std::string>(), ++entries;
  }
  EXPECT_EQ(entries, content.size());
  EXPECT_EQ(streamed, text);
  // Completions: the legacy shape.
  const json legacy = s.server->post_ok("/v1/completions", {{"prompt", "Weather?<|im_start|>assistant\n"}, {"max_tokens", 4},
                                                            {"temperature", 0}, {"logprobs", 1}});
  const json& lp = legacy["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"].size(), 4u);
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 1u);
  EXPECT_EQ(s.server->stop(), 0);
}

// `chat --tools FILE --json`: the template is offered the tools, the reply's call is parsed into
// tool_calls and kept in the history as a call (the next turn's prompt renders it as Qwen's
// <tool_call>, so the conversation's KV is reused).
TEST(AgentFormats, ChatCommandParsesCalls) {
  Served s("Qwen-Qwen2.5-7B-Instruct.jinja", kQwenTail,
           "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  EXPECT_EQ(s.server->stop(), 0);
  const fs::path tools = s.dir.path / "tools.json";
  std::ofstream(tools) << kTools.dump();
  const fs::path turns = s.dir.path / "turns.txt";
  std::ofstream(turns) << "Weather in Paris?\nAnd tomorrow?\n";
  const auto r = test::run_command(test::binary() + " chat " + (s.dir.path / "model").string() + " --tools " +
                                   tools.string() + " -f " + turns.string() + " --json --temp 0 -n 100 -t 1");
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  std::vector<json> out;
  while (std::getline(lines, line)) out.push_back(json::parse(line));
  ASSERT_EQ(out.size(), 2u) << r.out;
  ASSERT_EQ(out[0]["tool_calls"].size(), 1u);
  EXPECT_EQ(out[0]["tool_calls"][0]["name"], "get_weather");
  EXPECT_EQ(out[0]["tool_calls"][0]["arguments"], json({{"city", "Paris"}}));
  EXPECT_EQ(out[0]["content"], "");
  EXPECT_GT(out[1]["reused_tokens"].get<int>(), out[0]["prompt_tokens"].get<int>()) << "the first turn's call is reused";
  // A bad tools file is an error naming it.
  std::ofstream(tools) << "{\"not\": \"a list\"}";
  const auto bad = test::run_command(test::binary() + " chat " + (s.dir.path / "model").string() + " --tools " +
                                     tools.string() + " -f " + turns.string() + " --json");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("tools.json"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace ptllm
