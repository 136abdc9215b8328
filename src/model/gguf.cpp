#include "model/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace ptllm {

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "uint8";
    case GgufType::I8: return "int8";
    case GgufType::U16: return "uint16";
    case GgufType::I16: return "int16";
    case GgufType::U32: return "uint32";
    case GgufType::I32: return "int32";
    case GgufType::F32: return "float32";
    case GgufType::Bool: return "bool";
    case GgufType::String: return "string";
    case GgufType::Array: return "array";
    case GgufType::U64: return "uint64";
    case GgufType::I64: return "int64";
    case GgufType::F64: return "float64";
  }
  return "";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16: case GgufType::U32:
    case GgufType::I32: case GgufType::U64: case GgufType::I64: return true;
    default: return false;
  }
}

std::string GgufTensor::dims_str() const {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

bool is_gguf_path(const std::filesystem::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](char c) { return char(c >= 'A' && c <= 'Z' ? c + 32 : c); });
  std::error_code ec;
  return ext == ".gguf" && !std::filesystem::is_directory(p, ec);
}

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian

// Reads little-endian values from [0, size) of the file; every read is checked first. `field`
// names what is being read, for the message of a read past the end.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, const std::string& file) : p_(data), size_(size), file_(file) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  void need(uint64_t n, const std::string& field) const {
    if (n > left())
      throw Error(file_ + ": " + field + ": " + std::to_string(n) + " bytes at offset " + std::to_string(pos_) +
                  " past the end of the file (size " + std::to_string(size_) + "): truncated or not a GGUF file");
  }
  template <class T>
  T read(const std::string& field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));  // GGUF is little-endian, as every host this runs on
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const std::string& field) {
    const uint64_t n = read<uint64_t>(field + " (string length)");
    need(n, field + " (string of " + std::to_string(n) + " bytes)");
    std::string s(reinterpret_cast<const char*>(p_ + pos_), size_t(n));
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& file_;
};

// The fewest bytes one value of type t takes in the file (bounds an array's count by the bytes left).
uint64_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::Bool: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: case GgufType::String: return 8;
    case GgufType::Array: return 12;
  }
  return 1;
}

GgufType read_type(Cursor& c, const std::string& field) {
  const uint32_t t = c.read<uint32_t>(field + " (value type)");
  if (gguf_type_name(GgufType(t)).empty())
    throw Error("value type " + std::to_string(t) + " is not a GGUF type (0..12)");
  return GgufType(t);
}

// values: array elements read so far in the whole file (bounded: each costs memory far beyond its bytes).
GgufValue read_value(Cursor& c, GgufType t, const std::string& field, int depth, uint64_t& values) {
  GgufValue v;
  v.type = t;
  switch (t) {
    case GgufType::U8: v.u = c.read<uint8_t>(field); v.i = int64_t(v.u); break;
    case GgufType::I8: v.i = c.read<int8_t>(field); break;
    case GgufType::U16: v.u = c.read<uint16_t>(field); v.i = int64_t(v.u); break;
    case GgufType::I16: v.i = c.read<int16_t>(field); break;
    case GgufType::U32: v.u = c.read<uint32_t>(field); v.i = int64_t(v.u); break;
    case GgufType::I32: v.i = c.read<int32_t>(field); break;
    case GgufType::U64: v.u = c.read<uint64_t>(field); v.i = int64_t(v.u); break;
    case GgufType::I64: v.i = c.read<int64_t>(field); break;
    case GgufType::F32: v.f = c.read<float>(field); break;
    case GgufType::F64: v.f = c.read<double>(field); break;
    case GgufType::Bool: {
      const uint8_t b = c.read<uint8_t>(field);
      if (b > 1) throw Error("bool value " + std::to_string(b) + " (expected 0 or 1)");
      v.b = b != 0;
      break;
    }
    case GgufType::String: v.str = c.string(field); break;
    case GgufType::Array: {
      if (depth >= kGgufMaxArrayNesting)
        throw Error("arrays nested deeper than " + std::to_string(kGgufMaxArrayNesting) + " levels");
      v.elem = read_type(c, field + " (array element type)");
      const uint64_t n = c.read<uint64_t>(field + " (array length)");
      if (n > c.left() / min_value_bytes(v.elem))
        throw Error("array of " + std::to_string(n) + " " + std::string(gguf_type_name(v.elem)) +
                    " values cannot fit in the " + std::to_string(c.left()) + " bytes left in the file");
      if (n > kGgufMaxArrayValues - values)
        throw Error("array of " + std::to_string(n) + " values: the file's arrays hold more than " +
                    std::to_string(kGgufMaxArrayValues) + " values in all");
      values += n;
      v.array.reserve(size_t(n));
      for (uint64_t k = 0; k < n; ++k) v.array.push_back(read_value(c, v.elem, field, depth + 1, values));
      break;
    }
  }
  return v;
}

