#include "engine/session.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace ptllm {

int default_ctx_size(const ModelConfig& cfg) { return std::min(cfg.max_position_embeddings, 4096); }

Session::Session(const Model& model, const SessionOptions& opts, ThreadPool& pool)
    : model_(model), opts_(opts), pool_(pool) {
  opts_.kv.validate();
  if (!opts_.use_cache && (opts_.kv.streaming() || opts_.kv.precision != KVPrecision::F32))
    throw UsageError("--no-cache recomputes everything without a KV cache: it cannot be combined with "
                     "StreamingLLM or --kv-quantize");
  if (opts_.use_cache) cache_ = std::make_unique<KVCache>(model.kv_shape(), opts_.kv);
  // Decode steps append to the history without allocating (past ctx_size, under StreamingLLM, it
  // grows by doubling: a handful of allocations over a whole generation).
  history_.reserve(size_t(opts_.kv.ctx_size));
}

std::span<const float> Session::last_logits() const {
  if (history_.empty()) return {};
  const size_t vocab = size_t(model_.config().vocab_size);
  return {logits_.data() + last_row_ * vocab, vocab};
}

void Session::restore(std::span<const int32_t> history, std::string_view kv_state, std::span<const float> last_logits) {
  PTLLM_CHECK(history_.empty() && cache_);
  const size_t vocab = size_t(model_.config().vocab_size);
  if (last_logits.size() != vocab) throw Error("saved state has " + std::to_string(last_logits.size()) + " logits, the model has a vocabulary of " + std::to_string(vocab));
  if (history.empty()) throw Error("saved state has no tokens");
  cache_->deserialize(kv_state);
  if (cache_->n_tokens() != int64_t(history.size())) {
    cache_->clear();
    throw Error("saved state holds " + std::to_string(history.size()) + " token ids but a cache of " + std::to_string(cache_->n_tokens()) + " tokens");
  }
  history_.assign(history.begin(), history.end());
  if (logits_.size() < vocab) logits_.resize(vocab);
  std::copy(last_logits.begin(), last_logits.end(), logits_.begin());
  last_row_ = 0;
}

bool Session::fits(int64_t more) const {
  return cache_ ? cache_->fits(more) : position() + more <= opts_.kv.ctx_size;
}

std::span<float> Session::feed(std::span<const int32_t> tokens) { return run(tokens, false); }
std::span<float> Session::feed_all(std::span<const int32_t> tokens) { return run(tokens, true); }

std::span<float> Session::run(std::span<const int32_t> tokens, bool all_logits) {
  PTLLM_CHECK(!tokens.empty());
  const size_t T = tokens.size();
  const size_t vocab = size_t(model_.config().vocab_size);
  if (!fits(int64_t(T)))
    throw Error("context full: " + std::to_string(position() + int64_t(T)) + " tokens would exceed --ctx-size " +
                std::to_string(opts_.kv.ctx_size));
  const size_t rows = all_logits ? T : 1;
  if (logits_.size() < rows * vocab) logits_.resize(rows * vocab);
  last_row_ = rows - 1;

  if (opts_.use_cache) {
    // In chunks the cache can take at once (StreamingLLM and KIVI bound their full-precision blocks).
    for (size_t done = 0; done < T;) {
      const size_t n = std::min(T - done, size_t(cache_->max_append()));
      const bool last = done + n == T;
      float* dst = all_logits ? logits_.data() + done * vocab : logits_.data();
      if (all_logits || last)
        model_.forward(tokens.subspan(done, n), position(), *cache_, state_, dst, all_logits, pool_);
      else
        model_.forward(tokens.subspan(done, n), position(), *cache_, state_, nullptr, false, pool_);
      history_.insert(history_.end(), tokens.begin() + std::ptrdiff_t(done), tokens.begin() + std::ptrdiff_t(done + n));
      done += n;
    }
    return {logits_.data(), rows * vocab};
  }
  // Reference path: forget everything and run the whole sequence again in one pass.
  const size_t n_prev = history_.size();
  history_.insert(history_.end(), tokens.begin(), tokens.end());
  KVCacheConfig scratch;
  scratch.ctx_size = int(history_.size());
  KVCache fresh(model_.kv_shape(), scratch);
  std::vector<float> all(history_.size() * vocab);
  // One call, unless the model has sliding layers (their blocks are bounded by a window and a chunk).
  for (size_t done = 0; done < history_.size();) {
    const size_t n = std::min(history_.size() - done, size_t(fresh.max_append()));
    model_.forward(std::span<const int32_t>(history_).subspan(done, n), int64_t(done), fresh, state_,
                   all.data() + done * vocab, true, pool_);
    done += n;
  }
  std::copy(all.begin() + std::ptrdiff_t(all_logits ? n_prev * vocab : all.size() - vocab), all.end(), logits_.begin());
  return {logits_.data(), rows * vocab};
}

}  // namespace ptllm
