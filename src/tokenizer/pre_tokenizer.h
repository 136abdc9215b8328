#pragma once
// tokenizer.json "pre_tokenizer": ByteLevel, Split, Metaspace, Digits and Sequence. Each splits a
// piece of normalized text into the words the model encodes one at a time.
#include <memory>
#include <string_view>

#include "tokenizer/function_ref.h"
#include "tokenizer/json_util.h"

namespace ptllm::tok {

// A piece and whether it begins the original input (Metaspace's prepend_scheme "first").
using PieceFn = FunctionRef<void(std::string_view piece, bool at_start)>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Emits the non-empty sub-pieces of `piece` in order.
  virtual void split(std::string_view piece, bool at_start, PieceFn emit) const = 0;
};

// j must not be null. With defer_byte_mapping, a ByteLevel step that comes last leaves its
// words as raw bytes and sets *deferred: the model then maps each byte to its stand-in itself,
// which saves building a re-encoded string per word.
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& j, const JsonPath& at,
                                                  bool defer_byte_mapping, bool* deferred);

}  // namespace ptllm::tok
