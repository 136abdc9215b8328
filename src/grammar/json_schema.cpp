// JSON Schema to GBNF (json_schema.h). Values are written without surrounding whitespace; the
// containers put the bounded whitespace rule "ws" after "{", "[", ",", ":" and after each member,
// so that every byte has one reading and the matcher keeps few stacks.
#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/regex_gbnf.h"

namespace ptllm::grammar {

using json = nlohmann::ordered_json;

namespace {

std::string where(const std::string& path) { return path.empty() ? "the root" : path; }

std::string child_path(const std::string& path, std::string_view key) {
  std::string out = path + "/";
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

std::string sanitize(std::string_view hint) {
  std::string out;
  for (char c : hint) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    out += ok ? c : '-';
    if (out.size() >= 40) break;
  }
  if (out.empty()) out = "value";
  return out;
}

const std::set<std::string>& meta_keywords() {
  static const std::set<std::string> k = {"title",      "description", "$schema",  "$id",      "examples",
                                          "default",    "$comment",    "deprecated", "readOnly", "writeOnly",
                                          "$defs",      "definitions"};
  return k;
}

const std::set<std::string>& object_keywords() {
  static const std::set<std::string> k = {"properties", "required", "additionalProperties"};
  return k;
}
const std::set<std::string>& array_keywords() {
  static const std::set<std::string> k = {"items", "prefixItems", "minItems", "maxItems", "additionalItems"};
  return k;
}
const std::set<std::string>& string_keywords() {
  static const std::set<std::string> k = {"minLength", "maxLength", "pattern", "format"};
  return k;
}
const std::set<std::string>& number_keywords() {
  static const std::set<std::string> k = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
  return k;
}
const std::set<std::string>& combining_keywords() {
  static const std::set<std::string> k = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"};
  return k;
}

bool known_keyword(const std::string& k) {
  return meta_keywords().count(k) || object_keywords().count(k) || array_keywords().count(k) ||
         string_keywords().count(k) || number_keywords().count(k) || combining_keywords().count(k);
}

const std::vector<std::string> kTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};

// The JSON type of a value, as JSON Schema names it ("integer" for whole numbers).
std::string type_of(const json& v) {
  switch (v.type()) {
    case json::value_t::object: return "object";
    case json::value_t::array: return "array";
    case json::value_t::string: return "string";
    case json::value_t::boolean: return "boolean";
    case json::value_t::null: return "null";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    case json::value_t::number_float: {
      double d = v.get<double>();
      return std::floor(d) == d && std::isfinite(d) ? "integer" : "number";
    }
    default: return "null";
  }
}

bool type_allows(const std::set<std::string>& types, const std::string& t) {
  return types.count(t) || (t == "integer" && types.count("number"));
}

}  // namespace

SchemaError::SchemaError(std::string k, std::string p, const std::string& message)
    : Error(message), keyword(std::move(k)), path(std::move(p)) {}

namespace {
[[noreturn]] void unsupported(const std::string& keyword, const std::string& path) {
  throw SchemaError(keyword, path, "unsupported JSON Schema keyword \"" + keyword + "\" at " + where(path));
}
[[noreturn]] void bad(const std::string& keyword, const std::string& path, const std::string& why) {
  throw SchemaError(keyword, path, "JSON Schema keyword \"" + keyword + "\" at " + where(path) + ": " + why);
}
}  // namespace

// ---- integer ranges as digit grammars -------------------------------------------------------

namespace {

constexpr int kMaxIntDigits = 16;  // bounded so that a model cannot write digits forever

std::string digit_class(int lo, int hi) {
  if (lo == hi) return "\"" + std::string(1, static_cast<char>('0' + lo)) + "\"";
  if (lo == 0 && hi == 9) return "[0-9]";
  return "[" + std::string(1, static_cast<char>('0' + lo)) + "-" + std::string(1, static_cast<char>('0' + hi)) + "]";
}

std::string any_digits(size_t n) {
  if (n == 0) return "";
  if (n == 1) return "[0-9]";
  return "[0-9]{" + std::to_string(n) + "}";
}

// Decimal strings of equal length n, lo <= x <= hi digit-wise (leading zeros allowed here).
std::string same_length_range(const std::string& lo, const std::string& hi) {
  const size_t n = lo.size();
  if (n == 0) return "";
  if (lo == hi) return "\"" + lo + "\"";
  const bool lo_zeros = lo.find_first_not_of('0', 1) == std::string::npos;
  const bool hi_nines = hi.find_first_not_of('9', 1) == std::string::npos;
  const int a = lo[0] - '0', b = hi[0] - '0';
  auto seq = [](const std::string& x, const std::string& y) { return y.empty() ? x : x + " " + y; };
  if (a == b) return seq(digit_class(a, a), "(" + same_length_range(lo.substr(1), hi.substr(1)) + ")");
  if (lo_zeros && hi_nines) return seq(digit_class(a, b), any_digits(n - 1));
  std::vector<std::string> alts;
  int first = a, last = b;
  if (!lo_zeros) {
    alts.push_back(seq(digit_class(a, a), "(" + same_length_range(lo.substr(1), std::string(n - 1, '9')) + ")"));
    first = a + 1;
  }
  if (!hi_nines) last = b - 1;
  if (first <= last) alts.push_back(seq(digit_class(first, last), any_digits(n - 1)));
  if (!hi_nines) alts.push_back(seq(digit_class(b, b), "(" + same_length_range(std::string(n - 1, '0'), hi.substr(1)) + ")"));
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out;
}

// Non-negative integers lo..hi without leading zeros (hi empty: no upper bound, at most
// max(kMaxIntDigits, digits of lo) digits).
std::string nonneg_range(uint64_t lo, std::optional<uint64_t> hi, size_t open_digits = kMaxIntDigits) {
  const std::string los = std::to_string(lo);
  const size_t max_len = hi ? std::to_string(*hi).size() : std::max<size_t>(open_digits, los.size());
  std::vector<std::string> alts;
  for (size_t d = los.size(); d <= max_len; ++d) {
    std::string a = d == los.size() ? los : "1" + std::string(d - 1, '0');
    std::string b = hi && d == max_len ? std::to_string(*hi) : std::string(d, '9');
    if (d == 1 && d != los.size()) a = "0";
    if (!hi && d > los.size()) {
      // Every longer length at once.
      alts.push_back("[1-9] [0-9]{" + std::to_string(d - 1) + "," + std::to_string(max_len - 1) + "}");
      break;
    }
    alts.push_back(same_length_range(a, b));
  }
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + std::string("(") + alts[i] + ")";
  return out;
}

// An integer in [lo, hi] (either side open when empty), as a GBNF expression.
std::string integer_range_gbnf(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<std::string> alts;
  // Negative part: -x with x in [max(1, -hi), -lo].
  if (!lo || *lo < 0) {
    const uint64_t xmin = hi && *hi < 0 ? static_cast<uint64_t>(-(*hi + 1)) + 1 : 1;
    std::optional<uint64_t> xmax;
    if (lo) xmax = static_cast<uint64_t>(-(*lo + 1)) + 1;
    alts.push_back("\"-\" (" + nonneg_range(xmin, xmax) + ")");
  }
  if (!hi || *hi >= 0) {
    const uint64_t a = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    std::optional<uint64_t> b;
    if (hi) b = static_cast<uint64_t>(*hi);
    alts.push_back(nonneg_range(a, b));
  }
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + std::string("(") + alts[i] + ")";
  return out;
}

}  // namespace

