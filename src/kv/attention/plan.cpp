// The attention plan: which blocks and slots each query sees (attention/plan.h).
#include "kv/attention/plan.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace ptllm::attn {

using kvdetail::ceil_div;

Plan::Plan(const kvdetail::BlockTable& layer, const PlanSettings& s, int T)
    : L_(layer), group_size_(s.group_size), sink_(s.sink), window_(s.window), streaming_(s.window > 0), T_(T) {
  const int B = group_size_;
  n_before_ = L_.n_sink + L_.end - T;
  PTLLM_CHECK(n_before_ >= 0 && B > 0);
  part_len_ = int64_t(std::max(1, kPartTokens / B)) * B;
  const Visible first = visible(0), last = visible(T - 1);
  // Queries are consecutive: when the first is a sink, the first stream query sees stream index 0.
  p0_ = first.si >= 0 ? first.lo / part_len_ : 0;
  n_parts_ = 1 + (last.si >= 0 ? int(last.si / part_len_ - p0_ + 1) : 0);
  part_cols_ = int(std::max<int64_t>(part_len_, int64_t(ceil_div(sink_, B)) * B));
  max_blocks_ = ceil_div(part_cols_, B) + 1;
}

// A sliding layer sees a sink only while it is within its window (the intersection with what
// StreamingLLM keeps).
Visible Plan::visible(int t) const {
  const int64_t i = n_before_ + t;  // global index of the query
  const int64_t native = L_.native, win = L_.window;
  Visible v{native > 0 ? std::max<int64_t>(0, i - native + 1) : 0, std::min<int64_t>(L_.n_sink, i + 1), 0, -1};
  if (i >= L_.n_sink) {
    v.si = i - L_.n_sink;
    v.lo = win > 0 ? std::max<int64_t>(0, v.si - win + 1) : 0;
    PTLLM_CHECK(v.lo >= L_.begin);
  }
  return v;
}

void Plan::part_range(const Visible& v, int part, int64_t& a, int64_t& b) const {
  const int64_t start = (p0_ + part - 1) * part_len_;
  a = std::max(v.lo, start);
  b = std::min(v.si, start + part_len_ - 1);
}

bool Plan::sees_part(int t, int part) const {
  const Visible v = visible(t);
  if (part == 0) return v.n_sink_vis > v.sink_lo;
  int64_t a, b;
  part_range(v, part, a, b);
  return a <= b;
}

namespace {

// Queries [i0, i1) of the tile that see some of a block: an interval, since both ends of the
// visible range grow with the query index. False when none does.
bool set_active(PlanBlock& k, int nt) {
  k.i0 = 0;
  while (k.i0 < nt && k.a[k.i0] >= k.b[k.i0]) ++k.i0;
  k.i1 = k.i0;
  while (k.i1 < nt && k.a[k.i1] < k.b[k.i1]) ++k.i1;
  for (int i = k.i1; i < nt; ++i) PTLLM_CHECK(k.a[i] >= k.b[i]);
  k.same = true;
  for (int i = k.i0; i < k.i1; ++i) k.same = k.same && k.a[i] == k.a[k.i0] && k.b[i] == k.b[k.i0];
  return k.i0 < k.i1;
}

}  // namespace

size_t Plan::blocks(int t0, int nt, int part, PlanBlock* out, int* c0, int* c1) const {
  PTLLM_CHECK(nt > 0 && nt <= kTile && t0 >= 0 && t0 + nt <= T_ && part >= 0 && part < n_parts_);
  Visible v[kTile];
  for (int i = 0; i < nt; ++i) v[i] = visible(t0 + i);
  if (part > 0) return stream_blocks(v, nt, part, out, c0, c1);
  // The query's slot in the cache: its index, capped once StreamingLLM's window is full. Not on a
  // sliding layer: its keys are all within its window, where cache slots and indices are the same
  // distance apart, and a sink it sees keeps its true distance too (the one the model was trained on).
  int64_t q_slot[kTile];
  const bool cap_slot = streaming_ && L_.native == 0;
  for (int i = 0; i < nt; ++i) {
    const int64_t index = n_before_ + t0 + i;
    q_slot[i] = cap_slot ? std::min<int64_t>(index, int64_t(sink_) + window_ - 1) : index;
  }
  return sink_blocks(v, q_slot, nt, out, c0, c1);
}

