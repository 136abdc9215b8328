#pragma once
// JSON Schema (draft 2020-12 and draft-07 spellings) to GBNF for grammar.h.
//
// The grammar accepts only instances that validate (a subset of them where the schema allows more
// than a bounded grammar should: bounded whitespace and digits, no extra object properties unless
// additionalProperties says so). A keyword the converter cannot honour exactly throws SchemaError
// naming the keyword and its JSON pointer; metadata keywords (title, description, ...) are ignored.
// docs/structured-output.md lists the keywords and the choices.
#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"

namespace ptllm::grammar {

// A schema the converter refuses: `keyword` and `path` (a JSON pointer into the schema) are in the
// message too, e.g. `unsupported JSON Schema keyword "patternProperties" at /properties/a`.
struct SchemaError : Error {
  SchemaError(std::string keyword, std::string path, const std::string& message);
  std::string keyword;
  std::string path;
};

struct SchemaOptions {
  // The longest run of whitespace between two JSON tokens, in bytes: one space, or a newline
  // followed by up to max_whitespace - 1 spaces or tabs. 0: compact JSON.
  int max_whitespace = 20;
  // Bound on the GBNF rules written (counting those that repetition bounds like maxLength imply).
  size_t max_rules = 20000;
  // Bound on the nesting of subschemas visited (a $ref counts as one level).
  int max_depth = 64;
};

// GBNF for values matching `schema`; the start rule is "root". Throws SchemaError. Object
// properties come in the schema's order: parse the schema as ordered_json to keep it (a
// nlohmann::json has its keys sorted).
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema, const SchemaOptions& options = {});
std::string json_schema_to_gbnf(const nlohmann::json& schema, const SchemaOptions& options = {});

// GBNF for any JSON object (response_format {"type": "json_object"}): root ::= an object.
std::string json_object_gbnf(const SchemaOptions& options = {});

// Builds one grammar from several schemas and hand-written rules, e.g. a tool call:
//   SchemaGrammarBuilder b(opts);
//   std::string args = b.add(parameters, "get-weather-args");
//   b.add_rule("root", "\"<tool_call>{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": \" " + args + " \"}</tool_call>\"");
//   Grammar::parse(b.gbnf());
// Rule names are unique: shared rules (strings, whitespace "ws") are written once.
class SchemaGrammarBuilder {
 public:
  explicit SchemaGrammarBuilder(SchemaOptions options = {});
  // The rule name of a value matching `schema` (no whitespace around it). Throws SchemaError;
  // the builder is then as it was before the call.
  std::string add(const nlohmann::ordered_json& schema, std::string_view name_hint);
  std::string add(const nlohmann::json& schema, std::string_view name_hint);
  // Adds `name ::= body` and returns the name used: `name` with characters other than
  // [A-Za-z0-9_-] replaced by '-', and a suffix "-2", "-3", ... when taken.
  std::string add_rule(std::string name, std::string body);
  // The rule name of bounded whitespace between JSON tokens (may be used in add_rule bodies).
  std::string whitespace();
  // All rules so far, one per line.
  std::string gbnf() const;
  size_t rule_count() const { return rules_.size(); }

 private:
  friend class SchemaVisitor;
  SchemaOptions options_;
  std::vector<std::pair<std::string, std::string>> rules_;  // in order of addition
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> by_body_;  // dedup of identical bodies
  std::map<std::string, std::string> shared_;   // primitives (ws, string, ...) -> their rule names
  size_t weight_ = 0;                           // rules plus implied repetition helpers
};

}  // namespace ptllm::grammar