// A number (no exponent) in the range, bounds integral; "" when the range is empty. Digits are
// bounded to 15 significant ones, so that a validator reading the number as an IEEE double (as
// JavaScript's ajv does) rounds it to a value on the same side of each bound.
struct NumberBound {
  int64_t value;
  bool exclusive;
};

std::string nonneg_number(NumberBound lo, std::optional<NumberBound> hi) {
  constexpr size_t kSignificant = 15;
  constexpr size_t kOpenDigits = 9;  // integer digits without an upper bound
  const size_t int_digits = hi ? std::to_string(hi->value).size() : std::max(kOpenDigits, std::to_string(lo.value).size());
  const size_t frac = int_digits < kSignificant ? kSignificant - int_digits : 0;
  const std::string f = frac ? "[0-9]{1," + std::to_string(frac) + "}" : "";
  const std::string any_frac = frac ? " ( \".\" " + f + " )?" : "";
  const std::string zero_frac = frac ? " ( \".\" \"0\"{1," + std::to_string(frac) + "} )?" : "";
  std::vector<std::string> alts;
  const int64_t a = lo.exclusive ? lo.value + 1 : lo.value;
  if (!hi || a <= hi->value - 1) {
    std::optional<uint64_t> b;
    if (hi) b = static_cast<uint64_t>(hi->value - 1);
    alts.push_back("( " + nonneg_range(static_cast<uint64_t>(a), b, kOpenDigits) + " )" + any_frac);
  }
  if (lo.exclusive && frac && (!hi || lo.value < hi->value))
    alts.push_back("\"" + std::to_string(lo.value) + ".\" \"0\"{0," + std::to_string(frac - 1) + "} [1-9] [0-9]{0," +
                   std::to_string(frac - 1) + "}");
  if (hi && !hi->exclusive && (hi->value > lo.value || (hi->value == lo.value && !lo.exclusive)))
    alts.push_back("\"" + std::to_string(hi->value) + "\"" + zero_frac);
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out;
}

std::string number_range_gbnf(std::optional<NumberBound> lo, std::optional<NumberBound> hi) {
  std::vector<std::string> alts;
  // x >= 0 part.
  if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
    NumberBound a = lo && lo->value >= 0 ? *lo : NumberBound{0, false};
    std::string p = nonneg_number(a, hi);
    if (!p.empty()) alts.push_back(p);
  }
  // x < 0 part: x = -y.
  if (!lo || lo->value < 0) {
    NumberBound ylo = hi && hi->value <= 0 ? NumberBound{-hi->value, hi->exclusive} : NumberBound{0, true};
    std::optional<NumberBound> yhi;
    if (lo) yhi = NumberBound{-lo->value, lo->exclusive};
    std::string p = nonneg_number(ylo, yhi);
    if (!p.empty()) alts.push_back("\"-\" ( " + p + " )");
  }
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + std::string("( ") + alts[i] + " )";
  return out;
}

// ---- the builder -----------------------------------------------------------------------------

SchemaGrammarBuilder::SchemaGrammarBuilder(SchemaOptions options) : options_(options) {}

std::string SchemaGrammarBuilder::add_rule(std::string name, std::string body) {
  name = sanitize(name);
  std::string unique = name;
  for (int i = 2; by_name_.count(unique); ++i) unique = name + "-" + std::to_string(i);
  by_name_[unique] = rules_.size();
  rules_.emplace_back(unique, std::move(body));
  ++weight_;
  return unique;
}

std::string SchemaGrammarBuilder::gbnf() const {
  std::string out;
  for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
  return out;
}

std::string SchemaGrammarBuilder::whitespace() {
  auto it = shared_.find("ws");
  if (it != shared_.end()) return it->second;
  const int n = options_.max_whitespace;
  std::string body;
  if (n <= 0) body = "\"\"";
  else if (n == 1) body = "\" \"?";
  else body = "( \" \" | \"\\n\" [ \\t]{0," + std::to_string(n - 1) + "} )?";
  weight_ += static_cast<size_t>(std::max(0, n));
  const std::string name = add_rule("ws", body);
  shared_["ws"] = name;
  return name;
}

class SchemaVisitor {
 public:
  SchemaVisitor(SchemaGrammarBuilder& b, const json& root) : b_(b), root_(root) {}

  std::string visit(const json& s, const std::string& path, const std::string& hint, int depth);

 private:
  SchemaGrammarBuilder& b_;
  const json& root_;
  std::map<std::string, std::string> ref_rules_;  // JSON pointer -> rule name

  void charge(size_t w, const std::string& path) {
    b_.weight_ += w;
    if (b_.weight_ > b_.options_.max_rules)
      throw SchemaError("max_rules", path,
                        "JSON Schema too large at " + where(path) + ": its grammar needs more than " +
                            std::to_string(b_.options_.max_rules) + " rules");
  }

  // A rule for `body`, shared with an identical earlier body.
  std::string rule(const std::string& hint, const std::string& body, const std::string& path) {
    auto it = b_.by_body_.find(body);
    if (it != b_.by_body_.end()) return it->second;
    charge(1, path);
    --b_.weight_;  // add_rule counts it
    std::string name = b_.add_rule(hint, body);
    b_.by_body_[body] = name;
    return name;
  }

  // A rule with a fixed name for the shared primitives.
  std::string shared(const std::string& name, const std::string& body, size_t weight = 1) {
    auto it = b_.shared_.find(name);
    if (it != b_.shared_.end()) return it->second;
    const std::string actual = b_.add_rule(name, body);
    b_.shared_[name] = actual;
    b_.weight_ += weight - 1;
    return actual;
  }

  std::string ws() { return b_.whitespace(); }

