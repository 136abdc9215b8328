#pragma once
// Pieces of JSON Schema strings as GBNF (json_schema.cpp): ECMAScript-regex subsets for "pattern",
// formats, and keys other than a given set. All write the content of a JSON string (between the
// quotes) as JSON text: characters that JSON must escape are written as their escapes.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace ptllm::grammar {

struct RegexError : Error {
  using Error::Error;
};
// The pattern is supported but not together with the length bounds given.
struct RegexLengthError : RegexError {
  using RegexError::RegexError;
};

// A GBNF string literal whose text is `bytes` (UTF-8).
std::string gbnf_literal(std::string_view bytes);

// The JSON-string content of the strings that `pattern` (ECMAScript syntax with the u flag, as
// JSON Schema validators run it: unanchored unless ^ / $) matches. Supported: literals, escapes
// (\d \w \s and their negations, \t \n \r \f \v \0 \xHH \uHHHH \u{H..}, escaped syntax
// characters), classes with ranges and negation, '.', groups (capturing, (?:...)), alternation,
// quantifiers * + ? {m} {m,} {m,n} (lazy forms too), ^ at the start and $ at the end. Anything
// else throws RegexError naming it. `json_char` is the rule name of one JSON string character.
// Length bounds in code points (max_len < 0: none) are honoured when every match of the pattern
// lies within them, or when the pattern is one class repeated (^[a-z]+$), whose repetition they
// narrow; otherwise RegexLengthError.
std::string regex_to_gbnf(std::string_view pattern, const std::string& json_char, int64_t min_len = 0,
                          int64_t max_len = -1);

// A whole JSON string (quotes included) whose value is none of `keys`, written without escapes.
std::string string_not_in_gbnf(const std::vector<std::string>& keys, const std::string& json_char);

// The JSON-string content of a format (date, time, date-time, uuid, email), or "" when not
// supported. `shared(name, body)` adds a named rule once and returns its name.
std::string format_gbnf(const std::string& format,
                        const std::function<std::string(const std::string&, const std::string&)>& shared);

}  // namespace ptllm::grammar
