#pragma once
// The attention plan (DESIGN.md "The KV engine for many sequences"): for one layer's attention
// call of T consecutive queries, which stored keys each query sees, as plain data: blocks (an id,
// dense or quantized), the slot range of each block a query sees, and the distance of each slot
// from the query (what RoPE at cache positions needs). The masks are all in those ranges: the causal
// edge (query i sees no later key), a window's lower edge (the model's sliding window, StreamingLLM's
// or the narrower of the two) and the sinks (the first tokens, a sliding layer seeing them only
// while they are within its window). Nothing here reads a key or knows how a backend computes the
// scores: attention/cpu.h runs a plan on the CPU. It reads only the layer's block table (block_table.h).
//
// A query's keys are cut into parts: part 0 the sinks, then the stream tokens by absolute stream index
// in runs of part_len (flash-decoding's split, Dao et al. 2023). Parts depend only on token
// indices, never on T or on how the work is spread, so a token sees the same parts however a prompt
// was batched; a backend computes each part alone and merges them in order.
#include <cstddef>
#include <cstdint>

#include "kv/block_table.h"

namespace ptllm::attn {

// Stream tokens per part: a 4K-token decode step is 4 parts per KV head, enough to spread over a
// few threads, while what a part costs besides its keys (walking its blocks, one max and exp call
// per head, merging: O(D) per head) stays small next to reading 1024 keys, and its scores (4 heads
// x 4 KB) stay in the first-level cache. bench_attention int4 at 16K: 171 -> 164 us against 512
// (fp32 unchanged); 2048 no faster.
inline constexpr int kPartTokens = 1024;

// Prefill walks the keys for a tile of up to kTile consecutive query tokens at once.
inline constexpr int kTile = 8;

// The cache settings a plan depends on.
struct PlanSettings {
  int group_size = 0;  // B: tokens per block
  int sink = 0;        // StreamingLLM's N
  int window = 0;      // StreamingLLM's M (0: off)
};

// What one query sees: sinks [sink_lo, n_sink_vis) (none when empty), stream indices [lo, si] (none
// when si < lo).
struct Visible {
  int64_t sink_lo, n_sink_vis, lo, si;
};

// A block of a part, for queries [i0, i1) of a tile: query i sees slots [a[i], b[i]) of it (empty:
// a >= b), key slot j at distance delta0[i] - j from the query; its slot 0 is column col of the
// part's scores.
struct PlanBlock {
  kvdetail::Entry block;
  int i0, i1, col;
  int a[kTile], b[kTile];
  int64_t delta0[kTile];
  // The blocks read two blocks later in the order a backend walks the part (id -1: none), for
  // prefetching: scoring reads every K row, then summing values every V row. Near the part's end
  // (near_end) the next pass's first blocks: scoring asks for the first blocks' V rows, summing
  // values for the next part's K rows.
  kvdetail::Entry k_ahead, v_ahead;
  bool near_end;
  // Every query of [i0, i1) sees the same slots [a[i0], b[i0]).
  bool same;
};

class Plan {
 public:
  // The plan of the T queries just appended to the layer's table (global indices n_before ..
  // n_before + T - 1); the table must outlive the plan.
  Plan(const kvdetail::BlockTable& layer, const PlanSettings& s, int T);

  int queries() const { return T_; }
  int64_t n_before() const { return n_before_; }
  int parts() const { return n_parts_; }
  // Columns of a part's scores: part_len stream tokens, or the sinks (whole blocks).
  int part_cols() const { return part_cols_; }
  // Blocks one part of one tile can touch: the room `blocks` needs.
  size_t max_blocks() const { return max_blocks_; }

  Visible visible(int t) const;
  bool sees_part(int t, int part) const;
  // The blocks of part `part` that queries [t0, t0 + nt) (nt <= kTile) see, in order, written into
  // out[0, n) (out has room for max_blocks()); query i sees columns [c0[i], c1[i]) of the part's
  // scores (empty: c0 == c1). Returns n.
  size_t blocks(int t0, int nt, int part, PlanBlock* out, int* c0, int* c1) const;

 private:
  // Stream indices [a, b] of part `part` that v sees (empty when b < a).
  void part_range(const Visible& v, int part, int64_t& a, int64_t& b) const;
  size_t sink_blocks(const Visible* v, const int64_t* q_slot, int nt, PlanBlock* out, int* c0, int* c1) const;
  size_t stream_blocks(const Visible* v, int nt, int part, PlanBlock* out, int* c0, int* c1) const;

  const kvdetail::BlockTable& L_;
  int group_size_, sink_, window_;
  bool streaming_;
  int T_;
  int64_t n_before_;
  int64_t part_len_;  // stream tokens per part: kPartTokens rounded down to whole blocks
  int64_t p0_;        // part 1 holds the stream indices [p0 * part_len, (p0 + 1) * part_len)
  int n_parts_;
  int part_cols_;
  size_t max_blocks_;
};

}  // namespace ptllm::attn