 public:
  std::string json_char() {
    const std::string hex = shared("hex", "[0-9a-fA-F]");
    // \u escapes of surrogates only as a high-low pair (RFC 8259 section 7; parsers reject lone ones).
    // One alternative per first byte keeps the matcher at three stacks inside a string.
    return shared("char", "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-C] " + hex + " " + hex + " " +
                              hex + " | [dD] [0-7] " + hex + " " + hex + " | [eEfF] " + hex + " " + hex + " " + hex +
                              " | [dD] [89abAB] " + hex + " " + hex + " \"\\\\u\" [dD] [c-fC-F] " + hex + " " + hex + " ) )");
  }
  std::string any_string() { return shared("string", "\"\\\"\" " + json_char() + "* \"\\\"\""); }
  std::string any_integer() { return shared("integer", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} )", 16); }
  std::string any_number() {
    return shared("number", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?", 40);
  }
  std::string any_boolean() { return shared("boolean", "\"true\" | \"false\""); }
  std::string any_null() { return shared("null", "\"null\""); }
  std::string any_value() {
    auto it = b_.shared_.find("value");
    if (it != b_.shared_.end()) return it->second;
    const std::string value = b_.add_rule("value", "");
    b_.shared_["value"] = value;
    const size_t at = b_.by_name_[value];
    const std::string w = ws();
    const std::string str = any_string();
    const std::string obj = shared("object", "\"{\" " + w + " ( " + str + " " + w + " \":\" " + w + " " + value + " " + w +
                                                 " ( \",\" " + w + " " + str + " " + w + " \":\" " + w + " " + value + " " + w +
                                                 " )* )? \"}\"");
    const std::string arr =
        shared("array", "\"[\" " + w + " ( " + value + " " + w + " ( \",\" " + w + " " + value + " " + w + " )* )? \"]\"");
    b_.rules_[at].second =
        obj + " | " + arr + " | " + str + " | " + any_number() + " | " + any_boolean() + " | " + any_null();
    return value;
  }
  std::string any_object() {
    any_value();
    return b_.shared_.at("object");
  }

 private:
  std::string literal(const json& v) { return gbnf_literal(v.dump(-1, ' ', false, json::error_handler_t::strict)); }

  // A constant value: scalars as written by dump(), containers with whitespace allowed between tokens.
  std::string value_literal(const json& v) {
    if (!v.is_object() && !v.is_array()) return literal(v);
    const std::string w = ws();
    std::string out = v.is_object() ? "\"{\" " + w : "\"[\" " + w;
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      out += first ? " " : " " + w + " \",\" " + w + " ";
      if (v.is_object()) out += literal(json(it.key())) + " " + w + " \":\" " + w + " ";
      out += value_literal(it.value());
      first = false;
    }
    if (!first) out += " " + w;
    return out + (v.is_object() ? " \"}\"" : " \"]\"");
  }

  // Repetition of `x` (a rule name or a parenthesized expression) lo..hi times; hi < 0: unbounded.
  // Repetition of `x` (a rule name or a parenthesized expression) lo..hi times; hi < 0: unbounded.
  // Counts up to kChunk are GBNF's {m,n} (the parser's bound); larger ones are built from chunks
  // of kChunk so that the grammar grows with count / kChunk, not with the count.
  static constexpr int64_t kChunk = 1000;
  static constexpr int64_t kMaxCount = 1000000;

  std::string repeat(const std::string& x, int64_t lo, int64_t hi, const std::string& keyword, const std::string& path) {
    if (lo > kMaxCount || hi > kMaxCount) bad(keyword, path, "bounds above " + std::to_string(kMaxCount) + " are not supported");
    if (lo <= kChunk && hi <= kChunk) return small_repeat(x, lo, hi, path);
    auto seq = [](const std::string& a, const std::string& b) { return a.empty() ? b : b.empty() ? a : a + " " + b; };
    std::string chunk;
    auto get_chunk = [&] {
      if (chunk.empty()) chunk = rule("chunk", small_repeat(x, kChunk, kChunk, path), path);
      return chunk;
    };
    std::string head;  // x{lo}
    if (lo > kChunk) head = seq(small_repeat(get_chunk(), lo / kChunk, lo / kChunk, path), small_repeat(x, lo % kChunk, lo % kChunk, path));
    else head = small_repeat(x, lo, lo, path);
    if (hi < 0) return seq(head, small_repeat(x, 0, -1, path));
    const int64_t m = hi - lo;  // then x{0,m}
    if (m <= kChunk) return seq(head, small_repeat(x, 0, m, path));
    // L_0 = x{0, m mod kChunk}; L_j = chunk L_{j-1} | x{0, kChunk-1}: L_j covers 0 .. j*kChunk + m mod kChunk.
    const std::string below = rule("upto", small_repeat(x, 0, kChunk - 1, path), path);
    std::string level = rule("upto", "\"\" " + small_repeat(x, 0, m % kChunk, path), path);
    for (int64_t j = 1; j <= m / kChunk; ++j) level = rule("upto", get_chunk() + " " + level + " | " + below, path);
    return seq(head, level);
  }

  std::string small_repeat(const std::string& x, int64_t lo, int64_t hi, const std::string& path) {
    charge(static_cast<size_t>(hi < 0 ? lo + 1 : hi), path);
    if (hi < 0) {
      if (lo == 0) return x + "*";
      if (lo == 1) return x + "+";
      return x + "{" + std::to_string(lo) + ",}";
    }
    if (hi == 0) return "";
    if (lo == 0 && hi == 1) return x + "?";
    if (lo == hi) return lo == 1 ? x : x + "{" + std::to_string(lo) + "}";
    return x + "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
  }

  const json& resolve(const std::string& ref, const std::string& path, std::string& target_path) {
    if (ref.empty() || ref[0] != '#') bad("$ref", path, "only local references (#, #/$defs/...) are supported, not \"" + ref + "\"");
    target_path = ref.substr(1);
    try {
      json::json_pointer p(target_path);
      if (!root_.contains(p)) bad("$ref", path, "no target for \"" + ref + "\"");
      return root_.at(p);
    } catch (const json::exception&) {
      bad("$ref", path, "no target for \"" + ref + "\"");
    }
  }

  static int64_t get_count(const json& s, const char* k, const std::string& path) {
    const json& v = s.at(k);
    if (!v.is_number_integer() && !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))
      bad(k, path, "must be a non-negative integer");
    const double d = v.get<double>();
    if (d < 0) bad(k, path, "must be a non-negative integer");
    if (d > 1e15) return std::numeric_limits<int64_t>::max() / 2;
    return static_cast<int64_t>(d);
  }

  // allOf parts (and a schema's own keywords besides allOf) merged into one schema.
  json merge(const json& a, const json& b, const std::string& path, int depth);
  json merge_all(const json& s, const std::string& path, int depth);
  json deref(const json& s, const std::string& path, int depth);
  void check_disjoint(const std::vector<json>& branches, const std::string& path, int depth);

  std::string visit_object(const json& s, const std::string& path, const std::string& hint, int depth);
  std::string visit_array(const json& s, const std::string& path, const std::string& hint, int depth);
  std::string visit_string(const json& s, const std::string& path, const std::string& hint);
  std::string visit_number(const json& s, const std::string& path, const std::string& hint, bool integer);
  std::string visit_enum(const json& s, const std::string& path, const std::string& hint);
};

