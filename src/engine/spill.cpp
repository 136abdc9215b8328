#include "engine/spill.h"

#include <chrono>
#include <string>

#include "core/error.h"
#include "engine/session.h"

namespace ptllm {

uint64_t spill_session(const Session& s, const PromptCacheIdentity& id, const std::filesystem::path& file) {
  PTLLM_CHECK(s.has_cache() && s.position() > 0);
  std::string state;
  s.cache().serialize(state);
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  return write_cache_file(file, id, now, s.history(), s.last_logits(), state);
}

void restore_session(Session& s, const PromptCacheIdentity& id, const std::filesystem::path& file) {
  std::string buffer;
  try {
    const CacheFile f = read_cache_file(file, buffer);
    if (f.identity.config_key != id.config_key)
      throw Error("saved by another model, tokenizer, build or KV setting");
    s.restore(f.ids, f.kv_state, f.logits);
  } catch (const Error& e) {
    throw Error(file.string() + ": " + e.what());
  }
}

}  // namespace ptllm
