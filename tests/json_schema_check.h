#pragma once
// For the JSON Schema converter's tests: a validator of the keywords the converter supports (with
// JSON Schema's own semantics: absent additionalProperties allows any extra property), and a
// random sentence generator over a compiled grammar.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <regex>
#include <string>

#include "grammar/grammar.h"

namespace ptllm::test {

using ojson = nlohmann::ordered_json;

inline std::u32string to_u32(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : 3;
    uint32_t v = n == 0 ? c : n == 1 ? (c & 0x1F) : n == 2 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k <= n && i + static_cast<size_t>(k) < s.size(); ++k)
      v = (v << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3F);
    out.push_back(static_cast<char32_t>(v));
    i += static_cast<size_t>(n) + 1;
  }
  return out;
}

// \s and \S with ECMAScript's meaning (std::wregex asks the C locale, which knows no Unicode spaces).
inline std::u32string js_classes(const std::u32string& p) {
  const std::u32string spaces = U"\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff";
  std::u32string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char32_t c = p[i];
    if (c == U'\\' && i + 1 < p.size()) {
      const char32_t e = p[i + 1];
      if (e == U's') out += in_class ? spaces : U"[" + spaces + U"]";
      else if (e == U'S' && !in_class) out += U"[^" + spaces + U"]";
      else { out += c; out += e; }
      ++i;
      continue;
    }
    if (c == U'[') in_class = true;
    if (c == U']') in_class = false;
    out += c;
  }
  return out;
}

class SchemaChecker {
 public:
  explicit SchemaChecker(const ojson& root) : root_(root) {}

  // Empty when v validates; else why not.
  std::string check(const ojson& v) const { return check(v, root_, "", 0); }

 private:
  const ojson& root_;

  static bool is_int(const ojson& v) {
    if (v.is_number_integer()) return true;
    if (!v.is_number_float()) return false;
    const double d = v.get<double>();
    return std::isfinite(d) && std::floor(d) == d;
  }

  static bool has_type(const ojson& v, const std::string& t) {
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.is_number() && is_int(v);
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    return false;
  }

  static bool json_equal(const ojson& a, const ojson& b) {
    if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
    if (a.type() != b.type()) return false;
    if (a.is_array()) {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (!json_equal(a[i], b[i])) return false;
      return true;
    }
    if (a.is_object()) {
      if (a.size() != b.size()) return false;
      for (auto& [k, x] : a.items())
        if (!b.contains(k) || !json_equal(x, b[k])) return false;
      return true;
    }
    return a == b;
  }

  static bool format_ok(const std::string& f, const std::string& s) {
    static const std::regex date(R"(^(\d{4})-(\d{2})-(\d{2})$)");
    static const std::regex time(R"(^(\d{2}):(\d{2}):(\d{2})(\.\d+)?(z|Z|[+-](\d{2}):(\d{2}))$)");
    static const std::regex uuid(R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)");
    static const std::regex email(
        R"(^[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+(\.[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+)*@([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\.)+[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$)");
    auto date_ok = [&](const std::string& d) {
      std::smatch m;
      if (!std::regex_match(d, m, date)) return false;
      const int y = std::stoi(m[1]), mo = std::stoi(m[2]), day = std::stoi(m[3]);
      static const int kDays[] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
      if (mo < 1 || mo > 12 || day < 1) return false;
      const bool leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
      return day <= kDays[mo] || (mo == 2 && day == 29 && leap);
    };
    auto time_ok = [&](const std::string& t) {
      std::smatch m;
      if (!std::regex_match(t, m, time)) return false;
      if (std::stoi(m[1]) > 23 || std::stoi(m[2]) > 59 || std::stoi(m[3]) > 59) return false;
      if (m[6].matched && (std::stoi(m[6]) > 23 || std::stoi(m[7]) > 59)) return false;
      return true;
    };
    if (f == "date") return date_ok(s);
    if (f == "time") return time_ok(s);
    if (f == "date-time") {
      const auto t = s.find_first_of("Tt");
      return t != std::string::npos && date_ok(s.substr(0, t)) && time_ok(s.substr(t + 1));
    }
    if (f == "uuid") return std::regex_match(s, uuid);
    if (f == "email") return std::regex_match(s, email);
    return false;
  }

