#pragma once
// The checksum of the bytes posttrainllm writes and reads back (prompt-cache files, block-store
// values): XXH3-64, seed 0. On x86-64 through libxxhash's dispatcher, which picks the widest vector
// unit the CPU has at run time (AVX2, AVX-512): the library's plain XXH3_64bits is its SSE2 build, at
// half the speed (256 KiB buffers on the thirteenth session's Xeon: 14.1 GB/s against 28.5 GB/s).
// The values are the same either way.
#include <cstddef>
#include <cstdint>

namespace ptllm {

uint64_t checksum64(const void* data, size_t n);

// The same checksum over bytes given in parts.
class Checksum64 {
 public:
  Checksum64();
  ~Checksum64();
  Checksum64(const Checksum64&) = delete;
  Checksum64& operator=(const Checksum64&) = delete;
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  void* state_;  // XXH3_state_t
};

}  // namespace ptllm
