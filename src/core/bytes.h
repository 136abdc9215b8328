#pragma once
// Little-endian binary encoding of plain values, for the files and states posttrainllm writes (KV
// state, prompt-cache file). Written as in memory: the formats are little-endian and so is every
// target this builds for.
#include <bit>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/error.h"

namespace ptllm {

static_assert(std::endian::native == std::endian::little, "the binary formats are little-endian, written as in memory");

template <typename T>
void put_bytes(std::string& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Bounds-checked reads from untrusted bytes; running out throws ptllm::Error("truncated <what>").
class ByteReader {
 public:
  ByteReader(std::string_view in, const char* what) : in_(in), what_(what) {}

  const char* bytes(size_t n) {
    if (n > in_.size() - pos_) throw Error(std::string("truncated ") + what_);
    const char* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    std::memcpy(&v, bytes(sizeof v), sizeof v);
    return v;
  }
  size_t pos() const { return pos_; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
  const char* what_;  // names the region in messages
};

}  // namespace ptllm