// Part 0, the sinks: global indices [sink_lo, n_sink_vis), cache slot = index.
size_t Plan::sink_blocks(const Visible* v, const int64_t* q_slot, int nt, PlanBlock* out, int* c0, int* c1) const {
  const int B = group_size_;
  int64_t n_sink = 0;
  for (int i = 0; i < nt; ++i) {
    const bool any = v[i].sink_lo < v[i].n_sink_vis;
    n_sink = std::max(n_sink, v[i].n_sink_vis);
    c0[i] = any ? int(v[i].sink_lo) : 0;
    c1[i] = any ? int(v[i].n_sink_vis) : 0;
  }
  size_t nb = 0;
  for (int64_t s0 = 0; s0 < n_sink; s0 += B) {
    PTLLM_CHECK(nb < max_blocks_);
    PlanBlock& k = out[nb];
    for (int i = 0; i < nt; ++i) {
      k.a[i] = int(std::clamp<int64_t>(v[i].sink_lo - s0, 0, B));
      k.b[i] = int(std::clamp<int64_t>(v[i].n_sink_vis - s0, 0, B));
      k.delta0[i] = q_slot[i] - s0;
    }
    if (!set_active(k, nt)) continue;
    k.block = kvdetail::Entry{L_.sinks[size_t(s0 / B)], false};
    k.col = int(s0);
    k.k_ahead = k.v_ahead = kvdetail::Entry{};
    k.near_end = false;
    ++nb;
  }
  return nb;
}

// Part 1 + k: the stream indices [(p0 + k) * part_len, (p0 + k + 1) * part_len).
size_t Plan::stream_blocks(const Visible* v, int nt, int part, PlanBlock* out, int* c0, int* c1) const {
  const int B = group_size_;
  const kvdetail::Ring& stream = L_.stream;
  const int64_t start = (p0_ + part - 1) * part_len_;  // stream index of column 0
  int64_t lo[kTile], hi[kTile], lo_all = std::numeric_limits<int64_t>::max(), hi_all = -1;
  for (int i = 0; i < nt; ++i) {
    part_range(v[i], part, lo[i], hi[i]);
    c0[i] = c1[i] = 0;
    if (lo[i] > hi[i]) continue;
    c0[i] = int(lo[i] - start);
    c1[i] = int(hi[i] + 1 - start);
    lo_all = std::min(lo_all, lo[i]);
    hi_all = std::max(hi_all, hi[i]);
  }
  if (hi_all < 0) return 0;
  size_t nb = 0;
  const size_t e0 = size_t((lo_all - L_.begin) / B), e_last = size_t((hi_all - L_.begin) / B);
  for (size_t e = e0; e < stream.size(); ++e) {
    const int64_t first_slot = L_.begin + int64_t(e) * B;
    if (first_slot > hi_all) break;
    PTLLM_CHECK(nb < max_blocks_);
    PlanBlock& k = out[nb];
    for (int i = 0; i < nt; ++i) {
      k.a[i] = int(std::clamp<int64_t>(lo[i] - first_slot, 0, B));
      k.b[i] = int(std::clamp<int64_t>(hi[i] + 1 - first_slot, 0, B));
      if (lo[i] > hi[i]) k.a[i] = k.b[i] = 0;
      // Distances of window keys equal their index distances in both position schemes.
      k.delta0[i] = v[i].si - first_slot;
    }
    if (!set_active(k, nt)) continue;
    k.block = stream[e];
    k.col = int(first_slot - start);
    // Two blocks ahead: a block's K (or V) is read in less time than memory takes to answer.
    k.near_end = e + 2 > e_last;
    const size_t ka = k.near_end ? e + 2 - (e_last - e0 + 1) : e + 2;
    k.k_ahead = ka < stream.size() ? stream[ka] : kvdetail::Entry{};
    k.v_ahead = e + 2 < stream.size() ? stream[e + 2] : kvdetail::Entry{};
    ++nb;
  }
  return nb;
}

}  // namespace ptllm::attn
