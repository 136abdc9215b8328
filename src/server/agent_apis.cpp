#include "server/agent_apis.h"

#include <ctime>
#include <set>

namespace ptllm::server {

namespace {

std::string new_id(const char* prefix) { return random_alnum_id(prefix, 24); }

const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void wrong(const std::string& at, const std::string& what) { throw bad_request(at + ": " + what, at); }

// Fields outside `allowed` are refused by name, never ignored (a null is no value).
void check_fields(const json& body, const std::set<std::string>& allowed) {
  for (const auto& [key, value] : body.items())
    if (!value.is_null() && !allowed.count(key)) wrong(key, "not supported by this server (refused rather than ignored)");
}

// The text of a string or of a list of text parts of the given types.
std::string text_of(const json& content, const std::string& at, const std::set<std::string>& types) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) wrong(at, "expected a string or an array of content parts");
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& p = content[i];
    const std::string pat = at + "[" + std::to_string(i) + "]";
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) wrong(pat + ".type", "expected a string");
    if (!types.count(p["type"].get<std::string>()))
      wrong(pat + ".type", "content of type " + p["type"].dump() + " is not supported (text only)");
    if (!p.contains("text") || !p["text"].is_string()) wrong(pat + ".text", "expected a string");
    out += p["text"].get<std::string>();
  }
  return out;
}