// A $ref schema replaced by its target (siblings merged), for merging and comparison.
json SchemaVisitor::deref(const json& s, const std::string& path, int depth) {
  if (depth > b_.options_.max_depth) bad("$ref", path, "nested deeper than " + std::to_string(b_.options_.max_depth) + " levels");
  if (!s.is_object() || !s.contains("$ref")) return s;
  if (!s["$ref"].is_string()) bad("$ref", path, "must be a string");
  std::string tp;
  const json& target = resolve(s["$ref"].get<std::string>(), path, tp);
  json rest = s;
  rest.erase("$ref");
  json t = deref(target, tp, depth + 1);
  if (t.is_boolean()) t = t.get<bool>() ? json::object() : json{{"not", json::object()}};
  return merge(rest, t, path, depth + 1);
}

json SchemaVisitor::merge_all(const json& s, const std::string& path, int depth) {
  if (!s.is_object() || !s.contains("allOf")) return s;
  const json& parts = s["allOf"];
  if (!parts.is_array() || parts.empty()) bad("allOf", path, "must be a non-empty array");
  json out = s;
  out.erase("allOf");
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string pp = path + "/allOf/" + std::to_string(i);
    json part = parts[i];
    if (part.is_boolean()) {
      if (!part.get<bool>()) bad("allOf", pp, "false matches nothing");
      continue;
    }
    if (!part.is_object()) bad("allOf", pp, "must be a schema");
    part = merge_all(deref(part, pp, depth + 1), pp, depth + 1);
    out = merge(out, part, pp, depth + 1);
  }
  return out;
}

json SchemaVisitor::merge(const json& a, const json& b, const std::string& path, int depth) {
  if (depth > b_.options_.max_depth) bad("allOf", path, "nested deeper than " + std::to_string(b_.options_.max_depth) + " levels");
  json out = a;
  auto declared = [](const json& s) {
    std::set<std::string> k;
    if (s.contains("properties") && s["properties"].is_object())
      for (auto& [key, _] : s["properties"].items()) k.insert(key);
    return k;
  };
  for (auto& [k, v] : b.items()) {
    if (meta_keywords().count(k)) {
      if (!out.contains(k)) out[k] = v;
      continue;
    }
    if (!known_keyword(k)) unsupported(k, path);
    if (!out.contains(k)) {
      out[k] = v;
      continue;
    }
    json& o = out[k];
    if (o == v) continue;
    if (k == "properties") {
      for (auto& [p, ps] : v.items()) {
        if (o.contains(p) && o[p] != ps) {
          json x = o[p].is_boolean() ? (o[p].get<bool>() ? json::object() : json{{"not", json::object()}}) : o[p];
          json y = ps.is_boolean() ? (ps.get<bool>() ? json::object() : json{{"not", json::object()}}) : ps;
          const std::string pp = child_path(path + "/properties", p);
          o[p] = merge(merge_all(deref(x, pp, depth + 1), pp, depth + 1), merge_all(deref(y, pp, depth + 1), pp, depth + 1),
                       pp, depth + 1);
        } else {
          o[p] = ps;
        }
      }
    } else if (k == "required") {
      for (auto& r : v)
        if (std::find(o.begin(), o.end(), r) == o.end()) o.push_back(r);
    } else if (k == "type") {
      std::set<std::string> ta, tb, both;
      auto collect = [](const json& src, std::set<std::string>& dst) {
        if (src.is_string()) dst.insert(src.get<std::string>());
        else for (auto& t : src) dst.insert(t.get<std::string>());
      };
      collect(o, ta);
      collect(v, tb);
      for (const auto& t : ta)
        if (type_allows(tb, t)) both.insert(t);
      for (const auto& t : tb)
        if (type_allows(ta, t)) both.insert(t);
      if (both.count("integer") && both.count("number") && !(ta.count("number") && tb.count("number"))) both.erase("number");
      if (both.empty()) bad("allOf", path, "the parts have no type in common");
      o = json(std::vector<std::string>(both.begin(), both.end()));
    } else if (k == "minimum" || k == "minLength" || k == "minItems" || k == "exclusiveMinimum") {
      if (!o.is_number() || !v.is_number()) bad(k, path, "must be a number");
      if (v.get<double>() > o.get<double>()) o = v;
    } else if (k == "maximum" || k == "maxLength" || k == "maxItems" || k == "exclusiveMaximum") {
      if (!o.is_number() || !v.is_number()) bad(k, path, "must be a number");
      if (v.get<double>() < o.get<double>()) o = v;
    } else if (k == "additionalProperties") {
      if (o.is_boolean() && v.is_boolean()) o = o.get<bool>() && v.get<bool>();
      else bad("allOf", path, "parts with different additionalProperties schemas cannot be merged");
    } else if (k == "enum" || k == "const") {
      json va = k == "const" ? json::array({o}) : o, vb = k == "const" ? json::array({v}) : v;
      json inter = json::array();
      for (auto& x : va)
        if (std::find(vb.begin(), vb.end(), x) != vb.end()) inter.push_back(x);
      if (inter.empty()) bad("allOf", path, "the parts' " + k + " values have nothing in common");
      out.erase(k);
      out["enum"] = inter;
    } else {
      bad("allOf", path, "the parts' \"" + k + "\" differ; only objects (properties, required) merge");
    }
  }
  // additionalProperties false in a part: properties only another part declares are not allowed.
  for (const json* part : {&a, &b}) {
    const json* other = part == &a ? &b : &a;
    if (part->contains("additionalProperties") && (*part)["additionalProperties"] == false &&
        out.contains("properties")) {
      const auto mine = declared(*part);
      for (const auto& p : declared(*other))
        if (!mine.count(p)) {
          if (out.contains("required") && std::find(out["required"].begin(), out["required"].end(), p) != out["required"].end())
            bad("allOf", path, "property \"" + p + "\" is required but another part forbids it (additionalProperties: false)");
          out["properties"].erase(p);
        }
    }
  }
  return out;
}

