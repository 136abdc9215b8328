// KVStore over Redis with hiredis (Debian's libhiredis-dev, 0.14 and later): blocking contexts with
// timeouts, one for lookups (the scheduler's thread) and one for the writer thread (a hiredis
// context is not thread-safe).
#include <hiredis/hiredis.h>
#include <sys/time.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "core/error.h"
#include "store/redis_store.h"
#include "store/write_queue.h"

namespace ptllm::store {

bool redis_available() { return true; }

namespace {

using Clock = std::chrono::steady_clock;

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// One connection, reconnected on demand after a failure, with a backoff between attempts.
class Connection {
 public:
  Connection(RedisAddress addr, int timeout_ms) : addr_(std::move(addr)) {
    tv_.tv_sec = timeout_ms / 1000;
    tv_.tv_usec = (timeout_ms % 1000) * 1000;
  }
  ~Connection() { close(); }

  // The context, connected now if needed; null while a previous failure's backoff runs (then
  // *error stays empty) or when connecting failed (*error says why).
  redisContext* get(std::string* error) {
    if (c_) return c_;
    if (Clock::now() < retry_at_) return nullptr;
    c_ = redisConnectWithTimeout(addr_.host.c_str(), addr_.port, tv_);
    if (!c_ || c_->err) {
      *error = "cannot connect to " + where() + ": " + (c_ ? std::string(c_->errstr) : "out of memory");
      broken();
      return nullptr;
    }
    redisSetTimeout(c_, tv_);
    redisEnableKeepAlive(c_);
    if (!addr_.password.empty() && !command_ok({"AUTH", addr_.password}, error)) return nullptr;
    if (addr_.db != 0 && !command_ok({"SELECT", std::to_string(addr_.db)}, error)) return nullptr;
    backoff_ = std::chrono::milliseconds(0);
    return c_;
  }
  // The connection failed (an I/O error, a timeout: hiredis leaves the context unusable): closed,
  // retried after a backoff that doubles up to 5 s.
  void broken() {
    close();
    backoff_ = std::clamp(backoff_ * 2, std::chrono::milliseconds(100), std::chrono::milliseconds(5000));
    retry_at_ = Clock::now() + backoff_;
  }
  std::string where() const { return addr_.host + ":" + std::to_string(addr_.port); }
  // A command's reply; null on a connection failure (the connection is then broken(), *error set).
  Reply command(const std::vector<std::string>& args, std::string* error) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    return command(int(argv.size()), argv.data(), lens.data(), error);
  }
  Reply command(int argc, const char** argv, const size_t* lens, std::string* error) {
    Reply r(static_cast<redisReply*>(redisCommandArgv(c_, argc, argv, lens)));
    if (!r) {
      *error = io_error();
      broken();
    }
    return r;
  }
  std::string io_error() const {
    const std::string what = c_ && c_->err ? std::string(c_->errstr) : "no reply";
    return where() + ": " + (what.find("temporarily unavailable") != std::string::npos ? "timed out" : what);
  }

 private:
  bool command_ok(const std::vector<std::string>& args, std::string* error) {
    Reply r = command(args, error);
    if (!r) return false;
    if (r->type == REDIS_REPLY_ERROR) {
      *error = where() + ": " + args[0] + " refused: " + std::string(r->str, r->len);
      broken();
      return false;
    }
    return true;
  }
  void close() {
    if (c_) redisFree(c_);
    c_ = nullptr;
  }

  RedisAddress addr_;
  timeval tv_{};
  redisContext* c_ = nullptr;
  Clock::time_point retry_at_{};
  std::chrono::milliseconds backoff_{0};
};

// A lookup's reply, taken by hiredis's reader through the functions below instead of its own
// redisReply objects (a malloc and a copy per value): each value is handed to the caller's OnValue
// as soon as the reader has parsed it, as a view of the reader's buffer, and verified and loaded
// there while Redis sends the next ones (no copy of the whole reply first: a 61-value lookup of
// kjv-small, 16 MB, spent 2.5-3.2 ms verifying and 1.6-1.9 ms importing after the last byte came).
// Exceptions do not cross hiredis's C frames: the first is kept and rethrown by lookup().
struct LookupReply {
  const KVStore::OnValue* on_value = nullptr;
  size_t keys = 0;
  int type = 0;                // the reply's type: REDIS_REPLY_ARRAY for an MGET that was answered
  size_t elements = 0;         // an array's element count
  std::string error;           // a top-level error reply's text
  size_t handed = 0;           // elements handed to on_value (in order)
  bool wanted = true;          // on_value has not said it wants no more
  uint64_t bytes = 0;          // value bytes received
  double callback_seconds = 0; // time spent in on_value
  std::exception_ptr thrown;

