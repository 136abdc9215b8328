#include "server/api.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>

namespace ptllm::server {

json ApiError::body() const {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return {{"error", e}};
}

ApiError bad_request(std::string message, std::string param, std::string code) {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

namespace {

const char* type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

[[noreturn]] void wrong_type(const std::string& field, const char* want, const json& got) {
  throw bad_request(field + ": expected " + std::string(want) + ", got " + type_name(got), field);
}

// The field when present and not null, else nullptr.
const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// OpenAI's tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}], as
// given (the template renders them; a template may read any of these fields, so their types are
// checked here rather than be a template error).
json read_tools(const json& tools) {
  if (!tools.is_array()) wrong_type("tools", "an array of {\"type\": \"function\", \"function\": {...}}", tools);
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    const json& t = tools[i];
    if (!t.is_object()) wrong_type(at, "an object", t);
    if (const json* type = field(t, "type"); type && (!type->is_string() || *type != "function"))
      throw bad_request(at + ".type: expected \"function\", got " + type->dump(), at + ".type");
    const json* fn = field(t, "function");
    if (!fn) throw bad_request(at + ".function: missing (an object with a name)", at + ".function");
    if (!fn->is_object()) wrong_type(at + ".function", "an object", *fn);
    const json* name = field(*fn, "name");
    if (!name) throw bad_request(at + ".function.name: missing", at + ".function.name");
    if (!name->is_string()) wrong_type(at + ".function.name", "a string", *name);
    if (name->get<std::string>().empty()) throw bad_request(at + ".function.name: must not be empty", at + ".function.name");
    if (const json* d = field(*fn, "description"); d && !d->is_string())
      wrong_type(at + ".function.description", "a string", *d);
    if (const json* p = field(*fn, "parameters"); p && !p->is_object())
      wrong_type(at + ".function.parameters", "an object (a JSON Schema)", *p);
    if (const json* st = field(*fn, "strict"); st && !st->is_boolean()) wrong_type(at + ".function.strict", "a boolean", *st);
  }
  return tools;
}

void read_number(const json& body, const char* name, double lo, double hi, float& out) {
  const json* v = field(body, name);
  if (!v) return;
  if (!v->is_number()) wrong_type(name, "a number", *v);
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    throw bad_request(std::string(name) + ": must be between " + json(lo).dump() + " and " + json(hi).dump() +
                          " (got " + v->dump() + ")",
                      name);
  out = float(d);
}

bool read_int(const json& body, const char* name, int64_t lo, int64_t hi, int64_t& out) {
  const json* v = field(body, name);
  if (!v) return false;
  if (!v->is_number_integer()) wrong_type(name, "an integer", *v);
  const int64_t i = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v->get<int64_t>();
  if (i < lo || i > hi)
    throw bad_request(std::string(name) + ": must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                          " (got " + v->dump() + ")",
                      name);
  out = i;
  return true;
}

bool read_bool(const json& body, const char* name, bool& out) {
  const json* v = field(body, name);
  if (!v) return false;
  if (!v->is_boolean()) wrong_type(name, "a boolean", *v);
  out = v->get<bool>();
  return true;
}

std::vector<std::string> read_stops(const json& body) {
  const json* v = field(body, "stop");
  if (!v) return {};
  const json list = v->is_array() ? *v : json::array({*v});
  std::vector<std::string> out;
  for (const json& s : list) {
    if (!s.is_string()) wrong_type("stop", "a string or an array of strings", *v);
    if (s.get<std::string>().empty()) throw bad_request("stop: a stop string is empty", "stop");
    out.push_back(s.get<std::string>());
  }
  return out;
}

void read_content(const json& content, const std::string& at) {
  if (content.is_null() || content.is_string()) return;
  if (!content.is_array()) wrong_type(at, "a string or an array of content parts", content);
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string p = at + "[" + std::to_string(i) + "]";
    if (!part.is_object()) wrong_type(p, "an object", part);
    const auto type = part.find("type");
    if (type == part.end() || !type->is_string()) throw bad_request(p + ".type: expected a string", p);
    if (*type != "text")
      throw bad_request(p + ".type: only \"text\" content parts are supported (got " + type->dump() + ")", p);
    const auto text = part.find("text");
    if (text == part.end() || !text->is_string()) throw bad_request(p + ".text: expected a string", p);
  }
}

// An assistant message's tool_calls, as the OpenAI API sends them back: their `arguments` strings
// become objects, since templates write `arguments | tojson` (as llama-server and vLLM do).
void read_history_calls(json& msg, const std::string& at) {
  json& calls = msg["tool_calls"];
  if (calls.is_null()) return;
  if (!calls.is_array()) wrong_type(at + ".tool_calls", "an array", calls);
  for (size_t j = 0; j < calls.size(); ++j) {
    json& c = calls[j];
    const std::string cat = at + ".tool_calls[" + std::to_string(j) + "]";
    if (!c.is_object()) wrong_type(cat, "an object", c);
    if (const json* type = field(c, "type"); type && *type != "function")
      throw bad_request(cat + ".type: expected \"function\", got " + type->dump(), cat + ".type");
    if (const json* id = field(c, "id"); id && !id->is_string()) wrong_type(cat + ".id", "a string", *id);
    const auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object()) throw bad_request(cat + ".function: expected an object with a name", cat + ".function");
    const json* name = field(*fn, "name");
    if (!name || !name->is_string() || name->get<std::string>().empty())
      throw bad_request(cat + ".function.name: expected a non-empty string", cat + ".function.name");
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null()) {
      (*fn)["arguments"] = json::object();
    } else if (args->is_string()) {
      const std::string text = args->get<std::string>();
      json parsed = json::parse(text, nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object())
        throw bad_request(cat + ".function.arguments: not a JSON object (" +
                              (text.size() > 64 ? json(text.substr(0, 64) + "...").dump() : json(text).dump()) + ")",
                          cat + ".function.arguments");
      *args = std::move(parsed);
    } else if (!args->is_object()) {
      wrong_type(cat + ".function.arguments", "a JSON object as a string", *args);
    }
  }
}

