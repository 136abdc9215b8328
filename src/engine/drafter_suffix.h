#pragma once
// The suffix drafter (SuffixDecoding's idea, Oliaro et al. 2024): every context of up to N tokens seen
// counts the tokens that followed it; a draft follows the most frequent continuation of the longest
// context that matches the sequence's end, token by token, and stops where the product of the
// continuations' frequencies falls below a threshold (drafts of adaptive length). The counts come
// from the sequence's own history and, in a server, from the recent replies of all its requests
// (SuffixCache): the draft whose expected kept length is larger is proposed.
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/speculative.h"

namespace ptllm {

// What followed each context of 1..N tokens.
class SuffixCounts {
 public:
  struct Next {
    int32_t id;
    uint32_t count;
  };
  struct Counts {
    std::vector<Next> next;
    uint32_t total = 0;
  };
  explicit SuffixCounts(int max_context) : max_ctx_(max_context) {}
  // Counts (sign > 0) or uncounts (sign < 0) each token h[p], p >= from, after the contexts of up to
  // N tokens ending at p - 1 (which may reach before `from`).
  void count(std::span<const int32_t> h, size_t from, int sign);
  void clear() { table_.clear(); }
  size_t contexts() const { return table_.size(); }
  int max_context() const { return max_ctx_; }
  // The greedy draft after `tail` (the sequence's last tokens): up to `max` tokens into `out`
  // (cleared first) while the product of the frequencies stays at least `min_conf`. Returns the
  // expected number of kept tokens under those frequencies (the sum of the running products);
  // first_n: the length of the context that matched first (0: none).
  double draft(std::span<const int32_t> tail, int max, double min_conf, std::vector<int32_t>& out,
               int& first_n) const;

 private:
  static uint64_t key(std::span<const int32_t> ctx);
  const Counts* lookup(std::span<const int32_t> seq, int& n) const;
  int max_ctx_;
  std::unordered_map<uint64_t, Counts> table_;
};

// The recent replies of a server's requests, counted as SuffixCounts, shared by every sequence's
// suffix drafter: a request repeating an earlier reply (a regenerated answer, an agent's loop
// writing the same tool call) drafts it from its first token. Bounded: past `max_tokens` tokens the
// oldest replies are uncounted and dropped. Thread-safe.
class SuffixCache {
 public:
  SuffixCache(int max_context, size_t max_tokens);
  // A finished reply and the prompt it followed (only the prompt's last N - 1 tokens are kept, as
  // the context of the reply's first tokens).
  void add(std::span<const int32_t> prompt, std::span<const int32_t> reply);
  double draft(std::span<const int32_t> tail, int max, double min_conf, std::vector<int32_t>& out, int& first_n) const;
  size_t tokens() const;    // reply tokens held
  size_t contexts() const;  // distinct contexts counted
  size_t max_tokens() const { return max_tokens_; }

 private:
  struct Reply {
    std::vector<int32_t> ids;  // the prompt's tail, then the reply
    size_t start;              // where the reply begins in ids
  };
  mutable std::mutex mu_;
  SuffixCounts counts_;
  std::deque<Reply> replies_;
  size_t tokens_ = 0, max_tokens_;
};

class SuffixDrafter : public Drafter {
 public:
  explicit SuffixDrafter(int max_context = 8, double min_confidence = 0.1, const SuffixCache* shared = nullptr);
  int draft(std::span<const int32_t> history, int max, std::vector<int32_t>& out) override;
  int classes() const override { return own_.max_context() + 1; }

 private:
  void index(std::span<const int32_t> history);
  double min_conf_;
  const SuffixCache* shared_;
  SuffixCounts own_;
  std::vector<int32_t> indexed_;  // the tokens counted so far
  std::vector<int32_t> other_;    // the shared cache's draft
};

}  // namespace ptllm
