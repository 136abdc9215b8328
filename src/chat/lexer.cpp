#include "chat/lexer.h"

#include <cctype>
#include <charconv>
#include <cstdlib>

#include "chat/pystr.h"
#include "chat/value.h"

namespace ptllm::chat {

namespace {

bool ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string normalize(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

class Lexer {
 public:
  Lexer(std::string_view src, const std::string& name) : s_(normalize(src)), name_(name) {}
  std::vector<Token> run();

 private:
  [[noreturn]] void fail(const std::string& msg) const { throw TemplateError(name_, line_, msg); }
  void advance_to(size_t p) {
    for (; pos_ < p; ++pos_)
      if (s_[pos_] == '\n') ++line_;
  }
  void emit(Tok t, std::string text = {}) { out_.push_back({t, line_, std::move(text), 0, 0}); }
  void data(std::string text, int line) {
    if (!text.empty()) out_.push_back({Tok::Data, line, std::move(text), 0, 0});
  }
  void skip_ws_after(bool all);  // after a tag end: trim_blocks' one newline, or all with '-'
  void comment();
  bool raw_block();
  void tag(bool block);
  void string_literal();
  void number();

  std::string s_;
  const std::string& name_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> out_;
};

std::vector<Token> Lexer::run() {
  while (pos_ < s_.size()) {
    size_t f = pos_;
    while ((f = s_.find('{', f)) != std::string::npos &&
           !(f + 1 < s_.size() && (s_[f + 1] == '{' || s_[f + 1] == '%' || s_[f + 1] == '#')))
      ++f;
    const int data_line = line_;
    if (f == std::string::npos) {
      data(s_.substr(pos_), data_line);
      advance_to(s_.size());
      break;
    }
    const char kind = s_[f + 1];
    const char sign = f + 2 < s_.size() ? s_[f + 2] : '\0';
    std::string text = s_.substr(pos_, f - pos_);
    if (sign == '-') {
      size_t e = text.size();
      while (e > 0 && ws(text[e - 1])) --e;
      text.resize(e);
    } else if (sign != '+' && kind != '{') {  // lstrip_blocks
      const size_t l = text.rfind('\n') + 1;  // npos + 1 == 0
      if ((l > 0 || line_starting_) && l < text.size() &&
          text.find_first_not_of(" \t\f\v\r", l) == std::string::npos)
        text.resize(l);
    }
    data(std::move(text), data_line);
    advance_to(f);
    pos_ += 2 + ((sign == '-' || sign == '+') ? 1 : 0);
    line_starting_ = false;
    if (kind == '#') comment();
    else if (kind == '%' && raw_block()) continue;
    else tag(kind == '%');
  }
  emit(Tok::Eof);
  return std::move(out_);
}

void Lexer::skip_ws_after(bool all) {
  if (all) {
    size_t e = pos_;
    while (e < s_.size() && ws(s_[e])) ++e;
    advance_to(e);
  } else if (pos_ < s_.size() && s_[pos_] == '\n') {
    advance_to(pos_ + 1);
  }
  line_starting_ = pos_ > 0 && s_[pos_ - 1] == '\n';
}

void Lexer::comment() {
  const size_t e = s_.find("#}", pos_);
  if (e == std::string::npos) fail("missing end of comment tag");
  const char sign = e > pos_ ? s_[e - 1] : '\0';
  advance_to(e + 2);
  if (sign != '+') skip_ws_after(sign == '-');
}

// {% raw %}...{% endraw %}: the text between, untouched.
bool Lexer::raw_block() {
  size_t p = pos_;
  while (p < s_.size() && ws(s_[p])) ++p;
  if (s_.compare(p, 3, "raw") != 0 || (p + 3 < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[p + 3])) || s_[p + 3] == '_')))
    return false;
  p += 3;
  while (p < s_.size() && ws(s_[p])) ++p;
  const bool strip_open = s_.compare(p, 3, "-%}") == 0;
  if (!strip_open && s_.compare(p, 2, "%}") != 0) fail("expected '%}' after raw");
  advance_to(p + (strip_open ? 3 : 2));
  if (strip_open) skip_ws_after(true);
  const int start_line = line_;
  for (size_t q = pos_; (q = s_.find("{%", q)) != std::string::npos; ++q) {
    size_t r = q + 2;
    const char sign = r < s_.size() ? s_[r] : '\0';
    if (sign == '-' || sign == '+') ++r;
    while (r < s_.size() && ws(s_[r])) ++r;
    if (s_.compare(r, 6, "endraw") != 0) continue;
    r += 6;
    while (r < s_.size() && ws(s_[r])) ++r;
    const bool strip_close = s_.compare(r, 3, "-%}") == 0;
    if (!strip_close && s_.compare(r, 2, "%}") != 0) continue;
    std::string text = s_.substr(pos_, q - pos_);
    if (sign == '-')
      while (!text.empty() && ws(text.back())) text.pop_back();
    data(std::move(text), start_line);
    advance_to(r + (strip_close ? 3 : 2));
    skip_ws_after(strip_close);
    return true;
  }
  fail("missing endraw");
}

