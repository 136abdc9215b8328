#include "server/structured.h"

#include <string>
#include <vector>

#include "grammar/json_schema.h"
#include "grammar/regex_gbnf.h"

namespace ptllm::server {

namespace {

using grammar::SchemaGrammarBuilder;
const auto lit = grammar::gbnf_literal;

struct Tool {
  std::string name;
  const json* parameters = nullptr;  // null: none given
  bool strict = false;
  std::string param;  // "tools[i].function.parameters"
};

std::vector<Tool> tools_of(const ApiRequest& r) {
  std::vector<Tool> out;
  if (!r.tools.is_array()) return out;
  for (size_t i = 0; i < r.tools.size(); ++i) {
    const json& fn = r.tools[i]["function"];
    Tool t;
    t.name = fn["name"].get<std::string>();
    if (!r.tool_choice_name.empty() && t.name != r.tool_choice_name) continue;
    if (auto p = fn.find("parameters"); p != fn.end()) t.parameters = &*p;
    if (auto s = fn.find("strict"); s != fn.end()) t.strict = s->get<bool>();
    t.param = "tools[" + std::to_string(i) + "].function.parameters";
    out.push_back(std::move(t));
  }
  return out;
}

// Builds one grammar from the schema converter's rules and the call syntax's own rules.
class Builder {
 public:
  Builder() : b_(grammar::SchemaOptions{}) {}

  std::string schema(const json& s, const std::string& hint, const std::string& param) {
    try {
      return b_.add(s, hint);
    } catch (const grammar::SchemaError& e) {
      throw bad_request(param + ": " + e.what(), param);
    }
  }
  std::string any_object() { return schema(json{{"type", "object"}}, "object", "response_format"); }
  // A rule of the call syntax; one name is one rule (a second call returns the first's name).
  std::string rule(const std::string& name, const std::string& body) {
    for (const auto& [n, r] : rules_)
      if (n == name) return r;
    rules_.emplace_back(name, b_.add_rule(name, body));
    return rules_.back().second;
  }
  std::string gbnf() const { return b_.gbnf(); }

 private:
  SchemaGrammarBuilder b_;
  std::vector<std::pair<std::string, std::string>> rules_;  // asked name, name given
};

// A call's arguments: the tool's schema when it is enforced, else any JSON object.
std::string arguments_rule(Builder& b, const Tool& t, bool enforce, size_t i) {
  if (enforce && t.parameters) return b.schema(*t.parameters, "args-" + std::to_string(i), t.param);
  return b.any_object();
}

// Qwen3-Coder's XML: parameter names from the schema's properties; values are free text up to
// the closing tag (their types are read by the reply parser from the schema).
std::string xml_call(Builder& b, const Tool& t, size_t i) {
  std::string names;
  if (t.parameters && t.parameters->contains("properties") && (*t.parameters)["properties"].is_object())
    for (const auto& [k, v] : (*t.parameters)["properties"].items()) names += (names.empty() ? "" : " | ") + lit(k);
  const std::string value = b.rule("tc-xml-value", "( [^<] | \"<\" [^/] )*");
  std::string body = lit("<function=" + t.name + ">\n");
  if (!names.empty()) {
    const std::string param = b.rule("tc-param-" + std::to_string(i),
                                     lit("<parameter=") + " ( " + names + " ) " + lit(">\n") + " " + value + " " +
                                         lit("\n</parameter>\n"));
    body += " " + param + "*";
  }
  return body + " " + lit("</function>\n");
}

struct Calls {
  std::string rule;                   // the reply's calls (forced), or one call block (lazy)
  std::vector<std::string> triggers;  // the call marker, for a lazy grammar
  std::vector<std::string> special;   // special tokens' texts the calls write
};

Calls calls_rule(Builder& b, const ApiRequest& r, const std::vector<Tool>& tools, bool forced) {
  const ToolCallFormat f = r.output.format.tools;
  std::vector<std::string> alts;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Tool& t = tools[i];
    const bool enforce = forced || t.strict;
    if (f == ToolCallFormat::Qwen3Coder) {
      if (t.strict)
        throw bad_request(t.param + ": strict arguments cannot be enforced in the qwen3-coder call format (its "
                          "values are untyped text); drop \"strict\" or serve with --tool-call-format hermes",
                          t.param);
      alts.push_back(xml_call(b, t, i));
      continue;
    }
    if (f == ToolCallFormat::Mistral && r.output.format.name_args) {
      alts.push_back(lit(t.name + "[ARGS]") + " " + arguments_rule(b, t, enforce, i));
      continue;
    }
    const char* key = f == ToolCallFormat::Llama3 ? "parameters" : "arguments";
    alts.push_back(lit("{\"name\": " + json(t.name).dump() + ", \"" + key + "\": ") + " " +
                   arguments_rule(b, t, enforce, i) + " " + lit("}"));
  }
  std::string one;
  for (const std::string& a : alts) one += (one.empty() ? "" : " | ") + std::string("( ") + a + " )";
  const std::string call = b.rule("tc-call", one);
  const bool many = r.parallel_tool_calls;
  Calls c;
  switch (f) {
    case ToolCallFormat::Mistral: {
      // Small 3.2 / Devstral: each call its own [TOOL_CALLS]name[ARGS]{...}; v0.3 / Nemo: one JSON list.
      const std::string one_call = lit("[TOOL_CALLS]") + " " + call;
      const std::string block =
          r.output.format.name_args
              ? one_call + (many ? " ( " + one_call + " )*" : "")
              : lit("[TOOL_CALLS][") + " " + call + (many ? " ( " + lit(", ") + " " + call + " )*" : "") + " " +
                    lit("]");
      c.rule = b.rule("tc-calls", block);
      c.triggers = {"[TOOL_CALLS]"};
      c.special = {"[TOOL_CALLS]"};
      break;
    }
    case ToolCallFormat::Llama3:
      // One call per reply: the format has no list.
      c.rule = call;
      c.triggers = {"{\"name\""};
      break;
    case ToolCallFormat::Qwen3Coder:
    case ToolCallFormat::Hermes:
    case ToolCallFormat::None: {
      const std::string block =
          b.rule("tc-block", lit("<tool_call>\n") + " " + call + " " +
                                 lit(f == ToolCallFormat::Qwen3Coder ? "</tool_call>" : "\n</tool_call>"));
      c.rule = forced && many ? b.rule("tc-calls", block + " ( " + lit("\n") + " " + block + " )*") : block;
      c.triggers = {"<tool_call>"};
      break;
    }
  }
  return c;
}

// The reasoning a thinking model writes before its answer, when the reply is split into it.
std::string reasoning_prefix(Builder& b, const ApiRequest& r) {
  if (!r.output.parse_reasoning) return "";
  const std::string text = b.rule("tc-think-text", "( [^<] | \"<\" [^/] )*");
  if (r.output.in_reasoning) return b.rule("tc-think", text + " " + lit("</think>") + " [\\n]*") + " ";
  return b.rule("tc-think", "( " + lit("<think>") + " " + text + " " + lit("</think>") + " [\\n]* )?") + " ";
}

std::shared_ptr<ConstraintSpec> compile(const std::string& gbnf, const std::string& param) {
  auto spec = std::make_shared<ConstraintSpec>();
  try {
    spec->grammar = compile_grammar(gbnf);
  } catch (const grammar::GrammarError& e) {
    throw bad_request(param + ": line " + std::to_string(e.line) + ", column " + std::to_string(e.column) + ": " +
                          e.message,
                      param);
  } catch (const Error& e) {
    throw bad_request(param + ": " + e.what(), param);
  }
  return spec;
}

}  // namespace

