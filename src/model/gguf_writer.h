#pragma once
// GGUF writer: a Hugging Face checkpoint (config.json, safetensors, tokenizer.json) -> one .gguf file
// with the metadata keys, tensor names and Q/K row order of llama.cpp's convert_hf_to_gguf.py, so
// that llama.cpp loads it and this runtime reads it back (docs/gguf.md).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kernels/weights.h"
#include "model/gguf.h"
#include "model/gguf_mix.h"

namespace ptllm {

// The pieces of a GGUF file, written in order: header, key/values, tensor infos, the aligned data.
// Tensor data is produced tensor by tensor at write time (a checkpoint never sits in memory whole).
class GgufBuilder {
 public:
  void add(const std::string& key, GgufValue v);
  void add_string(const std::string& key, const std::string& s);
  void add_u32(const std::string& key, uint32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_strings(const std::string& key, const std::vector<std::string>& v);
  void add_f32s(const std::string& key, const std::vector<float>& v);
  void add_i32s(const std::string& key, const std::vector<int32_t>& v);

  // dims as GGUF writes them (dims[0] the row length); fill(out) writes exactly the tensor's bytes.
  using Fill = std::function<void(uint8_t* out)>;
  void add_tensor(const std::string& name, std::vector<uint64_t> dims, GgmlType type, Fill fill);

  // Everything before the data section (header, metadata, tensor infos, padding).
  std::string header(uint32_t alignment = kGgufDefaultAlignment) const;
  // Writes the file atomically (core/file_io's AtomicFile). Returns its size.
  uint64_t write(const std::filesystem::path& path, uint32_t alignment = kGgufDefaultAlignment) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    GgmlType type;
    uint64_t nbytes;
    Fill fill;
  };
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
};

// Serializes one value as GGUF stores it (type id not included), for the builder and for tests.
void gguf_append_value(std::string& out, const GgufValue& v);

struct GgufWriteResult {
  uint64_t bytes = 0;
  int tensors = 0;
  int quantized = 0;  // 2-D tensors written in a block type
  int fallback = 0;   // 2-D tensors whose planned type did not fit their rows (gguf_mix.h)
  std::map<std::string, int> by_type;  // "Q4_K" -> how many tensors
};

// MODEL_DIR -> OUT as `mix` (F32, F16, BF16, Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K): 2-D weights in the
// types model/gguf_mix.h chooses (llama-quantize's for the quantized mixes), norms and biases F32,
// as llama.cpp's converter (and llama-quantize) write them. Throws Error naming the file and the
// field for a checkpoint GGUF cannot hold (an architecture other than Llama/Mistral/Qwen2, KV
// sharing, a tokenizer layout tokenizer.ggml.pre cannot name).
GgufWriteResult write_gguf_from_hf(const std::filesystem::path& model_dir, const std::filesystem::path& out,
                                   GgufMix mix);

}  // namespace ptllm
