#pragma once
// A conversation's sequence across turns: each turn's prompt (the whole conversation rendered by
// the chat template) is brought into the session by feeding only what its history lacks. Token ids
// only: rendering and tokenizing belong to the caller (the chat command now, the server later).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/session.h"

namespace ptllm {

class PromptBlockCache;
class Tokenizer;

// How one turn's prompt reached the session.
struct TurnPrefill {
  int64_t prompt_tokens = 0;  // the whole rendered conversation
  int64_t reused = 0;         // tokens kept from the session (or restored from the prompt cache)
  int64_t prefilled = 0;      // tokens fed
  int64_t from_cache = 0;     // of `reused`, tokens restored from a prompt-cache file
  bool rewound = false;       // the template rewrote history: the session was rewound to `reused`
  bool fresh = false;         // the rewind was impossible (quantized or evicted tokens): a new session
  std::string note;           // one line saying what happened when rewound or fresh, else empty
};

class Conversation {
 public:
  // kv_pool: the pool its sessions draw from (a prompt cache's, PromptBlockCache::pool); null: private.
  Conversation(const Model& model, const SessionOptions& opts, ThreadPool& pool, KVPool* kv_pool = nullptr);

  // Feeds `prompt` minus the longest prefix the session already holds; where the history differs
  // (a template that rewrites earlier turns, a reply cut at a stop string) the session is rewound to
  // the first differing token, or started afresh when the cache cannot go back that far. At least
  // one token is fed unless the whole prompt is held with its logits. With a prompt `cache` (whose
  // pool the conversation draws from), a fresh session takes the prompt's cached prefix blocks, and
  // the blocks computed are queued for the store. Throws ptllm::Error when the prompt does not fit
  // the context.
  TurnPrefill prefill(std::span<const int32_t> prompt, PromptBlockCache* cache = nullptr);

  // Forgets everything (/reset): the next prefill starts from an empty session.
  void reset();

  Session& session() { return *session_; }
  const Session& session() const { return *session_; }

 private:
  const Model& model_;
  SessionOptions opts_;
  ThreadPool& pool_;
  KVPool* kv_pool_;
  std::unique_ptr<Session> session_;
};

// Every id that ends a reply: the tokenizer's EOS, config.json's eos_token_id and
// generation_config.json's eos_token_id (a number or a list: Llama 3 lists <|eot_id|> there).
// A malformed generation_config.json throws ptllm::Error naming it.
std::vector<int32_t> stop_token_ids(const std::filesystem::path& model_dir, const ModelConfig& cfg,
                                    const Tokenizer& tok);

}  // namespace ptllm
