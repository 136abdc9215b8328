#pragma once
// ops.h matmul_shared_x against a separate matmul for each matrix: every output the same bits
// (test_amx.cpp: AMX, parts crossing matrices; test_panels.cpp: the panels' product on every target).
#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace ptllm::test {

// ws share their cols; odd-numbered matrices get a bias.
inline void expect_shared_x_equals_separate_calls(std::span<const WeightMatrix> ws, int T, ThreadPool& pool,
                                                  const char* what) {
  const int K = ws[0].cols;
  const auto x = normal(size_t(T) * size_t(K), 1.f, uint32_t(T + 20));
  std::vector<std::vector<float>> biases, alone, shared;
  std::vector<MatmulOutput> outs;
  for (size_t i = 0; i < ws.size(); ++i) {
    const size_t n = size_t(T) * size_t(ws[i].rows);
    biases.push_back(normal(size_t(ws[i].rows), 1.f, uint32_t(30 + i)));
    alone.emplace_back(n);
    shared.emplace_back(n, NAN);
  }
  for (size_t i = 0; i < ws.size(); ++i) {
    const float* b = i % 2 ? biases[i].data() : nullptr;
    matmul(x.data(), T, ws[i], b, alone[i].data(), pool);
    outs.push_back({&ws[i], b, shared[i].data()});
  }
  matmul_shared_x(x.data(), T, outs, pool);
  for (size_t i = 0; i < ws.size(); ++i)
    ASSERT_EQ(shared[i], alone[i]) << what << ": matrix " << i << ", T " << T << ", " << pool.size() << " threads";
}

// Sets of matrices that share x against a kernel's answer to whether it takes them in one call
// (shares(outs)): the answer as expected, and every output the bits of its own call, for a decode's
// and a prefill's rows of x, on 2 and 3 threads.
struct SharedXSet {
  const char* what;
  std::vector<WeightMatrix> ws;
  bool shares;
};
template <class Shares>
void expect_sets_share_x(std::span<const SharedXSet> sets, Shares&& shares) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    for (const SharedXSet& set : sets) {
      std::vector<MatmulOutput> outs;
      for (const WeightMatrix& w : set.ws) outs.push_back({&w, nullptr, nullptr});
      EXPECT_EQ(shares(std::span<const MatmulOutput>(outs)), set.shares) << set.what;
      for (int T : {1, 3, 6, 17}) expect_shared_x_equals_separate_calls(set.ws, T, pool, set.what);
    }
  }
}

}  // namespace ptllm::test
