#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/affine.h"
#include "kernels/affine_q8.h"
#include "kernels/ggml.h"
#include "kernels/ops.h"
#include "model/weight_rows.h"

namespace ptllm {

void moe_route(const float* logits, int E, int k, bool norm, int* experts, float* weights) {
  // softmax in float32 (F.softmax(router_logits, dtype=torch.float))
  float m = logits[0];
  for (int e = 1; e < E; ++e) m = std::max(m, logits[e]);
  float sum = 0.f;
  for (int e = 0; e < E; ++e) sum += std::exp(logits[e] - m);
  // top-k by logit: softmax is monotonic, so the order is the logits' order; the probabilities of
  // the chosen ones are computed as softmax computes them.
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int i = 0; i < j && !taken; ++i) taken = experts[i] == e;
      if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
    }
    experts[j] = best;
    weights[j] = std::exp(logits[best] - m) / sum;
  }
  if (norm) {
    float s = 0.f;
    for (int j = 0; j < k; ++j) s += weights[j];
    for (int j = 0; j < k; ++j) weights[j] /= s;
  }
}

WeightMatrix stacked_expert(const WeightMatrix& stack, int e, int rows) {
  return weight_rows(stack, e * rows, rows);
}

namespace {
void ensure(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}
// Row blocks of a single-row product: enough parts for the pool, each a few cache lines of output.
constexpr int kBlockRows = 64;
int blocks_of(int rows) { return (rows + kBlockRows - 1) / kBlockRows; }

// Rows of x rounded to int8 once for every row block of every expert matrix that reads them. A matmul
// call rounds its x itself: called per block of 64 rows, a decode step rounded the same x 24 times
// per expert, a tenth of the step's time. The quantized formats' kernels then run on the rounded
// rows as matmul would (the same integers, the same sums: bit for bit its result; for Q4_0 and
// Q8_0 under AVX-512 the panel product, which is matmul's from two rows on).
class RoundedRows {
 public:
  // rows: [n][K], for matrices of w's format (MLX affine bits and group size, or GGUF block size).
  void prepare(const WeightMatrix& w, const float* rows, int n, int K, ThreadPool& pool) {
    rows_ = rows;
    K_ = K;
    kind_ = Kind::Plain;
    if (w.format == WeightFormat::Affine && affine_fast(w) && w.cols == K) {
      kind_ = Kind::Affine;
      bits_ = w.bits;
      group_ = w.group_size;
      const AffineKernelTable& kt = affine_active_table();
      ax_ = quantize_affine_x(rows, n, K, bits_, group_, kt.reg_bytes * 8 / bits_, abuf_, &pool);
    } else if (w.format == WeightFormat::Ggml && ggml_int_kernel(w.ggml) && w.cols == K &&
               K % ggml_act_block(w.ggml) == 0) {
      kind_ = Kind::Ggml;
      block_ = ggml_act_block(w.ggml);
      const size_t rn = size_t(n);
      if (q_.size() < rn * size_t(K)) q_.resize(rn * size_t(K));
      if (d_.size() < rn * size_t(K / block_)) d_.resize(rn * size_t(K / block_));
      if (sums_.size() < rn * size_t(K / 16)) sums_.resize(rn * size_t(K / 16));
      ggml_active_kernel().quantize(rows, K, block_, 0, n, q_.data(), d_.data(), sums_.data());
    }
  }
  // y[r] for r in [r0, r1) = row r of w . row i (y indexed by w's rows). A matrix of another format
  // than prepared takes matmul on its row block.
  void gemv(const WeightMatrix& w, int i, int r0, int r1, float* y, ThreadPool& pool) const {
    if (kind_ == Kind::Affine && w.format == WeightFormat::Affine && w.bits == bits_ && w.group_size == group_ &&
        w.cols == K_ && affine_fast(w)) {
      AffineX a = ax_;
      a.T = 1;
      a.q += size_t(i) * a.ldq;
      a.d += size_t(i) * a.ldd;
      a.xs += size_t(i) * a.ldg;
      a.xc += size_t(i) * a.ldg;
      affine_active_table().gemv(a, w, nullptr, y, r0, r1);
      return;
    }
    if (kind_ == Kind::Ggml && w.format == WeightFormat::Ggml && w.cols == K_ && ggml_int_kernel(w.ggml) &&
        ggml_act_block(w.ggml) == block_) {
      const GgmlActs a{1, K_, block_, q_.data() + size_t(i) * size_t(K_), d_.data() + size_t(i) * size_t(K_ / block_),
                       sums_.data() + size_t(i) * size_t(K_ / 16)};
      // The panel product where the variant has one for the type: faster for one row than the
      // one-row kernel (the decoded panel is used at once), and an expert's row gets the same bits
      // whether it was routed alone or with others.
      if (const GgmlRowsFn panel = ggml_panel_rows(w.ggml))
        panel(w, a, nullptr, y, r0, r1);
      else
        ggml_active_kernel().rows(w, a, nullptr, y, r0, r1);
      return;
    }
    matmul(rows_ + size_t(i) * size_t(K_), 1, weight_rows(w, r0, r1 - r0), nullptr, y + r0, pool);
  }

