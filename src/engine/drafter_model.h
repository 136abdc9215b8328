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

 private:
  const Model& model_;
  ThreadPool& pool_;
  SessionOptions opts_;
  std::unique_ptr<Session> session_;
  int64_t fed_ = 0;
};

// Throws UsageError naming both when the draft model's tokenizer is not the target's (the same
// token strings under the same ids).
void check_same_vocabulary(const Tokenizer& target, const Tokenizer& draft, const std::string& target_name,
                           const std::string& draft_name);

}  // namespace ptllm
