#include "sample/sampler.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"

namespace ptllm {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return double(next() >> 11) * 0x1.0p-53; }

int32_t argmax(std::span<const float> logits) {
  // Every verified row of a speculative step and every greedy token takes one: the vector maximum,
  // then the first index holding it, found chunk by chunk in loops the compiler vectorizes
  // (std::max_element keeps an index in a loop it leaves scalar: 10 us against 1.9 us for 8192 logits). The same index as
  // std::max_element's, the first of the largest; with a NaN anywhere (the vector maximum may pass
  // over larger values then) it is std::max_element's own.
  const size_t n = logits.size();
  const float* x = logits.data();
  if (n == 0) return 0;
  const float m = max_of(x, int(n));
  constexpr size_t kChunk = 64;
  size_t first = n;  // the first chunk holding m
  int nan = 0;  // counts, not flags: the compiler vectorizes sums of comparisons
  for (size_t b = 0; b < n; b += kChunk) {
    const size_t e = std::min(n, b + kChunk);
    int hit = 0;
    for (size_t i = b; i < e; ++i) {
      hit += x[i] == m;
      nan += x[i] != x[i];
    }
    if (hit && first == n) first = b;
  }
  if (!nan && first < n)
    for (size_t i = first;; ++i)
      if (x[i] == m) return int32_t(i);
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingConfig& cfg) : cfg_(cfg), rng_(cfg.seed) {}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  const int vocab = int(logits.size());
  const bool penalties = cfg_.repeat_penalty != 1.0f || cfg_.presence_penalty != 0.0f || cfg_.frequency_penalty != 0.0f;
  if (penalties && cfg_.repeat_last_n != 0) {
    // Over the recent tokens, each distinct one once (llama.cpp's penalties sampler): the CTRL-style
    // repetition penalty shrinks its logit (as transformers), then the additive ones subtract.
    size_t n = cfg_.repeat_last_n < 0 ? history.size() : std::min(history.size(), size_t(cfg_.repeat_last_n));
    auto recent = history.subspan(history.size() - n);
    count_.assign(size_t(vocab), 0);
    for (int32_t id : recent)
      if (id >= 0 && id < vocab) ++count_[size_t(id)];
    for (int32_t id : recent) {
      if (id < 0 || id >= vocab || count_[size_t(id)] == 0) continue;
      float& l = logits[size_t(id)];
      l = l > 0 ? l / cfg_.repeat_penalty : l * cfg_.repeat_penalty;
      l -= float(count_[size_t(id)]) * cfg_.frequency_penalty + cfg_.presence_penalty;
      count_[size_t(id)] = 0;  // done: the next occurrence is skipped
    }
  }
  if (cfg_.temperature <= 0.f) return argmax(logits);

  cand_.clear();
  for (int i = 0; i < vocab; ++i) cand_.emplace_back(logits[size_t(i)], i);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = cand_.size();
  if (cfg_.top_k > 0 && size_t(cfg_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + cfg_.top_k, cand_.end(), by_logit);
    n = size_t(cfg_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Probabilities at temperature 1 for the nucleus and min-p cuts (llama.cpp applies temperature last).
  const float mx = cand_[0].first;
  std::vector<float>& p = prob_;
  p.resize(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (p[i] = std::exp(cand_[i].first - mx));
  if (cfg_.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < n; ++i) {
      cum += p[i] / sum;
      if (cum >= cfg_.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  if (cfg_.min_p > 0.f) {
    // keep tokens with p >= min_p * p_max (p_max corresponds to p[0] = 1 before normalization)
    size_t keep = 1;
    while (keep < n && p[keep] >= cfg_.min_p) ++keep;
    n = keep;
  }
  // Temperature, then a draw.
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += (p[i] = std::exp((cand_[i].first - mx) / cfg_.temperature));
  double r = rng_.uniform() * total;
  for (size_t i = 0; i < n; ++i) {
    r -= p[i];
    if (r < 0) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace ptllm
