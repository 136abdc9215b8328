#pragma once
// Spilling a sequence: its whole state (token ids, KV bytes, last logits) written to a file in the
// prompt-cache format (docs/prompt-cache.md: versioned, checksummed, written atomically), so that
// its blocks go back to a shared pool; restoring it later continues exactly where it stopped.
#include <filesystem>

#include "persist/cache_file.h"

namespace ptllm {

class Session;

// Returns the bytes written; throws ptllm::Error naming the file.
uint64_t spill_session(const Session& s, const PromptCacheIdentity& id, const std::filesystem::path& file);
// Into a fresh session (nothing fed) with the options the state was saved with. Throws ptllm::Error
// naming the file when it is damaged, from another model or KV setting, or does not fit; the session
// then stays empty.
void restore_session(Session& s, const PromptCacheIdentity& id, const std::filesystem::path& file);

}  // namespace ptllm
