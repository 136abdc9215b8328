#pragma once
// Reading tokenizer.json with errors that name the file and the field ("<file>: a.b[2]: ...").
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace ptllm::tok {

using json = nlohmann::json;

struct JsonPath {
  std::string file;
  std::string path;

  JsonPath operator/(std::string_view key) const {
    return {file, path.empty() ? std::string(key) : path + "." + std::string(key)};
  }
  JsonPath operator[](size_t i) const { return {file, path + "[" + std::to_string(i) + "]"}; }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(file + ": " + (path.empty() ? "" : path + ": ") + what);
  }
  // A Sequence nested in a Sequence: refused past kMaxNesting levels, before the recursion (and the
  // path, which grows with the depth: memory quadratic in it) goes on.
  static constexpr size_t kMaxNesting = 32;
  void check_nesting() const {
    if (size_t(std::count(path.begin(), path.end(), '[')) >= kMaxNesting)
      fail("Sequence nested more than " + std::to_string(kMaxNesting) + " levels deep");
  }
};

inline const json& need(const json& obj, std::string_view key, const JsonPath& at) {
  if (!obj.is_object()) at.fail("expected an object");
  auto it = obj.find(key);
  if (it == obj.end()) (at / key).fail("missing");
  return *it;
}

inline std::string get_string(const json& obj, std::string_view key, const JsonPath& at) {
  const json& v = need(obj, key, at);
  if (!v.is_string()) (at / key).fail("expected a string");
  return v.get<std::string>();
}

// An optional field: absent or null gives `dflt`.
inline bool get_bool(const json& obj, std::string_view key, const JsonPath& at, bool dflt) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) (at / key).fail("expected true or false");
  return it->get<bool>();
}

inline size_t get_size(const json& obj, std::string_view key, const JsonPath& at) {
  const json& v = need(obj, key, at);
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    (at / key).fail("expected a non-negative integer");
  return v.get<size_t>();
}

// A token id. Tables are indexed by id, so a corrupt file must not ask for billions of entries;
// real vocabularies stay far below 2^24.
inline int32_t to_id(const json& v, const JsonPath& at) {
  constexpr int64_t kMaxId = (1 << 24) - 1;
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxId)
    at.fail("expected a token id from 0 to " + std::to_string(kMaxId));
  return static_cast<int32_t>(v.get<int64_t>());
}

// A single character ("▁", " "), as Metaspace and Strip take.
inline std::string get_char(const json& obj, std::string_view key, const JsonPath& at) {
  std::string s = get_string(obj, key, at);
  if (s.empty() || s.size() > 4 || utf8_char_count(s) != 1)
    (at / key).fail("expected one character");
  return s;
}

// {"String": "..."} or {"Regex": "..."}, the pattern of Split and Replace.
inline Pattern get_pattern(const json& obj, const JsonPath& at) {
  const json& p = need(obj, "pattern", at);
  const JsonPath pat = at / "pattern";
  if (p.is_object() && p.size() == 1) {
    if (p.contains("String") && p["String"].is_string())
      return Pattern::literal(p["String"].get<std::string>());
    if (p.contains("Regex") && p["Regex"].is_string())
      return Pattern::regex(p["Regex"].get<std::string>(), pat.file + ": " + pat.path);
  }
  pat.fail("expected {\"String\": ...} or {\"Regex\": ...}");
}

// Metaspace's prepend_scheme, shared by its pre-tokenizer and decoder.
enum class PrependScheme { Always, First, Never };

inline PrependScheme get_prepend_scheme(const json& j, const JsonPath& at) {
  // Files older than prepend_scheme say add_prefix_space instead.
  if (!get_bool(j, "add_prefix_space", at, true)) return PrependScheme::Never;
  auto it = j.find("prepend_scheme");
  if (it == j.end() || it->is_null()) return PrependScheme::Always;
  const std::string s = it->is_string() ? it->get<std::string>() : "";
  if (s == "always") return PrependScheme::Always;
  if (s == "first") return PrependScheme::First;
  if (s == "never") return PrependScheme::Never;
  (at / "prepend_scheme").fail("expected \"always\", \"first\" or \"never\"");
}

[[noreturn]] inline void unsupported(const JsonPath& at, std::string_view kind,
                                     const std::string& type, std::string_view supported) {
  at.fail("unsupported " + std::string(kind) + " type '" + type +
          "' (supported: " + std::string(supported) + ")");
}

}  // namespace ptllm::tok