// a * b, or nullopt on overflow.
std::optional<uint64_t> mul(uint64_t a, uint64_t b) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

}  // namespace

GgufFile GgufFile::open(const std::filesystem::path& path) {
  GgufFile f;
  f.name_ = path.string();
  f.map_.emplace(path);
  f.data_ = f.map_->data();
  f.size_ = f.map_->size();
  f.parse_all();
  return f;
}

GgufFile GgufFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  GgufFile f;
  f.name_ = name;
  f.data_ = data;
  f.size_ = size;
  f.parse_all();
  return f;
}

void GgufFile::parse_all() {
  const std::string& fn = name_;
  Cursor c(data_, size_, fn);
  if (size_ < 4 || c.read<uint32_t>("magic") != kMagic)
    throw Error(fn + ": not a GGUF file (the first 4 bytes are not \"GGUF\")");
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    throw Error(fn + ": GGUF version " + std::to_string(version_) + " (supported: 2, 3)");
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Each key/value takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info 8 + 4 + 4 + 8.
  if (n_kv > c.left() / 13)
    throw Error(fn + ": metadata count " + std::to_string(n_kv) + " cannot fit in the file (size " +
                std::to_string(size_) + ")");
  if (n_tensors > c.left() / 24)
    throw Error(fn + ": tensor count " + std::to_string(n_tensors) + " cannot fit in the file (size " +
                std::to_string(size_) + ")");

  kv_.reserve(size_t(n_kv));
  uint64_t values = 0;
  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string at = "metadata entry " + std::to_string(k);
    std::string key = c.string(at + " key");
    const std::string field = "metadata '" + key + "'";
    GgufValue v;
    try {
      v = read_value(c, read_type(c, field), field, 0, values);
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (msg.rfind(fn + ":", 0) == 0) throw;
      throw Error(fn + ": " + field + ": " + msg);
    }
    if (!kv_index_.emplace(key, kv_.size()).second) throw Error(fn + ": " + field + " appears twice");
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (a->type != GgufType::U32) fail_key("general.alignment", "expected uint32, got " + std::string(gguf_type_name(a->type)));
    if (a->u == 0 || (a->u & (a->u - 1)) != 0)
      fail_key("general.alignment", std::to_string(a->u) + " is not a power of two");
    alignment_ = uint32_t(a->u);
  }

  tensors_.reserve(size_t(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    t.name = c.string("tensor info " + std::to_string(k) + " name");
    const std::string field = "tensor '" + t.name + "'";
    auto bad = [&](const std::string& what) { return Error(fn + ": " + field + ": " + what); };
    const uint32_t n_dims = c.read<uint32_t>(field + " (dimension count)");
    if (n_dims == 0 || n_dims > uint32_t(kGgufMaxDims))
      throw bad(std::to_string(n_dims) + " dimensions (1 to " + std::to_string(kGgufMaxDims) + " allowed)");
    uint64_t elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t n = c.read<uint64_t>(field + " (dimension " + std::to_string(d) + ")");
      if (n == 0 || n > uint64_t(std::numeric_limits<int32_t>::max()))
        throw bad("dimension " + std::to_string(d) + " is " + std::to_string(n) + " (1 to 2^31-1 allowed)");
      const auto e = mul(elems, n);
      if (!e) throw bad("the element count of " + t.dims_str() + " overflows");
      elems = *e;
      t.dims.push_back(n);
    }
    const uint32_t type = c.read<uint32_t>(field + " (type)");
    const GgmlTypeInfo info = ggml_type_info(GgmlType(type));
    if (info.name.empty()) throw bad("unknown tensor type " + std::to_string(type));
    t.type = GgmlType(type);
    if (t.dims[0] % uint64_t(info.block_elems) != 0)
      throw bad("type " + std::string(info.name) + " stores blocks of " + std::to_string(info.block_elems) +
                " values, but the rows are " + std::to_string(t.dims[0]) + " long");
    const auto nbytes = mul(elems / uint64_t(info.block_elems), uint64_t(info.block_bytes));
    if (!nbytes) throw bad("the byte size of " + t.dims_str() + " overflows");
    t.nbytes = *nbytes;
    t.offset = c.read<uint64_t>(field + " (data offset)");
    if (t.offset % alignment_ != 0)
      throw bad("data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                std::to_string(alignment_));
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) throw bad("appears twice");
    tensors_.push_back(std::move(t));
  }
  header_end_ = c.pos();
  data_offset_ = (header_end_ + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_offset_ > size_)
    throw Error(fn + ": data section starts at offset " + std::to_string(data_offset_) + ", past the end of the file (size " +
                std::to_string(size_) + ")");
  // Every tensor's bytes inside the file, and no two overlapping.
  std::vector<std::pair<uint64_t, size_t>> order;
  for (size_t k = 0; k < tensors_.size(); ++k) {
    GgufTensor& t = tensors_[k];
    const uint64_t room = size_ - data_offset_;
    if (t.offset > room || t.nbytes > room - t.offset)
      throw Error(fn + ": tensor '" + t.name + "': data offset " + std::to_string(t.offset) + " + " +
                  std::to_string(t.nbytes) + " bytes past the end of the file (size " + std::to_string(size_) +
                  ", data section at " + std::to_string(data_offset_) + ")");
    t.data = data_ + data_offset_ + t.offset;
    order.emplace_back(t.offset, k);
  }
  std::sort(order.begin(), order.end());
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensor& a = tensors_[order[k - 1].second];
    const GgufTensor& b = tensors_[order[k].second];
    if (a.offset + a.nbytes > b.offset)
      throw Error(fn + ": tensor '" + b.name + "' (data offset " + std::to_string(b.offset) + ") overlaps tensor '" +
                  a.name + "' (offset " + std::to_string(a.offset) + ", " + std::to_string(a.nbytes) + " bytes)");
  }
}

