// Structured output end to end: each token's bytes as the grammar sees them, the constraint's masks
// (EOS, special tokens, the lazy trigger), `sample --grammar/--json-schema`, and serve's grammar,
// json_schema, response_format, forced and strict tool calls, with kjv-tiny at temperature 1 (a
// model that knows nothing of JSON: every valid output is the grammar's doing).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/constraint.h"
#include "scripted_model.h"
#include "serve_process.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

using json = nlohmann::ordered_json;

std::string read_template(const std::string& name) {
  std::ifstream in(test::repo_dir() / "tests" / "data" / "chat_templates" / name, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TokenBytes, TheirConcatenationSpellsTheText) {
  const std::vector<std::string> texts = {"And God said, Let there be light.", "naïve café — ünïcödé ✓ 日本語 🙂",
                                          "{\"a\": [1, 2.5e-3, true, null]}\n\t x", "  two  spaces"};
  for (const char* m : {"kjv-tiny", "qwen2-tiny", "mistral-tiny", "llama-mha-ropescaled-tiny"}) {
    const Tokenizer tok = Tokenizer::load(test::repo_model(m));
    const std::vector<std::string> bytes = tok.token_bytes();
    ASSERT_EQ(bytes.size(), size_t(tok.vocab_size())) << m;
    for (const std::string& text : texts) {
      std::string joined;
      for (int32_t id : tok.encode(text, {.add_special = false})) joined += bytes[size_t(id)];
      // A Metaspace tokenizer prepends a space to the text; in the middle of a text it is a space.
      EXPECT_TRUE(joined == text || joined == " " + text) << m << ": " << joined;
    }
  }
}

struct Vocab {
  Tokenizer tok = Tokenizer::load(test::repo_model("kjv-tiny"));
  std::shared_ptr<const GrammarVocab> vocab = GrammarVocab::of(tok);
  int32_t eos = *tok.eos_id();
};

std::shared_ptr<const ConstraintSpec> spec_of(const std::string& gbnf, std::vector<std::string> triggers = {}) {
  auto s = std::make_shared<ConstraintSpec>();
  s->grammar = compile_grammar(gbnf);
  s->triggers = std::move(triggers);
  return s;
}

std::vector<int32_t> allowed(Constraint& c, const Vocab& v) {
  std::vector<float> logits(v.vocab->size(), 0.0f);
  const int32_t eos[] = {v.eos};
  c.mask(logits, eos);
  std::vector<int32_t> out;
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::isfinite(logits[i])) out.push_back(int32_t(i));
  return out;
}

TEST(Constraint, MasksEveryTokenThatCannotFollowAndEndsWhereTheGrammarDoes) {
  Vocab v;
  Constraint c(spec_of(R"(root ::= "yes" | "no" | "yes!")"), v.vocab);
  for (int32_t id : allowed(c, v)) {
    const std::string& b = v.vocab->bytes(id);
    EXPECT_TRUE(std::string("yes!").starts_with(b) || std::string("no").starts_with(b)) << b;
    EXPECT_FALSE(v.vocab->special(id)) << "a special token where the grammar cannot end";
  }
  for (int32_t id : v.tok.encode("yes", {.add_special = false})) c.accept(id);
  const std::vector<int32_t> after = allowed(c, v);
  EXPECT_TRUE(std::count(after.begin(), after.end(), v.eos)) << "EOS where the grammar can end";
  EXPECT_FALSE(c.complete());  // "!" may still follow
  for (int32_t id : after) EXPECT_TRUE(id == v.eos || v.vocab->bytes(id) == "!") << v.vocab->bytes(id);
  for (int32_t id : v.tok.encode("!", {.add_special = false})) c.accept(id);
  EXPECT_TRUE(c.complete());
}

