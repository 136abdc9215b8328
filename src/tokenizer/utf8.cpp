#include "tokenizer/utf8.h"

#include <cstring>

namespace ptllm::tok {

char32_t next_char(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const size_t n = utf8_len(b0);
  char32_t c = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

namespace {

// Sequence length for a lead byte, 0 if it can never start a character (Unicode Table 3-7).
size_t lead_len(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Whether b may follow the lead byte `lead` as the second byte (the ranges that exclude
// overlongs, surrogates and code points above U+10FFFF).
bool valid_second(unsigned char lead, unsigned char b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
  }
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if ((w & 0x8080808080808080ULL) == 0) {
        i += 8;
        continue;
      }
    }
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t len = lead_len(b);
    if (len == 0 || i + len > n) return false;
    if (len > 1 && !valid_second(b, static_cast<unsigned char>(s[i + 1]))) return false;
    for (size_t k = 2; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

void Utf8Repairer::push(std::string_view bytes, std::string& out) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    if (npending_ == 0) {
      const size_t len = lead_len(b);
      if (len == 1) {
        out += static_cast<char>(b);
      } else if (len == 0) {
        out += kReplacementChar;
      } else {
        pending_[0] = b;
        npending_ = 1;
        need_ = len;
      }
      continue;
    }
    const bool ok = npending_ == 1 ? valid_second(pending_[0], b) : (b & 0xC0) == 0x80;
    if (!ok) {
      // The pending bytes are a maximal invalid subsequence; b starts over.
      out += kReplacementChar;
      npending_ = 0;
      --i;
      continue;
    }
    pending_[npending_++] = b;
    if (npending_ == need_) {
      out.append(reinterpret_cast<const char*>(pending_), npending_);
      npending_ = 0;
    }
  }
}

void Utf8Repairer::finish(std::string& out) {
  if (npending_ > 0) out += kReplacementChar;
  npending_ = 0;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  Utf8Repairer r;
  r.push(s, out);
  r.finish(out);
  return out;
}

}  // namespace ptllm::tok
