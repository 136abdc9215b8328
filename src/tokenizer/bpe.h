#pragma once
// tokenizer.json "model" of type BPE: vocab, merges (both stored forms), byte_fallback,
// ignore_merges, unk_token/fuse_unk, continuing_subword_prefix/end_of_word_suffix.
#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/json_util.h"

namespace ptllm::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// Recently encoded words and their ids. Two generations approximate LRU cheaply: when the young
// map is full it becomes the old one, and a hit in the old one is promoted.
class WordCache {
 public:
  bool lookup(std::string_view word, std::vector<int32_t>& out);  // appends the ids on a hit
  void insert(std::string_view word, const int32_t* ids, size_t n);

 private:
  static constexpr size_t kCapacity = 32768;
  std::mutex mu_;
  StringMap<std::vector<int32_t>> young_, old_;
};

class BpeModel {
 public:
  BpeModel(const json& model, const JsonPath& at);

  // Appends the ids of one pre-tokenized word. raw_bytes: the word is still raw bytes, each to be
  // read as its ByteLevel stand-in character (see parse_pre_tokenizer's deferral).
  void encode_word(std::string_view word, bool raw_bytes, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // null for an id not in the vocab
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  // Words can be handed over as raw bytes only when no prefix or suffix changes the symbols.
  bool accepts_raw_bytes() const { return prefix_.empty() && suffix_.empty(); }

 private:
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // neighbours in the word, -1 at the ends
    uint32_t len;        // bytes covered; 0 once merged into the symbol on its left
  };
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* find_merge(int32_t a, int32_t b) const {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }
  void encode_uncached(std::string_view word, bool raw_bytes, std::vector<int32_t>& out) const;
  void merge_all(std::vector<Symbol>& symbols) const;

  StringMap<int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged id
  std::optional<std::string> unk_token_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::string prefix_, suffix_;
  std::array<int32_t, 256> byte_ids_;      // id of each byte's ByteLevel stand-in, -1 if none
  std::array<int32_t, 256> fallback_ids_;  // id of "<0xXX>", -1 if none
  mutable WordCache cache_;
};

}  // namespace ptllm::tok
