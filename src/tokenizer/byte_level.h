#pragma once
// GPT-2's byte-to-unicode table: every byte has a printable stand-in character, so a byte-level
// vocabulary is made of ordinary strings ("Ġ" is the space byte 0x20).
#include <array>
#include <string>
#include <string_view>

namespace ptllm::tok {

// The UTF-8 of each byte's stand-in character.
const std::array<std::string, 256>& byte_to_unicode();

// The byte a stand-in character represents, or -1.
int unicode_to_byte(char32_t c);

// Every byte of `raw` replaced by its stand-in (what the ByteLevel pre-tokenizer produces).
std::string bytes_to_unicode(std::string_view raw);

}  // namespace ptllm::tok
