// Reuse after an edit: K/V another sequence computed, moved to other positions by rotating K again
// (RoPE composes: R(p + delta) k = R(delta) R(p) k), appended into this sequence's own blocks. The
// source blocks are only read, never written: what is shifted is a private copy, and a KIVI group
// is dequantized, rotated and quantized again by this sequence's policy.
#include <cstring>
#include <vector>

#include "kernels/layout.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "kv/cache_internal.h"

namespace ptllm {

using namespace kvdetail;

Key128 kvdetail::salted_key(Key128 parent, uint64_t salt) {
  const int32_t words[2] = {int32_t(uint32_t(salt)), int32_t(uint32_t(salt >> 32))};
  return chain_key(parent, -1, words);  // start -1: no token block has it
}

void KVPool::extend_block_hashes(std::span<const int32_t> tokens, size_t n_blocks, std::vector<BlockHash>& hashes,
                                 const Shifted& shifted) const {
  PTLLM_CHECK(complete_blocks(int64_t(tokens.size())) >= n_blocks);
  for (size_t j = hashes.size(); j < n_blocks; ++j) {
    Key128 parent = j == 0 ? root_key(shape_, cfg_) : hashes[j - 1];
    if (j == shifted.from_block) parent = salted_key(parent, shifted.salt);
    const TokenRange tb = token_block(j);
    hashes.push_back(chain_key(parent, tb.start, tokens.subspan(size_t(tb.start), size_t(tb.len))));
  }
}

bool KVPool::hold_block_any(const BlockHash& h, std::span<const int32_t> ids, std::vector<int32_t>& held) {
  PTLLM_CHECK(keyed_ && !ids.empty() && ids.size() <= size_t(cfg_.group_size));
  const size_t mark = held.size();
  for (int l = 0; l < shape_.n_layers; ++l) {
    if (!shape_.stores(l)) continue;
    // A KIVI group first where the pool has one: full-precision forms of quantized blocks linger in
    // the small full-precision pool, and holding them would leave no room to copy into.
    int32_t entry = -1;
    bool found = false;
    if (has_quantized_form() && ids.size() == size_t(cfg_.group_size)) {
      const int32_t id = quant_.find({h.lo, h.hi, int32_t(l), true}, ids);
      found = id >= 0;
      entry = ~id;  // release_held's form of a KIVI group
    }
    if (!found) {
      entry = dense_.find({h.lo, h.hi, int32_t(l), false}, ids);
      found = entry >= 0;
    }
    if (!found) {
      std::vector<int32_t> back(held.begin() + std::ptrdiff_t(mark), held.end());
      held.resize(mark);
      release_held(back);
      return false;
    }
    held.push_back(entry);
  }
  return true;
}

void KVPool::read_rows(int32_t held_entry, int n, float* k, float* v) const {
  const int B = cfg_.group_size, D = shape_.head_dim, H = shape_.n_kv_heads;
  const size_t kvd = size_t(shape_.kv_dim());
  PTLLM_CHECK(n > 0 && n <= B);
  if (held_entry >= 0) {
    const uint8_t* blk = dense_.data(held_entry);
    const DType t = dense_dtype(cfg_.precision);
    const size_t row = size_t(D) * dtype_size(t), half = size_t(B) * kvd * dtype_size(t);
    for (int g = 0; g < H; ++g)
      for (int j = 0; j < n; ++j) {
        const size_t at = (size_t(g) * size_t(B) + size_t(j)) * row;
        load_from(blk + at, t, k + size_t(j) * kvd + size_t(g) * size_t(D), D);
        load_from(blk + half + at, t, v + size_t(j) * kvd + size_t(g) * size_t(D), D);
      }
    return;
  }
  const uint8_t* blk = quant_.data(~held_entry);
  const int bits = kivi_bits(cfg_.precision);
  const size_t pk = packed_bytes(D, bits);
  std::vector<float> kg(size_t(B) * size_t(D));
  for (int g = 0; g < H; ++g) {
    const KiviOffsets o = kivi_offsets(g, H, B, D, pk);
    auto f16 = [&](size_t off) { return reinterpret_cast<const uint16_t*>(blk + off); };
    kivi_k_dequant(KRows{blk + o.kc, B, 0}, f16(o.ks), f16(o.kz), B, D, bits, kg.data());
    for (int j = 0; j < n; ++j) {
      std::memcpy(k + size_t(j) * kvd + size_t(g) * size_t(D), kg.data() + size_t(j) * size_t(D),
                  size_t(D) * sizeof(float));
      dequantize_v_token(blk + o.vc + size_t(j) * pk, f16(o.vs)[j], f16(o.vz)[j], D, bits,
                         v + size_t(j) * kvd + size_t(g) * size_t(D));
    }
  }
}

void KVCache::append_shifted(int layer, float* k, const float* v, int T, int64_t delta) {
  if (delta != 0 && !rotates_at_read()) {
    const int half = shape_.head_dim / 2;
    PTLLM_CHECK(int(shape_.rope_inv_freq.size()) == half);
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
    rope_cos_sin(shape_.rope_inv_freq.data(), half, delta, cs.data(), sn.data());
    for (int t = 0; t < T; ++t)
      rope_rotate(k + size_t(t) * size_t(shape_.kv_dim()), shape_.n_kv_heads, shape_.head_dim, cs.data(), sn.data());
  }
  append(layer, k, v, T);
}

void KVCache::mark_shifted(uint64_t salt) {
  PTLLM_CHECK(shifted_from_ < 0);
  // Under KIVI the blocks past canon_ are not published as exact ones either: the salted chain
  // starts no later than they do.
  shifted_from_ = cut_dependent() ? std::min(canon_, n_tokens()) : n_tokens();
  shift_salt_ = salt;
}

}  // namespace ptllm
