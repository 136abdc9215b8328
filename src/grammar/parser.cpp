// The GBNF parser and compiler to the flat form of grammar.h. Syntax as in llama.cpp's
// docs/grammars/README.md: newlines end a rule except after "::=", after "|" and inside parentheses;
// also accepted here, a line that starts with "|" continues the rule above.
#include <algorithm>
#include <functional>
#include <map>

#include "grammar/grammar.h"

namespace ptllm::grammar {

GrammarError::GrammarError(int l, int c, const std::string& m)
    : Error("grammar: line " + std::to_string(l) + ", column " + std::to_string(c) + ": " + m),
      line(l), column(c), message(m) {}

namespace {
constexpr uint32_t kMaxRepeat = 1000;  // bounds {m,n}: each count copies the element
}

class Compiler {
 public:
  explicit Compiler(std::string_view text) : t_(text) {}

  std::shared_ptr<const Grammar> run(std::string_view root) {
    skip_space(true);
    while (p_ < t_.size()) {
      parse_rule();
      skip_space(true);
    }
    for (size_t r = 0; r < names_.size(); ++r)
      if (!defined_[r]) fail_at(first_use_[r], "undefined rule '" + names_[r] + "'");
    auto it = ids_.find(std::string(root));
    if (it == ids_.end() || !defined_[it->second])
      throw GrammarError(1, 1, "no rule '" + std::string(root) + "' (the start rule)");
    check_left_recursion();
    return flatten(it->second);
  }

 private:
  using Seq = std::vector<Element>;
  std::string_view t_;
  size_t p_ = 0;
  std::map<std::string, uint32_t> ids_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::vector<size_t> first_use_;  // offset of the first mention
  std::vector<std::vector<Seq>> alts_;
  std::vector<uint32_t> origin_;   // helper rules: the user rule they come from
  std::vector<CharClass> classes_;
  uint32_t current_ = 0;           // the user rule being parsed

