// libFuzzer target: config.json -> ModelConfig on arbitrary bytes (through the file reader, as the
// loader reads it); a config that loads must have every shape product within int (the forward
// pass computes them in int).
#include <cstdlib>

#include "core/error.h"
#include "fuzz_input.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptllm;
  const std::filesystem::path p = fuzz::scratch_dir() / "config.json";
  fuzz::write_file(p, {reinterpret_cast<const char*>(data), size});
  try {
    const ModelConfig c = ModelConfig::load(p);
    const int64_t q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim;
    if (q != c.q_dim() || kv != c.kv_dim() || c.layer_windows().size() != size_t(c.n_layers)) std::abort();
    // what the forward pass indexes by: rotated dims even within a head, one RoPE choice per layer,
    // LongRoPE's factors one per rotated pair
    const int R = c.rotated_dims();
    if (R < 2 || R > c.head_dim || R % 2 != 0) std::abort();
    if (!c.layer_rope.empty() && c.layer_rope.size() != size_t(c.n_layers)) std::abort();
    if (c.rope.type == RopeType::LongRope &&
        (c.rope.short_factor.size() != size_t(R / 2) || c.rope.long_factor.size() != size_t(R / 2)))
      std::abort();
    // routed experts: what moe_forward indexes by (top_k within num_experts and kMaxTopK, layers in range)
    if (c.moe.enabled()) {
      const MoeConfig& m = c.moe;
      if (m.top_k < 1 || m.top_k > m.num_experts || m.top_k > kMaxTopK || m.intermediate_size < 1 ||
          m.decoder_sparse_step < 1)
        std::abort();
      for (int l : m.mlp_only_layers)
        if (l < 0 || l >= c.n_layers) std::abort();
    }
  } catch (const Error&) {
  }
  return 0;
}
