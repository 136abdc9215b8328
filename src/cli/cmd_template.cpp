// posttrainllm template: render a model's chat template over conversations, as transformers'
// apply_chat_template(..., tokenize=False) does; for checking templates from the shell (llama.cpp
// has the same kind of tool) and for the template tests.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>

#include "chat/chat_template.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/file_io.h"

namespace ptllm::cli {

namespace {

using chat::Json;

struct TemplateArgs {
  std::string path, jsonl, messages, kwargs, template_name;
  bool add_generation_prompt = false;
  long long now = -1;
  CLI::Option *jsonl_opt = nullptr, *messages_opt = nullptr, *now_opt = nullptr;
};

void write_out(const std::string& s) { std::fwrite(s.data(), 1, s.size(), stdout); }

// "-" is standard input.
std::string read_all(const std::string& path) {
  if (path == "-") return read_standard_input(kMaxTextBytes, "an input");
  return read_whole_file(path, kMaxTextBytes, "an input file");
}

// One request: {"messages": [...], "tools": [...], "add_generation_prompt": bool, "kwargs": {...}}
// or, for --messages, a bare list of messages. `at` names the file (and line) in errors.
chat::ChatRequest request_of(const Json& j, const std::string& at, const TemplateArgs& a,
                             const Json& kwargs) {
  chat::ChatRequest r;
  r.add_generation_prompt = a.add_generation_prompt;
  r.template_name = a.template_name;
  r.kwargs = kwargs;
  if (j.is_array()) {
    r.messages = j;
    return r;
  }
  if (!j.is_object()) throw Error(at + ": expected a JSON object or a list of messages");
  auto it = j.find("messages");
  if (it == j.end() || !it->is_array()) throw Error(at + ": messages: expected a list");
  r.messages = *it;
  if (auto t = j.find("tools"); t != j.end()) r.tools = *t;
  if (auto g = j.find("add_generation_prompt"); g != j.end()) {
    if (!g->is_boolean()) throw Error(at + ": add_generation_prompt: expected true or false");
    r.add_generation_prompt = g->get<bool>();
  }
  if (auto k = j.find("kwargs"); k != j.end() && !k->is_null()) {
    if (!k->is_object()) throw Error(at + ": kwargs: expected an object");
    for (const auto& [key, v] : k->items()) r.kwargs[key] = v;
  }
  return r;
}

int run_template(const TemplateArgs& a) {
  if ((a.jsonl_opt->count() > 0) == (a.messages_opt->count() > 0))
    throw UsageError("give exactly one of --jsonl, --messages");
  Json kwargs = Json::object();
  if (!a.kwargs.empty()) {
    kwargs = Json::parse(a.kwargs, nullptr, false);
    if (!kwargs.is_object()) throw UsageError("--chat-template-kwargs: expected a JSON object");
  }
  std::error_code ec;  // a path that exists is a file, even if it is also a built-in name
  const char* builtin = std::filesystem::exists(a.path, ec) ? nullptr : chat::builtin_template_source(a.path);
  const chat::ChatTemplate tmpl = builtin ? chat::ChatTemplate::from_string(builtin, "built-in " + a.path)
                                          : chat::ChatTemplate::load(a.path);
  chat::RenderOptions opt;
  if (a.now_opt->count()) opt.now = static_cast<std::time_t>(a.now);

  if (a.messages_opt->count()) {
    const Json j = Json::parse(read_all(a.messages), nullptr, false);
    if (j.is_discarded()) throw Error(a.messages + ": not valid JSON");
    write_out(tmpl.render(request_of(j, a.messages, a, kwargs), opt));
    return 0;
  }
  // One rendering per line, as a JSON string; a conversation the template refuses is
  // {"error": ...} on its line and does not stop the others.
  std::istringstream in(read_all(a.jsonl));
  std::string line, out;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = a.jsonl + ":" + std::to_string(n);
    const Json j = Json::parse(line, nullptr, false);
    if (j.is_discarded()) throw Error(at + ": not valid JSON");
    const chat::ChatRequest r = request_of(j, at, a, kwargs);
    try {
      out += Json(tmpl.render(r, opt)).dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
    } catch (const chat::TemplateError& e) {
      out += Json{{"error", e.what()}}.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
    }
    if (out.size() > (1 << 20)) write_out(std::exchange(out, {}));
  }
  write_out(out);
  return 0;
}

}  // namespace

Command add_template_command(CLI::App& root) {
  auto args = std::make_shared<TemplateArgs>();
  CLI::App* app = root.add_subcommand(
      "template", "Render a chat template over conversations (transformers' apply_chat_template)");
  std::string names;
  for (const std::string& n : chat::builtin_template_names()) names += (names.empty() ? "" : ", ") + n;
  app->add_option("path", args->path,
                  "model directory, tokenizer_config.json, .jinja file, or a built-in template name (" + names + ")")
      ->required();
  args->jsonl_opt = app->add_option(
      "--jsonl", args->jsonl,
      "one conversation per line: {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": "
      "bool, \"kwargs\": {...}}; prints one JSON string (or {\"error\": ...}) per line (- for stdin)");
  args->messages_opt = app->add_option(
      "--messages", args->messages,
      "one conversation (a list of messages, or an object as a --jsonl line); prints the rendering");
  app->add_flag("--add-generation-prompt", args->add_generation_prompt,
                "end with the assistant's header (a --jsonl line's own value wins)");
  app->add_option("--chat-template-kwargs", args->kwargs,
                  "extra template variables as a JSON object, e.g. '{\"enable_thinking\": false}'");
  app->add_option("--template-name", args->template_name,
                  "which of several named templates (default: tool_use with tools, else default)");
  args->now_opt = app->add_option("--now", args->now,
                                  "strftime_now's clock, in seconds since 1970 (UTC), for reproducible output");
  return {app, [args] { return run_template(*args); }};
}

}  // namespace ptllm::cli