  [[noreturn]] void fail_at(size_t off, const std::string& msg) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < off && i < t_.size(); ++i) {
      if (t_[i] == '\n') { ++line; col = 1; } else { ++col; }
    }
    throw GrammarError(line, col, msg);
  }
  [[noreturn]] void fail(const std::string& msg) const { fail_at(p_, msg); }

  bool at_end() const { return p_ >= t_.size(); }
  char peek(size_t k = 0) const { return p_ + k < t_.size() ? t_[p_ + k] : '\0'; }

  void skip_space(bool newlines) {
    while (!at_end()) {
      char c = t_[p_];
      if (c == ' ' || c == '\t' || c == '\r') ++p_;
      else if (c == '\n' && newlines) ++p_;
      else if (c == '#') { while (!at_end() && t_[p_] != '\n') ++p_; }
      else break;
    }
  }

  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }

  std::string parse_name() {
    size_t b = p_;
    while (!at_end() && name_char(t_[p_])) ++p_;
    if (b == p_) fail("expected a rule name");
    return std::string(t_.substr(b, p_ - b));
  }

  uint32_t rule_id(const std::string& name, size_t off) {
    auto [it, fresh] = ids_.emplace(name, static_cast<uint32_t>(names_.size()));
    if (fresh) {
      names_.push_back(name);
      defined_.push_back(false);
      first_use_.push_back(off);
      alts_.emplace_back();
      origin_.push_back(it->second);
    }
    return it->second;
  }

  uint32_t new_helper(std::vector<Seq> alts) {
    uint32_t id = static_cast<uint32_t>(names_.size());
    names_.push_back(names_[current_] + "_" + std::to_string(id));
    defined_.push_back(true);
    first_use_.push_back(p_);
    alts_.push_back(std::move(alts));
    origin_.push_back(current_);
    return id;
  }

  void parse_rule() {
    size_t start = p_;
    std::string name = parse_name();
    uint32_t id = rule_id(name, start);
    if (defined_[id]) fail_at(start, "rule '" + name + "' is defined twice");
    defined_[id] = true;
    first_use_[id] = start;
    current_ = id;
    skip_space(false);
    if (t_.substr(p_, 3) != "::=") fail("expected '::=' after the rule name '" + name + "'");
    p_ += 3;
    skip_space(true);
    alts_[id] = parse_alternatives(false);
    if (!at_end() && peek() != '\n') fail("expected the end of the rule, a newline");
  }

  std::vector<Seq> parse_alternatives(bool nested) {
    std::vector<Seq> alts;
    alts.push_back(parse_sequence(nested));
    while (true) {
      // A line that begins with '|' continues the rule above: no rule can begin with '|'.
      const size_t save = p_;
      skip_space(true);
      if (peek() != '|') {
        p_ = save;
        break;
      }
      ++p_;
      skip_space(true);
      alts.push_back(parse_sequence(nested));
    }
    return alts;
  }

  // A sequence ends at '|', ')', the end, or (outside parentheses) a newline.
  Seq parse_sequence(bool nested) {
    Seq seq;
    while (!at_end()) {
      char c = peek();
      if (c == '|' || c == ')' || c == '\n') break;
      Seq atom = parse_atom();
      skip_space(nested);
      c = peek();
      if (c == '*' || c == '+' || c == '?' || c == '{') {
        uint32_t lo = 0, hi = 0;
        bool unbounded = false;
        if (c == '*') { unbounded = true; ++p_; }
        else if (c == '+') { lo = 1; unbounded = true; ++p_; }
        else if (c == '?') { hi = 1; ++p_; }
        else parse_braces(lo, hi, unbounded);
        repeat(seq, atom, lo, hi, unbounded);
        skip_space(nested);
      } else {
        seq.insert(seq.end(), atom.begin(), atom.end());
      }
    }
    return seq;
  }

  uint32_t parse_int() {
    size_t b = p_;
    uint64_t v = 0;
    while (!at_end() && t_[p_] >= '0' && t_[p_] <= '9') {
      v = v * 10 + static_cast<uint64_t>(t_[p_] - '0');
      if (v > kMaxRepeat) fail_at(b, "repetition count above " + std::to_string(kMaxRepeat));
      ++p_;
    }
    if (b == p_) fail("expected a number in '{...}'");
    return static_cast<uint32_t>(v);
  }

  void parse_braces(uint32_t& lo, uint32_t& hi, bool& unbounded) {
    size_t b = p_;
    ++p_;
    skip_space(false);
    lo = parse_int();
    skip_space(false);
    if (peek() == ',') {
      ++p_;
      skip_space(false);
      if (peek() == '}') unbounded = true;
      else hi = parse_int();
      skip_space(false);
    } else {
      hi = lo;
    }
    if (peek() != '}') fail("expected '}' or ',' in a repetition");
    ++p_;
    if (!unbounded && hi < lo) fail_at(b, "repetition {m,n} with n < m");
  }

  // atom repeated lo..hi times (or lo.. when unbounded), appended to seq.
  void repeat(Seq& seq, Seq atom, uint32_t lo, uint32_t hi, bool unbounded) {
    if (atom.size() != 1) atom = {Element{Element::Kind::Ref, new_helper({atom})}};
    const Element x = atom[0];
    for (uint32_t i = 0; i < lo; ++i) seq.push_back(x);
    if (unbounded) {
      uint32_t s = new_helper({});
      alts_[s] = {Seq{x, Element{Element::Kind::Ref, s}}, Seq{}};
      seq.push_back(Element{Element::Kind::Ref, s});
      return;
    }
    // opt_k ::= x opt_{k-1} | (empty), nested so that every count in range is one path.
    uint32_t inner = 0;
    bool have = false;
    for (uint32_t k = lo; k < hi; ++k) {
      Seq first{x};
      if (have) first.push_back(Element{Element::Kind::Ref, inner});
      inner = new_helper({first, Seq{}});
      have = true;
    }
    if (have) seq.push_back(Element{Element::Kind::Ref, inner});
  }

  Seq parse_atom() {
    char c = peek();
    if (c == '"') return parse_literal();
    if (c == '[') return {Element{Element::Kind::Char, parse_class()}};
    if (c == '.') {
      ++p_;
      classes_.push_back(CharClass{{}, true});
      return {Element{Element::Kind::Char, static_cast<uint32_t>(classes_.size() - 1)}};
    }
    if (c == '(') {
      ++p_;
      skip_space(true);
      auto alts = parse_alternatives(true);
      if (peek() != ')') fail("expected ')'");
      ++p_;
      return {Element{Element::Kind::Ref, new_helper(std::move(alts))}};
    }
    if (name_char(c)) {
      size_t b = p_;
      std::string name = parse_name();
      size_t save = p_;
      skip_space(false);
      if (t_.substr(p_, 3) == "::=") fail_at(b, "expected the end of the rule before the new rule '" + name + "'");
      p_ = save;
      return {Element{Element::Kind::Ref, rule_id(name, b)}};
    }
    fail(std::string("expected an element (a \"string\", a [class], '.', '(' or a rule name), found '") +
         (at_end() ? std::string("end of input") : std::string(1, c)) + "'");
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      char c = peek();
      int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) fail("expected " + std::to_string(digits) + " hex digits");
      v = v * 16 + static_cast<uint32_t>(d);
      ++p_;
    }
    return v;
  }

  // One code point of a literal or class: an escape or a UTF-8 character.
  uint32_t parse_char() {
    if (at_end()) fail("unexpected end of input");
    size_t b = p_;
    unsigned char c = static_cast<unsigned char>(t_[p_]);
    if (c == '\\') {
      ++p_;
      if (at_end()) fail("unexpected end of input after '\\'");
      char e = peek();
      ++p_;
      switch (e) {
        case 'n': return '\n';
        case 't': return '\t';
        case 'r': return '\r';
        case '\\': case '"': case '[': case ']': case '-': case '/': case '^': return static_cast<uint32_t>(e);
        case 'x': return hex(2);
        case 'u': return check_cp(hex(4), b);
        case 'U': return check_cp(hex(8), b);
        default: fail_at(b, "unknown escape '\\" + std::string(1, e) + "'");
      }
    }
    int n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    if (n < 0) fail("invalid UTF-8");
    uint32_t v = n == 0 ? c : n == 1 ? (c & 0x1F) : n == 2 ? (c & 0x0F) : (c & 0x07);
    ++p_;
    for (int i = 0; i < n; ++i) {
      unsigned char k = static_cast<unsigned char>(peek());
      if ((k & 0xC0) != 0x80) fail("invalid UTF-8");
      v = (v << 6) | (k & 0x3F);
      ++p_;
    }
    return v;
  }

  uint32_t check_cp(uint32_t v, size_t at) const {
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) fail_at(at, "escape is not a Unicode scalar value");
    return v;
  }

  Seq parse_literal() {
    size_t b = p_;
    ++p_;
    Seq seq;
    while (true) {
      if (at_end() || peek() == '\n') fail_at(b, "unterminated string literal");
      if (peek() == '"') { ++p_; break; }
      uint32_t cp = parse_char();
      classes_.push_back(CharClass{{{cp, cp}}, false});
      seq.push_back(Element{Element::Kind::Char, static_cast<uint32_t>(classes_.size() - 1)});
    }
    return seq;
  }

  uint32_t parse_class() {
    size_t b = p_;
    ++p_;
    CharClass cls;
    if (peek() == '^') { cls.negated = true; ++p_; }
    while (true) {
      if (at_end()) fail_at(b, "unterminated character class, expected ']'");
      if (peek() == ']') { ++p_; break; }
      uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && p_ + 1 < t_.size()) {
        ++p_;
        size_t at = p_;
        hi = parse_char();
        if (hi < lo) fail_at(at, "character range end below its start");
      }
      cls.ranges.emplace_back(lo, hi);
    }
    std::sort(cls.ranges.begin(), cls.ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (auto r : cls.ranges) {
      if (!merged.empty() && r.first <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, r.second);
      else merged.push_back(r);
    }
    cls.ranges = std::move(merged);
    classes_.push_back(std::move(cls));
    return static_cast<uint32_t>(classes_.size() - 1);
  }

  // A rule is left-recursive when it can reach itself through references that come first in
  // an alternative, after only nullable elements.
  void check_left_recursion() {
    const size_t n = alts_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Seq& s : alts_[r]) {
          bool all = std::all_of(s.begin(), s.end(), [&](const Element& e) {
            return e.kind == Element::Kind::Ref && nullable[e.index];
          });
          if (all) { nullable[r] = true; changed = true; break; }
        }
      }
    }
    std::vector<std::vector<uint32_t>> first(n);
    for (size_t r = 0; r < n; ++r)
      for (const Seq& s : alts_[r])
        for (const Element& e : s) {
          if (e.kind != Element::Kind::Ref) break;
          first[r].push_back(e.index);
          if (!nullable[e.index]) break;
        }
    std::vector<int> color(n, 0);  // 0 unseen, 1 on the path, 2 done
    std::function<void(uint32_t)> dfs = [&](uint32_t r) {
      color[r] = 1;
      for (uint32_t q : first[r]) {
        if (color[q] == 1) {
          uint32_t user = origin_[q];
          fail_at(first_use_[user], "rule '" + names_[user] + "' is left-recursive (it can start with itself)");
        }
        if (color[q] == 0) dfs(q);
      }
      color[r] = 2;
    };
    for (uint32_t r = 0; r < n; ++r)
      if (color[r] == 0) dfs(r);
  }

  std::shared_ptr<const Grammar> flatten(uint32_t root) {
    auto g = std::make_shared<Grammar>();
    g->root_ = root;
    g->classes_ = std::move(classes_);
    g->names_ = names_;
    g->rules_.resize(alts_.size());
    for (size_t r = 0; r < alts_.size(); ++r)
      for (const Seq& s : alts_[r]) {
        g->rules_[r].push_back(static_cast<uint32_t>(g->elements_.size()));
        g->elements_.insert(g->elements_.end(), s.begin(), s.end());
        g->elements_.push_back(Element{});
      }
    return g;
  }
};

std::shared_ptr<const Grammar> Grammar::parse(std::string_view text, std::string_view root) {
  return Compiler(text).run(root);
}

bool CharClass::contains(uint32_t cp) const { return intersects(cp, cp); }

bool CharClass::intersects(uint32_t lo, uint32_t hi) const {
  if (!negated) {
    for (auto [a, b] : ranges)
      if (a <= hi && b >= lo) return true;
    return false;
  }
  // Some point of [lo, hi] outside every (sorted, merged) range.
  uint32_t next = lo;
  for (auto [a, b] : ranges) {
    if (b < next) continue;
    if (a > next) return true;
    if (b >= hi) return false;
    next = b + 1;
  }
  return next <= hi;
}

}  // namespace ptllm::grammar
