// A build without hiredis (libhiredis-dev was not found at configure time): --kv-store says so.
#include "core/error.h"
#include "store/redis_store.h"

namespace ptllm::store {

bool redis_available() { return false; }

std::unique_ptr<KVStore> open_redis_store(const RedisStoreOptions& opts, RateLimitedLog*) {
  parse_redis_url(opts.url);
  throw UsageError("--kv-store: this build of posttrainllm has no Redis client (hiredis was not found when it was "
                   "configured: install libhiredis-dev, then re-run cmake and rebuild)");
}

}  // namespace ptllm::store