json chat_call(const std::string& id, const std::string& name, const std::string& arguments) {
  return {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
}

// A flat tool ({name, description?, SCHEMA_KEY?}) as a chat tool; the chat parser checks its fields.
json chat_tool(const json& t, const char* schema_key) {
  json fn = {{"name", t.value("name", json())}};
  if (const json* d = field(t, "description")) fn["description"] = *d;
  if (const json* s = field(t, schema_key)) fn["parameters"] = *s;
  if (const json* s = field(t, "strict")) fn["strict"] = *s;
  return {{"type", "function"}, {"function", fn}};
}

json parsed_arguments(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  return j.is_object() ? j : json::object();
}

// The chat message of a reply, as it goes back into a conversation.
json assistant_message(const ChatOutputParser& out) {
  json m = {{"role", "assistant"}, {"content", out.content()}};
  if (!out.calls().empty()) {
    m["tool_calls"] = json::array();
    for (const ToolCall& c : out.calls()) m["tool_calls"].push_back(chat_call(c.id, c.name, c.arguments));
  }
  return m;
}

ApiRequest chat_request(const json& chat_body, uint64_t seed, const RequestDefaults& defaults) {
  return parse_request(chat_body.dump(), Endpoint::Chat, seed, defaults);
}

// ---- Anthropic Messages -------------------------------------------------------------------------

json messages_to_chat(const json& b) {
  check_fields(b, {"model", "messages", "max_tokens", "system", "tools", "tool_choice", "stream", "temperature",
                   "top_p", "top_k", "stop_sequences", "metadata", "service_tier"});
  json chat = json::object();
  if (const json* m = field(b, "model")) chat["model"] = *m;
  const json* max = field(b, "max_tokens");
  if (!max) wrong("max_tokens", "required");
  chat["max_tokens"] = *max;
  for (const char* k : {"temperature", "top_p", "top_k", "stream"})
    if (const json* v = field(b, k)) chat[k] = *v;
  if (const json* s = field(b, "stop_sequences")) chat["stop"] = *s;
  json msgs = json::array();
  if (const json* sys = field(b, "system")) msgs.push_back({{"role", "system"}, {"content", text_of(*sys, "system", {"text"})}});
  const json* in = field(b, "messages");
  if (!in || !in->is_array() || in->empty()) wrong("messages", "expected a non-empty array");
  for (size_t i = 0; i < in->size(); ++i) {
    const json& m = (*in)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) wrong(at, "expected an object");
    const json* role = field(m, "role");
    if (!role || (*role != "user" && *role != "assistant")) wrong(at + ".role", "expected \"user\" or \"assistant\"");
    const json* content = field(m, "content");
    if (!content) wrong(at + ".content", "required");
    if (content->is_string()) {
      msgs.push_back({{"role", *role}, {"content", *content}});
      continue;
    }
    if (!content->is_array()) wrong(at + ".content", "expected a string or an array of content blocks");
    std::string text;
    json calls = json::array();
    for (size_t j = 0; j < content->size(); ++j) {
      const json& blk = (*content)[j];
      const std::string bat = at + ".content[" + std::to_string(j) + "]";
      const json* type = blk.is_object() ? field(blk, "type") : nullptr;
      if (!type || !type->is_string()) wrong(bat + ".type", "expected a string");
      if (*type == "text") {
        text += text_of(json::array({blk}), bat, {"text"});
      } else if (*type == "tool_use" && *role == "assistant") {
        const json* id = field(blk, "id");
        const json* name = field(blk, "name");
        if (!id || !id->is_string()) wrong(bat + ".id", "expected a string");
        if (!name || !name->is_string()) wrong(bat + ".name", "expected a string");
        const json* input = field(blk, "input");
        if (input && !input->is_object()) wrong(bat + ".input", "expected an object");
        calls.push_back(chat_call(*id, *name, input ? input->dump() : "{}"));
      } else if (*type == "tool_result" && *role == "user") {
        const json* id = field(blk, "tool_use_id");
        if (!id || !id->is_string()) wrong(bat + ".tool_use_id", "expected a string");
        const json* c = field(blk, "content");
        msgs.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", c ? text_of(*c, bat + ".content", {"text"}) : ""}});
      } else if ((*type == "thinking" || *type == "redacted_thinking") && *role == "assistant") {
        // Earlier reasoning: chat templates drop it from the history, as here.
      } else {
        wrong(bat + ".type", "a " + type->dump() + " block is not supported in a " + role->get<std::string>() + " message");
      }
    }
    if (*role == "assistant") {
      json a = {{"role", "assistant"}, {"content", text}};
      if (!calls.empty()) a["tool_calls"] = calls;
      msgs.push_back(std::move(a));
    } else if (!text.empty() || content->empty()) {
      msgs.push_back({{"role", "user"}, {"content", text}});
    }
  }
  chat["messages"] = std::move(msgs);
  if (const json* tools = field(b, "tools")) {
    if (!tools->is_array()) wrong("tools", "expected an array");
    json out = json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) wrong(at, "expected an object");
      if (const json* type = field(t, "type"); type && *type != "custom")
        wrong(at + ".type", "server tools (" + type->dump() + ") are not supported; give a custom tool with input_schema");
      out.push_back(chat_tool(t, "input_schema"));
    }
    chat["tools"] = std::move(out);
  }
  if (const json* tc = field(b, "tool_choice")) {
    const json* type = tc->is_object() ? field(*tc, "type") : nullptr;
    if (!type || !type->is_string()) wrong("tool_choice.type", "expected a string");
    if (*type == "auto" || *type == "none") {
      chat["tool_choice"] = *type;
    } else if (*type == "any") {
      chat["tool_choice"] = "required";
    } else if (*type == "tool") {
      const json* name = field(*tc, "name");
      if (!name || !name->is_string()) wrong("tool_choice.name", "expected the name of a tool");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
    } else {
      wrong("tool_choice.type", "expected \"auto\", \"any\", \"tool\" or \"none\"");
    }
    if (const json* d = field(*tc, "disable_parallel_tool_use"); d && *d == true) chat["parallel_tool_calls"] = false;
  }
  return chat;
}

class MessagesReply : public AgentReply {
 public:
  explicit MessagesReply(std::string model) : model_(std::move(model)), id_(new_id("msg_")) {}

