#pragma once
// Continuous batching over one shared KV pool (vLLM v1's scheduler is the model): requests wait in
// a FIFO queue; one thread steps every running sequence together. Each step is one batched forward
// (Session::feed_batch) holding one decode token of every decoding sequence and at most one chunk of
// a prompt still being prefilled, so a long new prompt does not freeze the others' streams. A request
// joins at a step boundary when a slot (--parallel) is free and the pool has room; a prompt's prefix
// already in the pool (a shared system prompt, a resent conversation) is adopted, not computed.
// When the pool runs out mid-generation the youngest sequence is preempted: its blocks are given
// back and it waits at the head of the queue to be recomputed (its published blocks usually survive
// in the pool's cache, so that is mostly adoption). Plain structs only: HTTP lives in server/.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "engine/cache_reuse.h"
#include "engine/drafter_suffix.h"
#include "engine/generator.h"
#include "persist/kv_store.h"
#include "engine/session.h"
#include "engine/speculative.h"
#include "kv/manager.h"
#include "sample/sampler.h"

namespace ptllm {

class Runtime;

struct SchedulerConfig {
  SessionOptions session;       // every sequence's KV options (use_cache must be true)
  int parallel = 4;             // sequences running at once (-np)
  size_t kv_budget_bytes = 0;   // 0: room for `parallel` sequences of ctx_size tokens each
  int prefill_chunk = 256;      // most prompt tokens one step feeds
  std::vector<int32_t> eos_ids; // ids that end a reply (stop_token_ids)
  // A block store shared with other replicas (persist/kv_store.h), or null. A prompt's full blocks
  // missing from the pool after its local prefix are looked up there in one round trip and loaded
  // instead of computed; every full block a sequence computes is put there, in full precision, or
  // under KIVI as its quantized groups once the policy quantized it (BlockExchange::save_progress).
  KVStore* store = nullptr;
  Digest store_identity{};          // PromptCacheIdentity::config_key of this model and KV settings
  std::string store_prefix = "ptllm";  // the keys' first part (--kv-store-prefix)
  std::string store_flag = "--kv-store";  // the flag that gave the store, for errors
  // Bytes of KV blocks kept pinned for the prefixes requests mark (Request::pin_tokens: a chat's
  // system prompt and tools), so that other traffic never evicts them; 0: none. Pins give way,
  // least recently used first, before a request would wait or fail for room.
  size_t pin_bytes = 0;
  std::string pin_flag = "--kv-pin-mb";
  // Speculative decoding (engine/speculative.h): each decoding sequence drafts with its own drafter,
  // and its drafts are verified in the step's batched pass beside the other sequences' rows. With
  // spec.adaptive, the drafts a step takes are those that raise the measured tokens per second of
  // the whole step (none once the batch is wide enough that every row costs its full share).
  SpecOptions spec;
  // The suffix drafter's shared counts: the most reply tokens of finished requests kept (0: each
  // sequence drafts from its own history alone).
  size_t spec_suffix_cache = 16384;
  // A draft model (spec.type Draft) drafts for every speculating sequence of a step at once: one
  // batched forward of the draft model per draft position (engine/drafter_model.h draft_batched);
  // false: one sequence after another.
  bool spec_draft_batch = true;
};

// What an API reports: the generator's StopReason (engine/generator.h) in four classes.
enum class FinishReason { Stop, Length, Cancelled, Error };
// "stop", "length", "cancelled", "error".
const char* finish_reason_name(FinishReason r);
// Eos, StopString: Stop; TokenLimit, ContextFull: Length; Error: Error; the rest Cancelled.
FinishReason finish_reason_of(StopReason r);

struct GenerationParams {
  SamplingConfig sampling;       // temperature 0: greedy
  int max_tokens = 16;           // tokens to generate at most
  std::vector<std::string> stops;  // non-empty strings; the text ends where the first one begins
  bool ignore_eos = false;
  // Special tokens' text is kept in the reply (a tool-call format whose marker is a special token:
  // Mistral's [TOOL_CALLS], Llama 3's <|python_tag|>).
  bool keep_special = false;
  std::vector<std::pair<int32_t, float>> logit_bias;  // OpenAI's: added to the logits before sampling
  int top_logprobs = -1;  // -1: none; n >= 0: each token's log-probability with n alternatives
  std::shared_ptr<const ConstraintSpec> constraint;  // a grammar the reply follows
  // Speculation for this request (llama-server's speculative.n_max, .n_min): -1: the server's
  // SchedulerConfig::spec; draft_max 0: none.
  int spec_draft_max = -1, spec_draft_min = -1;
};

struct RequestResult {
  FinishReason reason = FinishReason::Length;
  StopReason stop_reason = StopReason::TokenLimit;  // the generator's own
  std::string text;              // everything streamed
  std::vector<int32_t> tokens;   // ids generated (a stopping EOS not included)
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;     // prompt tokens taken from the pool instead of computed
  int64_t store_tokens = 0;      // of those, tokens loaded from the block store (SchedulerConfig::store)
  int64_t shifted_tokens = 0;    // of those, tokens shifted from an earlier history (Request::cache_reuse)
  int64_t completion_tokens = 0; // ids sampled, a stopping EOS included
  std::string stop_string;       // the stop string met (reason Stop), else empty
  std::vector<TokenLogprob> logprobs;  // with params.top_logprobs >= 0: one per accepted token
  std::string error;             // reason Error: why
  bool speculative = false;      // the request could draft (the server's drafter, draft_max > 0)
  int64_t draft_n = 0;           // drafted tokens verified
  int64_t draft_accepted = 0;    // of them kept
};

struct Request {
  std::vector<int32_t> prompt;
  GenerationParams params;
  // Both called on the scheduler thread, so they must not block: on_text with each piece of text
  // safe to show (stop strings held back), on_done exactly once at the end, whatever the end.
  std::function<void(std::string_view text)> on_text;
  // With params.top_logprobs >= 0: each accepted token's log-probability, before its text.
  std::function<void(const TokenLogprob&)> on_logprob;
  std::function<void(const RequestResult&)> on_done;
  // Set by the client's side (a disconnect): the request ends at the next step, its blocks freed.
  std::shared_ptr<std::atomic<bool>> cancel;
  // The prompt's first tokens that many requests share and that should stay in the pool (a chat's
  // system prompt and tool definitions): pinned once computed (SchedulerConfig::pin_bytes).
  int64_t pin_tokens = 0;
  // What the prompt's tokens are kept for once cached (kv/block_pool.h Retention: a chat's system
  // prompt and tools, user turns, tool outputs and assistant turns), spans over the prompt; empty: the
  // whole prompt User. Generated tokens are Transient.
  std::vector<RetentionSpan> retention;
  // Reuse after an edit (engine/cache_reuse.h): past the prefix adopted exactly, runs of at least this
  // many tokens of a history the pool holds are shifted to their new positions instead of computed
  // (an approximation); 0: exact prefix reuse only. At least the block size (cache_reuse_error).
  int cache_reuse = 0;
};

// What /metrics shows; a snapshot the scheduler thread takes after each step.
struct SchedulerStats {
  uint64_t requests = 0, finished = 0, cancelled = 0, failed = 0, preempted = 0;
  uint64_t prompt_tokens = 0, cached_tokens = 0, prefill_tokens = 0, generated_tokens = 0;
  uint64_t shifted_tokens = 0;  // of cached_tokens, those shifted (Request::cache_reuse)
  double prefill_seconds = 0, decode_seconds = 0;  // forward passes, split by their token share
  uint64_t steps = 0;
  size_t queued = 0, running = 0;
  size_t blocks_total = 0, blocks_used = 0, blocks_cached = 0, blocks_shared = 0;
  size_t blocks_pinned = 0, pinned_prefixes = 0;  // held by pins (counted in blocks_used too)
  size_t blocks_cached_by[kRetentionClasses] = {};  // blocks_cached by retention class (Retention)
  // The block store (when SchedulerConfig::store is set): token blocks looked up and loaded (hits),
  // looked up and not loaded (misses; rejected: present but failing verification), the prompt tokens
  // they held, blocks queued to be put; and the store's own transport counters.
  // Speculative decoding: drafted tokens verified, kept, the sequences' verifications, and the
  // decoding sequences' steps taken without drafts although they had some (judged not to pay).
  uint64_t spec_drafted = 0, spec_accepted = 0, spec_verifications = 0, spec_declined = 0;
  // A draft model's forward passes, and the KV blocks its caches hold for the running sequences.
  uint64_t spec_draft_passes = 0;
  size_t spec_draft_blocks = 0;
  bool store = false;
  uint64_t store_hits = 0, store_misses = 0, store_rejected = 0, store_tokens = 0, store_puts = 0;
  KVStoreStats store_io;
};

class Scheduler {
 public:
  // Builds the shared pool (throws ptllm::Error / UsageError for a bad budget) and starts the thread.
  Scheduler(Runtime& rt, const SchedulerConfig& cfg);
  ~Scheduler();  // stop(), then joins
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request (FIFO). A prompt that is empty or does not fit the context ends at once with
  // FinishReason::Error (on_done called before submit returns); any request after stop() or drain()
  // ends at once as Cancelled.
  void submit(Request r);
  // Ends every request (queued: Cancelled; running: Cancelled) and stops the thread; idempotent.
  void stop();
  // Stops taking new requests (they end Cancelled, "the server is shutting down"); those already
  // submitted run to their end. Returns true when they have, false when `limit` passed first.
  bool drain(std::chrono::milliseconds limit = std::chrono::hours(24));

