#pragma once
// A 64-byte aligned scratch buffer that only grows (packed tiles, reordered x; one per thread).
#include <cstddef>
#include <new>

namespace ptllm {

class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { release(); }
  float* get(size_t n) {
    if (n > size_) {
      release();
      data_ = static_cast<float*>(::operator new[](n * sizeof(float), std::align_val_t(64)));
      size_ = n;
    }
    return data_;
  }

 private:
  void release() {
    if (data_) ::operator delete[](data_, std::align_val_t(64));
    data_ = nullptr;
    size_ = 0;
  }
  float* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ptllm