  static const char* stop_reason(const RequestResult& res, bool calls) {
    if (res.reason != FinishReason::Stop) return "max_tokens";
    if (calls) return "tool_use";
    return res.stop_string.empty() ? "end_turn" : "stop_sequence";
  }
  static json usage(const RequestResult& res) {
    return {{"input_tokens", res.prompt_tokens - res.cached_tokens},
            {"cache_read_input_tokens", res.cached_tokens},
            {"cache_creation_input_tokens", 0},
            {"output_tokens", res.completion_tokens}};
  }

  json response(const RequestResult& res, const ChatOutputParser& out) override {
    json content = json::array();
    if (!out.reasoning().empty()) content.push_back({{"type", "thinking"}, {"thinking", out.reasoning()}, {"signature", ""}});
    if (!out.content().empty()) content.push_back({{"type", "text"}, {"text", out.content()}});
    for (const ToolCall& c : out.calls())
      content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", parsed_arguments(c.arguments)}});
    return {{"id", id_},
            {"type", "message"},
            {"role", "assistant"},
            {"model", model_},
            {"content", content},
            {"stop_reason", stop_reason(res, !out.calls().empty())},
            {"stop_sequence", res.stop_string.empty() ? json(nullptr) : json(res.stop_string)},
            {"usage", usage(res)}};
  }

  std::vector<SseEvent> begin(int64_t prompt_tokens) override {
    json msg = {{"id", id_},          {"type", "message"},         {"role", "assistant"},
                {"model", model_},    {"content", json::array()},  {"stop_reason", nullptr},
                {"stop_sequence", nullptr},
                {"usage", {{"input_tokens", prompt_tokens}, {"output_tokens", 0}}}};
    return {{"message_start", {{"type", "message_start"}, {"message", msg}}}, {"ping", {{"type", "ping"}}}};
  }

