#pragma once
// apply_chat_template: a model's chat template(s) and special tokens, rendered over a
// conversation exactly as transformers' tokenizer.apply_chat_template(..., tokenize=False) does.
//
//   ChatTemplate t = ChatTemplate::load("models/my-instruct");  // dir, tokenizer_config.json or .jinja
//   ChatRequest r;
//   r.messages = Json::parse(R"([{"role": "user", "content": "Hi"}])");
//   r.add_generation_prompt = true;
//   std::string prompt = t.render(r);
//
// Parsed once at load; render() does not modify the template, so one ChatTemplate can serve
// many threads.
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/ast.h"
#include "chat/eval.h"
#include "chat/json_value.h"

namespace ptllm::chat {

struct ChatRequest {
  Json messages = Json::array();  // [{role, content (string or [{type, text}...]), tool_calls, tool_call_id, name}]
  Json tools;                     // OpenAI function schemas; null: none (the template sees None)
  bool add_generation_prompt = false;
  Json kwargs = Json::object();  // extra variables (enable_thinking, date_string, ...); override special tokens
  std::string template_name;     // "": transformers' choice ("tool_use" when tools are given, else "default")
};

class ChatTemplate {
 public:
  // A model directory (chat_template.jinja if present, else tokenizer_config.json's
  // chat_template; special tokens from tokenizer_config.json), a tokenizer_config.json, or a
  // .jinja file (no special tokens: pass them in kwargs). Throws Error naming the file and field,
  // TemplateError on a syntax error in the template.
  static ChatTemplate load(const std::string& path);
  // tokenizer_config.json's content; `origin` names it in errors.
  static ChatTemplate from_config(const Json& tokenizer_config, const std::string& origin);
  // One template text; `special_tokens` an object such as {"bos_token": "<s>"}.
  static ChatTemplate from_string(const std::string& source, const std::string& name = "chat_template",
                                  const Json& special_tokens = Json::object());

  // Throws TemplateError for a conversation the template refuses (raise_exception, a failed
  // operation), Error for a missing template name.
  std::string render(const ChatRequest& request, const RenderOptions& options = {}) const;

  // Whether the template raises on a leading system message although it renders the same
  // conversation without one (Gemma 2: "System role not supported"). Found by rendering two probe
  // conversations, so it holds for any template that refuses the role, whatever its message.
  bool refuses_system_role() const;

  // The names of the templates ("default" for a single one) and the special tokens.
  std::vector<std::string> template_names() const;
  const Json& special_tokens() const { return special_tokens_; }
  const std::string& origin() const { return origin_; }
  // Every template's text, one after another: what a caller scans to tell the model's output
  // format (tool-call markers, <think>).
  const std::string& source() const { return source_; }

 private:
  void add(const std::string& name, const std::string& source);
  std::string origin_;
  std::string source_;
  std::map<std::string, std::shared_ptr<const Program>> templates_;
  Json special_tokens_ = Json::object();  // bos_token, eos_token, ... as plain strings
};

// The built-in templates of --chat-template NAME (chatml, llama3, mistral-v7, qwen2.5, gemma,
// phi3): their names, and the source of one (nullptr for an unknown name).
std::vector<std::string> builtin_template_names();
const char* builtin_template_source(std::string_view name);

// `messages` with a leading system message folded into the first user message ("SYSTEM\n\nUSER"),
// for templates that refuse the system role; unchanged when there is nothing to fold.
Json fold_system_message(const Json& messages);

}  // namespace ptllm::chat
