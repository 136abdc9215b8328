#include "persist/kv_store.h"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>

#include "core/bytes.h"
#include "core/checksum.h"
#include "core/error.h"
#include "kv/kv_cache.h"

namespace ptllm {

namespace {
constexpr char kMagic[8] = {'P', 'T', 'L', 'L', 'M', 'K', 'V', 'B'};
constexpr uint32_t kHeaderBytes = 80;

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace

void RateLimitedLog::warn(const std::string& message) {
  std::string line;
  {
    std::lock_guard lk(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (any_ && now - last_ < every_) {
      ++suppressed_;
      return;
    }
    line = "warning: kv store: " + message;
    if (suppressed_ > 0) line += " (" + std::to_string(suppressed_) + " more warnings since the last one)";
    suppressed_ = 0;
    last_ = now;
    any_ = true;
  }
  if (sink) {
    sink(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  }
}

size_t StoreValue::size() const {
  size_t n = 0;
  each_part([&](std::string_view p) { n += p.size(); });
  return n;
}

std::string StoreValue::flatten() const {
  std::string out;
  out.reserve(size());
  each_part([&](std::string_view p) { out += p; });
  return out;
}

std::vector<std::optional<std::string>> KVStore::get(std::span<const std::string> keys) {
  std::vector<std::optional<std::string>> out(keys.size());
  lookup(keys, [&](size_t i, std::optional<std::string_view> v) {
    if (v) out[i].emplace(*v);
    return true;
  });
  return out;
}

std::string kv_store_key(std::string_view prefix, const Digest& identity, const BlockHash& h, bool quantized) {
  std::string k(prefix);
  k += ':';
  k += to_hex(std::span<const uint8_t>(identity.data(), 16));
  k += ':';
  k += hex64(h.hi);
  k += hex64(h.lo);
  if (quantized) k += ":q";
  return k;
}

namespace {
// A value up to its payload (which follows, then the checksum's 8 bytes: seal_value), in `out`, with
// room reserved for `more` bytes after it.
void value_head(std::string& out, const Digest& identity, const BlockHash& h, std::span<const int32_t> ids,
                size_t payload_bytes, size_t more, BlockForm form) {
  out.clear();
  out.reserve(kHeaderBytes + ids.size_bytes() + more);
  out.append(kMagic, sizeof kMagic);
  put_bytes<uint32_t>(out, kKVStoreVersion);
  put_bytes<uint32_t>(out, kHeaderBytes);
  out.append(reinterpret_cast<const char*>(identity.data()), identity.size());
  put_bytes<uint64_t>(out, h.lo);
  put_bytes<uint64_t>(out, h.hi);
  put_bytes<uint32_t>(out, uint32_t(ids.size()));
  put_bytes<uint8_t>(out, uint8_t(form.precision));
  put_bytes<uint8_t>(out, form.quantized ? 1 : 0);
  put_bytes<uint16_t>(out, 0);
  put_bytes<uint64_t>(out, uint64_t(payload_bytes));
  out.append(reinterpret_cast<const char*>(ids.data()), ids.size_bytes());
}
// Fills a value's last 8 bytes (its tail's) with the checksum of every byte before them.
void seal_value(StoreValue& v) {
  PTLLM_CHECK(v.tail.size() >= 8);
  Checksum64 sum;
  sum.update(v.head.data(), v.head.size());
  for (std::string_view p : v.body) sum.update(p.data(), p.size());
  sum.update(v.tail.data(), v.tail.size() - 8);
  const uint64_t d = sum.digest();
  std::memcpy(v.tail.data() + v.tail.size() - 8, &d, 8);
}
}  // namespace

std::string encode_block_value(const Digest& identity, const BlockHash& h, std::span<const int32_t> ids,
                               std::string_view payload, BlockForm form) {
  StoreValue v;
  value_head(v.head, identity, h, ids, payload.size(), payload.size() + 8, form);
  v.head.append(payload);
  v.tail.assign(8, '\0');
  seal_value(v);
  v.head += v.tail;
  return std::move(v.head);
}

std::optional<std::string_view> decode_block_value(std::string_view value, const Digest& identity, const BlockHash& h,
                                                   std::span<const int32_t> ids, size_t payload_bytes,
                                                   std::string* why, BlockForm form) {
  auto no = [&](const char* reason) -> std::optional<std::string_view> {
    if (why) *why = reason;
    return std::nullopt;
  };
  const size_t expect = kHeaderBytes + ids.size_bytes() + payload_bytes + 8;
  if (value.size() < kHeaderBytes + 8 || std::memcmp(value.data(), kMagic, sizeof kMagic) != 0)
    return no("not a block value of posttrainllm (magic)");
  ByteReader r(value, "kv store value");
  r.bytes(sizeof kMagic);
  if (r.get<uint32_t>() != kKVStoreVersion) return no("another format version");
  if (r.get<uint32_t>() != kHeaderBytes) return no("a header of another size");
  if (value.size() != expect) return no("a value of another size");
  // The checksum first: every field below is then what was written.
  uint64_t sum;
  std::memcpy(&sum, value.data() + value.size() - 8, 8);
  if (checksum64(value.data(), value.size() - 8) != sum) return no("a checksum mismatch (damaged value)");
  if (std::memcmp(r.bytes(identity.size()), identity.data(), identity.size()) != 0)
    return no("written for another model, tokenizer, build or KV configuration");
  const uint64_t lo = r.get<uint64_t>(), hi = r.get<uint64_t>();
  if (lo != h.lo || hi != h.hi) return no("another block's hash");
  if (r.get<uint32_t>() != ids.size()) return no("other block dimensions");
  if (r.get<uint8_t>() != uint8_t(form.precision)) return no("a block of another KV precision");
  if (r.get<uint8_t>() != (form.quantized ? 1 : 0)) return no("a block of another form (quantized or full precision)");
  if (r.get<uint16_t>() != 0 || r.get<uint64_t>() != payload_bytes) return no("other block dimensions");
  if (std::memcmp(r.bytes(ids.size_bytes()), ids.data(), ids.size_bytes()) != 0) return no("other token ids");
  return value.substr(r.pos(), payload_bytes);
}

BlockValueInfo read_block_value(std::string_view value) {
  if (value.size() < kHeaderBytes + 8 || std::memcmp(value.data(), kMagic, sizeof kMagic) != 0)
    throw Error("not a block value of posttrainllm (magic)");
  ByteReader r(value, "kv store value");
  r.bytes(sizeof kMagic);
  BlockValueInfo info;
  info.version = r.get<uint32_t>();
  if (info.version != kKVStoreVersion)
    throw Error("format version " + std::to_string(info.version) + ", this build reads version " +
                std::to_string(kKVStoreVersion));
  if (r.get<uint32_t>() != kHeaderBytes) throw Error("a header of another size");
  uint64_t sum;
  std::memcpy(&sum, value.data() + value.size() - 8, 8);
  if (checksum64(value.data(), value.size() - 8) != sum) throw Error("checksum mismatch (damaged value)");
  std::memcpy(info.identity.data(), r.bytes(info.identity.size()), info.identity.size());
  info.hash.lo = r.get<uint64_t>();
  info.hash.hi = r.get<uint64_t>();
  const uint32_t n = r.get<uint32_t>();
  const uint8_t precision = r.get<uint8_t>(), form = r.get<uint8_t>();
  if (precision > uint8_t(KVPrecision::Int2) || form > 1) throw Error("an unknown precision or form");
  info.form = {KVPrecision(precision), form == 1};
  r.get<uint16_t>();
  info.payload_bytes = r.get<uint64_t>();
  if (value.size() != kHeaderBytes + uint64_t(n) * 4 + info.payload_bytes + 8) throw Error("a value of another size");
  info.ids.resize(n);
  std::memcpy(info.ids.data(), r.bytes(size_t(n) * 4), size_t(n) * 4);
  return info;
}

// The pinned blocks the store has let go of, waiting for reclaim() (the pool is the scheduler's
// thread's alone).
struct BlockExchange::Pins {
  std::mutex mu;
  std::condition_variable let_go;
  std::vector<int32_t> returned;    // under mu
  std::atomic<bool> any_returned{false};  // !returned.empty(), for a caller that holds other locks
  std::function<void()> notify;     // set before any pin exists
};

// One value's blocks: handed to `returned` when the store drops the value's pin.
class BlockExchange::BlockPin final : public StoreValue::Pin {
 public:
  BlockPin(std::shared_ptr<Pins> pins, std::vector<int32_t> ids) : pins_(std::move(pins)), ids_(std::move(ids)) {}
  ~BlockPin() override {
    std::lock_guard lk(pins_->mu);
    pins_->returned.insert(pins_->returned.end(), ids_.begin(), ids_.end());
    pins_->any_returned = true;
    // Under the lock: ~BlockExchange, waiting on it, never returns while a pin still calls notify.
    if (pins_->notify) pins_->notify();
    pins_->let_go.notify_all();
  }

 private:
  std::shared_ptr<Pins> pins_;
  std::vector<int32_t> ids_;
};

BlockExchange::BlockExchange(KVStore& store, Digest identity, std::string prefix)
    : store_(store), identity_(identity), prefix_(std::move(prefix)), pins_(std::make_shared<Pins>()) {}

BlockExchange::~BlockExchange() {
  if (!pinned_pool_) return;
  // The store's writer may still read pinned blocks: the pool must not take them back before it is
  // done (each write attempted ends within the store's timeout).
  if (!all_let_go(std::chrono::milliseconds(0))) {
    store_.flush(std::chrono::seconds(60));
    while (!all_let_go(std::chrono::seconds(1))) {
    }
  }
  reclaim(*pinned_pool_);
}

bool BlockExchange::all_let_go(std::chrono::milliseconds limit) {
  std::unique_lock lk(pins_->mu);
  return pins_->let_go.wait_for(lk, limit, [&] { return pins_->returned.size() == pinned_; });
}

size_t BlockExchange::reclaim(KVPool& pool) {
  std::vector<int32_t> ids;
  {
    std::lock_guard lk(pins_->mu);
    ids.swap(pins_->returned);
    pins_->any_returned = false;
  }
  const size_t n = ids.size();
  pinned_ -= n;
  if (n > 0) pool.release_held(ids);  // clears ids
  return n;
}

size_t BlockExchange::reclaim_pinned(KVPool& pool, std::chrono::milliseconds limit) {
  all_let_go(limit);
  return reclaim(pool);
}

bool BlockExchange::has_returns() const { return pins_->any_returned; }

void BlockExchange::on_returns(std::function<void()> notify) {
  PTLLM_CHECK(pinned_ == 0);
  std::lock_guard lk(pins_->mu);
  pins_->notify = std::move(notify);
}

BlockExchange::Lookup BlockExchange::load(KVPool& pool, std::span<const int32_t> tokens,
                                          std::span<const BlockHash> hashes, size_t first, size_t n, size_t reserve,
                                          std::vector<int32_t>& held) {
  Lookup out;
  PTLLM_CHECK(n <= hashes.size() && pool.complete_blocks(int64_t(tokens.size())) >= n);
  if (first >= n || !pool.exchangeable()) return out;
  reclaim(pool);
  const bool kivi = pool.has_quantized_form();
  const BlockForm dense_form{pool.config().precision, false}, quant_form{pool.config().precision, true};
  // Blocks beyond what the pool can take are not asked for: each takes one block per storing layer,
  // of the full-precision pool or (a quantized form) of the KIVI one.
  const size_t layers = pool.exchange_bytes() / pool.dense().block_bytes();
  const size_t avail = pool.dense().available();
  const size_t dense_room = avail > reserve ? (avail - reserve) / layers : 0;
  const size_t quant_room = kivi ? pool.quant().available() / layers : 0;
  n = std::min(n, first + dense_room + quant_room);
  if (first >= n) return out;
  auto ids_of = [&](size_t j) {
    const KVPool::TokenRange tb = pool.token_block(j);
    return tokens.subspan(size_t(tb.start), size_t(tb.len));
  };
  // Without KIVI one key a block; under it two, its quantized form then its full-precision one.
  const size_t per = kivi ? 2 : 1;
  std::vector<std::string> keys;
  for (size_t j = first; j < n; ++j) {
    if (kivi) keys.push_back(kv_store_key(prefix_, identity_, hashes[j], true));
    keys.push_back(kv_store_key(prefix_, identity_, hashes[j]));
  }
  out.looked_up = n - first;
  // The adopting sequence keeps its last residual in full precision: the full-precision forms of
  // the blocks at the run's end are kept aside to be loaded as well.
  const size_t tail = kivi ? residual_tail(pool) : 0;
  std::vector<std::pair<size_t, std::string>> aside;  // (block, full-precision payload), the last `tail`
  size_t dense_taken = 0;
  bool got_quant = false, got = false;  // the current block's forms loaded
  auto verify = [&](size_t i, std::string_view v, size_t j, BlockForm form) -> std::optional<std::string_view> {
    std::string why;
    const auto payload = decode_block_value(v, identity_, hashes[j], ids_of(j), pool.exchange_bytes(form.quantized), &why, form);
    if (!payload) {
      ++out.rejected;
      log_.warn("ignoring the value of " + keys[i] + ": " + why);
    }
    return payload;
  };
  // Each value is verified and imported as it arrives; the run ends at the first block that has no
  // value that verifies and fits the pool.
  store_.lookup(keys, [&](size_t i, std::optional<std::string_view> v) {
    const size_t j = first + i / per;
    if (j != first + out.hits) return false;  // a block skipped: the run ends before it
    const bool quantized = kivi && i % 2 == 0;
    if (quantized) {
      got_quant = got = false;
      if (v)
        if (const auto payload = verify(i, *v, j, quant_form))
          got_quant = got = pool.import_block(hashes[j], ids_of(j), *payload, held, true);
      return true;
    }
    if (v) {
      if (const auto payload = verify(i, *v, j, dense_form)) {
        if (got_quant) {
          if (aside.size() == tail) aside.erase(aside.begin());
          if (tail > 0) aside.emplace_back(j, std::string(*payload));
        } else if (dense_taken < dense_room && pool.import_block(hashes[j], ids_of(j), *payload, held)) {
          ++dense_taken;
          got = true;
        }
      }
    }
    if (!got) return false;
    got = got_quant = false;
    ++out.hits;
    return true;
  });
  // From the run's end backwards: with room for fewer, the last blocks are the ones the residual keeps.
  for (auto it = aside.rbegin(); it != aside.rend(); ++it) {
    const auto& [j, payload] = *it;
    if (j + tail < first + out.hits || j >= first + out.hits) continue;
    if (dense_taken >= dense_room || !pool.import_block(hashes[j], ids_of(j), payload, held)) break;
    ++dense_taken;
  }
  return out;
}

size_t BlockExchange::save(KVPool& pool, std::span<const int32_t> tokens, std::span<const BlockHash> hashes,
                           size_t first, size_t n, bool quantized) {
  PTLLM_CHECK(n <= hashes.size() && pool.complete_blocks(int64_t(tokens.size())) >= n);
  PTLLM_CHECK(!pinned_pool_ || pinned_pool_ == &pool);
  const BlockForm form{pool.config().precision, quantized};
  const size_t bytes = pool.exchange_bytes(quantized);
  const size_t layers = pool.exchange_bytes() / pool.dense().block_bytes();
  const size_t most_pinned = (pool.dense().capacity() + pool.quant().capacity()) / 4;
  size_t queued = 0;
  for (size_t j = first; j < n; ++j) {
    const KVPool::TokenRange tb = pool.token_block(j);
    const auto ids = tokens.subspan(size_t(tb.start), size_t(tb.len));
    if (quantized && j < pool.sink_blocks()) continue;  // never quantized
    // The value's body is the pool's blocks themselves, pinned until the store has sent them: the
    // scheduler's thread writes the header only; the store's writer thread computes the checksum
    // (seal_value) and sends. A copy where pinning would hold too much of the pool.
    StoreValue v;
    std::vector<int32_t> held;
    const bool pinned = pinned_ + layers <= most_pinned && pool.view_block(hashes[j], ids, held, v.body, quantized);
    value_head(v.head, identity_, hashes[j], ids, bytes, pinned ? 0 : bytes, form);
    if (pinned) {
      pinned_ += layers;
      pinned_pool_ = &pool;
      v.pin = std::make_unique<BlockPin>(pins_, std::move(held));
    } else if (!pool.read_block(hashes[j], ids, v.head, quantized)) {
      continue;
    }
    v.tail.assign(8, '\0');
    store_.put(kv_store_key(prefix_, identity_, hashes[j], quantized), std::move(v), seal_value);
    ++queued;
  }
  reclaim(pool);  // the pins a put dropped at once (a full queue, a store without a writer)
  return queued;
}

size_t BlockExchange::save_progress(KVPool& pool, std::span<const int32_t> tokens, std::span<const BlockHash> hashes,
                                    size_t* saved, size_t n, bool at_end) {
  if (n <= *saved) return 0;
  if (!pool.has_quantized_form()) {
    const size_t q = save(pool, tokens, hashes, *saved, n);
    *saved = n;
    return q;
  }
  size_t q = 0;
  if (*saved < pool.sink_blocks()) {  // sink blocks stay in full precision
    const size_t m = std::min(n, pool.sink_blocks());
    q += save(pool, tokens, hashes, *saved, m);
    *saved = m;
  }
  if (*saved < n) {
    // A block whose group no layer holds yet (or no more: a window evicted it and the pool reused
    // it) stops the run here; the next call tries it again.
    std::vector<int32_t> held;
    size_t ready = *saved;
    while (ready < n) {
      const KVPool::TokenRange tb = pool.token_block(ready);
      if (!pool.hold_block(hashes[ready], tokens.subspan(size_t(tb.start), size_t(tb.len)), held, true)) break;
      pool.release_held(held);
      ++ready;
    }
    if (ready > *saved) q += save(pool, tokens, hashes, *saved, ready, true);
    *saved = ready;
  }
  // The blocks still in full precision, and the last ones in that form too while the pool holds it:
  // a later turn's adoption ends on the prefill grid and keeps its residual in full precision.
  if (at_end) {
    const size_t from = std::max(pool.sink_blocks(), std::min(*saved, n > residual_tail(pool) ? n - residual_tail(pool) : 0));
    if (from < n) q += save(pool, tokens, hashes, from, n);
  }
  return q;
}

size_t BlockExchange::residual_tail(const KVPool& pool) {
  const size_t B = size_t(pool.config().group_size);
  return (size_t(pool.config().residual) + B - 1) / B + size_t(pool.policy_chunk()) / B;
}

}  // namespace ptllm
