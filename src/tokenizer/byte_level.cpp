#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace ptllm::tok {
namespace {

// Printable Latin-1 bytes stand for themselves; the other 68 map to U+0100.. in byte order.
struct Table {
  std::array<std::string, 256> utf8;
  std::array<int16_t, 0x144> byte_of{};  // stand-ins lie below U+0144
  Table() {
    byte_of.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t c = printable ? static_cast<char32_t>(b) : next++;
      append_utf8(utf8[b], c);
      byte_of[c] = static_cast<int16_t>(b);
    }
  }
};

const Table& table() {
  static const Table t;
  return t;
}

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() { return table().utf8; }

int unicode_to_byte(char32_t c) { return c < 0x144 ? table().byte_of[c] : -1; }

std::string bytes_to_unicode(std::string_view raw) {
  const auto& t = table().utf8;
  std::string out;
  out.reserve(raw.size() * 2);
  for (char b : raw) out += t[static_cast<unsigned char>(b)];
  return out;
}

}  // namespace ptllm::tok