std::shared_ptr<const ConstraintSpec> request_constraint(const ApiRequest& r, const Tokenizer& tok) {
  using Kind = OutputConstraint::Kind;
  const OutputConstraint& c = r.constraint;
  const bool calls = r.output.parse_tools;  // tools offered, tool_choice not "none", a known format
  const std::vector<Tool> tools = calls ? tools_of(r) : std::vector<Tool>{};
  const bool forced = calls && r.tool_choice_required;
  bool strict = false;
  for (const Tool& t : tools) strict = strict || t.strict;

  if (c.kind == Kind::Grammar) {
    if (forced)
      throw bad_request("grammar: a grammar decides the whole reply, so it cannot be combined with tool_choice "
                        "\"required\" or a named function",
                        "grammar");
    return compile(c.grammar, "grammar");
  }
  if (c.kind == Kind::None && !forced && !strict) return nullptr;

  Builder b;
  std::vector<std::string> special;
  std::string root;
  std::vector<std::string> triggers;
  if (forced) {
    const Calls k = calls_rule(b, r, tools, true);
    root = reasoning_prefix(b, r) + k.rule;
    special = k.special;
  } else if (c.kind != Kind::None) {
    const std::string value = c.kind == Kind::AnyObject ? b.any_object() : b.schema(c.schema, "value", c.param);
    std::string body = value;
    if (calls) {  // the reply is the value, or calls
      const Calls k = calls_rule(b, r, tools, false);
      body = "( " + value + " | " + k.rule + " )";
      special = k.special;
    }
    root = reasoning_prefix(b, r) + body;
  } else {  // auto with strict tools: each call from its marker on
    const Calls k = calls_rule(b, r, tools, false);
    root = k.rule;
    triggers = k.triggers;
    special = k.special;
  }
  b.rule("root", root);
  const std::string param = forced ? "tool_choice" : c.kind != Kind::None ? c.param : "tools";
  auto spec = compile(b.gbnf(), param);
  spec->triggers = std::move(triggers);
  for (const std::string& s : special)
    if (auto id = tok.token_to_id(s); id && tok.is_special(*id)) spec->special_ids.push_back(*id);
  return spec;
}

}  // namespace ptllm::server
