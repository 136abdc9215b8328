#include "tokenizer/pre_tokenizer.h"

#include <string>
#include <vector>

#include "tokenizer/byte_level.h"

namespace ptllm::tok {
namespace {

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// What happens to the delimiters (the matches) of a split, as tokenizers'
// NormalizedString::split does it, fed one segment at a time so that no list of a whole text's
// segments is ever built.
class Splitter {
 public:
  Splitter(std::string_view text, Behavior b, bool invert, bool at_start, PieceFn emit)
      : text_(text), behavior_(b), invert_(invert), at_start_(at_start), emit_(emit) {}

  void segment(size_t start, size_t end, bool is_match) {
    const bool m = is_match != invert_;
    switch (behavior_) {
      case Behavior::Isolated: out(start, end); break;
      case Behavior::Removed:
        if (!m) out(start, end);
        break;
      case Behavior::Contiguous:  // runs of matches (or of non-matches) become one piece
        if (pending_ && pending_match_ == m) {
          pending_end_ = end;
        } else {
          flush();
          hold(start, end, m);
        }
        break;
      case Behavior::MergedWithPrevious:  // a match joins the non-match before it
        if (m && !prev_match_ && pending_) {
          pending_end_ = end;
        } else {
          flush();
          hold(start, end, m);
        }
        prev_match_ = m;
        break;
      case Behavior::MergedWithNext:  // a match joins the non-match after it
        if (pending_) {               // pending is always a match here
          if (!m) {
            out(pending_start_, end);
            pending_ = false;
            break;
          }
          flush();
        }
        if (m)
          hold(start, end, m);
        else
          out(start, end);
        break;
    }
  }

  void finish() { flush(); }

 private:
  void out(size_t s, size_t e) {
    if (s < e) emit_(text_.substr(s, e - s), at_start_ && s == 0);
  }
  void hold(size_t s, size_t e, bool m) {
    pending_ = true;
    pending_start_ = s;
    pending_end_ = e;
    pending_match_ = m;
  }
  void flush() {
    if (pending_) out(pending_start_, pending_end_);
    pending_ = false;
  }

  std::string_view text_;
  Behavior behavior_;
  bool invert_, at_start_;
  PieceFn emit_;
  bool pending_ = false, pending_match_ = false, prev_match_ = false;
  size_t pending_start_ = 0, pending_end_ = 0;
};

void split_on(const Pattern& p, std::string_view text, Behavior b, bool invert, bool at_start,
              PieceFn emit) {
  Splitter sp(text, b, invert, at_start, emit);
  size_t prev = 0;
  p.for_each_match(text, [&](size_t s, size_t e) {
    if (prev != s) sp.segment(prev, s, false);
    sp.segment(s, e, true);
    prev = e;
  });
  if (prev != text.size()) sp.segment(prev, text.size(), false);
  sp.finish();
}

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex, bool map_bytes)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex), map_bytes_(map_bytes) {}

  void split(std::string_view piece, bool at_start, PieceFn emit) const override {
    std::string spaced;
    if (add_prefix_space_ && piece.front() != ' ') {
      spaced.reserve(piece.size() + 1);
      spaced += ' ';
      spaced += piece;
      piece = spaced;
    }
    auto out = [&](std::string_view p, bool s) {
      if (map_bytes_)
        emit(bytes_to_unicode(p), s);
      else
        emit(p, s);
    };
    if (use_regex_)
      split_on(gpt2(), piece, Behavior::Isolated, false, at_start, out);
    else
      out(piece, at_start);
  }

 private:
  // The GPT-2 pattern that tokenizers' ByteLevel uses when use_regex is set.
  static const Pattern& gpt2() {
    static const Pattern p = Pattern::regex(
        R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
        "ByteLevel pre-tokenizer");
    return p;
  }
  bool add_prefix_space_, use_regex_, map_bytes_;
};

