#include "kv/manager.h"

#include <algorithm>

#include "core/error.h"
#include "kv/block_table.h"

namespace ptllm {

KVManager::KVManager(KVPool& pool) : pool_(pool) {
  for (int l = 0; l < pool.shape().n_layers; ++l) stored_layers_ += pool.shape().stores(l) ? 1 : 0;
}

size_t KVManager::decode_reserve(size_t running) const { return running * stored_layers_; }

size_t KVManager::prefill_reserve(size_t running, int chunk) const {
  const size_t chunk_blocks = kvdetail::ceil_div(chunk, pool_.config().group_size) + 1;
  return (running + chunk_blocks) * stored_layers_;
}

bool KVManager::can_append(const KVCache& cache, int T, size_t reserve) const {
  const BlocksNeeded need = cache.blocks_needed(T);
  return need.dense + reserve <= pool_.dense().available() && need.quant <= pool_.quant().available();
}

void KVManager::add_need(const KVCache& cache, int T, BlocksNeeded& sum) const {
  const BlocksNeeded n = cache.blocks_needed(T);
  sum.dense += n.dense;
  sum.quant += n.quant;
}

bool KVManager::fits(const BlocksNeeded& sum) const {
  return sum.dense <= pool_.dense().available() && sum.quant <= pool_.quant().available();
}

int64_t KVManager::complete_tokens(int64_t n) const {
  const size_t blocks = pool_.complete_blocks(n);
  if (blocks == 0) return 0;
  const KVPool::TokenRange last = pool_.token_block(blocks - 1);
  return last.start + last.len;
}

size_t KVManager::held_bytes(size_t blocks, bool quantized) const {
  return blocks * (quantized ? pool_.quant() : pool_.dense()).block_bytes();
}

size_t KVManager::capacity_bytes() const {
  return pool_.dense().capacity() * pool_.dense().block_bytes() + pool_.quant().capacity() * pool_.quant().block_bytes();
}

size_t KVManager::adoptable_blocks(int64_t n, const std::function<bool(int64_t)>& exact) const {
  if (n < 1) return 0;
  size_t m = std::min(pool_.complete_blocks(n - 1), pool_.adoptable_limit());
  while (m > 0) {
    const KVPool::TokenRange last = pool_.token_block(m - 1);
    if (exact(last.start + last.len)) break;
    --m;
  }
  return m;
}

size_t KVManager::get_computed_blocks(std::span<const int32_t> tokens, size_t first, size_t n,
                                      std::vector<BlockHash>& hashes, std::vector<int32_t>& held) {
  if (n == 0) return 0;
  pool_.extend_block_hashes(tokens, n, hashes);
  const bool kivi = pool_.has_quantized_form();
  size_t j = first;
  while (j < n) {
    const KVPool::TokenRange tb = pool_.token_block(j);
    const auto ids = tokens.subspan(size_t(tb.start), size_t(tb.len));
    if (!pool_.hold_block(hashes[j], ids, held) &&
        !(kivi && j >= pool_.sink_blocks() && pool_.hold_block(hashes[j], ids, held, true)))
      break;
    ++j;
  }
  return j - first;
}

size_t KVManager::final_form_blocks(std::span<const int32_t> tokens, std::span<const BlockHash> hashes,
                                    size_t adopted) {
  if (!pool_.has_quantized_form() || adopted == 0) return adopted;
  size_t n = std::min(adopted, pool_.sink_blocks());
  std::vector<int32_t> held;
  while (n < adopted && n < hashes.size()) {
    const KVPool::TokenRange tb = pool_.token_block(n);
    if (!pool_.hold_block(hashes[n], tokens.subspan(size_t(tb.start), size_t(tb.len)), held, true)) break;
    pool_.release_held(held);
    ++n;
  }
  return n;
}

int64_t KVManager::allocate_computed(KVCache& cache, std::span<const int32_t> tokens,
                                     const std::function<bool(int64_t)>& accept, std::vector<int32_t>& held) {
  PTLLM_CHECK(&cache.pool() == &pool_);
  const int64_t n = cache.adopt_prefix(tokens, accept);
  free(held);
  return n;
}

void KVManager::free(KVCache& cache) { cache.clear(); }

void KVManager::free(std::vector<int32_t>& held) { pool_.release_held(held); }

}  // namespace ptllm
