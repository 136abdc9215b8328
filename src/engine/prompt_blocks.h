#pragma once
// The prompt cache of `sample` and `chat` over a block store (`--prompt-cache-dir`): the format
// `serve --prompt-cache-dir` reads and writes (persist/kv_store.h: one self-verifying value per
// token block, keyed by the prompt-cache identity and the block's chained hash). A directory one
// command wrote gives the other its prefix blocks.
//
// A session draws from a pool of its own (one sequence, keyed), into which a prompt's blocks are
// loaded from the store; the session adopts the longest loaded prefix after which feeding the rest
// computes exactly what a cold prefill computes (adoption_is_exact: KIVI's 64-token grid, and the
// last append on the same matmul path), and feeds the rest. The blocks it computes go back to the
// store as the server puts them (BlockExchange::save_progress). A value that does not verify is a
// miss with a warning; the output is always the cold output.
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "kv/kv_cache.h"
#include "persist/kv_store.h"

namespace ptllm {

class Model;
class Session;

struct PromptBlockLoad {
  int64_t prompt = 0;     // tokens of the prompt
  int64_t reused = 0;     // of them, adopted from blocks (the store's or the pool's)
  size_t blocks = 0;      // blocks loaded from the store
  uint64_t bytes_read = 0;
  size_t rejected = 0;    // values present that did not verify (each a warning)
};

struct PromptBlockSave {
  uint64_t blocks = 0;   // block values written
  uint64_t bytes = 0;
  uint64_t dropped = 0;  // not written (queue full, a failed write, over the size bound)
  bool complete = true;  // every queued write was attempted within the limit
};

class PromptBlockCache {
 public:
  // store: the directory's (it must outlive this); identity: PromptCacheIdentity::config_key;
  // prefix: the keys' first part (serve's --kv-store-prefix default, "ptllm").
  PromptBlockCache(const Model& model, const KVCacheConfig& kv, KVStore& store, Digest identity,
                   std::string prefix = "ptllm");
  ~PromptBlockCache();
  PromptBlockCache(const PromptBlockCache&) = delete;
  PromptBlockCache& operator=(const PromptBlockCache&) = delete;

  // The pool a session using this cache must draw from (Session's kv_pool).
  KVPool* pool() { return pool_.get(); }

  // On a fresh session on pool(): loads the prompt's blocks, adopts the longest exact prefix and
  // feeds the rest (at least the last token, so that its logits exist), then queues the blocks the
  // prefill computed. Throws only what Session::feed throws.
  PromptBlockLoad prefill(Session& session, std::span<const int32_t> prompt);
  // Queues the full blocks the session computed since the last call (at_end: also, under KIVI, the
  // blocks still in full precision, as before the session lets go of them). A session rewound since
  // (a conversation whose template rewrote a turn) puts its new blocks.
  void save(const Session& session, bool at_end);
  // save(session, true), then waits at most `limit` for the store to write what was queued.
  PromptBlockSave finish(const Session& session, std::chrono::milliseconds limit = std::chrono::seconds(30));

 private:
  // Whether adopting `adopted` tokens of an n-token prompt and feeding the rest as Session::feed
  // does gives the cold prefill's computation.
  bool exact(const Session& session, int64_t n, int64_t adopted) const;
  void track(std::span<const int32_t> history);

  KVStore& store_;
  std::unique_ptr<KVPool> pool_;
  std::unique_ptr<BlockExchange> exchange_;  // after pool_: destroyed first, waiting for its pins
  std::vector<int32_t> tokens_;    // the history the hashes are of
  std::vector<BlockHash> hashes_;  // chained hashes of tokens_' first full blocks
  size_t saved_ = 0;               // blocks of tokens_ put or taken from the store
  KVStoreStats at_start_;
};

}  // namespace ptllm
