#pragma once
// A read-only memory map of a whole file (model weights are used in place, never copied).
#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace ptllm {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws ptllm::Error naming the file when it cannot be opened or mapped.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }
  // madvise(MADV_DONTNEED) on the whole pages of [p, p + n) within the mapping (none outside it):
  // the file's pages leave this process's resident memory; a later read faults them in again.
  void release(const void* p, size_t n) const;

 private:
  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ptllm
