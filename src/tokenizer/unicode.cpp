#include "tokenizer/unicode.h"

#include <algorithm>
#include <vector>

#include "tokenizer/unicode_nfc_table.h"
#include "tokenizer/utf8.h"

namespace ptllm::tok {
namespace {

// Hangul syllables are composed and decomposed arithmetically (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t ccc(char32_t c) {
  if (c < 0x300) return 0;
  const auto& t = nfc_data::kCcc;
  auto it = std::upper_bound(std::begin(t), std::end(t), c,
                             [](char32_t v, const nfc_data::CccRange& r) { return v < r.first; });
  if (it == std::begin(t)) return 0;
  --it;
  return c <= it->last ? it->ccc : 0;
}

bool needs_care(char32_t c) {
  if (c < 0x300) return false;
  const auto& t = nfc_data::kNeedsCare;
  auto it = std::upper_bound(std::begin(t), std::end(t), c,
                             [](char32_t v, const nfc_data::Range& r) { return v < r.first; });
  return it != std::begin(t) && c <= std::prev(it)->last;
}

void decompose(char32_t c, std::vector<char32_t>& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto& t = nfc_data::kDecomp;
  auto it = std::lower_bound(std::begin(t), std::end(t), c,
                             [](const nfc_data::Decomposition& d, char32_t v) { return d.cp < v; });
  if (it != std::end(t) && it->cp == c) {
    out.insert(out.end(), nfc_data::kDecompChars + it->offset,
               nfc_data::kDecompChars + it->offset + it->len);
  } else {
    out.push_back(c);
  }
}

// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto& t = nfc_data::kCompose;
  auto it =
      std::lower_bound(std::begin(t), std::end(t), std::pair{a, b},
                       [](const nfc_data::Composition& x, const std::pair<char32_t, char32_t>& k) {
                         return x.first != k.first ? x.first < k.first : x.second < k.second;
                       });
  return it != std::end(t) && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

std::string nfc(std::string_view s) {
  // Most text is already NFC and has no character NFC could touch: return it as is.
  bool care = false;
  for (size_t i = 0; i < s.size() && !care;) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    care = needs_care(next_char(s, i));
  }
  if (!care) return std::string(s);

  // Canonical decomposition, then canonical ordering of each run of non-starters.
  std::vector<char32_t> d;
  d.reserve(s.size());
  for (size_t i = 0; i < s.size();) decompose(next_char(s, i), d);
  for (size_t i = 0; i < d.size();) {
    if (ccc(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && ccc(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j,
                     [](char32_t a, char32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }

  // Canonical composition: a character joins the last starter unless blocked by a character of
  // the same or higher class in between (the UAX #15 reference algorithm).
  std::vector<char32_t> out;
  out.reserve(d.size());
  size_t starter = 0;
  int last_class = 256;
  for (size_t i = 0; i < d.size(); ++i) {
    const char32_t c = d[i];
    const int cls = ccc(c);
    if (i == 0) {
      out.push_back(c);
      last_class = cls == 0 ? 0 : 256;  // a leading non-starter never composes
      continue;
    }
    const char32_t comp = compose(out[starter], c);
    if (comp != 0 && (last_class < cls || last_class == 0)) {
      out[starter] = comp;
      continue;
    }
    if (cls == 0) starter = out.size();
    last_class = cls;
    out.push_back(c);
  }
  std::string r;
  r.reserve(s.size());
  for (char32_t c : out) append_utf8(r, c);
  return r;
}

bool is_white_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000: return true;
    default: return c >= 0x2000 && c <= 0x200A;
  }
}

}  // namespace ptllm::tok
