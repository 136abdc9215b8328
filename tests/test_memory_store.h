#pragma once
// A KVStore in a map, for the tests of what goes through a store (test_kv_store.cpp,
// test_kv_exchange.cpp): every put kept, every lookup answered from the map, values editable.
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/kv_store.h"

namespace ptllm::test {

class MemoryStore final : public KVStore {
 public:
  std::vector<std::optional<std::string>> get(std::span<const std::string> keys) override {
    std::lock_guard lk(mu_);
    ++stats_.lookups;
    std::vector<std::optional<std::string>> out;
    for (const auto& k : keys) {
      auto it = map_.find(k);
      if (it == map_.end()) out.emplace_back();
      else out.emplace_back(it->second);
    }
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
  KVStoreStats stats_;
};

}  // namespace ptllm::test
