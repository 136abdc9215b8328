#include "chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/file_io.h"
#include "chat/parser.h"

namespace ptllm::chat {

namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) { return read_whole_file(path, kMaxJsonConfigBytes, "a chat template"); }

Json read_json(const std::string& path) {
  const std::string text = read_file(path);
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Error(path + ": not valid JSON");
  if (!j.is_object()) throw Error(path + ": expected a JSON object");
  return j;
}

// The special tokens transformers passes to templates: a string, or an AddedToken object
// {"content": ..., "__type": "AddedToken"}; null or absent tokens are left out (undefined).
Json special_tokens_of(const Json& cfg, const std::string& origin) {
  static const char* const kNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token"};
  auto token_text = [&](const Json& v, const std::string& field) -> Json {
    if (v.is_string()) return v;
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"];
    if (v.is_null()) return nullptr;
    throw Error(origin + ": " + field + ": expected a string or {\"content\": ...}");
  };
  Json out = Json::object();
  for (const char* n : kNames) {
    auto it = cfg.find(n);
    if (it == cfg.end()) continue;
    Json t = token_text(*it, n);
    if (!t.is_null()) out[n] = std::move(t);
  }
  if (auto it = cfg.find("additional_special_tokens"); it != cfg.end() && it->is_array()) {
    Json list = Json::array();
    for (size_t i = 0; i < it->size(); ++i) {
      Json t = token_text((*it)[i], "additional_special_tokens[" + std::to_string(i) + "]");
      if (!t.is_null()) list.push_back(std::move(t));
    }
    out["additional_special_tokens"] = std::move(list);
  }
  return out;
}

}  // namespace

void ChatTemplate::add(const std::string& name, const std::string& source) {
  const std::string label = templates_.empty() && name == "default" ? origin_ : origin_ + " (" + name + ")";
  templates_[name] = std::make_shared<const Program>(parse_template(source, label));
  source_ += source;
}

ChatTemplate ChatTemplate::from_string(const std::string& source, const std::string& name,
                                       const Json& special_tokens) {
  ChatTemplate t;
  t.origin_ = name;
  t.special_tokens_ = special_tokens.is_object() ? special_tokens : Json::object();
  t.add("default", source);
  return t;
}

ChatTemplate ChatTemplate::from_config(const Json& cfg, const std::string& origin) {
  ChatTemplate t;
  t.origin_ = origin;
  t.special_tokens_ = special_tokens_of(cfg, origin);
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) throw Error(origin + ": chat_template: missing (the model has no chat template)");
  if (it->is_string()) {
    t.add("default", it->get<std::string>());
    return t;
  }
  // A list of named templates: [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
  if (!it->is_array() || it->empty()) throw Error(origin + ": chat_template: expected a string or a list of {name, template}");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& e = (*it)[i];
    const std::string at = origin + ": chat_template[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") ||
        !e["template"].is_string())
      throw Error(at + ": expected {\"name\": string, \"template\": string}");
    t.add(e["name"].get<std::string>(), e["template"].get<std::string>());
  }
  return t;
}

ChatTemplate ChatTemplate::load(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const std::string cfg_path = (fs::path(path) / "tokenizer_config.json").string();
    const std::string jinja_path = (fs::path(path) / "chat_template.jinja").string();
    const bool has_cfg = fs::exists(cfg_path, ec);
    if (fs::exists(jinja_path, ec)) {  // transformers >= 4.50 saves the template here, and prefers it
      const Json tokens = has_cfg ? special_tokens_of(read_json(cfg_path), cfg_path) : Json::object();
      return from_string(read_file(jinja_path), jinja_path, tokens);
    }
    if (!has_cfg) throw Error(path + ": no tokenizer_config.json or chat_template.jinja in this directory");
    return from_config(read_json(cfg_path), cfg_path);
  }
  if (path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0) return from_config(read_json(path), path);
  return from_string(read_file(path), path);
}

std::vector<std::string> ChatTemplate::template_names() const {
  std::vector<std::string> names;
  for (const auto& [n, p] : templates_) names.push_back(n);
  return names;
}

std::string ChatTemplate::render(const ChatRequest& req, const RenderOptions& options) const {
  std::string name = req.template_name;
  if (name.empty()) {
    if (templates_.size() == 1) name = templates_.begin()->first;
    else if (!req.tools.is_null() && templates_.count("tool_use")) name = "tool_use";
    else if (templates_.count("default")) name = "default";
    else throw Error(origin_ + ": several chat templates and none named 'default'");
  }
  const auto it = templates_.find(name);
  if (it == templates_.end()) throw Error(origin_ + ": no chat template named '" + name + "'");
  if (!req.messages.is_array()) throw Error("messages: expected a list");
  if (!req.kwargs.is_object()) throw Error("kwargs: expected an object");

  // As transformers: the special tokens, then the extra variables, then the named arguments.
  Dict ctx;
  for (const auto& [k, v] : special_tokens_.items()) ctx.set(k, from_json(v));
  for (const auto& [k, v] : req.kwargs.items()) ctx.set(k, from_json(v));
  ctx.set("messages", from_json(req.messages));
  ctx.set("tools", from_json(req.tools));
  ctx.set("documents", Value::none());
  ctx.set("add_generation_prompt", Value::boolean(req.add_generation_prompt));
  return chat::render(*it->second, ctx, options);
}

bool ChatTemplate::refuses_system_role() const {
  ChatRequest with, without;
  with.messages = Json::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])");
  without.messages = Json::parse(R"([{"role": "user", "content": "U"}])");
  with.add_generation_prompt = without.add_generation_prompt = true;
  RenderOptions opt;
  opt.now = 0;  // no clock needed
  try {
    render(with, opt);
    return false;
  } catch (const TemplateError&) {
  }
  try {
    render(without, opt);
    return true;
  } catch (const TemplateError&) {
    return false;  // refuses this much: not about the system role
  }
}

Json fold_system_message(const Json& messages) {
  if (!messages.is_array() || messages.empty() || !messages[0].is_object() || messages[0].value("role", "") != "system")
    return messages;
  const Json& sys = messages[0].contains("content") ? messages[0]["content"] : Json();
  std::string text;
  if (sys.is_string()) {
    text = sys.get<std::string>();
  } else if (sys.is_array()) {
    for (const Json& part : sys)
      if (part.is_object() && part.value("type", "") == "text" && part.contains("text") && part["text"].is_string())
        text += part["text"].get<std::string>();
  }
  Json out = Json::array();
  bool folded = false;
  for (size_t i = 1; i < messages.size(); ++i) {
    Json m = messages[i];
    if (!folded && m.is_object() && m.value("role", "") == "user") {
      Json& c = m["content"];
      if (c.is_string()) {
        c = text + "\n\n" + c.get<std::string>();
      } else if (c.is_array()) {
        c.insert(c.begin(), Json{{"type", "text"}, {"text", text + "\n\n"}});
      } else {
        c = text;
      }
      folded = true;
    }
    out.push_back(std::move(m));
  }
  if (!folded) return messages;  // no user turn to carry it: the template decides
  return out;
}

}  // namespace ptllm::chat
