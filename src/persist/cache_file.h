#pragma once
// What outlives a process, part one (DESIGN.md "Layers": persist/): the prompt cache's identity (the
// key of everything a saved KV state depends on) and its file format. The Session side (restoring a
// state and extending it) is engine/prompt_cache.h.
#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/file_io.h"
#include "core/sha256.h"
#include "kv/kv_cache.h"

namespace ptllm {

class Model;
class Tokenizer;

std::string iso_time(int64_t unix_ms);  // "2025-01-31T12:00:00Z"

// Everything a saved state depends on except the token ids. kv.ctx_size and kv.preallocate are not
// part of it: they bound the capacity but do not change what is stored.
struct PromptCacheIdentity {
  std::string model_name;  // the model directory's base name, sanitized to [A-Za-z0-9._-]
  std::string arch_name;   // config.json's architecture
  int32_t vocab_size = 0;
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  KVCacheConfig kv;
  // SHA-256 over the architecture, config.json's bytes, name, size and mtime of every weight file,
  // size and mtime of this executable and its SIMD target (they decide the rounding), the tokenizer
  // fingerprint, the shape above, the layers' sliding windows (when any), which layer's K/V each
  // layer reads (when any shares another's: YOCO) and every KV setting.
  Digest config_key{};
};

PromptCacheIdentity prompt_cache_identity(const Model& model, const Tokenizer& tok, const KVCacheConfig& kv);
std::string sanitize_model_name(std::string_view name);

// ---------------------------------------------------------------------------------------------
// The file (little-endian):
//   "PTLLMKVC"  u32 version  u32 header_bytes  u64 file_size                      (preamble, 24 bytes)
//   config_key[32]  u8 precision  u8 positions  u16 0  i32 group residual sink window
//   i32 vocab layers kv_heads head_dim  i64 created_ms  u64 n_ids  u64 kv_bytes
//   u16+model_name  u16+arch_name                                                 (header_bytes)
//   i32 ids[n_ids]  f32 logits[vocab]  kv_state[kv_bytes]                         (body)
//   u64 XXH3-64 over every byte before it
// 3: each layer's state names its sliding window (KVCache::serialize).
inline constexpr uint32_t kPromptCacheVersion = 3;

struct CacheFile {
  uint32_t version = kPromptCacheVersion;
  PromptCacheIdentity identity;  // as written
  int64_t created_ms = 0;        // Unix time
  std::vector<int32_t> ids;      // [n_ids]
  std::vector<float> logits;     // [vocab] of the last token; empty when only the header was read
  std::string_view kv_state;     // KVCache::serialize() bytes, a view into the decoded buffer
  uint64_t file_size = 0;
};

// The bytes of a file holding this state (tests and the fuzzer's seeds; saving streams the same).
std::string encode_cache_file(const PromptCacheIdentity& id, int64_t created_ms, std::span<const int32_t> ids,
                              std::span<const float> logits, std::string_view kv_state);
// Verifies and parses a whole file: magic, version, size, then the checksum before anything else,
// then every length against the size. Throws ptllm::Error saying what is wrong.
CacheFile decode_cache_file(std::string_view bytes);
// Reads a file's header and ids only (no checksum: for deciding whether the file fits the prompt;
// the full load verifies). Throws ptllm::Error.
CacheFile read_cache_header(const std::filesystem::path& path);
// Reads a whole file (large reads into `buffer`, which the result's kv_state points into) and decodes it.
CacheFile read_cache_file(const std::filesystem::path& path, std::string& buffer);
// Writes atomically: a temporary file beside `path`, fsync, rename, fsync of the directory, so that no
// reader ever sees a partial file under the final name. Returns the bytes written; throws ptllm::Error
// (the temporary removed).
uint64_t write_cache_file(const std::filesystem::path& path, const PromptCacheIdentity& id, int64_t created_ms,
                          std::span<const int32_t> ids, std::span<const float> logits, std::string_view kv_state);

// A regular file starting with this format's preamble (the magic, a version, a header length that
// fits; any version, the rest possibly damaged): one this program wrote.
bool is_prompt_cache_file(const std::filesystem::path& path);
// Why a save must not rename over `path` (nullopt: it is missing, or a file of ours): a save never
// replaces another program's file, a symbolic link, a device or a FIFO.
std::optional<std::string> not_replaceable(const std::filesystem::path& path);

}  // namespace ptllm
