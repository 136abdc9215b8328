// Speculative decoding's side of a KVCache: how many tokens a verification may append at once, and
// dropping the rejected ones.
#include "kv/cache_internal.h"

#include <algorithm>
#include <string>

namespace ptllm {

using namespace kvdetail;

int KVCache::exact_append() const {
  int most = max_append();
  if (bits_ == 0) return std::max(1, most);
  // KIVI: a step whose residual reaches R + B tokens quantizes its oldest group; a later query of the
  // same append would read that group in full precision where one step at a time reads it quantized.
  const int B = cfg_.group_size;
  for (int l : stored_) {
    const Layer& L = layers_[size_t(l)];
    const int64_t residual = L.end - (L.begin + int64_t(L.n_quant) * B);
    most = int(std::min<int64_t>(most, int64_t(cfg_.residual) + B - residual));
  }
  return std::max(1, most);
}

void KVCache::drop_unstepped(int64_t n) {
  if (n < rewind_floor() || n > n_tokens())
    throw Error("cannot drop drafted tokens back to " + std::to_string(n) + ": the cache holds " +
                std::to_string(n_tokens()) + " tokens, the oldest that can go is " + std::to_string(rewind_floor()));
  const int B = cfg_.group_size;
  for (Layer& L : layers_) {
    L.truncate(n, B, dense_pool_);
    // The tokens kept continue a block this sequence wrote itself (a shared block is never appended to).
    if (L.n_sink < cfg_.sink && L.n_sink % B != 0) PTLLM_CHECK(dense_pool_.refs(L.sinks.back()) == 1);
    if ((L.end - L.begin) % B != 0) PTLLM_CHECK(dense_pool_.refs(L.stream[L.stream.size() - 1].id) == 1);
  }
}

}  // namespace ptllm
