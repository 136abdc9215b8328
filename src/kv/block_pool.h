#pragma once
// The storage mechanism of the KV cache (vLLM v1's block_pool.py is the model): fixed-size blocks,
// reference counts, content keys, and a free list in eviction order. Policy (which tokens live where,
// what is evicted) belongs to the caches that hold the blocks.
//
// A block that is full and immutable may carry a content key: the chained hash of everything that
// determines its bytes (DESIGN.md "The KV engine for many sequences"). Another sequence needing the
// same content finds it by key and takes a reference instead of computing it. A hit is checked
// against the key's full 128 bits, the layer and the block's own token ids, so two different
// contents that meet in a bucket (or share a forced-short hash in the tests) are a miss. A keyed
// block whose last reference goes stays findable until the pool needs the memory: the lowest
// retention class first (Retention), least recently released first within a class.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace ptllm {

// A token block's chained content hash (kv/prefix.cpp), the same in every layer.
struct BlockHash {
  uint64_t lo = 0, hi = 0;
  bool operator==(const BlockHash&) const = default;
};

// What a cached block is kept for, lowest first: when the pool needs memory it takes the least
// recently released block of the lowest class that has one (mlx-lm's prompt cache evicts assistant,
// then user, then system turns). A chat's tool outputs and assistant turns (and generated tokens) are
// Transient, its user turns User, its system prompt and tool definitions System; a completion
// prompt is User.
enum class Retention : uint8_t { Transient = 0, User = 1, System = 2 };
inline constexpr int kRetentionClasses = 3;
// Inline: the server's metrics (api.cpp) name the classes in builds that link no kv/ (the fuzz readers).
inline const char* retention_name(Retention r) {
  switch (r) {
    case Retention::Transient: return "transient";
    case Retention::User: return "user";
    case Retention::System: return "system";
  }
  return "";
}

// The class of a sequence's tokens (KVCache::set_retention): span i covers the tokens from the end of
// span i-1 (0 for the first) to `end`; a block's class is the lowest of the spans its tokens touch.
struct RetentionSpan {
  int64_t end = 0;
  Retention cls = Retention::User;
  bool operator==(const RetentionSpan&) const = default;
};

struct BlockKey {
  uint64_t lo = 0, hi = 0;  // chained 128-bit hash (kv_cache.cpp: chain_key)
  int32_t layer = -1;
  bool quantized = false;   // the KIVI group of this content, or its full-precision block
  bool operator==(const BlockKey&) const = default;
};

class BlockPool {
 public:
  // preallocate: one arena of capacity * block_bytes reserved (and touched) now, so memory is flat and
  // an impossible size fails here; otherwise each block is allocated the first time it is needed
  // and kept for reuse (never moved, never copied). tokens_per_block: the token ids a keyed block
  // keeps to check a hit against (0: blocks are never keyed).
  BlockPool(size_t block_bytes, size_t capacity, bool preallocate, int tokens_per_block = 0);

  // A block with one reference and no key, or -1 when every block is referenced (an ordinary
  // outcome, not an error). Free blocks go first, then the least recently released keyed one (its
  // key forgotten).
  int32_t acquire();
  void ref(int32_t id);
  // Drops one reference. At zero a keyed block stays findable (cached), any other is free.
  void release(int32_t id);