  void reset(const KVStore::OnValue& f, size_t n) {
    *this = LookupReply{};
    on_value = &f;
    keys = n;
  }
  // An array element (the reply itself at the top level).
  void element(const redisReadTask* t, std::optional<std::string_view> v) {
    if (!t->parent) {
      type = t->type;
      if (t->type == REDIS_REPLY_ERROR && v) error.assign(*v);
      return;
    }
    if (v) bytes += v->size();
    if (!wanted || type != REDIS_REPLY_ARRAY || elements != keys || t->idx < 0 || size_t(t->idx) != handed) return;
    ++handed;
    const auto t0 = Clock::now();
    try {
      wanted = (*on_value)(handed - 1, v);
    } catch (...) {
      thrown = std::current_exception();
      wanted = false;
    }
    callback_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }
};

LookupReply* lookup_of(const redisReadTask* t) { return static_cast<LookupReply*>(t->privdata); }
void* lookup_string(const redisReadTask* t, char* s, size_t len) {
  LookupReply* r = lookup_of(t);
  r->element(t, std::string_view(s, len));
  return r;
}
// The element count is an int in hiredis 0.14, a size_t in 1.x.
template <class N>
void* lookup_array(const redisReadTask* t, N n) {
  LookupReply* r = lookup_of(t);
  if (!t->parent) {
    r->type = REDIS_REPLY_ARRAY;
    r->elements = n > 0 ? size_t(n) : 0;
  }
  return r;
}
void* lookup_integer(const redisReadTask* t, long long) {
  LookupReply* r = lookup_of(t);
  r->element(t, std::nullopt);
  return r;
}
void* lookup_nil(const redisReadTask* t) {
  LookupReply* r = lookup_of(t);
  r->element(t, std::nullopt);
  return r;
}
void lookup_free(void*) {}  // everything lives in the LookupReply
// Filled by name: hiredis 1.x has more members (for RESP3) than 0.14, left null (an MGET's reply
// is RESP2).
redisReplyObjectFunctions lookup_functions() {
  redisReplyObjectFunctions f{};
  f.createString = &lookup_string;
  f.createArray = &lookup_array;
  f.createInteger = &lookup_integer;
  f.createNil = &lookup_nil;
  f.freeObject = &lookup_free;
  return f;
}
redisReplyObjectFunctions kLookupFunctions = lookup_functions();

class RedisStore final : public QueuedStore {
 public:
  RedisStore(const RedisStoreOptions& o, RedisAddress addr, RateLimitedLog* log)
      : QueuedStore(o.queue_bytes),
        opts_(o),
        url_("redis://" + addr.host + ":" + std::to_string(addr.port) + "/" + std::to_string(addr.db)),
        reads_(addr, o.timeout_ms), writes_(addr, o.timeout_ms), log_(log ? log : &own_log_) {
    std::string error;
    if (!reads_.get(&error)) {
      log_->warn(error + " (every lookup misses until it answers)");
      count_error();
    }
    start_writer("ptllm-redis");
  }
  ~RedisStore() override { stop_writer(); }

