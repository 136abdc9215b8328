#pragma once
// The block store over a local directory (`serve --prompt-cache-dir DIR`): the same KVStore as the
// Redis one (persist/kv_store.h: same keys, same self-verifying values through BlockExchange), so
// the server's prefixes survive a restart with no new path in the engine.
//
// Layout: one file per token block, DIR/blocks/<hh>/<key with ':' as '-'>.kvblock, where <hh> is
// the first two hex digits of the block hash (256 subdirectories at most). `sample` and `chat`
// (--prompt-cache-dir) read and write the same files (engine/prompt_blocks.h).
//
// Puts are queued and written by a thread of their own (a temporary file, then a rename: a reader
// never sees a partial file; no fsync, since a file torn by a power loss fails its checksum and is
// a miss). When the queue holds `queue_bytes`, puts are dropped (counted). The files are bounded by
// `max_bytes`: past it the writer deletes the least recently used files (oldest mtime; a hit
// refreshes its file's mtime) until they take at most 90% of it. A file that cannot be read, or a
// damaged, truncated or foreign one, is a miss with a warning, never an error to a client.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "persist/kv_store.h"

namespace ptllm::store {

struct DirStoreOptions {
  std::filesystem::path dir;                  // --prompt-cache-dir (the files go to dir/blocks)
  uint64_t max_bytes = uint64_t(1024) << 20;  // --prompt-cache-max-mb
  size_t queue_bytes = size_t(128) << 20;     // values waiting to be written at most; more are dropped
};

// Creates dir/blocks when missing and checks that a file can be written there; throws UsageError
// naming --prompt-cache-dir and the directory when not. Removes temporaries of writers that are gone.
std::unique_ptr<KVStore> open_dir_store(const DirStoreOptions& opts, RateLimitedLog* log = nullptr);

// dir/blocks/<hh>/<file> of a key, or empty when the key is not one kv_store_key() makes
// (NAME:32 hex:32 hex, NAME of printable ASCII without '/', ':' or spaces).
std::filesystem::path dir_store_path(const std::filesystem::path& dir, std::string_view key);

// The block files under dir/blocks, least recently used first (`posttrainllm cache`); `temporaries`
// (when given) gets the temporary files of writers that are gone. Throws ptllm::Error when dir/blocks
// is not a directory that can be read.
struct DirStoreFile {
  std::filesystem::path path;
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;
};
std::vector<DirStoreFile> list_dir_store(const std::filesystem::path& dir,
                                         std::vector<std::filesystem::path>* temporaries = nullptr);

}  // namespace ptllm::store
