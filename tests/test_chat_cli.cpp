// posttrainllm template, run as a user would: --jsonl in, one JSON string (or {"error": ...}) per
// line out; --messages for one rendering; exit code 1 with the file (and line) for bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace fs = std::filesystem;

namespace {

struct CliResult {
  int code;
  std::string out;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// stderr is merged into out when `with_stderr`.
CliResult run(const std::vector<std::string>& args, bool with_stderr = false) {
  std::string cmd = quote(PTLLM_BINARY) + " template";
  for (const auto& a : args) cmd += " " + quote(a);
  cmd += with_stderr ? " 2>&1" : " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  CliResult r{-1, ""};
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The tests' files, in one directory removed when the test program exits.
const fs::path& temp_dir() {
  static const ptllm::test::TempDir dir;
  return dir.path;
}

fs::path temp_file(const std::string& name, const std::string& content) {
  const fs::path p = temp_dir() / name;
  std::ofstream(p, std::ios::binary) << content;
  return p;
}

const std::string kChatml =
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    "{% if flag is defined %}[{{ flag }}]{% endif %}";

TEST(TemplateCli, JsonlOneLinePerConversation) {
  const fs::path t = temp_file("chatml.jinja", kChatml);
  const fs::path in = temp_file("in.jsonl",
      R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true})" "\n"
      "\n"
      R"({"messages": [{"role": "user", "content": "é {{ x }}"}], "kwargs": {"flag": 1}})" "\n");
  const CliResult r = run({t.string(), "--jsonl", in.string()});
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "\"<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n\"\n"
                   "\"<|im_start|>user\\né {{ x }}<|im_end|>\\n[1]\"\n");
}

TEST(TemplateCli, RefusedConversationIsAnErrorLine) {
  const fs::path t = temp_file("strict.jinja", "{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}ok");
  const fs::path in = temp_file("in2.jsonl",
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})" "\n"
      R"({"messages": [{"role": "user", "content": "a"}]})" "\n");
  const CliResult r = run({t.string(), "--jsonl", in.string()});
  EXPECT_EQ(r.code, 0);
  const auto nl = r.out.find('\n');
  ASSERT_NE(nl, std::string::npos);
  const auto first = nlohmann::json::parse(r.out.substr(0, nl));
  EXPECT_NE(first["error"].get<std::string>().find("one message only"), std::string::npos);
  EXPECT_EQ(r.out.substr(nl + 1), "\"ok\"\n");
}

TEST(TemplateCli, MessagesFileAndFlags) {
  const fs::path t = temp_file("chatml2.jinja", kChatml);
  const fs::path m = temp_file("msgs.json", R"([{"role": "user", "content": "hi"}])");
  CliResult r = run({t.string(), "--messages", m.string(), "--add-generation-prompt", "--chat-template-kwargs", R"({"flag": "on"})"});
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n[on]");
  const fs::path cfg_dir = temp_dir() / "config";
  fs::create_directories(cfg_dir);
  std::ofstream(cfg_dir / "tokenizer_config.json") << nlohmann::json{{"chat_template", "{{ bos_token }}{{ strftime_now('%Y') }}"}, {"bos_token", "<s>"}}.dump();
  r = run({cfg_dir.string(), "--messages", m.string(), "--now", "1721995200"});
  EXPECT_EQ(r.out, "<s>2024");
  r = run({(cfg_dir / "tokenizer_config.json").string(), "--messages", m.string(), "--now", "0"});
  EXPECT_EQ(r.out, "<s>1970");
  // A built-in template by name, as chat and serve take it.
  r = run({"phi3", "--messages", m.string(), "--add-generation-prompt"});
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "<|user|>\nhi<|end|>\n<|assistant|>\n");
  fs::remove_all(cfg_dir);
}

// The test corpus through the command: every line as Jinja2 rendered it (or refused it).
TEST(TemplateCli, RealTemplateOverTheCaseFile) {
  const std::string data = std::string(PTLLM_SOURCE_DIR) + "/tests/data/";
  const std::string name = "Qwen-Qwen3-0.6B.jinja";
  const CliResult r = run({data + "chat_templates/" + name, "--jsonl", data + "chat_cases.jsonl", "--now", "1721995200",
                           "--chat-template-kwargs", R"({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})"});
  ASSERT_EQ(r.code, 0);
  std::vector<nlohmann::json> want;
  std::ifstream exp(data + "chat_expected.jsonl");
  for (std::string line; std::getline(exp, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["template"] == name) want.push_back(j);
  }
  std::istringstream got(r.out);
  size_t i = 0;
  for (std::string line; std::getline(got, line); ++i) {
    ASSERT_LT(i, want.size());
    const auto j = nlohmann::json::parse(line);
    if (want[i].contains("error")) {
      EXPECT_TRUE(j.is_object() && j.contains("error")) << line;
    } else {
      EXPECT_EQ(j, want[i]["output"]) << want[i]["case"];
    }
  }
  EXPECT_EQ(i, want.size());
}

TEST(TemplateCli, ErrorsNameTheFileAndLine) {
  const fs::path t = temp_file("chatml3.jinja", kChatml);
  CliResult r = run({"/nonexistent/x.jinja", "--messages", t.string()}, true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("/nonexistent/x.jinja: cannot open"), std::string::npos);
  const fs::path bad = temp_file("bad.jsonl", "{\"messages\": []}\n{oops\n");
  r = run({t.string(), "--jsonl", bad.string()}, true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find(bad.string() + ":2: not valid JSON"), std::string::npos);
  const fs::path nomsg = temp_file("nomsg.jsonl", "{\"tools\": []}\n");
  r = run({t.string(), "--jsonl", nomsg.string()}, true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find(":1: messages: expected a list"), std::string::npos);
  const fs::path badjson = temp_file("bad.json", "[");
  r = run({t.string(), "--messages", badjson.string()}, true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("bad.json: not valid JSON"), std::string::npos);
  const fs::path syntax = temp_file("syntax.jinja", "ok\n{% for %}");
  r = run({syntax.string(), "--messages", badjson.string()}, true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("syntax.jinja, line 2"), std::string::npos);
  EXPECT_EQ(run({t.string()}).code, 2);  // neither --jsonl nor --messages
  EXPECT_EQ(run({t.string(), "--messages", t.string(), "--chat-template-kwargs", "[1]"}).code, 2);
}

}  // namespace
