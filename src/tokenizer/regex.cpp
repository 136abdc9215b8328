#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <optional>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace ptllm::tok {

namespace {

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
using CodePtr = std::unique_ptr<pcre2_code, CodeDeleter>;

// Oniguruma's Unicode classes, written for PCRE2 (class bodies, usable inside [...]), as
// measured against tokenizers over every code point: \s is 0009-000D, 0085 and Z* (PCRE2 adds
// U+180E); \w is Alphabetic, M, Nd and Pc (PCRE2 10.42 leaves out marks and Other_Alphabetic
// and takes in all of N), plus, outside a class only, the Latin-1 digits ²³¹¼½¾; Ruby's \h is a
// hex digit (PCRE2's is horizontal space).
constexpr const char* kSpaceBody = "\\t-\\r\\x{85}\\p{Z}";
constexpr const char* kWordBody = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
constexpr const char* kWordOutsideBody =
    "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";
constexpr const char* kHexBody = "0-9a-fA-F";

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      const char* body = nullptr;
      bool negated = false;
      switch (e) {
        case 's': body = kSpaceBody; break;
        case 'S':
          body = kSpaceBody;
          negated = true;
          break;
        case 'w': body = in_class ? kWordBody : kWordOutsideBody; break;
        case 'W':
          body = kWordOutsideBody;
          negated = true;
          break;
        case 'h': body = kHexBody; break;
        case 'H':
          body = kHexBody;
          negated = true;
          break;
        default: break;
      }
      // A negated class cannot be spliced into another class: keep PCRE2's own there.
      if (body && !(in_class && negated)) {
        if (in_class) {
          out += body;
        } else {
          out += negated ? "[^" : "[";
          out += body;
          out += ']';
        }
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (in_class) {
      if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:alpha:]
        const size_t end = p.find(":]", i + 2);
        if (end != std::string_view::npos) {
          out.append(p.substr(i, end + 2 - i));
          i = end + 1;
          continue;
        }
      }
      if (c == ']') in_class = false;
      out += c;
      continue;
    }
    out += c;
    if (c == '[') {
      in_class = true;
      // "[^" and a "]" right after the opening bracket are part of the class syntax.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
    }
  }
  return out;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

pcre2_code* compile(std::string_view pattern, uint32_t extra_options, const std::string& where) {
  int err = 0;
  PCRE2_SIZE off = 0;
  // Ruby syntax: ^ and $ are line anchors.
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | extra_options, &err, &off, nullptr);
  if (!code)
    throw Error(where + ": regex does not compile at offset " + std::to_string(off) + ": " +
                pcre2_message(err));
  // JIT is an optimisation; without it (unsupported CPU) pcre2_match interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return code;
}

// Per-thread match context with a JIT stack of up to 16 MiB: the default 32 KiB runs out on
// long inputs for patterns that repeat a group, such as (?:\s|x)+ (the stock pre-tokenizer
// patterns do not need it).
struct MatchContext {
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
  MatchContext() { pcre2_jit_stack_assign(ctx, nullptr, stack); }
  ~MatchContext() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
  }
};

pcre2_match_context* match_context() {
  thread_local MatchContext mc;
  return mc.ctx;
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};
using MatchData = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

}  // namespace

struct Pattern::Code {
  CodePtr code;
};

Pattern Pattern::regex(std::string_view pattern, const std::string& where) {
  Pattern p;
  p.code_ = std::make_unique<Code>();
  p.code_->code.reset(compile(onig_to_pcre2(pattern), 0, where));
  return p;
}

Pattern Pattern::literal(std::string_view text) {
  // tokenizers escapes the string into a regex: an empty one matches between every character.
  if (text.empty()) return regex("", "empty pattern");
  Pattern p;
  p.literal_ = std::string(text);
  return p;
}

Pattern::~Pattern() = default;
Pattern::Pattern(Pattern&&) noexcept = default;
Pattern& Pattern::operator=(Pattern&&) noexcept = default;

// Rust's find_iter: after an empty match, the next search starts one character further.
void Pattern::for_each_match(std::string_view s, FunctionRef<void(size_t, size_t)> fn) const {
  if (s.empty()) return;  // tokenizers looks for no match, not even an empty one, in ""
  if (!code_) {
    for (size_t pos = s.find(literal_); pos != std::string_view::npos;
         pos = s.find(literal_, pos + literal_.size()))
      fn(pos, pos + literal_.size());
    return;
  }
  MatchData md(pcre2_match_data_create_from_pattern(code_->code.get(), nullptr));
  pcre2_match_context* ctx = match_context();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  std::optional<size_t> last_end;
  while (pos <= s.size()) {
    const int rc =
        pcre2_match(code_->code.get(), subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), ctx);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) throw Error("regex match failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t start = ov[0], end = ov[1];
    if (start == end && last_end == end) {
      if (end >= s.size()) return;
      pos = end + utf8_len(static_cast<unsigned char>(s[end]));
      continue;
    }
    fn(start, end);
    last_end = end;
    pos = end;
  }
}

std::string Pattern::replace_all(std::string_view s, std::string_view content) const {
  std::string out;
  out.reserve(s.size());
  size_t prev = 0;
  for_each_match(s, [&](size_t a, size_t b) {
    out.append(s.substr(prev, a - prev));
    out.append(content);
    prev = b;
  });
  out.append(s.substr(prev));
  return out;
}

bool is_word_char(char32_t c) {
  if (c < 0x80)
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  static const CodePtr word(compile("[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]",
                                    PCRE2_ANCHORED, "single_word test"));
  std::string utf8;
  append_utf8(utf8, c);
  MatchData md(pcre2_match_data_create(1, nullptr));
  return pcre2_match(word.get(), reinterpret_cast<PCRE2_SPTR>(utf8.data()), utf8.size(), 0,
                     PCRE2_NO_UTF_CHECK, md.get(), nullptr) >= 0;
}

}  // namespace ptllm::tok
