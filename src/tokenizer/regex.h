#pragma once
// The patterns of tokenizer.json (Split, Replace, the ByteLevel regex) on PCRE2. tokenizers
// compiles them with Oniguruma (Ruby syntax); the differences that matter are bridged here.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/function_ref.h"

namespace ptllm::tok {

class Pattern {
 public:
  // A regular expression in Oniguruma syntax, or a literal string (tokenizers' {"String": ...}).
  // Throws ptllm::Error with `where` in the message if the regex does not compile.
  static Pattern regex(std::string_view pattern, const std::string& where);
  static Pattern literal(std::string_view text);
  ~Pattern();
  Pattern(Pattern&&) noexcept;
  Pattern& operator=(Pattern&&) noexcept;

  // Every match in order, with the iteration rule of Rust's find_iter (which tokenizers' onig
  // wrapper shares): an empty match right where the previous match ended is skipped. No match
  // at all in an empty subject. `subject` must be valid UTF-8.
  void for_each_match(std::string_view subject, FunctionRef<void(size_t, size_t)> fn) const;

  // subject with every match replaced by `content`, taken literally as tokenizers 0.23 does
  // (no $1 group expansion).
  std::string replace_all(std::string_view subject, std::string_view content) const;

  bool is_literal() const { return !code_; }
  const std::string& literal_text() const { return literal_; }

 private:
  Pattern() = default;
  struct Code;
  std::unique_ptr<Code> code_;  // null for a literal
  std::string literal_;
};

// Rust regex \w (Alphabetic, marks, decimal digits, connector punctuation, join controls): the
// word test of added tokens' single_word.
bool is_word_char(char32_t c);

}  // namespace ptllm::tok
