#include "engine/prompt_blocks.h"

#include <algorithm>

#include "core/error.h"
#include "engine/session.h"
#include "kv/manager.h"
#include "model/model.h"

namespace ptllm {

PromptBlockCache::PromptBlockCache(const Model& model, const KVCacheConfig& kv, KVStore& store, Digest identity,
                                   std::string prefix)
    : store_(store),
      pool_(std::make_unique<KVPool>(model.kv_shape(), kv, 1)),
      exchange_(std::make_unique<BlockExchange>(store, identity, std::move(prefix))),
      at_start_(store.stats()) {
  PTLLM_CHECK(pool_->exchangeable());
}

PromptBlockCache::~PromptBlockCache() = default;

// A cold Session::feed appends the prompt in chunks of max_append() tokens from the first (one
// chunk without a policy); the rest after an adopted prefix is fed the same way from there.
bool PromptBlockCache::exact(const Session& session, int64_t n, int64_t adopted) const {
  if (adopted <= 0 || adopted >= n) return false;
  const KVCache& c = session.cache();
  const int64_t chunk = c.has_policy() ? c.max_append() : n;
  const int64_t grid = c.cut_dependent() ? c.max_append() : 1;
  return adoption_is_exact(n, adopted, chunk, grid);
}

void PromptBlockCache::track(std::span<const int32_t> history) {
  const auto mm = std::mismatch(tokens_.begin(), tokens_.end(), history.begin(), history.end());
  const int64_t common = int64_t(mm.first - tokens_.begin());
  if (common < int64_t(tokens_.size())) {
    const size_t keep = pool_->complete_blocks(common);
    if (hashes_.size() > keep) hashes_.resize(keep);
    saved_ = std::min(saved_, keep);
  }
  tokens_.assign(history.begin(), history.end());
}

PromptBlockLoad PromptBlockCache::prefill(Session& session, std::span<const int32_t> prompt) {
  PTLLM_CHECK(session.history().empty() && session.has_cache() && session.cache().shares_pool() &&
              &session.cache().pool() == pool_.get() && !prompt.empty());
  PromptBlockLoad load;
  const int64_t N = int64_t(prompt.size());
  load.prompt = N;
  tokens_.clear();
  hashes_.clear();
  saved_ = 0;
  track(prompt);

  // The prompt's full blocks, the last token left out (its logits are computed), up to the last one
  // an exact adoption may end with.
  KVManager kv(*pool_);
  const size_t n = kv.adoptable_blocks(N, [&](int64_t a) { return exact(session, N, a); });
  std::vector<int32_t> held;
  if (n > 0) {
    // A conversation started again (/reset) finds its earlier blocks in the pool first.
    const size_t local = kv.get_computed_blocks(prompt, 0, n, hashes_, held);
    if (local < n) {
      const KVStoreStats before = store_.stats();
      // Room kept for the shortest rest to compute: blocks loaded and then not adopted are given back
      // (findable, reclaimable) before the rest is computed.
      const KVPool::TokenRange last = pool_->token_block(n - 1);
      const int rest = int(std::min<int64_t>(N - (last.start + last.len), session.max_chunk()));
      const BlockExchange::Lookup r =
          exchange_->load(*pool_, prompt, hashes_, local, n, kv.prefill_reserve(0, rest), held);
      load.blocks = r.hits;
      load.rejected = r.rejected;
      load.bytes_read = store_.stats().bytes_in - before.bytes_in;
    }
  }
  session.adopt_only_explicitly();
  // The session holds its own references then; the rest of `held` stay findable.
  load.reused = session.adopt_prefix(kv, prompt, [&](int64_t a) { return exact(session, N, a); }, held);
  // Of the adopted blocks, those the store has in their final form already.
  saved_ = kv.final_form_blocks(prompt, hashes_, pool_->complete_blocks(load.reused));
  session.feed(prompt.subspan(size_t(load.reused)));
  save(session, false);
  return load;
}

void PromptBlockCache::save(const Session& session, bool at_end) {
  PTLLM_CHECK(session.has_cache() && &session.cache().pool() == pool_.get());
  const std::vector<int32_t>& hist = session.history();
  track(hist);
  const size_t n = std::min(pool_->complete_blocks(int64_t(hist.size())), pool_->adoptable_limit());
  if (n <= saved_ && !at_end) return;
  if (n > hashes_.size()) pool_->extend_block_hashes(hist, n, hashes_);
  exchange_->save_progress(*pool_, hist, hashes_, &saved_, n, at_end);
  exchange_->reclaim(*pool_);
}

PromptBlockSave PromptBlockCache::finish(const Session& session, std::chrono::milliseconds limit) {
  if (!session.history().empty()) save(session, true);
  PromptBlockSave out;
  out.complete = store_.flush(limit);
  exchange_->reclaim_pinned(*pool_, limit);
  const KVStoreStats s = store_.stats();
  out.blocks = s.writes - at_start_.writes;
  out.bytes = s.bytes_out - at_start_.bytes_out;
  out.dropped = s.dropped_writes - at_start_.dropped_writes;
  at_start_ = s;
  return out;
}

}  // namespace ptllm