void Lexer::tag(bool block) {
  emit(block ? Tok::BlockBegin : Tok::VarBegin);
  std::string stack;  // open brackets, so that '}}' inside a dict literal is two braces
  while (true) {
    while (pos_ < s_.size() && ws(s_[pos_])) advance_to(pos_ + 1);
    if (pos_ >= s_.size()) fail(block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'");
    const std::string_view rest(s_.data() + pos_, s_.size() - pos_);
    if (stack.empty()) {
      const char* end = block ? "%}" : "}}";
      const bool minus = rest.size() >= 3 && rest[0] == '-' && rest.substr(1, 2) == end;
      const bool plus = block && rest.size() >= 3 && rest[0] == '+' && rest.substr(1, 2) == end;
      if (minus || plus || rest.substr(0, 2) == end) {
        emit(block ? Tok::BlockEnd : Tok::VarEnd);
        advance_to(pos_ + (minus || plus ? 3 : 2));
        if (minus) skip_ws_after(true);
        else if (block && !plus) skip_ws_after(false);
        else line_starting_ = false;
        return;
      }
    }
    const char c = rest[0];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t n = 1;
      while (n < rest.size() && (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) ++n;
      emit(Tok::Name, std::string(rest.substr(0, n)));
      advance_to(pos_ + n);
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      number();
    } else if (c == '\'' || c == '"') {
      string_literal();
    } else {
      static const char* const two[] = {"//", "**", "==", "!=", ">=", "<="};
      std::string op(1, c);
      for (const char* t : two)
        if (rest.substr(0, 2) == t) op = t;
      if (op.size() == 1 && std::string_view("+-*/%~<>=.,:|()[]{};").find(c) == std::string_view::npos)
        fail(std::string("unexpected char '") + c + "'");
      if (c == '(' || c == '[' || c == '{') stack += c;
      if (c == ')' || c == ']' || c == '}') {
        const char open = c == ')' ? '(' : c == ']' ? '[' : '{';
        if (stack.empty() || stack.back() != open) fail(std::string("unexpected '") + c + "'");
        stack.pop_back();
      }
      emit(Tok::Op, op);
      advance_to(pos_ + op.size());
    }
  }
}

void Lexer::string_literal() {
  const char q = s_[pos_];
  std::string val;
  size_t p = pos_ + 1;
  auto hex = [&](size_t n) {
    if (p + n > s_.size()) fail("truncated escape in string");
    uint32_t v = 0;
    for (size_t k = 0; k < n; ++k) {
      const char h = s_[p + k];
      if (!std::isxdigit(static_cast<unsigned char>(h))) fail("truncated escape in string");
      v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
    }
    p += n;
    if (v > 0x10FFFF) fail("illegal Unicode character in string");
    pystr::append_utf8(val, v);
  };
  while (true) {
    if (p >= s_.size()) fail("unexpected end of string");
    const char c = s_[p];
    if (c == q) break;
    if (c != '\\') {
      val += c;
      ++p;
      continue;
    }
    if (p + 1 >= s_.size()) fail("unexpected end of string");
    const char e = s_[p + 1];
    p += 2;
    switch (e) {  // Python's unicode-escape, as Jinja2 decodes string literals
      case '\n': break;
      case '\\': val += '\\'; break;
      case '\'': val += '\''; break;
      case '"': val += '"'; break;
      case 'a': val += '\a'; break;
      case 'b': val += '\b'; break;
      case 'f': val += '\f'; break;
      case 'n': val += '\n'; break;
      case 'r': val += '\r'; break;
      case 't': val += '\t'; break;
      case 'v': val += '\v'; break;
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && p < s_.size() && s_[p] >= '0' && s_[p] <= '7'; ++k, ++p)
            v = v * 8 + static_cast<uint32_t>(s_[p] - '0');
          pystr::append_utf8(val, v);
        } else {
          val += '\\';
          val += e;
        }
    }
  }
  emit(Tok::String, std::move(val));
  advance_to(p + 1);
}

void Lexer::number() {
  size_t p = pos_;
  std::string digits;
  auto run = [&] {
    const size_t b = p;
    while (p < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[p])) || (s_[p] == '_' && p > b)))
      if (s_[p++] != '_') digits += s_[p - 1];
  };
  run();
  bool is_float = false;
  if (p + 1 < s_.size() && s_[p] == '.' && std::isdigit(static_cast<unsigned char>(s_[p + 1]))) {
    is_float = true;
    digits += s_[p++];
    run();
  }
  if (p < s_.size() && (s_[p] == 'e' || s_[p] == 'E')) {
    size_t q = p + 1;
    if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
    if (q < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q]))) {
      is_float = true;
      digits += 'e';
      digits.append(s_, p + 1, q - p - 1);
      p = q;
      run();
    }
  }
  Token t{is_float ? Tok::Float : Tok::Int, line_, digits, 0, 0};
  if (is_float) {
    t.fval = std::strtod(digits.c_str(), nullptr);
  } else {
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), t.ival);
    if (ec != std::errc() || ptr != digits.data() + digits.size()) fail("integer literal too large: " + digits);
  }
  out_.push_back(std::move(t));
  advance_to(p);
}

}  // namespace

std::vector<Token> tokenize(std::string_view source, const std::string& template_name) {
  return Lexer(source, template_name).run();
}

}  // namespace ptllm::chat
