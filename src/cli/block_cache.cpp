#include "cli/block_cache.h"

#include <cstdio>

#include "cli/options.h"
#include "core/error.h"
#include "persist/cache_file.h"
#include "store/dir_store.h"

namespace ptllm::cli {

BlockPromptCache open_block_prompt_cache(const std::string& dir, double max_mb, const Model& model, const Tokenizer& tok,
                                         const KVCacheConfig& kv) {
  BlockPromptCache c;
  if (dir.empty()) return c;
  store::DirStoreOptions o;
  o.dir = dir;
  if (max_mb > 0) o.max_bytes = uint64_t(max_mb * 1024 * 1024);
  try {
    c.store = store::open_dir_store(o);
  } catch (const Error& e) {  // a directory that cannot be used: the run goes on without it
    std::string why = e.what();
    const std::string flag = "--prompt-cache-dir " + dir + ": ";
    if (why.starts_with(flag)) why = why.substr(flag.size());
    std::fprintf(stderr, "warning: prompt cache: cannot use %s: %s\n", dir.c_str(), why.c_str());
    return c;
  }
  c.root = o.dir / "blocks";
  c.cache = std::make_unique<PromptBlockCache>(model, kv, *c.store, prompt_cache_identity(model, tok, kv).config_key);
  return c;
}

void report_block_load(const PromptBlockLoad& r, const std::filesystem::path& root, bool quiet) {
  if (quiet) return;
  if (r.reused == 0)
    std::fprintf(stderr, "prompt cache: miss, %lld tokens prefilled\n", (long long)r.prompt);
  else
    std::fprintf(stderr, "prompt cache: hit, %lld of %lld tokens reused from %s (%zu blocks, %s read), %lld prefilled\n",
                 (long long)r.reused, (long long)r.prompt, root.c_str(), r.blocks, format_bytes(r.bytes_read).c_str(),
                 (long long)(r.prompt - r.reused));
}

void report_block_save(const PromptBlockSave& r, const std::filesystem::path& root, bool quiet) {
  if (r.dropped > 0)
    std::fprintf(stderr, "warning: prompt cache: %llu blocks not written to %s\n", (unsigned long long)r.dropped,
                 root.c_str());
  if (!r.complete)
    std::fprintf(stderr, "warning: prompt cache: gave up waiting for the writes to %s\n", root.c_str());
  if (quiet || r.blocks == 0) return;
  std::fprintf(stderr, "prompt cache: saved %llu blocks to %s (%s written)\n", (unsigned long long)r.blocks,
               root.c_str(), format_bytes(r.bytes).c_str());
}

}  // namespace ptllm::cli
