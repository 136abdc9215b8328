#pragma once
// GPTQ (Frantar, Ashkboos, Hoefler, Alistarh 2022, "GPTQ: Accurate Post-Training Quantization for
// Generative Pre-trained Transformers"; the reference code is IST-DASLab/gptq). A linear layer's
// output on its inputs X is W X; rounding W to Q costs sum_r (W - Q)_r H (W - Q)_r^T with H = X X^T.
// GPTQ rounds the columns of W in order and, after each, moves the not yet rounded columns of every
// row by the optimal correction for that column's error (Optimal Brain Surgeon's update, read off
// the upper Cholesky factor U of H^-1: w[j] -= err[i] * U[i][j] / U[i][i]). Updates within a block of
// 128 columns are applied at once, the rest of the matrix once a block (the paper's lazy batch).
// Groups of group_size columns get their scale and bias (the Search fit of model/quantize.cpp) from
// the updated weights when the solve reaches their first column, and codes are rounded against
// the scale and bias as stored, as affine_quantize_rows does.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/model.h"
#include "model/quantize.h"

namespace ptllm {

class ThreadPool;

// H = sum over rows of x x^T, accumulated in double from float products of at most one call's rows.
class HessianAccumulator {
 public:
  explicit HessianAccumulator(int n) : n_(n), h_(size_t(n) * size_t(n), 0.0) {}
  // x: [T][n]
  void add(const float* x, int T, ThreadPool& pool);
  int n() const { return n_; }
  int64_t rows() const { return rows_; }
  const std::vector<double>& h() const { return h_; }  // [n][n], symmetric

 private:
  int n_;
  int64_t rows_ = 0;
  std::vector<double> h_;
  std::vector<float> xt_, prod_;  // [n][T] x transposed, [n][n] this call's x^T x
};

// What the solve needs of H: the upper Cholesky factor of (H + damp I)^-1.
struct GptqFactor {
  int n = 0;
  // The columns in the order they are solved: empty, 0, 1, ..., n-1; with act-order (the paper's
  // follow-up, "desc_act" in AutoGPTQ) by decreasing H_ii, the inputs of most energy first, while
  // later columns can still absorb their error. u is then the factor of H permuted so.
  std::vector<int> order;
  std::vector<float> u;       // [n][n], upper triangular (row i from column i on)
  std::vector<uint8_t> dead;  // [n] 1 where H_ii == 0: the input is always 0, its weights are set to 0
  double damp = 0;            // added to every diagonal entry
};

// h: [n][n] symmetric. damp_frac: the dampening as a fraction of the mean diagonal (0.01, the
// paper's); when H + damp I is not numerically positive definite the dampening is raised tenfold,
// up to four times. Throws ptllm::Error naming `what` when that fails too.
GptqFactor gptq_factor(std::vector<double> h, int n, double damp_frac, const std::string& what, ThreadPool& pool,
                       bool act_order = false);

// Quantizes w [rows][cols] (cols == f.n, a multiple of s.group_size; overwritten with the updated
// weights) into codes [rows][cols * bits / 32], scales and biases [rows][cols / group_size] as
// scale_dtype, the layout affine_quantize_rows writes. fit: Rtn or Search. block: columns updated
// together (a multiple of the group size). With f.order (act-order) the groups stay groups of
// consecutive columns, as the layout wants, with their scales and biases fitted up front on the
// weights as given (AutoGPTQ's static groups): a group's columns are reached at scattered times.
void gptq_quantize_rows(float* w, int rows, int cols, const GptqFactor& f, const AffineSpec& s, QuantMethod fit,
                        DType scale_dtype, uint32_t* codes, void* scales, void* biases, ThreadPool& pool,
                        int block = 128);

// sum_r (w - q)_r H (w - q)_r^T: the squared output error on the calibration inputs.
double gptq_output_error(const float* w, const float* q, int rows, int cols, const double* h);

// Calibration sequences from a token stream: ceil(tokens / seq) windows of seq tokens at starts drawn
// uniformly from [0, ids.size() - seq] by `seed`, each window's first token replaced by bos when the
// tokenizer has one (as eval's --ppl-chunks does). A stream shorter than seq gives windows of all of
// it. Empty when ids is empty.
std::vector<std::vector<int32_t>> calibration_windows(std::span<const int32_t> ids, int tokens, int seq,
                                                      uint64_t seed, std::optional<int32_t> bos);

// Runs every sequence through `model` with `obs` watching (each in a fresh fp32 cache, in one pass
// of at most the cache's max_append() tokens): the observer sees every matrix input and may end a
// pass early.
void run_calibration(const Model& model, const std::vector<std::vector<int32_t>>& seqs, ForwardObserver& obs,
                     ThreadPool& pool);

}  // namespace ptllm
