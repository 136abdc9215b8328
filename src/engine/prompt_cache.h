#pragma once
// Persistent prompt cache (DESIGN.md "Persistence", seed 003 section #3): the state of a Session after
// its prompt (token ids, KV-cache bytes, logits of the last token) saved to disk and restored on a
// later launch, so that a repeated or extended prompt skips its prefill.
//
// A cache never changes what the model outputs: a file is used only when its checksum, format
// version, key (model, tokenizer, binary, every KV setting) and token ids all match, and a cached
// prefix is extended only where feeding the rest computes exactly what a cold prefill computes
// (docs/prompt-cache.md). Anything wrong with a file is a warning and the cold path.
#include <array>
#include <cstdint>
#include <filesystem>
#include <future>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "persist/cache_file.h"

namespace ptllm {

class Session;

// ---------------------------------------------------------------------------------------------
// Prefill through the cache.

// One file holds one prompt's whole state (sample's --cache-prompt). The CLI's --prompt-cache-dir is
// another store, of token blocks: engine/prompt_blocks.h.
struct PromptCacheOptions {
  std::filesystem::path file;  // --cache-prompt
  bool enabled() const { return !file.empty(); }
};

enum class PromptCacheOutcome { Miss, PartialHit, Hit };

struct PromptCacheLoad {
  PromptCacheOutcome outcome = PromptCacheOutcome::Miss;
  int64_t reused = 0;  // tokens restored from the file
  int64_t prompt = 0;  // tokens of the prompt
  std::filesystem::path file;
  uint64_t bytes_read = 0;
  std::vector<std::string> warnings;  // one line each: a file ignored, and why
};

struct PromptCacheSave {
  struct Saved {
    std::filesystem::path path;
    int64_t tokens = 0;
    uint64_t bytes = 0;
  };
  std::vector<Saved> saved;  // at most one: the file
  std::vector<std::string> warnings;
};

class PromptCache {
 public:
  // `opts.file` must not be empty.
  PromptCache(PromptCacheOptions opts, PromptCacheIdentity id);
  ~PromptCache();  // waits for the background write
  PromptCache(const PromptCache&) = delete;
  PromptCache& operator=(const PromptCache&) = delete;

  // Restores into `session` (fresh) the file's state when its ids are a prefix of `prompt` that can
  // be extended exactly, feeds the rest, and, unless the whole prompt was restored, starts saving
  // the new state over the file in the background (the state is copied first: the caller may go on
  // feeding the session). Problems with the file become warnings; throws only what Session::feed
  // throws.
  PromptCacheLoad prefill(Session& session, std::span<const int32_t> prompt);
  // Waits for the write started by prefill().
  PromptCacheSave finish();

 private:
  struct Job {
    std::vector<int32_t> ids;
    std::vector<float> logits;
    std::string kv_state;
  };
  void write_async(Job job);
  bool header_fits(std::span<const int32_t> prompt, int64_t grid, PromptCacheLoad& load) const;

  PromptCacheOptions opts_;
  PromptCacheIdentity id_;
  std::future<PromptCacheSave> pending_;
};

}  // namespace ptllm
