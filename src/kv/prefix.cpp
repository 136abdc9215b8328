// The shared KV pool and prefix sharing: full blocks published under their content keys after a
// step, found and adopted by the next sequence whose prompt begins the same way.
#include "kv/cache_internal.h"
#include "kernels/ops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <xxhash.h>

namespace ptllm {

using namespace kvdetail;

KVPool::KVPool(const KVShape& shape, const KVCacheConfig& cfg, size_t dense_blocks, size_t quant_blocks, bool keyed)
    : shape_(shape),
      cfg_(cfg),
      keyed_(keyed),
      dense_(size_t(cfg.group_size) * 2 * size_t(shape.kv_dim()) * dtype_size(dense_dtype(cfg.precision)), dense_blocks,
             cfg.preallocate, keyed ? cfg.group_size : 0),
      quant_(kivi_bits(cfg.precision) ? size_t(shape.n_kv_heads) * kivi_block_bytes_per_head(cfg.group_size, shape.head_dim,
                                                                                                kivi_bits(cfg.precision))
                                      : 0,
             quant_blocks, cfg.preallocate, keyed ? cfg.group_size : 0) {}

KVPool::KVPool(const KVShape& shape, const KVCacheConfig& cfg, int sequences, size_t budget_bytes)
    : KVPool(shape, cfg, 0, 0, true) {
  cfg.validate();
  PTLLM_CHECK(sequences > 0);
  auto [dense, quant] = blocks_per_sequence(shape, cfg);
  dense *= size_t(sequences);
  quant *= size_t(sequences);
  const size_t dense_bytes = size_t(cfg.group_size) * 2 * size_t(shape.kv_dim()) * dtype_size(dense_dtype(cfg.precision));
  const size_t quant_bytes = quant ? size_t(shape.n_kv_heads) * kivi_block_bytes_per_head(cfg.group_size, shape.head_dim,
                                                                                           kivi_bits(cfg.precision))
                                   : 0;
  if (budget_bytes > 0) {
    const double worst = double(dense * dense_bytes + quant * quant_bytes);
    const double f = double(budget_bytes) / worst;
    dense = size_t(double(dense) * f);
    quant = size_t(double(quant) * f);
    if (dense < size_t(shape.n_layers))
      throw UsageError("--kv-budget-mb: " + std::to_string(budget_bytes >> 20) +
                       " MiB holds less than one block per layer for this model and KV configuration");
  }
  dense_ = BlockPool(dense_bytes, dense, cfg.preallocate, cfg.group_size);
  quant_ = BlockPool(quant_bytes, quant, cfg.preallocate, cfg.group_size);
}

size_t KVPool::shared_bytes() const {
  size_t total = 0;
  for (const BlockPool* p : {&dense_, &quant_}) {
    size_t n = 0;
    for (size_t id = 0; id < p->capacity(); ++id)
      if (p->refs(int32_t(id)) > 1) ++n;
    total += n * p->block_bytes();
  }
  return total;
}


// ---------------------------------------------------------------------------------------------
// Prefix sharing. The token blocks of a sequence are its sink blocks (the first N tokens in blocks of
// B, the last one shorter when B does not divide N), then stream blocks of B tokens; every layer
// stores them alike. A token block's key chains the previous one's with its first index and token
// ids (XXH3-128), from a root that hashes the KV settings and the shape: two blocks share a key only
// if every token before and in them is the same, and so are their bytes.

Key128 kvdetail::root_key(const KVShape& shape, const KVCacheConfig& cfg) {
  const std::string salt = cfg.describe() + " L" + std::to_string(shape.n_layers) + " H" +
                           std::to_string(shape.n_kv_heads) + " D" + std::to_string(shape.head_dim);
  const XXH128_hash_t h = XXH3_128bits(salt.data(), salt.size());
  return {h.low64, h.high64};
}

Key128 kvdetail::chain_key(Key128 parent, int64_t start, std::span<const int32_t> tokens) {
  const XXH128_hash_t t = XXH3_128bits(tokens.data(), tokens.size_bytes());
  const uint64_t words[5] = {parent.lo, parent.hi, uint64_t(start), t.low64, t.high64};
  const XXH128_hash_t h = XXH3_128bits(words, sizeof words);
  return {h.low64, h.high64};
}

KVPool::TokenRange KVPool::token_block(size_t j) const {
  const int B = cfg_.group_size, N = cfg_.streaming() ? cfg_.sink : 0;
  const size_t n_sink_blocks = ceil_div(N, B);
  if (j < n_sink_blocks) return {int64_t(j) * B, std::min(B, N - int(j) * B)};
  return {N + int64_t(j - n_sink_blocks) * B, B};
}

size_t KVPool::complete_blocks(int64_t n) const {
  const int B = cfg_.group_size, N = cfg_.streaming() ? cfg_.sink : 0;
  if (n <= 0) return 0;
  if (n < N) return size_t(n / B);  // the sink blocks wholly within n (the last, short one ends at N)
  return ceil_div(N, B) + size_t((n - N) / B);
}

int KVPool::policy_chunk() const { return kChunk; }

size_t KVPool::adoptable_limit() const {
  // Adoption leaves two blocks of each layer's ring for the tail (KVCache::adoptable_blocks): the
  // narrowest ring over the storing layers bounds them all.
  const int chunk = chunk_for(shape_, cfg_);
  const bool bounded = !unbounded_for(shape_, cfg_);
  size_t ring = SIZE_MAX;
  for (int l = 0; l < shape_.n_layers; ++l) {
    if (!shape_.stores(l)) continue;
    const Bounds b = block_bounds(cfg_, chunk, stream_window(shape_, cfg_, l), bounded);
    ring = std::min(ring, b.dense_stream_blocks + b.quant_blocks);
  }
  return ceil_div(cfg_.streaming() ? cfg_.sink : 0, cfg_.group_size) + (ring > 2 ? ring - 2 : 0);
}

// Whether token t, appended in a step that began with s tokens stored, was computed as a cold
// computation (appends of chunk_ tokens from the first) computes it: its query saw the groups the
// policy had quantized at s, the cold one those at c, the start of t's chunk; they are the same when
// no group is quantized in between. Group k (stream tokens kB..kB+B-1) is quantized once the stream
// holds R tokens past it: at N + (k+1)B + R tokens (a conservative set: a window may evict it first).
bool KVCache::same_cut(int64_t t, int64_t s) const {
  const int64_t c = t / chunk_ * chunk_, lo = std::min(s, c), hi = std::max(s, c);
  const int64_t B = cfg_.group_size;
  const int64_t first = int64_t(cfg_.streaming() ? cfg_.sink : 0) + cfg_.residual + B;  // k = 0
  const int64_t next = lo < first ? first : first + ((lo - first) / B + 1) * B;  // the first event after lo
  return next > hi;
}

void KVCache::end_step(std::span<const int32_t> history) {
  PTLLM_CHECK(int64_t(history.size()) == n_tokens());
  const int64_t n = int64_t(history.size());
  int64_t publish_to = n;
  if (cut_dependent()) {
    if (canon_ == stepped_)
      while (canon_ < n && same_cut(canon_, stepped_)) ++canon_;
    stepped_ = n;
    publish_to = canon_;
  }
  // A shifted sequence's approximate blocks go under its salted chain, whatever the cut (mark_shifted
  // starts that chain no later than canon_).
  if (shifted_from_ >= 0) publish_to = n;
  if (pool_->keyed()) {
    if (n_keyed_ == 0) {
      const Key128 r = root_key(shape_, cfg_);
      chain_lo_ = r.lo;
      chain_hi_ = r.hi;
    }
    const size_t salt_block = shifted_from_ >= 0 ? pool_->complete_blocks(shifted_from_) : SIZE_MAX;
    // Publish every token block filled since the last step, in every layer that still stores it.
    const size_t n_sink_blocks = ceil_div(cfg_.streaming() ? cfg_.sink : 0, cfg_.group_size);
    for (TokenBlock tb = token_block(n_keyed_); tb.start + tb.len <= publish_to;
         tb = token_block(++n_keyed_)) {
      const auto ids = history.subspan(size_t(tb.start), size_t(tb.len));
      Key128 parent{chain_lo_, chain_hi_};
      if (n_keyed_ == salt_block) parent = salted_key(parent, shift_salt_);
      const Key128 k = chain_key(parent, tb.start, ids);
      chain_lo_ = k.lo;
      chain_hi_ = k.hi;
      const Retention cls = retention_of(tb.start, tb.start + tb.len);
      for (int l : stored_) {
        const Entry e = layers_[size_t(l)].block_of(n_keyed_, n_sink_blocks, cfg_.group_size);
        if (e.id >= 0)
          (e.quantized ? quant_pool_ : dense_pool_).publish(e.id, {k.lo, k.hi, int32_t(l), e.quantized}, ids, cls,
                                                            &parent);
      }
    }
    // The partly filled block after them, kept for publish_tail: its tokens before the first one a
    // narrow append computed (those after it attended to its K/V, so they differ as well).
    tail_ids_.clear();
    const TokenBlock tb = token_block(n_keyed_);
    if (n - last_n_ > 0 && n - last_n_ <= kMatmulSmallRows) {
      if (narrow_hi_ <= narrow_lo_) narrow_lo_ = last_n_;  // the first one
      narrow_hi_ = n;
    }
    const int64_t exact_end = narrow_hi_ > narrow_lo_ ? std::min(n, narrow_lo_) : n;
    if (publish_to == n && tb.start < exact_end && tb.start + tb.len > n && n_keyed_ >= n_sink_blocks) {
      tail_ids_.assign(history.begin() + tb.start, history.begin() + exact_end);
      tail_block_ = n_keyed_;
      tail_end_ = n;
    }
  }
  last_n_ = n;
  for (int l = 0; l < shape_.n_layers; ++l) apply_policy(l);
}

Retention KVCache::retention_of(int64_t first, int64_t end) const {
  if (retention_.empty()) return Retention::User;
  Retention low = Retention::System;
  int64_t from = 0;
  for (const RetentionSpan& s : retention_) {
    if (s.end > first && from < end) low = std::min(low, s.cls);
    from = s.end;
  }
  return end > from ? Retention::Transient : low;
}

BlocksNeeded KVCache::blocks_needed(int T) const {
  // Per layer: the blocks the T tokens open (sinks, then stream blocks), and the groups the policy
  // may quantize after them (before the window's eviction gives any back: an upper bound). A
  // quantized group found by key takes nothing; counted anyway.
  const int B = cfg_.group_size, N = cfg_.streaming() ? cfg_.sink : 0;
  BlocksNeeded need;
  for (int l : stored_) {
    const Layer& L = layers_[size_t(l)];
    const int64_t sinks_after = std::min<int64_t>(N, L.n_sink + T);
    const int64_t end_after = L.end + (T - (sinks_after - L.n_sink));
    need.dense += ceil_div(sinks_after, B) - L.sinks.size();
    need.dense += ceil_div(end_after - L.begin, B) - L.stream.size();
    if (bits_) {
      const int64_t groups = std::max<int64_t>(0, (end_after - L.begin - cfg_.residual) / B);
      need.quant += size_t(std::max<int64_t>(0, groups - int64_t(L.n_quant)));
    }
  }
  return need;
}

// The longest run of `tokens`' token blocks (the last token left out) that every storing layer's pool
// holds, with a reference taken on each: got[block * stored layers + s] for the layer stored_[s]. A
// layer's stream blocks are KIVI groups first, then full-precision blocks, as the policy leaves them.
size_t KVCache::adoptable_blocks(std::span<const int32_t> tokens, std::vector<Adopted>& got) {
  const size_t L = stored_.size();
  const size_t n_sink_blocks = ceil_div(cfg_.streaming() ? cfg_.sink : 0, cfg_.group_size);
  const size_t limit = pool_->adoptable_limit();  // the rings hold them until the policy runs
  std::vector<uint8_t> dense_seen(L, 0);
  Key128 key = root_key(shape_, cfg_);
  size_t m = 0;
  for (TokenBlock tb = token_block(0); tb.start + tb.len < int64_t(tokens.size()); tb = token_block(++m)) {
    if (m >= limit) break;
    const auto span = tokens.subspan(size_t(tb.start), size_t(tb.len));
    key = chain_key(key, tb.start, span);
    size_t l = 0;
    for (; l < L; ++l) {
      const BlockKey k{key.lo, key.hi, int32_t(stored_[l]), false};
      Adopted a{dense_pool_.find(k, span), false};
      if (a.id >= 0) {
        if (m >= n_sink_blocks) dense_seen[l] = 1;  // the sinks are never quantized: groups may follow them
      } else if (bits_ && m >= n_sink_blocks && !dense_seen[l]) {
        BlockKey q = k;
        q.quantized = true;
        a = {quant_pool_.find(q, span), true};
      }
      if (a.id < 0) break;
      got.push_back(a);
    }
    if (l < L) {  // a layer misses: give back this block's references
      for (; l > 0; --l) {
        const Adopted a = got.back();
        got.pop_back();
        (a.quantized ? quant_pool_ : dense_pool_).release(a.id);
      }
      break;
    }
  }
  return m;
}

// Whether m adopted blocks leave no KIVI group where this sequence's own policy, having computed
// them, would keep full precision; and how many groups that policy would add (*to_quantize).
bool KVCache::adoption_exact(size_t m, const std::vector<Adopted>& got, size_t* to_quantize) const {
  const int B = cfg_.group_size;
  const size_t L = stored_.size();
  const size_t n_sink_blocks = ceil_div(cfg_.streaming() ? cfg_.sink : 0, B);
  const int64_t E = m > n_sink_blocks ? int64_t(m - n_sink_blocks) * B : 0;  // stream tokens
  *to_quantize = 0;
  for (size_t l = 0; l < L; ++l) {
    const int64_t w = layers_[size_t(stored_[l])].window;
    const int64_t k0 = w > 0 ? std::max<int64_t>(0, (E - w) / B) : 0;  // blocks its window evicts
    const int64_t want = bits_ ? std::max<int64_t>(0, (E - k0 * B - cfg_.residual) / B) : 0;
    int64_t q = 0;
    for (size_t j = n_sink_blocks; j < m; ++j) q += got[j * L + l].quantized ? 1 : 0;
    const int64_t kept = std::max<int64_t>(0, q - k0);
    if (kept > want) return false;
    *to_quantize += size_t(want - kept);
  }
  return true;
}

int64_t KVCache::adopt_prefix(std::span<const int32_t> tokens, const std::function<bool(int64_t)>& accept) {
  PTLLM_CHECK(n_tokens() == 0);
  if (!shares_pool() || !pool_->keyed()) return 0;
  const size_t L = stored_.size();
  std::vector<Adopted> got;
  size_t m = adoptable_blocks(tokens, got);
  size_t to_quantize = 0;
  auto drop_last = [&] {
    for (size_t l = 0; l < L; ++l) {
      const Adopted a = got.back();
      got.pop_back();
      (a.quantized ? quant_pool_ : dense_pool_).release(a.id);
    }
    --m;
  };
  auto accepted = [&] {
    const TokenBlock last = token_block(m - 1);
    return !accept || accept(last.start + last.len);
  };
  // The tokens of the next block shared with one the pool holds, copied (adopt_partial): past every
  // whole block found, where that is accepted (the rest long enough to be computed as a cold prompt
  // computes it), else past the whole blocks the accepted prefix keeps.
  std::vector<int32_t> copies;  // the partly shared block m, one copy per storing layer
  size_t k = adopt_partial(tokens, m, accept, copies);
  if (k == 0) {
    while (m > 0 && !(accepted() && adoption_exact(m, got, &to_quantize))) drop_last();
    // The policy after adoption quantizes what this sequence would have: room for it, or no adoption.
    if (to_quantize > quant_pool_.available())
      while (m > 0) drop_last();
    k = adopt_partial(tokens, m, accept, copies);
  }
  if (m == 0 && k == 0) return 0;
  const size_t n_sink_blocks = ceil_div(cfg_.streaming() ? cfg_.sink : 0, cfg_.group_size);
  for (size_t j = 0; j < m && !retention_.empty(); ++j) {  // what they are to this sequence
    const TokenBlock tb = token_block(j);
    const Retention cls = retention_of(tb.start, tb.start + tb.len);
    for (size_t l = 0; l < L; ++l) (got[j * L + l].quantized ? quant_pool_ : dense_pool_).set_retention(got[j * L + l].id, cls);
  }
  for (size_t l = 0; l < L; ++l) {
    Layer& layer = layers_[size_t(stored_[l])];
    for (size_t j = 0; j < m; ++j) {
      const Adopted a = got[j * L + l];
      if (j < n_sink_blocks) {
        layer.sinks.push_back(a.id);
        continue;
      }
      layer.stream.push_back({a.id, a.quantized});
      if (a.quantized) ++layer.n_quant;
    }
    if (k > 0) layer.stream.push_back({copies[l], false});
    const TokenBlock last = token_block(k > 0 ? m : m - 1);
    const int64_t n = last.start + (k > 0 ? int64_t(k) : last.len);
    layer.n_sink = int(std::min<int64_t>(n, cfg_.streaming() ? cfg_.sink : 0));
    layer.begin = 0;
    layer.end = n - layer.n_sink;
  }
  n_keyed_ = 0;
  canon_ = stepped_ = n_tokens();  // only such blocks are published, from here or from a store
  last_n_ = n_tokens();  // adopted: not a narrow append of this sequence's
  return n_tokens();
}

// Past m adopted blocks, the tokens of block m that the prompt shares with a block the pool holds
// under the same parent (one the prompt diverges inside, or a finished sequence's shorter last block:
// publish_tail): each storing layer's block is copied into a fresh one of this sequence (copies), as
// own_block copies before a write, so that the shared block is never written. A token's K/V depend on
// it and the tokens before it only, so the copy holds what computing them here gives. Not under a
// cut-dependent policy (KIVI): there a prefix must end on the prefill grid, which no partial block
// does, and a block the policy quantized holds another group's scales. Returns the tokens copied
// (0: none, nothing held).
size_t KVCache::adopt_partial(std::span<const int32_t> tokens, size_t m, const std::function<bool(int64_t)>& accept,
                              std::vector<int32_t>& copies) {
  const size_t L = stored_.size();
  const size_t n_sink_blocks = ceil_div(cfg_.streaming() ? cfg_.sink : 0, cfg_.group_size);
  if (cut_dependent() || m < n_sink_blocks || m >= pool_->adoptable_limit() || L == 0) return 0;
  const TokenBlock tb = token_block(m);
  const int64_t room = std::min<int64_t>(tb.len - 1, int64_t(tokens.size()) - 1 - tb.start);  // a whole one: adopted
  if (room <= 0) return 0;
  Key128 parent = root_key(shape_, cfg_);
  for (size_t j = 0; j < m; ++j) {
    const TokenBlock b = token_block(j);
    parent = chain_key(parent, b.start, tokens.subspan(size_t(b.start), size_t(b.len)));
  }
  size_t common = 0;
  const int32_t first =
      dense_pool_.find_child(parent, stored_[0], false, tokens.subspan(size_t(tb.start), size_t(room)), &common);
  if (first < 0) return 0;
  std::vector<int32_t> src{first};
  const BlockKey key = *dense_pool_.key_of(first);
  const auto ids = dense_pool_.tokens_of(first);
  for (size_t l = 1; l < L; ++l) {
    const int32_t id = dense_pool_.find({key.lo, key.hi, int32_t(stored_[l]), false}, ids);
    if (id < 0) break;
    src.push_back(id);
  }
  size_t k = src.size() == L ? common : 0;
  while (k > 0 && accept && !accept(tb.start + int64_t(k))) --k;
  for (size_t l = 0; k > 0 && l < L; ++l) {
    const int32_t copy = dense_pool_.acquire();
    if (copy < 0) {
      k = 0;
      break;
    }
    std::memcpy(dense_pool_.data(copy), dense_pool_.data(src[l]), size_t(cfg_.group_size) * dense_token_bytes_);
    copies.push_back(copy);
  }
  for (int32_t id : src) dense_pool_.release(id);
  if (k == 0) {
    for (int32_t id : copies) dense_pool_.release(id);
    copies.clear();
  }
  return k;
}

// The last, partly filled block (end_step: tail_ids_) is published under the chain after the blocks
// before it, as a block shorter than B, before the sequence lets go of it: no sequence writes into it
// any more, and find_child finds it for a prompt that goes on past its tokens. Exact prefix adoption
// never takes it (its key covers fewer tokens than a block).
void KVCache::publish_tail() {
  if (tail_ids_.empty() || !pool_->keyed() || !shares_pool() || cut_dependent() || shifted_from_ >= 0) return;
  const TokenBlock tb = token_block(tail_block_);
  if (n_keyed_ != tail_block_ || n_tokens() != tail_end_) return;
  const Key128 parent{chain_lo_, chain_hi_};
  const Key128 k = chain_key(parent, tb.start, tail_ids_);
  const Retention cls = retention_of(tb.start, tb.start + int64_t(tail_ids_.size()));
  const size_t n_sink_blocks = ceil_div(cfg_.streaming() ? cfg_.sink : 0, cfg_.group_size);
  for (int l : stored_) {
    const Entry e = layers_[size_t(l)].block_of(tail_block_, n_sink_blocks, cfg_.group_size);
    if (e.id >= 0 && !e.quantized && dense_pool_.refs(e.id) == 1)
      dense_pool_.publish(e.id, {k.lo, k.hi, int32_t(l), false}, tail_ids_, cls, &parent);
  }
  tail_ids_.clear();
}

}  // namespace ptllm