  std::vector<SseEvent> delta(const OutputDelta& d) override {
    std::vector<SseEvent> ev;
    const auto piece = [&](const char* kind, const char* delta_type, const char* key, const std::string& text) {
      if (text.empty()) return;
      if (open_ != kind) {
        close(ev);
        json blk = {{"type", kind}, {key, ""}};
        if (std::string(kind) == "thinking") blk["signature"] = "";
        ev.push_back({"content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", blk}}});
        open_ = kind;
      }
      ev.push_back({"content_block_delta",
                    {{"type", "content_block_delta"}, {"index", index_}, {"delta", {{"type", delta_type}, {key, text}}}}});
    };
    piece("thinking", "thinking_delta", "thinking", d.reasoning);
    piece("text", "text_delta", "text", d.content);
    for (const ToolCall& c : d.calls) {
      close(ev);
      ev.push_back({"content_block_start",
                    {{"type", "content_block_start"},
                     {"index", index_},
                     {"content_block", {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", json::object()}}}}});
      ev.push_back({"content_block_delta",
                    {{"type", "content_block_delta"},
                     {"index", index_},
                     {"delta", {{"type", "input_json_delta"}, {"partial_json", c.arguments}}}}});
      open_ = "tool_use";
      close(ev);
    }
    return ev;
  }

  std::vector<SseEvent> end(const RequestResult& res, const ChatOutputParser& out) override {
    std::vector<SseEvent> ev;
    close(ev);
    ev.push_back({"message_delta",
                  {{"type", "message_delta"},
                   {"delta",
                    {{"stop_reason", stop_reason(res, !out.calls().empty())},
                     {"stop_sequence", res.stop_string.empty() ? json(nullptr) : json(res.stop_string)}}},
                   {"usage", usage(res)}}});
    ev.push_back({"message_stop", {{"type", "message_stop"}}});
    return ev;
  }

  json error_body(const ApiError& e) const override { return anthropic_error_body(e); }

 private:
  void close(std::vector<SseEvent>& ev) {
    if (open_.empty()) return;
    ev.push_back({"content_block_stop", {{"type", "content_block_stop"}, {"index", index_}}});
    ++index_;
    open_.clear();
  }
  std::string model_, id_;
  std::string open_;  // the open block's type, "" when none
  int index_ = 0;
};

// ---- OpenAI Responses ---------------------------------------------------------------------------

json responses_to_chat(const json& b, const ResponseStore& store, json& history) {
  check_fields(b, {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
                   "previous_response_id", "store", "stream", "temperature", "top_p", "max_output_tokens", "text",
                   "metadata", "user", "include", "truncation", "prompt_cache_key", "safety_identifier",
                   "service_tier", "reasoning", "top_logprobs", "background", "stream_options"});
  if (const json* r = field(b, "reasoning"); r && !(r->is_object() && (r->empty() || !field(*r, "effort"))))
    wrong("reasoning", "reasoning effort is not supported by this server");
  if (const json* t = field(b, "top_logprobs"); t && *t != 0) wrong("top_logprobs", "not supported by this server");
  if (const json* bg = field(b, "background"); bg && *bg != false) wrong("background", "not supported by this server");
  if (const json* t = field(b, "truncation"); t && *t != "disabled") wrong("truncation", "only \"disabled\" is supported");
  json chat = json::object();
  for (const char* k : {"model", "temperature", "top_p", "parallel_tool_calls", "stream"})
    if (const json* v = field(b, k)) chat[k] = *v;
  if (const json* v = field(b, "max_output_tokens")) chat["max_tokens"] = *v;
  if (const json* t = field(b, "text")) {
    if (!t->is_object()) wrong("text", "expected an object");
    // text.format: the chat API's response_format, its json_schema's fields beside the type.
    if (const json* fmt = field(*t, "format")) {
      if (!fmt->is_object()) wrong("text.format", "expected an object");
      const json type = fmt->value("type", json());
      if (type == "json_schema") {
        json js = json::object();
        for (const char* k : {"name", "schema", "strict", "description"})
          if (const json* v = field(*fmt, k)) js[k] = *v;
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
      } else if (type == "text" || type == "json_object") {
        chat["response_format"] = {{"type", type}};
      } else {
        wrong("text.format.type", "expected \"text\", \"json_object\" or \"json_schema\"");
      }
    }
  }
  // The conversation: the previous response's, then this input.
  history = json::array();
  if (const json* prev = field(b, "previous_response_id")) {
    if (!prev->is_string()) wrong("previous_response_id", "expected a string");
    auto kept = store.get(prev->get<std::string>());
    if (!kept) wrong("previous_response_id", "no stored response " + prev->dump() + " (unknown, expired, or store was false)");
    history = std::move(*kept);
  }
  const json* input = field(b, "input");
  if (!input) wrong("input", "required");
  if (input->is_string()) {
    history.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array()) {
    for (size_t i = 0; i < input->size(); ++i) {
      const json& it = (*input)[i];
      const std::string at = "input[" + std::to_string(i) + "]";
      if (!it.is_object()) wrong(at, "expected an object");
      const std::string type = it.value("type", std::string(it.contains("role") ? "message" : ""));
      if (type == "message") {
        const json* role = field(it, "role");
        if (!role || !role->is_string()) wrong(at + ".role", "expected a string");
        if (*role != "user" && *role != "assistant" && *role != "system" && *role != "developer")
          wrong(at + ".role", "unknown role " + role->dump());
        const json* c = field(it, "content");
        if (!c) wrong(at + ".content", "required");
        history.push_back({{"role", *role}, {"content", text_of(*c, at + ".content", {"input_text", "output_text", "text"})}});
      } else if (type == "function_call") {
        for (const char* k : {"call_id", "name", "arguments"})
          if (!field(it, k) || !it[k].is_string()) wrong(at + "." + k, "expected a string");
        const json call = chat_call(it["call_id"], it["name"], it["arguments"]);
        // Calls that follow an assistant turn belong to it.
        if (!history.empty() && history.back()["role"] == "assistant") {
          json& last = history.back();
          if (!last.contains("tool_calls")) last["tool_calls"] = json::array();
          last["tool_calls"].push_back(call);
        } else {
          history.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call})}});
        }
      } else if (type == "function_call_output") {
        const json* id = field(it, "call_id");
        if (!id || !id->is_string()) wrong(at + ".call_id", "expected a string");
        const json* out = field(it, "output");
        if (!out) wrong(at + ".output", "required");
        history.push_back({{"role", "tool"}, {"tool_call_id", *id},
                           {"content", text_of(*out, at + ".output", {"input_text", "output_text", "text"})}});
      } else if (type == "reasoning") {
        // Earlier reasoning: chat templates drop it from the history, as here.
      } else {
        wrong(at + ".type", "items of type " + json(type).dump() + " are not supported");
      }
    }
  } else {
    wrong("input", "expected a string or an array of items");
  }
  json msgs = json::array();
  if (const json* ins = field(b, "instructions")) {
    if (!ins->is_string()) wrong("instructions", "expected a string");
    msgs.push_back({{"role", "system"}, {"content", *ins}});
  }
  for (const json& m : history) msgs.push_back(m);
  chat["messages"] = std::move(msgs);
  if (const json* tools = field(b, "tools")) {
    if (!tools->is_array()) wrong("tools", "expected an array");
    json out = json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || t.value("type", json()) != "function")
        wrong(at + ".type", "only tools of type \"function\" are supported");
      out.push_back(chat_tool(t, "parameters"));
    }
    chat["tools"] = std::move(out);
  }
  if (const json* tc = field(b, "tool_choice")) {
    if (tc->is_object() && tc->value("type", json()) == "function")
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc->value("name", json())}}}};
    else
      chat["tool_choice"] = *tc;
  }
  return chat;
}

