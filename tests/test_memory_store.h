#pragma once
// A KVStore in a map, for the tests of what goes through a store (test_kv_store.cpp,
// test_kv_exchange.cpp): every put kept, every lookup answered from the map, values editable.
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/kv_store.h"

namespace ptllm::test {

class MemoryStore final : public KVStore {
 public:
  // The values are copied (into last_): a put or an edit while the caller reads them changes nothing.
  std::vector<std::optional<std::string_view>> get(std::span<const std::string> keys) override {
    std::lock_guard lk(mu_);
    ++stats_.lookups;
    last_.assign(keys.size(), std::nullopt);
    for (size_t i = 0; i < keys.size(); ++i)
      if (auto it = map_.find(keys[i]); it != map_.end()) last_[i] = it->second;
    std::vector<std::optional<std::string_view>> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i)
      if (last_[i]) out[i] = *last_[i];
    stats_.keys_looked_up += keys.size();
    return out;
  }
  void put(std::string key, std::string value) override {
    std::lock_guard lk(mu_);
    ++stats_.writes;
    map_[std::move(key)] = std::move(value);
  }
  bool flush(std::chrono::milliseconds) override { return true; }
  KVStoreStats stats() const override {
    std::lock_guard lk(mu_);
    return stats_;
  }
  std::string describe() const override { return "memory"; }
  // Changes every value: f(key, value).
  template <typename F>
  void edit(F f) {
    std::lock_guard lk(mu_);
    for (auto& [k, v] : map_) f(k, v);
  }
  size_t size() const {
    std::lock_guard lk(mu_);
    return map_.size();
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> map_;
  std::vector<std::optional<std::string>> last_;  // the last get()'s values
  KVStoreStats stats_;
};

}  // namespace ptllm::test
