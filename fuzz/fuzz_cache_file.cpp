// libFuzzer target: the prompt-cache file reader on arbitrary bytes. Every input goes through
// decode_cache_file() (whole file in memory) and read_cache_header() (the header check before a load,
// through a memfd); a KV state that decodes is restored into caches of every configuration and then
// used (one more token appended and attended), which must never crash.
//
// Random bytes almost never carry a valid checksum. The first input byte is a mode: when it is odd the
// target overwrites the last 8 bytes with the right checksum, so the parser behind it is explored too.
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/prompt_cache.h"
#include "fuzz_common.h"

namespace {

void use(ptllm::KVCache& cache) {
  static ptllm::ThreadPool pool(1);
  const ptllm::KVShape& s = cache.shape();
  if (!cache.fits(1)) return;
  std::vector<float> k(size_t(s.kv_dim()), 0.5f), v(k), q(size_t(s.kv_dim()), 0.25f), out(q.size());
  for (int layer = 0; layer < s.n_layers; ++layer) {
    cache.append(layer, k.data(), v.data(), 1);
    cache.attend(layer, q.data(), 1, s.n_kv_heads, out.data(), pool);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto caches = ptllm::fuzz::fuzz_caches();
  static const int memfd = memfd_create("fuzz-cache", 0);
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) && bytes.size() >= 8) {
    const uint64_t sum = XXH3_64bits(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
  }
  try {
    const ptllm::CacheFile f = ptllm::decode_cache_file(bytes);
    for (auto& c : caches) {
      try {
        c->deserialize(f.kv_state);
        use(*c);
      } catch (const ptllm::Error&) {
      }
      c->clear();
    }
  } catch (const ptllm::Error&) {
  }
  if (memfd >= 0 && ftruncate(memfd, 0) == 0 && pwrite(memfd, bytes.data(), bytes.size(), 0) == ssize_t(bytes.size())) {
    try {
      ptllm::read_cache_header("/proc/self/fd/" + std::to_string(memfd));
    } catch (const ptllm::Error&) {
    }
  }
  return 0;
}