json read_messages(const json& body) {
  const json* m = field(body, "messages");
  if (!m) throw bad_request("messages: required", "messages");
  if (!m->is_array()) wrong_type("messages", "an array", *m);
  if (m->empty()) throw bad_request("messages: must hold at least one message", "messages");
  json out = *m;
  for (size_t i = 0; i < out.size(); ++i) {
    json& msg = out[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) wrong_type(at, "an object", msg);
    const auto role = msg.find("role");
    if (role == msg.end() || !role->is_string()) throw bad_request(at + ".role: expected a string", at + ".role");
    static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};
    const std::string r = role->get<std::string>();
    if (std::find(std::begin(kRoles), std::end(kRoles), r) == std::end(kRoles))
      throw bad_request(at + ".role: unknown role " + role->dump(), at + ".role");
    const auto content = msg.find("content");
    const bool calls = msg.contains("tool_calls");
    if (calls && r != "assistant")
      throw bad_request(at + ".tool_calls: only assistant messages carry tool calls", at + ".tool_calls");
    if (content == msg.end() && !calls) throw bad_request(at + ".content: required", at + ".content");
    if (content != msg.end()) read_content(*content, at + ".content");
    if (calls) read_history_calls(msg, at);
    if (r == "tool") {
      const json* id = field(msg, "tool_call_id");
      if (!id) throw bad_request(at + ".tool_call_id: required in a tool message (the id of the call it answers)", at + ".tool_call_id");
      if (!id->is_string()) wrong_type(at + ".tool_call_id", "a string", *id);
    }
  }
  return out;
}

// tool_choice: "auto", "none", "required" (the reply is one or more calls) or a named function
// (the reply is calls of it); both enforced by a grammar over the model's call syntax.
void read_tool_choice(const json& body, ApiRequest& r) {
  const json* tc = field(body, "tool_choice");
  if (!tc) return;
  const bool has_tools = r.tools.is_array() && !r.tools.empty();
  if (tc->is_string()) {
    const std::string v = tc->get<std::string>();
    if (v == "auto") return;
    if (v == "none") {
      r.tool_choice_none = true;
      return;
    }
    if (v == "required") {
      if (!has_tools) throw bad_request("tool_choice: \"required\" needs tools", "tool_choice");
      r.tool_choice_required = true;
      return;
    }
    throw bad_request("tool_choice: expected \"auto\", \"none\", \"required\" or a function, got " + tc->dump(),
                      "tool_choice");
  }
  if (!tc->is_object()) wrong_type("tool_choice", "a string or an object", *tc);
  const json* fn = field(*tc, "function");
  const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
  if (!name || !name->is_string())
    throw bad_request("tool_choice.function.name: expected a string", "tool_choice.function.name");
  bool known = false;
  if (r.tools.is_array())
    for (const json& t : r.tools) known = known || t["function"]["name"] == *name;
  if (!known)
    throw bad_request("tool_choice.function.name: no tool named " + name->dump() + " in tools", "tool_choice.function.name");
  r.tool_choice_required = true;
  r.tool_choice_name = name->get<std::string>();
}

