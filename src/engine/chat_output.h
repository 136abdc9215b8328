#pragma once
// A chat reply split into what an API returns: content, reasoning (<think>...</think>) and tool
// calls, over text that arrives in pieces. The format is read from the chat template, as llama.cpp
// derives it (detect_output_format); a server flag may override it.
//
// The split does not depend on how the text was cut: the deltas of any sequence of push() calls
// followed by finish() add up to the same content, reasoning and calls. A call is handed out whole,
// once its closing marker (or the end of its JSON) has arrived and it parsed, so malformed output
// (an unclosed tag, invalid JSON) is returned as content and never as half a call. Work per reply is
// linear in its length: each byte is scanned a bounded number of times.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ptllm {

enum class ToolCallFormat {
  None,        // no calls parsed
  Hermes,      // <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Hermes, Qwen2.5, Qwen3)
  Llama3,      // a reply that is {"name": ..., "parameters": {...}} (Llama 3.1-3.3, <|python_tag|> too)
  Mistral,     // [TOOL_CALLS][{...}] (v0.3, Nemo) and [TOOL_CALLS]name[ARGS]{...} (Small 3.2, Devstral)
  Qwen3Coder,  // <tool_call><function=name><parameter=p>value</parameter></function></tool_call>
};
const char* tool_call_format_name(ToolCallFormat f);  // "none", "hermes", "llama3", "mistral", "qwen3-coder"
std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name);

struct OutputFormat {
  ToolCallFormat tools = ToolCallFormat::Hermes;
  bool reasoning = false;  // the model writes <think>...</think> first
  bool short_ids = false;  // call ids of 9 alphanumerics (Mistral's templates refuse others)
  bool name_args = false;  // Mistral's calls written [TOOL_CALLS]name[ARGS]{...}, not as a JSON list
};
// What a chat template's source says of its model's replies. A template that shows no known
// tool-call syntax gets Hermes, the most common one among fine-tunes. `tool_call_format` other than
// "auto" (a tool_call_format_name) overrides the template's tool-call syntax.
OutputFormat detect_output_format(std::string_view template_source, std::string_view tool_call_format = "auto");

// Whether a rendered prompt ends inside an open <think> (DeepSeek-R1 and QwQ's generation prompts
// open it, so the reply starts in the reasoning).
bool prompt_opens_reasoning(std::string_view prompt);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct OutputDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> calls;  // calls completed by this piece, whole
  bool empty() const { return content.empty() && reasoning.empty() && calls.empty(); }
  void append(OutputDelta&& d);
};

struct ChatOutputOptions {
  OutputFormat format;
  bool parse_tools = false;      // the request has tools and tool_choice is not "none"
  bool parse_reasoning = false;  // format.reasoning and the request did not ask for none
  bool in_reasoning = false;     // the prompt opened <think> (prompt_opens_reasoning)
  size_t max_calls = std::numeric_limits<size_t>::max();  // 1 for parallel_tool_calls: false
  // The request's tools: Qwen3-Coder's parameter values are typed by their schemas.
  nlohmann::ordered_json tools;
};

// How one reply is read: calls parsed when `tools` is a non-empty list (null or empty: none, as for
// tool_choice "none"), reasoning split when the format has it and `reasoning` is on, starting inside
// it when `prompt` opened it; at most one call unless `parallel_calls`.
ChatOutputOptions chat_output_options(const OutputFormat& format, bool reasoning, const nlohmann::ordered_json& tools,
                                      bool parallel_calls, std::string_view prompt);
// Whether the reply's special tokens must be kept as text for the parser: the format's marker is a
// special token (Mistral's [TOOL_CALLS], Llama 3's <|python_tag|>).
bool needs_special_text(const ChatOutputOptions& o);

// `prefix` then `n` random letters and digits (call ids, response ids).
std::string random_alnum_id(std::string_view prefix, int n);

class ChatOutputParser {
 public:
  explicit ChatOutputParser(ChatOutputOptions o);
  // Text that arrived; returns what is now certain.
  OutputDelta push(std::string_view text);
  // The reply ended: everything held back is settled.
  OutputDelta finish();

  // The sums of every delta so far.
  const std::string& content() const { return content_; }
  const std::string& reasoning() const { return reasoning_; }
  const std::vector<ToolCall>& calls() const { return calls_; }

 private:
  enum class State { Start, Reasoning, Text, Call, Llama3, Ignore };
  void run(bool final, OutputDelta& d);
  bool step_start(bool final, OutputDelta& d);
  bool step_reasoning(bool final, OutputDelta& d);
  bool step_text(bool final, OutputDelta& d);
  bool step_call(bool final, OutputDelta& d);
  bool step_llama3(bool final, OutputDelta& d);
  void emit_content(std::string_view s, OutputDelta& d);
  void emit_reasoning(std::string_view s, OutputDelta& d);
  void add_call(std::string name, std::string arguments, std::string id, OutputDelta& d);
  void malformed(bool final, OutputDelta& d);  // the call's marker (and at the end its text) becomes content

  ChatOutputOptions o_;
  State state_ = State::Start;
  std::string buf_;        // text not yet settled
  size_t scan_ = 0;        // buf_ before this holds no closing marker or end of JSON (Call state)
  std::string marker_;     // the opening marker of the call being read
  bool drop_ws_ = false;   // skip whitespace before the next text (after </think>)
  std::string held_ws_;    // trailing whitespace of the content, given out once text follows
  bool think_allowed_ = false;  // a <think> may still open the reply
  // Mistral: the call's name and id (name form), then its JSON value, scanned once as it arrives.
  std::string call_name_, call_id_;
  bool array_form_ = false, value_started_ = false;
  size_t value_begin_ = 0;
  int depth_ = 0;
  bool in_string_ = false, escape_ = false;
  std::string content_, reasoning_;
  std::vector<ToolCall> calls_;
};

}  // namespace ptllm
