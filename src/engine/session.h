#pragma once
// A Session: the token history, the position counter and the KV cache of one generation.
// Prefill and decode are both `feed`: T tokens in, logits out.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"

namespace ptllm {

class ThreadPool;

struct SessionOptions {
  KVCacheConfig kv;
  bool use_cache = true;  // false: recompute the whole sequence every step (the reference path)
};

class Session {
 public:
  // Throws ptllm::Error if the cache cannot be allocated.
  Session(const Model& model, const SessionOptions& opts, ThreadPool& pool);

  // Feeds tokens (a prompt: one batched pass; a sampled token: one step) and returns the logits
  // of the last one [vocab]. Throws ptllm::Error if the context would exceed --ctx-size.
  std::span<float> feed(std::span<const int32_t> tokens);
  // Same, returning the logits of every fed token [T][vocab] (teacher forcing).
  std::span<float> feed_all(std::span<const int32_t> tokens);

  // Whether `more` tokens can still be fed (always, under StreamingLLM).
  bool fits(int64_t more) const;
  const std::vector<int32_t>& history() const { return history_; }
  int64_t position() const { return int64_t(history_.size()); }
  // The KV cache (not available with use_cache = false).
  const KVCache& cache() const { return *cache_; }
  bool has_cache() const { return cache_ != nullptr; }
  const Model& model() const { return model_; }
  const SessionOptions& options() const { return opts_; }

 private:
  std::span<float> run(std::span<const int32_t> tokens, bool all_logits);

  const Model& model_;
  SessionOptions opts_;
  ThreadPool& pool_;
  std::unique_ptr<KVCache> cache_;
  ForwardState state_;
  std::vector<float> logits_;  // [T][vocab]
  std::vector<int32_t> history_;
};

// The default KV capacity: min(max_position_embeddings, 4096), as DESIGN.md says.
int default_ctx_size(const ModelConfig& cfg);

}  // namespace ptllm
