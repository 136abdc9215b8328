#pragma once
// Template source -> tokens, as Jinja2's lexer with transformers' settings: trim_blocks (a block
// or comment tag eats the newline after it), lstrip_blocks (spaces and tabs before a block or
// comment tag on its own line go), `-`/`+` whitespace control on every tag, raw blocks, a single
// trailing newline dropped (keep_trailing_newline=False) and \r\n / \r read as \n.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ptllm::chat {

enum class Tok : uint8_t {
  Data,        // text outside tags, whitespace control already applied
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,  // text: the unescaped value
  Int,     // ival
  Float,   // fval
  Op,      // text: one of + - * / // % ** ~ == != < > <= >= = . , : | ( ) [ ] { } ;
  Eof,
};

struct Token {
  Tok type = Tok::Eof;
  int line = 1;
  std::string text;
  int64_t ival = 0;
  double fval = 0;
};

// Throws TemplateError (template name, line) on an unterminated tag, comment or string, an
// unknown character or an unbalanced bracket.
std::vector<Token> tokenize(std::string_view source, const std::string& template_name);

}  // namespace ptllm::chat