class Split final : public PreTokenizer {
 public:
  Split(Pattern pattern, Behavior b, bool invert)
      : pattern_(std::move(pattern)), behavior_(b), invert_(invert) {}
  void split(std::string_view piece, bool at_start, PieceFn emit) const override {
    split_on(pattern_, piece, behavior_, invert_, at_start, emit);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

// Spaces become the replacement character (▁), which is prepended per prepend_scheme; with
// split, each ▁ starts a new word.
class Metaspace final : public PreTokenizer {
 public:
  Metaspace(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)),
        delimiter_(Pattern::literal(replacement_)),
        scheme_(scheme),
        split_(split) {}

  void split(std::string_view piece, bool at_start, PieceFn emit) const override {
    std::string s;
    s.reserve(piece.size() + 8);
    for (char c : piece) {
      if (c == ' ')
        s += replacement_;
      else
        s += c;
    }
    const bool prepend =
        scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && at_start);
    if (prepend && s.compare(0, replacement_.size(), replacement_) != 0) s.insert(0, replacement_);
    if (split_)
      split_on(delimiter_, s, Behavior::MergedWithNext, false, at_start, emit);
    else
      emit(s, at_start);
  }

 private:
  std::string replacement_;
  Pattern delimiter_;
  PrependScheme scheme_;
  bool split_;
};

// Digits go in words of their own: one each, or one per run of digits. Rust's is_numeric is
// the Unicode N category.
class Digits final : public PreTokenizer {
 public:
  explicit Digits(bool individual) : individual_(individual) {}
  void split(std::string_view piece, bool at_start, PieceFn emit) const override {
    static const Pattern digit = Pattern::regex("\\p{N}", "Digits pre-tokenizer");
    split_on(digit, piece, individual_ ? Behavior::Isolated : Behavior::Contiguous, false, at_start,
             emit);
  }

 private:
  bool individual_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void split(std::string_view piece, bool at_start, PieceFn emit) const override {
    run(0, piece, at_start, emit);
  }

 private:
  void run(size_t i, std::string_view piece, bool at_start, PieceFn emit) const {
    if (i == steps_.size()) {
      emit(piece, at_start);
      return;
    }
    steps_[i]->split(piece, at_start, [&](std::string_view p, bool s) { run(i + 1, p, s, emit); });
  }
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

Behavior parse_behavior(const json& j, const JsonPath& at) {
  const std::string b = get_string(j, "behavior", at);
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  (at / "behavior").fail("unknown split behavior '" + b + "'");
}

std::unique_ptr<PreTokenizer> parse(const json& j, const JsonPath& at, bool last, bool defer,
                                    bool* deferred) {
  const std::string type = get_string(j, "type", at);
  if (type == "ByteLevel") {
    const bool map_here = !(defer && last);
    if (!map_here) *deferred = true;
    return std::make_unique<ByteLevel>(get_bool(j, "add_prefix_space", at, true),
                                       get_bool(j, "use_regex", at, true), map_here);
  }
  if (type == "Split")
    return std::make_unique<Split>(get_pattern(j, at), parse_behavior(j, at),
                                   get_bool(j, "invert", at, false));
  if (type == "Metaspace")
    return std::make_unique<Metaspace>(get_char(j, "replacement", at), get_prepend_scheme(j, at),
                                       get_bool(j, "split", at, true));
  if (type == "Digits")
    return std::make_unique<Digits>(get_bool(j, "individual_digits", at, false));
  if (type == "Sequence") {
    at.check_nesting();
    const json& list = need(j, "pretokenizers", at);
    if (!list.is_array()) (at / "pretokenizers").fail("expected an array");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back(
          parse(list[i], (at / "pretokenizers")[i], last && i + 1 == list.size(), defer, deferred));
    return std::make_unique<Sequence>(std::move(steps));
  }
  unsupported(at, "pre_tokenizer", type, "ByteLevel, Split, Metaspace, Digits, Sequence");
}

}  // namespace

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& j, const JsonPath& at,
                                                  bool defer_byte_mapping, bool* deferred) {
  *deferred = false;
  return parse(j, at, true, defer_byte_mapping, deferred);
}

}  // namespace ptllm::tok
