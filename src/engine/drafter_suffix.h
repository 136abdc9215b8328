#pragma once
// The suffix drafter (SuffixDecoding's idea, Oliaro et al. 2024): every context of up to N tokens seen
// in the sequence counts the tokens that followed it; a draft follows the most frequent continuation
// of the longest context that matches the sequence's end, token by token, and stops where the
// product of the continuations' frequencies falls below a threshold (drafts of adaptive length).
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/speculative.h"

namespace ptllm {

class SuffixDrafter : public Drafter {
 public:
  explicit SuffixDrafter(int max_context = 8, double min_confidence = 0.1);
  int draft(std::span<const int32_t> history, int max, std::vector<int32_t>& out) override;
  int classes() const override { return max_ctx_ + 1; }

 private:
  struct Next {
    int32_t id;
    uint32_t count;
  };
  struct Counts {
    std::vector<Next> next;
    uint32_t total = 0;
  };
  static uint64_t key(std::span<const int32_t> ctx);
  void index(std::span<const int32_t> history);
  // The most frequent continuation of the longest context ending `seq` (n: its length; 0: none).
  const Counts* lookup(std::span<const int32_t> seq, int& n) const;
  int max_ctx_;
  double min_conf_;
  std::unordered_map<uint64_t, Counts> table_;
  std::vector<int32_t> indexed_;  // the tokens counted so far
  std::vector<int32_t> path_;     // history tail plus the draft being built
};

}  // namespace ptllm
