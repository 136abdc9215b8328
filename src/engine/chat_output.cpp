#include "engine/chat_output.h"

#include <algorithm>
#include <mutex>
#include <random>

namespace ptllm {

namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr const char* kSpace = " \t\r\n";
// A Mistral call's name longer than this without [ARGS] is not a call.
constexpr size_t kMaxNameBytes = 256;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

// The length of the longest end of `s` that `marker` begins with (a marker cut by the stream).
size_t partial_marker(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

// Where a JSON value that starts at s[0] ('{' or '[') ends (one past it), or npos while unfinished.
size_t json_value_end(std::string_view s) {
  int depth = 0;
  bool in_string = false, escape = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

json parse_json(std::string_view s) { return json::parse(s.begin(), s.end(), nullptr, false); }

// A call's arguments as JSON text: an object, or a string holding one (some models write that).
std::optional<std::string> arguments_text(const json& a) {
  if (a.is_object()) return a.dump();
  if (a.is_string()) {
    const json inner = parse_json(a.get<std::string>());
    if (inner.is_object()) return inner.dump();
  }
  return std::nullopt;
}

struct Parsed {
  std::string name, arguments, id;
};

// {"name": ..., "arguments" | "parameters": {...}, "id"?}
std::optional<Parsed> json_call(const json& j) {
  if (!j.is_object()) return std::nullopt;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  Parsed p{name->get<std::string>(), "{}", ""};
  for (const char* key : {"arguments", "parameters"}) {
    const auto a = j.find(key);
    if (a == j.end()) continue;
    const auto text = arguments_text(*a);
    if (!text) return std::nullopt;
    p.arguments = *text;
    break;
  }
  if (const auto id = j.find("id"); id != j.end() && id->is_string()) p.id = id->get<std::string>();
  return p;
}

// The JSON Schema type of a tool's parameter, "" when the tools do not say.
std::string parameter_type(const json& tools, const std::string& fn, const std::string& param) {
  if (!tools.is_array()) return "";
  for (const json& t : tools) {
    const json* f = t.contains("function") ? &t["function"] : &t;
    if (!f->is_object() || f->value("name", json()) != fn) continue;
    const json* props = f->contains("parameters") && (*f)["parameters"].is_object() &&
                                (*f)["parameters"].contains("properties")
                            ? &(*f)["parameters"]["properties"]
                            : nullptr;
    if (!props || !props->is_object() || !props->contains(param)) return "";
    const json& p = (*props)[param];
    return p.is_object() && p.contains("type") && p["type"].is_string() ? p["type"].get<std::string>() : "";
  }
  return "";
}

// Qwen3-Coder's XML: <function=NAME> (<parameter=P>\nVALUE\n</parameter>)* </function>, the values
// typed by the tool's schema (a string stays text; anything else is read as JSON when it parses).
std::optional<Parsed> xml_call(std::string_view body, const json& tools) {
  body = trim(body);
  constexpr std::string_view fn_open = "<function=", fn_close = "</function>";
  constexpr std::string_view p_open = "<parameter=", p_close = "</parameter>";
  if (!body.starts_with(fn_open) || !body.ends_with(fn_close)) return std::nullopt;
  const size_t name_end = body.find('>');
  Parsed p;
  p.name = std::string(trim(body.substr(fn_open.size(), name_end - fn_open.size())));
  if (p.name.empty()) return std::nullopt;
  std::string_view rest = body.substr(name_end + 1, body.size() - fn_close.size() - name_end - 1);
  json args = json::object();
  for (rest = trim(rest); !rest.empty(); rest = trim(rest)) {
    if (!rest.starts_with(p_open)) return std::nullopt;
    const size_t key_end = rest.find('>');
    const size_t close = rest.find(p_close);
    if (key_end == std::string_view::npos || close == std::string_view::npos || close < key_end) return std::nullopt;
    const std::string key(trim(rest.substr(p_open.size(), key_end - p_open.size())));
    std::string_view value = rest.substr(key_end + 1, close - key_end - 1);
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    const std::string type = parameter_type(tools, p.name, key);
    json v = type.empty() || type == "string" ? json() : parse_json(value);
    args[key] = v.is_discarded() || (v.is_null() && type != "null") ? json(std::string(value)) : v;
    rest.remove_prefix(close + p_close.size());
  }
  p.arguments = args.dump();
  return p;
}

// Llama 3.x: the whole reply is one or more {"name", "parameters"} objects (after an optional
// <|python_tag|>), separated by whitespace or ';'.
std::optional<std::vector<Parsed>> llama3_calls(std::string_view s) {
  s = trim(s);
  if (s.starts_with(kPythonTag)) s.remove_prefix(kPythonTag.size());
  std::vector<Parsed> out;
  for (;;) {
    const size_t b = s.find_first_not_of(" \t\r\n;");
    if (b == std::string_view::npos) break;
    s.remove_prefix(b);
    if (s[0] != '{') return std::nullopt;
    const size_t end = json_value_end(s);
    if (end == std::string_view::npos) return std::nullopt;
    auto call = json_call(parse_json(s.substr(0, end)));
    if (!call) return std::nullopt;
    out.push_back(std::move(*call));
    s.remove_prefix(end);
  }
  if (out.empty()) return std::nullopt;
  return out;
}

}  // namespace

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::None: return "none";
    case ToolCallFormat::Hermes: return "hermes";
    case ToolCallFormat::Llama3: return "llama3";
    case ToolCallFormat::Mistral: return "mistral";
    case ToolCallFormat::Qwen3Coder: return "qwen3-coder";
  }
  return "none";
}

