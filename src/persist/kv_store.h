#pragma once
// Token blocks shared across processes through a key-value store (LMCache's and SGLang
// HiCache's design: chunks keyed by a chained prefix hash, values in Redis). One replica computes a
// prompt's full blocks and puts them; another, missing them in its own pool, looks them up and loads
// them instead of computing them.
//
// The store is a cache that never changes an output: a value is used only when its header, format
// version, identity (the prompt cache's: model, tokenizer, binary, every KV setting), block hash,
// token ids, length and checksum (XXH3-64) all verify; anything else is a miss. A store that is down or
// slow is a miss too (the implementation logs a warning and counts an error), never an error to a
// client. The implementation (store/redis_store.h) lives above the engine; the engine sees this
// interface only.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/sha256.h"
#include "kv/kv_cache.h"

namespace ptllm {

// What a store's transport did (the engine counts hits and misses itself: SchedulerStats).
struct KVStoreStats {
  uint64_t lookups = 0;          // lookup() calls that reached the store (one round trip each)
  uint64_t keys_looked_up = 0;
  double lookup_seconds = 0;     // their time, summed, less the time their values' callers took
  uint64_t bytes_in = 0;         // value bytes received
  uint64_t bytes_out = 0;        // value bytes written
  uint64_t writes = 0;           // values written
  uint64_t dropped_writes = 0;   // puts not written: the queue was full, the store down or over its size
  uint64_t errors = 0;           // failed connections, timeouts, error replies
};

// A value to put: `head`, then the parts of `body`, then `tail`, written one after another. The head
// and tail are the value's own; the body is memory its putter keeps unchanged while `pin` lives (a
// block value is sent straight from the pool's blocks: BlockExchange::save), and a store drops the
// pin as soon as it reads the body no more.
struct StoreValue {
  struct Pin {
    virtual ~Pin() = default;
  };
  StoreValue() = default;
  StoreValue(std::string whole) : head(std::move(whole)) {}  // NOLINT(google-explicit-constructor)
  std::string head;
  std::vector<std::string_view> body;
  std::string tail;
  std::unique_ptr<Pin> pin;

  size_t size() const;
  // f(part) for the head, each part of the body and the tail, in order.
  template <class F>
  void each_part(F&& f) const {
    f(std::string_view(head));
    for (std::string_view p : body) f(p);
    f(std::string_view(tail));
  }
  std::string flatten() const;  // the value's bytes in one string
};

class KVStore {
 public:
  virtual ~KVStore() = default;
  // A value as it arrives: keys[i]'s, or nullopt where it is absent; the view is valid during the
  // call only. Returns false to be handed no more (the rest of the answer is still read).
  using OnValue = std::function<bool(size_t i, std::optional<std::string_view> value)>;
  // Looks up `keys` in one round trip and hands their values to on_value in key order as they
  // arrive, each at most once: a lookup of megabytes is verified and loaded while the rest is still
  // on the wire, straight from the store's read buffer. An absent key is handed as nullopt and the
  // lookup goes on while on_value asks for more (under KIVI a block has two keys, either may be
  // absent). The keys not handed are misses: a store that is unreachable, slow (its read timeout)
  // or answering errors hands none after the failure. Throws only what on_value throws. One caller
  // at a time.
  virtual void lookup(std::span<const std::string> keys, const OnValue& on_value) = 0;
  // The values of `keys`, copied: values[i] for keys[i], nullopt where not handed (tests, tools).
  std::vector<std::optional<std::string>> get(std::span<const std::string> keys);
  // What a store's writer does to a value just before writing it, off the thread that put it
  // (BlockExchange: the checksum in its last 8 bytes); it must not change the value's size.
  using Finish = void (*)(StoreValue& value);
  // Queues a write and returns at once (never blocks a scheduler step): dropped and counted when the
  // queue is full. `finish`, when given, runs on the value before it is written (or, for a store
  // without a writer thread, before put returns). The value's pin is dropped once the store reads
  // its body no more (written, dropped or failed), on the writer's thread or in put. Never throws.
  virtual void put(std::string key, StoreValue value, Finish finish) = 0;
  void put(std::string key, std::string value) { put(std::move(key), StoreValue(std::move(value)), nullptr); }
  // Waits until every queued write was attempted, at most `limit`; true when it was.
  virtual bool flush(std::chrono::milliseconds limit) = 0;
  virtual KVStoreStats stats() const = 0;
  // "redis://127.0.0.1:6379/0": for the log.
  virtual std::string describe() const = 0;
};

// Warnings of a failing store, at most one per `every` (the rest counted and said with the next);
// thread-safe. Writes "warning: kv store: MESSAGE" to stderr, or to `sink` when given (tests).
class RateLimitedLog {
 public:
  explicit RateLimitedLog(std::chrono::milliseconds every = std::chrono::seconds(10)) : every_(every) {}
  void warn(const std::string& message);
  std::function<void(const std::string&)> sink;

