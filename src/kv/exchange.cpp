// Token blocks in and out of a shared pool as bytes, for a block store outside the process
// (persist/kv_store.h): what one replica computed, another loads instead of computing.
#include <cstring>

#include "kv/cache_internal.h"

namespace ptllm {

using namespace kvdetail;

// A keyed pool exchanges every token block in full precision, and under KIVI a stream block also as
// its quantized group (the header's comment says why both are exact); a pool without keys has
// nothing to find blocks by.
bool KVPool::exchangeable() const { return keyed_; }

size_t KVPool::exchange_bytes(bool quantized) const {
  size_t stored = 0;
  for (int l = 0; l < shape_.n_layers; ++l) stored += shape_.stores(l) ? 1 : 0;
  return stored * (quantized ? quant_.block_bytes() : dense_.block_bytes());
}

size_t KVPool::sink_blocks() const { return ceil_div(cfg_.streaming() ? cfg_.sink : 0, cfg_.group_size); }

void KVPool::extend_block_hashes(std::span<const int32_t> tokens, size_t n_blocks, std::vector<BlockHash>& hashes) const {
  PTLLM_CHECK(complete_blocks(int64_t(tokens.size())) >= n_blocks);
  for (size_t j = hashes.size(); j < n_blocks; ++j) {
    const Key128 parent = j == 0 ? root_key(shape_, cfg_) : hashes[j - 1];
    const TokenRange tb = token_block(j);
    hashes.push_back(chain_key(parent, tb.start, tokens.subspan(size_t(tb.start), size_t(tb.len))));
  }
}

// `held` keeps a full-precision block's id as it is and a KIVI group's as ~id (negative), so that
// release_held knows the pool each came from.
namespace {
int32_t held_id(int32_t id, bool quantized) { return quantized ? ~id : id; }
}  // namespace

bool KVPool::hold_block(const BlockHash& h, std::span<const int32_t> ids, std::vector<int32_t>& held, bool quantized) {
  PTLLM_CHECK(exchangeable() && !ids.empty() && ids.size() <= size_t(cfg_.group_size));
  PTLLM_CHECK(!quantized || (has_quantized_form() && ids.size() == size_t(cfg_.group_size)));
  BlockPool& pool = quantized ? quant_ : dense_;
  const size_t mark = held.size();
  for (int l = 0; l < shape_.n_layers; ++l) {
    if (!shape_.stores(l)) continue;
    const int32_t id = pool.find({h.lo, h.hi, int32_t(l), quantized}, ids);
    if (id < 0) {
      std::vector<int32_t> back(held.begin() + std::ptrdiff_t(mark), held.end());
      held.resize(mark);
      release_held(back);
      return false;
    }
    held.push_back(held_id(id, quantized));
  }
  return true;
}

bool KVPool::read_block(const BlockHash& h, std::span<const int32_t> ids, std::string& out, bool quantized) {
  std::vector<int32_t> held;
  if (!hold_block(h, ids, held, quantized)) return false;
  const size_t B = size_t(cfg_.group_size), n = ids.size();
  const size_t row = size_t(shape_.head_dim) * dtype_size(dense_dtype(cfg_.precision));  // one token of one head
  BlockPool& pool = quantized ? quant_ : dense_;
  for (int32_t id : held) {
    const size_t at = out.size();
    out.append(reinterpret_cast<const char*>(pool.data(quantized ? ~id : id)), pool.block_bytes());
    // A short (sink) block's slots past its tokens hold whatever the block held before: zeros instead,
    // so that no other sequence's bytes leave the process. K [kv_head][slot][head_dim], then V alike.
    if (n < B)
      for (size_t part = 0; part < size_t(2 * shape_.n_kv_heads); ++part)
        std::memset(out.data() + at + (part * B + n) * row, 0, (B - n) * row);
  }
  release_held(held);
  return true;
}

bool KVPool::view_block(const BlockHash& h, std::span<const int32_t> ids, std::vector<int32_t>& held,
                        std::vector<std::string_view>& parts, bool quantized) {
  const size_t mark = held.size();
  if (ids.size() != size_t(cfg_.group_size) || !hold_block(h, ids, held, quantized)) return false;
  BlockPool& pool = quantized ? quant_ : dense_;
  for (size_t i = mark; i < held.size(); ++i)
    parts.emplace_back(reinterpret_cast<const char*>(pool.data(quantized ? ~held[i] : held[i])), pool.block_bytes());
  return true;
}

bool KVPool::import_block(const BlockHash& h, std::span<const int32_t> ids, std::string_view bytes,
                          std::vector<int32_t>& held, bool quantized) {
  PTLLM_CHECK(exchangeable() && !ids.empty() && ids.size() <= size_t(cfg_.group_size) &&
              bytes.size() == exchange_bytes(quantized));
  PTLLM_CHECK(!quantized || (has_quantized_form() && ids.size() == size_t(cfg_.group_size)));
  BlockPool& pool = quantized ? quant_ : dense_;
  const size_t mark = held.size(), n = pool.block_bytes();
  size_t at = 0;
  for (int l = 0; l < shape_.n_layers; ++l) {
    if (!shape_.stores(l)) continue;
    const BlockKey key{h.lo, h.hi, int32_t(l), quantized};
    int32_t id = pool.find(key, ids);  // this layer's block is here already (another sequence computed it)
    if (id < 0) {
      id = pool.acquire();
      if (id < 0) {
        std::vector<int32_t> back(held.begin() + std::ptrdiff_t(mark), held.end());
        held.resize(mark);
        release_held(back);
        return false;
      }
      std::memcpy(pool.data(id), bytes.data() + at, n);
      PTLLM_CHECK(pool.publish(id, key, ids));  // find() just said no block holds the key
    }
    held.push_back(held_id(id, quantized));
    at += n;
  }
  return true;
}

void KVPool::release_held(std::vector<int32_t>& held) {
  for (int32_t id : held) {
    if (id >= 0) dense_.release(id);
    else quant_.release(~id);
  }
  held.clear();
}

}  // namespace ptllm
