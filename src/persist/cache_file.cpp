// The prompt-cache file (format in cache_file.h). Kept apart from the identity (identity.cpp, which
// reads the model) so that the fuzzer builds the reader with nothing but core/, kernels/ and kv/.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <optional>
#include <utility>

#include "core/bytes.h"
#include "core/checksum.h"
#include "core/error.h"
#include "core/file_io.h"
#include "persist/cache_file.h"

namespace ptllm {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'P', 'T', 'L', 'L', 'M', 'K', 'V', 'C'};
constexpr size_t kPreamble = 24;        // magic, version, header_bytes, file_size
constexpr size_t kMaxHeader = 1 << 16;  // two names of at most 64 KiB together, and the fixed fields
constexpr size_t kTrailer = 8;          // the checksum

// A name: u16 length, then its bytes.
std::string get_name(ByteReader& r) {
  const uint16_t n = r.get<uint16_t>();
  return std::string(r.bytes(n), n);
}

// Errors without the path: the callers name the file.
RegularFile open_cache_file(const fs::path& path) { return RegularFile(path, false); }

// The fixed part of the header and both names.
struct HeaderFields {
  PromptCacheIdentity id;
  int64_t created_ms = 0;
  uint64_t n_ids = 0;
  uint64_t kv_bytes = 0;
};

std::string encode_header(const PromptCacheIdentity& id, int64_t created_ms, uint64_t n_ids, uint64_t kv_bytes) {
  std::string h;
  h.append(reinterpret_cast<const char*>(id.config_key.data()), id.config_key.size());
  put_bytes<uint8_t>(h, uint8_t(id.kv.precision));
  put_bytes<uint8_t>(h, uint8_t(id.kv.positions));
  put_bytes<uint16_t>(h, 0);
  for (int32_t v : {id.kv.group_size, id.kv.residual, id.kv.sink, id.kv.window, id.vocab_size, id.n_layers,
                    id.n_kv_heads, id.head_dim})
    put_bytes<int32_t>(h, v);
  put_bytes<int64_t>(h, created_ms);
  put_bytes<uint64_t>(h, n_ids);
  put_bytes<uint64_t>(h, kv_bytes);
  for (const std::string* s : {&id.model_name, &id.arch_name}) {
    const size_t n = std::min<size_t>(s->size(), 1024);  // names are for display; the key identifies
    put_bytes<uint16_t>(h, uint16_t(n));
    h.append(*s, 0, n);
  }
  return h;
}

HeaderFields decode_header(std::string_view bytes) {
  ByteReader r(bytes, "header");
  HeaderFields f;
  std::memcpy(f.id.config_key.data(), r.bytes(f.id.config_key.size()), f.id.config_key.size());
  const uint8_t precision = r.get<uint8_t>(), positions = r.get<uint8_t>();
  if (r.get<uint16_t>() != 0) throw Error("header has a non-zero reserved field");
  if (precision > uint8_t(KVPrecision::Int2)) throw Error("header has an unknown KV precision " + std::to_string(precision));
  if (positions > uint8_t(PositionMode::Cache)) throw Error("header has an unknown position scheme " + std::to_string(positions));
  f.id.kv.precision = KVPrecision(precision);
  f.id.kv.positions = PositionMode(positions);
  for (int32_t* v : {&f.id.kv.group_size, &f.id.kv.residual, &f.id.kv.sink, &f.id.kv.window, &f.id.vocab_size,
                     &f.id.n_layers, &f.id.n_kv_heads, &f.id.head_dim}) {
    *v = r.get<int32_t>();
    if (*v < 0) throw Error("header has a negative count");
  }
  if (f.id.vocab_size == 0) throw Error("header has a vocabulary of 0");
  f.created_ms = r.get<int64_t>();
  f.n_ids = r.get<uint64_t>();
  f.kv_bytes = r.get<uint64_t>();
  f.id.model_name = get_name(r);
  f.id.arch_name = get_name(r);
  if (r.pos() != bytes.size()) throw Error("header has trailing bytes");
  return f;
}

