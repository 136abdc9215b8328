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

int64_t ModelDrafter::catch_up(std::span<const int32_t> h, int max) {
  const int64_t L = int64_t(h.size());
  if (max <= 0 || L == 0 || L + max > opts_.kv.ctx_size) return -1;
  // Rewind to the shared prefix (at least the last token is fed again: its logits are needed).
  const std::vector<int32_t>& mine = session_->history();
  const int64_t common = std::mismatch(mine.begin(), mine.begin() + std::min<int64_t>(int64_t(mine.size()), L), h.begin()).first -
                         mine.begin();
  const int64_t keep = std::min(common, L - 1);
  if (keep < session_->position()) session_->truncate(keep);
  return keep;
}

int ModelDrafter::draft(std::span<const int32_t> h, int max, std::vector<int32_t>& out) {
  out.clear();
  const int64_t L = int64_t(h.size());
  const int64_t keep = catch_up(h, max);
  if (keep < 0) return 0;
  std::span<float> logits = session_->feed(h.subspan(size_t(keep)));
  fed_ += L - keep;
  ++passes_;
  for (;;) {
    const int32_t id = argmax(logits);
    out.push_back(id);
    if (int(out.size()) >= max) break;
    logits = session_->feed({&id, 1});
    ++fed_;
    ++passes_;
  }
  return 0;
}

int draft_batched(std::span<DraftJob> jobs, ForwardState& st) {
  int passes = 0;
  std::vector<Session*> sessions;
  std::vector<std::span<const int32_t>> feeds;
  std::vector<DraftJob*> active;
  std::vector<std::span<const int32_t>> rest(jobs.size());  // what each cache still lacks
  for (size_t i = 0; i < jobs.size(); ++i) {
    DraftJob& j = jobs[i];
    j.out->clear();
    const int64_t keep = j.drafter->catch_up(j.history, j.max);
    if (keep >= 0) rest[i] = j.history.subspan(size_t(keep));
  }
  // The missing tokens, in chunks as long as each cache takes in one append (a prompt's first draft).
  for (;;) {
    sessions.clear();
    feeds.clear();
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (rest[i].empty()) continue;
      Session& s = *jobs[i].drafter->session_;
      const size_t n = std::min(rest[i].size(), size_t(s.max_chunk()));
      sessions.push_back(&s);
      feeds.push_back(rest[i].first(n));
      jobs[i].drafter->fed_ += int64_t(n);
      rest[i] = rest[i].subspan(n);
      if (rest[i].empty()) active.push_back(&jobs[i]);
    }
    if (sessions.empty()) break;
    Session::feed_batch(sessions, feeds, st);
    ++passes;
  }
  // One pass per draft position: each sequence's greedy token, fed while it wants more.
  std::vector<int32_t> ids(jobs.size());
  while (!active.empty()) {
    sessions.clear();
    feeds.clear();
    size_t n = 0;
    for (DraftJob* j : active) {
      Session& s = *j->drafter->session_;
      const int32_t id = argmax(s.last_logits());
      j->out->push_back(id);
      if (int(j->out->size()) >= j->max) continue;
      active[n] = j;
      ids[n] = id;
      ++n;
    }
    active.resize(n);
    if (n == 0) break;
    for (size_t i = 0; i < n; ++i) {
      sessions.push_back(active[i]->drafter->session_.get());
      feeds.push_back({&ids[i], 1});
      ++active[i]->drafter->fed_;
    }
    Session::feed_batch(sessions, feeds, st);
    ++passes;
  }
  return passes;
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
