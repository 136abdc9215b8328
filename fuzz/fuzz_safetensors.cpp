// libFuzzer target: the safetensors reader (header JSON, dtypes, shapes, data offsets, duplicate
// names) and the shard index (model.safetensors.index.json) on arbitrary bytes.
// Input: [mode byte] then the bytes. Mode even: the bytes are a model.safetensors file. Mode odd:
// the bytes are an index JSON, then (after the separator) the bytes of one shard it may name as
// "shard.safetensors".
#include "core/error.h"
#include "fuzz_input.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptllm;
  if (size == 0) return 0;
  const std::filesystem::path single = fuzz::scratch_dir() / "single", sharded = fuzz::scratch_dir() / "sharded";
  static const bool made = [&] {
    std::filesystem::create_directories(single);
    std::filesystem::create_directories(sharded);
    return true;
  }();
  (void)made;
  try {
    if ((data[0] & 1) == 0) {
      fuzz::write_file(single / "model.safetensors", {reinterpret_cast<const char*>(data) + 1, size - 1});
      const WeightFiles w = WeightFiles::open(single);
      for (const auto& f : w.files())
        for (const auto& [name, t] : f->tensors()) {
          // Every byte a tensor claims must be readable (ASan checks the mapping).
          volatile uint8_t sum = 0;
          if (t.nbytes) sum = sum + t.data[0] + t.data[t.nbytes - 1];
          (void)t.numel();
        }
    } else {
      const auto parts = fuzz::split_input(data + 1, size - 1, 2);
      fuzz::write_file(sharded / "model.safetensors.index.json", parts[0]);
      fuzz::write_file(sharded / "shard.safetensors", parts[1]);
      const WeightFiles w = WeightFiles::open(sharded);
      (void)w.files_description();
    }
  } catch (const Error&) {
  }
  return 0;
}
