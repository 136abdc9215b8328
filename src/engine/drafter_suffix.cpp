#include "engine/drafter_suffix.h"

#include <algorithm>

namespace ptllm {

SuffixDrafter::SuffixDrafter(int max_context, double min_confidence)
    : max_ctx_(std::max(1, max_context)), min_conf_(min_confidence) {}

uint64_t SuffixDrafter::key(std::span<const int32_t> ctx) {
  // FNV-1a over the ids and the length (a collision only costs a worse draft: verification decides).
  uint64_t h = 1469598103934665603ull ^ ctx.size();
  for (int32_t t : ctx) {
    h ^= uint32_t(t);
    h *= 1099511628211ull;
  }
  return h;
}

void SuffixDrafter::index(std::span<const int32_t> h) {
  // A rewound or rewritten history (chat's template, a regenerated turn) is counted again.
  if (indexed_.size() > h.size() || !std::equal(indexed_.begin(), indexed_.end(), h.begin())) {
    table_.clear();
    indexed_.clear();
  }
  for (size_t p = indexed_.size(); p < h.size(); ++p) {
    // Token p follows the contexts ending at p - 1.
    for (int n = 1; n <= max_ctx_ && size_t(n) <= p; ++n) {
      Counts& c = table_[key(h.subspan(p - size_t(n), size_t(n)))];
      auto it = std::find_if(c.next.begin(), c.next.end(), [&](const Next& x) { return x.id == h[p]; });
      if (it == c.next.end()) c.next.push_back({h[p], 1});
      else ++it->count;
      ++c.total;
    }
  }
  indexed_.assign(h.begin(), h.end());
}

const SuffixDrafter::Counts* SuffixDrafter::lookup(std::span<const int32_t> seq, int& n) const {
  for (n = int(std::min<size_t>(size_t(max_ctx_), seq.size())); n >= 1; --n) {
    const auto it = table_.find(key(seq.subspan(seq.size() - size_t(n), size_t(n))));
    if (it != table_.end()) return &it->second;
  }
  n = 0;
  return nullptr;
}

int SuffixDrafter::draft(std::span<const int32_t> history, int max, std::vector<int32_t>& out) {
  out.clear();
  index(history);
  const size_t tail = std::min<size_t>(history.size(), size_t(max_ctx_));
  path_.assign(history.end() - std::ptrdiff_t(tail), history.end());
  int first_n = 0;
  double conf = 1;
  while (int(out.size()) < max) {
    int n = 0;
    const Counts* c = lookup(path_, n);
    if (!c) break;
    if (out.empty()) first_n = n;
    const Next best = *std::max_element(c->next.begin(), c->next.end(),
                                        [](const Next& a, const Next& b) { return a.count < b.count; });
    conf *= double(best.count) / double(c->total);
    if (conf < min_conf_) break;
    out.push_back(best.id);
    path_.push_back(best.id);
  }
  return out.empty() ? 0 : first_n;
}

}  // namespace ptllm
