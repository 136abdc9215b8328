#include "model/gptq.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kv/kv_cache.h"
#include "model/affine_fit.h"

namespace ptllm {

void HessianAccumulator::add(const float* x, int T, ThreadPool& pool) {
  if (T <= 0) return;
  const size_t n = size_t(n_), t = size_t(T);
  // x^T x as the product of x^T [n][T] with itself (the dense float gemm: this is most of the
  // calibration's arithmetic), added to the double sum.
  if (xt_.size() < n * t) xt_.resize(n * t);
  if (prod_.size() < n * n) prod_.resize(n * n);
  for (size_t r = 0; r < t; ++r)
    for (size_t k = 0; k < n; ++k) xt_[k * t + r] = x[r * n + k];
  matmul(xt_.data(), n_, dense_matrix(DType::F32, xt_.data(), n_, T), nullptr, prod_.data(), pool);
  for (size_t i = 0; i < n * n; ++i) h_[i] += double(prod_[i]);
  rows_ += T;
}

namespace {

double dot_d(const double* a, const double* b, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int k = 0;
  for (; k + 4 <= n; k += 4) {
    s0 += a[k] * b[k];
    s1 += a[k + 1] * b[k + 1];
    s2 += a[k + 2] * b[k + 2];
    s3 += a[k + 3] * b[k + 3];
  }
  for (; k < n; ++k) s0 += a[k] * b[k];
  return (s0 + s1) + (s2 + s3);
}

// a [n][n] symmetric (the lower triangle is read) becomes L, lower triangular, a = L L^T (the upper
// triangle is left as it was). false: not numerically positive definite.
bool cholesky_lower(std::vector<double>& a, int n, ThreadPool& pool) {
  const size_t N = size_t(n);
  for (int j = 0; j < n; ++j) {
    double* aj = a.data() + size_t(j) * N;
    const double d = aj[j] - dot_d(aj, aj, j);
    if (!(d > 0) || !std::isfinite(d)) return false;
    const double ljj = std::sqrt(d);
    aj[j] = ljj;
    pool.parallel_for(size_t(n - j - 1), [&](size_t b, size_t e) {
      for (size_t i = size_t(j) + 1 + b; i < size_t(j) + 1 + e; ++i) {
        double* ai = a.data() + i * N;
        ai[j] = (ai[j] - dot_d(ai, aj, j)) / ljj;
      }
    }, 64);
  }
  return true;
}

}  // namespace

// With J the reversal of the indices: J H J = L L^T (one Cholesky), so H = R R^T with R = J L J upper
// triangular, H^-1 = R^-T R^-1, and U = R^-1 = J L^-1 J is the upper factor of H^-1 that the paper
// computes as chol(H^-1, upper): one factorization and one triangular inverse instead of the
// reference's inverse and second factorization.
GptqFactor gptq_factor(std::vector<double> h, int n, double damp_frac, const std::string& what, ThreadPool& pool,
                       bool act_order) {
  const size_t N = size_t(n);
  PTLLM_CHECK(n > 0 && h.size() == N * N);
  GptqFactor f;
  f.n = n;
  f.dead.assign(N, 0);
  double mean_diag = 0;
  for (size_t i = 0; i < N; ++i) {
    if (h[i * N + i] == 0) {  // an input that is always 0: any weight does; it is set to 0
      f.dead[i] = 1;
      h[i * N + i] = 1;
    }
    mean_diag += h[i * N + i];
  }
  mean_diag /= double(n);
  if (act_order) {
    f.order.resize(N);
    for (size_t i = 0; i < N; ++i) f.order[i] = int(i);
    std::stable_sort(f.order.begin(), f.order.end(),
                     [&](int x, int y) { return h[size_t(x) * N + size_t(x)] > h[size_t(y) * N + size_t(y)]; });
    std::vector<double> p(N * N);
    for (size_t i = 0; i < N; ++i)
      for (size_t j = 0; j < N; ++j) p[i * N + j] = h[size_t(f.order[i]) * N + size_t(f.order[j])];
    h.swap(p);
  }
  // Reversed: a[i][j] = h[n-1-i][n-1-j].
  std::vector<double> rev(N * N), a;
  for (size_t i = 0; i < N; ++i)
    for (size_t j = 0; j < N; ++j) rev[i * N + j] = h[(N - 1 - i) * N + (N - 1 - j)];
  double damp = damp_frac * mean_diag;
  bool ok = false;
  for (int attempt = 0; attempt < 5 && !ok; ++attempt, damp *= 10) {
    a = rev;
    for (size_t i = 0; i < N; ++i) a[i * N + i] += damp;
    ok = cholesky_lower(a, n, pool);
    f.damp = damp;
  }
  if (!ok)
    throw Error("gptq: the calibration statistics of " + what +
                " are not positive definite even with the dampening raised to " + std::to_string(f.damp) +
                " (mean diagonal " + std::to_string(mean_diag) + ")");
  // M = (L^-1)^T, row k: column k of L^-1, from forward substitution (entries k.. of the row).
  std::vector<double> m(N * N, 0.0);
  pool.parallel_for(N, [&](size_t k0, size_t k1) {
    for (size_t k = k0; k < k1; ++k) {
      double* mk = m.data() + k * N;
      mk[k] = 1.0 / a[k * N + k];
      for (size_t i = k + 1; i < N; ++i) {
        const double* li = a.data() + i * N;
        mk[i] = -dot_d(li + k, mk + k, int(i - k)) / li[i];
      }
    }
  }, 16);
  // U[i][j] = L^-1[n-1-i][n-1-j] = M[n-1-j][n-1-i], nonzero for j >= i.
  f.u.assign(N * N, 0.f);
  for (size_t i = 0; i < N; ++i)
    for (size_t j = i; j < N; ++j) f.u[i * N + j] = float(m[(N - 1 - j) * N + (N - 1 - i)]);
  return f;
}

void gptq_quantize_rows(float* w, int rows, int cols, const GptqFactor& f, const AffineSpec& s, QuantMethod fit,
                        DType scale_dtype, uint32_t* codes, void* scales, void* biases, ThreadPool& pool, int block) {
  const bool permuted = !f.order.empty();
  PTLLM_CHECK(affine_supported(s) && cols == f.n && cols % s.group_size == 0);
  PTLLM_CHECK(permuted || block % s.group_size == 0);
  PTLLM_CHECK(fit == QuantMethod::Rtn || fit == QuantMethod::Search);
  const int gs = s.group_size, nmax = (1 << s.bits) - 1, groups = cols / gs;
  const size_t C = size_t(cols), B = size_t(block), R = size_t(rows);
  const float* u = f.u.data();
  for (size_t c = 0; c < C; ++c)
    if (f.dead[c])
      for (size_t r = 0; r < R; ++r) w[r * C + c] = 0;
  // Solve order: column i of the work matrix is column col(i) of w.
  auto col = [&](int i) { return permuted ? f.order[size_t(i)] : i; };
  std::vector<float> wp;                    // [rows][cols] w's columns in f.order (act-order)
  std::vector<float> gscale, gbias;         // [rows][groups] the static groups' fits (act-order)
  float* wk = w;
  auto fit_group = [&](size_t r, int k, const float* x) {
    const AffineGroupFit g = affine_fit_group(x, gs, s.bits, fit, scale_dtype);
    const size_t gi = r * size_t(groups) + size_t(k);
    affine_store(scales, scale_dtype, gi, g.scale);
    affine_store(biases, scale_dtype, gi, g.bias);
    return g;
  };
  if (permuted) {
    wp.resize(R * C);
    gscale.resize(R * size_t(groups));
    gbias.resize(gscale.size());
    pool.parallel_for(R, [&](size_t r0, size_t r1) {
      for (size_t r = r0; r < r1; ++r) {
        for (int k = 0; k < groups; ++k) {
          const AffineGroupFit g = fit_group(r, k, w + r * C + size_t(k) * size_t(gs));
          gscale[r * size_t(groups) + size_t(k)] = g.scale;
          gbias[r * size_t(groups) + size_t(k)] = g.bias;
        }
        for (size_t i = 0; i < C; ++i) wp[r * C + i] = w[r * C + size_t(f.order[i])];
      }
    }, 16);
    wk = wp.data();
  }
  std::vector<uint8_t> q(R * C);     // [rows][cols] codes, in w's column order
  std::vector<float> err(R * B);     // [rows][block] each column's error over U[i][i]
  std::vector<float> ublk, upd;      // [cols - e][block] U's rows of the block, transposed; [rows][cols - e]
  for (int b = 0; b < cols; b += block) {
    const int e = std::min(cols, b + block);
    // The block's columns in order, each row on its own: round, then spread the error over the
    // block's later columns (without act-order a group's scale and bias are fitted when its first
    // column comes up, on the weights as updated so far).
    pool.parallel_for(R, [&](size_t r0, size_t r1) {
      for (size_t r = r0; r < r1; ++r) {
        float* wr = wk + r * C;
        uint8_t* qr = q.data() + r * C;
        float* er = err.data() + r * B;
        float scale = 0, bias = 0;
        for (int i = b; i < e; ++i) {
          const int c = col(i);
          if (permuted) {
            scale = gscale[r * size_t(groups) + size_t(c / gs)];
            bias = gbias[r * size_t(groups) + size_t(c / gs)];
          } else if (i % gs == 0) {
            const AffineGroupFit g = fit_group(r, i / gs, wr + i);
            scale = g.scale;
            bias = g.bias;
          }
          const uint8_t code = affine_code(wr[i], scale, bias, nmax);
          qr[c] = code;
          const float* ui = u + size_t(i) * C;
          const float ei = (wr[i] - (scale * float(code) + bias)) / ui[i];
          for (int j = i + 1; j < e; ++j) wr[j] -= ei * ui[j];
          er[i - b] = ei;
        }
      }
    }, 4);
    if (e == cols) break;
    // The lazy update of the columns after the block: w[:, e:] -= err[:, :block] U[b:e, e:].
    const size_t rest = C - size_t(e);
    ublk.resize(rest * B);
    for (size_t c = 0; c < rest; ++c)
      for (size_t k = 0; k < B; ++k) ublk[c * B + k] = u[(size_t(b) + k) * C + size_t(e) + c];
    upd.resize(R * rest);
    matmul(err.data(), rows, dense_matrix(DType::F32, ublk.data(), int(rest), block), nullptr, upd.data(), pool);
    pool.parallel_for(R, [&](size_t r0, size_t r1) {
      for (size_t r = r0; r < r1; ++r) {
        float* wr = wk + r * C + size_t(e);
        const float* ur = upd.data() + r * rest;
        for (size_t c = 0; c < rest; ++c) wr[c] -= ur[c];
      }
    }, 16);
  }
  if (permuted)
    for (size_t r = 0; r < R; ++r)
      for (size_t i = 0; i < C; ++i) w[r * C + size_t(f.order[i])] = wp[r * C + i];
  const size_t words = C * size_t(s.bits) / 32;
  for (size_t r = 0; r < R; ++r) affine_pack_row(q.data() + r * C, cols, s.bits, codes + r * words);
}

double gptq_output_error(const float* w, const float* q, int rows, int cols, const double* h) {
  const size_t C = size_t(cols);
  std::vector<double> d(C);
  double total = 0;
  for (size_t r = 0; r < size_t(rows); ++r) {
    for (size_t c = 0; c < C; ++c) d[c] = double(w[r * C + c]) - double(q[r * C + c]);
    for (size_t i = 0; i < C; ++i) total += d[i] * dot_d(h + i * C, d.data(), cols);
  }
  return total;
}

std::vector<std::vector<int32_t>> calibration_windows(std::span<const int32_t> ids, int tokens, int seq,
                                                      uint64_t seed, std::optional<int32_t> bos) {
  PTLLM_CHECK(tokens > 0 && seq > 1);
  std::vector<std::vector<int32_t>> out;
  if (ids.empty()) return out;
  const size_t len = std::min(ids.size(), size_t(seq));
  const size_t n = (size_t(tokens) + size_t(seq) - 1) / size_t(seq), range = ids.size() - len + 1;
  // splitmix64: the same starts on every platform (std's distributions are not specified).
  uint64_t state = seed;
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  for (size_t k = 0; k < n; ++k) {
    const size_t start = size_t(next() % uint64_t(range));
    out.emplace_back(ids.begin() + std::ptrdiff_t(start), ids.begin() + std::ptrdiff_t(start + len));
    if (bos) out.back()[0] = *bos;
  }
  return out;
}

void run_calibration(const Model& model, const std::vector<std::vector<int32_t>>& seqs, ForwardObserver& obs,
                     ThreadPool& pool) {
  size_t longest = 0;
  for (const auto& s : seqs) longest = std::max(longest, s.size());
  if (longest == 0) return;
  KVCacheConfig kc;  // fp32, room for the longest sequence
  kc.precision = KVPrecision::F32;
  kc.ctx_size = int(longest);
  ForwardState st;
  st.observer = &obs;
  // Every row's logits asked for: the rows reach the LM head (the observer ends the pass before they
  // are computed when it has what it wants), and a YOCO model keeps them all past its donor layer.
  std::vector<float> logits(longest * size_t(model.config().vocab_size));
  for (const auto& s : seqs) {
    if (s.empty()) continue;
    KVCache cache(model.kv_shape(), kc);
    const size_t n = std::min(s.size(), size_t(cache.max_append()));
    model.forward(std::span<const int32_t>(s).first(n), 0, cache, st, logits.data(), true, pool);
  }
}

}  // namespace ptllm
