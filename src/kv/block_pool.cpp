#include "kv/block_pool.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include <sys/mman.h>

#include "core/error.h"

namespace ptllm {

namespace {
constexpr size_t kAlign = 64;
uint8_t* alloc_aligned(size_t bytes, size_t align = kAlign) {
  size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (!p) throw Error("KV cache: cannot allocate " + std::to_string(bytes) + " bytes");
  return static_cast<uint8_t*>(p);
}
}  // namespace

void BlockPool::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

BlockPool::BlockPool(size_t block_bytes, size_t capacity, bool preallocate)
    : block_bytes_((block_bytes + kAlign - 1) / kAlign * kAlign), capacity_(capacity), ptr_(capacity, nullptr) {
  free_.reserve(capacity);
  if (preallocate && capacity > 0) {
    // A large arena goes on transparent huge pages where the kernel allows them (madvise mode): a
    // long-context decode step reads a few KB from each of thousands of blocks, and with 4 KB pages
    // every one costs a TLB miss (a nested page walk in a VM). 8 layers of 16K fp16 tokens, one
    // thread: attention 11.1 -> 8.9 ms (bench_attention, BM_AttentionLayers). Advice only: where it
    // is refused the pages stay 4 KB.
    const size_t bytes = block_bytes_ * capacity, huge = size_t(2) << 20;
    const bool on_huge = bytes >= 2 * huge;
    arena_.reset(alloc_aligned(bytes, on_huge ? huge : kAlign));
    if (on_huge) madvise(arena_.get(), (bytes + huge - 1) / huge * huge, MADV_HUGEPAGE);
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
    return -1;
  }
  ++in_use_;
  return id;
}

void BlockPool::release(int32_t id) {
  PTLLM_CHECK(id >= 0 && size_t(id) < capacity_ && ptr_[size_t(id)] != nullptr);
  free_.push_back(id);
  --in_use_;
}

}  // namespace ptllm
