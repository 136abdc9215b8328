#include "engine/session.h"

#include <algorithm>
#include <array>
#include <string>

#include "core/error.h"
#include "kernels/ops.h"
#include "kv/manager.h"

namespace ptllm {

int default_ctx_size(const ModelConfig& cfg) { return std::min(cfg.max_position_embeddings, 4096); }

Session::Session(const Model& model, const SessionOptions& opts, ThreadPool& pool, KVPool* kv_pool)
    : model_(model), opts_(opts), pool_(pool) {
  opts_.kv.validate();
  if (!opts_.use_cache && (opts_.kv.streaming() || opts_.kv.precision != KVPrecision::F32))
    throw UsageError("--no-cache recomputes everything without a KV cache: it cannot be combined with "
                     "StreamingLLM or --kv-quantize");
  if (opts_.use_cache) cache_ = std::make_unique<KVCache>(model.kv_shape(), opts_.kv, kv_pool);
  PTLLM_CHECK(opts_.use_cache || !kv_pool);
  // Decode steps append to the history without allocating (past ctx_size, under StreamingLLM, it
  // grows by doubling: a handful of allocations over a whole generation).
  history_.reserve(size_t(opts_.kv.ctx_size));
}

std::span<const float> Session::last_logits() const {
  if (history_.empty() || !logits_valid_) return {};
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
  cache_->end_step(history_);
  if (logits_.size() < vocab) logits_.resize(vocab);
  std::copy(last_logits.begin(), last_logits.end(), logits_.begin());
  last_row_ = 0;
  logits_valid_ = true;
}

int Session::max_chunk() const {
  PTLLM_CHECK(cache_);
  return cache_->max_append();
}

void Session::feed_batch(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> tokens,
                         ForwardState& st, std::span<const uint8_t> drafts) {
  PTLLM_CHECK(sessions.size() == tokens.size() && !sessions.empty());
  PTLLM_CHECK(drafts.empty() || drafts.size() == sessions.size());
  auto is_draft = [&](size_t i) { return !drafts.empty() && drafts[i] != 0; };
  const Model& model = sessions[0]->model_;
  const size_t vocab = size_t(model.config().vocab_size);
  PTLLM_CHECK(sessions.size() <= kMaxBatchSequences);
  for (size_t i = 0; i < sessions.size(); ++i) {
    const Session& s = *sessions[i];
    PTLLM_CHECK(&s.model_ == &model && s.cache_ && !tokens[i].empty());
    if (!s.fits(int64_t(tokens[i].size())))
      throw Error("context full: " + std::to_string(s.position() + int64_t(tokens[i].size())) +
                  " tokens would exceed --ctx-size " + std::to_string(s.opts_.kv.ctx_size));
    PTLLM_CHECK(int(tokens[i].size()) <= s.max_chunk() && s.draft_from_ < 0);
    PTLLM_CHECK(!is_draft(i) || (int(tokens[i].size()) <= s.max_draft_append() && !s.history_.empty()));
  }
  check_room(sessions, tokens);
  std::array<SequenceBatch, kMaxBatchSequences> items;
  for (size_t i = 0; i < sessions.size(); ++i) {
    Session& s = *sessions[i];
    const size_t rows = is_draft(i) ? tokens[i].size() : 1;
    if (s.logits_.size() < rows * vocab) s.logits_.resize(rows * vocab);
    s.last_row_ = rows - 1;
    items[i] = SequenceBatch{s.cache_.get(), tokens[i], s.position(), s.logits_.data(), is_draft(i)};
  }
  model.forward(std::span(items.data(), sessions.size()), st, sessions[0]->pool_);
  for (size_t i = 0; i < sessions.size(); ++i) {
    Session& s = *sessions[i];
    if (is_draft(i)) s.draft_from_ = s.position();
    s.history_.insert(s.history_.end(), tokens[i].begin(), tokens[i].end());
    if (!is_draft(i)) s.cache_->end_step(s.history_);
    s.reused_ = 0;
    s.logits_valid_ = true;
  }
}

// A shared pool must have room for the step's blocks before anything is written (a private pool is
// sized for the worst case). Sessions on one pool add up.
namespace {
void require_room(const KVPool& p, const BlocksNeeded& need) {
  if (need.dense > p.dense().available() || need.quant > p.quant().available())
    throw KVPoolFull("KV pool full: " + std::to_string(p.blocks_in_use()) + " blocks in use; the step needs " +
                     std::to_string(need.dense + need.quant) +
                     " more (raise --kv-budget-mb, or pause or end a sequence)");
}
}  // namespace

void Session::check_room(int T) const {
  if (cache_->shares_pool()) require_room(cache_->pool(), cache_->blocks_needed(T));
}

void Session::check_room(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> tokens) {
  // Distinct pools are few (usually one): each is summed from the first session that draws from it.
  for (size_t i = 0; i < sessions.size(); ++i) {
    const KVCache& c = *sessions[i]->cache_;
    if (!c.shares_pool()) continue;
    bool first = true;
    for (size_t j = 0; j < i && first; ++j) first = &sessions[j]->cache_->pool() != &c.pool();
    if (!first) continue;
    BlocksNeeded sum;
    for (size_t j = i; j < sessions.size(); ++j)
      if (&sessions[j]->cache_->pool() == &c.pool()) {
        const BlocksNeeded n = sessions[j]->cache_->blocks_needed(int(tokens[j].size()));
        sum.dense += n.dense;
        sum.quant += n.quant;
      }
    require_room(c.pool(), sum);
  }
}

int Session::max_draft_append() const {
  PTLLM_CHECK(cache_);
  return std::min(cache_->max_append(), cache_->exact_append());
}

std::span<float> Session::feed_draft(std::span<const int32_t> tokens) {
  PTLLM_CHECK(cache_ && draft_from_ < 0 && !tokens.empty() && !history_.empty());
  const size_t T = tokens.size(), vocab = size_t(model_.config().vocab_size);
  PTLLM_CHECK(int(T) <= max_draft_append());
  if (!fits(int64_t(T)))
    throw Error("context full: " + std::to_string(position() + int64_t(T)) + " tokens would exceed --ctx-size " +
                std::to_string(opts_.kv.ctx_size));
  check_room(int(T));
  if (logits_.size() < T * vocab) logits_.resize(T * vocab);
  model_.forward(tokens, position(), *cache_, state_, logits_.data(), true, pool_);
  draft_from_ = position();
  history_.insert(history_.end(), tokens.begin(), tokens.end());
  last_row_ = T - 1;
  logits_valid_ = true;
  reused_ = 0;
  return {logits_.data(), T * vocab};
}

void Session::commit_draft(int64_t n) {
  PTLLM_CHECK(draft_from_ >= 0 && n >= 1 && draft_from_ + n <= position());
  cache_->drop_unstepped(draft_from_ + n);
  history_.resize(size_t(draft_from_ + n));
  cache_->end_step(history_);
  last_row_ = size_t(n - 1);
  draft_from_ = -1;
}

std::span<float> Session::draft_rows() {
  PTLLM_CHECK(draft_from_ >= 0);
  const size_t vocab = size_t(model_.config().vocab_size);
  return {logits_.data(), size_t(position() - draft_from_) * vocab};
}

void Session::truncate(int64_t n) {
  if (n < 0 || n > position())
    throw Error("cannot rewind to " + std::to_string(n) + " tokens: the session holds " + std::to_string(position()));
  if (n == position()) return;
  if (cache_) cache_->truncate(n);
  history_.resize(size_t(n));
  last_row_ = 0;
  logits_valid_ = false;
}

bool Session::fits(int64_t more) const {
  return cache_ ? cache_->fits(more) : position() + more <= opts_.kv.ctx_size;
}

int64_t Session::adopt_prefix(std::span<const int32_t> prompt, const std::function<bool(int64_t)>& accept) {
  PTLLM_CHECK(history_.empty());
  reused_ = 0;
  if (!cache_ || !cache_->shares_pool()) return 0;
  // A prompt's blocks other sequences already computed are taken, not computed again.
  reused_ = cache_->adopt_prefix(prompt, accept);
  history_.insert(history_.end(), prompt.begin(), prompt.begin() + std::ptrdiff_t(reused_));
  if (reused_ > 0) cache_->end_step(history_);
  return reused_;
}

int64_t Session::adopt_prefix(KVManager& kv, std::span<const int32_t> prompt,
                              const std::function<bool(int64_t)>& accept, std::vector<int32_t>& held) {
  PTLLM_CHECK(history_.empty() && cache_ && cache_->shares_pool());
  reused_ = kv.allocate_computed(*cache_, prompt, accept, held);
  history_.insert(history_.end(), prompt.begin(), prompt.begin() + std::ptrdiff_t(reused_));
  if (reused_ > 0) cache_->end_step(history_);
  return reused_;
}

void Session::release(KVManager& kv) {
  if (cache_) kv.free(*cache_);
  history_.clear();
  reused_ = 0;
  draft_from_ = -1;
  logits_valid_ = false;
}

void Session::append_shifted(std::span<const int32_t> ids, int64_t delta, uint64_t salt,
                             const std::function<void(int layer, float* k, float* v)>& rows) {
  PTLLM_CHECK(cache_ && draft_from_ < 0 && !ids.empty() && int(ids.size()) <= max_chunk() && fits(int64_t(ids.size())));
  const int T = int(ids.size());
  const size_t n = size_t(T) * size_t(cache_->shape().kv_dim());
  shift_k_.resize(n);
  shift_v_.resize(n);
  if (cache_->shifted_from() < 0) cache_->mark_shifted(salt);
  for (int l = 0; l < cache_->shape().n_layers; ++l) {
    if (!cache_->stores(l)) continue;
    rows(l, shift_k_.data(), shift_v_.data());
    cache_->append_shifted(l, shift_k_.data(), shift_v_.data(), T, delta);
  }
  history_.insert(history_.end(), ids.begin(), ids.end());
  cache_->end_step(history_);
  logits_valid_ = false;
}

std::span<float> Session::feed(std::span<const int32_t> tokens) { return run(tokens, false); }
std::span<float> Session::feed_all(std::span<const int32_t> tokens) { return run(tokens, true); }

std::span<float> Session::run(std::span<const int32_t> tokens, bool all_logits) {
  PTLLM_CHECK(!tokens.empty() && draft_from_ < 0);
  const size_t T = tokens.size();
  const size_t vocab = size_t(model_.config().vocab_size);
  if (!fits(int64_t(T)))
    throw Error("context full: " + std::to_string(position() + int64_t(T)) + " tokens would exceed --ctx-size " +
                std::to_string(opts_.kv.ctx_size));
  const size_t rows = all_logits ? T : 1;
  if (logits_.size() < rows * vocab) logits_.resize(rows * vocab);
  last_row_ = rows - 1;
  logits_valid_ = true;

  if (opts_.use_cache) {
    reused_ = 0;
    size_t done = 0;
    if (history_.empty() && !all_logits && auto_adopt_) done = size_t(adopt_prefix(tokens));
    // In chunks the cache can take at once (StreamingLLM and KIVI bound their full-precision blocks).
    while (done < T) {
      const size_t n = std::min(T - done, size_t(cache_->max_append()));
      check_room(int(n));
      const bool last = done + n == T;
      float* dst = all_logits ? logits_.data() + done * vocab : logits_.data();
      if (all_logits || last)
        model_.forward(tokens.subspan(done, n), position(), *cache_, state_, dst, all_logits, pool_);
      else
        model_.forward(tokens.subspan(done, n), position(), *cache_, state_, nullptr, false, pool_);
      history_.insert(history_.end(), tokens.begin() + std::ptrdiff_t(done), tokens.begin() + std::ptrdiff_t(done + n));
      cache_->end_step(history_);
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
  // One call, unless the model has sliding layers (their blocks are bounded by a window and a chunk:
  // the policy gives back what left the window after each chunk).
  for (size_t done = 0; done < history_.size();) {
    const size_t n = std::min(history_.size() - done, size_t(fresh.max_append()));
    model_.forward(std::span<const int32_t>(history_).subspan(done, n), int64_t(done), fresh, state_,
                   all.data() + done * vocab, true, pool_);
    done += n;
    fresh.end_step(std::span<const int32_t>(history_).first(done));
  }
  std::copy(all.begin() + std::ptrdiff_t(all_logits ? n_prev * vocab : all.size() - vocab), all.end(), logits_.begin());
  return {logits_.data(), rows * vocab};
}

bool adoption_is_exact(int64_t n, int64_t adopted, int64_t chunk, int64_t grid) {
  PTLLM_CHECK(chunk > 0 && grid > 0 && adopted >= 0 && adopted < n);
  if (adopted % grid != 0) return false;
  const int64_t cold = (n - 1) % chunk + 1, warm = (n - adopted - 1) % chunk + 1;  // the last appends
  return cold == warm || (cold > kMatmulSmallRows && warm > kMatmulSmallRows);
}

}  // namespace ptllm
