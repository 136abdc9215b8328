#pragma once
// GGUF reader (llama.cpp's single-file model format, versions 2 and 3): the header, every metadata
// key/value (all value types, arrays of any of them, nested arrays), the tensor infos and the
// aligned data section. Memory-mapped; every count, length, offset and size is checked against the
// file with 64-bit arithmetic before anything is read, and an inconsistency is an Error naming the
// file and the field ("m.gguf: tensor 'blk.0.attn_q.weight': data offset 123 + 4096 bytes past the
// end of the file (size 100)"). Layout: docs/gguf.md.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "kernels/weights.h"

namespace ptllm {

// GGUF metadata value types, as the file stores them.
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
std::string_view gguf_type_name(GgufType t);  // "uint32", "array", ...; "" for an unknown id

// One metadata value. Integers are held widened (u for unsigned, i for signed), floats as double.
struct GgufValue {
  GgufType type = GgufType::U8;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string str;
  GgufType elem = GgufType::U8;  // Array: the elements' type
  std::vector<GgufValue> array;  // Array: the elements

  bool is_integer() const;
  bool is_float() const { return type == GgufType::F32 || type == GgufType::F64; }
};

// One tensor: dims as GGUF writes them (dims[0] the fastest-varying: the columns of a matrix).
struct GgufTensor {
  std::string name;
  std::vector<uint64_t> dims;
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;            // from the start of the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // in the mapped file
  std::string dims_str() const;   // "[128, 8192]"
};

inline constexpr int kGgufMaxDims = 4;             // GGML_MAX_DIMS
inline constexpr int kGgufMaxArrayNesting = 8;      // arrays of arrays deeper than this are refused
inline constexpr uint32_t kGgufDefaultAlignment = 32;
// Array elements a file may hold in all (a vocabulary of 256k tokens with its merges, scores and
// types is about 1M): a bound on memory, since a value in memory is larger than in the file.
inline constexpr uint64_t kGgufMaxArrayValues = uint64_t(1) << 23;

class GgufFile {
 public:
  // Maps and parses a file (O_NONBLOCK + fstat, as core/file_io: a FIFO is an error).
  static GgufFile open(const std::filesystem::path& path);
  // Parses bytes that stay owned by the caller (tests, the fuzzer); `name` is used in messages.
  static GgufFile parse(const uint8_t* data, size_t size, const std::string& name);

  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;

  const std::string& name() const { return name_; }  // the path, for messages
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the data section in the file
  uint64_t size() const { return size_; }
  // The header, metadata and tensor infos (every byte before the data section's padding): what
  // a prompt-cache key hashes.
  std::string_view header_bytes() const;

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;

  // Typed reads; throw Error "FILE: metadata 'KEY': PROBLEM" for a missing key or a wrong type.
  std::string get_string(std::string_view key) const;
  std::optional<std::string> opt_string(std::string_view key) const;
  int64_t get_int(std::string_view key, int64_t lo, int64_t hi) const;  // any integer type, in [lo, hi]
  std::optional<int64_t> opt_int(std::string_view key, int64_t lo, int64_t hi) const;
  std::optional<double> opt_float(std::string_view key) const;            // any float or integer type
  std::optional<bool> opt_bool(std::string_view key) const;
  // An array of elements of type `elem` (one of the listed; the message names them).
  const GgufValue* opt_array(std::string_view key, std::initializer_list<GgufType> elems) const;

  [[noreturn]] void fail_key(std::string_view key, const std::string& problem) const;

  // The mapped file's whole pages within [p, p + n) leave this process's resident memory (a copy
  // made at load reads them no more); a later read faults them in again. Nothing for parsed bytes.
  void release(const void* p, size_t n) const {
    if (map_) map_->release(p, n);
  }

 private:
  GgufFile() = default;
  void parse_all();

  std::string name_;
  std::optional<MappedFile> map_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t header_end_ = 0;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Whether a path names a GGUF file (a regular file whose name ends in .gguf, any case).
bool is_gguf_path(const std::filesystem::path& p);

}  // namespace ptllm
