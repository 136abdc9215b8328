#pragma once
// `--prompt-cache-dir` of `sample` and `chat`: the block store of `serve --prompt-cache-dir` over the
// same directory (engine/prompt_blocks.h), its opening and its status lines.
#include <filesystem>
#include <memory>

#include "engine/prompt_blocks.h"
#include "kv/config.h"

namespace ptllm {
class Model;
class Tokenizer;
}  // namespace ptllm

namespace ptllm::cli {

struct BlockPromptCache {
  std::unique_ptr<KVStore> store;
  std::unique_ptr<PromptBlockCache> cache;  // null: no directory, or one that cannot be used (a warning said so)
  std::filesystem::path root;               // DIR/blocks
  KVPool* pool() { return cache ? cache->pool() : nullptr; }
};

// max_mb <= 0: serve's default bound (1024 MiB).
BlockPromptCache open_block_prompt_cache(const std::string& dir, double max_mb, const Model& model, const Tokenizer& tok,
                                         const KVCacheConfig& kv);
void report_block_load(const PromptBlockLoad& r, const std::filesystem::path& root, bool quiet);
void report_block_save(const PromptBlockSave& r, const std::filesystem::path& root, bool quiet);

}  // namespace ptllm::cli