std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name) {
  for (ToolCallFormat f : {ToolCallFormat::None, ToolCallFormat::Hermes, ToolCallFormat::Llama3,
                           ToolCallFormat::Mistral, ToolCallFormat::Qwen3Coder})
    if (name == tool_call_format_name(f)) return f;
  return std::nullopt;
}

OutputFormat detect_output_format(std::string_view src, std::string_view tool_call_format) {
  const auto has = [&](std::string_view s) { return src.find(s) != std::string_view::npos; };
  OutputFormat f;
  f.reasoning = has(kThinkOpen);
  if (has(kHermesOpen))
    f.tools = has("<function=") ? ToolCallFormat::Qwen3Coder : ToolCallFormat::Hermes;
  else if (has(kMistralOpen))
    f.tools = ToolCallFormat::Mistral;
  else if (has("<|start_header_id|>") && (has(kPythonTag) || has("\"parameters\"")))
    f.tools = ToolCallFormat::Llama3;
  if (const auto forced = tool_call_format_from_name(tool_call_format)) f.tools = *forced;
  f.short_ids = f.tools == ToolCallFormat::Mistral;
  f.name_args = f.tools == ToolCallFormat::Mistral && has(kMistralArgs);
  return f;
}

ChatOutputOptions chat_output_options(const OutputFormat& format, bool reasoning, const nlohmann::ordered_json& tools,
                                      bool parallel_calls, std::string_view prompt) {
  ChatOutputOptions o;
  o.format = format;
  o.parse_tools = tools.is_array() && !tools.empty() && format.tools != ToolCallFormat::None;
  o.parse_reasoning = format.reasoning && reasoning;
  o.in_reasoning = o.parse_reasoning && prompt_opens_reasoning(prompt);
  o.max_calls = parallel_calls ? std::numeric_limits<size_t>::max() : 1;
  o.tools = tools;
  return o;
}

bool needs_special_text(const ChatOutputOptions& o) {
  return o.parse_tools && (o.format.tools == ToolCallFormat::Mistral || o.format.tools == ToolCallFormat::Llama3);
}

std::string random_alnum_id(std::string_view prefix, int n) {
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard lk(mu);
  std::string id(prefix);
  for (int i = 0; i < n; ++i) id += kAlnum[rng() % (sizeof kAlnum - 1)];
  return id;
}

void OutputDelta::append(OutputDelta&& d) {
  content += d.content;
  reasoning += d.reasoning;
  for (ToolCall& c : d.calls) calls.push_back(std::move(c));
}

bool prompt_opens_reasoning(std::string_view prompt) {
  const size_t end = prompt.find_last_not_of(kSpace);
  return end != std::string_view::npos && prompt.substr(0, end + 1).ends_with(kThinkOpen);
}

ChatOutputParser::ChatOutputParser(ChatOutputOptions o) : o_(std::move(o)) {
  if (o_.format.tools == ToolCallFormat::None) o_.parse_tools = false;
  if (o_.parse_reasoning && o_.in_reasoning) state_ = State::Reasoning;
  think_allowed_ = o_.parse_reasoning && !o_.in_reasoning;
}

OutputDelta ChatOutputParser::push(std::string_view text) {
  OutputDelta d;
  buf_ += text;
  run(false, d);
  return d;
}

OutputDelta ChatOutputParser::finish() {
  OutputDelta d;
  run(true, d);
  if (calls_.empty()) {  // whitespace before a call is dropped; at the end of a plain reply it is text
    d.content += held_ws_;
    content_ += held_ws_;
  }
  held_ws_.clear();
  return d;
}

void ChatOutputParser::run(bool final, OutputDelta& d) {
  for (;;) {
    bool more = false;
    switch (state_) {
      case State::Start: more = step_start(final, d); break;
      case State::Reasoning: more = step_reasoning(final, d); break;
      case State::Text: more = step_text(final, d); break;
      case State::Call: more = step_call(final, d); break;
      case State::Llama3: more = step_llama3(final, d); break;
      case State::Ignore: buf_.clear(); break;
    }
    if (!more) return;
  }
}

