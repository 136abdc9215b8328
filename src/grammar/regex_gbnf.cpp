// Regex subsets, formats and key exclusion as GBNF (regex_gbnf.h). Regex syntax per ECMA-262
// (22.2, with the u flag, as JSON Schema validators such as ajv compile "pattern").
#include "grammar/regex_gbnf.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

namespace ptllm::grammar {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCp = 0x10FFFF;

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) out.back().second = std::max(out.back().second, x.second);
    else out.push_back(x);
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (auto [a, b] : normalize(r)) {
    if (a > next) out.emplace_back(next, a - 1);
    next = b + 1;
  }
  if (next <= kMaxCp) out.emplace_back(next, kMaxCp);
  return out;
}

Ranges subtract(const Ranges& a, const Ranges& b) {
  Ranges cb = complement(b), out;
  for (auto [x, y] : normalize(a))
    for (auto [p, q] : cb) {
      const uint32_t lo = std::max(x, p), hi = std::min(y, q);
      if (lo <= hi) out.emplace_back(lo, hi);
    }
  return normalize(out);
}

std::string class_char(uint32_t cp) {
  char buf[16];
  if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return std::string(1, static_cast<char>(cp));
  if (cp <= 0xFF) std::snprintf(buf, sizeof buf, "\\x%02X", cp);
  else if (cp <= 0xFFFF) std::snprintf(buf, sizeof buf, "\\u%04X", cp);
  else std::snprintf(buf, sizeof buf, "\\U%08X", cp);
  return buf;
}

// A GBNF class of the ranges (surrogates left out: the GBNF parser refuses them as escapes).
std::string gbnf_class(const Ranges& r) {
  std::string out = "[";
  for (auto [a, b] : r) {
    std::vector<std::pair<uint32_t, uint32_t>> parts;
    if (a < 0xD800 && b > 0xDFFF) parts = {{a, 0xD7FF}, {0xE000, b}};
    else if (a >= 0xD800 && b <= 0xDFFF) continue;
    else if (a >= 0xD800 && a <= 0xDFFF) parts = {{0xE000, b}};
    else if (b >= 0xD800 && b <= 0xDFFF) parts = {{a, 0xD7FF}};
    else parts = {{a, b}};
    for (auto [x, y] : parts) {
      out += class_char(x);
      if (y != x) out += "-" + class_char(y);
    }
  }
  return out + "]";
}

std::string escape_of(uint32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      return buf;
    }
  }
}

// JSON text of one character of the set: direct characters, and the escapes of those JSON must escape.
std::string json_chars_of(const Ranges& set) {
  const Ranges must_escape = normalize({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
  const Ranges direct = subtract(set, normalize({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0xD800, 0xDFFF}}));
  std::vector<std::string> alts;
  if (!direct.empty()) alts.push_back(gbnf_class(direct));
  for (auto [a, b] : normalize(set))
    for (auto [p, q] : must_escape)
      for (uint32_t c = std::max(a, p); c <= std::min(b, q); ++c) alts.push_back(gbnf_literal(escape_of(c)));
  if (alts.empty()) throw RegexError("a character class that matches nothing");
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : " ") + alts[i];
  return out + " )";
}

