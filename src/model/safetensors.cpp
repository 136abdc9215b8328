#include "model/safetensors.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "core/json_text.h"

namespace ptllm {

using nlohmann::json;

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

bool parse_dtype(const std::string& s, DType& out) {
  static const std::map<std::string, DType> names = {
      {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16},
      {"I32", DType::I32}, {"I64", DType::I64}, {"U8", DType::U8}, {"U32", DType::U32}};
  auto it = names.find(s);
  if (it == names.end()) return false;
  out = it->second;
  return true;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : file_(path) {
  const std::string fname = path.string();
  const size_t size = file_.size();
  if (size < 8) throw Error(fname + ": truncated (" + std::to_string(size) + " bytes, no safetensors header)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file_.data()[i];
  if (header_len > size - 8)
    throw Error(fname + ": header length " + std::to_string(header_len) + " exceeds the file size (" +
                std::to_string(size) + " bytes): truncated or not a safetensors file");
  const char* hdr = reinterpret_cast<const char*>(file_.data() + 8);
  // A JSON object keeps the last of two equal keys: a header naming a tensor twice is refused instead.
  std::set<std::string> names;
  std::string twice;
  const json::parser_callback_t dup = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1 && twice.empty() && !names.insert(parsed.get<std::string>()).second)
      twice = parsed.get<std::string>();
    return true;
  };
  json j = json::parse(hdr, hdr + header_len, dup, false);
  if (j.is_discarded() || !j.is_object()) throw Error(fname + ": safetensors header is not a valid JSON object");
  if (!twice.empty()) throw Error(fname + ": tensor '" + twice + "' appears twice in the safetensors header");
  const uint8_t* data_start = file_.data() + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& item : j.items()) {
    const std::string& name = item.key();  // (not a structured binding: clang 14 cannot capture one)
    json& info = item.value();
    if (name == "__metadata__") continue;
    auto bad = [&](const std::string& what) -> Error {
      return Error(fname + ": tensor '" + name + "': " + what);
    };
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets"))
      throw bad("header entry lacks dtype, shape or data_offsets");
    TensorView t;
    t.name = name;
    t.file = &file_.path();
    if (!info["dtype"].is_string() || !parse_dtype(info["dtype"].get<std::string>(), t.dtype))
      throw bad("unsupported dtype " + info["dtype"].dump());
    if (!info["shape"].is_array()) throw bad("shape is not a list");
    uint64_t numel = 1;
    for (const auto& d : info["shape"]) {
      if (!d.is_number_unsigned()) throw bad("shape has a non-integer or negative dimension");
      uint64_t dim = d.get<uint64_t>();
      if (dim > (uint64_t(1) << 62) || (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 8 / dim))
        throw bad("shape is too large");
      numel *= dim;
      t.shape.push_back(int64_t(dim));
    }
    const json& off = info["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw bad("data_offsets must be two non-negative integers");
    uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end) throw bad("data_offsets are reversed");
    if (end > data_size)
      throw bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + ") run past the end of the file (" +
                std::to_string(data_size) + " data bytes): truncated file or a header that lies");
    uint64_t expect = numel * dtype_size(t.dtype);
    if (end - begin != expect)
      throw bad("byte range holds " + std::to_string(end - begin) + " bytes but " + std::string(dtype_name(t.dtype)) +
                " " + t.shape_str() + " needs " + std::to_string(expect));
    t.data = data_start + begin;
    t.nbytes = size_t(expect);
    if (expect > 0) ranges.emplace_back(begin, end);
    tensors_.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      throw Error(fname + ": two tensors' data_offsets overlap (at byte " + std::to_string(ranges[i].first) + ")");
}

WeightFiles WeightFiles::open(const std::filesystem::path& dir) {
  WeightFiles w;
  auto single = dir / "model.safetensors";
  auto index = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(single)) {
    w.files_.push_back(std::make_unique<SafetensorsFile>(single));
  } else if (std::filesystem::exists(index)) {
    json j = parse_json_text(read_whole_file(index, kMaxJsonConfigBytes, "a shard index"), index.string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(index.string() + ": not a valid index (expected an object with 'weight_map')");
    std::set<std::string> shards;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw Error(index.string() + ": weight_map entry '" + name + "' is not a file name");
      std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f == "..")
        throw Error(index.string() + ": weight_map entry '" + name + "' names a file outside the model directory");
      shards.insert(f);
    }
    if (shards.empty()) throw Error(index.string() + ": weight_map is empty (it names no tensor and no shard file)");
    w.index_file_ = index;
    for (const auto& f : shards) w.files_.push_back(std::make_unique<SafetensorsFile>(dir / f));
  } else {
    throw Error(dir.string() + ": no model.safetensors or model.safetensors.index.json");
  }
  for (const auto& f : w.files_)
    for (const auto& [name, t] : f->tensors()) {
      auto [it, inserted] = w.index_.emplace(name, &t);
      if (!inserted)
        throw Error(f->path().string() + ": tensor '" + name + "' also appears in " + it->second->file->string());
    }
  return w;
}

const TensorView* WeightFiles::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorView& WeightFiles::get(const std::string& name) const {
  if (const TensorView* t = find(name)) return *t;
  throw Error(files_description() + ": tensor '" + name + "' is missing");
}

std::string WeightFiles::files_description() const {
  if (index_file_.empty()) return files_.empty() ? "model.safetensors" : files_[0]->path().string();
  std::string s = index_file_.string() + " (shards ";
  for (size_t i = 0; i < files_.size(); ++i) s += (i ? ", " : "") + files_[i]->path().filename().string();
  return s + ")";
}

}  // namespace ptllm
