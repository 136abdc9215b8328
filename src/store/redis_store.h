#pragma once
// The block store over Redis: a KVStore (persist/kv_store.h) through hiredis. Lookups are
// one MGET (one round trip per prompt); puts are queued and written by a thread of their own,
// pipelined SETs, so a scheduler step never waits for Redis. A Redis that is down, slow (past the
// timeout) or answering errors is a miss, a warning in the log (at most one per 10 s) and an error
// counted; the connection is retried with a growing backoff (100 ms to 5 s) and, meanwhile, lookups
// miss at once instead of waiting for a timeout each time.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "persist/kv_store.h"

namespace ptllm::store {

// redis://[:PASSWORD@]HOST[:PORT][/DB]
struct RedisAddress {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string password;
};
// Throws UsageError naming --kv-store and what is wrong.
RedisAddress parse_redis_url(std::string_view url);

struct RedisStoreOptions {
  std::string url;                  // --kv-store
  int timeout_ms = 250;             // connecting, and each read or write of a command
  int ttl_s = 0;                    // --kv-store-ttl: values expire after this (0: never; maxmemory decides)
  uint64_t max_bytes = 0;           // --kv-store-max-mb: writes pause while Redis's used_memory is at or over it
  size_t queue_bytes = size_t(128) << 20;  // values waiting to be written at most; more are dropped
};

// Whether this build has the Redis client (hiredis was found at configure time).
bool redis_available();
// Throws UsageError for a bad URL, or when the build has no Redis client. A Redis that cannot be
// reached now is not an error: a warning, and the store retries later.
std::unique_ptr<KVStore> open_redis_store(const RedisStoreOptions& opts, RateLimitedLog* log = nullptr);

}  // namespace ptllm::store