// The reply's beginning: a <think>, a Llama 3 call, or text.
bool ChatOutputParser::step_start(bool final, OutputDelta& d) {
  const bool llama3 = o_.parse_tools && o_.format.tools == ToolCallFormat::Llama3;
  if (think_allowed_ || llama3) {
    const size_t b = buf_.find_first_not_of(kSpace);
    const std::string_view rest = b == std::string::npos ? std::string_view() : std::string_view(buf_).substr(b);
    const auto undecided = [&](std::string_view marker) { return marker.starts_with(rest); };
    if (think_allowed_ && rest.starts_with(kThinkOpen)) {
      buf_.erase(0, b + kThinkOpen.size());
      think_allowed_ = false;
      state_ = State::Reasoning;
      return true;
    }
    if (llama3 && (rest.starts_with('{') || rest.starts_with(kPythonTag))) {
      if (drop_ws_) buf_.erase(0, b);
      state_ = State::Llama3;
      return true;
    }
    if (!final && ((think_allowed_ && undecided(kThinkOpen)) || (llama3 && undecided(kPythonTag)))) return false;
  }
  if (drop_ws_) {
    const size_t b = buf_.find_first_not_of(kSpace);
    buf_.erase(0, b == std::string::npos ? buf_.size() : b);
    if (buf_.empty() && !final) return false;  // more whitespace may follow
  }
  drop_ws_ = false;
  think_allowed_ = false;
  state_ = State::Text;
  return true;
}

bool ChatOutputParser::step_reasoning(bool final, OutputDelta& d) {
  const size_t pos = buf_.find(kThinkClose);
  if (pos != std::string::npos) {
    emit_reasoning(std::string_view(buf_).substr(0, pos), d);
    buf_.erase(0, pos + kThinkClose.size());
    drop_ws_ = true;
    state_ = State::Start;
    return true;
  }
  const size_t keep = final ? 0 : partial_marker(buf_, kThinkClose);
  emit_reasoning(std::string_view(buf_).substr(0, buf_.size() - keep), d);
  buf_.erase(0, buf_.size() - keep);
  return false;
}

bool ChatOutputParser::step_text(bool final, OutputDelta& d) {
  std::string_view marker;
  if (o_.parse_tools) {
    if (o_.format.tools == ToolCallFormat::Hermes || o_.format.tools == ToolCallFormat::Qwen3Coder) marker = kHermesOpen;
    if (o_.format.tools == ToolCallFormat::Mistral) marker = kMistralOpen;
  }
  const size_t pos = marker.empty() ? std::string::npos : buf_.find(marker);
  if (pos != std::string::npos) {
    emit_content(std::string_view(buf_).substr(0, pos), d);
    buf_.erase(0, pos + marker.size());
    marker_ = std::string(marker);
    scan_ = 0;
    value_started_ = false;
    state_ = State::Call;
    return true;
  }
  const size_t keep = final || marker.empty() ? 0 : partial_marker(buf_, marker);
  emit_content(std::string_view(buf_).substr(0, buf_.size() - keep), d);
  buf_.erase(0, buf_.size() - keep);
  return false;
}

