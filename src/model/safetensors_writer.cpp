#include "model/safetensors_writer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ptllm {

size_t TensorDecl::nbytes() const {
  size_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path, std::vector<TensorDecl> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), out_(path) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const TensorDecl& t : tensors) {
    PTLLM_CHECK(!header.contains(t.name));
    const uint64_t bytes = t.nbytes();
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {data_bytes_, data_bytes_ + bytes}}};
    data_bytes_ += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = char((uint64_t(h.size()) >> (8 * i)) & 0xff);
  out_.write({len, 8});
  out_.write(h);
}

void SafetensorsWriter::write(std::string_view bytes) {
  PTLLM_CHECK(written_ + bytes.size() <= data_bytes_);
  out_.write(bytes);
  written_ += bytes.size();
}

uint64_t SafetensorsWriter::commit() {
  PTLLM_CHECK(written_ == data_bytes_);
  return out_.commit();
}

}  // namespace ptllm
