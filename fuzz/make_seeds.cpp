// Writes a starting corpus for fuzz_cache_file into DIR: one valid cache file per configuration of
// fuzz_common.h (its cache filled with a few tokens), each prefixed with the mode byte 1 (fix the
// checksum) and 0 (keep it).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/prompt_cache.h"
#include "fuzz_common.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  ptllm::ThreadPool pool(1);
  auto caches = ptllm::fuzz::fuzz_caches();
  for (size_t i = 0; i < caches.size(); ++i) {
    ptllm::KVCache& c = *caches[i];
    const ptllm::KVShape& s = c.shape();
    const int T = 9;  // past the sinks, the window and a KIVI group
    std::vector<float> k(size_t(s.kv_dim())), v(k), q(k), out(k);
    std::vector<int32_t> ids;
    for (int t = 0; t < T; ++t) {
      for (size_t j = 0; j < k.size(); ++j) k[j] = v[j] = q[j] = float(t + 1) * 0.1f + float(j);
      for (int layer = 0; layer < s.n_layers; ++layer) {
        c.append(layer, k.data(), v.data(), 1);
        c.attend(layer, q.data(), 1, s.n_kv_heads, out.data(), pool);
      }
      ids.push_back(t % 16);
    }
    ptllm::PromptCacheIdentity id;
    id.model_name = "fuzz";
    id.arch_name = "LlamaForCausalLM";
    id.vocab_size = 16;
    id.n_layers = s.n_layers;
    id.n_kv_heads = s.n_kv_heads;
    id.head_dim = s.head_dim;
    id.kv = c.config();
    std::string state;
    c.serialize(state);
    const std::vector<float> logits(16, 0.5f);
    const std::string file = ptllm::encode_cache_file(id, 0, ids, logits, state);
    for (char mode : {'\1', '\0'}) {
      std::ofstream(dir / ("seed-" + std::to_string(i) + "-" + std::to_string(int(mode))), std::ios::binary)
          << mode << file;
    }
  }
  return 0;
}
