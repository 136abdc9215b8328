#include "tokenizer/decoder.h"

#include <optional>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace ptllm::tok {

struct DecoderPlan::Step {
  enum Kind { ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip } kind;
  std::string text;          // Metaspace replacement, Replace content, Strip content
  bool strip_first = false;  // Metaspace: the first token loses its ▁ (prepend_scheme != never)
  std::optional<Pattern> pattern;  // Replace
  size_t start = 0, stop = 0;      // Strip
};

// A stage receives tokens, or, once a ByteLevel or Fuse step has joined them, the successive
// fragments of the single token they became ("fused" input).
class Stage {
 public:
  explicit Stage(Stage* next) : next_(next) {}
  virtual ~Stage() = default;
  virtual void push(std::string_view s) = 0;
  virtual void finish() = 0;

 protected:
  Stage* next_;
};

namespace {

using Step = DecoderPlan::Step;

// The text out of the last step: tokens are concatenated, or joined with spaces when there is
// no decoder at all (tokenizers' fallback).
class Sink final : public Stage {
 public:
  Sink(std::string& out, bool join_with_space)
      : Stage(nullptr), out_(out), join_(join_with_space) {}
  void push(std::string_view s) override {
    if (join_ && !first_) out_ += ' ';
    first_ = false;
    out_ += s;
  }
  void finish() override {}

 private:
  std::string& out_;
  bool join_, first_ = true;
};

// A step written per token, as tokenizers' decode_chain is. With fused input the fragments are
// gathered and handled as that one token at the end, unless the step streams them itself.
class TokenStage : public Stage {
 public:
  TokenStage(Stage* next, bool fused_in) : Stage(next), fused_in_(fused_in) {}
  void push(std::string_view s) final {
    if (fused_in_)
      fragment(s);
    else
      token(s);
  }
  void finish() final {
    if (fused_in_)
      end_fragments();
    else
      end_tokens();
    next_->finish();
  }

 protected:
  virtual void token(std::string_view t) = 0;
  virtual void end_tokens() {}
  virtual void fragment(std::string_view s) { gathered_ += s; }
  virtual void end_fragments() {
    token(gathered_);
    end_tokens();
  }

 private:
  bool fused_in_;
  std::string gathered_;
};

// Stand-in characters back to bytes, then UTF-8 repaired across token boundaries. A token with
// a character outside the table (an added token's text) keeps its own bytes.
class ByteLevelStage final : public TokenStage {
 public:
  ByteLevelStage(Stage* next, bool fused_in, bool raw) : TokenStage(next, fused_in), raw_(raw) {}

 protected:
  void token(std::string_view t) override {
    std::string bytes;
    bytes.reserve(t.size());
    for (size_t i = 0; i < t.size();) {
      const int b = unicode_to_byte(next_char(t, i));
      if (b < 0) {
        bytes.assign(t);
        break;
      }
      bytes += static_cast<char>(b);
    }
    if (raw_) {
      if (!bytes.empty()) next_->push(bytes);
      return;
    }
    std::string text;
    repair_.push(bytes, text);
    if (!text.empty()) next_->push(text);
  }
  void end_tokens() override {
    std::string text;
    repair_.finish(text);
    if (!text.empty()) next_->push(text);
  }

 private:
  Utf8Repairer repair_;
  bool raw_;
};

// ▁ back to a space; in the first token it is dropped when encoding prepended it.
class MetaspaceStage final : public TokenStage {
 public:
  MetaspaceStage(Stage* next, bool fused_in, const Step& s)
      : TokenStage(next, fused_in), replacement_(s.text), strip_first_(s.strip_first) {}

 protected:
  void token(std::string_view t) override { next_->push(map(t, first_++ == 0)); }
  void fragment(std::string_view s) override {  // fused: all of it is the first token
    const std::string m = map(s, true);
    if (!m.empty()) next_->push(m);
  }
  void end_fragments() override {}

 private:
  std::string map(std::string_view t, bool first) const {
    std::string out;
    out.reserve(t.size());
    size_t prev = 0;
    for (size_t p = t.find(replacement_); p != std::string_view::npos;
         p = t.find(replacement_, prev)) {
      out.append(t.substr(prev, p - prev));
      if (!(first && strip_first_)) out += ' ';
      prev = p + replacement_.size();
    }
    out.append(t.substr(prev));
    return out;
  }
  std::string replacement_;
  bool strip_first_;
  size_t first_ = 0;
};

class ReplaceStage final : public TokenStage {
 public:
  ReplaceStage(Stage* next, bool fused_in, const Step& s)
      : TokenStage(next, fused_in), pattern_(*s.pattern), content_(s.text) {}