TEST(Constraint, LazyStartsAtTheTriggerAndLetsGoAfterTheCall) {
  Vocab v;
  Constraint c(spec_of(R"(root ::= "<call>" [0-9]+ "</call>")", {"<call>"}), v.vocab);
  EXPECT_FALSE(c.active());
  EXPECT_GT(allowed(c, v).size(), v.vocab->size() / 2) << "free before the trigger";
  for (int32_t id : v.tok.encode("He said <ca", {.add_special = false})) c.accept(id);
  EXPECT_FALSE(c.active());
  for (int32_t id : v.tok.encode("ll>", {.add_special = false})) c.accept(id);
  ASSERT_TRUE(c.active()) << "the trigger spans two pieces";
  for (int32_t id : allowed(c, v)) {
    const std::string& b = v.vocab->bytes(id);
    ASSERT_FALSE(b.empty());
    EXPECT_TRUE(b.find_first_not_of("0123456789") == std::string::npos) << b;
  }
  for (int32_t id : v.tok.encode("42</call>", {.add_special = false})) c.accept(id);
  EXPECT_FALSE(c.active()) << "free again after the call";
  EXPECT_FALSE(c.complete()) << "a lazy constraint never ends the reply";
}

TEST(Constraint, EmptyLanguageAndBadGrammarsAreRefused) {
  EXPECT_THROW(compile_grammar("root ::= a\na ::= \"x\" a\n"), grammar::GrammarError);
  try {
    compile_grammar("root ::= \"a\"\nb ::= \"x\" @ \"y\"\n");
    FAIL();
  } catch (const grammar::GrammarError& e) {
    EXPECT_EQ(e.line, 2);
  }
  EXPECT_EQ(compile_grammar("root ::= \"a\""), compile_grammar("root ::= \"a\"")) << "kept by its text";
}

std::string sample(const std::string& args) {
  return test::binary() + " sample " + test::repo_model("kjv-tiny").string() + " -t 1 " + args;
}

TEST(StructuredCli, GrammarHoldsAtTemperatureOne) {
  std::set<std::string> seen;
  for (int seed = 1; seed <= 6; ++seed) {
    const auto r = test::run_command(sample("-p 'Answer:' --temp 1 -n 40 --json --seed " + std::to_string(seed) +
                                            " --grammar 'root ::= (\"yes\" | \"no\") \" \" [0-9]{1,3} \".\"'"));
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = json::parse(r.out);
    const std::string text = j["text"];
    EXPECT_TRUE(text.starts_with("yes ") || text.starts_with("no ")) << text;
    EXPECT_TRUE(text.ends_with(".")) << text;
    EXPECT_EQ(j["stop_reason"], "grammar") << r.out;
    seen.insert(text);
  }
  EXPECT_GT(seen.size(), 1u) << "sampling still varies within the grammar";
}

TEST(StructuredCli, JsonSchemaFromAFile) {
  test::TempDir dir;
  const json schema = json::parse(R"({"type": "object", "properties": {
      "verse": {"type": "integer", "minimum": 1, "maximum": 176},
      "book": {"enum": ["Genesis", "Exodus", "Psalms"]}}, "required": ["verse", "book"],
      "additionalProperties": false})");
  std::ofstream(dir.path / "s.json") << schema.dump();
  for (int seed = 1; seed <= 4; ++seed) {
    const auto r = test::run_command(sample("-p 'In the beginning' --temp 1 -n 200 -q --seed " + std::to_string(seed) +
                                            " --json-schema @" + (dir.path / "s.json").string()));
    ASSERT_EQ(r.code, 0) << r.err;
    const json v = json::parse(r.out);
    ASSERT_TRUE(v.is_object()) << r.out;
    EXPECT_EQ(v.size(), 2u) << r.out;
    EXPECT_GE(v["verse"].get<int>(), 1);
    EXPECT_LE(v["verse"].get<int>(), 176);
    EXPECT_TRUE(v["book"] == "Genesis" || v["book"] == "Exodus" || v["book"] == "Psalms") << r.out;
  }
}

