// KVCache: storage (appending tokens to their blocks), counts and bytes, reading a stored token.
// Attention, the policy, prefix sharing and serialization live beside it (cache_internal.h).
#include "kv/cache_internal.h"

#include <algorithm>
#include <cstring>
#include <string>
#include "kernels/ops.h"
#include "kernels/quant.h"

namespace ptllm {

using namespace kvdetail;

KVCache::KVCache(const KVShape& shape, const KVCacheConfig& cfg, KVPool* pool)
    : shape_(shape),
      cfg_(cfg),
      dense_(dense_dtype(cfg.precision)),
      bits_(kivi_bits(cfg.precision)),
      dense_token_bytes_(2 * size_t(shape.kv_dim()) * dtype_size(dense_dtype(cfg.precision))),
      own_pool_(pool ? nullptr : new KVPool(shape, cfg, 0, 0, false)),
      pool_(pool ? pool : own_pool_.get()),
      dense_pool_(pool_->dense_),
      quant_pool_(pool_->quant_) {
  cfg_.validate();
  PTLLM_CHECK(shape.n_layers > 0 && shape.n_kv_heads > 0 && shape.head_dim > 0 && shape.head_dim % 2 == 0);
  PTLLM_CHECK(shape.layer_window.empty() || int(shape.layer_window.size()) == shape.n_layers);
  if (pool)
    PTLLM_CHECK(pool->cfg_.describe() == cfg_.describe() && pool->cfg_.ctx_size == cfg_.ctx_size &&
                pool->shape_.n_layers == shape.n_layers && pool->shape_.kv_dim() == shape.kv_dim() &&
                pool->shape_.layer_window == shape.layer_window && pool->shape_.kv_source == shape.kv_source &&
                pool->shape_.layer_rope_inv_freq == shape.layer_rope_inv_freq);
  PTLLM_CHECK(shape.layer_rope_inv_freq.empty() || int(shape.layer_rope_inv_freq.size()) == shape.n_layers);
  PTLLM_CHECK(shape.kv_source.empty() || int(shape.kv_source.size()) == shape.n_layers);
  for (int l = 0; l < shape.n_layers; ++l) {
    const int src = shape.source_of(l);
    // A donor is an earlier storing layer with the same window (the model config checks it).
    PTLLM_CHECK(src == l || (src >= 0 && src < l && shape.stores(src) && shape.window_of(src) == shape.window_of(l)));
    if (src == l) stored_.push_back(l);
  }
  windows_ = shape.any_window();
  chunk_ = chunk_for(shape, cfg_);
  const int B = cfg_.group_size;
  unbounded_ = unbounded_for(shape, cfg_);
  layers_.resize(size_t(shape.n_layers));
  size_t dense_blocks = 0, quant_blocks = 0;
  for (int l = 0; l < shape.n_layers; ++l) {
    Layer& layer = layers_[size_t(l)];
    layer.native = shape.window_of(l);
    layer.window = stream_window(shape, cfg_, l);
    if (!shape.stores(l)) continue;  // no blocks: it reads its donor's
    const Bounds b = block_bounds(cfg_, chunk_, layer.window, !unbounded_);
    layer.sinks.reserve(b.sink_blocks);
    layer.stream = Ring(b.dense_stream_blocks + b.quant_blocks);
    dense_blocks += b.sink_blocks + b.dense_stream_blocks;
    quant_blocks += b.quant_blocks;
  }
  if (own_pool_) {
    dense_pool_ = BlockPool(size_t(B) * dense_token_bytes_, dense_blocks, cfg_.preallocate);
    if (bits_ > 0)
      quant_pool_ = BlockPool(size_t(shape.n_kv_heads) * kivi_block_bytes_per_head(B, shape.head_dim, bits_),
                              quant_blocks, cfg_.preallocate);
  }
  if (rotates_at_read()) {
    // Distances a query can have to a key: within the window (or the context), or to a sink; a
    // sliding layer sees every key, sinks too, at its true distance, less than its window.
    // Plus a block: attention rotates a block's keys by their slot in the block and the query by
    // its distance to the block's first slot, which may be before the first key it sees.
    const int64_t full = (cfg_.streaming() ? cfg_.sink + cfg_.window + chunk_ : cfg_.ctx_size) + B;
    int64_t most = 0;
    for (const Layer& layer : layers_) {
      int64_t d = layer.native > 0 ? int64_t(layer.native) + chunk_ + B : full;
      if (!unbounded_) d = std::min<int64_t>(d, int64_t(cfg_.ctx_size) + B);
      most = std::max(most, d);
    }
    max_delta_ = int(most);
    const int half = shape.head_dim / 2;
    const size_t table = size_t(max_delta_) * size_t(half);
    std::vector<const std::vector<float>*> seen;  // the distinct frequency sets, one table each
    rope_table_.assign(size_t(shape.n_layers), 0);
    for (int l = 0; l < shape.n_layers; ++l) {
      const std::vector<float>& f = shape.inv_freq_of(l);
      PTLLM_CHECK(int(f.size()) == half);
      size_t k = 0;
      while (k < seen.size() && *seen[k] != f) ++k;
      if (k == seen.size()) {
        seen.push_back(&f);
        rope_cos_.resize(seen.size() * table);
        rope_sin_.resize(rope_cos_.size());
        for (int d = 0; d < max_delta_; ++d)
          rope_cos_sin(f.data(), half, d, rope_cos_.data() + k * table + size_t(d) * size_t(half),
                       rope_sin_.data() + k * table + size_t(d) * size_t(half));
      }
      rope_table_[size_t(l)] = k * table;
    }
  }
}

KVCache::~KVCache() { clear(); }  // a shared pool gets every reference back

int KVCache::max_append() const {
  if (has_policy()) return chunk_;
  return int(std::max<int64_t>(0, int64_t(cfg_.ctx_size) - n_tokens()));
}

bool KVCache::fits(int64_t more) const { return unbounded_ || n_tokens() + more <= cfg_.ctx_size; }

int64_t KVCache::n_tokens() const {
  return layers_[size_t(stored_.back())].tokens();  // the last layer to append in a step
}

int KVCache::n_stored() const {
  int64_t most = 0;
  for (const Layer& L : layers_) most = std::max(most, L.seen());
  return int(most);
}

int64_t KVCache::held_tokens(int layer) const {
  return layers_[size_t(layer)].held();
}

void KVCache::append(int layer, const float* k, const float* v, int T) {
  Layer& L = layers_[size_t(layer)];
  PTLLM_CHECK(stores(layer));      // a KV-shared layer has no blocks of its own (kv_layer)
  PTLLM_CHECK(T <= max_append());  // max_append() reads the last storing layer, which appends last
  const int B = cfg_.group_size, D = shape_.head_dim, H = shape_.n_kv_heads;
  const size_t elem = dtype_size(dense_);
  for (int t = 0; t < T; ++t) {
    uint8_t* block;
    int slot;
    if (cfg_.streaming() && L.n_sink < cfg_.sink) {
      if (L.n_sink % B == 0) {
        const int32_t id = dense_pool_.acquire();
        PTLLM_CHECK(id >= 0);
        L.sinks.push_back(id);
      }
      block = dense_pool_.data(L.sinks[size_t(L.n_sink / B)]);
      slot = L.n_sink % B;
      ++L.n_sink;
    } else {
      const size_t entry = size_t((L.end - L.begin) / B);
      if (L.end % B == 0) {
        PTLLM_CHECK(entry == L.stream.size());
        const int32_t id = dense_pool_.acquire();
        PTLLM_CHECK(id >= 0);  // the pool is sized for the worst case (block_bounds)
        L.stream.push_back({id, false});
      }
      PTLLM_CHECK(!L.stream[entry].quantized);
      block = dense_pool_.data(L.stream[entry].id);
      slot = int(L.end % B);
      ++L.end;
    }
    const size_t half_bytes = size_t(B) * size_t(shape_.kv_dim()) * elem;
    for (int g = 0; g < H; ++g) {
      const size_t dst = (size_t(g) * size_t(B) + size_t(slot)) * size_t(D) * elem;
      const size_t src = size_t(t) * size_t(shape_.kv_dim()) + size_t(g) * size_t(D);
      store_as(k + src, block + dst, dense_, D);
      store_as(v + src, block + half_bytes + dst, dense_, D);
    }
  }
}

size_t KVCache::logical_bytes() const {
  size_t total = 0;
  for (int l : stored_) total += logical_bytes(l);
  return total;
}

size_t KVCache::logical_bytes(int layer) const {
  const int D = shape_.head_dim, H = shape_.n_kv_heads;
  // KIVI: codes for K and V, V scale+zero per token; K scale+zero per channel for the group.
  TokenBytes bytes{dense_token_bytes_, 0, 0};
  if (bits_ > 0) {
    bytes.quant = size_t(H) * (2 * packed_bytes(D, bits_) + 2 * sizeof(uint16_t));
    bytes.quant_group = size_t(H) * 2 * sizeof(uint16_t) * size_t(D);
  }
  return layers_[size_t(layer)].logical_bytes(cfg_.group_size, bytes);
}

size_t KVCache::physical_bytes() const { return dense_pool_.physical_bytes() + quant_pool_.physical_bytes(); }

KVCache::Located KVCache::locate(int layer, int64_t index) const {
  const BlockTable::Where w = layers_[size_t(layer)].locate(index, cfg_.group_size);
  const Entry& e = w.block;
  return {e.quantized ? quant_pool_.data(e.id) : dense_pool_.data(e.id), e.quantized, w.slot};
}

void KVCache::read_key(int layer, int64_t index, int g, float* out) const {
  const Located at = locate(layer, index);
  const int B = cfg_.group_size, D = shape_.head_dim, H = shape_.n_kv_heads;
  if (!at.quantized) {
    load_from(at.block + (size_t(g) * size_t(B) + size_t(at.slot)) * size_t(D) * dtype_size(dense_), dense_, out, D);
    return;
  }
  const size_t pk = packed_bytes(D, bits_);
  const KiviOffsets o = kivi_offsets(g, H, B, D, pk);
  std::vector<uint8_t> row(pk);
  k_rows_from_group(KRows{at.block + o.kc, B, at.slot}, 1, pk, row.data());
  dequantize_k_group(row.data(), reinterpret_cast<const uint16_t*>(at.block + o.ks),
                     reinterpret_cast<const uint16_t*>(at.block + o.kz), 1, D, bits_, out);
}

void KVCache::read_value(int layer, int64_t index, int g, float* out) const {
  const Located at = locate(layer, index);
  const int B = cfg_.group_size, D = shape_.head_dim, H = shape_.n_kv_heads;
  if (!at.quantized) {
    const size_t half = size_t(B) * size_t(shape_.kv_dim()) * dtype_size(dense_);
    load_from(at.block + half + (size_t(g) * size_t(B) + size_t(at.slot)) * size_t(D) * dtype_size(dense_), dense_, out, D);
    return;
  }
  const size_t pk = packed_bytes(D, bits_);
  const KiviOffsets o = kivi_offsets(g, H, B, D, pk);
  const uint16_t* vs = reinterpret_cast<const uint16_t*>(at.block + o.vs);
  const uint16_t* vz = reinterpret_cast<const uint16_t*>(at.block + o.vz);
  dequantize_v_token(at.block + o.vc + size_t(at.slot) * pk, vs[at.slot], vz[at.slot], D, bits_, out);
}

}  // namespace ptllm