  SchedulerStats stats() const;
  const SchedulerConfig& config() const { return cfg_; }
  const KVPool& pool() const { return *pool_; }  // read it only while the scheduler is idle (tests)

 private:
  struct Slot;
  void loop();
  void admit();
  bool try_start(Slot& s);
  void adopt_at_turn(Slot& s);
  void reuse_after_edit(Slot& s);
  void remember_history(const Slot& s);
  int64_t adoption_grid(const Session& session) const;
  bool exact(const Slot& s, int64_t adopted) const;
  bool balanced(const Session& session) const;
  int64_t next_chunk(const Slot& s) const;
  size_t load_from_store(Slot& s, std::vector<int32_t>& held, size_t* local_blocks);
  void save_to_store(Slot& s, bool at_end = false);
  void pin_prefix(Slot& s);
  bool unpin_oldest();
  void step();
  bool build_batch(std::vector<Slot*>& batch, std::vector<std::span<const int32_t>>& feeds);
  bool fits(const std::vector<Slot*>& batch, const std::vector<std::span<const int32_t>>& feeds) const;
  void preempt_youngest();
  void after_step(Slot& s);
  void sample_next(Slot& s);
  void take(Slot& s, Generator::Step& step);
  void plan_drafts(const std::vector<Slot*>& batch, std::vector<std::span<const int32_t>>& feeds);
  void draft_with_models(const std::vector<Slot*>& batch);
  void verify_drafts(Slot& s);
  void finish(Slot& s, FinishReason r, std::string error = {});
  void reap();
  void publish_stats();
  std::string fit_error(const Request& r) const;