TEST(StructuredCli, MistakesNameTheFlagAndThePlace) {
  auto r = test::run_command(sample("-p x --grammar 'root ::= \"a\"\nb ::= (\"x\"'"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--grammar: line 2"), std::string::npos) << r.err;
  r = test::run_command(sample("-p x --grammar-file /nonexistent/g.gbnf"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("/nonexistent/g.gbnf"), std::string::npos) << r.err;
  r = test::run_command(sample("-p x --json-schema '{\"type\": \"object\", \"patternProperties\": {}}'"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("patternProperties"), std::string::npos) << r.err;
  r = test::run_command(sample("-p x --json-schema '{\"type\": '"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--json-schema"), std::string::npos) << r.err;
  r = test::run_command(sample("-p x --grammar 'root ::= \"a\"' --json-schema '{}'"));
  EXPECT_NE(r.code, 0);
}

// ---- serve ------------------------------------------------------------------------------------

const json kWeather = json::parse(R"({"type": "function", "function": {"name": "get_weather", "strict": true,
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"],
    "additionalProperties": false}}})");
const json kVerse = json::parse(R"({"type": "function", "function": {"name": "lookup_verse",
    "parameters": {"type": "object", "properties": {"book": {"type": "string", "maxLength": 12}},
    "required": ["book"]}}})");

void expect_weather_args(const json& call) {
  EXPECT_EQ(call["function"]["name"], "get_weather") << call.dump();
  const json a = json::parse(call["function"]["arguments"].get<std::string>());
  ASSERT_TRUE(a.is_object());
  EXPECT_EQ(a.size(), 2u) << a.dump();
  EXPECT_TRUE(a["city"] == "Paris" || a["city"] == "Rome" || a["city"] == "Oslo") << a.dump();
  EXPECT_TRUE(a["days"].is_number_integer() && a["days"] >= 1 && a["days"] <= 7) << a.dump();
}

struct QwenServer {
  test::TempDir dir;
  test::ServeProcess server{test::repo_model("kjv-tiny"),
                            {"--chat-template",
                             (test::repo_dir() / "tests/data/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja").string(),
                             "-c", "2048"},
                            dir.path / "serve.err"};
};

json chat(const std::string& content) {
  return {{"messages", {{{"role", "user"}, {"content", content}}}}, {"temperature", 1}, {"max_tokens", 200}};
}

TEST(StructuredServe, ResponseFormatJsonSchemaAndJsonObject) {
  QwenServer s;
  const json schema = json::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
      "age": {"type": "integer", "minimum": 0, "maximum": 120}, "tags": {"type": "array",
      "items": {"enum": ["a", "b"]}, "maxItems": 3}}, "required": ["name", "age"], "additionalProperties": false})");
  int stopped = 0;
  for (int seed = 1; seed <= 5; ++seed) {
    json body = chat("Describe a person.");
    body["seed"] = seed;
    body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", schema}, {"strict", true}}}};
    const json r = s.server.post_ok("/v1/chat/completions", body);
    ASSERT_TRUE(r.contains("choices")) << r.dump();
    if (r["choices"][0]["finish_reason"] != "stop") continue;
    ++stopped;
    const json v = json::parse(r["choices"][0]["message"]["content"].get<std::string>());
    EXPECT_TRUE(v["name"].is_string() && v["name"].get<std::string>().size() <= 8 * 4) << v.dump();
    EXPECT_TRUE(v["age"].is_number_integer() && v["age"] >= 0 && v["age"] <= 120) << v.dump();
    for (const auto& [k, val] : v.items()) EXPECT_TRUE(k == "name" || k == "age" || k == "tags") << k;
  }
  EXPECT_GT(stopped, 0);
  json body = chat("Anything.");
  body["response_format"] = {{"type", "json_object"}};
  body["max_tokens"] = 400;
  int objects = 0;
  for (int seed = 7; seed <= 12; ++seed) {
    body["seed"] = seed;
    const json r = s.server.post_ok("/v1/chat/completions", body);
    if (r["choices"][0]["finish_reason"] != "stop") continue;
    EXPECT_TRUE(json::parse(r["choices"][0]["message"]["content"].get<std::string>()).is_object());
    ++objects;
  }
  EXPECT_GT(objects, 0) << "no json_object reply ended by stop";
}

