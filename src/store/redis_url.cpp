#include <charconv>

#include "core/error.h"
#include "store/redis_store.h"

namespace ptllm::store {

namespace {
int parse_int(std::string_view s, int lo, int hi, std::string_view url, const char* what) {
  int v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi)
    throw UsageError("--kv-store " + std::string(url) + ": " + what + " '" + std::string(s) + "' is not a number from " +
                     std::to_string(lo) + " to " + std::to_string(hi));
  return v;
}
}  // namespace

RedisAddress parse_redis_url(std::string_view url) {
  constexpr std::string_view scheme = "redis://";
  if (url.substr(0, scheme.size()) != scheme)
    throw UsageError("--kv-store " + std::string(url) + ": expected redis://HOST[:PORT][/DB]");
  std::string_view rest = url.substr(scheme.size());
  RedisAddress a;
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    // redis://:PASSWORD@host (a user name before the colon is not supported by Redis < 6 AUTH).
    if (cred.empty() || cred[0] != ':' || cred.size() == 1)
      throw UsageError("--kv-store: the credentials must be written redis://:PASSWORD@HOST");
    a.password = std::string(cred.substr(1));
  }
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    if (!db.empty()) a.db = parse_int(db, 0, 1 << 20, url, "the database");
  }
  if (rest.size() > 0 && rest[0] == '[') {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) throw UsageError("--kv-store " + std::string(url) + ": unclosed '['");
    a.host = std::string(rest.substr(1, close - 1));
    rest = rest.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') throw UsageError("--kv-store " + std::string(url) + ": expected ':' after ']'");
      a.port = parse_int(rest.substr(1), 1, 65535, url, "the port");
    }
  } else {
    const size_t colon = rest.find(':');
    a.host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) a.port = parse_int(rest.substr(colon + 1), 1, 65535, url, "the port");
  }
  if (a.host.empty()) throw UsageError("--kv-store " + std::string(url) + ": no host (redis://HOST[:PORT][/DB])");
  return a;
}

}  // namespace ptllm::store