class ResponsesReply : public AgentReply {
 public:
  ResponsesReply(std::string model, json echo, json history, bool store, ResponseStore& kept)
      : model_(std::move(model)), echo_(std::move(echo)), history_(std::move(history)), store_(store), kept_(kept),
        id_(new_id("resp_")), created_(int64_t(std::time(nullptr))) {}

  json response(const RequestResult& res, const ChatOutputParser& out) override {
    json items = json::array();
    if (!out.reasoning().empty()) items.push_back(reasoning_item(new_id("rs_"), out.reasoning()));
    if (!out.content().empty() || out.calls().empty()) items.push_back(message_item(new_id("msg_"), out.content()));
    for (const ToolCall& c : out.calls()) items.push_back(call_item(c));
    return finished(res, out, std::move(items));
  }

  std::vector<SseEvent> begin(int64_t) override {
    std::vector<SseEvent> ev;
    json r = skeleton("in_progress");
    add(ev, "response.created", {{"response", r}});
    add(ev, "response.in_progress", {{"response", r}});
    return ev;
  }

  std::vector<SseEvent> delta(const OutputDelta& d) override {
    std::vector<SseEvent> ev;
    if (!d.reasoning.empty()) {
      if (open_ != "reasoning") open(ev, reasoning_item(new_id("rs_"), ""), "reasoning");
      text_ += d.reasoning;
      add(ev, "response.reasoning_text.delta",
          {{"item_id", items_.back()["id"]}, {"output_index", items_.size() - 1}, {"content_index", 0}, {"delta", d.reasoning}});
    }
    if (!d.content.empty()) {
      if (open_ != "message") {
        open(ev, message_item(new_id("msg_"), ""), "message");
        add(ev, "response.content_part.added",
            {{"item_id", items_.back()["id"]}, {"output_index", items_.size() - 1}, {"content_index", 0},
             {"part", text_part("")}});
      }
      text_ += d.content;
      add(ev, "response.output_text.delta",
          {{"item_id", items_.back()["id"]}, {"output_index", items_.size() - 1}, {"content_index", 0},
           {"delta", d.content}, {"logprobs", json::array()}});
    }
    for (const ToolCall& c : d.calls) {
      close(ev);
      json item = call_item(c);
      item["arguments"] = "";
      item["status"] = "in_progress";
      items_.push_back(item);
      const size_t at = items_.size() - 1;
      add(ev, "response.output_item.added", {{"output_index", at}, {"item", item}});
      add(ev, "response.function_call_arguments.delta", {{"item_id", item["id"]}, {"output_index", at}, {"delta", c.arguments}});
      add(ev, "response.function_call_arguments.done",
          {{"item_id", item["id"]}, {"output_index", at}, {"name", c.name}, {"arguments", c.arguments}});
      items_.back() = call_item(c);
      items_.back()["id"] = item["id"];
      add(ev, "response.output_item.done", {{"output_index", at}, {"item", items_.back()}});
    }
    return ev;
  }