TEST(StructuredServe, ToolChoiceRequiredAlwaysCallsWithValidArguments) {
  QwenServer s;
  for (int seed = 1; seed <= 6; ++seed) {
    json body = chat("What is the weather?");
    body["seed"] = seed;
    body["tools"] = {kWeather, kVerse};
    body["parallel_tool_calls"] = false;
    body["tool_choice"] = seed % 2 ? json("required") : json{{"type", "function"}, {"function", {{"name", "get_weather"}}}};
    if (seed % 2) body["tools"] = {kWeather};
    const json r = s.server.post_ok("/v1/chat/completions", body);
    ASSERT_TRUE(r.contains("choices")) << r.dump();
    const json& c = r["choices"][0];
    ASSERT_EQ(c["finish_reason"], "tool_calls") << c.dump();
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << c.dump();
    expect_weather_args(c["message"]["tool_calls"][0]);
  }
}

// Mistral's two call syntaxes: v0.3's JSON list and Small 3.2's [TOOL_CALLS]name[ARGS]{...}; the
// forced call is written in the template's own, and read back as a call.
TEST(StructuredServe, ToolChoiceRequiredInBothMistralSyntaxes) {
  for (const char* tmpl : {"mistralai-Mistral-7B-Instruct-v0.3.jinja", "Mistral-Small-3.2-24B-Instruct-2506.jinja"}) {
    SCOPED_TRACE(tmpl);
    test::TempDir dir;
    test::ServeProcess server{test::repo_model("kjv-tiny"),
                              {"--chat-template", (test::repo_dir() / "tests/data/chat_templates" / tmpl).string(),
                               "-c", "2048"},
                              dir.path / "serve.err"};
    for (int seed = 1; seed <= 3; ++seed) {
      json body = chat("What is the weather?");
      body["seed"] = seed;
      body["tools"] = {kWeather, kVerse};
      body["parallel_tool_calls"] = false;
      body["max_tokens"] = 600;
      // Small 3.2's default system prompt alone fills kjv-tiny's context
      body["messages"] = {{{"role", "system"}, {"content", "You call tools."}}, {{"role", "user"}, {"content", "What is the weather?"}}};
      body["tool_choice"] = json{{"type", "function"}, {"function", {{"name", "get_weather"}}}};
      const json r = server.post_ok("/v1/chat/completions", body);
      ASSERT_TRUE(r.contains("choices")) << r.dump();
      const json& c = r["choices"][0];
      ASSERT_EQ(c["finish_reason"], "tool_calls") << c.dump();
      ASSERT_GE(c["message"]["tool_calls"].size(), 1u) << c.dump();
      for (const json& call : c["message"]["tool_calls"]) expect_weather_args(call);
      EXPECT_TRUE(c["message"]["content"].is_null() || c["message"]["content"] == "") << c.dump();
    }
  }
}

TEST(StructuredServe, GrammarFieldAndBadInputKeepTheServerServing) {
  QwenServer s;
  json body = chat("x");
  body["grammar"] = "root ::= \"amen\" | \"selah\"";
  json r = s.server.post_ok("/v1/chat/completions", body);
  const std::string text = r["choices"][0]["message"]["content"];
  EXPECT_TRUE(text == "amen" || text == "selah") << text;
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");

  const auto bad = [&](json b, const std::string& param, const std::string& words) {
    const auto res = s.server.post("/v1/chat/completions", b.dump());
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << res->body;
    const json e = json::parse(res->body)["error"];
    EXPECT_EQ(e["param"], param) << res->body;
    EXPECT_NE(e["message"].get<std::string>().find(words), std::string::npos) << res->body;
  };
  body["grammar"] = "root ::= \"a\"\nb ::= [a-";
  bad(body, "grammar", "line 2");
  body.erase("grammar");
  body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}, {"patternProperties", json::object()}}}}}};
  bad(body, "response_format.json_schema.schema", "patternProperties");
  json deep = {{"type", "integer"}};
  for (int i = 0; i < 100; ++i) deep = {{"type", "array"}, {"items", deep}};
  body["response_format"]["json_schema"]["schema"] = deep;
  bad(body, "response_format.json_schema.schema", "");
  body.erase("response_format");
  body["grammar"] = "root ::= a\na ::= \"x\" a";
  bad(body, "grammar", "no text");
  body["grammar"] = "root ::= \"a\"";
  body["json_schema"] = {{"type", "object"}};
  bad(body, "json_schema", "only one");
  body.erase("json_schema");
  body.erase("grammar");
  const json ok = s.server.post_ok("/v1/chat/completions", body);
  EXPECT_TRUE(ok.contains("choices")) << "still serving";
}