bool ChatOutputParser::step_call(bool final, OutputDelta& d) {
  const auto done = [&](size_t consumed) {
    buf_.erase(0, consumed);
    state_ = calls_.size() >= o_.max_calls ? State::Ignore : State::Text;
    return true;
  };
  if (o_.format.tools != ToolCallFormat::Mistral) {
    const size_t pos = buf_.find(kHermesClose, scan_);
    if (pos == std::string::npos) {
      if (final) return malformed(final, d), true;
      scan_ = buf_.size() - std::min(buf_.size(), kHermesClose.size() - 1);
      return false;
    }
    const std::string_view body = std::string_view(buf_).substr(0, pos);
    const auto call = o_.format.tools == ToolCallFormat::Qwen3Coder ? xml_call(body, o_.tools)
                                                                    : json_call(parse_json(trim(body)));
    if (call)
      add_call(call->name, call->arguments, call->id, d);
    else
      emit_content(marker_ + std::string(body) + std::string(kHermesClose), d);
    return done(pos + kHermesClose.size());
  }
  // Mistral: [TOOL_CALLS] then a JSON array of calls, or a name, [CALL_ID]id?, [ARGS] and an object.
  if (!value_started_) {
    const size_t b = buf_.find_first_not_of(kSpace);
    if (b == std::string::npos) return final ? (malformed(final, d), true) : false;
    array_form_ = buf_[b] == '[' && !std::string_view(buf_).substr(b).starts_with(kMistralCallId);
    if (array_form_) {
      value_begin_ = b;
    } else {
      // Looked for within kMaxNameBytes only, so the outcome does not depend on the pieces' sizes.
      size_t args = buf_.find(kMistralArgs, std::max(scan_, b));
      if (args != std::string::npos && args - b > kMaxNameBytes) return malformed(final, d), true;
      if (args == std::string::npos) {
        if (final || buf_.size() - b >= kMaxNameBytes + kMistralArgs.size()) return malformed(final, d), true;
        scan_ = buf_.size() - std::min(buf_.size(), kMistralArgs.size() - 1);
        return false;
      }
      std::string_view head = std::string_view(buf_).substr(b, args - b);
      call_id_.clear();
      if (const size_t id = head.find(kMistralCallId); id != std::string_view::npos) {
        call_id_ = std::string(trim(head.substr(id + kMistralCallId.size())));
        head = head.substr(0, id);
      }
      call_name_ = std::string(trim(head));
      value_begin_ = args + kMistralArgs.size();
    }
    value_started_ = true;
    scan_ = value_begin_;
    depth_ = 0;
    in_string_ = escape_ = false;
  }
  // The value, scanned from where the last piece ended.
  size_t end = std::string::npos;
  for (size_t i = scan_; i < buf_.size() && end == std::string::npos; ++i) {
    const char c = buf_[i];
    if (depth_ == 0) {
      if (is_space(c)) continue;
      if (c != (array_form_ ? '[' : '{')) return malformed(final, d), true;
      value_begin_ = i;
    }
    if (in_string_) {
      if (escape_) escape_ = false;
      else if (c == '\\') escape_ = true;
      else if (c == '"') in_string_ = false;
    } else if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if ((c == '}' || c == ']') && --depth_ == 0) {
      end = i + 1;
    }
  }
  if (end == std::string::npos) {
    if (final) return malformed(final, d), true;
    scan_ = buf_.size();
    return false;
  }
  const json value = parse_json(std::string_view(buf_).substr(value_begin_, end - value_begin_));
  std::vector<Parsed> calls;
  bool ok = !value.is_discarded();
  if (ok && array_form_) {
    for (const json& c : value) {
      auto p = json_call(c);
      if (!p) ok = false;
      else calls.push_back(std::move(*p));
    }
    ok = ok && !calls.empty();
  } else if (ok) {
    const auto args = arguments_text(value);
    ok = args.has_value() && !call_name_.empty();
    if (ok) calls.push_back({call_name_, *args, call_id_});
  }
  if (!ok) {
    emit_content(marker_ + buf_.substr(0, end), d);
  } else {
    for (Parsed& p : calls) add_call(std::move(p.name), std::move(p.arguments), std::move(p.id), d);
  }
  return done(end);
}

bool ChatOutputParser::step_llama3(bool final, OutputDelta& d) {
  if (!final) return false;  // a reply that starts as a call is one only if all of it parses
  if (auto calls = llama3_calls(buf_)) {
    for (Parsed& p : *calls) add_call(std::move(p.name), std::move(p.arguments), std::move(p.id), d);
  } else {
    emit_content(buf_, d);
  }
  buf_.clear();
  state_ = State::Ignore;
  return false;
}

void ChatOutputParser::emit_content(std::string_view s, OutputDelta& d) {
  if (!o_.parse_tools) {
    d.content += s;
    content_ += s;
    return;
  }
  // Trailing whitespace waits: it is dropped if a call comes next.
  std::string t = std::exchange(held_ws_, {});
  t += s;
  const size_t end = t.find_last_not_of(kSpace);
  if (end == std::string::npos) {
    held_ws_ = std::move(t);
    return;
  }
  held_ws_ = t.substr(end + 1);
  t.resize(end + 1);
  d.content += t;
  content_ += t;
}

void ChatOutputParser::emit_reasoning(std::string_view s, OutputDelta& d) {
  d.reasoning += s;
  reasoning_ += s;
}

void ChatOutputParser::add_call(std::string name, std::string arguments, std::string id, OutputDelta& d) {
  if (calls_.size() >= o_.max_calls) return;
  held_ws_.clear();
  if (id.empty()) id = o_.format.short_ids ? random_alnum_id("", 9) : random_alnum_id("call_", 24);
  ToolCall c{std::move(id), std::move(name), std::move(arguments)};
  calls_.push_back(c);
  d.calls.push_back(std::move(c));
}

void ChatOutputParser::malformed(bool final, OutputDelta& d) {
  // At the end the rest is text; before it, only the marker is, and the text after it is read again
  // (it may hold the next call).
  emit_content(final ? marker_ + buf_ : marker_, d);
  if (final) buf_.clear();
  state_ = State::Text;
}

}  // namespace ptllm
