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
  } catch (const Error&) {
  }
  return 0;
}