 protected:
  void token(std::string_view t) override { next_->push(pattern_.replace_all(t, content_)); }
  // A literal streams: everything up to a possible start of a match goes out.
  void fragment(std::string_view s) override {
    if (!pattern_.is_literal()) {
      TokenStage::fragment(s);
      return;
    }
    const std::string& lit = pattern_.literal_text();  // never empty
    held_ += s;
    std::string out;
    size_t prev = 0;
    for (size_t p = held_.find(lit); p != std::string::npos; p = held_.find(lit, prev)) {
      out.append(held_, prev, p - prev);
      out += content_;
      prev = p + lit.size();
    }
    size_t keep = 0;
    for (size_t k = std::min(lit.size() - 1, held_.size() - prev); k > 0; --k) {
      if (held_.compare(held_.size() - k, k, lit, 0, k) == 0) {
        keep = k;
        break;
      }
    }
    out.append(held_, prev, held_.size() - keep - prev);
    held_.erase(0, held_.size() - keep);
    if (!out.empty()) next_->push(out);
  }
  void end_fragments() override {
    if (!pattern_.is_literal()) {
      TokenStage::end_fragments();
      return;
    }
    if (!held_.empty()) next_->push(held_);
    held_.clear();
  }

 private:
  const Pattern& pattern_;
  std::string content_;
  std::string held_;
};

// Runs of "<0xXX>" tokens become the text their bytes spell, or one U+FFFD per byte when they
// are not valid UTF-8. A run is held until it ends, so no stray byte is ever emitted.
class ByteFallbackStage final : public TokenStage {
 public:
  ByteFallbackStage(Stage* next, bool fused_in, bool raw) : TokenStage(next, fused_in), raw_(raw) {}

 protected:
  void token(std::string_view t) override {
    if (auto b = byte_of(t)) {
      bytes_ += static_cast<char>(*b);
      return;
    }
    flush();
    next_->push(t);
  }
  void end_tokens() override { flush(); }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // tokenizers parses the two characters with Rust's u8::from_str_radix, which takes "+F" too.
  static std::optional<unsigned char> byte_of(std::string_view t) {
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return std::nullopt;
    const int hi = t[3] == '+' ? 0 : hex(t[3]), lo = hex(t[4]);
    if (hi < 0 || lo < 0) return std::nullopt;
    return static_cast<unsigned char>(hi * 16 + lo);
  }
  void flush() {
    if (bytes_.empty()) return;
    if (raw_ || is_valid_utf8(bytes_)) {
      next_->push(bytes_);
    } else {
      for (size_t i = 0; i < bytes_.size(); ++i) next_->push(kReplacementChar);
    }
    bytes_.clear();
  }
  std::string bytes_;
  bool raw_;
};

class FuseStage final : public TokenStage {
 public:
  using TokenStage::TokenStage;

 protected:
  void token(std::string_view t) override {
    if (!t.empty()) next_->push(t);
  }
  void fragment(std::string_view s) override { token(s); }
  void end_fragments() override {}
};

// Removes up to `start` leading and `stop` trailing `content` characters of each token; once
// fused, of the whole text, which streams by holding back a trailing run of them.
class StripStage final : public TokenStage {
 public:
  StripStage(Stage* next, bool fused_in, const Step& s)
      : TokenStage(next, fused_in),
        content_(s.text),
        start_(s.start),
        stop_(s.stop),
        left_(s.start) {}

 protected:
  void token(std::string_view t) override {
    const size_t n = content_.size();
    size_t begin = 0, end = t.size();
    for (size_t k = 0; k < start_ && t.compare(begin, n, content_) == 0; ++k) begin += n;
    // tokenizers never strips more from the end than the start left over.
    const size_t limit = std::min(stop_, utf8_char_count(t.substr(begin)));
    for (size_t k = 0; k < limit && end >= begin + n && t.compare(end - n, n, content_) == 0; ++k)
      end -= n;
    next_->push(t.substr(begin, end - begin));
  }
  void fragment(std::string_view s) override {
    const size_t n = content_.size();
    while (left_ > 0 && s.size() >= n && s.compare(0, n, content_) == 0) {
      s.remove_prefix(n);
      --left_;
    }
    if (s.empty()) return;
    left_ = 0;
    held_ += s;
    size_t end = held_.size();
    for (size_t k = 0; k < stop_ && end >= n && held_.compare(end - n, n, content_) == 0; ++k)
      end -= n;
    if (end > 0) next_->push(std::string_view(held_).substr(0, end));
    held_.erase(0, end);
  }
  void end_fragments() override { held_.clear(); }

