// Real Hugging Face chat templates (tests/data/chat_templates/) over a set of conversations
// (tests/data/chat_cases.jsonl), compared byte for byte with Jinja2's renderings
// (tests/data/chat_expected.jsonl, written by scripts/render_chat_templates.py with
// transformers' environment); and the ChatTemplate API: loading, named templates, tokens.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "chat/chat_template.h"
#include "test_util.h"

namespace fs = std::filesystem;
using ptllm::chat::ChatRequest;
using ptllm::chat::ChatTemplate;
using ptllm::chat::Json;

namespace {

constexpr std::time_t kChatFixedNow = 1721995200;  // FIXED_NOW of scripts/render_chat_templates.py

fs::path data_dir() { return ptllm::test::repo_dir() / "tests" / "data"; }

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<Json> read_jsonl(const fs::path& p) {
  std::vector<Json> rows;
  std::istringstream in(read_text(p));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(Json::parse(line));
  return rows;
}

ChatRequest request_of(const Json& c) {
  ChatRequest r;
  r.messages = c.at("messages");
  if (c.contains("tools")) r.tools = c["tools"];
  r.add_generation_prompt = c.value("add_generation_prompt", false);
  if (c.contains("kwargs")) r.kwargs = c["kwargs"];
  return r;
}

struct Corpus {
  Json manifest;
  std::map<std::string, Json> cases;
  std::vector<Json> expected;
  std::map<std::string, ChatTemplate> templates;
  Corpus() {
    manifest = Json::parse(read_text(data_dir() / "chat_templates" / "manifest.json"));
    for (auto& c : read_jsonl(data_dir() / "chat_cases.jsonl")) cases[c["name"].get<std::string>()] = c;
    expected = read_jsonl(data_dir() / "chat_expected.jsonl");
    for (const auto& [name, tokens] : manifest.items())
      templates.emplace(name, ChatTemplate::from_string(read_text(data_dir() / "chat_templates" / name), name, tokens));
  }
};

const Corpus& corpus() {
  static const Corpus c;
  return c;
}

TEST(ChatTemplates, RealTemplatesRenderAsJinja2) {
  const Corpus& c = corpus();
  ASSERT_EQ(c.expected.size(), c.manifest.size() * c.cases.size());
  ptllm::chat::RenderOptions opt;
  opt.now = kChatFixedNow;
  size_t same = 0, refused = 0;
  for (const Json& row : c.expected) {
    const std::string tname = row["template"], cname = row["case"];
    SCOPED_TRACE(tname + " / " + cname);
    const ChatTemplate& t = c.templates.at(tname);
    const ChatRequest req = request_of(c.cases.at(cname));
    if (row.contains("error")) {
      // Jinja2 refuses it: so must we; a raise_exception message comes through word for word.
      const std::string py = row["error"];
      try {
        t.render(req, opt);
        ADD_FAILURE() << "rendered, but Jinja2 raised: " << py;
      } catch (const ptllm::chat::TemplateError& e) {
        if (read_text(data_dir() / "chat_templates" / tname).find(py) != std::string::npos) {
          EXPECT_EQ(e.message, py);
        }
        ++refused;
      }
      continue;
    }
    std::string got;
    ASSERT_NO_THROW(got = t.render(req, opt));
    EXPECT_EQ(got, row["output"].get<std::string>());
    same += got == row["output"].get<std::string>();
  }
  std::printf("[ chat ] %zu templates x %zu cases: %zu byte-identical renderings, %zu refused as Jinja2 refuses\n",
              c.manifest.size(), c.cases.size(), same, refused);
}

// A conversation every built-in template handles: system/user/assistant turns of text, no tools, no
// variables that replace the special tokens (the built-ins write the tokens themselves).
bool plain_case(const Json& c) {
  if (c.contains("tools") && !c["tools"].is_null()) return false;
  if (c.contains("kwargs"))
    for (const auto& [k, v] : c["kwargs"].items())
      if (k.size() > 6 && k.compare(k.size() - 6, 6, "_token") == 0) return false;
  for (const Json& m : c["messages"]) {
    const std::string role = m.value("role", "");
    if (m.size() != 2 || !m.contains("content") || !m["content"].is_string()) return false;
    if (role != "system" && role != "user" && role != "assistant") return false;
  }
  return true;
}

// Each built-in renders what its model's own template renders, wherever that one renders at all.
TEST(ChatBuiltinTemplates, RenderAsTheModelsOwnTemplate) {
  const Corpus& c = corpus();
  const std::map<std::string, std::string> model_of = {
      {"llama3", "meta-llama-Llama-3.1-8B-Instruct.jinja"},
      {"mistral-v7", "Mistral-Small-3.2-24B-Instruct-2506.jinja"},
      {"qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja"},
      {"gemma", "google-gemma-3-4b-it.jinja"},
      {"phi3", "microsoft-Phi-3.5-mini-instruct.jinja"}};
  ptllm::chat::RenderOptions opt;
  opt.now = kChatFixedNow;
  for (const auto& [name, real_name] : model_of) {
    const char* source = ptllm::chat::builtin_template_source(name);
    ASSERT_NE(source, nullptr) << name;
    const ChatTemplate builtin = ChatTemplate::from_string(source, "built-in " + name);
    const ChatTemplate& real = c.templates.at(real_name);
    size_t same = 0;
    for (const auto& [cname, cs] : c.cases) {
      if (!plain_case(cs)) continue;
      SCOPED_TRACE(name + " / " + cname);
      const ChatRequest req = request_of(cs);
      std::string want;
      try {
        want = real.render(req, opt);
      } catch (const ptllm::chat::TemplateError&) {
        continue;  // the model's template refuses it (roles not alternating): nothing to match
      }
      EXPECT_EQ(builtin.render(req, opt), want);
      ++same;
    }
    EXPECT_GE(same, 15u) << name;
  }
  // qwen2.5 is Qwen's own template, tools included.
  EXPECT_EQ(std::string(ptllm::chat::builtin_template_source("qwen2.5")),
            read_text(data_dir() / "chat_templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"));
}

TEST(ChatBuiltinTemplates, ChatmlAndNames) {
  EXPECT_EQ(ptllm::chat::builtin_template_names(),
            (std::vector<std::string>{"chatml", "llama3", "mistral-v7", "qwen2.5", "gemma", "phi3"}));
  EXPECT_EQ(ptllm::chat::builtin_template_source("llama-3"), nullptr);
  const ChatTemplate t = ChatTemplate::from_string(ptllm::chat::builtin_template_source("chatml"));
  ChatRequest r = request_of(corpus().cases.at("multi_turn"));
  EXPECT_EQ(t.render(r),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\nHello! How can I help you today?<|im_end|>\n<|im_start|>user\nTell me a joke."
            "<|im_end|>\n<|im_start|>assistant\n");
  r.add_generation_prompt = false;
  r.messages = Json::parse(R"([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])");
  EXPECT_EQ(t.render(r), "<|im_start|>user\nab<|im_end|>\n");
}

// Gemma 2 raises on a system message; Gemma 3 folds it itself; the others take it.
TEST(ChatSystemRole, ProbeFindsTemplatesThatRefuseIt) {
  const Corpus& c = corpus();
  EXPECT_TRUE(c.templates.at("google-gemma-2-2b-it.jinja").refuses_system_role());
  EXPECT_FALSE(c.templates.at("google-gemma-3-4b-it.jinja").refuses_system_role());
  EXPECT_FALSE(c.templates.at("meta-llama-Llama-3.1-8B-Instruct.jinja").refuses_system_role());
  EXPECT_FALSE(c.templates.at("mistralai-Mistral-7B-Instruct-v0.3.jinja").refuses_system_role());
  // A template that refuses everything is not about the system role.
  EXPECT_FALSE(ChatTemplate::from_string("{{ raise_exception('no') }}").refuses_system_role());
}

// Folded, Gemma 2 renders what Gemma 3 renders with the system message.
TEST(ChatSystemRole, FoldedSystemMessageOpensTheFirstUserTurn) {
  const Corpus& c = corpus();
  ChatRequest r = request_of(c.cases.at("multi_turn"));
  const std::string gemma3 = c.templates.at("google-gemma-3-4b-it.jinja").render(r);
  EXPECT_THROW(c.templates.at("google-gemma-2-2b-it.jinja").render(r), ptllm::chat::TemplateError);
  r.messages = ptllm::chat::fold_system_message(r.messages);
  EXPECT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0]["content"], "You are a helpful assistant.\n\nHi there");
  EXPECT_EQ(c.templates.at("google-gemma-2-2b-it.jinja").render(r), gemma3);

  const Json parts = Json::parse(R"([{"role": "system", "content": [{"type": "text", "text": "S"}]},
                                      {"role": "user", "content": [{"type": "text", "text": "U"}]}])");
  EXPECT_EQ(ptllm::chat::fold_system_message(parts).dump(),
            R"([{"role":"user","content":[{"type":"text","text":"S\n\n"},{"type":"text","text":"U"}]}])");
  const Json alone = Json::parse(R"([{"role": "system", "content": "S"}])");
  EXPECT_EQ(ptllm::chat::fold_system_message(alone), alone);  // no user turn: left to the template
  const Json none = Json::parse(R"([{"role": "user", "content": "U"}])");
  EXPECT_EQ(ptllm::chat::fold_system_message(none), none);
}

