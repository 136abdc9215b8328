// The attention plan (src/kv/attention/plan.h) against the masks written as plain sets: every query
// sees exactly the keys its causal, window and sink masks allow, each once, in the block that holds
// it, at the right distance and in a score column of its own, whatever the tiling.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "kv/attention/plan.h"
#include "test_util.h"

namespace ptllm::attn {
namespace {

struct Case {
  int B, N, M;     // block size, StreamingLLM sinks and window (M = 0: off)
  int native;      // the layer's sliding window (0: none)
  int64_t total;   // tokens appended
  int T;           // queries: the last T of them
  bool old_block;  // keep one block before the first one a query sees (not yet released)
};

int stream_window(const Case& c) {
  return c.native > 0 && c.M > 0 ? std::min(c.native, c.M) : std::max(c.native, c.M);
}

// A layer's block table as the cache would hold it after `total` tokens: sinks ids 100 + b, stream
// ids 1000 + e, the first half of the stream quantized.
void make_table(const Case& c, int64_t first_lo, kvdetail::BlockTable& t) {
  t.n_sink = int(std::min<int64_t>(c.total, c.N));
  t.end = c.total - t.n_sink;
  t.begin = first_lo / c.B * c.B;
  if (c.old_block) t.begin = std::max<int64_t>(0, t.begin - c.B);
  t.native = c.native;
  t.window = stream_window(c);
  for (int b = 0; b * c.B < t.n_sink; ++b) t.sinks.push_back(100 + b);
  const size_t n_blocks = size_t((t.end - t.begin + c.B - 1) / c.B);
  t.stream = kvdetail::Ring(n_blocks + 1);
  for (size_t e = 0; e < n_blocks; ++e) t.stream.push_back({int32_t(1000 + e), e < n_blocks / 2});
  t.n_quant = n_blocks / 2;
}

// What query index i sees (global indices) and the distance the plan must give each key.
std::map<int64_t, int64_t> expected(const Case& c, int n_sink, int64_t i) {
  std::map<int64_t, int64_t> want;  // index -> distance
  const int win = stream_window(c);
  // A sink's distance is from the query's cache slot, capped once StreamingLLM's window is full
  // (not on a sliding layer, whose keys keep their true distances).
  const int64_t q_slot = c.M > 0 && c.native == 0 ? std::min<int64_t>(i, c.N + c.M - 1) : i;
  for (int64_t j = 0; j < n_sink && j <= i; ++j)
    if (c.native == 0 || j > i - c.native) want[j] = q_slot - j;
  if (i >= n_sink) {
    const int64_t si = i - n_sink;
    for (int64_t s = win > 0 ? std::max<int64_t>(0, si - win + 1) : 0; s <= si; ++s) want[n_sink + s] = si - s;
  }
  return want;
}

void check(const Case& c) {
  SCOPED_TRACE(testing::Message() << "B=" << c.B << " N=" << c.N << " M=" << c.M << " native=" << c.native
                                  << " total=" << c.total << " T=" << c.T << " old_block=" << c.old_block);
  // The first query's lowest stream index seen decides the first block the table must still hold.
  const int n_sink = int(std::min<int64_t>(c.total, c.N));
  const int64_t first = c.total - c.T, first_si = first - n_sink, win = stream_window(c);
  const int64_t first_lo = first_si >= 0 && win > 0 ? std::max<int64_t>(0, first_si - win + 1) : 0;
  kvdetail::BlockTable table;
  make_table(c, first_lo, table);
  const Plan plan(table, PlanSettings{c.B, c.N, c.M}, c.T);
  ASSERT_EQ(plan.n_before(), first);
  std::vector<PlanBlock> blocks(plan.max_blocks());
  for (int tile : {1, 3, kTile}) {
    std::vector<std::map<int64_t, int64_t>> seen(static_cast<size_t>(c.T));  // per query: index -> distance
    for (int t0 = 0; t0 < c.T; t0 += tile) {
      const int nt = std::min(tile, c.T - t0);
      for (int part = 0; part < plan.parts(); ++part) {
        int c0[kTile], c1[kTile];
        const size_t nb = plan.blocks(t0, nt, part, blocks.data(), c0, c1);
        std::vector<std::vector<int>> cols(static_cast<size_t>(nt));
        for (size_t n = 0; n < nb; ++n) {
          const PlanBlock& k = blocks[n];
          ASSERT_LT(k.i0, k.i1);
          for (int i = 0; i < nt; ++i) {
            if (k.a[i] >= k.b[i]) continue;
            ASSERT_TRUE(i >= k.i0 && i < k.i1) << "a query outside [i0, i1) sees the block";
            if (k.same) {
              ASSERT_TRUE(k.a[i] == k.a[k.i0] && k.b[i] == k.b[k.i0]);
            }
            ASSERT_TRUE(k.a[i] >= 0 && k.b[i] <= c.B);
            for (int j = k.a[i]; j < k.b[i]; ++j) {
              int64_t index;
              if (part == 0) {
                index = k.col + j;
                ASSERT_EQ(k.block.id, 100 + index / c.B);
                ASSERT_FALSE(k.block.quantized);
              } else {
                const int64_t s = table.begin + (k.block.id - 1000) * int64_t(c.B) + j;
                index = table.n_sink + s;
                ASSERT_EQ(k.block.quantized, table.stream[size_t(k.block.id - 1000)].quantized);
              }
              ASSERT_EQ(seen[size_t(t0 + i)].count(index), 0u) << "key " << index << " seen twice";
              seen[size_t(t0 + i)][index] = k.delta0[i] - j;
              cols[size_t(i)].push_back(k.col + j);
            }
          }
        }
        // The columns a query's keys land in are exactly [c0, c1): the softmax reads no stale score.
        for (int i = 0; i < nt; ++i) {
          std::sort(cols[size_t(i)].begin(), cols[size_t(i)].end());
          std::vector<int> want_cols;
          for (int x = c0[i]; x < c1[i]; ++x) want_cols.push_back(x);
          ASSERT_EQ(cols[size_t(i)], want_cols) << "query " << t0 + i << " part " << part;
          ASSERT_EQ(!want_cols.empty(), plan.sees_part(t0 + i, part));
          ASSERT_LE(c1[i], plan.part_cols());
        }
      }
    }
    for (int t = 0; t < c.T; ++t)
      ASSERT_EQ(seen[size_t(t)], expected(c, n_sink, first + t)) << "tile " << tile << " query " << t;
  }
}

TEST(AttentionPlanTest, FullCausal) {
  for (int B : {1, 5, 32})
    for (int64_t total : {1, 7, 64, 1100, 2500})
      for (int T : {1, 8, 13})
        if (T <= total) check({B, 0, 0, 0, total, T, false});
}

TEST(AttentionPlanTest, SlidingLayer) {
  for (int B : {4, 32})
    for (int native : {1, 9, 64, 1500})
      for (int64_t total : {3, 70, 1200, 3000})
        for (int T : {1, 8, 21})
          if (T <= total) check({B, 0, 0, native, total, T, total % 2 == 0});
}

TEST(AttentionPlanTest, StreamingLLMSinksAndWindow) {
  for (int B : {4, 5, 32})
    for (int N : {1, 4, 37})
      for (int M : {8, 28, 1030})
        for (int native : {0, 17})
          for (int64_t total : {2, 30, 200, 2100})
            for (int T : {1, 9})
              if (T <= total) check({B, N, M, native, total, T, total % 3 == 0});
}

// Random shapes, including prompts that start inside the sinks.
TEST(AttentionPlanTest, RandomCases) {
  std::mt19937 rng(5);
  for (int n = 0; n < test::light_or(200); ++n) {
    Case c;
    c.B = 1 + int(rng() % 40);
    const bool stream = rng() % 2;
    c.N = stream ? int(rng() % 12) : 0;
    c.M = stream ? 1 + int(rng() % 300) : 0;
    c.native = rng() % 3 == 0 ? 1 + int(rng() % 200) : 0;
    c.total = 1 + int64_t(rng() % 2600);
    c.T = 1 + int(rng() % std::min<int64_t>(c.total, 40));
    c.old_block = rng() % 2;
    check(c);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace ptllm::attn
