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

// Oniguruma's Unicode classes, written for PCRE2 (class bodies, usable inside [...]):
// \s is 0009-000D, 0085 and Z* (PCRE2 adds U+180E); \w is L, M, N, Pc (PCRE2 10.42 has no M);
// Ruby's \h is a hex digit (PCRE2's is horizontal space).
constexpr const char* kSpaceBody = "\\t-\\r\\x{85}\\p{Z}";
constexpr const char* kWordBody = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
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
        case 'S': body = kSpaceBody; negated = true; break;
        case 'w': body = kWordBody; break;
        case 'W': body = kWordBody; negated = true; break;
        case 'h': body = kHexBody; break;
        case 'H': body = kHexBody; negated = true; break;
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
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | extra_options, &err,
                                   &off, nullptr);
  if (!code)
    throw Error(where + ": regex does not compile at offset " + std::to_string(off) + ": " +
                pcre2_message(err));
  // JIT is an optimisation; without it (unsupported CPU) pcre2_match interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return code;
}

// Per-thread match context with a JIT stack large enough for long runs of whitespace (the
// default 32 KiB is exhausted by the lookahead branch of the GPT-2 pattern).
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

// Rust find_iter over a compiled regex; fn(start, end, match_data).
template <class F>
void iterate(const pcre2_code* code, std::string_view s, F&& fn) {
  MatchData md(pcre2_match_data_create_from_pattern(code, nullptr));
  pcre2_match_context* ctx = match_context();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  std::optional<size_t> last_end;
  while (pos <= s.size()) {
    const int rc = pcre2_match(code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), ctx);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) throw Error("regex match failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t start = ov[0], end = ov[1];
    if (start == end && last_end == end) {
      if (end >= s.size()) return;
      pos = end + utf8_len(static_cast<unsigned char>(s[end]));
      continue;
    }
    fn(start, end, md.get());
    last_end = end;
    pos = end;
  }
}

bool is_name_char(char c) {
  return c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// Rust regex Captures::expand: $N, $name, ${N}, ${name}; $$ is a dollar; unknown groups are empty.
void expand(std::string& out, std::string_view content, std::string_view s, const pcre2_code* code,
            pcre2_match_data* md) {
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  const uint32_t ngroups = pcre2_get_ovector_count(md);
  for (size_t i = 0; i < content.size(); ++i) {
    if (content[i] != '$' || i + 1 >= content.size()) {
      out += content[i];
      continue;
    }
    if (content[i + 1] == '$') {
      out += '$';
      ++i;
      continue;
    }
    std::string_view name;
    size_t next;
    if (content[i + 1] == '{') {
      const size_t close = content.find('}', i + 2);
      if (close == std::string_view::npos) {
        out += '$';
        continue;
      }
      name = content.substr(i + 2, close - i - 2);
      next = close + 1;
    } else {
      size_t j = i + 1;
      while (j < content.size() && is_name_char(content[j])) ++j;
      name = content.substr(i + 1, j - i - 1);
      next = j;
    }
    if (name.empty()) {
      out += '$';
      continue;
    }
    int group = -1;
    if (name.find_first_not_of("0123456789") == std::string_view::npos) {
      group = std::stoi(std::string(name));
    } else {
      const std::string n(name);
      group = pcre2_substring_number_from_name(code, reinterpret_cast<PCRE2_SPTR>(n.c_str()));
    }
    if (group >= 0 && static_cast<uint32_t>(group) < ngroups &&
        ov[2 * group] != PCRE2_UNSET)
      out.append(s.substr(ov[2 * group], ov[2 * group + 1] - ov[2 * group]));
    i = next - 1;
  }
}

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
  Pattern p;
  p.literal_ = std::string(text);
  return p;
}

Pattern::~Pattern() = default;
Pattern::Pattern(Pattern&&) noexcept = default;
Pattern& Pattern::operator=(Pattern&&) noexcept = default;

void Pattern::for_each_match(std::string_view s, FunctionRef<void(size_t, size_t)> fn) const {
  if (code_) {
    iterate(code_->code.get(), s, [&](size_t a, size_t b, pcre2_match_data*) { fn(a, b); });
    return;
  }
  if (literal_.empty()) return;  // an empty literal matches nothing
  for (size_t pos = s.find(literal_); pos != std::string_view::npos;
       pos = s.find(literal_, pos + literal_.size()))
    fn(pos, pos + literal_.size());
}

std::string Pattern::replace_all(std::string_view s, std::string_view content) const {
  std::string out;
  out.reserve(s.size());
  size_t prev = 0;
  if (code_) {
    iterate(code_->code.get(), s, [&](size_t a, size_t b, pcre2_match_data* md) {
      out.append(s.substr(prev, a - prev));
      expand(out, content, s, code_->code.get(), md);
      prev = b;
    });
  } else {
    for_each_match(s, [&](size_t a, size_t b) {
      out.append(s.substr(prev, a - prev));
      out.append(content);
      prev = b;
    });
  }
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
