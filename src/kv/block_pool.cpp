#include "kv/block_pool.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include <sys/mman.h>

#include "core/error.h"
#include "core/memory.h"

namespace ptllm {

namespace {
constexpr size_t kAlign = 64;
uint8_t* alloc_aligned(size_t bytes, size_t align = kAlign) {
  size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (!p) throw Error("KV cache: cannot allocate " + std::to_string(bytes) + " bytes");
  return static_cast<uint8_t*>(p);
}
// The block size rounded to kAlign, once the pool is known to fit: the arena (when preallocated)
// and the per-block bookkeeping against the memory this machine has left, refused with the sizes
// before any of it is allocated (a --ctx-size of 2^30 tokens is a message, not a bad_alloc or the
// OOM killer).
size_t checked_block_bytes(size_t block_bytes, size_t capacity, bool preallocate, int tokens_per_block) {
  const size_t aligned = (block_bytes + kAlign - 1) / kAlign * kAlign;
  const double per_block = double(preallocate ? aligned : 0) + 64.0 + 4.0 * tokens_per_block;
  const double need = per_block * double(capacity);
  const std::optional<size_t> avail = available_memory_bytes();
  if (avail && need > double(*avail))
    throw Error("the KV cache needs " + memory_size_text(size_t(need)) + " (" + std::to_string(capacity) +
                " blocks of " + memory_size_text(aligned) + (preallocate ? ", preallocated" : " of bookkeeping") +
                "), more than the " + memory_size_text(*avail) +
                " of memory available (MemAvailable, /proc/meminfo): lower --ctx-size (serve: --parallel or "
                "--kv-budget-mb) or pick a smaller --kv-quantize");
  return aligned;
}
}  // namespace

void BlockPool::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

BlockPool::BlockPool(size_t block_bytes, size_t capacity, bool preallocate, int tokens_per_block)
    : block_bytes_(checked_block_bytes(block_bytes, capacity, preallocate, tokens_per_block)),
      capacity_(capacity),
      tokens_per_block_(tokens_per_block),
      ptr_(capacity, nullptr),
      refs_(capacity, 0),
      class_(capacity, uint8_t(Retention::User)) {
  free_.reserve(capacity);
  if (tokens_per_block > 0) {
    keys_.resize(capacity);
    keyed_.assign(capacity, 0);
    tokens_.assign(capacity * size_t(tokens_per_block), 0);
    size_t n = 16;
    while (n < 2 * capacity) n *= 2;
    buckets_.assign(n, kNone);
    bucket_next_.assign(capacity, kNone);
    parent_.resize(capacity);
    has_parent_.assign(capacity, 0);
    pbuckets_.assign(n, kNone);
    pbucket_next_.assign(capacity, kNone);
    lru_prev_.assign(capacity, kNone);
    lru_next_.assign(capacity, kNone);
  }
  if (preallocate && capacity > 0) {
    // A large arena goes on transparent huge pages where the kernel allows them (madvise mode): a
    // long-context decode step reads a few KB from each of thousands of blocks, and with 4 KB pages
    // every one costs a TLB miss (a nested page walk in a VM). 8 layers of 16K fp16 tokens, one
    // thread: attention 11.1 -> 8.9 ms (bench_attention, BM_AttentionLayers). Advice only: where it
    // is refused the pages stay 4 KB.
    const size_t bytes = block_bytes_ * capacity, huge = size_t(2) << 20;
    const bool on_huge = bytes >= 2 * huge;
    arena_.reset(alloc_aligned(bytes, on_huge ? huge : kAlign));
#ifdef MADV_HUGEPAGE  // Linux only
    if (on_huge) madvise(arena_.get(), (bytes + huge - 1) / huge * huge, MADV_HUGEPAGE);
#endif
    std::memset(arena_.get(), 0, bytes);  // touch every page now: flat memory from the start
    for (size_t i = 0; i < capacity; ++i) ptr_[i] = arena_.get() + i * block_bytes_;
    for (size_t i = capacity; i-- > 0;) free_.push_back(int32_t(i));
    allocated_ = capacity;
    next_fresh_ = int32_t(capacity);
  } else {
    owned_.reserve(capacity);
  }
}

int32_t BlockPool::acquire() {
  int32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else if (size_t(next_fresh_) < capacity_) {
    id = next_fresh_++;
    owned_.emplace_back(alloc_aligned(block_bytes_));
    ptr_[size_t(id)] = owned_.back().get();
    ++allocated_;
  } else {
    // The least recently released cached block of the lowest class: its content is forgotten.
    id = kNone;
    for (const Lru& l : lru_)
      if (l.head != kNone) {
        id = l.head;
        break;
      }
    if (id == kNone) return -1;
    lru_remove(id);
    forget(id);
  }
  class_[size_t(id)] = uint8_t(Retention::User);
  refs_[size_t(id)] = 1;
  ++in_use_;
  return id;
}

void BlockPool::ref(int32_t id) {
  PTLLM_CHECK(id >= 0 && size_t(id) < capacity_ && refs_[size_t(id)] > 0);
  ++refs_[size_t(id)];
}

void BlockPool::release(int32_t id) {
  PTLLM_CHECK(id >= 0 && size_t(id) < capacity_ && ptr_[size_t(id)] != nullptr && refs_[size_t(id)] > 0);
  if (--refs_[size_t(id)] > 0) return;
  --in_use_;
  if (!keyed_.empty() && keyed_[size_t(id)])
    lru_push_back(id);
  else
    free_.push_back(id);
}

size_t BlockPool::bucket(const BlockKey& k) const {
  const uint64_t h = k.lo ^ (uint64_t(uint32_t(k.layer)) * 0x9E3779B97F4A7C15ull) ^ (k.quantized ? 0x5bd1e995ull : 0);
  return size_t(h ^ (h >> 29)) & (buckets_.size() - 1);
}

size_t BlockPool::pbucket(const BlockHash& parent, int32_t layer) const {
  const uint64_t h = parent.lo ^ (uint64_t(uint32_t(layer)) * 0x9E3779B97F4A7C15ull);
  return size_t(h ^ (h >> 31)) & (pbuckets_.size() - 1);
}

bool BlockPool::publish(int32_t id, const BlockKey& key, std::span<const int32_t> tokens, Retention cls,
                        const BlockHash* parent) {
  PTLLM_CHECK(tokens_per_block_ > 0 && refs_[size_t(id)] > 0 && tokens.size() <= size_t(tokens_per_block_));
  if (keyed_[size_t(id)]) return false;
  for (int32_t at = buckets_[bucket(key)]; at != kNone; at = bucket_next_[size_t(at)])
    if (keys_[size_t(at)] == key) return false;  // one block per key: the first keeps it
  class_[size_t(id)] = uint8_t(cls);
  keys_[size_t(id)] = key;
  keyed_[size_t(id)] = 1;
  int32_t* t = tokens_.data() + size_t(id) * size_t(tokens_per_block_);
  std::fill_n(t, tokens_per_block_, -1);
  std::copy(tokens.begin(), tokens.end(), t);
  const size_t b = bucket(key);
  bucket_next_[size_t(id)] = buckets_[b];
  buckets_[b] = id;
  if (parent) {
    parent_[size_t(id)] = *parent;
    has_parent_[size_t(id)] = 1;
    const size_t pb = pbucket(*parent, key.layer);
    pbucket_next_[size_t(id)] = pbuckets_[pb];
    pbuckets_[pb] = id;
  }
  return true;
}

int32_t BlockPool::find_child(const BlockHash& parent, int32_t layer, bool quantized, std::span<const int32_t> tokens,
                              size_t* common) {
  *common = 0;
  if (tokens_per_block_ == 0 || tokens.empty()) return kNone;
  int32_t best = kNone;
  for (int32_t at = pbuckets_[pbucket(parent, layer)]; at != kNone; at = pbucket_next_[size_t(at)]) {
    const BlockKey& k = keys_[size_t(at)];
    if (!(parent_[size_t(at)] == parent) || k.layer != layer || k.quantized != quantized) continue;
    const int32_t* t = tokens_.data() + size_t(at) * size_t(tokens_per_block_);
    const size_t n = std::min(tokens.size(), size_t(tokens_per_block_));
    size_t c = 0;
    while (c < n && t[c] != -1 && t[c] == tokens[c]) ++c;
    if (c > *common) {
      *common = c;
      best = at;
    }
  }
  if (best == kNone) return kNone;
  if (refs_[size_t(best)] == 0) {  // revived from the cache
    lru_remove(best);
    ++in_use_;
  }
  ++refs_[size_t(best)];
  return best;
}

int32_t BlockPool::find(const BlockKey& key, std::span<const int32_t> tokens) {
  if (tokens_per_block_ == 0 || tokens.size() > size_t(tokens_per_block_)) return kNone;
  for (int32_t at = buckets_[bucket(key)]; at != kNone; at = bucket_next_[size_t(at)]) {
    if (!(keys_[size_t(at)] == key)) continue;
    // The hash is only the way in: the block's own tokens decide (a collision is a miss).
    const int32_t* t = tokens_.data() + size_t(at) * size_t(tokens_per_block_);
    if (!std::equal(tokens.begin(), tokens.end(), t)) return kNone;
    if (tokens.size() < size_t(tokens_per_block_) && t[tokens.size()] != -1) return kNone;
    if (refs_[size_t(at)] == 0) {  // revived from the cache
      lru_remove(at);
      ++in_use_;
    }
    ++refs_[size_t(at)];
    return at;
  }
  return kNone;
}

void BlockPool::set_retention(int32_t id, Retention cls) {
  PTLLM_CHECK(id >= 0 && size_t(id) < capacity_ && refs_[size_t(id)] > 0);  // not in a list
  class_[size_t(id)] = uint8_t(cls);
}

const BlockKey* BlockPool::key_of(int32_t id) const {
  return !keyed_.empty() && keyed_[size_t(id)] ? &keys_[size_t(id)] : nullptr;
}

std::span<const int32_t> BlockPool::tokens_of(int32_t id) const {
  PTLLM_CHECK(key_of(id));
  const int32_t* t = tokens_.data() + size_t(id) * size_t(tokens_per_block_);
  size_t n = 0;
  while (n < size_t(tokens_per_block_) && t[n] != -1) ++n;
  return {t, n};
}

void BlockPool::unpublish(int32_t id) {
  PTLLM_CHECK(refs_[size_t(id)] == 1);
  if (key_of(id)) forget(id);
}

void BlockPool::unlink_bucket(int32_t id) {
  int32_t* link = &buckets_[bucket(keys_[size_t(id)])];
  while (*link != id) {
    PTLLM_CHECK(*link != kNone);
    link = &bucket_next_[size_t(*link)];
  }
  *link = bucket_next_[size_t(id)];
  bucket_next_[size_t(id)] = kNone;
}

void BlockPool::forget(int32_t id) {
  unlink_bucket(id);
  keyed_[size_t(id)] = 0;
  if (has_parent_[size_t(id)]) {
    int32_t* link = &pbuckets_[pbucket(parent_[size_t(id)], keys_[size_t(id)].layer)];
    while (*link != id) {
      PTLLM_CHECK(*link != kNone);
      link = &pbucket_next_[size_t(*link)];
    }
    *link = pbucket_next_[size_t(id)];
    pbucket_next_[size_t(id)] = kNone;
    has_parent_[size_t(id)] = 0;
  }
}

void BlockPool::lru_push_back(int32_t id) {
  Lru& l = lru_[class_[size_t(id)]];
  lru_prev_[size_t(id)] = l.tail;
  lru_next_[size_t(id)] = kNone;
  if (l.tail != kNone) lru_next_[size_t(l.tail)] = id;
  else l.head = id;
  l.tail = id;
  ++l.n;
  ++n_cached_;
}

void BlockPool::lru_remove(int32_t id) {
  Lru& l = lru_[class_[size_t(id)]];
  const int32_t p = lru_prev_[size_t(id)], n = lru_next_[size_t(id)];
  if (p != kNone) lru_next_[size_t(p)] = n;
  else l.head = n;
  if (n != kNone) lru_prev_[size_t(n)] = p;
  else l.tail = p;
  --l.n;
  --n_cached_;
}

}  // namespace ptllm