std::string SchemaVisitor::visit(const json& s_in, const std::string& path, const std::string& hint, int depth) {
  if (depth > b_.options_.max_depth)
    throw SchemaError("max_depth", path,
                      "JSON Schema nested deeper than " + std::to_string(b_.options_.max_depth) + " levels at " + where(path));
  if (s_in.is_boolean()) {
    if (s_in.get<bool>()) return any_value();
    throw SchemaError("false", path, "JSON Schema false (matches nothing) at " + where(path));
  }
  if (!s_in.is_object()) throw SchemaError("", path, "a JSON Schema must be an object or a boolean at " + where(path));
  for (auto& [k, v] : s_in.items())
    if (!known_keyword(k)) unsupported(k, path);

  if (s_in.contains("$ref")) {
    const json& r = s_in["$ref"];
    if (!r.is_string()) bad("$ref", path, "must be a string");
    bool only_meta = true;
    for (auto& [k, v] : s_in.items())
      if (k != "$ref" && !meta_keywords().count(k)) only_meta = false;
    if (!only_meta) return visit(deref(s_in, path, depth), path, hint, depth + 1);
    std::string tp;
    const json& target = resolve(r.get<std::string>(), path, tp);
    auto it = ref_rules_.find(tp);
    if (it != ref_rules_.end()) return it->second;
    // Reserved before the visit so that a recursive reference finds it.
    charge(1, path);
    std::string name = sanitize(tp.empty() ? "root-ref" : tp.substr(tp.rfind('/') + 1));
    name = b_.add_rule("ref-" + name, "");
    ref_rules_[tp] = name;
    const size_t at = b_.by_name_[name];
    const std::string body = visit(target, tp, name, depth + 1);
    b_.rules_[at].second = body;
    return name;
  }
  if (s_in.contains("allOf")) return visit(merge_all(s_in, path, depth), path, hint, depth + 1);

  for (const char* k : {"anyOf", "oneOf"}) {
    if (!s_in.contains(k)) continue;
    const json& alts = s_in[k];
    if (!alts.is_array() || alts.empty()) bad(k, path, "must be a non-empty array");
    if (s_in.contains(k == std::string("anyOf") ? "oneOf" : "anyOf")) bad(k, path, "anyOf and oneOf together are not supported");
    json rest = s_in;
    rest.erase(k);
    bool only_meta = true;
    for (auto& [kk, v] : rest.items())
      if (!meta_keywords().count(kk)) only_meta = false;
    std::vector<json> branches;
    for (size_t i = 0; i < alts.size(); ++i) {
      const std::string bp = path + "/" + k + "/" + std::to_string(i);
      if (only_meta) branches.push_back(alts[i]);
      else if (alts[i].is_boolean()) {
        if (alts[i].get<bool>()) branches.push_back(rest);
        else continue;
      } else branches.push_back(merge(rest, merge_all(deref(alts[i], bp, depth + 1), bp, depth + 1), bp, depth + 1));
    }
    if (std::string(k) == "oneOf") check_disjoint(branches, path, depth);
    std::string body;
    for (size_t i = 0; i < branches.size(); ++i) {
      const std::string bp = path + "/" + k + "/" + std::to_string(i);
      body += (i ? " | " : "") + visit(branches[i], bp, hint + "-" + std::to_string(i), depth + 1);
    }
    return rule(hint, body, path);
  }

  if (s_in.contains("enum") || s_in.contains("const")) return visit_enum(s_in, path, hint);

  // The types to write: "type", or those whose keywords appear, or all.
  std::set<std::string> types;
  if (s_in.contains("type")) {
    const json& t = s_in["type"];
    auto add = [&](const json& x) {
      if (!x.is_string() || std::find(kTypes.begin(), kTypes.end(), x.get<std::string>()) == kTypes.end())
        bad("type", path, "unknown type " + x.dump());
      types.insert(x.get<std::string>());
    };
    if (t.is_array()) {
      if (t.empty()) bad("type", path, "must not be empty");
      for (auto& x : t) add(x);
    } else {
      add(t);
    }
  } else {
    for (auto& [k, v] : s_in.items()) {
      if (object_keywords().count(k)) types.insert("object");
      if (array_keywords().count(k)) types.insert("array");
      if (string_keywords().count(k)) types.insert("string");
      if (number_keywords().count(k)) types.insert("number");
    }
  }
  if (types.empty()) return any_value();
  if (types.count("number")) types.erase("integer");
  std::vector<std::string> alts;
  for (const auto& t : kTypes) {
    if (!types.count(t)) continue;
    const std::string h = types.size() > 1 ? hint + "-" + t : hint;
    if (t == "object") alts.push_back(visit_object(s_in, path, h, depth));
    else if (t == "array") alts.push_back(visit_array(s_in, path, h, depth));
    else if (t == "string") alts.push_back(visit_string(s_in, path, h));
    else if (t == "number") alts.push_back(visit_number(s_in, path, h, false));
    else if (t == "integer") alts.push_back(visit_number(s_in, path, h, true));
    else if (t == "boolean") alts.push_back(any_boolean());
    else alts.push_back(any_null());
  }
  if (alts.size() == 1) return alts[0];
  std::string body;
  for (size_t i = 0; i < alts.size(); ++i) body += (i ? " | " : "") + alts[i];
  return rule(hint, body, path);
}

std::string SchemaVisitor::visit_enum(const json& s, const std::string& path, const std::string& hint) {
  const bool is_const = s.contains("const");
  if (is_const && s.contains("enum")) bad("const", path, "const and enum together are not supported");
  const char* kw = is_const ? "const" : "enum";
  json values = is_const ? json::array({s["const"]}) : s["enum"];
  if (!values.is_array() || values.empty()) bad(kw, path, "must be a non-empty array");
  for (auto& [k, v] : s.items())
    if (k != kw && k != "type" && !meta_keywords().count(k))
      bad(k, path, std::string("together with ") + kw + " is not supported");
  std::set<std::string> types;
  if (s.contains("type")) {
    if (s["type"].is_string()) types.insert(s["type"].get<std::string>());
    else for (auto& t : s["type"]) types.insert(t.get<std::string>());
  }
  std::string body;
  for (auto& v : values) {
    if (!types.empty() && !type_allows(types, type_of(v))) continue;
    body += (body.empty() ? "" : " | ") + value_literal(v);
  }
  if (body.empty()) bad(kw, path, "no value has the schema's type");
  return rule(hint, body, path);
}

