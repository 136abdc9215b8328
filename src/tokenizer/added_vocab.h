#pragma once
// tokenizer.json "added_tokens": found in the input before the rest of the pipeline runs, with
// tokenizers' rules (leftmost-longest match; single_word, lstrip, rstrip; "normalized" tokens
// are looked for in the normalized text, the others in the raw text).
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/function_ref.h"

namespace ptllm::tok {

class Normalizer;

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

class AddedVocab {
 public:
  // normalizer: applied to the content of the normalized tokens to get what to look for.
  AddedVocab(std::vector<AddedToken> tokens, const Normalizer* normalizer);

  // Splits `text` on the tokens of one set: the raw set (normalized=false), looked for in the
  // input, or the normalized set, looked for in normalized text. Emits the ids of the tokens and
  // the non-empty text between them with its byte offset. parse_special=false skips special
  // tokens, leaving them to be encoded as text.
  void split(std::string_view text, bool normalized_set, bool parse_special,
             FunctionRef<void(int32_t)> on_token,
             FunctionRef<void(std::string_view, size_t)> on_text) const;

  const AddedToken* find(int32_t id) const;
  const AddedToken* find(std::string_view content) const;
  int32_t max_id() const { return max_id_; }

 private:
  // A byte trie of the patterns of one set, for leftmost-longest matching.
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> next;
      int32_t token = -1;  // index into tokens_ when a pattern ends here
    };
    std::vector<Node> nodes{Node{}};
    bool starts[256] = {};
    void add(std::string_view pattern, int32_t token);
    // Longest pattern starting at s[i]: its end and token, or token -1.
    std::pair<size_t, int32_t> longest_at(std::string_view s, size_t i) const;
  };

  std::vector<AddedToken> tokens_;
  Trie raw_, normalized_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  int32_t max_id_ = -1;
};

}  // namespace ptllm::tok