  std::string check(const ojson& v, const ojson& s, const std::string& at, int depth) const {
    if (depth > 200) return at + ": too deep";
    if (s.is_boolean()) return s.get<bool>() ? "" : at + ": false schema";
    if (s.contains("$ref")) {
      const std::string ref = s["$ref"].get<std::string>();
      const ojson& t = root_.at(ojson::json_pointer(ref.substr(1)));
      if (auto e = check(v, t, at, depth + 1); !e.empty()) return e;
    }
    if (s.contains("type")) {
      bool ok = false;
      if (s["type"].is_string()) ok = has_type(v, s["type"].get<std::string>());
      else for (auto& t : s["type"]) ok = ok || has_type(v, t.get<std::string>());
      if (!ok) return at + ": type " + s["type"].dump() + " expected, got " + v.dump();
    }
    if (s.contains("enum")) {
      bool ok = false;
      for (auto& e : s["enum"]) ok = ok || json_equal(e, v);
      if (!ok) return at + ": not in enum";
    }
    if (s.contains("const") && !json_equal(s["const"], v)) return at + ": not the const";
    if (s.contains("allOf"))
      for (auto& p : s["allOf"])
        if (auto e = check(v, p, at, depth + 1); !e.empty()) return e;
    if (s.contains("anyOf")) {
      bool ok = false;
      for (auto& p : s["anyOf"]) ok = ok || check(v, p, at, depth + 1).empty();
      if (!ok) return at + ": no anyOf branch matches";
    }
    if (s.contains("oneOf")) {
      int n = 0;
      for (auto& p : s["oneOf"]) n += check(v, p, at, depth + 1).empty() ? 1 : 0;
      if (n != 1) return at + ": " + std::to_string(n) + " oneOf branches match";
    }
    if (v.is_object()) {
      if (s.contains("required"))
        for (auto& r : s["required"])
          if (!v.contains(r.get<std::string>())) return at + ": missing " + r.get<std::string>();
      for (auto& [k, x] : v.items()) {
        if (s.contains("properties") && s["properties"].contains(k)) {
          if (auto e = check(x, s["properties"][k], at + "/" + k, depth + 1); !e.empty()) return e;
        } else if (s.contains("additionalProperties")) {
          if (auto e = check(x, s["additionalProperties"], at + "/" + k, depth + 1); !e.empty()) return e;
        }
      }
    }
    if (v.is_array()) {
      size_t prefix = 0;
      const ojson* rest = nullptr;
      if (s.contains("prefixItems")) {
        prefix = s["prefixItems"].size();
        for (size_t i = 0; i < prefix && i < v.size(); ++i)
          if (auto e = check(v[i], s["prefixItems"][i], at + "/" + std::to_string(i), depth + 1); !e.empty()) return e;
        if (s.contains("items")) rest = &s["items"];
      } else if (s.contains("items") && s["items"].is_array()) {
        prefix = s["items"].size();
        for (size_t i = 0; i < prefix && i < v.size(); ++i)
          if (auto e = check(v[i], s["items"][i], at + "/" + std::to_string(i), depth + 1); !e.empty()) return e;
        if (s.contains("additionalItems")) rest = &s["additionalItems"];
      } else if (s.contains("items")) {
        rest = &s["items"];
      }
      if (rest)
        for (size_t i = prefix; i < v.size(); ++i)
          if (auto e = check(v[i], *rest, at + "/" + std::to_string(i), depth + 1); !e.empty()) return e;
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": too few items";
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": too many items";
    }
    if (v.is_string()) {
      const std::string str = v.get<std::string>();
      const size_t n = to_u32(str).size();
      if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return at + ": too short";
      if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return at + ": too long";
      if (s.contains("pattern")) {
        // ECMAScript syntax over code points (wchar_t is UTF-32 here), unanchored like ajv.
        const std::u32string p32 = js_classes(to_u32(s["pattern"].get<std::string>()));
        const std::u32string s32 = to_u32(str);
        const std::wregex re(std::wstring(p32.begin(), p32.end()), std::regex::ECMAScript);
        if (!std::regex_search(std::wstring(s32.begin(), s32.end()), re)) return at + ": pattern mismatch: " + str;
      }
      if (s.contains("format") && !format_ok(s["format"].get<std::string>(), str)) return at + ": bad format: " + str;
    }
    if (v.is_number()) {
      const double d = v.get<double>();
      auto num = [&](const char* k) { return s[k].get<double>(); };
      if (s.contains("minimum")) {
        const bool ex = s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean() && s["exclusiveMinimum"].get<bool>();
        if (ex ? d <= num("minimum") : d < num("minimum")) return at + ": below minimum";
      }
      if (s.contains("maximum")) {
        const bool ex = s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean() && s["exclusiveMaximum"].get<bool>();
        if (ex ? d >= num("maximum") : d > num("maximum")) return at + ": above maximum";
      }
      if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() && d <= num("exclusiveMinimum"))
        return at + ": not above exclusiveMinimum";
      if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() && d >= num("exclusiveMaximum"))
        return at + ": not below exclusiveMaximum";
    }
    return "";
  }
};

