// The block table (src/kv/block_table.h): where a token lives, the rewind floor, truncation and
// eviction giving blocks back to their pools, logical bytes.
#include <gtest/gtest.h>

#include "kv/block_pool.h"
#include "kv/block_table.h"

namespace ptllm::kvdetail {
namespace {

constexpr int B = 4;

// A table of `sink` sink tokens and `stream` stream tokens from stream index 0, its blocks taken
// from the pools; the first n_quant stream blocks are KIVI groups.
struct Fixture {
  BlockPool dense{16, 32, false}, quant{8, 32, false};
  BlockTable t;
  Fixture(int sink, int64_t stream, size_t n_quant, int window = 0) {
    t.window = window;
    t.n_sink = sink;
    for (int s = 0; s < sink; s += B) t.sinks.push_back(dense.acquire());
    t.end = stream;
    t.stream = Ring(16);
    for (size_t e = 0; e < ceil_div(stream, B); ++e) {
      const bool q = e < n_quant;
      t.stream.push_back({(q ? quant : dense).acquire(), q});
    }
    t.n_quant = n_quant;
  }
};

TEST(BlockTableTest, LocateFindsTheBlockAndSlotOfEveryToken) {
  Fixture f(6, 13, 1);
  EXPECT_EQ(f.t.tokens(), 19);
  EXPECT_EQ(f.t.held(), 19);
  for (int64_t i = 0; i < 19; ++i) {
    const BlockTable::Where w = f.t.locate(i, B);
    if (i < 6) {
      EXPECT_EQ(w.block.id, f.t.sinks[size_t(i / B)]);
      EXPECT_FALSE(w.block.quantized);
      EXPECT_EQ(w.slot, i % B);
    } else {
      const int64_t s = i - 6;
      EXPECT_EQ(w.block.id, f.t.stream[size_t(s / B)].id);
      EXPECT_EQ(w.block.quantized, s < B);
      EXPECT_EQ(w.slot, s % B);
    }
  }
  // Token blocks: 2 of sinks, then the stream's; past the end, nothing.
  EXPECT_EQ(f.t.block_of(1, 2, B).id, f.t.sinks[1]);
  EXPECT_EQ(f.t.block_of(2, 2, B).id, f.t.stream[0].id);
  EXPECT_TRUE(f.t.block_of(2, 2, B).quantized);
  EXPECT_EQ(f.t.block_of(5, 2, B).id, f.t.stream[3].id);
  EXPECT_EQ(f.t.block_of(6, 2, B).id, -1);
}

TEST(BlockTableTest, EvictionMovesTheFloorAndTruncateGivesBlocksBack) {
  Fixture f(2, 15, 0, 6);
  EXPECT_EQ(f.t.rewind_floor(B), 0);
  const size_t in_use = f.dense.in_use();
  f.t.release_front(f.dense, f.quant, B);  // stream tokens 0-3 leave the window
  EXPECT_EQ(f.t.begin, B);
  EXPECT_EQ(f.dense.in_use(), in_use - 1);
  EXPECT_EQ(f.t.held(), 2 + 15 - 4);
  // The next query's window (6 tokens, itself included) must still be stored: from stream index 4.
  EXPECT_EQ(f.t.rewind_floor(B), 2 + 4 + 6 - 1);
  EXPECT_EQ(f.t.locate(2 + 4, B).block.id, f.t.stream[0].id);
  f.t.truncate(2 + 11, B, f.dense);  // stream [4, 11): two blocks, the last partial
  EXPECT_EQ(f.t.end, 11);
  EXPECT_EQ(f.t.stream.size(), 2u);
  EXPECT_EQ(f.dense.in_use(), in_use - 2);
  EXPECT_EQ(f.t.seen(), 2 + 6);
  f.t.clear(f.dense, f.quant, B);
  EXPECT_EQ(f.dense.in_use(), 0u);
  EXPECT_EQ(f.t.tokens(), 0);
}

TEST(BlockTableTest, QuantizedGroupsBoundTheFloorAndCountTheirBytes) {
  Fixture f(0, 10, 2);
  EXPECT_EQ(f.t.rewind_floor(B), 2 * B);
  // 8 tokens in 2 groups, 2 dense: 8 * quant + 2 * quant_group + 2 * dense.
  EXPECT_EQ(f.t.logical_bytes(B, TokenBytes{100, 10, 1}), size_t(8 * 10 + 2 * 1 + 2 * 100));
  f.t.release_front(f.dense, f.quant, B);
  EXPECT_EQ(f.t.n_quant, 1u);
  EXPECT_EQ(f.quant.in_use(), 1u);
  f.t.clear(f.dense, f.quant, B);
  EXPECT_EQ(f.quant.in_use() + f.dense.in_use(), 0u);
}

TEST(BlockTableTest, LogicalBytesCountOnlyWhatTheLastQuerySees) {
  // Sliding layer of window 5 with 3 sinks: the last query (index 3 + 12 - 1 = 14) sees stream
  // [7, 12) and no sink (a sink is within its window only while index > 14 - 5).
  Fixture f(3, 12, 0, 5);
  f.t.native = 5;
  EXPECT_EQ(f.t.logical_bytes(B, TokenBytes{1, 0, 0}), 5u);
  f.t.native = 0;  // StreamingLLM's window: the sinks too
  EXPECT_EQ(f.t.logical_bytes(B, TokenBytes{1, 0, 0}), 8u);
  f.t.clear(f.dense, f.quant, B);
}

}  // namespace
}  // namespace ptllm::kvdetail
