// KVCache::attend: causal attention over the stored blocks on the CPU (wave 1's kernels).
#include "kv/cache_internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/quant.h"

namespace ptllm {

using namespace kvdetail;

// ---------------------------------------------------------------------------------------------
// Attention.
//
// Work is cut into (query tokens, KV head, part) pieces. The `group` query heads sharing a KV head
// are processed together, and in prefill those of a tile of consecutive tokens: a block's rows are
// converted (dense_*_block) or its codes unpacked (kivi_*_block) once for all of them. Cache
// positions rotate each block's keys once (dequantized into a per-thread buffer when quantized)
// and the query once per block. A query's keys are cut into parts: one for the sinks, then the
// stream tokens by absolute index in runs of kPartTokens; each part has its own online softmax, and the parts are
// merged in order at the end (flash-decoding, Dao et al. 2023), so a single decode token keeps
// every thread busy even with 2 KV heads. Parts depend only on token indices, never on T or the
// thread count, and are computed and merged the same way whether one thread walks them all or
// they are spread over the pool: a token's output is bit for bit the same however a prompt was
// batched (the prompt cache relies on it: tests/test_prompt_cache.cpp).

namespace {

// One per thread: see local_buffers in KVCache::attend.
std::vector<float>& attention_scratch() {
  thread_local std::vector<float> v;
  return v;
}

// Stream tokens per part: a 4K-token decode step is 4 parts per KV head, enough to spread over a
// few threads, while what a part costs besides its keys (walking its blocks, one max and exp call
// per head, merging: O(D) per head) stays small next to reading 1024 keys, and its scores (4 heads
// x 4 KB) stay in the first-level cache. bench_attention int4 at 16K: 171 -> 164 us against 512
// (fp32 unchanged); 2048 no faster.
constexpr int kPartTokens = 1024;

// Prefill walks the keys for a tile of up to kTile consecutive query tokens at once (KVCache::attend).
constexpr int kTile = 8;

// A block of a part, for queries [i0, i1) of the tile: query i sees slots [a[i], b[i]) of it
// (empty: a >= b), key slot j at distance delta0[i] - j; its slot 0 is column col of the scores.
struct WalkBlock {
  const uint8_t* data;
  bool quantized;
  int i0, i1, col;
  int a[kTile], b[kTile];
  int64_t delta0[kTile];
  // What the kernels ask for while they read this block (null: nothing): rows of the block read
  // two blocks later. Scoring, its K rows; summing values, its V rows. Near the part's end
  // (near_end) the other way round: scoring asks for the first blocks' V rows (the values pass
  // starts there), summing values for the next part's K rows.
  const Entry *k_ahead, *v_ahead;
  bool near_end;
  // Every query of [i0, i1) sees the same slots [a[i0], b[i0]).
  bool same;
};

// A part's blocks (the first of `blocks`), walked once for both passes, and the spans handed to the
// kernels; one per thread (kept, so a decode step allocates nothing).
struct Walk {
  std::vector<WalkBlock> blocks;
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

}  // namespace

void KVCache::attend(int layer, const float* q, int T, int n_heads, float* out, ThreadPool& pool) {
  const Layer& L = layers_[size_t(layer)];
  const int B = cfg_.group_size, D = shape_.head_dim, H = shape_.n_kv_heads, half = D / 2;
  const int N = cfg_.sink, M = cfg_.window;
  const bool stream_mode = cfg_.streaming();
  const int64_t win = L.window, native = L.native;
  const bool rotate = rotates_at_read();
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t n_total = L.n_sink + L.end;
  const int64_t n_before = n_total - T;
  const size_t elem = dtype_size(dense_);
  const size_t dense_half = size_t(B) * size_t(shape_.kv_dim()) * elem;
  const size_t pk = bits_ ? packed_bytes(D, bits_) : 0;
  PTLLM_CHECK(n_before >= 0 && n_heads % H == 0);
  const int group = n_heads / H;
  const size_t state_floats = State::floats(group, D);

  // What query t sees: sinks [sink_lo, n_sink_vis) (none when empty), stream indices [lo, si] (none
  // when si < lo). A sliding layer sees a sink only while it is within its window (the intersection
  // with what StreamingLLM keeps).
  struct Visible {
    int64_t sink_lo, n_sink_vis, lo, si;
  };
  auto visible = [&](int t) {
    const int64_t i = n_before + t;  // global index of the query
    Visible v{native > 0 ? std::max<int64_t>(0, i - native + 1) : 0, std::min<int64_t>(L.n_sink, i + 1), 0, -1};
    if (i >= L.n_sink) {
      v.si = i - L.n_sink;
      v.lo = win > 0 ? std::max<int64_t>(0, v.si - win + 1) : 0;
      PTLLM_CHECK(v.lo >= L.begin);
    }
    return v;
  };
  // Part 0 holds the sinks; part 1 + k the stream indices [(p0 + k) * part_len, (p0 + k + 1) * part_len).
  const int64_t part_len = int64_t(std::max(1, kPartTokens / B)) * B;
  const Visible first = visible(0), last = visible(T - 1);
  // Queries are consecutive: when the first is a sink, the first stream query sees stream index 0.
  const int64_t p0 = first.si >= 0 ? first.lo / part_len : 0;
  const int n_parts = 1 + (last.si >= 0 ? int(last.si / part_len - p0 + 1) : 0);
  // Stream indices [a, b] of part `part` that query t sees (empty when b < a).
  auto part_range = [&](const Visible& v, int part, int64_t& a, int64_t& b) {
    const int64_t start = (p0 + part - 1) * part_len;
    a = std::max(v.lo, start);
    b = std::min(v.si, start + part_len - 1);
  };
  auto sees_part = [&](int t, int part) {
    const Visible v = visible(t);
    if (part == 0) return v.n_sink_vis > v.sink_lo;
    int64_t a, b;
    part_range(v, part, a, b);
    return a <= b;
  };

  // Prefill walks the keys for a tile of up to kTile consecutive query tokens at once (per KV head):
  // a block of which all the tile's queries see the same slots is read from memory once for their
  // tile * group heads (and converted or unpacked once per kernel pass of 4 heads); where their
  // slots differ (the causal edge, the window's lower edge) each query takes the block alone. Per
  // head, the kernels' arithmetic does not depend on which other heads share the call, so a token's
  // output is bit for bit the same in any tile, batch or thread.
  // Per-thread scratch: [kTile][group][part_cols] scores (a part's stream tokens, or the sinks),
  // [kTile][group][D] queries (gathered or rotated), [B][D] keys as float32 (rotated, cache positions).
  const int part_cols = int(std::max<int64_t>(part_len, int64_t(ceil_div(N, B)) * B));
  const size_t tile_heads = size_t(kTile) * size_t(group);
  const size_t scratch_floats = tile_heads * size_t(part_cols) + tile_heads * size_t(D) + size_t(B) * size_t(D);
  const size_t tile_state_floats = State::floats(int(tile_heads), D);
  auto cos_at = [&](int64_t delta) {
    PTLLM_CHECK(delta >= 0 && delta < max_delta_);
    return rope_cos_.data() + size_t(delta) * size_t(half);
  };
  auto sin_at = [&](int64_t delta) { return rope_sin_.data() + size_t(delta) * size_t(half); };
  auto query = [&](int t, int g) {  // [group][D]
    return q + (size_t(t) * size_t(n_heads) + size_t(g) * size_t(group)) * size_t(D);
  };

  // KV head g's K and V rows in a block (row: bytes of one): codes with their f16 scales and zeros
  // when quantized (kivi_offsets), else rows of dense_ (K [H][B][D], then V the same).
  struct Rows {
    const uint8_t *k = nullptr, *v = nullptr;
    size_t row = 0;
    const uint16_t *ks = nullptr, *kz = nullptr, *vs = nullptr, *vz = nullptr;
  };
  auto rows_of = [&](const uint8_t* blk, bool quantized, int g) {
    if (!quantized) {
      const uint8_t* k = blk + size_t(g) * size_t(B) * size_t(D) * elem;
      return Rows{k, k + dense_half, size_t(D) * elem};
    }
    const KiviOffsets o = kivi_offsets(g, H, B, D, pk);
    auto u16 = [&](size_t off) { return reinterpret_cast<const uint16_t*>(blk + off); };
    return Rows{blk + o.kc, blk + o.vc, pk, u16(o.ks), u16(o.kz), u16(o.vs), u16(o.vz)};
  };

  // The states of the heads of KV head g of queries [t0, t0 + nt) over part `part`, into st
  // (nt * group heads, query i's heads at [i * group, (i + 1) * group)), in three passes over the
  // part's blocks: the scores of all its keys (the part is at most kPartTokens wide, so they stay in
  // the first-level cache), one softmax over them per head, then the values. Against an online
  // softmax block by block this leaves one max and one exp pass per head and part instead of one per
  // block (at int4 those took half as long as the scores), and no rescaling of the accumulators.
  auto run_part = [&](int t0, int nt, int g, int part, State st, float* scratch) {
    const int nh = nt * group;
    float* scores = scratch;                               // [nt * group][part_cols], by slot in the part
    float* qb = scores + tile_heads * size_t(part_cols);   // [nt * group][D]
    float* kr = qb + tile_heads * size_t(D);               // [B][D]
    const size_t ld = size_t(part_cols);
    st.reset(nh, D);
    if (!rotate)
      for (int i = 0; i < nt; ++i)
        std::copy_n(query(t0 + i, g), size_t(group) * size_t(D), qb + size_t(i) * size_t(group) * size_t(D));

    auto data_of = [&](const Entry& e) { return e.quantized ? quant_pool_.data(e.id) : dense_pool_.data(e.id); };
    // Queries [j0, j1) of a block all seeing slots [a0, b0), or each query alone where they differ
    // (the causal edge, the window's lower edge).
    auto for_runs = [&](const WalkBlock& k, auto&& fn) {
      if (k.same) {
        fn(k.i0, k.i1, k.a[k.i0], k.b[k.i0]);
      } else {
        for (int i = k.i0; i < k.i1; ++i)
          if (k.a[i] < k.b[i]) fn(i, i + 1, k.a[i], k.b[i]);
      }
    };
    // Prefetch: a head's K (or V) in a block is a few KB, one page or less, and blocks are not
    // adjacent, so the hardware prefetchers (which follow a stream within a page) would start each
    // block cold and attention over a cache larger than the last-level cache would wait on memory.
    // While the keys of a block are scored (or their values summed), the kernels ask for the rows read
    // two blocks later (Block), a few lines per row read: a steady trickle ahead (asking for a whole
    // block at once fills the core's miss buffers and stalls it). Their scales (a line or two each)
    // are asked for here (blocks one at a time) or by the span kernels.
    // Entry e's K (values: V) rows from slot a0, with their scales asked for (unless not `scales`:
    // the span kernels ask for those themselves); null when e is.
    auto ahead = [&](const Entry* e, bool values, int a0, bool scales = true) -> const uint8_t* {
      if (!e) return nullptr;
      const Rows r = rows_of(data_of(*e), e->quantized, g);
      if (e->quantized && scales) {
        if (values)
          prefetch_f16(r.vs, B), prefetch_f16(r.vz, B);
        else
          prefetch_f16(r.ks, D), prefetch_f16(r.kz, D);
      }
      return (values ? r.v : r.k) + size_t(a0) * r.row;
    };

    // Pass 1: scores. Quantized: q.k_j = (q * s) . c_j + q . z with per-channel (s, z), the softmax
    // scale folded in. Cache positions: the score of key slot j is R(delta0 - j) q . k_j =
    // R(delta0) q . R(j) k_j (RoPE depends only on the difference), so the block's keys (as float32,
    // in kr) are rotated by j once for every head and each query once per block, instead of each
    // query once per key.
    auto score = [&](const WalkBlock& k) {
      const int lo = *std::min_element(k.a + k.i0, k.a + k.i1), hi = *std::max_element(k.b + k.i0, k.b + k.i1);
      const Rows cur = rows_of(k.data, k.quantized, g);
      if (rotate) {
        float* k0 = kr + size_t(lo) * size_t(D);
        if (k.quantized)
          kivi_k_dequant(KRows{cur.k, B, lo}, cur.ks, cur.kz, hi - lo, D, bits_, k0);
        else
          load_from(cur.k + size_t(lo) * cur.row, dense_, k0, (hi - lo) * D);
        for (int j = lo; j < hi; ++j) {
          float* kj = kr + size_t(j) * size_t(D);
          rope_rotate_one(kj, D, cos_at(j), sin_at(j), kj);  // in place
        }
        for (int i = k.i0; i < k.i1; ++i) {
          if (k.a[i] >= k.b[i]) continue;
          const float *c = cos_at(k.delta0[i]), *sn = sin_at(k.delta0[i]);
          for (int r = 0; r < group; ++r)
            rope_rotate_one(query(t0 + i, g) + size_t(r) * size_t(D), D, c, sn,
                            qb + (size_t(i) * size_t(group) + size_t(r)) * size_t(D));
        }
      }
      for_runs(k, [&](int j0, int j1, int a0, int b0) {
        const int n = b0 - a0, h0 = j0 * group, nq = (j1 - j0) * group;
        float* sc = scores + size_t(h0) * ld + size_t(k.col + a0);
        const float* qq = qb + size_t(h0) * size_t(D);
        // (Quantized K rows ahead: the group's, from its first key.)
        const uint8_t* nk = ahead(k.k_ahead, k.near_end, k.quantized && !k.near_end ? 0 : a0);
        if (rotate)
          dense_k_block(qq, nq, kr + size_t(a0) * size_t(D), DType::F32, scale, n, D, sc, int(ld));
        else if (k.quantized)
          kivi_k_block(qq, nq, KRows{cur.k, B, a0}, cur.ks, cur.kz, scale, n, D, bits_, sc, int(ld), nk);
        else
          dense_k_block(qq, nq, cur.k + size_t(a0) * cur.row, dense_, scale, n, D, sc, int(ld), nk);
      });
    };
    // Pass 3: values (quantized: sum p_j v_j = sum (p_j s_j) c_j + (sum p_j z_j) 1 with per-token
    // (s_j, z_j)).
    auto sum_values = [&](const WalkBlock& k) {
      const Rows cur = rows_of(k.data, k.quantized, g);
      for_runs(k, [&](int j0, int j1, int a0, int b0) {
        const int n = b0 - a0, h0 = j0 * group, nq = (j1 - j0) * group;
        const float* p = scores + size_t(h0) * ld + size_t(k.col + a0);
        const uint8_t* nv = ahead(k.v_ahead, !k.near_end, a0);
        float* acc = st.acc + size_t(h0) * size_t(D);
        if (k.quantized)
          kivi_v_block(p, int(ld), nq, cur.v + size_t(a0) * cur.row, cur.vs + a0, cur.vz + a0, n, D, bits_, acc,
                       st.z + h0, nv);
        else
          dense_v_block(p, int(ld), nq, cur.v + size_t(a0) * cur.row, dense_, n, D, acc, nv);
      });
    };

    Visible v[kTile];
    // The query's slot in the cache: its index, capped once StreamingLLM's window is full. Not on a
    // sliding layer: its keys are all within its window, where cache slots and indices are the same
    // distance apart, and a sink it sees keeps its true distance too (the one the model was trained on).
    int64_t q_slot[kTile];
    const bool cap_slot = stream_mode && native == 0;
    for (int i = 0; i < nt; ++i) {
      v[i] = visible(t0 + i);
      q_slot[i] = cap_slot ? std::min<int64_t>(n_before + t0 + i, int64_t(N) + M - 1) : n_before + t0 + i;
    }
    // Queries [i0, i1) of the tile that see some of a block: an interval, since both ends of the
    // visible range grow with the query index.
    auto active = [&](WalkBlock& k) {
      k.i0 = 0;
      while (k.i0 < nt && k.a[k.i0] >= k.b[k.i0]) ++k.i0;
      k.i1 = k.i0;
      while (k.i1 < nt && k.a[k.i1] < k.b[k.i1]) ++k.i1;
      for (int i = k.i1; i < nt; ++i) PTLLM_CHECK(k.a[i] >= k.b[i]);
      k.same = true;
      for (int i = k.i0; i < k.i1; ++i) k.same = k.same && k.a[i] == k.a[k.i0] && k.b[i] == k.b[k.i0];
      return k.i0 < k.i1;
    };
    // The part's blocks in order, written in place into walk.blocks [0, nb) (no copies: a block is
    // ~180 bytes); query i sees columns [c0[i], c1[i]) of the scores.
    int c0[kTile], c1[kTile];
    Walk& walk = Walk::local();
    const size_t most = ceil_div(part_cols, B) + 1;  // blocks a part can touch (sized once: decode allocates nothing)
    if (walk.blocks.size() < most) walk.blocks.resize(most);
    walk.spans.reserve(most);
    size_t nb = 0;
    auto collect = [&] {
      if (part == 0) {
        // Sinks: global indices [sink_lo, n_sink_vis), cache slot = index.
        int64_t n_sink = 0;
        for (int i = 0; i < nt; ++i) {
          const bool any = v[i].sink_lo < v[i].n_sink_vis;
          n_sink = std::max(n_sink, v[i].n_sink_vis);
          c0[i] = any ? int(v[i].sink_lo) : 0;
          c1[i] = any ? int(v[i].n_sink_vis) : 0;
        }
        for (int64_t s0 = 0; s0 < n_sink; s0 += B) {
          WalkBlock& k = walk.blocks[nb];
          for (int i = 0; i < nt; ++i) {
            k.a[i] = int(std::clamp<int64_t>(v[i].sink_lo - s0, 0, B));
            k.b[i] = int(std::clamp<int64_t>(v[i].n_sink_vis - s0, 0, B));
            k.delta0[i] = q_slot[i] - s0;
          }
          if (!active(k)) continue;
          k.data = dense_pool_.data(L.sinks[size_t(s0 / B)]);
          k.quantized = false;
          k.col = int(s0);
          k.k_ahead = k.v_ahead = nullptr;
          k.near_end = false;
          ++nb;
        }
        return;
      }
      const int64_t start = (p0 + part - 1) * part_len;  // stream index of column 0
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
      if (hi_all < 0) return;
      const size_t e0 = size_t((lo_all - L.begin) / B), e_last = size_t((hi_all - L.begin) / B);
      for (size_t e = e0; e < L.stream.size(); ++e) {
        const int64_t first_slot = L.begin + int64_t(e) * B;
        if (first_slot > hi_all) break;
        WalkBlock& k = walk.blocks[nb];
        for (int i = 0; i < nt; ++i) {
          k.a[i] = int(std::clamp<int64_t>(lo[i] - first_slot, 0, B));
          k.b[i] = int(std::clamp<int64_t>(hi[i] + 1 - first_slot, 0, B));
          if (lo[i] > hi[i]) k.a[i] = k.b[i] = 0;
          // Distances of window keys equal their index distances in both position schemes.
          k.delta0[i] = v[i].si - first_slot;
        }
        if (!active(k)) continue;
        const Entry& en = L.stream[e];
        k.data = data_of(en);
        k.quantized = en.quantized;
        k.col = int(first_slot - start);
        // Two blocks ahead: a block's K (or V) is read in less time than memory takes to answer.
        k.near_end = e + 2 > e_last;
        const size_t ka = k.near_end ? e + 2 - (e_last - e0 + 1) : e + 2;
        k.k_ahead = ka < L.stream.size() ? &L.stream[ka] : nullptr;
        k.v_ahead = e + 2 < L.stream.size() ? &L.stream[e + 2] : nullptr;
        ++nb;
      }
    };
    // Runs of consecutive quantized blocks read as stored (no rotation), each seen alike by every
    // query of the call and by the same queries, go to the span kernels in one call (a decode step:
    // all the part's quantized blocks): one call a pass instead of one a block, accumulators kept in
    // registers between blocks. Other blocks, one at a time. Either way the same sums in the same order.
    collect();
    auto spanned = [&](const WalkBlock& k) { return k.quantized && !rotate && k.same; };
    // The spans of the spanned blocks, in order, built once for both passes.
    walk.spans.clear();
    for (size_t i = 0; i < nb; ++i) {
      const WalkBlock& b = walk.blocks[i];
      if (!spanned(b)) continue;
      const int a0 = b.a[b.i0];
      const Rows r = rows_of(b.data, true, g);
      KiviSpan& sp = walk.spans.emplace_back();  // filled in place (a copy would stall on store forwarding)
      sp.k = r.k;
      sp.k0 = a0;
      sp.v = r.v + size_t(a0) * pk;
      sp.ks = r.ks;
      sp.kz = r.kz;
      sp.vs = r.vs + a0;
      sp.vz = r.vz + a0;
      sp.n = b.b[b.i0] - a0;
      sp.col = b.col + a0;
      // The rows two blocks ahead, from the list where they are in it (the same as `ahead` finds).
      const WalkBlock* b2 = i + 2 < nb ? &walk.blocks[i + 2] : nullptr;
      if (!b.near_end && b2 && b2->quantized) {
        const Rows r2 = rows_of(b2->data, true, g);
        sp.k_next = r2.k;
        sp.v_next = r2.v + size_t(a0) * pk;
      } else {
        sp.k_next = ahead(b.k_ahead, b.near_end, b.near_end ? a0 : 0, false);
        sp.v_next = ahead(b.v_ahead, !b.near_end, a0, false);
      }
    }
    auto for_each = [&](auto&& one, auto&& many) {
      size_t sp = 0;  // the next span
      for (size_t i = 0; i < nb;) {
        const WalkBlock& k = walk.blocks[i];
        if (!spanned(k)) {
          one(k);
          ++i;
          continue;
        }
        const size_t s0 = sp;
        for (; i < nb && spanned(walk.blocks[i]) && walk.blocks[i].i0 == k.i0 && walk.blocks[i].i1 == k.i1; ++i) ++sp;
        many(k.i0 * group, (k.i1 - k.i0) * group, walk.spans.data() + s0, int(sp - s0));
      }
    };
    for_each(score, [&](int h0, int nq, const KiviSpan* sp, int ns) {
      kivi_k_spans(qb + size_t(h0) * size_t(D), nq, sp, ns, B, scale, D, bits_, scores + size_t(h0) * ld, int(ld));
    });
    // Pass 2: each head's softmax numerators e^(x - m) over its columns, in place, and their sum.
    for (int i = 0; i < nt; ++i) {
      const int n = c1[i] - c0[i];
      if (n <= 0) continue;
      for (int r = 0; r < group; ++r) {
        const int h = i * group + r;
        float* x = scores + size_t(h) * ld + size_t(c0[i]);
        st.m[h] = max_of(x, n);
        st.l[h] = exp_sum(x, n, st.m[h]);
      }
    }
    for_each(sum_values, [&](int h0, int nq, const KiviSpan* sp, int ns) {
      kivi_v_spans(scores + size_t(h0) * ld, int(ld), nq, sp, ns, D, bits_, st.acc + size_t(h0) * size_t(D),
                   st.z + h0);
    });
  };
  // Query t0 + i's heads of KV head g, from the state of the tile.
  auto write_out = [&](int t0, int nt, int g, const State& st) {
    for (int i = 0; i < nt; ++i)
      for (int r = 0; r < group; ++r) {
        const int h = i * group + r;
        float* o = out + (size_t(t0 + i) * size_t(n_heads) + size_t(g) * size_t(group) + size_t(r)) * size_t(D);
        const float* acc = st.acc + size_t(h) * size_t(D);
        const float inv = 1.0f / st.l[h];
        for (int d = 0; d < D; ++d) o[d] = (acc[d] + st.z[h]) * inv;
      }
  };

  const size_t items = size_t(T) * size_t(H);
  // Each thread's scratch, then a part's state, then the running one. Obtained through a function
  // call on the thread that uses it: a block-scope thread_local is only constructed (and destroyed at
  // thread exit) on threads that pass its declaration, which pool workers running the lambda do not.
  auto local_buffers = [&] {
    std::vector<float>& local = attention_scratch();
    const size_t need = scratch_floats + 2 * tile_state_floats + 15;
    if (local.size() < need) local.resize(need);
    // From a 64-byte boundary: the kernels' full-register loads and stores of scores and queries
    // never straddle two cache lines.
    const uintptr_t a = reinterpret_cast<uintptr_t>(local.data());
    return local.data() + ((64 - a % 64) % 64) / sizeof(float);
  };
  if (pool.size() > 1 && items < 4 * size_t(pool.size())) {
    // Few (token, KV head) pairs (decode): every part is a piece of work, merged afterwards.
    thread_local std::vector<float> parts;  // [T][H][n_parts] states
    const size_t need = items * size_t(n_parts) * state_floats;
    if (parts.size() < need) parts.resize(need);
    float* pbuf = parts.data();
    pool.parallel_for(items * size_t(n_parts), [&](size_t begin, size_t end) {
      float* buf = local_buffers();
      for (size_t it = begin; it < end; ++it) {
        const int t = int(it / (size_t(H) * size_t(n_parts))), g = int(it / size_t(n_parts) % size_t(H));
        const int part = int(it % size_t(n_parts));
        State st(pbuf + it * state_floats, group);
        if (sees_part(t, part))
          run_part(t, 1, g, part, st, buf);
        else
          st.reset(group, D);
      }
    });
    float* buf = local_buffers();
    State run(buf + scratch_floats + tile_state_floats, group);
    for (size_t it = 0; it < items; ++it) {
      run.reset(group, D);
      for (int part = 0; part < n_parts; ++part)
        run.merge(State(pbuf + (it * size_t(n_parts) + size_t(part)) * state_floats, group), group, D);
      write_out(int(it / size_t(H)), 1, int(it % size_t(H)), run);
    }
  } else {
    // (tile of kTile tokens, KV head) pieces.
    const size_t n_tiles = size_t(ceil_div(T, kTile));
    pool.parallel_for(n_tiles * size_t(H), [&](size_t begin, size_t end) {
      float* buf = local_buffers();
      for (size_t it = begin; it < end; ++it) {
        const int t0 = int(it / size_t(H)) * kTile, g = int(it % size_t(H));
        const int nt = std::min(kTile, T - t0), nh = nt * group;
        State part_st(buf + scratch_floats, nh), run(buf + scratch_floats + tile_state_floats, nh);
        run.reset(nh, D);
        for (int part = 0; part < n_parts; ++part) {
          bool seen = false;
          for (int i = 0; i < nt && !seen; ++i) seen = sees_part(t0 + i, part);
          if (!seen) continue;
          run_part(t0, nt, g, part, part_st, buf);
          run.merge(part_st, nh, D);
        }
        write_out(t0, nt, g, run);
      }
    });
  }
}

}  // namespace ptllm
