#include "engine/drafter_suffix.h"

#include <algorithm>

namespace ptllm {

uint64_t SuffixCounts::key(std::span<const int32_t> ctx) {
  // FNV-1a over the ids and the length (a collision only costs a worse draft: verification decides).
  uint64_t h = 1469598103934665603ull ^ ctx.size();
  for (int32_t t : ctx) {
    h ^= uint32_t(t);
    h *= 1099511628211ull;
  }
  return h;
}

void SuffixCounts::count(std::span<const int32_t> h, size_t from, int sign) {
  for (size_t p = from; p < h.size(); ++p) {
    for (int n = 1; n <= max_ctx_ && size_t(n) <= p; ++n) {
      const uint64_t k = key(h.subspan(p - size_t(n), size_t(n)));
      if (sign > 0) {
        Counts& c = table_[k];
        auto it = std::find_if(c.next.begin(), c.next.end(), [&](const Next& x) { return x.id == h[p]; });
        if (it == c.next.end()) c.next.push_back({h[p], 1});
        else ++it->count;
        ++c.total;
        continue;
      }
      const auto e = table_.find(k);
      if (e == table_.end()) continue;
      Counts& c = e->second;
      auto it = std::find_if(c.next.begin(), c.next.end(), [&](const Next& x) { return x.id == h[p]; });
      if (it == c.next.end()) continue;
      --c.total;
      if (--it->count == 0) c.next.erase(it);
      if (c.total == 0 || c.next.empty()) table_.erase(e);
    }
  }
}

const SuffixCounts::Counts* SuffixCounts::lookup(std::span<const int32_t> seq, int& n) const {
  for (n = int(std::min<size_t>(size_t(max_ctx_), seq.size())); n >= 1; --n) {
    const auto it = table_.find(key(seq.subspan(seq.size() - size_t(n), size_t(n))));
    if (it != table_.end()) return &it->second;
  }
  n = 0;
  return nullptr;
}

double SuffixCounts::draft(std::span<const int32_t> tail, int max, double min_conf, std::vector<int32_t>& out,
                           int& first_n) const {
  out.clear();
  first_n = 0;
  if (table_.empty()) return 0;
  const size_t keep = std::min<size_t>(tail.size(), size_t(max_ctx_));
  std::vector<int32_t> path(tail.end() - std::ptrdiff_t(keep), tail.end());
  double conf = 1, expected = 0;
  while (int(out.size()) < max) {
    int n = 0;
    const Counts* c = lookup(path, n);
    if (!c) break;
    if (out.empty()) first_n = n;
    const Next best = *std::max_element(c->next.begin(), c->next.end(),
                                        [](const Next& a, const Next& b) { return a.count < b.count; });
    conf *= double(best.count) / double(c->total);
    if (conf < min_conf) break;
    expected += conf;
    out.push_back(best.id);
    path.push_back(best.id);
  }
  if (out.empty()) first_n = 0;
  return expected;
}

// ---------------------------------------------------------------------------------------------

SuffixCache::SuffixCache(int max_context, size_t max_tokens) : counts_(max_context), max_tokens_(max_tokens) {}

void SuffixCache::add(std::span<const int32_t> prompt, std::span<const int32_t> reply) {
  if (reply.empty() || max_tokens_ == 0) return;
  // A reply longer than the whole budget keeps its end.
  if (reply.size() > max_tokens_) reply = reply.last(max_tokens_);
  Reply r;
  const size_t ctx = std::min<size_t>(prompt.size(), size_t(counts_.max_context() - 1));
  r.ids.assign(prompt.end() - std::ptrdiff_t(ctx), prompt.end());
  r.start = r.ids.size();
  r.ids.insert(r.ids.end(), reply.begin(), reply.end());
  std::lock_guard lk(mu_);
  while (!replies_.empty() && tokens_ + reply.size() > max_tokens_) {
    const Reply& old = replies_.front();
    counts_.count(old.ids, old.start, -1);
    tokens_ -= old.ids.size() - old.start;
    replies_.pop_front();
  }
  counts_.count(r.ids, r.start, +1);
  tokens_ += reply.size();
  replies_.push_back(std::move(r));
}

double SuffixCache::draft(std::span<const int32_t> tail, int max, double min_conf, std::vector<int32_t>& out,
                          int& first_n) const {
  std::lock_guard lk(mu_);
  return counts_.draft(tail, max, min_conf, out, first_n);
}

size_t SuffixCache::tokens() const {
  std::lock_guard lk(mu_);
  return tokens_;
}

size_t SuffixCache::contexts() const {
  std::lock_guard lk(mu_);
  return counts_.contexts();
}

// ---------------------------------------------------------------------------------------------

SuffixDrafter::SuffixDrafter(int max_context, double min_confidence, const SuffixCache* shared)
    : min_conf_(min_confidence), shared_(shared), own_(std::max(1, max_context)) {}

void SuffixDrafter::index(std::span<const int32_t> h) {
  // A rewound or rewritten history (chat's template, a regenerated turn) is counted again.
  if (indexed_.size() > h.size() || !std::equal(indexed_.begin(), indexed_.end(), h.begin())) {
    own_.clear();
    indexed_.clear();
  }
  own_.count(h, indexed_.size(), +1);
  indexed_.assign(h.begin(), h.end());
}

int SuffixDrafter::draft(std::span<const int32_t> history, int max, std::vector<int32_t>& out) {
  index(history);
  int n = 0;
  const double own = own_.draft(history, max, min_conf_, out, n);
  if (shared_) {
    // SuffixDecoding scores a candidate by its expected accepted length and takes the best (on a
    // tie, the one matched on the longer context).
    int m = 0;
    const double other = shared_->draft(history, max, min_conf_, other_, m);
    if (other > own || (other == own && m > n)) {
      out.swap(other_);
      n = m;
    }
  }
  return out.empty() ? 0 : n;
}

}  // namespace ptllm
