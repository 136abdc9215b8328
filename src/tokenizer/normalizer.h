#pragma once
// tokenizer.json "normalizer": NFC, Replace, Prepend and Sequence (SentencePiece-style models
// turn spaces into ▁ with Prepend + Replace).
#include <memory>
#include <string>

#include "tokenizer/json_util.h"

namespace ptllm::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};

// j must not be null. Throws ptllm::Error naming an unsupported type.
std::unique_ptr<Normalizer> parse_normalizer(const json& j, const JsonPath& at);

}  // namespace ptllm::tok