void set_constraint(ApiRequest& r, OutputConstraint c) {
  if (r.constraint.kind != OutputConstraint::Kind::None)
    throw bad_request(c.param + ": only one of grammar, json_schema and a JSON response_format may be given (" +
                          r.constraint.param + " was too)",
                      c.param);
  r.constraint = std::move(c);
}

// llama-server's fields: "grammar" (GBNF) and "json_schema" (a schema), for both endpoints.
void read_constraint_fields(const json& body, ApiRequest& r) {
  if (const json* g = field(body, "grammar")) {
    if (!g->is_string()) wrong_type("grammar", "a string (GBNF)", *g);
    if (!g->get<std::string>().empty())
      set_constraint(r, {OutputConstraint::Kind::Grammar, g->get<std::string>(), json(), "grammar"});
  }
  if (const json* js = field(body, "json_schema")) {
    if (!js->is_object() && !js->is_boolean()) wrong_type("json_schema", "a JSON Schema object", *js);
    set_constraint(r, {OutputConstraint::Kind::Schema, {}, *js, "json_schema"});
  }
}

// response_format: text, json_object (any object; llama-server's "schema" beside it too) and
// json_schema {name, schema, strict}.
void read_response_format(const json& body, ApiRequest& r) {
  const json* rf = field(body, "response_format");
  if (!rf) return;
  if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
  const json* type = field(*rf, "type");
  if (!type || !type->is_string()) throw bad_request("response_format.type: expected a string", "response_format.type");
  if (*type == "text") return;
  if (*type == "json_object") {
    if (const json* schema = field(*rf, "schema")) {
      if (!schema->is_object()) wrong_type("response_format.schema", "a JSON Schema object", *schema);
      return set_constraint(r, {OutputConstraint::Kind::Schema, {}, *schema, "response_format.schema"});
    }
    return set_constraint(r, {OutputConstraint::Kind::AnyObject, {}, json(), "response_format"});
  }
  if (*type == "json_schema") {
    const json* js = field(*rf, "json_schema");
    if (!js || !js->is_object()) throw bad_request("response_format.json_schema: expected an object {name, schema, strict}", "response_format.json_schema");
    if (const json* name = field(*js, "name"); name && !name->is_string())
      wrong_type("response_format.json_schema.name", "a string", *name);
    if (const json* strict = field(*js, "strict"); strict && !strict->is_boolean())
      wrong_type("response_format.json_schema.strict", "a boolean", *strict);
    const json* schema = field(*js, "schema");
    if (!schema) throw bad_request("response_format.json_schema.schema: required", "response_format.json_schema.schema");
    if (!schema->is_object() && !schema->is_boolean())
      wrong_type("response_format.json_schema.schema", "a JSON Schema object", *schema);
    return set_constraint(r, {OutputConstraint::Kind::Schema, {}, *schema, "response_format.json_schema.schema"});
  }
  throw bad_request("response_format.type: expected \"text\", \"json_object\" or \"json_schema\", got " + type->dump(),
                    "response_format.type");
}

void read_chat_options(const json& body, ApiRequest& r) {
  read_tool_choice(body, r);
  read_bool(body, "parallel_tool_calls", r.parallel_tool_calls);
  read_response_format(body, r);
  if (const json* f = field(body, "reasoning_format")) {
    if (!f->is_string() || (*f != "none" && *f != "deepseek" && *f != "auto"))
      throw bad_request("reasoning_format: expected \"none\", \"deepseek\" or \"auto\", got " + f->dump(),
                        "reasoning_format");
    r.reasoning = *f != "none";
  }
  if (const json* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object()) wrong_type("chat_template_kwargs", "an object", *k);
    r.template_kwargs = *k;
  }
}

