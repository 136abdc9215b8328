#pragma once
// UTF-8 helpers shared by the tokenizer stages.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ptllm::tok {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the UTF-8 sequence that starts with lead byte b (1 for a stray byte).
inline size_t utf8_len(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

inline size_t utf8_char_count(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// Decodes the character at s[i] (s must be valid UTF-8) and advances i past it.
char32_t next_char(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t c);

bool is_valid_utf8(std::string_view s);

// Streaming UTF-8 validation with the replacement rule of Rust's String::from_utf8_lossy and
// Python's "replace" error handler: each maximal invalid subsequence becomes one U+FFFD.
// push() appends only whole characters to `out`; an incomplete tail waits for more bytes.
class Utf8Repairer {
 public:
  void push(std::string_view bytes, std::string& out);
  void finish(std::string& out);  // an incomplete tail becomes U+FFFD

 private:
  unsigned char pending_[4] = {};
  size_t npending_ = 0;
  size_t need_ = 0;  // total length of the pending sequence
};

std::string to_valid_utf8(std::string_view s);

}  // namespace ptllm::tok