 private:
  std::string content_;
  size_t start_, stop_;
  size_t left_;       // leading characters that may still be stripped
  std::string held_;  // trailing content characters that the end may strip
};

std::unique_ptr<Stage> make_stage(const Step& s, Stage* next, bool fused_in, bool raw) {
  switch (s.kind) {
    case Step::ByteLevel: return std::make_unique<ByteLevelStage>(next, fused_in, raw);
    case Step::Metaspace: return std::make_unique<MetaspaceStage>(next, fused_in, s);
    case Step::Replace: return std::make_unique<ReplaceStage>(next, fused_in, s);
    case Step::ByteFallback: return std::make_unique<ByteFallbackStage>(next, fused_in, raw);
    case Step::Fuse: return std::make_unique<FuseStage>(next, fused_in);
    case Step::Strip: return std::make_unique<StripStage>(next, fused_in, s);
  }
  return nullptr;
}

void parse_into(const json& j, const JsonPath& at, std::vector<std::unique_ptr<Step>>& steps) {
  const std::string type = get_string(j, "type", at);
  auto step = std::make_unique<Step>();
  if (type == "ByteLevel") {
    step->kind = Step::ByteLevel;
  } else if (type == "Metaspace") {
    step->kind = Step::Metaspace;
    step->text = get_char(j, "replacement", at);
    step->strip_first = get_prepend_scheme(j, at) != PrependScheme::Never;
  } else if (type == "Replace") {
    step->kind = Step::Replace;
    step->pattern = get_pattern(j, at);
    step->text = get_string(j, "content", at);
  } else if (type == "ByteFallback") {
    step->kind = Step::ByteFallback;
  } else if (type == "Fuse") {
    step->kind = Step::Fuse;
  } else if (type == "Strip") {
    step->kind = Step::Strip;
    step->text = get_char(j, "content", at);
    step->start = get_size(j, "start", at);
    step->stop = get_size(j, "stop", at);
  } else if (type == "Sequence") {
    at.check_nesting();
    const json& list = need(j, "decoders", at);
    if (!list.is_array()) (at / "decoders").fail("expected an array");
    for (size_t i = 0; i < list.size(); ++i) parse_into(list[i], (at / "decoders")[i], steps);
    return;
  } else {
    unsupported(at, "decoder", type,
                "ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence");
  }
  steps.push_back(std::move(step));
}

}  // namespace

DecoderPlan::DecoderPlan(const json& j, const JsonPath& at) : join_with_space_(j.is_null()) {
  if (!j.is_null()) parse_into(j, at, steps_);
}
DecoderPlan::~DecoderPlan() = default;
DecoderPlan::DecoderPlan(DecoderPlan&&) noexcept = default;

std::unique_ptr<DecodeStream> DecoderPlan::start(bool raw) const {
  return std::make_unique<DecodeStream>(steps_, join_with_space_, raw);
}

DecodeStream::DecodeStream(const std::vector<std::unique_ptr<DecoderPlan::Step>>& steps,
                           bool join_with_space, bool raw) {
  std::vector<bool> fused_in(steps.size());
  bool fused = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    fused_in[i] = fused;
    fused = fused || steps[i]->kind == Step::ByteLevel || steps[i]->kind == Step::Fuse;
  }
  stages_.resize(steps.size() + 1);
  stages_.back() = std::make_unique<Sink>(out_, join_with_space);
  for (size_t i = steps.size(); i-- > 0;)
    stages_[i] = make_stage(*steps[i], stages_[i + 1].get(), fused_in[i], raw);
}

DecodeStream::~DecodeStream() = default;

void DecodeStream::push(std::string_view token) {
  PTLLM_CHECK(!finished_);
  stages_.front()->push(token);
}

void DecodeStream::finish() {
  if (!finished_) stages_.front()->finish();
  finished_ = true;
}
std::string DecodeStream::take() { return std::exchange(out_, {}); }

}  // namespace ptllm::tok
