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

class Model;
class Session;
class Tokenizer;

// ---------------------------------------------------------------------------------------------
// Prefill through the cache.

struct PromptCacheOptions {
  std::filesystem::path file;  // --cache-prompt: this one file (wins over dir)
  std::filesystem::path dir;   // a directory of whole-state files (the CLI's --prompt-cache-dir is the
                               // block store: engine/prompt_blocks.h)
  uint64_t max_bytes = 0;      // --prompt-cache-max-mb (dir only; 0 = unbounded)
  bool enabled() const { return !file.empty() || !dir.empty(); }
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
  std::vector<Saved> saved;
  PruneResult pruned;
  std::vector<std::string> warnings;
};

class PromptCache {
 public:
  PromptCache(PromptCacheOptions opts, PromptCacheIdentity id, const Tokenizer& tok);
  ~PromptCache();  // waits for the background write
  PromptCache(const PromptCache&) = delete;
  PromptCache& operator=(const PromptCache&) = delete;

  // Restores into `session` (fresh) the longest cached prefix of `prompt` that can be extended
  // exactly, feeds the rest, and starts saving the new state in the background (the state is
  // copied first: the caller may go on feeding the session). Problems with cache files become
  // warnings; throws only what Session::feed throws.
  PromptCacheLoad prefill(Session& session, std::span<const int32_t> prompt);
  // Saves the session's whole state (its history, KV and last logits) in the background, as
  // prefill() saves a prompt's: a conversation saves each turn's prompt this way. The state is
  // copied first. Waits for an earlier write still running (its result is then lost: call finish()
  // first to report it).
  void save(const Session& session);
  // Waits for the writes started by prefill() or save().
  PromptCacheSave finish();

 private:
  struct Candidate;
  struct Job {
    std::filesystem::path path;
    std::vector<int32_t> ids;
    std::vector<float> logits;
    std::string kv_state;
  };
  void write_async(std::vector<Job> jobs, std::filesystem::path used, bool dir_ok);
  std::vector<Candidate> candidates(std::span<const int32_t> prompt, int64_t grid, PromptCacheLoad& load) const;

  PromptCacheOptions opts_;
  PromptCacheIdentity id_;
  const Tokenizer& tok_;
  std::future<PromptCacheSave> pending_;
};

}  // namespace ptllm
