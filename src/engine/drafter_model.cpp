#include "engine/drafter_model.h"

#include <algorithm>

#include "core/error.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {

ModelDrafter::ModelDrafter(const Model& draft, ThreadPool& pool, int ctx_size) : model_(draft), pool_(pool) {
  opts_.kv.ctx_size = std::max(2, std::min(ctx_size, draft.config().max_position_embeddings));
  session_ = std::make_unique<Session>(model_, opts_, pool_);
}

int ModelDrafter::draft(std::span<const int32_t> h, int max, std::vector<int32_t>& out) {
  out.clear();
  const int64_t L = int64_t(h.size());
  if (max <= 0 || L == 0 || L + max > opts_.kv.ctx_size) return 0;
  // Rewind to the shared prefix (at least the last token is fed again: its logits are needed).
  const std::vector<int32_t>& mine = session_->history();
  const int64_t common = std::mismatch(mine.begin(), mine.begin() + std::min<int64_t>(int64_t(mine.size()), L), h.begin()).first -
                         mine.begin();
  const int64_t keep = std::min(common, L - 1);
  if (keep < session_->position()) session_->truncate(keep);
  std::span<float> logits = session_->feed(h.subspan(size_t(keep)));
  fed_ += L - keep;
  for (;;) {
    const int32_t id = argmax(logits);
    out.push_back(id);
    if (int(out.size()) >= max) break;
    logits = session_->feed({&id, 1});
    ++fed_;
  }
  return 0;
}

void check_same_vocabulary(const Tokenizer& target, const Tokenizer& draft, const std::string& target_name,
                           const std::string& draft_name) {
  if (target.vocab_size() != draft.vocab_size())
    throw UsageError("--model-draft " + draft_name + " has a vocabulary of " + std::to_string(draft.vocab_size()) +
                     " tokens, the model " + target_name + " one of " + std::to_string(target.vocab_size()) +
                     ": a draft model needs the target's tokenizer");
  const std::vector<std::string> a = target.token_bytes(), b = draft.token_bytes();
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (a[i] != b[i])
      throw UsageError("--model-draft " + draft_name + ": token " + std::to_string(i) +
                       " is not the one of the model " + target_name +
                       " (a draft model needs the target's tokenizer)");
}

}  // namespace ptllm
