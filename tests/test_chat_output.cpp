// The reply parser (engine/chat_output.h): each tool-call format on output written as the models
// write it, malformed output, reasoning, and the same result however the text is cut.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/chat_output.h"

namespace ptllm {
namespace {

using json = nlohmann::ordered_json;

struct Outcome {
  std::string content, reasoning;
  std::vector<ToolCall> calls;
};

ChatOutputOptions options(ToolCallFormat f, bool reasoning = false, bool in_reasoning = false) {
  ChatOutputOptions o;
  o.format.tools = f;
  o.format.reasoning = reasoning;
  o.format.short_ids = f == ToolCallFormat::Mistral;
  o.parse_tools = f != ToolCallFormat::None;
  o.parse_reasoning = reasoning;
  o.in_reasoning = in_reasoning;
  return o;
}

// Feeds `text` in pieces cut at `cuts`; checks the deltas add up to the parser's sums.
Outcome run(const ChatOutputOptions& o, const std::string& text, const std::vector<size_t>& cuts) {
  ChatOutputParser p(o);
  Outcome sum;
  const auto take = [&](const OutputDelta& d) {
    sum.content += d.content;
    sum.reasoning += d.reasoning;
    for (const ToolCall& c : d.calls) sum.calls.push_back(c);
  };
  size_t at = 0;
  for (size_t cut : cuts) {
    take(p.push(text.substr(at, cut - at)));
    at = cut;
  }
  take(p.push(text.substr(at)));
  take(p.finish());
  EXPECT_EQ(sum.content, p.content());
  EXPECT_EQ(sum.reasoning, p.reasoning());
  EXPECT_EQ(sum.calls.size(), p.calls().size());
  return sum;
}

// The whole text at once, then cut at every byte boundary, in one-byte pieces, and in two cuts at
// every pair of boundaries for short texts: every way gives the one-shot result.
Outcome parse_everyhow(const ChatOutputOptions& o, const std::string& text) {
  const Outcome whole = run(o, text, {});
  const auto same = [&](const Outcome& x, const std::string& how) {
    EXPECT_EQ(x.content, whole.content) << how;
    EXPECT_EQ(x.reasoning, whole.reasoning) << how;
    EXPECT_EQ(x.calls.size(), whole.calls.size()) << how;
    for (size_t i = 0; i < std::min(x.calls.size(), whole.calls.size()); ++i) {
      EXPECT_EQ(x.calls[i].name, whole.calls[i].name) << how;
      EXPECT_EQ(x.calls[i].arguments, whole.calls[i].arguments) << how;
    }
  };
  for (size_t i = 1; i < text.size(); ++i) same(run(o, text, {i}), "cut at " + std::to_string(i));
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  same(run(o, text, bytes), "one byte at a time");
  if (text.size() <= 120)
    for (size_t i = 1; i < text.size(); ++i)
      for (size_t j = i + 1; j < text.size(); ++j) same(run(o, text, {i, j}), "cuts at " + std::to_string(i) + "," + std::to_string(j));
  return whole;
}

void expect_call(const ToolCall& c, const std::string& name, const json& args) {
  EXPECT_EQ(c.name, name);
  EXPECT_EQ(json::parse(c.arguments), args) << c.arguments;
  EXPECT_FALSE(c.id.empty());
}

TEST(ChatOutput, HermesOneCall) {
  const auto r = parse_everyhow(options(ToolCallFormat::Hermes),
                                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "get_weather", {{"city", "Paris"}});
  EXPECT_TRUE(r.calls[0].id.starts_with("call_"));
}

TEST(ChatOutput, HermesTextThenParallelCalls) {
  const std::string text =
      "Let me check both cities.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\", \"h24\": true}}\n</tool_call>";
  const auto r = parse_everyhow(options(ToolCallFormat::Hermes), text);
  EXPECT_EQ(r.content, "Let me check both cities.");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[0], "get_weather", {{"city", "Paris"}});
  expect_call(r.calls[1], "get_time", {{"tz", "Europe/Paris"}, {"h24", true}});
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
}

TEST(ChatOutput, HermesMarkersInsideStringsAndNoCalls) {
  // A closing marker inside the JSON's string would end the call early: Hermes has no escape for it,
  // so the call is malformed and comes back as text.
  const auto r = parse_everyhow(options(ToolCallFormat::Hermes),
                                "<tool_call>{\"name\": \"echo\", \"arguments\": {\"s\": \"</tool_call>\"}}</tool_call>");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_NE(r.content.find("<tool_call>"), std::string::npos);
  // Plain text passes through byte for byte, its final newline included.
  const auto plain = parse_everyhow(options(ToolCallFormat::Hermes), "The weather is <b>fine</b>.\n\n");
  EXPECT_EQ(plain.content, "The weather is <b>fine</b>.\n\n");
  EXPECT_TRUE(plain.calls.empty());
}

TEST(ChatOutput, MalformedCallsAreText) {
  for (const std::string& text : {
           std::string("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par"),  // unclosed
           std::string("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }}\n</tool_call>"),  // bad JSON
           std::string("<tool_call>\n{\"arguments\": {}}\n</tool_call>"),  // no name
           std::string("<tool_call>\n[1, 2]\n</tool_call>"),
       }) {
    const auto r = parse_everyhow(options(ToolCallFormat::Hermes), text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text.substr(0, text.find_last_not_of("\n") + 1)) << text;
  }
  // A good call after a bad one is still a call.
  const auto r = parse_everyhow(options(ToolCallFormat::Hermes),
                                "<tool_call>oops</tool_call><tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "<tool_call>oops</tool_call>");
}

TEST(ChatOutput, ArgumentsAsAString) {
  const auto r = parse_everyhow(options(ToolCallFormat::Hermes),
                                "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "f", {{"x", 1}});
}

TEST(ChatOutput, Llama3Json) {
  const auto r = parse_everyhow(options(ToolCallFormat::Llama3),
                                "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}");
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "get_weather", {{"city", "Paris"}, {"unit", "celsius"}});
  EXPECT_EQ(r.content, "");
  const auto tagged = parse_everyhow(options(ToolCallFormat::Llama3),
                                     "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"n\": 2}}");
  ASSERT_EQ(tagged.calls.size(), 2u);
  expect_call(tagged.calls[1], "b", {{"n", 2}});
  // JSON that is not a call, and text, are content.
  EXPECT_EQ(parse_everyhow(options(ToolCallFormat::Llama3), "{\"answer\": 42}").content, "{\"answer\": 42}");
  EXPECT_EQ(parse_everyhow(options(ToolCallFormat::Llama3), "It is {sunny} today.").content, "It is {sunny} today.");
}

TEST(ChatOutput, MistralArrayForm) {
  const auto r = parse_everyhow(options(ToolCallFormat::Mistral),
                                "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
                                "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}, \"id\": \"abcDEF123\"}]");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[0], "get_weather", {{"city", "Paris"}});
  EXPECT_EQ(r.calls[0].id.size(), 9u);
  EXPECT_EQ(r.calls[1].id, "abcDEF123");
  EXPECT_EQ(r.content, "");
}

TEST(ChatOutput, MistralNameArgsForm) {
  const auto r = parse_everyhow(options(ToolCallFormat::Mistral),
                                "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"q\": \"a]b}\"}"
                                "[TOOL_CALLS]get_time[CALL_ID]x1y2z3w4v[ARGS]{}");
  EXPECT_EQ(r.content, "Checking.");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[0], "get_weather", {{"city", "Paris"}, {"q", "a]b}"}});
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.calls[1].id, "x1y2z3w4v");
  const auto bad = parse_everyhow(options(ToolCallFormat::Mistral), "[TOOL_CALLS]f[ARGS]not json");
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.content, "[TOOL_CALLS]f[ARGS]not json");
}