TEST(StructuredServe, CompletionsTakeGrammarAndJsonSchema) {
  QwenServer s;
  const json r = s.server.post_ok("/v1/completions", {{"prompt", "The number is"}, {"temperature", 1}, {"seed", 3},
                                                      {"max_tokens", 20}, {"json_schema", {{"type", "integer"}, {"minimum", 10}, {"maximum", 99}}}});
  const std::string text = r["choices"][0]["text"];
  const int n = std::stoi(text);
  EXPECT_GE(n, 10);
  EXPECT_LE(n, 99);
}

// A strict tool with tool_choice "auto": the text before the call is free, the call's arguments
// follow the schema although the model meant to write others.
TEST(StructuredServe, StrictToolIsLazy) {
  test::TempDir dir;
  test::ScriptedModelSpec spec;
  spec.scripts = {{"Let me look. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\", \"days\": 30}}\n</tool_call>", "", ""}};
  spec.prompt_tail = "<|im_start|>assistant\n";
  spec.chat_template = read_template("Qwen-Qwen2.5-7B-Instruct.jinja");
  test::write_scripted_model(spec, dir.path / "model");
  test::ServeProcess server(dir.path / "model", {}, dir.path / "serve.err");
  json body = chat("Weather?");
  body["temperature"] = 0;
  body["tools"] = {kWeather};
  body["parallel_tool_calls"] = false;
  json r = server.post_ok("/v1/chat/completions", body);
  ASSERT_TRUE(r.contains("choices")) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Let me look.") << r.dump();
  ASSERT_EQ(r["choices"][0]["message"]["tool_calls"].size(), 1u) << r.dump();
  expect_weather_args(r["choices"][0]["message"]["tool_calls"][0]);
  // Not strict: the model's own arguments.
  body["tools"][0]["function"]["strict"] = false;
  r = server.post_ok("/v1/chat/completions", body);
  EXPECT_EQ(json::parse(r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json::parse(R"({"city": "Lyon", "days": 30})"));
}

TEST(StructuredServe, ResponsesTextFormatAndMessagesToolChoice) {
  QwenServer s;
  const json schema = json::parse(R"({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
      "additionalProperties": false})");
  json r = s.server.post_ok("/v1/responses", {{"input", "Is it?"}, {"temperature", 1}, {"max_output_tokens", 300},
                                              {"text", {{"format", {{"type", "json_schema"}, {"name", "answer"}, {"schema", schema}, {"strict", true}}}}}});
  ASSERT_TRUE(r.contains("output")) << r.dump();
  ASSERT_EQ(r["status"], "completed") << r.dump();
  std::string text;
  for (const json& item : r["output"])
    if (item["type"] == "message") text = item["content"][0]["text"];
  const json v = json::parse(text);
  EXPECT_TRUE(v["ok"].is_boolean()) << text;

  const json tool = {{"name", "get_weather"}, {"input_schema", kWeather["function"]["parameters"]}};
  r = s.server.post_ok("/v1/messages", {{"model", "x"}, {"max_tokens", 200}, {"temperature", 1},
                                        {"messages", {{{"role", "user"}, {"content", "Weather?"}}}},
                                        {"tools", {tool}}, {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}}});
  ASSERT_TRUE(r.contains("content")) << r.dump();
  EXPECT_EQ(r["stop_reason"], "tool_use") << r.dump();
  bool found = false;
  for (const json& b : r["content"])
    if (b["type"] == "tool_use") {
      found = true;
      expect_weather_args({{"function", {{"name", b["name"]}, {"arguments", b["input"].dump()}}}});
    }
  EXPECT_TRUE(found) << r.dump();
}

}  // namespace
}  // namespace ptllm
