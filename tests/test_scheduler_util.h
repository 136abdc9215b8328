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

#include "engine/prompt_cache.h"
#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "test_util.h"

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

// Schedulers on kjv-tiny sharing a store (the Redis and directory store tests): one Runtime for the
// suite; config(store) is two sequences of 512 tokens, prefill chunks of 64, with `store` (null:
// none) under the identity the server gives it.
class StoreSchedulerFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { rt_ = new Runtime({repo_model("kjv-tiny"), 2, true}); }
  static void TearDownTestSuite() {
    delete rt_;
    rt_ = nullptr;
  }
  static SchedulerConfig config(KVStore* store, const char* flag = "--kv-store") {
    SchedulerConfig c;
    c.session.kv.ctx_size = 512;
    c.parallel = 2;
    c.prefill_chunk = 64;
    c.eos_ids = {1};
    c.store = store;
    c.store_flag = flag;
    if (store) c.store_identity = prompt_cache_identity(rt_->model(), rt_->tokenizer(), c.session.kv).config_key;
    return c;
  }
  static int vocab() { return rt_->config().vocab_size; }
  static inline Runtime* rt_ = nullptr;
};

}  // namespace ptllm::test
