// The CPU executor of an attention plan (attention/cpu.h).
#include "kv/attention/cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/layout.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "kv/block_pool.h"

namespace ptllm::attn {
namespace {

using kvdetail::Entry;

// One per thread: see Executor::local_buffers.
std::vector<float>& attention_scratch() {
  thread_local std::vector<float> v;
  return v;
}

// A part's blocks (the first nb of `blocks`), planned once for both passes, and the spans handed to
// the kernels; one per thread (kept, so a decode step allocates nothing).
struct Walk {
  std::vector<PlanBlock> blocks;
  std::vector<KiviSpan> spans;
  static Walk& local() {
    thread_local Walk w;
    return w;
  }
};

// The online softmax state of the nq query heads of one KV head over some keys, in a float buffer:
// running max m [nq], sum l [nq], accumulated V zero-point term z [nq] (added to every channel at
// the end) and V accumulator acc [nq][D]. l == 0: no key seen yet.
struct State {
  float *m, *l, *z, *acc;
  State(float* p, int nq) : m(p), l(p + nq), z(p + 2 * nq), acc(p + 3 * nq) {}
  static size_t floats(int nq, int D) { return size_t(nq) * (size_t(D) + 3); }

  void reset(int nq, int D) {
    std::fill_n(m, nq, -std::numeric_limits<float>::infinity());
    std::fill_n(l, nq, 0.f);
    std::fill_n(z, nq, 0.f);
    std::fill_n(acc, size_t(nq) * size_t(D), 0.f);
  }

  // Folds in src, the state over later keys. An empty state takes src bit for bit.
  void merge(const State& src, int nq, int D) {
    for (int h = 0; h < nq; ++h) {
      if (src.l[h] == 0.f) continue;
      float* a = acc + size_t(h) * size_t(D);
      const float* b = src.acc + size_t(h) * size_t(D);
      if (l[h] == 0.f) {
        m[h] = src.m[h];
        l[h] = src.l[h];
        z[h] = src.z[h];
        std::copy_n(b, D, a);
        continue;
      }
      const float new_m = std::max(m[h], src.m[h]);
      const float c1 = std::exp(m[h] - new_m), c2 = std::exp(src.m[h] - new_m);
      m[h] = new_m;
      l[h] = l[h] * c1 + src.l[h] * c2;
      z[h] = z[h] * c1 + src.z[h] * c2;
      for (int d = 0; d < D; ++d) a[d] = a[d] * c1 + b[d] * c2;
    }
  }
};

// KV head g's K and V rows in a block (row: bytes of one): codes with their f16 scales and zeros
// when quantized (kivi_offsets), else rows of the dense dtype (K [H][B][D], then V the same).
struct Rows {
  const uint8_t *k = nullptr, *v = nullptr;
  size_t row = 0;
  const uint16_t *ks = nullptr, *kz = nullptr, *vs = nullptr, *vz = nullptr;
};

// Queries [j0, j1) of a block all seeing slots [a0, b0), or each query alone where they differ
// (the causal edge, the window's lower edge).
template <class Fn>
void for_runs(const PlanBlock& k, Fn&& fn) {
  if (k.same) {
    fn(k.i0, k.i1, k.a[k.i0], k.b[k.i0]);
  } else {
    for (int i = k.i0; i < k.i1; ++i)
      if (k.a[i] < k.b[i]) fn(i, i + 1, k.a[i], k.b[i]);
  }
}

// One part of one tile of queries for one KV head, being computed: its blocks and its buffers.
struct PartWork {
  int t0, nt, g;
  float* scores;  // [nt * group][ld], by slot in the part
  float* qb;      // [nt * group][D] queries (gathered or rotated)
  float* kr;      // [B][D] keys as float32 (rotated, cache positions)
  size_t ld;
  State st;
  const PlanBlock* blocks;  // [nb]
  size_t nb;
  const KiviSpan* spans;    // the spanned blocks' (spanned()), in order
};

// One attention call: the plan, the storage, and the sizes every piece of work shares.
class Executor {
 public:
  Executor(const Plan& plan, const CpuStorage& s, const float* q, int n_heads, float* out);
  void run(ThreadPool& pool);