// OpenAI's logit_bias: {"token id": bias from -100 to 100}. The ids are checked against the
// vocabulary by the server, which knows it.
std::vector<std::pair<int32_t, float>> read_logit_bias(const json& v) {
  if (!v.is_object()) wrong_type("logit_bias", "an object of token ids to biases", v);
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, bias] : v.items()) {
    char* end = nullptr;
    const long long id = std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || id < 0 || id > INT32_MAX)
      throw bad_request("logit_bias: " + json(key).dump() + " is not a token id", "logit_bias");
    if (!bias.is_number() || !std::isfinite(bias.get<double>()) || bias.get<double>() < -100 || bias.get<double>() > 100)
      throw bad_request("logit_bias: the bias of " + key + " must be a number from -100 to 100 (got " + bias.dump() + ")",
                        "logit_bias");
    out.emplace_back(int32_t(id), bias.get<float>());
  }
  return out;
}

// Every field is implemented, carries only metadata, or is refused by name: none is accepted and
// ignored when it would change the output.
void check_fields(const json& body, Endpoint endpoint) {
  static const std::set<std::string> common = {
      "model", "temperature", "top_p", "min_p", "top_k", "repeat_penalty", "repeat_last_n", "presence_penalty",
      "frequency_penalty", "seed", "max_tokens", "n", "stop", "stream", "stream_options", "ignore_eos", "logit_bias",
      "logprobs", "grammar", "json_schema", "speculative.n_max", "speculative.n_min", "n_cache_reuse",
      // metadata: no effect on the output
      "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "cache_prompt"};
  static const std::set<std::string> chat = {"messages", "tools", "tool_choice", "parallel_tool_calls",
                                             "response_format", "reasoning_format", "chat_template_kwargs",
                                             "max_completion_tokens", "top_logprobs"};
  static const std::set<std::string> completion = {"prompt"};
  for (const auto& [key, value] : body.items()) {
    if (common.count(key) || (endpoint == Endpoint::Chat ? chat : completion).count(key)) continue;
    // Fields whose neutral value changes nothing are accepted with that value.
    const bool neutral = value.is_null() || (key == "echo" && value == false) ||
                         (key == "best_of" && value == 1) || (key == "suffix" && value == "") ||
                         (key == "modalities" && value == json::array({"text"}));
    if (neutral) continue;
    static const std::set<std::string> known = {"top_logprobs", "echo", "best_of",
                                                "suffix", "modalities", "audio", "prediction", "functions",
                                                "function_call", "web_search_options", "reasoning_effort",
                                                "verbosity", "n_probs", "speculative.p_min"};
    throw bad_request(key + (known.count(key) ? ": not supported by this server" : ": unknown field") +
                          " (refused rather than ignored)",
                      key);
  }
}

void read_prompt(const json& body, ApiRequest& r) {
  const json* p = field(body, "prompt");
  if (!p) throw bad_request("prompt: required", "prompt");
  json v = *p;
  if (v.is_array() && v.size() == 1 && v[0].is_string()) v = v[0];  // ["text"]: one prompt
  if (v.is_string()) {
    r.prompt_text = v.get<std::string>();
    if (r.prompt_text.empty()) throw bad_request("prompt: empty", "prompt");
    return;
  }
  if (!v.is_array()) wrong_type("prompt", "a string or an array of token ids", v);
  if (v.empty()) throw bad_request("prompt: empty", "prompt");
  for (const json& id : v) {
    if (!id.is_number_integer()) throw bad_request("prompt: only one prompt per request (n = 1): a string or an array of token ids", "prompt");
    // Checked in the JSON's own form: get<int32_t>() would wrap 4294967301 to 5. The vocabulary's
    // bound is checked where the model is known (http_server.cpp).
    if (id.is_number_unsigned() ? id.get<uint64_t>() > uint64_t(INT32_MAX) : id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      throw bad_request("prompt: token id " + id.dump() + " is outside the vocabulary", "prompt");
    r.prompt_ids.push_back(id.get<int32_t>());
  }
}

void read_sampling(const json& body, ApiRequest& r) {
  SamplingConfig& s = r.params.sampling;
  read_number(body, "temperature", 0, 2, s.temperature);
  read_number(body, "top_p", 0, 1, s.top_p);
  read_number(body, "min_p", 0, 1, s.min_p);
  read_number(body, "repeat_penalty", 0.01, 10, s.repeat_penalty);
  int64_t i = 0;
  if (read_int(body, "top_k", 0, 1 << 30, i)) s.top_k = int(i);
  if (const json* seed = field(body, "seed")) {
    if (!seed->is_number_integer()) wrong_type("seed", "an integer", *seed);
    s.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : uint64_t(seed->get<int64_t>());
  }
  read_number(body, "presence_penalty", -2, 2, s.presence_penalty);
  read_number(body, "frequency_penalty", -2, 2, s.frequency_penalty);
  if (read_int(body, "repeat_last_n", -1, 1 << 30, i)) s.repeat_last_n = int(i);
}

}  // namespace

namespace {

// The deepest nesting of arrays and objects in `text`, brackets inside strings not counted; the scan
// stops once past `limit`. No recursion, so it is safe on any input; malformed JSON is left for
// the parser to report.
int nesting_depth(const std::string& text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) break;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

json parse_json_object(const std::string& text) {
  if (nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth)
    throw bad_request("the request body nests arrays and objects more than " + std::to_string(kMaxJsonDepth) +
                      " levels deep (the limit)");
  json body;
  try {
    body = json::parse(text);
  } catch (const json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 3: ..." without the prefix
    // (ill-formed UTF-8 is one of these; a number past double's range, 1e999, is out_of_range.406).
    const std::string what = e.what();
    const size_t at = what.find("] ");
    throw bad_request("the request body is not valid JSON: " + (at == std::string::npos ? what : what.substr(at + 2)));
  }
  if (!body.is_object()) throw bad_request("the request body must be a JSON object");
  return body;
}

ApiRequest parse_request(const std::string& body_text, Endpoint endpoint, uint64_t seed,
                         const RequestDefaults& defaults) {
  const json body = parse_json_object(body_text);
  check_fields(body, endpoint);
  ApiRequest r;
  r.endpoint = endpoint;
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) wrong_type("model", "a string", *m);
    r.model = m->get<std::string>();
  }
  if (endpoint == Endpoint::Chat) {
    r.messages = read_messages(body);
    if (const json* t = field(body, "tools")) r.tools = read_tools(*t);
    read_chat_options(body, r);
  } else {
    read_prompt(body, r);
  }
  read_constraint_fields(body, r);
  r.params.sampling = defaults.sampling;
  r.params.sampling.seed = seed;
  read_sampling(body, r);
  int64_t n = 0;
  r.params.max_tokens = endpoint == Endpoint::Completion ? 16 : 0;  // chat: until the context is full
  if (defaults.max_tokens > 0) {
    r.params.max_tokens = defaults.max_tokens;
    r.max_tokens_given = true;
  }
  for (const char* name : {"max_tokens", "max_completion_tokens"})
    if (read_int(body, name, 1, 1 << 30, n)) {
      r.params.max_tokens = int(n);
      r.max_tokens_given = true;
    }
  if (endpoint == Endpoint::Completion) r.max_tokens_given = true;
  if (read_int(body, "n", 1, 1 << 30, n) && n != 1) throw bad_request("n: only n = 1 is supported", "n");
  r.params.stops = read_stops(body);
  read_bool(body, "stream", r.stream);
  read_bool(body, "ignore_eos", r.params.ignore_eos);
  if (const json* lb = field(body, "logit_bias")) r.params.logit_bias = read_logit_bias(*lb);
  // Log-probabilities: chat's logprobs (a boolean) and top_logprobs (0-20); completions' logprobs
  // (the number of alternatives, 0-20).
  int64_t k = 0;
  if (endpoint == Endpoint::Chat) {
    read_bool(body, "logprobs", r.logprobs);
    if (read_int(body, "top_logprobs", 0, 20, k) && !r.logprobs)
      throw bad_request("top_logprobs: needs \"logprobs\": true", "top_logprobs");
    if (r.logprobs) r.params.top_logprobs = int(k);
  } else if (read_int(body, "logprobs", 0, 20, k)) {
    r.logprobs = true;
    r.params.top_logprobs = int(k);
  }
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    read_bool(*so, "include_usage", r.include_usage);
  }
  // llama-server's per-request speculation (the keys contain the dots): whether the server drafts
  // at all is checked where its options are known (http_server.cpp).
  if (read_int(body, "speculative.n_max", 0, 256, n)) r.params.spec_draft_max = int(n);
  if (read_int(body, "speculative.n_min", 0, 256, n)) r.params.spec_draft_min = int(n);
  if (read_int(body, "n_cache_reuse", 0, 1 << 30, k)) r.cache_reuse = int(k);
  return r;
}

