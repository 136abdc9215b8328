// The policy of a KVCache: what leaves a window, which groups are quantized (KIVI), rewinding.
#include "kv/cache_internal.h"

#include <algorithm>
#include <cstring>
#include <string>
#include "kernels/quant.h"

namespace ptllm {

using namespace kvdetail;

// ---------------------------------------------------------------------------------------------
// Policy: eviction and quantization, after each attention call.

void KVCache::quantize_block(Layer& L, size_t entry) {
  Entry& e = L.stream[entry];
  PTLLM_CHECK(!e.quantized && dense_ == DType::F32);
  const int B = cfg_.group_size, D = shape_.head_dim, H = shape_.n_kv_heads;
  // On a shared pool another sequence may have quantized this very content already (quantization is
  // a function of the group's content): take its group instead.
  if (const BlockKey* key = dense_pool_.key_of(e.id)) {
    BlockKey qkey = *key;
    qkey.quantized = true;
    const int32_t hit = quant_pool_.find(qkey, dense_pool_.tokens_of(e.id));
    if (hit >= 0) {
      dense_pool_.release(e.id);
      e = {hit, true};
      return;
    }
  }
  const size_t pk = packed_bytes(D, bits_);
  const int32_t qid = quant_pool_.acquire();
  PTLLM_CHECK(qid >= 0);  // a private pool is sized for the worst case; a shared one is checked before the step
  const float* src = reinterpret_cast<const float*>(dense_pool_.data(e.id));
  const float* vsrc = src + size_t(B) * size_t(shape_.kv_dim());
  uint8_t* blk = quant_pool_.data(qid);
  auto u16 = [&](size_t off) { return reinterpret_cast<uint16_t*>(blk + off); };
  for (int g = 0; g < H; ++g) {
    const KiviOffsets o = kivi_offsets(g, H, B, D, pk);
    // K: one (scale, zero) per channel over the group, computed once, never again.
    quantize_k_group(src + size_t(g) * size_t(B) * size_t(D), size_t(D), B, D, bits_, blk + o.kc, u16(o.ks),
                     u16(o.kz));
    // V: one (scale, zero) per token.
    for (int j = 0; j < B; ++j)
      quantize_v_token(vsrc + (size_t(g) * size_t(B) + size_t(j)) * size_t(D), D, bits_, blk + o.vc + size_t(j) * pk,
                       u16(o.vs) + j, u16(o.vz) + j);
  }
  if (const BlockKey* key = dense_pool_.key_of(e.id)) {
    BlockKey qkey = *key;
    qkey.quantized = true;
    quant_pool_.publish(qid, qkey, dense_pool_.tokens_of(e.id), dense_pool_.retention(e.id));
  }
  dense_pool_.release(e.id);
  e = {qid, true};
}

void KVCache::apply_policy(int layer) {
  if (!stores(layer)) return;  // a KV-shared layer: its donor's policy runs on the blocks it reads
  Layer& L = layers_[size_t(layer)];
  const int B = cfg_.group_size;
  // StreamingLLM or a sliding layer: give back blocks whose every token is out of the last query's window.
  if (L.window > 0) {
    const int64_t lo = L.end - L.window;
    while (!L.stream.empty() && L.begin + B <= lo) L.release_front(dense_pool_, quant_pool_, B);
  }
  // KIVI: the residual keeps at least R recent tokens; each full group beyond them is quantized.
  if (bits_ > 0) {
    while (L.n_quant < L.stream.size()) {
      const int64_t residual_start = L.begin + int64_t(L.n_quant) * B;
      if (L.end - residual_start < int64_t(cfg_.residual) + B) break;
      quantize_block(L, L.n_quant);
      ++L.n_quant;
    }
  }
}

// ---------------------------------------------------------------------------------------------

int64_t KVCache::rewind_floor() const {
  int64_t floor = 0;
  for (const Layer& L : layers_) floor = std::max(floor, L.rewind_floor(cfg_.group_size));
  return floor;
}

void KVCache::truncate(int64_t n) {
  if (n < 0 || n > n_tokens())
    throw Error("cannot rewind to " + std::to_string(n) + " tokens: the cache holds " + std::to_string(n_tokens()));
  if (n < rewind_floor())
    throw Error("cannot rewind to " + std::to_string(n) + " tokens: tokens before " + std::to_string(rewind_floor()) +
                " have been evicted or quantized");
  if (shares_pool() && dense_pool_.available() < 2 * stored_.size())
    throw KVPoolFull("KV pool: no room to rewind (a shared block would be copied)");
  const int B = cfg_.group_size;
  for (Layer& L : layers_) {
    L.truncate(n, B, dense_pool_);
    // The next append writes into the block now partly filled: it must be this sequence's alone.
    if (L.n_sink < cfg_.sink && L.n_sink % B != 0) own_block(L.sinks.back());
    if ((L.end - L.begin) % B != 0) own_block(L.stream[L.stream.size() - 1].id);
  }
  n_keyed_ = 0;  // the keys are derived again from the history at the next step
  tail_ids_.clear();
  last_n_ = n;
  narrow_hi_ = std::min(narrow_hi_, n);
  if (narrow_lo_ >= n) narrow_lo_ = narrow_hi_ = 0;  // rewound to before the first narrow append
  canon_ = std::min(canon_, n);
  stepped_ = n;
  if (n <= shifted_from_) shifted_from_ = -1;  // what is left was computed here
}

void KVCache::own_block(int32_t& id) {
  if (dense_pool_.refs(id) == 1) {
    dense_pool_.unpublish(id);
    return;
  }
  const int32_t copy = dense_pool_.acquire();
  PTLLM_CHECK(copy >= 0);  // truncate() checked the room first
  std::memcpy(dense_pool_.data(copy), dense_pool_.data(id), size_t(cfg_.group_size) * dense_token_bytes_);
  dense_pool_.release(id);
  id = copy;
}

void KVCache::clear() {
  publish_tail();
  tail_ids_.clear();
  last_n_ = narrow_lo_ = narrow_hi_ = 0;
  n_keyed_ = 0;
  shifted_from_ = -1;
  canon_ = stepped_ = 0;
  for (Layer& L : layers_) L.clear(dense_pool_, quant_pool_, cfg_.group_size);
}

}  // namespace ptllm
