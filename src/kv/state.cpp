// A KVCache's state as bytes (the prompt cache, spilling), and back.
#include "kv/cache_internal.h"

#include <cstring>
#include <string>
#include "core/bytes.h"

namespace ptllm {

using namespace kvdetail;

// ---------------------------------------------------------------------------------------------
// Serialization: per layer {n_sink i32, window i32 (the model's sliding window, 0: full attention),
// begin i64, end i64, n_quant u32, n_sink_blocks u32, n_entries u32}, then the sink blocks, then per
// stream entry {quantized u8, block bytes}.
// Little-endian, exact block sizes (the pool's alignment padding is not written). Only the storing
// layers are written: a KV-shared layer (YOCO) has no state of its own.


void KVCache::serialize(std::string& out) const {
  const size_t dense_bytes = size_t(cfg_.group_size) * dense_token_bytes_;
  const size_t quant_bytes = bits_ ? size_t(shape_.n_kv_heads) * kivi_block_bytes_per_head(cfg_.group_size, shape_.head_dim, bits_) : 0;
  for (int l : stored_) {
    const Layer& L = layers_[size_t(l)];
    put_bytes<int32_t>(out, L.n_sink);
    put_bytes<int32_t>(out, L.native);
    put_bytes<int64_t>(out, L.begin);
    put_bytes<int64_t>(out, L.end);
    put_bytes<uint32_t>(out, uint32_t(L.n_quant));
    put_bytes<uint32_t>(out, uint32_t(L.sinks.size()));
    put_bytes<uint32_t>(out, uint32_t(L.stream.size()));
    for (int32_t id : L.sinks) out.append(reinterpret_cast<const char*>(dense_pool_.data(id)), dense_bytes);
    for (size_t e = 0; e < L.stream.size(); ++e) {
      const Entry& en = L.stream[e];
      put_bytes<uint8_t>(out, en.quantized ? 1 : 0);
      if (en.quantized)
        out.append(reinterpret_cast<const char*>(quant_pool_.data(en.id)), quant_bytes);
      else
        out.append(reinterpret_cast<const char*>(dense_pool_.data(en.id)), dense_bytes);
    }
  }
}

void KVCache::deserialize(std::string_view in) {
  PTLLM_CHECK(n_tokens() == 0);
  const int B = cfg_.group_size;
  const size_t dense_bytes = size_t(B) * dense_token_bytes_;
  const size_t quant_bytes = bits_ ? size_t(shape_.n_kv_heads) * kivi_block_bytes_per_head(B, shape_.head_dim, bits_) : 0;
  ByteReader r(in, "KV state");
  try {
    int64_t tokens = -1;
    for (int l : stored_) {
      Layer& L = layers_[size_t(l)];
      const int32_t n_sink = r.get<int32_t>();
      // Another model's windows would leave blocks this one's attention reads, or needs, missing.
      if (r.get<int32_t>() != L.native) throw Error("KV state was written for a model with other sliding windows");
      const int64_t begin = r.get<int64_t>(), end = r.get<int64_t>();
      const uint32_t n_quant = r.get<uint32_t>(), n_sink_blocks = r.get<uint32_t>(), n_entries = r.get<uint32_t>();
      const bool ok = n_sink >= 0 && n_sink <= (cfg_.streaming() ? cfg_.sink : 0) && begin >= 0 && begin % B == 0 &&
                      begin <= end && n_sink_blocks == ceil_div(n_sink, B) && n_entries == ceil_div(end - begin, B) &&
                      n_entries <= L.stream.capacity() && n_quant <= n_entries && (bits_ > 0 || n_quant == 0) && (tokens < 0 || tokens == n_sink + end) &&
                      (unbounded_ || n_sink + end <= cfg_.ctx_size) &&
                      // the next query's window must still be stored (rewind_floor)
                      (begin == 0 || (L.window > 0 && begin <= end - L.window + 1));
      if (!ok) throw Error("KV state has inconsistent block counts");
      tokens = n_sink + end;
      for (uint32_t b = 0; b < n_sink_blocks; ++b) {
        const int32_t id = dense_pool_.acquire();
        if (id < 0) throw Error("KV state holds more blocks than the configuration allows");
        L.sinks.push_back(id);
        std::memcpy(dense_pool_.data(id), r.bytes(dense_bytes), dense_bytes);
      }
      L.n_sink = n_sink;
      L.begin = L.end = begin;
      for (uint32_t e = 0; e < n_entries; ++e) {
        const bool quantized = r.get<uint8_t>() != 0;
        if (quantized != (e < n_quant)) throw Error("KV state has quantized blocks out of order");
        BlockPool& pool = quantized ? quant_pool_ : dense_pool_;
        const int32_t id = pool.acquire();
        if (id < 0) throw Error("KV state holds more blocks than the configuration allows");
        L.stream.push_back({id, quantized});
        if (quantized) ++L.n_quant;
        const size_t n = quantized ? quant_bytes : dense_bytes;
        std::memcpy(pool.data(id), r.bytes(n), n);
      }
      L.end = end;
    }
    if (r.pos() != in.size()) throw Error("KV state has trailing bytes");
    // How the restored tokens were cut is not known: under KIVI none of their blocks is published.
    canon_ = 0;
    stepped_ = n_tokens();
  } catch (const Error&) {
    clear();
    throw;
  }
}

}  // namespace ptllm