 private:
  const uint8_t* data_of(const Entry& e) const {
    return e.quantized ? s_.quant->data(e.id) : s_.dense->data(e.id);
  }
  Rows rows_of(const uint8_t* blk, bool quantized, int g) const;
  const float* cos_at(int64_t delta) const {
    PTLLM_CHECK(delta >= 0 && delta < s_.max_delta);
    return s_.rope_cos + size_t(delta) * size_t(half_);
  }
  const float* sin_at(int64_t delta) const { return s_.rope_sin + size_t(delta) * size_t(half_); }
  const float* query(int t, int g) const {  // [group][D]
    return q_ + (size_t(t) * size_t(n_heads_) + size_t(g) * size_t(group_)) * size_t(D_);
  }
  // Runs of consecutive quantized blocks read as stored (no rotation), each seen alike by every query
  // of the call, go to the span kernels in one call.
  bool spanned(const PlanBlock& k) const { return k.block.quantized && !s_.rotate && k.same; }
  float* local_buffers() const;
  const uint8_t* ahead(const Entry& e, int g, bool values, int a0, bool scales = true) const;

  void run_part(int t0, int nt, int g, int part, State st, float* scratch) const;
  void build_spans(const PartWork& w, Walk& walk) const;
  template <class One, class Many>
  void for_each(const PartWork& w, One&& one, Many&& many) const;
  void rotate(const PartWork& w, const PlanBlock& k, const Rows& cur, int lo, int hi) const;
  void score(const PartWork& w, const PlanBlock& k) const;
  void softmax(const PartWork& w, const int* c0, const int* c1) const;
  void sum_values(const PartWork& w, const PlanBlock& k) const;
  void write_out(int t0, int nt, int g, const State& st) const;
  void run_decode(ThreadPool& pool);
  void run_prefill(ThreadPool& pool);