std::string_view GgufFile::header_bytes() const {
  return {reinterpret_cast<const char*>(data_), size_t(header_end_)};
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::fail_key(std::string_view key, const std::string& problem) const {
  throw Error(name_ + ": metadata '" + std::string(key) + "': " + problem);
}

std::optional<std::string> GgufFile::opt_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::String) fail_key(key, "expected a string, got " + std::string(gguf_type_name(v->type)));
  return v->str;
}

std::string GgufFile::get_string(std::string_view key) const {
  auto s = opt_string(key);
  if (!s) fail_key(key, "missing");
  return *s;
}

std::optional<int64_t> GgufFile::opt_int(std::string_view key, int64_t lo, int64_t hi) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_integer()) fail_key(key, "expected an integer, got " + std::string(gguf_type_name(v->type)));
  const bool too_big = v->type == GgufType::U64 && v->u > uint64_t(std::numeric_limits<int64_t>::max());
  if (too_big || v->i < lo || v->i > hi)
    fail_key(key, (too_big ? std::to_string(v->u) : std::to_string(v->i)) + " is outside [" + std::to_string(lo) +
                      ", " + std::to_string(hi) + "]");
  return v->i;
}

int64_t GgufFile::get_int(std::string_view key, int64_t lo, int64_t hi) const {
  auto i = opt_int(key, lo, hi);
  if (!i) fail_key(key, "missing");
  return *i;
}

std::optional<double> GgufFile::opt_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_float()) return v->f;
  if (v->is_integer()) return v->type == GgufType::U64 ? double(v->u) : double(v->i);
  fail_key(key, "expected a number, got " + std::string(gguf_type_name(v->type)));
}

std::optional<bool> GgufFile::opt_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::Bool) fail_key(key, "expected a bool, got " + std::string(gguf_type_name(v->type)));
  return v->b;
}

const GgufValue* GgufFile::opt_array(std::string_view key, std::initializer_list<GgufType> elems) const {
  const GgufValue* v = find(key);
  if (!v) return nullptr;
  std::string names;
  for (GgufType t : elems) names += (names.empty() ? "" : " or ") + std::string(gguf_type_name(t));
  if (v->type != GgufType::Array) fail_key(key, "expected an array of " + names + ", got " + std::string(gguf_type_name(v->type)));
  if (std::find(elems.begin(), elems.end(), v->elem) == elems.end())
    fail_key(key, "expected an array of " + names + ", got an array of " + std::string(gguf_type_name(v->elem)));
  return v;
}

}  // namespace ptllm
