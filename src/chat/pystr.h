#pragma once
// Python str semantics over UTF-8 bytes: lengths, indices and slices count code points, as the
// templates' `content[-1]`, `|length` and `[::-1]` do in Python. Invalid bytes round-trip as one
// code point each (Python's surrogateescape), so no input can break a string apart.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ptllm::chat::pystr {

std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
void append_utf8(std::string& out, char32_t cp);
size_t length(std::string_view s);  // in code points

// Python's slice.indices(): normalized start, stop and step over a sequence of `len` items.
// step == 0 throws EvalError.
struct SliceIdx {
  int64_t start, stop, step;
  size_t count() const;
  int64_t at(size_t i) const { return start + static_cast<int64_t>(i) * step; }
};
SliceIdx slice_indices(int64_t len, std::optional<int64_t> start, std::optional<int64_t> stop,
                       std::optional<int64_t> step);

std::string slice(std::string_view s, const SliceIdx& idx);
std::string char_at(std::string_view s, int64_t i);  // Python s[i]; out of range throws EvalError

// strip/lstrip/rstrip: `chars` absent = whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// split(None, maxsplit) splits on runs of whitespace; split(sep) on each sep (empty sep throws).
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s);
std::string replace(std::string_view s, std::string_view from, std::string_view to, int64_t count);
int64_t count(std::string_view s, std::string_view sub);
int64_t find(std::string_view s, std::string_view sub, bool reverse);  // code point index or -1

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
std::string jinja_title(std::string_view s);  // Jinja2's |title: words split at - space ( { [ <
bool is_space(char32_t c);
bool all_of(std::string_view s, int (*pred)(int));  // isdigit/isalpha/... on a non-empty string

}  // namespace ptllm::chat::pystr
