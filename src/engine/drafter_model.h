#pragma once
// The draft-model drafter: a smaller model of the same vocabulary (kjv-tiny for kjv-small) decodes
// greedily ahead of the target. It keeps its own KV cache, private and small, that follows the
// target's history: before each draft it rewinds to the longest prefix it shares with the target's
// history (the kept drafts stay, the rejected ones go) and feeds what the target added since.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/session.h"
#include "engine/speculative.h"

namespace ptllm {

class Tokenizer;
class ThreadPool;
struct DraftJob;

class ModelDrafter : public Drafter {
 public:
  // ctx_size: the draft cache's capacity in tokens (the target's context; a longer history drafts
  // nothing).
  ModelDrafter(const Model& draft, ThreadPool& pool, int ctx_size);
  int draft(std::span<const int32_t> history, int max, std::vector<int32_t>& out) override;
  int classes() const override { return 1; }
  bool costly() const override { return true; }
  // Tokens the draft model was fed (its prefill and its drafting steps), for reports and tests.
  int64_t fed_tokens() const { return fed_; }
  // Forward passes of the draft model its draft() calls ran.
  int64_t passes() const { return passes_; }
  // KV blocks the draft cache holds now (a rewind gives back the blocks past the kept tokens).
  size_t kv_blocks() const { return session_->cache().pool().blocks_in_use(); }
  const Model& model() const { return model_; }

 private:
  friend // Returns the forward passes it ran.
int draft_batched(std::span<DraftJob> jobs, ForwardState& st);
  // Rewinds the draft cache to the prefix it shares with `h` (at least the last token is fed again)
  // and returns where the tokens to feed start; -1 when `max` drafts would not fit.
  int64_t catch_up(std::span<const int32_t> h, int max);
  const Model& model_;
  ThreadPool& pool_;
  SessionOptions opts_;
  std::unique_ptr<Session> session_;
  int64_t fed_ = 0, passes_ = 0;
};

// One sequence's drafting in a batch: its drafter, history and most drafts; its drafts come out in
// `out`.
struct DraftJob {
  ModelDrafter* drafter = nullptr;
  std::span<const int32_t> history;
  int max = 0;
  std::vector<int32_t>* out = nullptr;
};
// The drafts of several sequences of one draft model, each as ModelDrafter::draft() would give them,
// in one batched forward of the draft model per draft position (every weight matrix read once for
// all the sequences, as the target's verification does): the tokens each cache lacks first (one
// chunked pass), then each further draft position. st: the draft model's activations, kept by the
// caller. Greedy drafts of a batched pass may differ from one-at-a-time ones in a last bit (matmul's
// paths by row count), never the verified output: the target decides every kept token.
// Returns the forward passes it ran.
int draft_batched(std::span<DraftJob> jobs, ForwardState& st);

// Throws UsageError naming both when the draft model's tokenizer is not the target's (the same
// token strings under the same ids).
void check_same_vocabulary(const Tokenizer& target, const Tokenizer& draft, const std::string& target_name,
                           const std::string& draft_name);

}  // namespace ptllm
