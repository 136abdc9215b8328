#include "engine/stop_text.h"

#include <algorithm>
#include <utility>

namespace ptllm {

std::string StopText::push(const std::string& piece) {
  pending_ += piece;
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < first) first = at, found_ = s;
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  size_t hold = 0;  // the longest end of pending_ that begins a stop string
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopText::finish() { return std::exchange(pending_, {}); }

std::string StopText::close(const std::string& rest) {
  if (stopped_) return "";
  std::string out = push(rest);
  if (!stopped_) out += finish();
  return out;
}

}  // namespace ptllm
