#pragma once
// The greedy continuation the engine tests compare against: argmax, fed back one token at a time.
#include <cstdint>
#include <span>
#include <vector>

#include "engine/session.h"
#include "sample/sampler.h"

namespace ptllm::test {

struct Greedy {
  std::vector<int32_t> ids;        // the chosen tokens (a stop id not included)
  std::vector<float> last_logits;  // after the last one fed
};

// `steps` greedy tokens after `prompt` on `s`. stop >= 0: ends before that id. feed_last: the last
// chosen token is fed too (last_logits follow it); otherwise generation stops at choosing it.
inline Greedy greedy(Session& s, std::span<const int32_t> prompt, int steps, int32_t stop = -1,
                     bool feed_last = true) {
  std::span<float> lg = s.feed(prompt);
  Greedy g;
  for (int i = 0; i < steps; ++i) {
    const int32_t next = argmax(lg);
    if (next == stop) break;
    g.ids.push_back(next);
    if (feed_last || i + 1 < steps) lg = s.feed({&g.ids.back(), 1});
  }
  g.last_logits.assign(lg.begin(), lg.end());
  return g;
}

}  // namespace ptllm::test
