#include "cli/chat_prompt.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "chat/chat_template.h"
#include "core/error.h"
#include "core/file_io.h"
#include "model/gguf_model.h"

namespace ptllm::cli {

namespace fs = std::filesystem;

namespace {

std::string builtin_names() {
  std::string s;
  for (const std::string& n : chat::builtin_template_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

void add_chat_prompt_options(CLI::App& app, ChatPromptOptions& o) {
  app.add_option("--chat-template", o.template_file,
                 "A chat template instead of the model's: a Jinja FILE (the special tokens still come from "
                 "tokenizer_config.json) or a built-in NAME: " + builtin_names() +
                     ". A model without a template uses chatml")
      ->type_name("FILE|NAME");
  app.add_option("--chat-template-kwargs", o.kwargs,
                 "Extra template variables as a JSON object, e.g. '{\"enable_thinking\": false}'");
}

namespace {

std::string read_file(const fs::path& path, const std::string& what) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(path.string() + ": cannot open " + what);
  return read_whole_file(path, kMaxJsonConfigBytes, what);
}

chat_json parse_kwargs(const std::string& text) {
  if (text.empty()) return chat_json::object();
  chat_json j;
  try {
    j = chat_json::parse(text);
  } catch (const chat_json::exception& e) {  // out_of_range too (1e999)
    throw UsageError("--chat-template-kwargs: not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object()) throw UsageError("--chat-template-kwargs: expected a JSON object, e.g. '{\"enable_thinking\": false}'");
  return j;
}

// A GGUF file's tokenizer_config.json equivalent: tokenizer.chat_template and the special tokens.
chat::Json gguf_config(const fs::path& file) {
  // Invalid UTF-8 in a token or the template (GGUF strings are any bytes) becomes U+FFFD.
  return chat::Json::parse(gguf_vocab_to_json(gguf_vocab(GgufFile::open(file)))
                               .config.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// --chat-template FILE: the file's text with the special tokens of the model's tokenizer_config.json.
chat::ChatTemplate load_override(const fs::path& model_dir, const std::string& file) {
  const std::string source = read_file(file, "the chat template (--chat-template)");
  if (is_gguf_path(model_dir)) {
    chat::Json cfg = gguf_config(model_dir);
    cfg["chat_template"] = source;
    return chat::ChatTemplate::from_config(cfg, file);
  }
  const fs::path cfg_path = model_dir / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::exists(cfg_path, ec)) return chat::ChatTemplate::from_string(source, file);
  chat::Json cfg = chat::Json::parse(read_file(cfg_path, "the tokenizer config"), nullptr, false);
  if (!cfg.is_object()) throw Error(cfg_path.string() + ": not a valid JSON object");
  cfg["chat_template"] = source;
  return chat::ChatTemplate::from_config(cfg, file);
}

chat::ChatTemplate load_builtin(const std::string& name) {
  const char* source = chat::builtin_template_source(name);
  if (source == nullptr)
    throw Error("--chat-template " + name + ": no such file, and not a built-in template name (" + builtin_names() + ")");
  return chat::ChatTemplate::from_string(source, "built-in " + name);
}

// Whether a model directory ships a chat template; a broken configuration counts as one, so that
// loading it reports the file and field.
bool dir_has_template(const fs::path& model_dir) {
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec) || fs::exists(model_dir / "chat_template.jinja", ec)) return true;
  const fs::path cfg_path = model_dir / "tokenizer_config.json";
  if (!fs::exists(cfg_path, ec)) return false;
  const chat::Json cfg = chat::Json::parse(read_file(cfg_path, "the tokenizer config"), nullptr, false);
  return !cfg.is_object() || (cfg.contains("chat_template") && !cfg["chat_template"].is_null());
}

// The template that --chat-template and the model give, before any rendering.
chat::ChatTemplate load_template(const fs::path& model_dir, const ChatPromptOptions& o) {
  std::error_code ec;
  if (!o.template_file.empty())  // a path that exists is a file, even if it is also a built-in name
    return fs::exists(o.template_file, ec) ? load_override(model_dir, o.template_file) : load_builtin(o.template_file);
  const bool gguf = is_gguf_path(model_dir);
  const chat::Json gguf_cfg = gguf ? gguf_config(model_dir) : chat::Json();
  if (gguf ? !gguf_cfg.contains("chat_template") || gguf_cfg["chat_template"].is_null() : !dir_has_template(model_dir)) {
    std::fprintf(stderr, "warning: %s has no chat template; using the built-in chatml (choose another with "
                 "--chat-template NAME or FILE)\n", model_dir.string().c_str());
    return load_builtin("chatml");
  }
  try {
    if (gguf) return chat::ChatTemplate::from_config(gguf_cfg, model_dir.string() + " (tokenizer.chat_template)");
    return chat::ChatTemplate::load(model_dir.string());
  } catch (const chat::TemplateError&) {
    throw;
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + "; give one with --chat-template NAME or FILE");
  }
}

}  // namespace

ChatPrompt ChatPrompt::load(const fs::path& model_dir, const ChatPromptOptions& o) {
  ChatPrompt p;
  p.kwargs_ = parse_kwargs(o.kwargs);
  p.template_ = std::make_shared<const chat::ChatTemplate>(load_template(model_dir, o));
  p.fold_system_ = p.template_->refuses_system_role();
  return p;
}

std::string ChatPrompt::render(const chat_json& messages, bool add_generation_prompt, const chat_json& tools,
                               const chat_json& extra_kwargs) const {
  chat::ChatRequest r;
  r.messages = fold_system_ ? chat::fold_system_message(messages) : messages;
  if (fold_system_ && r.messages != messages) {
    if (!warned_fold_->exchange(true))
      std::fprintf(stderr, "warning: the chat template (%s) refuses system messages; the system message is put at "
                   "the start of the first user message\n", origin().c_str());
  }
  r.tools = tools;
  r.add_generation_prompt = add_generation_prompt;
  r.kwargs = kwargs_;
  for (const auto& [k, v] : extra_kwargs.items()) r.kwargs[k] = v;
  return template_->render(r);
}

const std::string& ChatPrompt::source() const { return template_->source(); }

const std::string& ChatPrompt::origin() const { return template_->origin(); }

}  // namespace ptllm::cli