std::string SchemaVisitor::visit_object(const json& s, const std::string& path, const std::string& hint, int depth) {
  const bool has_props = s.contains("properties");
  const bool has_ap = s.contains("additionalProperties");
  if (!has_props && !has_ap && !s.contains("required")) return any_object();
  std::vector<std::pair<std::string, const json*>> props;
  if (has_props) {
    if (!s["properties"].is_object()) bad("properties", path, "must be an object");
    for (auto& [k, v] : s["properties"].items()) {
      // A property whose schema is false must not appear.
      if (v.is_boolean() && !v.get<bool>()) {
        if (s.contains("required") && std::find(s["required"].begin(), s["required"].end(), k) != s["required"].end())
          bad("required", path, "property \"" + k + "\" is required but its schema is false");
        continue;
      }
      props.emplace_back(k, &v);
    }
  }
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) bad("required", path, "must be an array of strings");
    for (auto& r : s["required"]) {
      if (!r.is_string()) bad("required", path, "must be an array of strings");
      required.insert(r.get<std::string>());
    }
  }
  // A required key no property declares: any value (absent additionalProperties) or one of the
  // additionalProperties schema, written after the declared ones, in the order of "required".
  static const json kAnyValue = json::object();
  for (const auto& r : s.contains("required") ? s["required"] : json::array()) {
    const std::string k = r.get<std::string>();
    if (std::any_of(props.begin(), props.end(), [&](const auto& p) { return p.first == k; })) continue;
    if (has_props && s["properties"].contains(k)) continue;  // false: refused above
    if (has_ap && s["additionalProperties"] == false)
      bad("required", path, "property \"" + k + "\" is required but additionalProperties is false and properties lacks it");
    props.emplace_back(k, has_ap ? &s["additionalProperties"] : &kAnyValue);
  }
  const std::string w = ws();
  // Extra properties: keys other than the declared ones, values per additionalProperties.
  std::string extra;
  if (has_ap) {
    const json& ap = s["additionalProperties"];
    if (!(ap.is_boolean() && !ap.get<bool>())) {
      if (!ap.is_boolean() && !ap.is_object()) bad("additionalProperties", path, "must be a boolean or a schema");
      const std::string val = visit(ap, path + "/additionalProperties", hint + "-additional", depth + 1);
      std::vector<std::string> keys;
      for (auto& p : props) keys.push_back(p.first);
      const std::string key = keys.empty() ? any_string() : rule(hint + "-additional-key", string_not_in_gbnf(keys, json_char()), path);
      extra = rule(hint + "-additional-kv", key + " " + w + " \":\" " + w + " " + val, path);
    }
  }
  // C_i: the members from property i on, at least one (the next key decides which); B_i: what may
  // follow a member, i.e. "," then C_i, optional when no required property is left. One comma
  // and one whitespace per member whatever the choice, so the matcher keeps one stack per key.
  const size_t n = props.size();
  std::vector<std::string> kv(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string pp = child_path(path + "/properties", props[i].first);
    const std::string val = visit(*props[i].second, pp, hint + "-" + props[i].first, depth + 1);
    kv[i] = literal(json(props[i].first)) + " " + w + " \":\" " + w + " " + val + " " + w;
  }
  std::string c_next, b_next;  // C_{i+1}, B_{i+1}
  bool required_after = false;
  if (!extra.empty()) {
    b_next = rule(hint + "-more", "( \",\" " + w + " " + extra + " " + w + " )*", path);
    c_next = rule(hint + "-extra", extra + " " + w + " " + b_next, path);
  }
  for (size_t i = n; i-- > 0;) {
    const bool req = required.count(props[i].first) > 0;
    std::string c = kv[i] + (b_next.empty() ? "" : " " + b_next);
    if (!req && !c_next.empty()) c += " | " + c_next;
    c_next = rule(hint + "-c" + std::to_string(i), c, path);
    required_after = required_after || req;
    b_next = "\",\" " + w + " " + c_next;
    if (!required_after) b_next = "( " + b_next + " )?";
  }
  std::string members;
  if (!c_next.empty()) members = required_after ? " " + c_next : " " + c_next + "?";
  return rule(hint, "\"{\" " + w + members + " \"}\"", path);
}

std::string SchemaVisitor::visit_array(const json& s, const std::string& path, const std::string& hint, int depth) {
  std::vector<std::string> prefix;
  std::string rest;  // rule of the items after the prefix; empty: none allowed
  const json* rest_schema = nullptr;
  bool rest_any = false;
  if (s.contains("prefixItems")) {
    const json& p = s["prefixItems"];
    if (!p.is_array()) bad("prefixItems", path, "must be an array of schemas");
    for (size_t i = 0; i < p.size(); ++i)
      prefix.push_back(visit(p[i], path + "/prefixItems/" + std::to_string(i), hint + "-" + std::to_string(i), depth + 1));
    if (s.contains("additionalItems")) unsupported("additionalItems", path);
    if (s.contains("items")) rest_schema = &s["items"];
  } else if (s.contains("items") && s["items"].is_array()) {
    // Draft-07 tuples: items as an array, the rest per additionalItems.
    const json& p = s["items"];
    for (size_t i = 0; i < p.size(); ++i)
      prefix.push_back(visit(p[i], path + "/items/" + std::to_string(i), hint + "-" + std::to_string(i), depth + 1));
    if (s.contains("additionalItems")) rest_schema = &s["additionalItems"];
  } else {
    if (s.contains("additionalItems")) unsupported("additionalItems", path);
    if (s.contains("items")) rest_schema = &s["items"];
    else rest_any = true;
  }
  if (rest_schema) {
    if (!(rest_schema->is_boolean() && !rest_schema->get<bool>()))
      rest = visit(*rest_schema, path + (s.contains("prefixItems") || !s.contains("items") ? "/items" : "/additionalItems"),
                   hint + "-item", depth + 1);
  } else if (rest_any) {
    rest = any_value();
  }
  // Without items, tuples end after their prefix (a valid subset: extra items would be any value).
  const int64_t k = static_cast<int64_t>(prefix.size());
  int64_t min_items = s.contains("minItems") ? get_count(s, "minItems", path) : 0;
  int64_t max_items = s.contains("maxItems") ? get_count(s, "maxItems", path) : -1;
  if (rest.empty()) max_items = max_items < 0 ? k : std::min(max_items, k);
  if (max_items >= 0 && min_items > max_items) bad("minItems", path, "is above maxItems (or the tuple's length)");
  const std::string w = ws();
  // items(i): the members from index i on (i >= 1 written already when i > 0).
  std::function<std::string(int64_t)> items = [&](int64_t i) -> std::string {
    if (max_items >= 0 && i >= max_items) return "";
    if (i < k) {
      std::string inner = (i == 0 ? "" : "\",\" " + w + " ") + prefix[static_cast<size_t>(i)] + " " + w;
      std::string tail = items(i + 1);
      if (!tail.empty()) inner += " " + tail;
      return i >= min_items ? "( " + inner + " )?" : inner;
    }
    const int64_t lo = std::max<int64_t>(0, min_items - i);
    const int64_t hi = max_items < 0 ? -1 : max_items - i;
    const std::string one = "\",\" " + w + " " + rest + " " + w;
    if (i > 0) {
      const std::string r = repeat("( " + one + " )", lo, hi, lo > 0 && (hi < 0 || lo >= hi) ? "minItems" : "maxItems", path);
      return r;
    }
    std::string more = repeat("( " + one + " )", std::max<int64_t>(0, lo - 1), hi < 0 ? -1 : hi - 1,
                              lo > 1000 ? "minItems" : "maxItems", path);
    std::string first = rest + " " + w + (more.empty() ? "" : " " + more);
    return lo == 0 ? "( " + first + " )?" : first;
  };
  const std::string body = items(0);
  return rule(hint, "\"[\" " + w + (body.empty() ? "" : " " + body) + " \"]\"", path);
}