std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    if (n < 0 || i + static_cast<size_t>(n) >= s.size() + (n == 0 ? 1 : 0)) throw RegexError("invalid UTF-8");
    uint32_t v = n == 0 ? c : n == 1 ? (c & 0x1F) : n == 2 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k <= n; ++k) {
      if (i + static_cast<size_t>(k) >= s.size()) throw RegexError("invalid UTF-8");
      v = (v << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3F);
    }
    out.push_back(v);
    i += static_cast<size_t>(n) + 1;
  }
  return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = normalize({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
const Ranges kSpace = normalize({{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                                 {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}});

class RegexParser {
 public:
  RegexParser(std::vector<uint32_t> p, std::string jc) : p_(std::move(p)), jc_(std::move(jc)) {}

  std::string run(int64_t min_len, int64_t max_len) {
    bool start = false, end = false;
    size_t b = 0, e = p_.size();
    if (e > 0 && p_[0] == '^') { start = true; b = 1; }
    if (e > b && p_[e - 1] == '$') {
      size_t bs = 0;
      for (size_t k = e - 1; k > b && p_[k - 1] == '\\'; --k) ++bs;
      if (bs % 2 == 0) { end = true; --e; }
    }
    p_.resize(e);
    i_ = b;
    std::string body = alternation();
    if (i_ < p_.size()) fail("unbalanced ')'");
    const Len len = start && end ? len_ : Len{len_.min, kInf};
    const bool bounded = min_len > 0 || max_len >= 0;
    if (bounded && !(len.min >= min_len && (max_len < 0 || len.max <= max_len))) {
      // One class repeated, anchored: the bounds narrow the repetition.
      if (!(start && end && rep_)) throw RegexLengthError("the pattern's lengths are not within minLength/maxLength");
      const int64_t lo = std::max(rep_lo_, min_len);
      const int64_t hi = rep_hi_ < 0 ? max_len : max_len < 0 ? rep_hi_ : std::min(rep_hi_, max_len);
      if (hi >= 0 && lo > hi) throw RegexLengthError("no string of the pattern has a length within minLength/maxLength");
      if (lo > 1000 || hi > 1000) throw RegexLengthError("bounds above 1000 together with pattern are not supported");
      return rep_class_ + (hi < 0 ? "{" + std::to_string(lo) + ",}" : "{" + std::to_string(lo) + "," + std::to_string(hi) + "}");
    }
    std::string out = start ? "" : jc_ + "* ";
    out += "( " + body + " )";
    if (!end) out += " " + jc_ + "*";
    return out;
  }

 private:
  std::vector<uint32_t> p_;
  std::string jc_;
  size_t i_ = 0;
  // Lengths in code points of the piece parsed last (kInf: unbounded), and whether it was one
  // character (an atom) or one character class repeated (rep_: class, lo, hi or -1).
  static constexpr int64_t kInf = int64_t{1} << 40;
  struct Len {
    int64_t min, max;
  };
  Len len_{0, 0};
  bool single_ = false;
  bool rep_ = false;
  std::string rep_class_;
  int64_t rep_lo_ = 0, rep_hi_ = -1;
  static int64_t sat(int64_t v) { return std::min(v, kInf); }

  [[noreturn]] void fail(const std::string& what) const {
    throw RegexError(what + " (at character " + std::to_string(i_ + 1) + "); supported: literals, escapes, classes, '.', "
                     "groups, '|', quantifiers, ^ at the start and $ at the end");
  }
  bool more() const { return i_ < p_.size(); }
  uint32_t peek(size_t k = 0) const { return i_ + k < p_.size() ? p_[i_ + k] : 0xFFFFFFFF; }

  std::string alternation() {
    std::vector<std::string> alts{sequence()};
    Len len = len_;
    while (more() && peek() == '|') {
      ++i_;
      alts.push_back(sequence());
      len = {std::min(len.min, len_.min), std::max(len.max, len_.max)};
      rep_ = false;
    }
    len_ = len;
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t k = 0; k < alts.size(); ++k) out += (k ? " | " : " ") + alts[k];
    return out + " )";
  }

  std::string sequence() {
    std::string out;
    Len len{0, 0};
    int pieces = 0;
    bool rep = false;
    while (more() && peek() != '|' && peek() != ')') {
      rep_ = false;
      std::string a = atom();
      a = quantified(a);
      rep = rep_;
      ++pieces;
      len = {sat(len.min + len_.min), sat(len.max + len_.max)};
      if (!a.empty()) out += (out.empty() ? "" : " ") + a;
    }
    len_ = len;
    rep_ = pieces == 1 && rep;
    return out.empty() ? "\"\"" : out;
  }

  bool read_int(uint64_t& v) {
    size_t b = i_;
    v = 0;
    while (more() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > 100000) fail("repetition count too large");
      ++i_;
    }
    return i_ > b;
  }

  std::string quantified(const std::string& a) {
    if (!more()) return a;
    uint32_t c = peek();
    uint64_t lo = 0, hi = 0;
    bool unbounded = false;
    if (c == '*') { unbounded = true; ++i_; }
    else if (c == '+') { lo = 1; unbounded = true; ++i_; }
    else if (c == '?') { hi = 1; ++i_; }
    else if (c == '{') {
      ++i_;
      if (!read_int(lo)) fail("'{' must start a quantifier {m}, {m,} or {m,n}");
      if (more() && peek() == ',') {
        ++i_;
        if (more() && peek() == '}') unbounded = true;
        else if (!read_int(hi)) fail("bad quantifier");
      } else {
        hi = lo;
      }
      if (!more() || peek() != '}') fail("bad quantifier, expected '}'");
      ++i_;
      if (!unbounded && hi < lo) fail("quantifier {m,n} with n < m");
      if (lo > 1000 || hi > 1000) fail("repetition counts above 1000 are not supported");
    } else {
      return a;
    }
    if (more() && peek() == '?') ++i_;  // lazy: the same language
    if (more() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{')) fail("nothing to repeat");
    if (single_) {
      rep_ = true;
      rep_class_ = "( " + a + " )";
      rep_lo_ = static_cast<int64_t>(lo);
      rep_hi_ = unbounded ? -1 : static_cast<int64_t>(hi);
    } else {
      rep_ = false;  // a repeated group is not one class repeated
    }
    len_ = {sat(len_.min * static_cast<int64_t>(lo)), unbounded ? (len_.max == 0 ? 0 : kInf) : sat(len_.max * static_cast<int64_t>(hi))};
    single_ = false;
    const std::string x = "( " + a + " )";
    if (unbounded) {
      if (lo == 0) return x + "*";
      if (lo == 1) return x + "+";
      return x + "{" + std::to_string(lo) + ",}";
    }
    if (hi == 0) return "";
    if (lo == 0 && hi == 1) return x + "?";
    if (lo == hi) return x + "{" + std::to_string(lo) + "}";
    return x + "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
  }

  std::string atom() {
    const uint32_t c = peek();
    len_ = {1, 1};
    single_ = c != '(';
    if (c == '(') {
      ++i_;
      if (peek() == '?') {
        if (peek(1) == ':') i_ += 2;
        else fail("lookarounds and named groups are not supported");
      }
      std::string inner = alternation();
      if (!more() || peek() != ')') fail("missing ')'");
      ++i_;
      single_ = false;
      return "( " + inner + " )";
    }
    if (c == '[') return json_chars_of(char_class());
    if (c == '.') {
      ++i_;
      return json_chars_of(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '\\') {
      Ranges r = escape(false);
      return json_chars_of(r);
    }
    if (c == '^' || c == '$') fail("anchors are supported only at the start (^) and the end ($)");
    if (c == '*' || c == '+' || c == '?' || c == '{') fail("nothing to repeat");
    if (c == '}' || c == ']') fail("lone '" + std::string(1, static_cast<char>(c)) + "'");
    ++i_;
    return json_chars_of({{c, c}});
  }

  uint32_t hex_digits(size_t n) {
    uint32_t v = 0;
    for (size_t k = 0; k < n; ++k) {
      uint32_t c = peek();
      int d = (c >= '0' && c <= '9') ? int(c - '0') : (c >= 'a' && c <= 'f') ? int(c - 'a' + 10) : (c >= 'A' && c <= 'F') ? int(c - 'A' + 10) : -1;
      if (d < 0) fail("bad hex escape");
      v = v * 16 + static_cast<uint32_t>(d);
      ++i_;
    }
    return v;
  }

  // After '\\': a set (\d ...) or one code point.
  Ranges escape(bool in_class) {
    ++i_;
    if (!more()) fail("'\\' at the end");
    const uint32_t c = peek();
    ++i_;
    switch (c) {
      case 'd': return kDigit;
      case 'D': return complement(kDigit);
      case 'w': return kWord;
      case 'W': return complement(kWord);
      case 's': return kSpace;
      case 'S': return complement(kSpace);
      case 't': return {{'\t', '\t'}};
      case 'n': return {{'\n', '\n'}};
      case 'r': return {{'\r', '\r'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case '0':
        if (more() && peek() >= '0' && peek() <= '9') fail("octal escapes are not supported");
        return {{0, 0}};
      case 'x': {
        uint32_t v = hex_digits(2);
        return {{v, v}};
      }
      case 'u': {
        uint32_t v;
        if (peek() == '{') {
          ++i_;
          v = 0;
          size_t n = 0;
          while (more() && peek() != '}') { v = v * 16 + hex_digits(1); if (++n > 6) fail("bad \\u{...} escape"); }
          if (!more() || n == 0) fail("bad \\u{...} escape");
          ++i_;
          if (v > kMaxCp) fail("escape above U+10FFFF");
        } else {
          v = hex_digits(4);
          if (v >= 0xD800 && v <= 0xDBFF && peek() == '\\' && peek(1) == 'u') {
            const size_t save = i_;
            i_ += 2;
            uint32_t lo = hex_digits(4);
            if (lo >= 0xDC00 && lo <= 0xDFFF) v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            else i_ = save;
          }
        }
        if (v >= 0xD800 && v <= 0xDFFF) fail("a lone surrogate escape");
        return {{v, v}};
      }
      case 'b':
        if (in_class) return {{8, 8}};
        fail("word boundaries (\\b) are not supported");
      case '-':
        if (in_class) return {{'-', '-'}};
        fail("'\\-' outside a class");
      default:
        break;
    }
    static const std::u32string kSyntax = U"^$\\.*+?()[]{}|/";
    if (kSyntax.find(static_cast<char32_t>(c)) != std::u32string::npos) return {{c, c}};
    if (c >= '1' && c <= '9') fail("backreferences are not supported");
    fail("escape '\\" + std::string(1, c < 0x80 ? static_cast<char>(c) : '?') + "' is not supported");
  }

  Ranges char_class() {
    ++i_;  // '['
    bool negated = false;
    if (peek() == '^') { negated = true; ++i_; }
    Ranges set;
    while (true) {
      if (!more()) fail("missing ']'");
      if (peek() == ']') { ++i_; break; }
      Ranges a = class_atom();
      if (peek() == '-' && peek(1) != ']' && i_ + 1 < p_.size()) {
        ++i_;
        Ranges b = class_atom();
        if (a.size() != 1 || b.size() != 1 || a[0].first != a[0].second || b[0].first != b[0].second)
          fail("a class escape as the end of a range");
        if (b[0].first < a[0].first) fail("a range out of order");
        set.emplace_back(a[0].first, b[0].first);
      } else {
        set.insert(set.end(), a.begin(), a.end());
      }
    }
    set = normalize(set);
    return negated ? complement(set) : set;
  }

  Ranges class_atom() {
    if (peek() == '\\') return escape(true);
    if (peek() == '[') fail("nested classes are not supported");
    const uint32_t c = peek();
    ++i_;
    return {{c, c}};
  }
};

}  // namespace

std::string gbnf_literal(std::string_view bytes) {
  std::string out = "\"";
  for (char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string regex_to_gbnf(std::string_view pattern, const std::string& json_char, int64_t min_len, int64_t max_len) {
  return RegexParser(decode_utf8(pattern), json_char).run(min_len, max_len);
}

std::string string_not_in_gbnf(const std::vector<std::string>& keys, const std::string& /*json_char*/) {
  // A trie of the keys' code points; from each node: close the string (unless a key ends here),
  // or a character that leaves the trie followed by anything, or a child.
  struct Node {
    std::map<uint32_t, std::unique_ptr<Node>> children;
    bool end = false;
  };
  Node root;
  for (const auto& k : keys) {
    Node* n = &root;
    for (uint32_t cp : decode_utf8(k)) {
      auto& ch = n->children[cp];
      if (!ch) ch = std::make_unique<Node>();
      n = ch.get();
    }
    n->end = true;
  }
  const Ranges plain_excluded = normalize({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
  const std::string plain = "[^\"\\\\\\x00-\\x1F]";
  std::function<std::string(const Node&)> expr = [&](const Node& n) -> std::string {
    std::vector<std::string> alts;
    if (!n.end) alts.push_back("\"\\\"\"");
    Ranges out = plain_excluded;
    for (const auto& [cp, child] : n.children) out.emplace_back(cp, cp);
    alts.push_back(gbnf_class(complement(normalize(out))) + " " + plain + "* \"\\\"\"");
    for (const auto& [cp, child] : n.children) {
      if (cp < 0x20 || cp == '"' || cp == '\\' || (cp >= 0xD800 && cp <= 0xDFFF)) continue;  // never written unescaped
      alts.push_back(gbnf_class({{cp, cp}}) + " ( " + expr(*child) + " )");
    }
    std::string s;
    for (size_t k = 0; k < alts.size(); ++k) s += (k ? " | " : "") + alts[k];
    return s;
  };
  return "\"\\\"\" ( " + expr(root) + " )";
}

std::string format_gbnf(const std::string& format,
                        const std::function<std::string(const std::string&, const std::string&)>& shared) {
  auto date = [&] {
    // Days per month, February 29 only in leap years (RFC 3339 section 5.7, as ajv-formats checks).
    const std::string m4 = "( \"0\" [48] | [2468] [048] | [13579] [26] )";
    return shared("date", "[0-9]{4} \"-\" ( \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) | ( \"0\" [13578] | \"1\" [02] ) \"-\" "
                          "( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | ( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) ) "
                          "| ( [0-9]{2} " + m4 + " | ( " + m4 + " | \"00\" ) \"00\" ) \"-02-29\"");
  };
  auto time = [&] {
    return shared("time", "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? "
                          "( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )");
  };
  if (format == "date") return date();
  if (format == "time") return time();
  if (format == "date-time") return shared("date-time", date() + " \"T\" " + time());
  if (format == "uuid") {
    const std::string h = "[0-9a-fA-F]";
    return shared("uuid", h + "{8} \"-\" " + h + "{4} \"-\" " + h + "{4} \"-\" " + h + "{4} \"-\" " + h + "{12}");
  }
  if (format == "email") {
    // A subset of what ajv-formats' email regex accepts: dot-separated atoms, an LDH domain.
    const std::string label = shared("email-label", "[a-zA-Z0-9] ( [a-zA-Z0-9-]{0,61} [a-zA-Z0-9] )?");
    return shared("email", "[a-zA-Z0-9_+-]+ ( \".\" [a-zA-Z0-9_+-]+ )* \"@\" " + label + " ( \".\" " + label + " )+");
  }
  return "";
}

}  // namespace ptllm::grammar