const char* openai_finish_reason(FinishReason r, bool calls) {
  if (r != FinishReason::Stop) return "length";
  return calls ? "tool_calls" : "stop";
}

json timings_json(const RequestResult& res) {
  if (!res.speculative) return nullptr;
  return {{"draft_n", res.draft_n}, {"draft_n_accepted", res.draft_accepted}};
}

json usage_json(const RequestResult& res) {
  return {{"prompt_tokens", res.prompt_tokens},
          {"completion_tokens", res.completion_tokens},
          {"total_tokens", res.prompt_tokens + res.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", res.cached_tokens}}}};
}

namespace {

json envelope(const ApiRequest& r, bool chunk, const std::string& id, int64_t created, const std::string& model) {
  const char* object = r.endpoint == Endpoint::Chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                    : "text_completion";
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model}, {"system_fingerprint", "posttrainllm"}};
}

}  // namespace

namespace {

json bytes_json(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

json entry_json(const TokenLogprob::Entry& e) {
  return {{"token", e.text}, {"logprob", e.logprob}, {"bytes", bytes_json(e.text)}};
}

json call_json(const ToolCall& c) {
  return {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

}  // namespace

json logprobs_json(const ApiRequest& r, std::span<const TokenLogprob> lps, size_t text_offset) {
  if (!r.logprobs) return nullptr;
  if (r.endpoint == Endpoint::Chat) {
    json content = json::array();
    for (const TokenLogprob& lp : lps) {
      json e = entry_json(lp.chosen);
      e["top_logprobs"] = json::array();
      for (const auto& t : lp.top) e["top_logprobs"].push_back(entry_json(t));
      content.push_back(std::move(e));
    }
    return {{"content", content}};
  }
  json tokens = json::array(), values = json::array(), top = json::array(), offsets = json::array();
  for (const TokenLogprob& lp : lps) {
    tokens.push_back(lp.chosen.text);
    values.push_back(lp.chosen.logprob);
    json alt = json::object();
    for (const auto& t : lp.top) alt[t.text] = t.logprob;
    top.push_back(std::move(alt));
    offsets.push_back(text_offset);
    text_offset += lp.chosen.text.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", top}, {"text_offset", offsets}};
}

json response_json(const ApiRequest& r, const RequestResult& res, const std::string& id, int64_t created,
                   const std::string& model) {
  json out = envelope(r, false, id, created, model);
  json choice = {{"index", 0}};
  bool calls = false;
  if (r.endpoint == Endpoint::Chat) {
    ChatOutputParser parser(r.output);
    parser.push(res.text);
    parser.finish();
    calls = !parser.calls().empty();
    json message = {{"role", "assistant"}};
    message["content"] = calls && parser.content().empty() ? json(nullptr) : json(parser.content());
    if (!parser.reasoning().empty()) message["reasoning_content"] = parser.reasoning();
    if (calls) {
      message["tool_calls"] = json::array();
      for (const ToolCall& c : parser.calls()) message["tool_calls"].push_back(call_json(c));
    }
    choice["message"] = std::move(message);
  } else {
    choice["text"] = res.text;
  }
  choice["logprobs"] = logprobs_json(r, res.logprobs, 0);
  choice["finish_reason"] = openai_finish_reason(res.reason, calls);
  out["choices"] = json::array({choice});
  out["usage"] = usage_json(res);
  if (json t = timings_json(res); !t.is_null()) out["timings"] = std::move(t);
  return out;
}

json chunk_json(const ApiRequest& r, const OutputDelta& d, const RequestResult* res, bool first,
                const std::string& id, int64_t created, const std::string& model, size_t calls_before,
                bool any_calls) {
  json out = envelope(r, true, id, created, model);
  json choice = {{"index", 0}};
  if (r.endpoint == Endpoint::Chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if ((!res && d.reasoning.empty() && d.calls.empty()) || !d.content.empty()) delta["content"] = d.content;
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.calls.empty()) {
      // OpenAI's shape: a call's first delta has its index, id, type and name; its arguments follow.
      json calls = json::array();
      for (size_t i = 0; i < d.calls.size(); ++i) {
        json c = call_json(d.calls[i]);
        c["index"] = calls_before + i;
        calls.push_back(std::move(c));
      }
      delta["tool_calls"] = std::move(calls);
    }
    choice["delta"] = delta;
  } else {
    choice["text"] = d.content;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = res ? json(openai_finish_reason(res->reason, any_calls)) : json(nullptr);
  out["choices"] = json::array({choice});
  if (r.include_usage) out["usage"] = nullptr;
  if (res)
    if (json t = timings_json(*res); !t.is_null()) out["timings"] = std::move(t);
  return out;
}

json tool_arguments_chunk_json(const ApiRequest& r, size_t index, const std::string& arguments, const std::string& id,
                               int64_t created, const std::string& model) {
  json out = envelope(r, true, id, created, model);
  json call = {{"index", index}, {"function", {{"arguments", arguments}}}};
  out["choices"] = json::array({{{"index", 0}, {"delta", {{"tool_calls", json::array({call})}}}, {"logprobs", nullptr},
                                 {"finish_reason", nullptr}}});
  if (r.include_usage) out["usage"] = nullptr;
  return out;
}

json usage_chunk_json(const ApiRequest& r, const RequestResult& res, const std::string& id, int64_t created,
                      const std::string& model) {
  json out = envelope(r, true, id, created, model);
  out["choices"] = json::array();
  out["usage"] = usage_json(res);
  return out;
}

namespace {

void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " ";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g\n", value);
  out += buf;
}

}  // namespace

std::string metrics_text(const SchedulerStats& s, int parallel) {
  std::string o;
  metric(o, "ptllm_requests_total", "counter", "Requests submitted to the scheduler", double(s.requests));
  metric(o, "ptllm_requests_finished_total", "counter", "Requests ended by stop or length", double(s.finished));
  metric(o, "ptllm_requests_cancelled_total", "counter", "Requests cancelled (client gone, shutdown)", double(s.cancelled));
  metric(o, "ptllm_requests_failed_total", "counter", "Requests ended by an error", double(s.failed));
  metric(o, "ptllm_requests_preempted_total", "counter", "Sequences preempted for KV room (recomputed later)", double(s.preempted));
  metric(o, "ptllm_prompt_tokens_total", "counter", "Prompt tokens of admitted requests", double(s.prompt_tokens));
  metric(o, "ptllm_prompt_tokens_cached_total", "counter", "Prompt tokens taken from the KV pool instead of computed", double(s.cached_tokens));
  metric(o, "ptllm_prompt_tokens_shifted_total", "counter", "Of those, tokens shifted from an earlier history (--cache-reuse, n_cache_reuse)", double(s.shifted_tokens));
  metric(o, "ptllm_prefill_tokens_total", "counter", "Prompt tokens computed", double(s.prefill_tokens));
  metric(o, "ptllm_generated_tokens_total", "counter", "Tokens generated", double(s.generated_tokens));
  metric(o, "ptllm_prefill_seconds_total", "counter", "Forward-pass time attributed to prefill", s.prefill_seconds);
  metric(o, "ptllm_decode_seconds_total", "counter", "Forward-pass time attributed to decode", s.decode_seconds);
  metric(o, "ptllm_prefill_tokens_per_second", "gauge", "Prefill throughput over the server's life",
         s.prefill_seconds > 0 ? double(s.prefill_tokens) / s.prefill_seconds : 0);
  metric(o, "ptllm_decode_tokens_per_second", "gauge", "Decode throughput over the server's life",
         s.decode_seconds > 0 ? double(s.generated_tokens) / s.decode_seconds : 0);
  metric(o, "ptllm_prefix_cache_hit_ratio", "gauge", "Cached prompt tokens over prompt tokens",
         s.prompt_tokens > 0 ? double(s.cached_tokens) / double(s.prompt_tokens) : 0);
  metric(o, "ptllm_steps_total", "counter", "Batched forward passes", double(s.steps));
  metric(o, "ptllm_spec_drafted_tokens_total", "counter", "Drafted tokens verified (speculative decoding)", double(s.spec_drafted));
  metric(o, "ptllm_spec_accepted_tokens_total", "counter", "Drafted tokens kept", double(s.spec_accepted));
  metric(o, "ptllm_spec_verifications_total", "counter", "Sequences' steps that verified drafts", double(s.spec_verifications));
  metric(o, "ptllm_spec_declined_steps_total", "counter",
         "Sequences' steps taken without their drafts (judged not to pay: low acceptance or a wide batch)",
         double(s.spec_declined));
  metric(o, "ptllm_spec_draft_passes_total", "counter", "Forward passes of the draft model (speculative decoding)",
         double(s.spec_draft_passes));
  metric(o, "ptllm_spec_draft_kv_blocks", "gauge", "KV blocks the draft model's caches hold for running sequences",
         double(s.spec_draft_blocks));
  metric(o, "ptllm_requests_queued", "gauge", "Requests waiting for a slot or KV room", double(s.queued));
  metric(o, "ptllm_requests_running", "gauge", "Sequences in the running batch", double(s.running));
  metric(o, "ptllm_parallel_slots", "gauge", "Sequences that may run at once (--parallel)", double(parallel));
  metric(o, "ptllm_kv_blocks_total", "gauge", "KV blocks in the pool", double(s.blocks_total));
  metric(o, "ptllm_kv_blocks_used", "gauge", "KV blocks referenced by a sequence", double(s.blocks_used));
  metric(o, "ptllm_kv_blocks_shared", "gauge", "KV blocks referenced by more than one sequence", double(s.blocks_shared));
  metric(o, "ptllm_kv_blocks_cached", "gauge", "Unreferenced KV blocks kept for prefix reuse (reclaimable)", double(s.blocks_cached));
  metric(o, "ptllm_kv_blocks_free", "gauge", "KV blocks not referenced (cached ones included)", double(s.blocks_total - s.blocks_used));
  o += "# HELP ptllm_kv_blocks_cached_by_role Cached KV blocks by what they hold, evicted transient first, system "
       "last (tool outputs and assistant turns: transient)\n# TYPE ptllm_kv_blocks_cached_by_role gauge\n";
  for (int c = 0; c < kRetentionClasses; ++c)
    o += std::string("ptllm_kv_blocks_cached_by_role{role=\"") + retention_name(Retention(c)) + "\"} " +
         std::to_string(s.blocks_cached_by[c]) + "\n";
  metric(o, "ptllm_kv_blocks_pinned", "gauge", "KV blocks held by pinned prefixes (--kv-pin-mb; counted as used)", double(s.blocks_pinned));
  metric(o, "ptllm_kv_pinned_prefixes", "gauge", "Prefixes pinned (a system prompt and its tools each)", double(s.pinned_prefixes));
  if (s.store) {  // serve --kv-store
    const KVStoreStats& io = s.store_io;
    metric(o, "ptllm_kv_store_hits_total", "counter", "Token blocks loaded from the block store instead of computed", double(s.store_hits));
    metric(o, "ptllm_kv_store_misses_total", "counter", "Token blocks looked up in the store and not loaded", double(s.store_misses));
    metric(o, "ptllm_kv_store_rejected_total", "counter", "Store values that failed verification (counted as misses)", double(s.store_rejected));
    metric(o, "ptllm_kv_store_prompt_tokens_total", "counter", "Prompt tokens loaded from the store", double(s.store_tokens));
    metric(o, "ptllm_kv_store_puts_total", "counter", "Token blocks queued to be written to the store", double(s.store_puts));
    metric(o, "ptllm_kv_store_writes_total", "counter", "Token blocks written to the store", double(io.writes));
    metric(o, "ptllm_kv_store_dropped_writes_total", "counter", "Writes dropped (queue full, store down or over --kv-store-max-mb)", double(io.dropped_writes));
    metric(o, "ptllm_kv_store_errors_total", "counter", "Store failures: connections, timeouts, error replies", double(io.errors));
    metric(o, "ptllm_kv_store_bytes_in_total", "counter", "Value bytes read from the store", double(io.bytes_in));
    metric(o, "ptllm_kv_store_bytes_out_total", "counter", "Value bytes written to the store", double(io.bytes_out));
    metric(o, "ptllm_kv_store_keys_looked_up_total", "counter", "Keys asked for in lookups", double(io.keys_looked_up));
    o += "# HELP ptllm_kv_store_lookup_seconds Time of a lookup round trip (one per prompt)\n"
         "# TYPE ptllm_kv_store_lookup_seconds summary\n";
    char buf[128];
    std::snprintf(buf, sizeof buf, "ptllm_kv_store_lookup_seconds_sum %.17g\nptllm_kv_store_lookup_seconds_count %llu\n",
                  io.lookup_seconds, static_cast<unsigned long long>(io.lookups));
    o += buf;
  }
  return o;
}

}  // namespace ptllm::server