  void lookup(std::span<const std::string> keys, const OnValue& on_value) override {
    if (keys.empty()) return;
    std::lock_guard lk(read_mu_);
    std::string error;
    redisContext* c = reads_.get(&error);
    if (!c) {
      if (!error.empty()) fail(error);
      return;
    }
    std::vector<const char*> argv{"MGET"};
    std::vector<size_t> lens{4};
    for (const std::string& k : keys) {
      argv.push_back(k.data());
      lens.push_back(k.size());
    }
    // The reader keeps its buffer (maxbuf 0: not freed and grown again for each value) and hands
    // the reply to reply_; its own functions are put back once the reply is whole. On a failure
    // the connection is closed with ours in place: a partial reply belongs to reply_, not the heap.
    reply_.reset(on_value, keys.size());
    redisReader* rd = c->reader;
    redisReplyObjectFunctions* own = rd->fn;
    void* own_priv = rd->privdata;
    rd->fn = &kLookupFunctions;
    rd->privdata = &reply_;
    rd->maxbuf = 0;
    const auto t0 = Clock::now();
    void* raw = redisCommandArgv(c, int(argv.size()), argv.data(), lens.data());
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count() - reply_.callback_seconds;
    if (!raw) {
      fail("lookup: " + reads_.io_error());
      reads_.broken();
    } else {
      rd->fn = own;
      rd->privdata = own_priv;
      if (reply_.type != REDIS_REPLY_ARRAY || reply_.elements != keys.size())
        fail("lookup: MGET answered " + (reply_.type == REDIS_REPLY_ERROR ? reply_.error : "an unexpected reply"));
      else
        count_lookup(keys.size(), dt, reply_.bytes);
    }
    if (reply_.thrown) std::rethrow_exception(reply_.thrown);
  }

  std::string describe() const override { return url_; }

 private:
  void count_error() {
    count([](KVStoreStats& s) { ++s.errors; });
  }
  void fail(const std::string& error) {
    count_error();
    log_->warn(error + " (a miss; generation goes on without the store)");
  }
  void dropped(size_t n) {
    count([n](KVStoreStats& s) { s.dropped_writes += n; });
  }

  // Redis's used_memory, asked at most once a second; false when it is at or over --kv-store-max-mb.
  bool under_max_bytes() {
    if (opts_.max_bytes == 0) return true;
    const auto now = Clock::now();
    if (now - memory_checked_ < std::chrono::seconds(1)) return used_memory_ < opts_.max_bytes;
    memory_checked_ = now;
    std::string error;
    Reply r = writes_.command({"INFO", "memory"}, &error);
    if (!r) {
      fail("INFO memory: " + error);
      return false;
    }
    if (r->type == REDIS_REPLY_STRING) {
      const std::string_view info(r->str, r->len);
      const size_t at = info.find("used_memory:");
      if (at != std::string_view::npos) used_memory_ = std::strtoull(r->str + at + 12, nullptr, 10);
    }
    if (used_memory_ >= opts_.max_bytes)
      log_->warn("Redis at " + writes_.where() + " uses " + std::to_string(used_memory_ >> 20) +
                 " MiB, at or over --kv-store-max-mb: writes are skipped until it uses less");
    return used_memory_ < opts_.max_bytes;
  }

  // Pipelined SETs: every command of a batch sent, then every reply read.
  void write_batch(std::vector<WriteQueue::Item>& batch) {
    std::string error;
    redisContext* c = writes_.get(&error);
    if (!c) {
      if (!error.empty()) fail("write: " + error);
      return dropped(batch.size());
    }
    if (!under_max_bytes()) return dropped(batch.size());
    if (!send_sets(c->fd, batch, &error)) {
      fail("write: " + writes_.where() + ": " + error);
      writes_.broken();
      return dropped(batch.size());
    }
    size_t done = 0;
    uint64_t bytes = 0, written = 0, refused = 0;
    std::string refusal;
    for (; done < batch.size(); ++done) {
      void* raw = nullptr;
      if (redisGetReply(c, &raw) != REDIS_OK) break;
      Reply r(static_cast<redisReply*>(raw));
      if (r->type == REDIS_REPLY_ERROR) {  // e.g. OOM under maxmemory with noeviction
        ++refused;
        refusal.assign(r->str, r->len);
      } else {
        ++written;
        bytes += batch[done].value.size();
      }
    }
    count([&](KVStoreStats& s) {
      s.writes += written;
      s.bytes_out += bytes;
      s.dropped_writes += refused + (batch.size() - done);
      s.errors += refused > 0 ? 1 : 0;
    });
    if (refused > 0) log_->warn("write: Redis at " + writes_.where() + " refused " + std::to_string(refused) + " SET: " + refusal);
    if (done < batch.size()) {
      fail("write: " + writes_.io_error());
      writes_.broken();
    }
  }