 private:
  std::chrono::milliseconds every_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_{};
  bool any_ = false;
  uint64_t suppressed_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Keys and values.
//
// Key: NAME ":" hex(first 16 bytes of the identity) ":" hex(block hash, hi then lo), and ":q" after
// it for a block's quantized form (KIVI): two replicas of different builds or settings never read
// each other's blocks, and a block's two forms live side by side.
// Value (little-endian):
//   "PTLLMKVB"  u32 version  u32 header_bytes (80)  identity[32]  u64 hash_lo  u64 hash_hi
//   u32 n_ids  u8 precision  u8 form  u16 0  u64 payload_bytes                  (header, 80 bytes)
//   i32 ids[n_ids]  payload[payload_bytes]  u64 XXH3-64 (core/checksum.h) over every byte before it
// precision: the pool's KVPrecision (0 fp32, 1 fp16, 2 bf16, 3 int8, 4 int4, 5 int2); form: 0 for the
// full-precision block of every storing layer as KVPool::read_block gives it (the prompt-cache
// file's layout), 1 for every storing layer's KIVI group as the policy stored it (codes, scales and
// zeros). n_ids is the block's token count: B, or less for StreamingLLM's last sink block.
// Version 3 adds precision and form (version 2 carried full precision only, version 1 an XXH64:
// their values are misses).
inline constexpr uint32_t kKVStoreVersion = 3;

// What a value holds: the pool's precision and the block's form.
struct BlockForm {
  KVPrecision precision = KVPrecision::F32;
  bool quantized = false;  // the KIVI groups (precision is then int8, int4 or int2)
};

std::string kv_store_key(std::string_view prefix, const Digest& identity, const BlockHash& h, bool quantized = false);
std::string encode_block_value(const Digest& identity, const BlockHash& h, std::span<const int32_t> ids,
                               std::string_view payload, BlockForm form = {});
// The payload of `value` when it verifies against everything expected (identity, block hash, token
// ids, precision and form, payload size, checksum); nullopt otherwise, with the reason in *why when
// given.
std::optional<std::string_view> decode_block_value(std::string_view value, const Digest& identity, const BlockHash& h,
                                                   std::span<const int32_t> ids, size_t payload_bytes,
                                                   std::string* why = nullptr, BlockForm form = {});

// What a value says of itself once its magic, version, size and checksum verify (the `cache`
// command's view of a block file). Throws ptllm::Error saying what is wrong.
struct BlockValueInfo {
  uint32_t version = kKVStoreVersion;
  Digest identity{};
  BlockHash hash;
  std::vector<int32_t> ids;
  BlockForm form;
  uint64_t payload_bytes = 0;
};
BlockValueInfo read_block_value(std::string_view value);

// The engine's side of a store: a shared pool's token blocks to keys and values and back.
class BlockExchange {
 public:
  // identity: PromptCacheIdentity::config_key of the pool's model, tokenizer and KV settings.
  BlockExchange(KVStore& store, Digest identity, std::string prefix);

