#pragma once
// safetensors writer (the reader is safetensors.h): every tensor's name, dtype and shape declared up
// front, the header written padded to 8 bytes as the reference writer does, then the tensors' bytes
// streamed in declaration order, so a checkpoint larger than memory is written a piece at a time.
// The file is a temporary until commit() (core/file_io.h's AtomicFile): an interrupted run leaves no
// half file behind.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/file_io.h"

namespace ptllm {

struct TensorDecl {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  size_t nbytes() const;
};

class SafetensorsWriter {
 public:
  // Writes the header. metadata: the "__metadata__" strings (e.g. {"format": "pt"}, as transformers
  // writes; mlx-lm writes {"format": "mlx"}). Throws ptllm::Error naming the file.
  SafetensorsWriter(const std::filesystem::path& path, std::vector<TensorDecl> tensors,
                    const std::map<std::string, std::string>& metadata);
  // The next bytes of the tensors, in declaration order, in pieces of any size.
  void write(std::string_view bytes);
  // Checks that every declared byte came, then renames the file into place. Returns the file's size.
  uint64_t commit();

 private:
  std::filesystem::path path_;
  AtomicFile out_;
  uint64_t data_bytes_ = 0;  // the tensors' bytes the header declares
  uint64_t written_ = 0;     // of those, written so far
};

}  // namespace ptllm
