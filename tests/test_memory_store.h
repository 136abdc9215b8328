#pragma once
// A KVStore in a map, for the tests of what goes through a store (test_kv_store.cpp,
// test_kv_exchange.cpp): every put kept, every lookup answered from the map, values editable.
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "persist/kv_store.h"

namespace ptllm::test {

class MemoryStore final : public KVStore {
 public:
  // The values are copied first: a put or an edit while the caller reads them changes nothing.
  void lookup(std::span<const std::string> keys, const OnValue& on_value) override {
    std::vector<std::optional<std::string>> values(keys.size());
    {
      std::lock_guard lk(mu_);
      ++stats_.lookups;
      stats_.keys_looked_up += keys.size();
      for (size_t i = 0; i < keys.size(); ++i)
        if (auto it = map_.find(keys[i]); it != map_.end()) values[i] = it->second;
    }
    for (size_t i = 0; i < keys.size(); ++i)
      if (!on_value(i, values[i] ? std::optional<std::string_view>(*values[i]) : std::nullopt)) break;
  }
  using KVStore::put;
  // A value's pin is dropped on return (its body copied); hold_pins() keeps them instead, until
  // release_pins(), as a store whose writer has not sent them yet would.
  void put(std::string key, StoreValue value, Finish finish) override {
    if (finish) finish(value);
    std::lock_guard lk(mu_);
    ++stats_.writes;
    map_[std::move(key)] = value.flatten();
    if (hold_pins_ && value.pin) pins_.push_back(std::move(value.pin));
  }
  void hold_pins(bool on) {
    std::lock_guard lk(mu_);
    hold_pins_ = on;
  }
  size_t held_pins() const {
    std::lock_guard lk(mu_);
    return pins_.size();
  }
  void release_pins() {
    std::vector<std::unique_ptr<StoreValue::Pin>> pins;
    {
      std::lock_guard lk(mu_);
      pins.swap(pins_);
    }
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
  bool hold_pins_ = false;
  std::vector<std::unique_ptr<StoreValue::Pin>> pins_;
};

}  // namespace ptllm::test