TEST(ChatOutput, Qwen3CoderXml) {
  ChatOutputOptions o = options(ToolCallFormat::Qwen3Coder);
  o.tools = json::parse(R"([{"type": "function", "function": {"name": "edit", "parameters": {"type": "object",
      "properties": {"path": {"type": "string"}, "line": {"type": "integer"}, "text": {"type": "string"},
      "opts": {"type": "object"}}}}}])");
  const auto r = parse_everyhow(o,
                                "I will edit it.\n<tool_call>\n<function=edit>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
                                "<parameter=line>\n12\n</parameter>\n<parameter=text>\n42\n</parameter>\n"
                                "<parameter=opts>\n{\"dry\": true}\n</parameter>\n</function>\n</tool_call>");
  EXPECT_EQ(r.content, "I will edit it.");
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "edit", {{"path", "src/a.py"}, {"line", 12}, {"text", "42"}, {"opts", {{"dry", true}}}});
}

TEST(ChatOutput, Reasoning) {
  const auto r = parse_everyhow(options(ToolCallFormat::Hermes, true),
                                "<think>\nThe user wants Paris.\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(r.reasoning, "\nThe user wants Paris.\n");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  // The prompt opened <think> (DeepSeek-R1): the reply starts in it.
  const auto open = parse_everyhow(options(ToolCallFormat::None, true, true), "Hmm, 2+2.\n</think>\n\nIt is 4.");
  EXPECT_EQ(open.reasoning, "Hmm, 2+2.\n");
  EXPECT_EQ(open.content, "It is 4.");
  // Cut off while thinking: all of it is reasoning.
  const auto cut = parse_everyhow(options(ToolCallFormat::None, true), "<think>still going");
  EXPECT_EQ(cut.reasoning, "still going");
  EXPECT_EQ(cut.content, "");
  // Reasoning off: the tags are text.
  EXPECT_EQ(parse_everyhow(options(ToolCallFormat::None, false), "<think>x</think>y").content, "<think>x</think>y");
  // A <think> later in the reply is text.
  EXPECT_EQ(parse_everyhow(options(ToolCallFormat::None, true), "a <think>b</think>").content, "a <think>b</think>");
}

TEST(ChatOutput, OneCallWhenParallelCallsAreOff) {
  ChatOutputOptions o = options(ToolCallFormat::Hermes);
  o.max_calls = 1;
  const auto r = parse_everyhow(o, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n"
                                   "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(r.content, "");
}

TEST(ChatOutput, ToolsOffIsPlainText) {
  ChatOutputOptions o = options(ToolCallFormat::Hermes);
  o.parse_tools = false;
  const std::string text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n";
  const auto r = parse_everyhow(o, text);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, text);
}

// Linear work: a long reply in one-token pieces.
TEST(ChatOutput, LongReplyInSmallPieces) {
  std::string args = "{\"text\": \"";
  for (int i = 0; i < 20000; ++i) args += "word ";
  args += "\"}";
  const std::string text = "<tool_call>{\"name\": \"write\", \"arguments\": " + args + "}</tool_call>";
  ChatOutputParser p(options(ToolCallFormat::Hermes));
  size_t calls = 0;
  for (size_t i = 0; i < text.size(); i += 3) calls += p.push(text.substr(i, 3)).calls.size();
  calls += p.finish().calls.size();
  EXPECT_EQ(calls, 1u);
  ChatOutputParser m(options(ToolCallFormat::Mistral));
  const std::string mtext = "[TOOL_CALLS]write[ARGS]" + args;
  for (size_t i = 0; i < mtext.size(); i += 3) calls += m.push(mtext.substr(i, 3)).calls.size();
  calls += m.finish().calls.size();
  EXPECT_EQ(calls, 2u);
}

std::string read_template(const std::string& name) {
  std::ifstream f(std::filesystem::path(PTLLM_SOURCE_DIR) / "tests/data/chat_templates" / name);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(ChatOutput, FormatFromTheTemplate) {
  struct Case {
    const char* file;
    ToolCallFormat tools;
    bool reasoning;
  };
  for (const Case& c : {Case{"Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallFormat::Hermes, false},
                        Case{"Qwen-Qwen3-0.6B.jinja", ToolCallFormat::Hermes, true},
                        Case{"Qwen-QwQ-32B.jinja", ToolCallFormat::Hermes, true},
                        Case{"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolCallFormat::Hermes, false},
                        Case{"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolCallFormat::Llama3, false},
                        Case{"meta-llama-Llama-3.2-3B-Instruct.jinja", ToolCallFormat::Llama3, false},
                        Case{"meta-llama-Llama-3.3-70B-Instruct.jinja", ToolCallFormat::Llama3, false},
                        Case{"mistralai-Mistral-7B-Instruct-v0.3.jinja", ToolCallFormat::Mistral, false},
                        Case{"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolCallFormat::Mistral, false},
                        Case{"Mistral-Small-3.2-24B-Instruct-2506.jinja", ToolCallFormat::Mistral, false},
                        Case{"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", ToolCallFormat::Hermes, true}}) {
    const std::string src = read_template(c.file);
    ASSERT_FALSE(src.empty()) << c.file;
    const OutputFormat f = detect_output_format(src);
    EXPECT_EQ(tool_call_format_name(f.tools), std::string(tool_call_format_name(c.tools))) << c.file;
    EXPECT_EQ(f.reasoning, c.reasoning) << c.file;
    EXPECT_EQ(f.short_ids, c.tools == ToolCallFormat::Mistral) << c.file;
  }
  // --tool-call-format overrides the template's syntax; the marker of Mistral and Llama 3 is a special
  // token, kept as text only when calls are parsed.
  const OutputFormat forced = detect_output_format(read_template("Qwen-Qwen2.5-7B-Instruct.jinja"), "mistral");
  EXPECT_EQ(forced.tools, ToolCallFormat::Mistral);
  EXPECT_TRUE(forced.short_ids);
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  EXPECT_TRUE(needs_special_text(chat_output_options(forced, true, tools, true, "")));
  EXPECT_FALSE(needs_special_text(chat_output_options(forced, true, json(), true, "")));
  EXPECT_EQ(chat_output_options(forced, true, tools, false, "").max_calls, 1u);
  EXPECT_TRUE(prompt_opens_reasoning("<｜Assistant｜><think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_EQ(tool_call_format_from_name("qwen3-coder"), ToolCallFormat::Qwen3Coder);
  EXPECT_FALSE(tool_call_format_from_name("gpt"));
}

}  // namespace
}  // namespace ptllm
