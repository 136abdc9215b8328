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

// Recently encoded words and their ids, in a flat set-associative table of one cache line per
// word: a lookup costs one or two memory accesses, where a node-based map costs four or five.
// Words longer than kMaxWord bytes or of more than kMaxIds tokens are not kept (they are rare).
// A word goes to the front of its set; the oldest of the set is dropped.
class WordCache {
 public:
  static constexpr size_t kMaxWord = 30, kMaxIds = 6;
  WordCache();
  bool lookup(std::string_view word, std::vector<int32_t>& out);  // appends the ids on a hit
  void insert(std::string_view word, const int32_t* ids, size_t n);

 private:
  struct Slot {
    uint64_t hash = 0;  // 0: empty
    uint8_t len = 0, nids = 0;
    char word[kMaxWord];
    int32_t ids[kMaxIds];
  };
  static_assert(sizeof(Slot) == 64);
  static constexpr size_t kWays = 4, kSets = 1 << 14;  // 65536 words, 4 MiB
  static uint64_t hash_of(std::string_view word) { return std::hash<std::string_view>{}(word) | 1; }
  Slot* set_of(uint64_t h) { return &slots_[(h >> 7) % kSets * kWays]; }
  std::mutex mu_;
  std::vector<Slot> slots_;
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
  // (left id, right id) -> Merge, open addressing with linear probing: the merge loop looks up
  // every adjacent pair, and a flat table keeps that to about one memory access.
  class MergeTable {
   public:
    void reserve(size_t n);
    void set(int32_t a, int32_t b, Merge m);  // a later rule for the same pair replaces it
    const Merge* find(int32_t a, int32_t b) const;

   private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    struct Entry {
      uint64_t key = kEmpty;
      Merge merge{};
    };
    size_t index(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ULL) >> shift_; }
    std::vector<Entry> entries_;
    int shift_ = 64;
  };
  const Merge* find_merge(int32_t a, int32_t b) const { return merges_.find(a, b); }
  void encode_uncached(std::string_view word, bool raw_bytes, std::vector<int32_t>& out) const;
  void merge_all(std::vector<Symbol>& symbols) const;

  StringMap<int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  MergeTable merges_;
  std::optional<std::string> unk_token_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::string prefix_, suffix_;
  std::array<int32_t, 256> byte_ids_;      // id of each byte's ByteLevel stand-in, -1 if none
  std::array<int32_t, 256> fallback_ids_;  // id of "<0xXX>", -1 if none
  mutable WordCache cache_;
};

}  // namespace ptllm::tok