struct Preamble {
  uint32_t version = 0;
  uint32_t header_bytes = 0;
  uint64_t file_size = 0;
};

// The fixed-size fields, checked against the real size before anything else is read.
Preamble decode_preamble(std::string_view bytes, uint64_t actual_size) {
  if (bytes.size() < kPreamble) throw Error("truncated: " + std::to_string(actual_size) + " bytes, not even a header");
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) throw Error("not a prompt-cache file (bad magic)");
  Preamble p;
  std::memcpy(&p.version, bytes.data() + 8, 4);
  std::memcpy(&p.header_bytes, bytes.data() + 12, 4);
  std::memcpy(&p.file_size, bytes.data() + 16, 8);
  if (p.version == 0 || p.version > 0xffff)  // text after the magic (is_prompt_cache_file)
    throw Error("not a prompt-cache file (the magic, then no version)");
  if (p.version != kPromptCacheVersion)
    throw Error("format version " + std::to_string(p.version) + ", this build reads version " +
                std::to_string(kPromptCacheVersion));
  if (p.file_size != actual_size)
    throw Error((actual_size < p.file_size ? "truncated: " : "has extra bytes: ") + std::to_string(actual_size) +
                " bytes, the header says " + std::to_string(p.file_size));
  if (p.header_bytes > kMaxHeader || kPreamble + p.header_bytes + kTrailer > actual_size)
    throw Error("header length " + std::to_string(p.header_bytes) + " does not fit the file");
  return p;
}

// Checks that ids and logits and the KV state exactly fill the body; returns the body's offset.
size_t check_body(const Preamble& p, const HeaderFields& h) {
  const uint64_t body = p.file_size - kPreamble - p.header_bytes - kTrailer;
  const uint64_t vocab = uint64_t(h.id.vocab_size);
  if (h.n_ids == 0) throw Error("holds no tokens");
  if (h.n_ids > body / 4 || vocab > body / 4 || h.kv_bytes > body ||
      4 * h.n_ids + 4 * vocab + h.kv_bytes != body)
    throw Error("section lengths (" + std::to_string(h.n_ids) + " ids, " + std::to_string(vocab) + " logits, " +
                std::to_string(h.kv_bytes) + " KV bytes) do not match the file size");
  return kPreamble + p.header_bytes;
}

std::vector<int32_t> decode_ids(const char* p, uint64_t n, int32_t vocab) {
  std::vector<int32_t> ids(n);
  std::memcpy(ids.data(), p, n * sizeof(int32_t));
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) throw Error("holds token id " + std::to_string(id) + ", outside the vocabulary");
  return ids;
}

// Everything before the KV state: preamble, header, ids, logits.
std::string encode_head(const PromptCacheIdentity& id, int64_t created_ms, std::span<const int32_t> ids,
                        std::span<const float> logits, uint64_t kv_bytes) {
  PTLLM_CHECK(logits.size() == size_t(id.vocab_size) && !ids.empty());
  const std::string header = encode_header(id, created_ms, ids.size(), kv_bytes);
  const uint64_t file_size = kPreamble + header.size() + 4 * ids.size() + 4 * logits.size() + kv_bytes + kTrailer;
  std::string head(kMagic, sizeof kMagic);
  put_bytes<uint32_t>(head, kPromptCacheVersion);
  put_bytes<uint32_t>(head, uint32_t(header.size()));
  put_bytes<uint64_t>(head, file_size);
  head += header;
  head.append(reinterpret_cast<const char*>(ids.data()), ids.size_bytes());
  head.append(reinterpret_cast<const char*>(logits.data()), logits.size_bytes());
  return head;
}

}  // namespace