  Runtime& rt_;
  SchedulerConfig cfg_;
  std::unique_ptr<KVPool> pool_;
  std::unique_ptr<KVManager> kv_;  // the room the pool has, in its own terms
  std::unique_ptr<BlockExchange> exchange_;  // with a store
  ForwardState state_;  // the batch's activations, reused every step
  std::vector<float> logits_;  // [vocab] a copy the sampler may modify
  // Speculation: the CPU seconds of a step of T rows (its pass, drafting, verifications and samples;
  // an average per width), a verification's steps.
  PassCosts step_costs_;
  std::vector<Generator::Step> spec_steps_;
  ForwardState draft_state_;  // the draft model's activations for batched drafting
  std::unique_ptr<SuffixCache> suffix_cache_;  // recent replies, for every suffix drafter (or null)

  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<std::unique_ptr<Slot>> queue_;  // waiting, FIFO (a preempted one at the front); under mu_
  bool stopping_ = false, draining_ = false;  // under mu_
  size_t live_requests_ = 0;                  // submitted and not yet ended; under mu_
  SchedulerStats stats_;                      // under mu_ (the published snapshot)

  // Owned by the scheduler thread.
  std::vector<std::unique_ptr<Slot>> running_;
  SchedulerStats live_;
  uint64_t admitted_ = 0;
  // Pinned prefixes: each holds a reference on its blocks; the scheduler thread's.
  struct Pin {
    BlockHash last;  // the chained hash of its last block: the whole prefix
    size_t blocks = 0;
    std::vector<int32_t> held;
    size_t bytes = 0;
    uint64_t used = 0;  // the admission order of its last user
  };
  std::vector<Pin> pins_;
  size_t pinned_bytes_ = 0;
  // Prefixes one request has marked so far (its last block's hash and block count), most recent last:
  // a prefix is pinned when a second request marks it, so one-off prompts take no pin budget.
  std::deque<std::pair<BlockHash, size_t>> pin_candidates_;
  // Recent histories (most recent last), the sources of reuse after an edit; the scheduler thread's.
  std::deque<CachedHistory> histories_;
  uint64_t shift_salt_ = 0;  // the last salt given to a shifted sequence
  std::thread thread_;
};

}  // namespace ptllm