// Random sentences of a compiled grammar: alternatives at random until `budget` code points are
// written, then each rule's shortest completion (found by a fixpoint over the rules).
class GrammarSampler {
 public:
  explicit GrammarSampler(std::shared_ptr<const grammar::Grammar> g) : g_(std::move(g)) {
    const auto& rules = g_->rules();
    const auto& el = g_->elements();
    constexpr size_t kInf = std::numeric_limits<size_t>::max() / 4;
    best_len_.assign(rules.size(), kInf);
    best_alt_.assign(rules.size(), 0);
    // Bellman-Ford style: a rule's best alternative only uses rules already finite, so the
    // shortest completions are well founded.
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < rules.size(); ++r)
        for (size_t a = 0; a < rules[r].size(); ++a) {
          size_t len = 0;
          for (uint32_t p = rules[r][a]; el[p].kind != grammar::Element::Kind::End; ++p) {
            len += el[p].kind == grammar::Element::Kind::Char ? 1 : best_len_[el[p].index];
            if (len >= kInf) break;
          }
          if (len < best_len_[r]) {
            best_len_[r] = len;
            best_alt_[r] = a;
            changed = true;
          }
        }
    }
  }

  std::string sample(std::mt19937& rng, size_t budget) {
    out_.clear();
    written_ = 0;
    budget_ = budget;
    gen(g_->root(), rng, 0);
    return out_;
  }

 private:
  std::shared_ptr<const grammar::Grammar> g_;
  std::vector<size_t> best_len_, best_alt_;
  std::string out_;
  size_t written_ = 0, budget_ = 0;

  void put(uint32_t cp) {
    if (cp < 0x80) out_ += static_cast<char>(cp);
    else if (cp < 0x800) { out_ += static_cast<char>(0xC0 | (cp >> 6)); out_ += static_cast<char>(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
      out_ += static_cast<char>(0xE0 | (cp >> 12));
      out_ += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out_ += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out_ += static_cast<char>(0xF0 | (cp >> 18));
      out_ += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out_ += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out_ += static_cast<char>(0x80 | (cp & 0x3F));
    }
    ++written_;
  }

  static bool valid_cp(uint32_t cp) { return cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF); }

  uint32_t pick(const grammar::CharClass& c, std::mt19937& rng) {
    // Mostly printable ASCII, sometimes anything in the class (multi-byte code points too).
    for (int tries = 0; tries < 200; ++tries) {
      uint32_t cp;
      const int mode = static_cast<int>(rng() % 10);
      if (mode < 7) cp = 0x20 + rng() % 0x5F;
      else if (mode < 9 && !c.negated && !c.ranges.empty()) {
        const auto& [a, b] = c.ranges[rng() % c.ranges.size()];
        cp = a + static_cast<uint32_t>(rng() % (uint64_t(b) - a + 1));
      } else {
        static const uint32_t kSamples[] = {0x00E9, 0x4E2D, 0x1F600, 0x2028, 0x0A, 0x09, 0x7F, 0x3C0};
        cp = kSamples[rng() % 8];
      }
      if (valid_cp(cp) && c.contains(cp)) return cp;
    }
    for (const auto& [a, b] : c.ranges)
      for (uint32_t cp = a; cp <= b && cp < a + 4096; ++cp)
        if (valid_cp(cp) && c.contains(cp)) return cp;
    for (uint32_t cp = 0; cp < 0x10000; ++cp)
      if (valid_cp(cp) && c.contains(cp)) return cp;
    return 0;
  }

  void gen(uint32_t rule, std::mt19937& rng, int depth) {
    const auto& alts = g_->rules()[rule];
    const auto& el = g_->elements();
    const bool free = written_ < budget_ && depth < 200;
    const size_t a = free ? rng() % alts.size() : best_alt_[rule];
    for (uint32_t p = alts[a]; el[p].kind != grammar::Element::Kind::End; ++p) {
      if (el[p].kind == grammar::Element::Kind::Char) put(pick(g_->classes()[el[p].index], rng));
      else gen(el[p].index, rng, depth + 1);
    }
  }
};

}  // namespace ptllm::test
