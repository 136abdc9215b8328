#pragma once
// tokenizer.json "decoder": ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip and
// Sequence, run as a stream. decode() pushes every token and then finishes; the streaming
// detokenizer pushes as tokens arrive. Both take the same path, so they cannot disagree.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/json_util.h"

namespace ptllm::tok {

class DecodeStream;

class DecoderPlan {
 public:
  // j may be null: no decoder, and tokens are joined with spaces as tokenizers does.
  DecoderPlan(const json& j, const JsonPath& at);
  ~DecoderPlan();
  DecoderPlan(DecoderPlan&&) noexcept;

  // raw: bytes as the tokens spell them, with no UTF-8 repair (a token may hold part of a
  // character); for the grammar's view of each token.
  std::unique_ptr<DecodeStream> start(bool raw = false) const;

  struct Step;

 private:
  std::vector<std::unique_ptr<Step>> steps_;  // Sequence flattened
  bool join_with_space_ = false;              // no decoder at all
};

class Stage;

class DecodeStream {
 public:
  DecodeStream(const std::vector<std::unique_ptr<DecoderPlan::Step>>& steps, bool join_with_space, bool raw = false);
  ~DecodeStream();

  void push(std::string_view token);  // not after finish()
  void finish();                      // a second call does nothing
  // Text produced so far and not yet taken: always whole UTF-8 characters (unless raw).
  std::string take();

 private:
  std::string out_;
  std::vector<std::unique_ptr<Stage>> stages_;  // stages_.back() collects into out_
  bool finished_ = false;
};

}  // namespace ptllm::tok
