#pragma once
// The storage mechanism of the KV cache: fixed-size blocks, a free list, nothing else.
// Policy (which tokens live where, what is evicted) belongs to KVCache.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace ptllm {

class BlockPool {
 public:
  // preallocate: one arena of capacity * block_bytes reserved (and touched) now, so memory is flat and
  // an impossible size fails here; otherwise each block is allocated the first time it is needed
  // and kept for reuse (never moved, never copied).
  BlockPool(size_t block_bytes, size_t capacity, bool preallocate);

  // A free block id, or -1 when all `capacity` blocks are in use (an ordinary outcome, not an error).
  int32_t acquire();
  void release(int32_t id);
  uint8_t* data(int32_t id) { return ptr_[size_t(id)]; }
  const uint8_t* data(int32_t id) const { return ptr_[size_t(id)]; }

  size_t block_bytes() const { return block_bytes_; }
  size_t capacity() const { return capacity_; }
  size_t in_use() const { return in_use_; }
  size_t physical_bytes() const { return allocated_ * block_bytes_; }

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

  size_t block_bytes_;
  size_t capacity_;
  size_t allocated_ = 0;  // blocks backed by memory
  size_t in_use_ = 0;
  Buffer arena_;                // preallocated mode
  std::vector<Buffer> owned_;   // on-demand mode, one allocation per block
  std::vector<uint8_t*> ptr_;   // [capacity] id -> data (null until allocated)
  std::vector<int32_t> free_;   // ids with memory, ready for reuse
  int32_t next_fresh_ = 0;      // first id never handed out (on-demand mode)
};

}  // namespace ptllm
