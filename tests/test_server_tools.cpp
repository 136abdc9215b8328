// `tools` through a real chat template and the real server: `posttrainllm serve --chat-template`
// with Qwen2.5-7B-Instruct's template (tests/data/chat_templates), a chat request with the tools of
// the case "tools_user" (tests/data/chat_cases.jsonl): the prompt the server builds (its
// /apply-template, and the prompt tokens of /v1/chat/completions) is byte for byte what Jinja2 set
// up as transformers' apply_chat_template renders (tests/data/chat_expected.jsonl, written by
// scripts/render_chat_templates.py). And invalid `tools` are a 400 naming the field; a built-in
// --chat-template NAME, and a system message folded for a template that refuses the role.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "serve_process.h"
#include "test_util.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

const char* kTemplate = "Qwen-Qwen2.5-7B-Instruct.jinja";

fs::path data_dir() { return test::repo_dir() / "tests" / "data"; }

// The line of a .jsonl file whose fields match.
json find_line(const fs::path& file, const std::string& key, const std::string& value, const std::string& key2 = "",
               const std::string& value2 = "") {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line);
    if (j[key] == value && (key2.empty() || j[key2] == value2)) return j;
  }
  ADD_FAILURE() << "no line with " << key << " = " << value << " in " << file;
  return json::object();
}

void expect_error(const httplib::Result& r, const std::string& param, const std::string& message_part) {
  ASSERT_TRUE(r) << "no response";
  EXPECT_EQ(r->status, 400) << r->body;
  const json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
  EXPECT_EQ(j["error"]["param"], param) << r->body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find(message_part), std::string::npos) << r->body;
  EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r->body;
}

class ServerToolsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new test::TempDir;
    server_ = new test::ServeProcess(test::repo_model("kjv-tiny"),
                                     {"--chat-template", (data_dir() / "chat_templates" / kTemplate).string()},
                                     tmp_->path / "serve.err");
  }
  static void TearDownTestSuite() {
    if (server_->port > 0) {
      EXPECT_EQ(server_->stop(), 0);
    }
    delete server_;
    delete tmp_;
  }
  void SetUp() override { ASSERT_GT(server_->port, 0) << server_->log(); }
  static test::TempDir* tmp_;
  static test::ServeProcess* server_;
};
test::TempDir* ServerToolsTest::tmp_ = nullptr;
test::ServeProcess* ServerToolsTest::server_ = nullptr;

TEST_F(ServerToolsTest, ThePromptHoldsTheToolsAsTheTemplateRendersThem) {
  const json c = find_line(data_dir() / "chat_cases.jsonl", "name", "tools_user");
  const json expected = find_line(data_dir() / "chat_expected.jsonl", "template", kTemplate, "case", "tools_user");
  ASSERT_TRUE(c.contains("tools") && expected.contains("output"));
  const std::string want = expected["output"];
  // The tool definitions are in the expected render (so the comparison below is about them).
  ASSERT_NE(want.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""), std::string::npos);
  ASSERT_NE(want.find("\"name\": \"get_time\""), std::string::npos);
  const json request = {{"messages", c["messages"]}, {"tools", c["tools"]}, {"max_tokens", 2}, {"temperature", 0}};
  const json rendered = server_->post_ok("/apply-template", request);
  EXPECT_EQ(rendered["prompt"], want);
  // The completion's prompt is that text, tokenized as the server tokenizes a rendered template.
  const json tokens = server_->post_ok("/tokenize", {{"content", want}, {"add_special", false}});
  const json reply = server_->post_ok("/v1/chat/completions", request);
  ASSERT_TRUE(tokens["tokens"].is_array());
  EXPECT_EQ(reply["usage"]["prompt_tokens"], tokens["tokens"].size());
  EXPECT_GE(reply["usage"]["completion_tokens"].get<int>(), 1);
  EXPECT_LE(reply["usage"]["completion_tokens"].get<int>(), 2);
  // Without tools, the template's other branch: no tool section, a shorter prompt.
  json plain = request;
  plain.erase("tools");
  const json without = server_->post_ok("/apply-template", plain);
  EXPECT_EQ(without["prompt"].get<std::string>().find("# Tools"), std::string::npos);
  const json plain_reply = server_->post_ok("/v1/chat/completions", plain);
  EXPECT_LT(plain_reply["usage"]["prompt_tokens"].get<int>(), reply["usage"]["prompt_tokens"].get<int>());
}

