#pragma once
// A block table (DESIGN.md "The KV engine for many sequences"): one sequence's blocks of one layer,
// in order, and the counts that say which slots hold which tokens. Mechanism only: what is evicted
// or quantized, and when, is the policy's (policy.cpp); the blocks' bytes are the pools'
// (block_pool.h); attention reads a table through its plan (attention/plan.h).
//
// Layout of the tokens, oldest first:
//   [ sinks: the first n_sink tokens (StreamingLLM), dense blocks, never evicted, never quantized ]
//   [ stream: the tokens after them by stream index, from stream[0]'s slot 0 = stream index begin:
//     the first n_quant entries KIVI groups, then full-precision blocks; the last may be partial ]
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"

namespace ptllm {

class BlockPool;

namespace kvdetail {

// A block of a table: its id in the dense pool, or in the quantized pool when quantized.
struct Entry {
  int32_t id = -1;
  bool quantized = false;
};

// A fixed-capacity ring of block entries, oldest first (no allocation after construction).
class Ring {
 public:
  explicit Ring(size_t cap = 0) : buf_(cap) {}
  size_t size() const { return size_; }
  size_t capacity() const { return buf_.size(); }
  bool empty() const { return size_ == 0; }
  // Indexed by a compare, not a division (attention indexes the ring once per block read).
  Entry& operator[](size_t i) { return buf_[wrap(head_ + i)]; }
  const Entry& operator[](size_t i) const { return buf_[wrap(head_ + i)]; }
  void push_back(Entry e) {
    PTLLM_CHECK(size_ < buf_.size());
    buf_[wrap(head_ + size_)] = e;
    ++size_;
  }
  void pop_front() {
    PTLLM_CHECK(size_ > 0);
    head_ = wrap(head_ + 1);
    --size_;
  }
  void pop_back() {
    PTLLM_CHECK(size_ > 0);
    --size_;
  }

 private:
  size_t wrap(size_t i) const { return i < buf_.size() ? i : i - buf_.size(); }  // i < 2 capacity
  std::vector<Entry> buf_;
  size_t head_ = 0, size_ = 0;
};

inline size_t ceil_div(int64_t a, int64_t b) { return size_t((a + b - 1) / b); }

// Bytes one stored token costs attention: full precision (K and V, every head), or in a KIVI group
// (codes and V's scale and zero per token, plus K's scales and zeros once per group).
struct TokenBytes {
  size_t dense = 0, quant = 0, quant_group = 0;
};

struct BlockTable {
  std::vector<int32_t> sinks;  // dense blocks holding the first n_sink tokens
  int n_sink = 0;
  int native = 0;              // the model's sliding window (0: full attention)
  int window = 0;              // stream tokens a query sees, itself included (0: all): native and/or StreamingLLM's
  Ring stream;                 // blocks of the tokens after the sinks, oldest first
  size_t n_quant = 0;          // the first n_quant entries of `stream` are quantized
  int64_t begin = 0;           // stream index of the first slot of stream[0] (a multiple of B)
  int64_t end = 0;             // stream tokens appended

  int64_t tokens() const { return n_sink + end; }  // appended so far
  int64_t held() const { return n_sink + end - begin; }  // in the blocks now, masked ones included
  // What the last query saw: the sinks and the stream tokens of its window.
  int64_t seen() const;

  // The block holding global token `index` (still stored) and its slot there; B tokens a block.
  struct Where {
    Entry block;
    int slot;
  };
  Where locate(int64_t index, int B) const;
  // The block of token block j (n_sink_blocks of them for the sinks, then the stream's by stream
  // index / B), or an entry with id -1 when it is not stored (evicted, not yet there).
  Entry block_of(size_t j, size_t n_sink_blocks, int B) const;
  // The lowest token count the table can be rewound to: not into quantized or evicted tokens, and the
  // next query's window must still be stored.
  int64_t rewind_floor(int B) const;
  // Bytes attention read for the last query's keys (logical, whatever blocks are shared).
  size_t logical_bytes(int B, const TokenBytes& bytes) const;

  // Gives back stream[0] (out of the window) to its pool.
  void release_front(BlockPool& dense, BlockPool& quant, int B);
  // Keeps the first n tokens (n >= rewind_floor): the blocks after them go back to the dense pool
  // (tokens past the floor are never quantized). A block left partial may be shared: the caller
  // makes it its own before writing.
  void truncate(int64_t n, int B, BlockPool& dense);
  // Gives back every block; the table is empty.
  void clear(BlockPool& dense, BlockPool& quant, int B);
};

}  // namespace kvdetail
}  // namespace ptllm