  // Gives a referenced full block its content key and retention class; false (and nothing changes)
  // when another block already holds the key, or when the block already has one. parent (when given):
  // the chained key the block's own key was derived from (its predecessor's), under which find_child
  // finds it.
  bool publish(int32_t id, const BlockKey& key, std::span<const int32_t> tokens,
               Retention cls = Retention::User, const BlockHash* parent = nullptr);
  // Sets the retention class of a referenced block (it applies once the block is cached).
  void set_retention(int32_t id, Retention cls);
  Retention retention(int32_t id) const { return Retention(class_[size_t(id)]); }
  // The block holding exactly this content, with a reference taken for the caller, or -1.
  int32_t find(const BlockKey& key, std::span<const int32_t> tokens);
  // Of the blocks published under `parent` for `layer` (in the form `quantized`), the one whose token
  // ids share the longest prefix with `tokens` (at least one token): a reference taken for the caller
  // and that prefix's length in *common. -1 when none shares a first token. What a prompt that
  // diverges inside a block, or goes on past a shorter one, can copy its matching tokens from.
  int32_t find_child(const BlockHash& parent, int32_t layer, bool quantized, std::span<const int32_t> tokens,
                     size_t* common);
  // The block's key, or null.
  const BlockKey* key_of(int32_t id) const;
  // The token ids a keyed block was published with (its length: the block's token count).
  std::span<const int32_t> tokens_of(int32_t id) const;
  // Drops the block's key (its holder is about to write into it); it must have one reference.
  void unpublish(int32_t id);
  int refs(int32_t id) const { return refs_[size_t(id)]; }

  uint8_t* data(int32_t id) { return ptr_[size_t(id)]; }
  const uint8_t* data(int32_t id) const { return ptr_[size_t(id)]; }

  size_t block_bytes() const { return block_bytes_; }
  size_t capacity() const { return capacity_; }
  size_t in_use() const { return in_use_; }       // blocks with a reference
  size_t cached() const { return n_cached_; }     // keyed blocks without one (findable, reclaimable)
  size_t cached(Retention cls) const { return lru_[size_t(cls)].n; }  // of them, in one class
  size_t available() const { return capacity_ - in_use_; }  // what acquire() can still hand out
  size_t physical_bytes() const { return allocated_ * block_bytes_; }

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;
  static constexpr int32_t kNone = -1;

  size_t bucket(const BlockKey& k) const;
  void unlink_bucket(int32_t id);
  void lru_push_back(int32_t id);
  void lru_remove(int32_t id);
  void forget(int32_t id);

  size_t block_bytes_;
  size_t capacity_;
  int tokens_per_block_;
  size_t allocated_ = 0;  // blocks backed by memory
  size_t in_use_ = 0;
  size_t n_cached_ = 0;
  Buffer arena_;                // preallocated mode
  std::vector<Buffer> owned_;   // on-demand mode, one allocation per block
  std::vector<uint8_t*> ptr_;   // [capacity] id -> data (null until allocated)
  std::vector<int32_t> free_;   // ids with memory and no key, ready for reuse
  int32_t next_fresh_ = 0;      // first id never handed out (on-demand mode)
  std::vector<int32_t> refs_;   // [capacity]
  // Keys: chained buckets (no allocation after construction).
  std::vector<BlockKey> keys_;        // [capacity]
  std::vector<uint8_t> keyed_;        // [capacity] 1: keys_[id] is valid and in a bucket
  std::vector<int32_t> tokens_;       // [capacity][tokens_per_block]
  std::vector<int32_t> buckets_;      // [power of two] first id of the bucket
  std::vector<int32_t> bucket_next_;  // [capacity]
  // The parent index (find_child): chained buckets by parent key, a block in one when published
  // with a parent.
  std::vector<BlockHash> parent_;      // [capacity]
  std::vector<uint8_t> has_parent_;    // [capacity]
  std::vector<int32_t> pbuckets_;      // [power of two] first id of the bucket
  std::vector<int32_t> pbucket_next_;  // [capacity]
  size_t pbucket(const BlockHash& parent, int32_t layer) const;
  // Cached blocks: per retention class, least recently released first (doubly linked lists through
  // the ids, one per class).
  struct Lru {
    int32_t head = kNone, tail = kNone;
    size_t n = 0;
  };
  std::vector<int32_t> lru_prev_, lru_next_;
  std::vector<uint8_t> class_;  // [capacity] Retention
  Lru lru_[kRetentionClasses];
};

}  // namespace ptllm