TEST_F(ServerToolsTest, InvalidToolsAreA400NamingTheField) {
  const json messages = json::array({{{"role", "user"}, {"content", "What's the weather in Paris?"}}});
  auto with_tools = [&](const json& tools) {
    return json{{"messages", messages}, {"tools", tools}, {"max_tokens", 2}}.dump();
  };
  for (const char* path : {"/v1/chat/completions", "/apply-template"}) {
    SCOPED_TRACE(path);
    expect_error(server_->post(path, with_tools(json::object({{"type", "function"}}))), "tools", "tools: expected an array");
    expect_error(server_->post(path, with_tools("get_weather")), "tools", "tools: expected an array");
    expect_error(server_->post(path, with_tools(json::array({"get_weather"}))), "tools[0]", "expected an object");
    expect_error(server_->post(path, with_tools(json::array({{{"type", "function"}, {"function", {{"description", "x"}}}}}))),
                 "tools[0].function.name", "tools[0].function.name: missing");
    expect_error(server_->post(path, with_tools(json::array({{{"type", "function"}, {"function", {{"name", "ok"}}}},
                                                              {{"type", "function"}, {"function", {{"name", 7}}}}}))),
                 "tools[1].function.name", "expected a string, got a number");
    expect_error(server_->post(path, with_tools(json::array({{{"type", "function"}, {"function", {{"name", ""}}}}}))),
                 "tools[0].function.name", "must not be empty");
    expect_error(server_->post(path, with_tools(json::array({{{"type", "function"}}}))), "tools[0].function",
                 "tools[0].function: missing");
    expect_error(server_->post(path, with_tools(json::array({{{"type", "retrieval"}, {"function", {{"name", "f"}}}}}))),
                 "tools[0].type", "expected \"function\"");
    expect_error(server_->post(path, with_tools(json::array({{{"type", "function"},
                                                              {"function", {{"name", "f"}, {"parameters", "none"}}}}}))),
                 "tools[0].function.parameters", "expected an object");
  }
  // The server still answers a well-formed request.
  const json ok = server_->post_ok("/v1/chat/completions",
                                   {{"messages", messages},
                                    {"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})},
                                    {"max_tokens", 2}});
  EXPECT_GE(ok["usage"]["completion_tokens"].get<int>(), 1);
}

// serve --chat-template NAME takes a built-in; a template that refuses the system role (Gemma 2)
// gets the system message folded into the first user message, with one warning at the first fold.
TEST(ServeTemplates, BuiltinNameAndSystemFolding) {
  test::TempDir tmp;
  const json conv = {{"messages", {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}}}};
  {
    test::ServeProcess llama3(test::repo_model("kjv-tiny"), {"--chat-template", "llama3"}, tmp.path / "llama3.err");
    ASSERT_GT(llama3.port, 0) << llama3.log();
    EXPECT_EQ(llama3.post_ok("/apply-template", conv)["prompt"],
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
              "Today Date: 26 Jul 2024\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    EXPECT_NE(llama3.log().find("chat template: built-in llama3"), std::string::npos) << llama3.log();
    EXPECT_EQ(llama3.stop(), 0);
  }
  const fs::path gemma2 = data_dir() / "chat_templates" / "google-gemma-2-2b-it.jinja";
  test::ServeProcess gemma(test::repo_model("kjv-tiny"), {"--chat-template", gemma2.string()}, tmp.path / "gemma.err");
  ASSERT_GT(gemma.port, 0) << gemma.log();
  const std::string warning = "refuses system messages";
  EXPECT_EQ(gemma.log().find(warning), std::string::npos) << "warned before any system message: " << gemma.log();
  // kjv-tiny's bos_token is <s>.
  const std::string folded = "<s><start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n";
  EXPECT_EQ(gemma.post_ok("/apply-template", conv)["prompt"], folded);
  EXPECT_EQ(gemma.post_ok("/apply-template", conv)["prompt"], folded);
  json gen = conv;
  gen["max_tokens"] = 2;
  EXPECT_GE(gemma.post_ok("/v1/chat/completions", gen)["usage"]["completion_tokens"].get<int>(), 1);
  const std::string log = gemma.log();
  EXPECT_NE(log.find(warning), std::string::npos) << log;
  EXPECT_EQ(log.find(warning), log.rfind(warning)) << "warned more than once: " << log;
  EXPECT_EQ(gemma.stop(), 0);
}

}  // namespace
}  // namespace ptllm
