#pragma once
// safetensors reader: memory-mapped, every tensor's dtype, shape and byte range checked against
// the header and the file size before anything is read (llama.cpp's loader distrusts files the same way).
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace ptllm {

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into the mapped file
  size_t nbytes = 0;
  const std::filesystem::path* file = nullptr;  // the file it lives in (for messages)

  int64_t numel() const;
  std::string shape_str() const;  // "[8192, 128]"
};

// One .safetensors file.
class SafetensorsFile {
 public:
  // Throws ptllm::Error naming the file (and the tensor) on any inconsistency.
  explicit SafetensorsFile(const std::filesystem::path& path);
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::filesystem::path& path() const { return file_.path(); }
  size_t size() const { return file_.size(); }
  // Drops the mapped pages wholly inside [p, p + n) from this process's memory (nothing when the
  // range is not in this file); a later read maps them in again.
  void release(const void* p, size_t n) const { file_.release(p, n); }

 private:
  MappedFile file_;
  std::map<std::string, TensorView> tensors_;
};

// All the weight files of a model directory: model.safetensors, or the shards named by
// model.safetensors.index.json.
class WeightFiles {
 public:
  static WeightFiles open(const std::filesystem::path& model_dir);
  // Throws if the tensor is missing (naming the file(s) searched).
  const TensorView& get(const std::string& name) const;
  const TensorView* find(const std::string& name) const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // "DIR/model.safetensors", or "DIR/model.safetensors.index.json (shards model-00001-of-00002.safetensors, ...)".
  std::string files_description() const;

 private:
  std::filesystem::path index_file_;  // empty for a single model.safetensors
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

}  // namespace ptllm
