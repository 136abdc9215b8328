#pragma once
// Unicode algorithms the tokenizer needs beyond what PCRE2 provides.
#include <string>
#include <string_view>

namespace ptllm::tok {

// Normalization Form C (UAX #15) of valid UTF-8 text. Data: Unicode 14 (see
// scripts/gen_unicode_nfc.py); tokenizers uses a newer version, which differs only for
// characters added since.
std::string nfc(std::string_view s);

// The Unicode White_Space property (what Rust's char::is_whitespace and regex \s test).
bool is_white_space(char32_t c);

}  // namespace ptllm::tok