  struct Lookup {
    size_t looked_up = 0;        // keys asked for (0: no round trip)
    size_t hits = 0;             // blocks loaded into the pool
    size_t rejected = 0;         // values present that did not verify
  };
  // Loads token blocks first..n-1 of `tokens` (KVPool::token_block; hashes: their chained hashes, at
  // least n) into `pool` from the store in one round trip: the consecutive run of blocks from `first`
  // with a verified value, as far as the pool has more than `reserve` free blocks. Under KIVI both
  // forms of each block are asked for: a stream block comes in as its quantized groups where the
  // store has them (in full precision where not), and the last blocks of the run in full precision
  // too, where the adopting sequence's residual keeps them so. Each loaded block is published and
  // held (appended to `held`, released by the caller with KVPool::release_held once adopted).
  Lookup load(KVPool& pool, std::span<const int32_t> tokens, std::span<const BlockHash> hashes, size_t first,
              size_t n, size_t reserve, std::vector<int32_t>& held);
  // Puts token blocks first..n-1 of `tokens` that the pool holds in the given form (queued: returns
  // at once). Returns the blocks queued. A value is sent from the pool's blocks themselves, held (pinned)
  // until the store has sent them and reclaim() gives them back; a quarter of the pool at most is
  // pinned, the rest (and a short sink block, whose slots past its tokens go out as zeros) copied.
  size_t save(KVPool& pool, std::span<const int32_t> tokens, std::span<const BlockHash> hashes, size_t first,
              size_t n, bool quantized = false);
  // A sequence's blocks as its policy leaves them: what a scheduler calls after each step of a
  // sequence (at_end: before the sequence lets go of its blocks). Without KIVI every full block goes
  // in full precision once computed. Under KIVI the sink blocks go so, a stream block goes as its
  // quantized groups once the policy quantized it in every layer (never in full precision first: an
  // int4 history moves int4 bytes), and at_end the blocks still in full precision go as they are,
  // with the last residual_tail() blocks' full-precision forms while the pool holds them (the
  // residual a later turn's adoption keeps so). *saved: the blocks from the first already
  // put or taken from elsewhere, advanced. Returns the blocks queued.
  size_t save_progress(KVPool& pool, std::span<const int32_t> tokens, std::span<const BlockHash> hashes,
                       size_t* saved, size_t n, bool at_end);
  // Gives `pool` back the blocks whose values the store sent (or dropped): on the pool's thread, as
  // load() and save() do themselves. Returns the blocks given back.
  size_t reclaim(KVPool& pool);
  // reclaim() once every pinned block is let go, waiting at most `limit` for the store to send them
  // (none pinned: no wait).
  size_t reclaim_pinned(KVPool& pool, std::chrono::milliseconds limit);
  // True when reclaim() has blocks to give back (takes no lock). notify, when set, is called each
  // time blocks become so (on the store's writer thread, or in save), under the exchange's own lock:
  // it may take a lock of the caller's (the scheduler wakes to reclaim them) if no caller holding
  // that lock calls into the exchange other than has_returns.
  bool has_returns() const;
  void on_returns(std::function<void()> notify);
  // Waits for the store to let go of every pinned block (the pool they are in must outlive this).
  ~BlockExchange();
  BlockExchange(const BlockExchange&) = delete;
  BlockExchange& operator=(const BlockExchange&) = delete;

  // Under KIVI, the blocks at the end of a history a later adoption may want in full precision: its
  // residual's and the prefill grid's.
  static size_t residual_tail(const KVPool& pool);

  KVStore& store() { return store_; }
  const KVStore& store() const { return store_; }

 private:
  struct Pins;
  class BlockPin;
  // True once the store has let go of every pinned block, waiting at most `limit`.
  bool all_let_go(std::chrono::milliseconds limit);
  KVStore& store_;
  Digest identity_;
  std::string prefix_;
  RateLimitedLog log_;
  std::shared_ptr<Pins> pins_;  // shared with each value's pin, which may outlive a put
  KVPool* pinned_pool_ = nullptr;  // the pool save() pinned blocks of
  size_t pinned_ = 0;  // blocks pinned and not yet reclaimed: the pool's thread's (save, reclaim)
};

}  // namespace ptllm