  // The batch's SET commands (RESP), written with writev straight from the values' parts (a block
  // value's body is the pool's blocks themselves): through hiredis's output buffer each value was
  // copied once more, into a buffer grown and freed again for every batch (2,000 puts of 256 KiB:
  // the writer's CPU 0.07-0.16 s, 0.05-0.06 s without). The socket is blocking with the store's
  // timeout (hiredis set it). False with *error on a failure or a timeout.
  bool send_sets(int fd, const std::vector<WriteQueue::Item>& batch, std::string* error) {
    const std::string ttl = std::to_string(opts_.ttl_s);
    std::vector<std::string> heads, tails;
    heads.reserve(batch.size());
    tails.reserve(batch.size());
    std::vector<iovec> iov;
    size_t parts = 0;
    for (const WriteQueue::Item& item : batch) parts += 4 + item.value.body.size();
    iov.reserve(parts);
    auto length = [](std::string& out, size_t n) {
      out += '$';
      out += std::to_string(n);
      out += "\r\n";
    };
    auto bulk = [&](std::string& out, std::string_view arg) {
      length(out, arg.size());
      out += arg;
      out += "\r\n";
    };
    for (const WriteQueue::Item& item : batch) {
      const std::string& k = item.key;
      const StoreValue& v = item.value;
      std::string& head = heads.emplace_back(opts_.ttl_s > 0 ? "*5\r\n" : "*3\r\n");
      bulk(head, "SET");
      bulk(head, k);
      length(head, v.size());  // the value's parts are the next iovecs
      std::string& tail = tails.emplace_back("\r\n");
      if (opts_.ttl_s > 0) {
        bulk(tail, "EX");
        bulk(tail, ttl);
      }
      iov.push_back({head.data(), head.size()});
      v.each_part([&](std::string_view p) { iov.push_back({const_cast<char*>(p.data()), p.size()}); });
      iov.push_back({tail.data(), tail.size()});
    }
    for (size_t at = 0; at < iov.size();) {
      const ssize_t n = ::writev(fd, iov.data() + at, int(std::min<size_t>(iov.size() - at, IOV_MAX)));
      if (n < 0) {
        if (errno == EINTR) continue;
        *error = errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : std::strerror(errno);
        return false;
      }
      // Past what was written (a blocking socket writes everything but on a timeout or a signal).
      for (size_t left = size_t(n); at < iov.size() && (left > 0 || iov[at].iov_len == 0);) {
        const size_t step = std::min(left, iov[at].iov_len);
        iov[at].iov_base = static_cast<char*>(iov[at].iov_base) + step;
        iov[at].iov_len -= step;
        left -= step;
        if (iov[at].iov_len == 0) ++at;
      }
    }
    return true;
  }

  void write_loop() override {
    constexpr size_t kBatch = 32;  // SETs per pipeline round (bounds the replies awaited and the iovecs)
    std::vector<WriteQueue::Item> batch;
    while (take(batch, kBatch)) write_batch(batch);  // false: stopping, everything attempted
  }

  RedisStoreOptions opts_;
  std::string url_;
  std::mutex read_mu_;  // the lookup connection (one caller at a time)
  Connection reads_;
  LookupReply reply_;   // the lookup under way
  Connection writes_;   // the writer thread's
  RateLimitedLog own_log_;
  RateLimitedLog* log_;

  // The writer thread's.
  Clock::time_point memory_checked_{};
  uint64_t used_memory_ = 0;
};

}  // namespace

std::unique_ptr<KVStore> open_redis_store(const RedisStoreOptions& opts, RateLimitedLog* log) {
  RedisAddress addr = parse_redis_url(opts.url);
  if (opts.timeout_ms < 1) throw UsageError("--kv-store-timeout-ms: must be at least 1");
  return std::make_unique<RedisStore>(opts, std::move(addr), log);
}

}  // namespace ptllm::store
