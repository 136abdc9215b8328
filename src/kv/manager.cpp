#include "kv/manager.h"

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

}  // namespace ptllm
