#include "chat/pystr.h"

#include <algorithm>
#include <cctype>

#include "chat/value.h"

namespace ptllm::chat::pystr {

namespace {

bool ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

// Simple case mappings: ASCII, Latin-1, Greek and Cyrillic basic letters (what chat text needs);
// other scripts are left as they are.
char32_t to_upper(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}
char32_t to_lower(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}
bool is_cased(char32_t c) { return to_upper(c) != c || to_lower(c) != c; }

bool in_set(char32_t c, const std::optional<std::u32string>& set) {
  return set ? set->find(c) != std::u32string::npos : is_space(c);
}

}  // namespace

bool is_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 ||
         c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    char32_t cp = n == 0 ? c : n == 1 ? (c & 0x1F) : n == 2 ? (c & 0x0F) : (c & 0x07);
    bool ok = n >= 0 && i + static_cast<size_t>(n) < s.size() + (n == 0 ? 1 : 0);
    for (int k = 1; ok && k <= n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((d & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (ok && n > 0) {
      static const char32_t min_cp[] = {0, 0x80, 0x800, 0x10000};
      if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) ok = false;
    }
    if (!ok) {
      out += static_cast<char32_t>(0xDC00 + c);  // surrogateescape
      ++i;
      continue;
    }
    out += cp;
    i += static_cast<size_t>(n) + 1;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out += static_cast<char>(cp - 0xDC00);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

size_t length(std::string_view s) { return ascii(s) ? s.size() : decode(s).size(); }

size_t SliceIdx::count() const {  // unsigned differences: range() passes any int64 bounds
  const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  if (step > 0) return start < stop ? static_cast<size_t>((u(stop) - u(start) - 1) / u(step) + 1) : 0;
  const uint64_t neg_step = u(-(step + 1)) + 1;  // -step without overflow at INT64_MIN
  return start > stop ? static_cast<size_t>((u(start) - u(stop) - 1) / neg_step + 1) : 0;
}

SliceIdx slice_indices(int64_t len, std::optional<int64_t> start, std::optional<int64_t> stop,
                       std::optional<int64_t> step) {
  const int64_t st = std::max<int64_t>(step.value_or(1), -INT64_MAX);  // so that -step exists
  if (st == 0) throw EvalError("slice step cannot be zero");
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) x = std::max<int64_t>(x + len, st < 0 ? -1 : 0);
    else if (x >= len) x = st < 0 ? len - 1 : len;
    return x;
  };
  return {adjust(start, st < 0 ? len - 1 : 0), adjust(stop, st < 0 ? -1 : len), st};
}

std::string slice(std::string_view s, const SliceIdx& idx) {
  if (ascii(s)) {
    std::string out;
    for (size_t i = 0, n = idx.count(); i < n; ++i) out += s[static_cast<size_t>(idx.at(i))];
    return out;
  }
  const std::u32string cps = decode(s);
  std::u32string out;
  for (size_t i = 0, n = idx.count(); i < n; ++i) out += cps[static_cast<size_t>(idx.at(i))];
  return encode(out);
}

std::string char_at(std::string_view s, int64_t i) {
  const std::u32string cps = decode(s);
  const int64_t n = static_cast<int64_t>(cps.size());
  if (i < 0) i += n;
  if (i < 0 || i >= n) throw EvalError("string index out of range");
  std::string out;
  append_utf8(out, cps[static_cast<size_t>(i)]);
  return out;
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::u32string cps = decode(s);
  std::optional<std::u32string> set;
  if (chars) set = decode(*chars);
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && in_set(cps[b], set)) ++b;
  if (right)
    while (e > b && in_set(cps[e - 1], set)) --e;
  return encode(std::u32string_view(cps).substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw EvalError("empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t f = s.find(*sep, pos);
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, f - pos));
      pos = f + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  const std::u32string cps = decode(s);
  size_t i = 0;
  while (true) {
    while (i < cps.size() && is_space(cps[i])) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      size_t e = cps.size();
      while (e > i && is_space(cps[e - 1])) --e;
      out.push_back(encode(std::u32string_view(cps).substr(i, e - i)));
      break;
    }
    size_t j = i;
    while (j < cps.size() && !is_space(cps[j])) ++j;
    out.push_back(encode(std::u32string_view(cps).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit) {
  if (maxsplit < 0 || !sep) return split(s, sep, maxsplit);  // same result without a limit
  if (sep->empty()) throw EvalError("empty separator");
  std::vector<std::string> out;
  size_t end = s.size();
  while (static_cast<int64_t>(out.size()) < maxsplit) {
    if (end < sep->size()) break;
    const size_t f = s.rfind(*sep, end - sep->size());
    if (f == std::string_view::npos) break;
    out.emplace_back(s.substr(f + sep->size(), end - f - sep->size()));
    end = f;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s) {
  const std::u32string cps = decode(s);
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) ||
                     c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    out.push_back(encode(std::u32string_view(cps).substr(b, i - b)));
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    b = i + 1;
  }
  if (b < cps.size()) out.push_back(encode(std::u32string_view(cps).substr(b)));
  return out;
}

std::string replace(std::string_view s, std::string_view from, std::string_view to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between code points (and at both ends)
    const std::u32string cps = decode(s);
    int64_t n = 0;
    for (char32_t c : cps) {
      if (count < 0 || n < count) out += to, ++n;
      append_utf8(out, c);
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t f = s.find(from, pos);
    if (f == std::string_view::npos) break;
    out.append(s.substr(pos, f - pos));
    out.append(to);
    pos = f + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(length(s)) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string_view::npos; pos = s.find(sub, pos + sub.size())) ++n;
  return n;
}

int64_t find(std::string_view s, std::string_view sub, bool reverse) {
  const size_t f = reverse ? s.rfind(sub) : s.find(sub);
  if (f == std::string_view::npos) return -1;
  return static_cast<int64_t>(length(s.substr(0, f)));
}

std::string upper(std::string_view s) {
  std::u32string cps = decode(s);
  for (auto& c : cps) c = to_upper(c);
  return encode(cps);
}

std::string lower(std::string_view s) {
  std::u32string cps = decode(s);
  for (auto& c : cps) c = to_lower(c);
  return encode(cps);
}

std::string title(std::string_view s) {
  std::u32string cps = decode(s);
  bool prev_cased = false;
  for (auto& c : cps) {
    c = prev_cased ? to_lower(c) : to_upper(c);
    prev_cased = is_cased(c);
  }
  return encode(cps);
}

std::string capitalize(std::string_view s) {
  std::u32string cps = decode(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? to_upper(cps[i]) : to_lower(cps[i]);
  return encode(cps);
}

std::string jinja_title(std::string_view s) {
  // Jinja2: "".join(w[0].upper() + w[1:].lower() for w in re.split(r"([-\s({\[<]+)", s) if w)
  std::u32string cps = decode(s);
  bool word_start = true;
  for (auto& c : cps) {
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_space(c);
    if (sep) {
      word_start = true;
      continue;
    }
    c = word_start ? to_upper(c) : to_lower(c);
    word_start = false;
  }
  return encode(cps);
}

bool all_of(std::string_view s, int (*pred)(int)) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return pred(static_cast<unsigned char>(c)) != 0; });
}

}  // namespace ptllm::chat::pystr