std::string SchemaVisitor::visit_string(const json& s, const std::string& path, const std::string& hint) {
  const bool has_len = s.contains("minLength") || s.contains("maxLength");
  const int64_t lo = s.contains("minLength") ? get_count(s, "minLength", path) : 0;
  const int64_t hi = s.contains("maxLength") ? get_count(s, "maxLength", path) : -1;
  if (hi >= 0 && lo > hi) bad("minLength", path, "is above maxLength");
  const std::string q = "\"\\\"\"";
  if (s.contains("pattern")) {
    if (s.contains("format")) bad("format", path, "together with pattern is not supported");
    if (!s["pattern"].is_string()) bad("pattern", path, "must be a string");
    std::string expr;
    try {
      expr = regex_to_gbnf(s["pattern"].get<std::string>(), json_char(), lo, hi);
    } catch (const RegexLengthError& e) {
      bad(s.contains("maxLength") ? "maxLength" : "minLength", path,
          std::string("together with pattern: ") + e.what() +
              " (supported when the pattern's lengths lie within the bounds, or the pattern is one class repeated, e.g. ^[a-z]+$)");
    } catch (const RegexError& e) {
      bad("pattern", path, e.what());
    }
    charge(expr.size() / 16, path);
    return rule(hint, q + " " + expr + " " + q, path);
  }
  if (s.contains("format")) {
    if (!s["format"].is_string()) bad("format", path, "must be a string");
    const std::string f = s["format"].get<std::string>();
    if (has_len) {
      // Allowed when every string of the format's grammar has a length within the bounds.
      static const std::map<std::string, std::pair<int64_t, int64_t>> kLengths = {
          {"date", {10, 10}}, {"time", {9, 21}}, {"date-time", {20, 32}}, {"uuid", {36, 36}}};
      auto it = kLengths.find(f);
      const char* kw = s.contains("maxLength") ? "maxLength" : "minLength";
      if (it == kLengths.end() || it->second.first < lo || (hi >= 0 && it->second.second > hi))
        bad(kw, path, "together with format \"" + f + "\" is supported only when the format's lengths lie within it");
    }
    const std::string body = format_gbnf(f, [&](const std::string& n, const std::string& b) { return shared(n, b, 4); });
    if (body.empty()) bad("format", path, "format \"" + f + "\" is not supported (date, time, date-time, uuid, email are)");
    return rule(hint, q + " " + body + " " + q, path);
  }
  if (!has_len) return any_string();
  return rule(hint, q + " " + repeat(json_char(), lo, hi, lo > 1000 ? "minLength" : "maxLength", path) + " " + q, path);
}

// The safe integers (zod's int() and JavaScript's Number.MAX_SAFE_INTEGER bounds are 2^53 - 1).
constexpr double kMaxBound = 9007199254740992.0;

std::string SchemaVisitor::visit_number(const json& s, const std::string& path, const std::string& hint, bool integer) {
  bool any_bound = false;
  for (const auto& k : number_keywords())
    if (s.contains(k)) any_bound = true;
  if (!any_bound) return integer ? any_integer() : any_number();
  if (!integer) {
    std::optional<NumberBound> lo, hi;
    std::string lo_kw = "minimum";
    auto bound = [&](const char* k) {
      const json& v = s.at(k);
      if (!v.is_number()) bad(k, path, "must be a number");
      const double d = v.get<double>();
      if (std::floor(d) != d) bad(k, path, "bounds on numbers must be whole numbers (non-integral bounds are not supported)");
      if (std::fabs(d) > kMaxBound) bad(k, path, "bounds beyond 2^53 are not supported");
      return static_cast<int64_t>(d);
    };
    auto tighten_lo = [&](NumberBound b, const char* k) {
      if (!lo || b.value > lo->value || (b.value == lo->value && b.exclusive)) { lo = b; lo_kw = k; }
    };
    auto tighten_hi = [&](NumberBound b) {
      if (!hi || b.value < hi->value || (b.value == hi->value && b.exclusive)) hi = b;
    };
    const bool ex_min_bool = s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean();
    const bool ex_max_bool = s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean();
    if (s.contains("minimum")) tighten_lo({bound("minimum"), ex_min_bool && s["exclusiveMinimum"].get<bool>()}, "minimum");
    if (s.contains("maximum")) tighten_hi({bound("maximum"), ex_max_bool && s["exclusiveMaximum"].get<bool>()});
    if (s.contains("exclusiveMinimum") && !ex_min_bool) tighten_lo({bound("exclusiveMinimum"), true}, "exclusiveMinimum");
    if (s.contains("exclusiveMaximum") && !ex_max_bool) tighten_hi({bound("exclusiveMaximum"), true});
    const std::string body = number_range_gbnf(lo, hi);
    if (body.empty()) bad(lo_kw, path, "no number lies within the bounds");
    charge(body.size() / 16, path);
    return rule(hint, body, path);
  }
  std::optional<int64_t> lo, hi;
  auto num = [&](const char* k) {
    const json& v = s.at(k);
    if (!v.is_number()) bad(k, path, "must be a number");
    const double d = v.get<double>();
    if (std::fabs(d) > kMaxBound) bad(k, path, "bounds beyond 2^53 are not supported");
    return d;
  };
  auto tighten_lo = [&](int64_t v) { lo = lo ? std::max(*lo, v) : v; };
  auto tighten_hi = [&](int64_t v) { hi = hi ? std::min(*hi, v) : v; };
  // Draft 4 spells exclusiveness as a boolean beside minimum / maximum.
  const bool ex_min_bool = s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean();
  const bool ex_max_bool = s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean();
  if (s.contains("minimum")) {
    const double d = num("minimum");
    if (ex_min_bool && s["exclusiveMinimum"].get<bool>()) tighten_lo(static_cast<int64_t>(std::floor(d)) + 1);
    else tighten_lo(static_cast<int64_t>(std::ceil(d)));
  }
  if (s.contains("maximum")) {
    const double d = num("maximum");
    if (ex_max_bool && s["exclusiveMaximum"].get<bool>()) tighten_hi(static_cast<int64_t>(std::ceil(d)) - 1);
    else tighten_hi(static_cast<int64_t>(std::floor(d)));
  }
  if (s.contains("exclusiveMinimum") && !ex_min_bool) tighten_lo(static_cast<int64_t>(std::floor(num("exclusiveMinimum"))) + 1);
  if (s.contains("exclusiveMaximum") && !ex_max_bool) tighten_hi(static_cast<int64_t>(std::ceil(num("exclusiveMaximum"))) - 1);
  if (lo && hi && *lo > *hi) bad(s.contains("minimum") ? "minimum" : "exclusiveMinimum", path, "no integer lies within the bounds");
  const std::string body = integer_range_gbnf(lo, hi);
  charge(body.size() / 16, path);
  return rule(hint, body, path);
}

