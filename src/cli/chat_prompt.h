#pragma once
// The chat command's view of a chat template: the conversation (a JSON list of messages) in, the
// prompt text out. The only piece of the command that knows the template interpreter (src/chat/).
#include <CLI/CLI.hpp>
#include <atomic>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace ptllm::chat {
class ChatTemplate;
}

namespace ptllm::cli {

using chat_json = nlohmann::ordered_json;  // key order kept, as the template interpreter wants

struct ChatPromptOptions {
  std::string template_file;  // --chat-template FILE or NAME (a built-in); "" = the model's
  std::string kwargs;         // --chat-template-kwargs JSON ("" = none)
};

// --chat-template FILE|NAME and --chat-template-kwargs JSON, as llama.cpp spells them.
void add_chat_prompt_options(CLI::App& app, ChatPromptOptions& o);

class ChatPrompt {
 public:
  // The model's template (chat_template.jinja, or tokenizer_config.json's chat_template), or
  // --chat-template FILE with the model's special tokens (bos_token, ...), or a built-in NAME; a
  // model with no template gets the built-in chatml and a warning on stderr, as llama.cpp does.
  // Throws UsageError for bad --chat-template-kwargs, Error naming the file for a broken template
  // or a --chat-template that is neither a file nor a built-in name.
  static ChatPrompt load(const std::filesystem::path& model_dir, const ChatPromptOptions& o);
  // transformers' apply_chat_template(messages, add_generation_prompt=..., tools=..., tokenize=False,
  // **kwargs); tools null: none.
  // `extra_kwargs` (a request's chat_template_kwargs) override --chat-template-kwargs.
  std::string render(const chat_json& messages, bool add_generation_prompt, const chat_json& tools = nullptr,
                     const chat_json& extra_kwargs = chat_json::object()) const;
  // The template's text (to read the model's output format from it).
  const std::string& source() const;
  // Where the template came from (a file path, "built-in NAME"), for the start-up line and errors.
  const std::string& origin() const;
  // The template refuses system messages (Gemma 2): render() folds a leading one into the first
  // user message, with a warning on stderr the first time.
  bool folds_system() const { return fold_system_; }

 private:
  std::shared_ptr<const chat::ChatTemplate> template_;
  chat_json kwargs_ = chat_json::object();
  bool fold_system_ = false;
  std::shared_ptr<std::atomic<bool>> warned_fold_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace ptllm::cli