  std::vector<SseEvent> end(const RequestResult& res, const ChatOutputParser& out) override {
    std::vector<SseEvent> ev;
    if (items_.empty()) {  // an empty reply is still one message
      open(ev, message_item(new_id("msg_"), ""), "message");
      add(ev, "response.content_part.added",
          {{"item_id", items_.back()["id"]}, {"output_index", 0}, {"content_index", 0}, {"part", text_part("")}});
    }
    close(ev);
    const json r = finished(res, out, items_);
    add(ev, r["status"] == "completed" ? "response.completed" : "response.incomplete", {{"response", r}});
    return ev;
  }

  json error_body(const ApiError& e) const override { return e.body(); }

 private:
  static json text_part(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
  }
  static json message_item(const std::string& id, const std::string& text) {
    return {{"type", "message"}, {"id", id}, {"status", "completed"}, {"role", "assistant"},
            {"content", json::array({text_part(text)})}};
  }
  static json reasoning_item(const std::string& id, const std::string& text) {
    return {{"type", "reasoning"}, {"id", id}, {"summary", json::array()},
            {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
  }
  static json call_item(const ToolCall& c) {
    return {{"type", "function_call"}, {"id", "fc_" + c.id}, {"call_id", c.id}, {"name", c.name},
            {"arguments", c.arguments}, {"status", "completed"}};
  }

  json skeleton(const char* status) const {
    json r = {{"id", id_}, {"object", "response"}, {"created_at", created_}, {"status", status},
              {"error", nullptr}, {"incomplete_details", nullptr}, {"model", model_}, {"output", json::array()},
              {"usage", nullptr}};
    for (const auto& [k, v] : echo_.items()) r[k] = v;
    return r;
  }

  json finished(const RequestResult& res, const ChatOutputParser& out, json items) {
    const bool complete = res.reason == FinishReason::Stop;
    json r = skeleton(complete ? "completed" : "incomplete");
    if (!complete) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    r["output"] = std::move(items);
    r["usage"] = {{"input_tokens", res.prompt_tokens},
                  {"input_tokens_details", {{"cached_tokens", res.cached_tokens}}},
                  {"output_tokens", res.completion_tokens},
                  {"output_tokens_details", {{"reasoning_tokens", 0}}},
                  {"total_tokens", res.prompt_tokens + res.completion_tokens}};
    if (store_) {
      json conv = history_;
      conv.push_back(assistant_message(out));
      kept_.put(id_, std::move(conv));
    }
    return r;
  }

  void add(std::vector<SseEvent>& ev, const char* type, json data) {
    json e = {{"type", type}, {"sequence_number", seq_++}};
    for (auto& [k, v] : data.items()) e[k] = v;
    ev.push_back({type, std::move(e)});
  }
  void open(std::vector<SseEvent>& ev, json item, const char* kind) {
    close(ev);
    item["status"] = "in_progress";
    if (std::string(kind) == "message") item["content"] = json::array();
    items_.push_back(item);
    add(ev, "response.output_item.added", {{"output_index", items_.size() - 1}, {"item", item}});
    open_ = kind;
    text_.clear();
  }
  void close(std::vector<SseEvent>& ev) {
    if (open_.empty()) return;
    json& item = items_.back();
    const size_t at = items_.size() - 1;
    if (open_ == "message") {
      add(ev, "response.output_text.done",
          {{"item_id", item["id"]}, {"output_index", at}, {"content_index", 0}, {"text", text_}, {"logprobs", json::array()}});
      add(ev, "response.content_part.done",
          {{"item_id", item["id"]}, {"output_index", at}, {"content_index", 0}, {"part", text_part(text_)}});
      item = message_item(item["id"], text_);
    } else {
      add(ev, "response.reasoning_text.done", {{"item_id", item["id"]}, {"output_index", at}, {"content_index", 0}, {"text", text_}});
      item = reasoning_item(item["id"], text_);
    }
    add(ev, "response.output_item.done", {{"output_index", at}, {"item", item}});
    open_.clear();
  }

  std::string model_;
  json echo_;     // request fields a response repeats (instructions, tools, ...)
  json history_;  // the conversation before this reply, without the instructions
  bool store_;
  ResponseStore& kept_;
  std::string id_;
  int64_t created_;
  json items_ = json::array();  // streamed output items
  std::string open_, text_;     // the open item's kind and text
  int64_t seq_ = 0;
};

}  // namespace

void ResponseStore::put(const std::string& id, json messages) {
  std::lock_guard lk(mu_);
  if (items_.emplace(id, std::move(messages)).second) order_.push_back(id);
  while (order_.size() > capacity_) {
    items_.erase(order_.front());
    order_.pop_front();
  }
}

std::optional<json> ResponseStore::get(const std::string& id) const {
  std::lock_guard lk(mu_);
  const auto it = items_.find(id);
  if (it == items_.end()) return std::nullopt;
  return it->second;
}

json anthropic_error_body(const ApiError& e) {
  const char* type = e.status == 401 ? "authentication_error" : e.status == 404 ? "not_found_error"
                     : e.status == 413 ? "request_too_large" : e.status >= 500 ? "api_error" : "invalid_request_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}};
}

std::unique_ptr<AgentReply> parse_agent_request(AgentApi api, const std::string& body_text, uint64_t seed,
                                                const std::string& model, ResponseStore& store,
                                                const RequestDefaults& defaults) {
  const json body = parse_json_object(body_text);
  std::unique_ptr<AgentReply> reply;
  if (api == AgentApi::Messages) {
    const json chat = messages_to_chat(body);
    reply = std::make_unique<MessagesReply>(model);
    reply->request = chat_request(chat, seed, defaults);
  } else {
    json history;
    const json chat = responses_to_chat(body, store, history);
    json echo = json::object();
    for (const char* k : {"instructions", "max_output_tokens", "previous_response_id", "temperature", "top_p",
                          "parallel_tool_calls", "tool_choice", "tools", "metadata"})
      echo[k] = body.contains(k) ? body[k] : json(nullptr);
    if (echo["tools"].is_null()) echo["tools"] = json::array();
    if (echo["tool_choice"].is_null()) echo["tool_choice"] = "auto";
    if (echo["parallel_tool_calls"].is_null()) echo["parallel_tool_calls"] = true;
    if (echo["metadata"].is_null()) echo["metadata"] = json::object();
    echo["store"] = body.value("store", json(true)).is_boolean() ? body.value("store", json(true)) : json(true);
    echo["text"] = {{"format", {{"type", "text"}}}};
    echo["truncation"] = "disabled";
    reply = std::make_unique<ResponsesReply>(model, echo, std::move(history), echo["store"] == true, store);
    reply->request = chat_request(chat, seed, defaults);
  }
  return reply;
}

}  // namespace ptllm::server