  const Plan& plan_;
  const CpuStorage& s_;
  const float* q_;  // [T][n_heads][D]
  float* out_;      // [T][n_heads][D]
  int n_heads_, B_, D_, H_, half_, group_;
  float scale_;
  size_t dense_half_;  // bytes of a dense block's K (V follows)
  size_t elem_, pk_;   // bytes of a dense element, of a row of KIVI codes
  size_t state_floats_, tile_heads_, scratch_floats_, tile_state_floats_;
};

Executor::Executor(const Plan& plan, const CpuStorage& s, const float* q, int n_heads, float* out)
    : plan_(plan), s_(s), q_(q), out_(out), n_heads_(n_heads), B_(s.group_size), D_(s.head_dim), H_(s.n_kv_heads),
      half_(s.head_dim / 2) {
  PTLLM_CHECK(H_ > 0 && n_heads % H_ == 0 && s.group_size == B_);
  group_ = n_heads / H_;
  scale_ = 1.0f / std::sqrt(float(D_));
  elem_ = dtype_size(s.dense_dtype);
  dense_half_ = size_t(B_) * size_t(H_) * size_t(D_) * elem_;
  pk_ = s.bits ? packed_bytes(D_, s.bits) : 0;
  state_floats_ = State::floats(group_, D_);
  // Per-thread scratch: [kTile][group][part_cols] scores (a part's stream tokens, or the sinks),
  // [kTile][group][D] queries (gathered or rotated), [B][D] keys as float32 (rotated, cache positions).
  tile_heads_ = size_t(kTile) * size_t(group_);
  scratch_floats_ = tile_heads_ * size_t(plan.part_cols()) + tile_heads_ * size_t(D_) + size_t(B_) * size_t(D_);
  tile_state_floats_ = State::floats(int(tile_heads_), D_);
}

Rows Executor::rows_of(const uint8_t* blk, bool quantized, int g) const {
  if (!quantized) {
    const uint8_t* k = blk + size_t(g) * size_t(B_) * size_t(D_) * elem_;
    return Rows{k, k + dense_half_, size_t(D_) * elem_};
  }
  const KiviOffsets o = kivi_offsets(g, H_, B_, D_, pk_);
  auto u16 = [&](size_t off) { return reinterpret_cast<const uint16_t*>(blk + off); };
  return Rows{blk + o.kc, blk + o.vc, pk_, u16(o.ks), u16(o.kz), u16(o.vs), u16(o.vz)};
}

// Each thread's scratch, then a part's state, then the running one. Obtained through a function call
// on the thread that uses it: a block-scope thread_local is only constructed (and destroyed at thread
// exit) on threads that pass its declaration, which pool workers running a lambda do not.
float* Executor::local_buffers() const {
  std::vector<float>& local = attention_scratch();
  const size_t need = scratch_floats_ + 2 * tile_state_floats_ + 15;
  if (local.size() < need) local.resize(need);
  // From a 64-byte boundary: the kernels' full-register loads and stores of scores and queries
  // never straddle two cache lines.
  const uintptr_t a = reinterpret_cast<uintptr_t>(local.data());
  return local.data() + ((64 - a % 64) % 64) / sizeof(float);
}

// Prefetch: a head's K (or V) in a block is a few KB, one page or less, and blocks are not adjacent,
// so the hardware prefetchers (which follow a stream within a page) would start each block cold and
// attention over a cache larger than the last-level cache would wait on memory. While the keys of a
// block are scored (or their values summed), the kernels ask for the rows read two blocks later
// (PlanBlock::k_ahead, v_ahead), a few lines per row read: a steady trickle ahead (asking for a whole
// block at once fills the core's miss buffers and stalls it). Their scales (a line or two each) are
// asked for here (blocks one at a time) or by the span kernels.
// Block e's K (values: V) rows of KV head g from slot a0, with their scales asked for (unless not
// `scales`: the span kernels ask for those themselves); null when there is no block.
const uint8_t* Executor::ahead(const Entry& e, int g, bool values, int a0, bool scales) const {
  if (e.id < 0) return nullptr;
  const Rows r = rows_of(data_of(e), e.quantized, g);
  if (e.quantized && scales) {
    if (values)
      prefetch_f16(r.vs, B_), prefetch_f16(r.vz, B_);
    else
      prefetch_f16(r.ks, D_), prefetch_f16(r.kz, D_);
  }
  return (values ? r.v : r.k) + size_t(a0) * r.row;
}

// The states of the heads of KV head g of queries [t0, t0 + nt) over part `part`, into st
// (nt * group heads, query i's heads at [i * group, (i + 1) * group)), in three passes over the
// part's blocks: the scores of all its keys (the part is at most kPartTokens wide, so they stay in
// the first-level cache), one softmax over them per head, then the values. Against an online
// softmax block by block this leaves one max and one exp pass per head and part instead of one per
// block (at int4 those took half as long as the scores), and no rescaling of the accumulators.
// Spanned blocks go to the span kernels a run at a time (a decode step: all the part's quantized
// blocks), one call a pass instead of one a block, accumulators kept in registers between blocks;
// other blocks, one at a time. Either way the same sums in the same order.
void Executor::run_part(int t0, int nt, int g, int part, State st, float* scratch) const {
  PartWork w{t0, nt, g, scratch, nullptr, nullptr, size_t(plan_.part_cols()), st, nullptr, 0, nullptr};
  w.qb = w.scores + tile_heads_ * w.ld;
  w.kr = w.qb + tile_heads_ * size_t(D_);
  st.reset(nt * group_, D_);
  if (!s_.rotate)
    for (int i = 0; i < nt; ++i)
      std::copy_n(query(t0 + i, g), size_t(group_) * size_t(D_), w.qb + size_t(i) * size_t(group_) * size_t(D_));
  // The part's blocks in order, planned in place (no copies: a block is ~180 bytes); query i sees
  // columns [c0[i], c1[i]) of the scores.
  Walk& walk = Walk::local();
  const size_t most = plan_.max_blocks();  // sized once: decode allocates nothing
  if (walk.blocks.size() < most) walk.blocks.resize(most);
  walk.spans.reserve(most);
  int c0[kTile], c1[kTile];
  w.nb = plan_.blocks(t0, nt, part, walk.blocks.data(), c0, c1);
  w.blocks = walk.blocks.data();
  build_spans(w, walk);
  w.spans = walk.spans.data();
  for_each(w, [&](const PlanBlock& k) { score(w, k); }, [&](int h0, int nq, const KiviSpan* sp, int ns) {
    kivi_k_spans(w.qb + size_t(h0) * size_t(D_), nq, sp, ns, B_, scale_, D_, s_.bits, w.scores + size_t(h0) * w.ld,
                 int(w.ld));
  });
  softmax(w, c0, c1);
  for_each(w, [&](const PlanBlock& k) { sum_values(w, k); }, [&](int h0, int nq, const KiviSpan* sp, int ns) {
    kivi_v_spans(w.scores + size_t(h0) * w.ld, int(w.ld), nq, sp, ns, D_, s_.bits, w.st.acc + size_t(h0) * size_t(D_),
                 w.st.z + h0);
  });
}

// The spans of the spanned blocks, in order, built once for both passes.
void Executor::build_spans(const PartWork& w, Walk& walk) const {
  walk.spans.clear();
  for (size_t i = 0; i < w.nb; ++i) {
    const PlanBlock& b = w.blocks[i];
    if (!spanned(b)) continue;
    const int a0 = b.a[b.i0];
    const Rows r = rows_of(data_of(b.block), true, w.g);
    KiviSpan& sp = walk.spans.emplace_back();  // filled in place (a copy would stall on store forwarding)
    sp.k = r.k;
    sp.k0 = a0;
    sp.v = r.v + size_t(a0) * pk_;
    sp.ks = r.ks;
    sp.kz = r.kz;
    sp.vs = r.vs + a0;
    sp.vz = r.vz + a0;
    sp.n = b.b[b.i0] - a0;
    sp.col = b.col + a0;
    // The rows two blocks ahead, from the list where they are in it (the same as `ahead` finds).
    const PlanBlock* b2 = i + 2 < w.nb ? &w.blocks[i + 2] : nullptr;
    if (!b.near_end && b2 && b2->block.quantized) {
      const Rows r2 = rows_of(data_of(b2->block), true, w.g);
      sp.k_next = r2.k;
      sp.v_next = r2.v + size_t(a0) * pk_;
    } else {
      sp.k_next = ahead(b.k_ahead, w.g, b.near_end, b.near_end ? a0 : 0, false);
      sp.v_next = ahead(b.v_ahead, w.g, !b.near_end, a0, false);
    }
  }
}

// The part's blocks in order: one(block) for each block read alone, many(h0, nq, spans, n) for each
// run of spanned blocks seen by the same queries.
template <class One, class Many>
void Executor::for_each(const PartWork& w, One&& one, Many&& many) const {
  size_t sp = 0;  // the next span
  for (size_t i = 0; i < w.nb;) {
    const PlanBlock& k = w.blocks[i];
    if (!spanned(k)) {
      one(k);
      ++i;
      continue;
    }
    const size_t s0 = sp;
    for (; i < w.nb && spanned(w.blocks[i]) && w.blocks[i].i0 == k.i0 && w.blocks[i].i1 == k.i1; ++i) ++sp;
    many(k.i0 * group_, (k.i1 - k.i0) * group_, w.spans + s0, int(sp - s0));
  }
}

// Cache positions: the score of key slot j is R(delta0 - j) q . k_j = R(delta0) q . R(j) k_j (RoPE
// depends only on the difference), so the block's keys of slots [lo, hi) (as float32, in kr) are
// rotated by j once for every head and each query once per block, instead of each query once per key.
void Executor::rotate(const PartWork& w, const PlanBlock& k, const Rows& cur, int lo, int hi) const {
  float* k0 = w.kr + size_t(lo) * size_t(D_);
  if (k.block.quantized)
    kivi_k_dequant(KRows{cur.k, B_, lo}, cur.ks, cur.kz, hi - lo, D_, s_.bits, k0);
  else
    load_from(cur.k + size_t(lo) * cur.row, s_.dense_dtype, k0, (hi - lo) * D_);
  for (int j = lo; j < hi; ++j) {
    float* kj = w.kr + size_t(j) * size_t(D_);
    rope_rotate_one(kj, D_, cos_at(j), sin_at(j), kj);  // in place
  }
  for (int i = k.i0; i < k.i1; ++i) {
    if (k.a[i] >= k.b[i]) continue;
    const float *c = cos_at(k.delta0[i]), *sn = sin_at(k.delta0[i]);
    for (int r = 0; r < group_; ++r)
      rope_rotate_one(query(w.t0 + i, w.g) + size_t(r) * size_t(D_), D_, c, sn,
                      w.qb + (size_t(i) * size_t(group_) + size_t(r)) * size_t(D_));
  }
}

// Pass 1: scores. Quantized: q.k_j = (q * s) . c_j + q . z with per-channel (s, z), the softmax
// scale folded in.
void Executor::score(const PartWork& w, const PlanBlock& k) const {
  const int lo = *std::min_element(k.a + k.i0, k.a + k.i1), hi = *std::max_element(k.b + k.i0, k.b + k.i1);
  const Rows cur = rows_of(data_of(k.block), k.block.quantized, w.g);
  if (s_.rotate) rotate(w, k, cur, lo, hi);
  for_runs(k, [&](int j0, int j1, int a0, int b0) {
    const int n = b0 - a0, h0 = j0 * group_, nq = (j1 - j0) * group_;
    float* sc = w.scores + size_t(h0) * w.ld + size_t(k.col + a0);
    const float* qq = w.qb + size_t(h0) * size_t(D_);
    // (Quantized K rows ahead: the group's, from its first key.)
    const uint8_t* nk = ahead(k.k_ahead, w.g, k.near_end, k.block.quantized && !k.near_end ? 0 : a0);
    if (s_.rotate)
      dense_k_block(qq, nq, w.kr + size_t(a0) * size_t(D_), DType::F32, scale_, n, D_, sc, int(w.ld));
    else if (k.block.quantized)
      kivi_k_block(qq, nq, KRows{cur.k, B_, a0}, cur.ks, cur.kz, scale_, n, D_, s_.bits, sc, int(w.ld), nk);
    else
      dense_k_block(qq, nq, cur.k + size_t(a0) * cur.row, s_.dense_dtype, scale_, n, D_, sc, int(w.ld), nk);
  });
}

// Pass 2: each head's softmax numerators e^(x - m) over its columns [c0, c1), in place, and their sum.
void Executor::softmax(const PartWork& w, const int* c0, const int* c1) const {
  for (int i = 0; i < w.nt; ++i) {
    const int n = c1[i] - c0[i];
    if (n <= 0) continue;
    for (int r = 0; r < group_; ++r) {
      const int h = i * group_ + r;
      float* x = w.scores + size_t(h) * w.ld + size_t(c0[i]);
      w.st.m[h] = max_of(x, n);
      w.st.l[h] = exp_sum(x, n, w.st.m[h]);
    }
  }
}

// Pass 3: values (quantized: sum p_j v_j = sum (p_j s_j) c_j + (sum p_j z_j) 1 with per-token
// (s_j, z_j)).
void Executor::sum_values(const PartWork& w, const PlanBlock& k) const {
  const Rows cur = rows_of(data_of(k.block), k.block.quantized, w.g);
  for_runs(k, [&](int j0, int j1, int a0, int b0) {
    const int n = b0 - a0, h0 = j0 * group_, nq = (j1 - j0) * group_;
    const float* p = w.scores + size_t(h0) * w.ld + size_t(k.col + a0);
    const uint8_t* nv = ahead(k.v_ahead, w.g, !k.near_end, a0);
    float* acc = w.st.acc + size_t(h0) * size_t(D_);
    if (k.block.quantized)
      kivi_v_block(p, int(w.ld), nq, cur.v + size_t(a0) * cur.row, cur.vs + a0, cur.vz + a0, n, D_, s_.bits, acc,
                   w.st.z + h0, nv);
    else
      dense_v_block(p, int(w.ld), nq, cur.v + size_t(a0) * cur.row, s_.dense_dtype, n, D_, acc, nv);
  });
}

// Query t0 + i's heads of KV head g, from the state of the tile.
void Executor::write_out(int t0, int nt, int g, const State& st) const {
  for (int i = 0; i < nt; ++i)
    for (int r = 0; r < group_; ++r) {
      const int h = i * group_ + r;
      float* o = out_ + (size_t(t0 + i) * size_t(n_heads_) + size_t(g) * size_t(group_) + size_t(r)) * size_t(D_);
      const float* acc = st.acc + size_t(h) * size_t(D_);
      const float inv = 1.0f / st.l[h];
      for (int d = 0; d < D_; ++d) o[d] = (acc[d] + st.z[h]) * inv;
    }
}

// Few (token, KV head) pairs (decode): every part is a piece of work, merged afterwards in order.
void Executor::run_decode(ThreadPool& pool) {
  const size_t items = size_t(plan_.queries()) * size_t(H_), n_parts = size_t(plan_.parts());
  thread_local std::vector<float> parts;  // [T][H][n_parts] states
  const size_t need = items * n_parts * state_floats_;
  if (parts.size() < need) parts.resize(need);
  float* pbuf = parts.data();
  pool.parallel_for(items * n_parts, [&](size_t begin, size_t end) {
    float* buf = local_buffers();
    for (size_t it = begin; it < end; ++it) {
      const int t = int(it / (size_t(H_) * n_parts)), g = int(it / n_parts % size_t(H_));
      const int part = int(it % n_parts);
      State st(pbuf + it * state_floats_, group_);
      if (plan_.sees_part(t, part))
        run_part(t, 1, g, part, st, buf);
      else
        st.reset(group_, D_);
    }
  });
  float* buf = local_buffers();
  State run(buf + scratch_floats_ + tile_state_floats_, group_);
  for (size_t it = 0; it < items; ++it) {
    run.reset(group_, D_);
    for (size_t part = 0; part < n_parts; ++part)
      run.merge(State(pbuf + (it * n_parts + part) * state_floats_, group_), group_, D_);
    write_out(int(it / size_t(H_)), 1, int(it % size_t(H_)), run);
  }
}

// (tile of kTile tokens, KV head) pieces, each walking its parts in order. A block of which all the
// tile's queries see the same slots is read from memory once for their tile * group heads (and
// converted or unpacked once per kernel pass of 4 heads); where their slots differ each query takes
// the block alone. Per head, the kernels' arithmetic does not depend on which other heads share the
// call, so a token's output is bit for bit the same in any tile, batch or thread.
void Executor::run_prefill(ThreadPool& pool) {
  const int T = plan_.queries();
  const size_t n_tiles = size_t(kvdetail::ceil_div(T, kTile));
  pool.parallel_for(n_tiles * size_t(H_), [&](size_t begin, size_t end) {
    float* buf = local_buffers();
    for (size_t it = begin; it < end; ++it) {
      const int t0 = int(it / size_t(H_)) * kTile, g = int(it % size_t(H_));
      const int nt = std::min(kTile, T - t0), nh = nt * group_;
      State part_st(buf + scratch_floats_, nh), run(buf + scratch_floats_ + tile_state_floats_, nh);
      run.reset(nh, D_);
      for (int part = 0; part < plan_.parts(); ++part) {
        bool seen = false;
        for (int i = 0; i < nt && !seen; ++i) seen = plan_.sees_part(t0 + i, part);
        if (!seen) continue;
        run_part(t0, nt, g, part, part_st, buf);
        run.merge(part_st, nh, D_);
      }
      write_out(t0, nt, g, run);
    }
  });
}

void Executor::run(ThreadPool& pool) {
  const size_t items = size_t(plan_.queries()) * size_t(H_);
  if (pool.size() > 1 && items < 4 * size_t(pool.size()))
    run_decode(pool);
  else
    run_prefill(pool);
}

}  // namespace

void attend_cpu(const Plan& plan, const CpuStorage& s, const float* q, int n_heads, float* out, ThreadPool& pool) {
  Executor(plan, s, q, n_heads, out).run(pool);
}

}  // namespace ptllm::attn