namespace {
// What keys an instance of a (merged) schema may have: nullopt when any.
std::optional<std::set<std::string>> emitted_keys(const json& s) {
  if (!s.is_object()) return std::nullopt;
  if (s.contains("additionalProperties") && s["additionalProperties"] != false) return std::nullopt;
  if (!s.contains("properties")) return std::nullopt;
  std::set<std::string> k;
  for (auto& [key, _] : s["properties"].items()) k.insert(key);
  return k;
}

std::set<std::string> types_of(const json& s) {
  std::set<std::string> t;
  if (!s.is_object()) return {kTypes.begin(), kTypes.end()};
  if (s.contains("const")) return {type_of(s["const"])};
  if (s.contains("enum") && s["enum"].is_array()) {
    for (auto& v : s["enum"]) t.insert(type_of(v));
    return t;
  }
  if (s.contains("type")) {
    if (s["type"].is_string()) t.insert(s["type"].get<std::string>());
    else for (auto& x : s["type"]) t.insert(x.get<std::string>());
    return t;
  }
  for (auto& [k, v] : s.items()) {
    if (object_keywords().count(k)) t.insert("object");
    if (array_keywords().count(k)) t.insert("array");
    if (string_keywords().count(k)) t.insert("string");
    if (number_keywords().count(k)) t.insert("number");
  }
  if (t.empty() || s.contains("anyOf") || s.contains("oneOf") || s.contains("$ref")) return {kTypes.begin(), kTypes.end()};
  return t;
}

std::optional<std::vector<json>> values_of(const json& s) {
  if (!s.is_object()) return std::nullopt;
  if (s.contains("const")) return std::vector<json>{s["const"]};
  if (s.contains("enum") && s["enum"].is_array()) return std::vector<json>(s["enum"].begin(), s["enum"].end());
  return std::nullopt;
}
}  // namespace

// oneOf is exact only when no instance written for one branch also matches another: proven here by
// types, by const / enum values, or for objects by a required key the other never writes or a
// required key whose const / enum values differ.
void SchemaVisitor::check_disjoint(const std::vector<json>& branches, const std::string& path, int depth) {
  std::vector<json> flat;
  for (size_t i = 0; i < branches.size(); ++i) {
    const std::string bp = path + "/oneOf/" + std::to_string(i);
    flat.push_back(branches[i].is_object() ? merge_all(deref(branches[i], bp, depth + 1), bp, depth + 1) : branches[i]);
  }
  auto disjoint = [&](const json& x, const json& y) {
    if (!x.is_object() || !y.is_object()) return false;
    const auto tx = types_of(x), ty = types_of(y);
    bool common = false;
    for (const auto& t : tx)
      if (type_allows(ty, t) || (t == "number" && ty.count("integer"))) common = true;
    if (!common) return true;
    const auto vx = values_of(x), vy = values_of(y);
    if (vx && vy) {
      for (auto& a : *vx)
        if (std::find(vy->begin(), vy->end(), a) != vy->end()) return false;
      return true;
    }
    if (!(tx.size() == 1 && *tx.begin() == "object" && ty.size() == 1 && *ty.begin() == "object")) return false;
    auto req = [](const json& s) {
      std::set<std::string> r;
      if (s.contains("required") && s["required"].is_array())
        for (auto& k : s["required"])
          if (k.is_string()) r.insert(k.get<std::string>());
      return r;
    };
    const auto rx = req(x), ry = req(y);
    const auto kx = emitted_keys(x), ky = emitted_keys(y);
    for (const auto& k : ry)
      if (kx && !kx->count(k)) return true;
    for (const auto& k : rx)
      if (ky && !ky->count(k)) return true;
    for (const auto& k : rx) {
      if (!ry.count(k)) continue;
      static const json kNone;
      const auto prop = [&](const json& s) -> const json& {
        const auto p = s.find("properties");
        if (p == s.end() || !p->is_object()) return kNone;
        const auto v = p->find(k);
        return v == p->end() ? kNone : *v;
      };
      const json& px = prop(x);
      const json& py = prop(y);
      const auto ax = values_of(px), ay = values_of(py);
      if (!ax || !ay) continue;
      bool overlap = false;
      for (auto& a : *ax)
        if (std::find(ay->begin(), ay->end(), a) != ay->end()) overlap = true;
      if (!overlap) return true;
    }
    return false;
  };
  for (size_t i = 0; i < flat.size(); ++i)
    for (size_t j = i + 1; j < flat.size(); ++j)
      if (!disjoint(flat[i], flat[j]))
        bad("oneOf", path,
            "branches " + std::to_string(i) + " and " + std::to_string(j) +
                " may both match one instance (exactly one must); use anyOf, or tell them apart by type, const or a required property");
}

std::string SchemaGrammarBuilder::add(const nlohmann::json& schema, std::string_view name_hint) {
  return add(nlohmann::ordered_json::parse(schema.dump()), name_hint);
}

std::string SchemaGrammarBuilder::add(const nlohmann::ordered_json& schema, std::string_view name_hint) {
  SchemaGrammarBuilder saved = *this;
  try {
    SchemaVisitor v(*this, schema);
    return v.visit(schema, "", sanitize(name_hint), 0);
  } catch (const nlohmann::json::exception& e) {
    // A keyword of an unexpected shape the checks above did not name: still the caller's error.
    *this = std::move(saved);
    throw SchemaError("", "", std::string("the schema has a keyword of an unexpected form (") + e.what() + ")");
  } catch (...) {
    *this = std::move(saved);
    throw;
  }
}

std::string json_schema_to_gbnf(const nlohmann::json& schema, const SchemaOptions& options) {
  return json_schema_to_gbnf(nlohmann::ordered_json::parse(schema.dump()), options);
}

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema, const SchemaOptions& options) {
  SchemaGrammarBuilder b(options);
  const std::string value = b.add(schema, "root-value");
  b.add_rule("root", value);
  std::string out = b.gbnf();
  try {
    Grammar::parse(out);
  } catch (const GrammarError& e) {
    // A $ref cycle that writes nothing (e.g. {"$ref": "#"} or anyOf [{"$ref": "#"}, ...]).
    throw SchemaError("$ref", "", "JSON Schema \"$ref\" cycle that consumes no input: " + e.message);
  }
  return out;
}

std::string json_object_gbnf(const SchemaOptions& options) {
  SchemaGrammarBuilder b(options);
  SchemaVisitor v(b, json::object());
  b.add_rule("root", v.any_object());
  return b.gbnf();
}

}  // namespace ptllm::grammar