std::string iso_time(int64_t ms) {
  const std::time_t t = std::time_t(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string encode_cache_file(const PromptCacheIdentity& id, int64_t created_ms, std::span<const int32_t> ids,
                              std::span<const float> logits, std::string_view kv_state) {
  std::string out = encode_head(id, created_ms, ids, logits, kv_state.size());
  out += kv_state;
  put_bytes<uint64_t>(out, checksum64(out.data(), out.size()));
  return out;
}

CacheFile decode_cache_file(std::string_view bytes) {
  const Preamble p = decode_preamble(bytes, bytes.size());
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - kTrailer, kTrailer);
  if (checksum64(bytes.data(), bytes.size() - kTrailer) != stored)
    throw Error("checksum mismatch (the file is damaged)");
  const HeaderFields h = decode_header(bytes.substr(kPreamble, p.header_bytes));
  size_t at = check_body(p, h);
  CacheFile f;
  f.version = p.version;
  f.identity = h.id;
  f.created_ms = h.created_ms;
  f.file_size = p.file_size;
  f.ids = decode_ids(bytes.data() + at, h.n_ids, h.id.vocab_size);
  at += h.n_ids * 4;
  f.logits.resize(size_t(h.id.vocab_size));
  std::memcpy(f.logits.data(), bytes.data() + at, f.logits.size() * sizeof(float));
  at += f.logits.size() * sizeof(float);
  f.kv_state = bytes.substr(at, h.kv_bytes);
  return f;
}

CacheFile read_cache_header(const fs::path& path) {
  const RegularFile f = open_cache_file(path);
  const uint64_t size = f.size();
  char pre[kPreamble];
  const size_t n_pre = size_t(std::min<uint64_t>(size, kPreamble));
  f.read_at(pre, n_pre, 0);
  const Preamble p = decode_preamble({pre, n_pre}, size);
  std::string header(p.header_bytes, '\0');
  f.read_at(header.data(), header.size(), kPreamble);
  const HeaderFields h = decode_header(header);
  const size_t at = check_body(p, h);
  CacheFile out;
  out.version = p.version;
  out.identity = h.id;
  out.created_ms = h.created_ms;
  out.file_size = size;
  std::string ids(h.n_ids * 4, '\0');
  f.read_at(ids.data(), ids.size(), at);
  out.ids = decode_ids(ids.data(), h.n_ids, h.id.vocab_size);
  return out;
}

CacheFile read_cache_file(const fs::path& path, std::string& buffer) {
  const RegularFile f = open_cache_file(path);
  buffer.resize(f.size());
  f.read_at(buffer.data(), buffer.size(), 0);
  return decode_cache_file(buffer);
}

uint64_t write_cache_file(const fs::path& path, const PromptCacheIdentity& id, int64_t created_ms,
                          std::span<const int32_t> ids, std::span<const float> logits, std::string_view kv_state) {
  const std::string head = encode_head(id, created_ms, ids, logits, kv_state.size());
  Checksum64 st;
  st.update(head.data(), head.size());
  st.update(kv_state.data(), kv_state.size());
  const uint64_t sum = st.digest();
  return write_file_atomically(path, {head, kv_state, std::string_view(reinterpret_cast<const char*>(&sum), sizeof sum)});
}

// ---------------------------------------------------------------------------------------------

bool is_prompt_cache_file(const fs::path& path) {
  try {
    const RegularFile f(path);
    char pre[kPreamble];
    if (f.size() < sizeof pre) return false;
    f.read_at(pre, sizeof pre, 0);
    if (std::memcmp(pre, kMagic, sizeof kMagic) != 0) return false;
    // The binary fields after the magic: a text file that begins with the magic has ASCII there,
    // which reads as a version and a header length in the hundreds of millions.
    uint32_t version = 0, header_bytes = 0;
    std::memcpy(&version, pre + 8, 4);
    std::memcpy(&header_bytes, pre + 12, 4);
    return version >= 1 && version <= 0xffff && header_bytes <= kMaxHeader;
  } catch (const Error&) {
    return false;
  }
}

std::optional<std::string> not_replaceable(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    return std::string("cannot stat it: ") + std::strerror(errno);
  }
  if (!S_ISREG(st.st_mode)) return "it is " + file_type_name(st.st_mode) + ", not a file of ours";
  if (st.st_size == 0) return std::nullopt;  // nothing to lose (`touch` made it, or a crash of another writer)
  if (!is_prompt_cache_file(path)) return "it is not a prompt-cache file";
  return std::nullopt;
}

}  // namespace ptllm