 private:
  enum class Kind { Plain, Affine, Ggml } kind_ = Kind::Plain;
  const float* rows_ = nullptr;
  int K_ = 0, bits_ = 0, group_ = 0, block_ = 0;
  AffineXBuffers abuf_;
  AffineX ax_;
  std::vector<int8_t> q_;
  std::vector<float> d_;
  std::vector<int16_t> sums_;
};
}  // namespace

void moe_forward(const MoeWeights& w, const MoeConfig& cfg, const float* x, int T, int H, float* out, MoeScratch& s,
                 ThreadPool& pool, MoeCounters* counters, int layer) {
  const int E = cfg.num_experts, k = cfg.top_k, I = cfg.intermediate_size;
  const size_t pairs = size_t(T) * size_t(k);
  ensure(s.logits, size_t(T) * size_t(E));
  if (s.experts.size() < pairs) s.experts.resize(pairs);
  ensure(s.weights, pairs);
  matmul(x, T, w.router, nullptr, s.logits.data(), pool);
  for (int t = 0; t < T; ++t)
    moe_route(s.logits.data() + size_t(t) * size_t(E), E, k, cfg.norm_topk_prob, s.experts.data() + size_t(t) * k,
              s.weights.data() + size_t(t) * k);

  // Group the (row, slot) pairs by expert, rows in order within an expert (a counting sort).
  s.start.assign(size_t(E) + 1, 0);
  for (size_t p = 0; p < pairs; ++p) ++s.start[size_t(s.experts[p]) + 1];
  for (int e = 0; e < E; ++e) s.start[size_t(e) + 1] += s.start[size_t(e)];
  if (s.order.size() < pairs) s.order.resize(pairs);
  {
    std::vector<int>& next = s.order;  // filled below through a cursor per expert
    thread_local std::vector<int> cursor;
    cursor.assign(s.start.begin(), s.start.end() - 1);
    for (size_t p = 0; p < pairs; ++p) next[size_t(cursor[size_t(s.experts[p])]++)] = int(p);
  }
  // y[g]: the output of pair order[g] (its expert's product of its row), before weighting
  ensure(s.y, pairs * size_t(H));
  ensure(s.h, pairs * size_t(I));
  ensure(s.u, pairs * size_t(I));

  // Experts with two or more rows: gathered, one pass over each expert's weights for all of them.
  // positions g of the experts with one row: this thread's buffer, which the pool's threads read
  // through `singles` below (by its name they would read their own)
  thread_local std::vector<int> singles_buf;
  singles_buf.clear();
  for (int e = 0; e < E; ++e) {
    const int g0 = s.start[size_t(e)], n = s.start[size_t(e) + 1] - g0;
    if (n == 0) continue;
    if (counters) {
      ++counters->expert_passes;
      counters->expert_rows += n;
      counters->expert_bytes += int64_t(w.gate[size_t(e)].nbytes() + w.up[size_t(e)].nbytes() + w.down[size_t(e)].nbytes());
      if (!counters->passes_by_expert.empty()) ++counters->passes_by_expert[size_t(layer) * size_t(E) + size_t(e)];
    }
    if (n == 1) {
      singles_buf.push_back(g0);
      continue;
    }
    ensure(s.xg, size_t(n) * size_t(H));
    for (int i = 0; i < n; ++i)
      std::memcpy(s.xg.data() + size_t(i) * size_t(H), x + size_t(s.order[size_t(g0 + i)] / k) * size_t(H),
                  size_t(H) * sizeof(float));
    float* h = s.h.data() + size_t(g0) * size_t(I);
    float* u = s.u.data() + size_t(g0) * size_t(I);
    const MatmulOutput gu[] = {{&w.gate[size_t(e)], nullptr, h}, {&w.up[size_t(e)], nullptr, u}};
    matmul_shared_x(s.xg.data(), n, gu, pool);
    silu_mul(h, u, n * I);
    matmul(h, n, w.down[size_t(e)], nullptr, s.y.data() + size_t(g0) * size_t(H), pool);
  }

  // Experts with one row (all of a decode step's): every expert's row blocks in one parallel pass for
  // gate and up, one for down, each block a single-threaded product on rows rounded once (x for all
  // experts, each expert's h for its down).
  if (!singles_buf.empty()) {
    const size_t n = singles_buf.size();
    const int* singles = singles_buf.data();
    const int bi = blocks_of(I), bh = blocks_of(H);
    auto expert_of = [&](size_t i) { return size_t(s.experts[size_t(s.order[size_t(singles[i])])]); };
    auto token_of = [&](size_t i) { return s.order[size_t(singles[i])] / k; };
    // this thread's buffers, which the pool's threads read through xr and hr (by the thread_local's
    // name they would read their own)
    thread_local RoundedRows x_rounded, h_rounded;
    RoundedRows* const xr = &x_rounded;
    RoundedRows* const hr = &h_rounded;
    xr->prepare(w.gate[expert_of(0)], x, T, H, pool);
    pool.parallel_for(n * 2 * size_t(bi), [&](size_t b, size_t e) {
      for (size_t task = b; task < e; ++task) {
        const size_t i = task / (2 * size_t(bi)), rest = task % (2 * size_t(bi));
        const bool is_up = rest >= size_t(bi);
        const int r0 = int(rest % size_t(bi)) * kBlockRows, r1 = std::min(I, r0 + kBlockRows);
        const WeightMatrix& m = is_up ? w.up[expert_of(i)] : w.gate[expert_of(i)];
        float* dst = (is_up ? s.u.data() : s.h.data()) + size_t(singles[i]) * size_t(I);
        xr->gemv(m, token_of(i), r0, r1, dst, pool);
      }
    });
    // each single's h gathered into [n][I] (in s.xg) for one rounding of all of them
    ensure(s.xg, n * size_t(I));
    for (size_t i = 0; i < n; ++i) {
      const size_t g = size_t(singles[i]);
      silu_mul(s.h.data() + g * size_t(I), s.u.data() + g * size_t(I), I);
      std::memcpy(s.xg.data() + i * size_t(I), s.h.data() + g * size_t(I), size_t(I) * sizeof(float));
    }
    hr->prepare(w.down[expert_of(0)], s.xg.data(), int(n), I, pool);
    pool.parallel_for(n * size_t(bh), [&](size_t b, size_t e) {
      for (size_t task = b; task < e; ++task) {
        const size_t i = task / size_t(bh);
        const int r0 = int(task % size_t(bh)) * kBlockRows, r1 = std::min(H, r0 + kBlockRows);
        hr->gemv(w.down[expert_of(i)], int(i), r0, r1, s.y.data() + size_t(singles[i]) * size_t(H), pool);
      }
    });
  }

  // out[t] = sum of its experts' outputs times their weights, in increasing expert index (the order
  // in which transformers' index_add_ adds them), whatever the batch's grouping.
  thread_local std::vector<int> pos;
  if (pos.size() < pairs) pos.resize(pairs);
  for (size_t g = 0; g < pairs; ++g) pos[size_t(s.order[g])] = int(g);
  for (int t = 0; t < T; ++t) {
    float* o = out + size_t(t) * size_t(H);
    std::fill(o, o + H, 0.f);
    int slots[kMaxTopK];
    const int kk = k;
    for (int j = 0; j < kk; ++j) slots[j] = j;
    const int* ex = s.experts.data() + size_t(t) * k;
    std::sort(slots, slots + kk, [&](int a, int b) { return ex[a] < ex[b]; });
    for (int j = 0; j < kk; ++j) {
      const size_t p = size_t(t) * k + size_t(slots[j]);
      axpy(s.weights[p], s.y.data() + size_t(pos[p]) * size_t(H), o, H);
    }
  }
}

}  // namespace ptllm
