#pragma once
// Helpers of the tests that drive a Scheduler (test_scheduler.cpp, test_kv_store.cpp,
// test_dir_store.cpp): random prompts, and one greedy request run to its end.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <random>
#include <vector>

#include "engine/scheduler.h"

namespace ptllm::test {

// n token ids drawn from [3, vocab) (past the special ids), the same for the same seed.
inline std::vector<int32_t> random_prompt(uint32_t seed, int n, int vocab) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, vocab - 1);
  std::vector<int32_t> p(size_t(n), 0);
  for (auto& x : p) x = id(rng);
  return p;
}

// `prompt` submitted greedy (temperature 0, EOS ignored) for max_tokens, its result once done.
inline RequestResult run_greedy(Scheduler& sch, std::vector<int32_t> prompt, int max_tokens) {
  auto done = std::make_shared<std::promise<RequestResult>>();
  auto fut = done->get_future();
  Request r;
  r.prompt = std::move(prompt);
  r.params.sampling.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.on_done = [done](const RequestResult& res) { done->set_value(res); };
  sch.submit(std::move(r));
  // A bound so that a bug fails the test instead of hanging it (not a timing assertion).
  if (fut.wait_for(std::chrono::minutes(5)) != std::future_status::ready) {
    ADD_FAILURE() << "request did not finish";
    return {};
  }
  return fut.get();
}

}  // namespace ptllm::test