// Not a benchmark: one figure for docs/chat.md (below ~1 ms per conversation is fine).
TEST(ChatTemplates, RenderTimeLlama31LongConversation) {
  const Corpus& c = corpus();
  const ChatTemplate& t = c.templates.at("meta-llama-Llama-3.1-8B-Instruct.jinja");
  const ChatRequest req = request_of(c.cases.at("long_conversation"));  // system + 10 turns + 1
  ptllm::chat::RenderOptions opt;
  opt.now = kChatFixedNow;
  std::string out = t.render(req, opt);
  const int n = 200;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) out = t.render(req, opt);
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
  std::printf("[ chat ] Llama 3.1 template, %zu messages, %zu bytes out: %.1f us per render\n",
              req.messages.size(), out.size(), us);
  EXPECT_GT(out.size(), 500u);
}

void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

TEST(ChatTemplateLoad, TokenizerConfigWithAddedTokens) {
  ptllm::test::TempDir dir;
  Json cfg = {{"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}, {"lstrip", false}}},
              {"eos_token", "</s>"},
              {"pad_token", nullptr},
              {"chat_template", "{{ bos_token }}|{{ eos_token }}|{{ pad_token is defined }}|{{ messages[0].content }}"}};
  write(dir.path / "tokenizer_config.json", cfg.dump());
  ChatRequest r;
  r.messages = Json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(ChatTemplate::load(dir.path.string()).render(r), "<s>|</s>|False|hi");
  EXPECT_EQ(ChatTemplate::load((dir.path / "tokenizer_config.json").string()).render(r), "<s>|</s>|False|hi");
  EXPECT_EQ(ChatTemplate::load(dir.path.string()).special_tokens().dump(), R"({"bos_token":"<s>","eos_token":"</s>"})");
  // Extra variables override the tokens, as transformers' **kwargs do.
  r.kwargs = {{"bos_token", "<B>"}};
  EXPECT_EQ(ChatTemplate::load(dir.path.string()).render(r), "<B>|</s>|False|hi");
}

TEST(ChatTemplateLoad, ChatTemplateJinjaWinsInADirectory) {
  ptllm::test::TempDir dir;
  write(dir.path / "tokenizer_config.json", Json{{"eos_token", "E"}, {"chat_template", "old"}}.dump());
  write(dir.path / "chat_template.jinja", "new {{ eos_token }}\n");
  EXPECT_EQ(ChatTemplate::load(dir.path.string()).render({}), "new E");
  EXPECT_EQ(ChatTemplate::load((dir.path / "chat_template.jinja").string()).render({}), "new ");
}

TEST(ChatTemplateLoad, NamedTemplatesPickToolUseWithTools) {
  Json cfg = {{"chat_template", Json::array({Json{{"name", "default"}, {"template", "D{{ tools is none }}"}},
                                             Json{{"name", "tool_use"}, {"template", "T{{ tools|length }}"}}})}};
  const ChatTemplate t = ChatTemplate::from_config(cfg, "cfg");
  EXPECT_EQ(t.template_names(), (std::vector<std::string>{"default", "tool_use"}));
  ChatRequest r;
  EXPECT_EQ(t.render(r), "DTrue");
  r.tools = Json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  EXPECT_EQ(t.render(r), "T1");
  r.template_name = "default";
  EXPECT_EQ(t.render(r), "DFalse");
  r.template_name = "nope";
  EXPECT_THROW(t.render(r), ptllm::Error);
  Json no_default = {{"chat_template", Json::array({Json{{"name", "a"}, {"template", "A"}}, Json{{"name", "b"}, {"template", "B"}}})}};
  EXPECT_THROW(ChatTemplate::from_config(no_default, "cfg").render({}), ptllm::Error);
}

TEST(ChatTemplateLoad, ErrorsNameTheFile) {
  ptllm::test::TempDir dir;
  auto message = [](const std::string& path) {
    try {
      ChatTemplate::load(path);
    } catch (const ptllm::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message((dir.path / "missing.jinja").string()).find("missing.jinja: cannot open"), std::string::npos);
  EXPECT_NE(message(dir.path.string()).find("no tokenizer_config.json"), std::string::npos);
  write(dir.path / "tokenizer_config.json", "{not json");
  EXPECT_NE(message(dir.path.string()).find("tokenizer_config.json: not valid JSON"), std::string::npos);
  write(dir.path / "tokenizer_config.json", R"({"eos_token": "x"})");
  EXPECT_NE(message(dir.path.string()).find("chat_template: missing"), std::string::npos);
  write(dir.path / "tokenizer_config.json", R"({"chat_template": [{"name": 1}]})");
  EXPECT_NE(message(dir.path.string()).find("chat_template[0]"), std::string::npos);
  write(dir.path / "tokenizer_config.json", R"({"chat_template": "ok", "bos_token": 5})");
  EXPECT_NE(message(dir.path.string()).find("bos_token"), std::string::npos);
  write(dir.path / "bad.jinja", "line 1\n{% if %}\n");
  EXPECT_NE(message((dir.path / "bad.jinja").string()).find("bad.jinja, line 2"), std::string::npos);
}

TEST(ChatTemplateRender, RaiseExceptionNamesTemplateAndMessage) {
  const ChatTemplate t = ChatTemplate::from_string("a\n{{ raise_exception('roles must alternate') }}", "my.jinja");
  try {
    t.render({});
    FAIL();
  } catch (const ptllm::chat::TemplateError& e) {
    EXPECT_EQ(std::string(e.what()), "template my.jinja, line 2: roles must alternate");
    EXPECT_EQ(e.message, "roles must alternate");
    EXPECT_EQ(e.line, 2);
  }
}

TEST(ChatTemplateRender, StrftimeNowUsesTheInjectedClock) {
  const ChatTemplate t = ChatTemplate::from_string("{{ strftime_now('%d %b %Y') }}");
  ptllm::chat::RenderOptions opt;
  opt.now = kChatFixedNow;
  EXPECT_EQ(t.render({}, opt), "26 Jul 2024");
  EXPECT_EQ(t.render({}).size(), 11u);  // today, local time
}

}  // namespace
