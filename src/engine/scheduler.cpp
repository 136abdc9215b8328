#include "engine/scheduler.h"

#include "engine/drafter_model.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "core/error.h"
#include "engine/runtime.h"
#include "engine/generator.h"
#include "engine/stop_text.h"
#include "kernels/ops.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "";
}

namespace {

GeneratorOptions generator_options(const GenerationParams& p, const std::vector<int32_t>& eos) {
  GeneratorOptions o;
  o.sampling = p.sampling;
  o.stops = p.stops;
  o.eos_ids = eos;
  o.ignore_eos = p.ignore_eos;
  o.max_tokens = p.max_tokens;
  o.keep_special = p.keep_special;
  o.logit_bias = p.logit_bias;
  o.top_logprobs = p.top_logprobs;
  o.constraint = p.constraint;
  return o;
}

}  // namespace

FinishReason finish_reason_of(StopReason r) {
  switch (r) {
    case StopReason::Eos:
    case StopReason::StopString:
    case StopReason::Grammar: return FinishReason::Stop;
    case StopReason::TokenLimit:
    case StopReason::ContextFull: return FinishReason::Length;
    case StopReason::Error: return FinishReason::Error;
    default: return FinishReason::Cancelled;
  }
}

// One request's life: queued (no session), running (a session on the pool), done.
struct Scheduler::Slot {
  Slot(Request r, const Tokenizer& tok, const std::vector<int32_t>& eos)
      : req(std::move(r)), seq(req.prompt), gen(tok, generator_options(req.params, eos)) {
    result.prompt_tokens = int64_t(req.prompt.size());
  }
  Request req;
  std::vector<int32_t> seq;  // the prompt, then every sampled id; the last one unfed while decoding
  std::unique_ptr<Session> session;  // null while queued (or preempted)
  Generator gen;  // sampling, EOS, detokenizer, stop strings, the token limit
  RequestResult result;
  uint64_t order = 0;     // admission order: the youngest is preempted first
  bool started = false;   // admitted once (prompt_tokens counts the first admission only)
  bool cached_counted = false;  // cached_tokens set (at the first adoption)
  bool pin_done = false;        // its pinned prefix taken care of (pin_prefix)
  int64_t gap_tokens = 0;       // prompt tokens computed between shifted runs (reuse_after_edit)
  std::vector<BlockHash> hashes;  // chained hashes of seq's first full blocks (with a store)
  size_t saved_blocks = 0;        // blocks of the history put to the store or taken from elsewhere
  bool done = false;
  // Speculation (null: none for this request): the drafter and its measured acceptance; this step's
  // drafts (the pending id then k drafts: fed), their class, and the steps they were declined in a row.
  std::unique_ptr<Speculator> spec;
  std::vector<int32_t> drafts, fed;
  int cls = 0, k = 0, skipped = 0;
  int deferred = 0;  // a draft model's drafts on offer this step, not drafted yet (plan_drafts)
  bool cancelled() const { return req.cancel && req.cancel->load(); }
  int64_t remaining() const { return int64_t(seq.size()) - session->position(); }
};

Scheduler::Scheduler(Runtime& rt, const SchedulerConfig& cfg) : rt_(rt), cfg_(cfg) {
  PTLLM_CHECK(cfg_.session.use_cache && cfg_.parallel >= 1 && cfg_.prefill_chunk >= 1);
  if (size_t(cfg_.parallel) >= kMaxBatchSequences)
    throw UsageError("--parallel: at most " + std::to_string(kMaxBatchSequences - 1) + " sequences");
  cfg_.session.kv.validate();
  pool_ = std::make_unique<KVPool>(rt_.model().kv_shape(), cfg_.session.kv, cfg_.parallel, cfg_.kv_budget_bytes);
  kv_ = std::make_unique<KVManager>(*pool_);
  const size_t pool_bytes = kv_->capacity_bytes();
  if (cfg_.pin_bytes > pool_bytes)
    throw UsageError(cfg_.pin_flag + ": " + std::to_string(cfg_.pin_bytes >> 20) + " MiB is more than the KV pool's " +
                     std::to_string(pool_bytes >> 20) + " MiB");
  if (cfg_.store) {
    PTLLM_CHECK(pool_->exchangeable());  // a shared pool is keyed
    // Under KIVI a prefix is adopted where it ends on the prefill grid (adoption_grid): a setting
    // where none ever does would put blocks and never use one.
    const KVCacheConfig& kv = cfg_.session.kv;
    if (is_kivi(kv.precision)) {
      const int grid = pool_->policy_chunk();
      const std::string setting = cfg_.store_flag + ": under " + kv.describe() + " a prefix is taken from the store ";
      if (cfg_.prefill_chunk < grid)
        throw UsageError(setting + "where it ends on the prefill grid of " + std::to_string(grid) +
                         " tokens; --prefill-chunk " + std::to_string(cfg_.prefill_chunk) + " is below it");
      const int sink = kv.streaming() ? kv.sink : 0;
      if (sink % std::gcd(kv.group_size, grid) != 0)
        throw UsageError(setting + "where it ends on the prefill grid of " + std::to_string(grid) +
                         " tokens, and with " + std::to_string(sink) + " sink tokens no block ends there (give "
                         "--streaming-llm-sink a multiple of " + std::to_string(std::gcd(kv.group_size, grid)) + ")");
    }
    exchange_ = std::make_unique<BlockExchange>(*cfg_.store, cfg_.store_identity, cfg_.store_prefix);
    // Blocks the store has sent wake the loop, which gives them back to the pool.
    exchange_->on_returns([this] {
      { std::lock_guard lk(mu_); }
      wake_.notify_all();
    });
  }
  if (cfg_.spec.type == SpecType::Suffix && cfg_.spec_suffix_cache > 0) {
    suffix_cache_ = std::make_unique<SuffixCache>(8, cfg_.spec_suffix_cache);
    cfg_.spec.suffix_cache = suffix_cache_.get();
  }
  publish_stats();
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  stop();
  exchange_.reset();  // waits for the store to let go of the pool's blocks, while the loop's lock lives
}

std::string Scheduler::fit_error(const Request& r) const {
  const KVCacheConfig& kv = cfg_.session.kv;
  if (r.prompt.empty()) return "the prompt is empty";
  if (!kv.streaming() && int64_t(r.prompt.size()) > kv.ctx_size)
    return "the prompt has " + std::to_string(r.prompt.size()) + " tokens, more than the context of " +
           std::to_string(kv.ctx_size) + " tokens (--ctx-size)";
  if (r.params.max_tokens < 1) return "max_tokens must be at least 1";
  for (const std::string& s : r.params.stops)
    if (s.empty()) return "a stop string is empty";
  return cache_reuse_error(r.cache_reuse, kv, "n_cache_reuse");
}

void Scheduler::submit(Request r) {
  std::string error = fit_error(r);
  FinishReason reason = FinishReason::Error;
  auto slot = std::make_unique<Slot>(std::move(r), rt_.tokenizer(), cfg_.eos_ids);
  if (error.empty() && cfg_.spec.type != SpecType::None) {
    SpecOptions o = cfg_.spec;
    const GenerationParams& p = slot->req.params;
    if (p.spec_draft_max >= 0) o.draft_max = p.spec_draft_max;
    if (p.spec_draft_min >= 0) o.draft_min = p.spec_draft_min;
    if (o.draft_min > o.draft_max && o.draft_max > 0)
      error = "speculative.n_min " + std::to_string(o.draft_min) + " is more than speculative.n_max " +
              std::to_string(o.draft_max);
    else if (o.draft_max > 0)
      slot->spec = std::make_unique<Speculator>(o);
    slot->result.speculative = slot->spec != nullptr;
  }
  {
    std::lock_guard lk(mu_);
    if (error.empty() && (stopping_ || draining_)) {
      error = "the server is shutting down";
      reason = FinishReason::Cancelled;
    }
    if (error.empty()) {
      ++live_requests_;
      ++stats_.requests;
      queue_.push_back(std::move(slot));
    }
  }
  if (!error.empty()) {
    slot->result.reason = reason;
    slot->result.error = error;
    if (slot->req.on_done) slot->req.on_done(slot->result);
    return;
  }
  wake_.notify_one();
}

void Scheduler::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Scheduler::drain(std::chrono::milliseconds limit) {
  std::unique_lock lk(mu_);
  draining_ = true;
  return idle_.wait_for(lk, limit, [&] { return live_requests_ == 0 || stopping_; });
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  {
    std::lock_guard lk(mu_);
    s = stats_;
    s.queued = queue_.size();
  }
  // The store's counters now: its writer thread goes on after the last step.
  if (exchange_) s.store_io = exchange_->store().stats();
  return s;
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock lk(mu_);
      wake_.wait(lk, [&] {
        return stopping_ || !queue_.empty() || !running_.empty() || (exchange_ && exchange_->has_returns());
      });
      if (stopping_) break;
    }
    if (exchange_) exchange_->reclaim(*pool_);
    reap();
    admit();
    if (!running_.empty()) step();
    reap();
    publish_stats();
  }
  // Stopping: whatever has not ended is cancelled (its blocks given back with its session).
  for (auto& s : running_) finish(*s, FinishReason::Cancelled);
  while (unpin_oldest()) {
  }
  std::deque<std::unique_ptr<Slot>> rest;
  {
    std::lock_guard lk(mu_);
    rest.swap(queue_);
  }
  for (auto& s : rest) finish(*s, FinishReason::Cancelled);
  running_.clear();
  publish_stats();
}

void Scheduler::admit() {
  while (running_.size() < size_t(cfg_.parallel)) {
    std::unique_ptr<Slot> s;
    {
      std::lock_guard lk(mu_);
      if (queue_.empty()) return;
      s = std::move(queue_.front());
      queue_.pop_front();
    }
    if (s->cancelled()) {
      finish(*s, FinishReason::Cancelled);
      continue;
    }
    bool started = try_start(*s);
    while (!started && unpin_oldest()) started = try_start(*s);  // pins give way first
    if (!started) {
      if (running_.empty()) {
        finish(*s, FinishReason::Error,
               "the KV pool cannot hold this prompt (" + std::to_string(s->seq.size()) + " tokens; raise --kv-budget-mb)");
        continue;
      }
      std::lock_guard lk(mu_);
      queue_.push_front(std::move(s));  // it keeps its place: first in line when room comes
      return;
    }
    s->order = ++admitted_;
    running_.push_back(std::move(s));
  }
}

// A session on the pool, kept if its first chunk fits beside one more block per layer for each
// running sequence (their next decode steps). The pool's prefix is adopted later, at its first
// chunk (adopt_at_turn).
bool Scheduler::try_start(Slot& s) {
  s.session = std::make_unique<Session>(rt_.model(), cfg_.session, rt_.pool(), pool_.get());
  s.session->set_retention(s.req.retention.empty()
                               ? std::vector<RetentionSpan>{{int64_t(s.req.prompt.size()), Retention::User}}
                               : s.req.retention);
  const int n = int(std::min<int64_t>({s.remaining(), cfg_.prefill_chunk, s.session->max_chunk()}));
  if (!kv_->can_append(s.session->cache(), n, kv_->decode_reserve(running_.size()))) {
    s.session.reset();
    return false;
  }
  if (!s.started) live_.prompt_tokens += uint64_t(s.seq.size());
  s.started = true;
  return true;
}

// Prompts are prefilled one at a time, oldest first, so by a prompt's first chunk every older one
// has published its blocks: requests arriving together over one system prompt compute it once.
// With a store, the blocks past the pool's own prefix are first loaded from it (held until adopted).
void Scheduler::adopt_at_turn(Slot& s) {
  std::vector<int32_t> held;
  size_t local = 0;
  const size_t loaded = exchange_ ? load_from_store(s, held, &local) : 0;
  const int64_t grid = adoption_grid(*s.session);
  // The session holds its own references then; the rest of `held` stay findable.
  const int64_t adopted =
      grid > 0 ? s.session->adopt_prefix(*kv_, s.seq, [&](int64_t a) { return exact(s, a); }, held) : 0;
  kv_->free(held);
  const size_t adopted_blocks = pool_->complete_blocks(adopted);
  s.saved_blocks = exchange_ ? kv_->final_form_blocks(s.seq, s.hashes, adopted_blocks) : adopted_blocks;
  const int64_t before = s.session->position();
  s.gap_tokens = 0;
  if (s.req.cache_reuse > 0) reuse_after_edit(s);
  if (s.cached_counted) return;  // a preempted sequence's return is not the client's cache hit
  const int64_t shifted = s.session->position() - before - s.gap_tokens;
  s.result.shifted_tokens = shifted;
  live_.shifted_tokens += uint64_t(shifted);
  s.result.cached_tokens = adopted + shifted;
  live_.cached_tokens += uint64_t(adopted + shifted);
  const size_t from_store = adopted_blocks > local ? std::min(adopted_blocks - local, loaded) : 0;
  if (from_store > 0) {
    const KVPool::TokenRange last = pool_->token_block(local + from_store - 1);
    const int64_t tokens = last.start + last.len - pool_->token_block(local).start;
    s.result.store_tokens = tokens;
    live_.store_tokens += uint64_t(tokens);
  }
  s.cached_counted = true;
}

// ---------------------------------------------------------------------------------------------
// Reuse after an edit (engine/cache_reuse.h). The source is the remembered history sharing the
// longest prefix with the prompt (the most recent on a tie), as llama.cpp's server picks a slot.

void Scheduler::reuse_after_edit(Slot& s) {
  if (histories_.empty() || s.remaining() <= 1) return;
  const CachedHistory* best = nullptr;
  int64_t best_common = -1;
  for (auto it = histories_.rbegin(); it != histories_.rend(); ++it) {
    const auto& t = it->tokens;
    const auto mm = std::mismatch(t.begin(), t.end(), s.seq.begin(), s.seq.end());
    const int64_t common = mm.first - t.begin();
    if (common > best_common) {
      best = &*it;
      best_common = common;
    }
  }
  const int64_t avail = kv_->complete_tokens(int64_t(best->tokens.size()));
  // Up to one prefill chunk of prompt tokens no run supplies (an inserted summary, a token merged at
  // the seam of a cut) is computed here, outside the batch, before the next run is shifted.
  const int64_t gap = std::min<int64_t>(cfg_.prefill_chunk, s.session->max_chunk());
  const std::vector<ReuseChunk> plan =
      plan_cache_reuse(best->tokens, avail, s.seq, s.session->position(), s.req.cache_reuse, gap);
  // Room kept for every running sequence's next block (as try_start keeps it).
  const size_t reserve = kv_->decode_reserve(running_.size());
  const uint64_t salt = ++shift_salt_;
  for (const ReuseChunk& c : plan) {
    const int64_t pos = s.session->position();
    if (c.dst > pos) {
      if (!kv_->can_append(s.session->cache(), int(c.dst - pos), reserve)) return;
      s.session->feed(std::span<const int32_t>(s.seq).subspan(size_t(pos), size_t(c.dst - pos)));
      live_.prefill_tokens += uint64_t(c.dst - pos);
      s.gap_tokens += c.dst - pos;
    }
    if (apply_cache_reuse(*s.session, *pool_, *best, s.seq, std::span(&c, 1), salt, reserve) < c.len) return;
  }
}

void Scheduler::remember_history(const Slot& s) {
  if (!s.session || s.session->history().empty()) return;
  constexpr size_t kHistories = 32;
  CachedHistory h = cached_history(*s.session);
  // One whose tokens this one extends, with the same chain, is this one's past: keep the longer.
  std::erase_if(histories_, [&](const CachedHistory& o) {
    return o.shifted.from_block == h.shifted.from_block && o.shifted.salt == h.shifted.salt &&
           o.tokens.size() <= h.tokens.size() && std::equal(o.tokens.begin(), o.tokens.end(), h.tokens.begin());
  });
  histories_.push_back(std::move(h));
  if (histories_.size() > kHistories) histories_.pop_front();
}

// Where what is stored depends on how a prompt is cut into appends (KVCache::cut_dependent: KIVI), the
// pool publishes only blocks computed as appends of max_chunk() tokens from the first compute them,
// and a prefix taken from the pool must end on that grid: then a reply never depends on what the
// pool or the store held. A cold prompt here is fed on that grid unless --prefill-chunk is smaller:
// then nothing is adopted (0). Elsewhere any block boundary (1).
int64_t Scheduler::adoption_grid(const Session& session) const {
  if (!session.cache().cut_dependent()) return 1;
  return cfg_.prefill_chunk >= session.max_chunk() ? session.max_chunk() : 0;
}

// Whether adopting `adopted` tokens of the slot's prompt gives what computing it cold gives, bit for
// bit (adoption_is_exact): a cold prompt is fed in chunks of min(--prefill-chunk, the cache's
// largest append) from its first token (build_batch).
bool Scheduler::exact(const Slot& s, int64_t adopted) const {
  const int64_t grid = adoption_grid(*s.session);
  const int64_t chunk = std::min<int64_t>(cfg_.prefill_chunk, s.session->max_chunk());
  const int64_t n = int64_t(s.seq.size());
  if (grid == 0 || adopted >= n) return false;
  if (!balanced(*s.session)) return adoption_is_exact(n, adopted, chunk, grid);
  // Chunked as next_chunk cuts them, a cold prompt's rows are computed on matmul's batched path but
  // those of a last chunk of kMatmulSmallRows or fewer; the rest after a prefix is computed alike when
  // it ends with that chunk after batched ones, or has only batched ones.
  const int64_t rest = n - adopted, last = (n - 1) % chunk + 1;
  if (last <= kMatmulSmallRows) return rest == last || rest - last > kMatmulSmallRows;
  return rest > kMatmulSmallRows;
}

bool Scheduler::balanced(const Session& session) const {
  return adoption_grid(session) == 1 &&
         std::min<int64_t>(cfg_.prefill_chunk, session.max_chunk()) > 2 * (kMatmulSmallRows + 1);
}

// A slot's next prompt chunk: at most --prefill-chunk tokens (and the cache's largest append). A cold
// prompt is cut from its first token, its last chunk the shorter one. Where a prefix may end at any
// token (balanced), the rest after one is cut so that it ends as the cold prompt does: with the cold
// prompt's last chunk when that is of kMatmulSmallRows tokens or fewer (matmul computes a batch of so
// few rows another way: kernels/ops.h), every other chunk longer than that.
int64_t Scheduler::next_chunk(const Slot& s) const {
  const int64_t left = s.remaining();
  const int64_t chunk = std::min<int64_t>(cfg_.prefill_chunk, s.session->max_chunk());
  const int64_t n = std::min(left, chunk);
  if (!balanced(*s.session)) return n;
  const int64_t total = int64_t(s.seq.size()), last = (total - 1) % chunk + 1;
  const int64_t middle = last <= kMatmulSmallRows ? left - last : left;  // before the short last chunk
  if (middle <= 0) return n;
  const int64_t c = std::min(middle, chunk);
  if (middle - c > 0 && middle - c <= kMatmulSmallRows) return middle - (kMatmulSmallRows + 1);
  return c;
}

// The prompt's full blocks (the last token left out, as adoption leaves it; no more than a sequence
// adopts, and up to the last one where an adoption would be exact): the run the pool holds is held, the next ones are looked
// up in the store in one round trip and loaded. Returns the blocks loaded; *local_blocks: those the
// pool held.
size_t Scheduler::load_from_store(Slot& s, std::vector<int32_t>& held, size_t* local_blocks) {
  const int64_t grid = adoption_grid(*s.session);
  *local_blocks = 0;
  if (grid == 0) return 0;
  const size_t n = kv_->adoptable_blocks(int64_t(s.seq.size()), [&](int64_t a) { return exact(s, a); });
  if (n == 0) return 0;
  const size_t local = kv_->get_computed_blocks(s.seq, 0, n, s.hashes, held);
  *local_blocks = local;
  if (local == n) return 0;
  // Room left for this prompt's first chunk and every running sequence's next block.
  const int chunk = int(std::min<int64_t>(cfg_.prefill_chunk, s.session->max_chunk()));
  const size_t reserve = kv_->prefill_reserve(running_.size(), chunk);
  const BlockExchange::Lookup r = exchange_->load(*pool_, s.seq, s.hashes, local, n, reserve, held);
  live_.store_hits += r.hits;
  live_.store_misses += r.looked_up - r.hits;
  live_.store_rejected += r.rejected;
  return r.hits;
}

// The full blocks this sequence computed since the last call go to the store (queued, not waited for)
// in the form its policy left them (BlockExchange::save_progress; at_end: the sequence is about to
// let go of its blocks); none past what a sequence adopts (a long StreamingLLM or sliding-window
// history's later blocks).
void Scheduler::save_to_store(Slot& s, bool at_end) {
  if (!s.session) return;
  const std::vector<int32_t>& hist = s.session->history();
  size_t n = std::min(pool_->complete_blocks(int64_t(hist.size())), pool_->adoptable_limit());
  // Shifted (approximate) blocks never leave the process: only the exact ones before them.
  if (s.session->cache().shifted_from() >= 0) n = std::min(n, pool_->complete_blocks(s.session->cache().shifted_from()));
  if (n <= s.saved_blocks) return;
  pool_->extend_block_hashes(hist, n, s.hashes);
  live_.store_puts += exchange_->save_progress(*pool_, hist, s.hashes, &s.saved_blocks, n, at_end);
}

// ---------------------------------------------------------------------------------------------
// Pinned prefixes (SchedulerConfig::pin_bytes): once a second request's marked prefix
// (Request::pin_tokens) is computed, its full blocks are held by a pin, so that a burst of other
// traffic never takes them (one-off prefixes, a burst's own system prompts, are never pinned);
// a later request with the same prefix adopts them as it would from the pool. Pins over the budget,
// and every pin when room runs out, go least recently used first.

void Scheduler::pin_prefix(Slot& s) {
  if (s.req.pin_tokens <= 0 || s.pin_done || !s.session) return;
  const int64_t upto = std::min<int64_t>(s.req.pin_tokens, int64_t(s.seq.size()) - 1);
  if (s.session->position() < upto) return;  // not computed yet
  s.pin_done = true;
  const size_t n = pool_->complete_blocks(upto);
  if (n == 0) return;
  pool_->extend_block_hashes(s.seq, n, s.hashes);
  for (Pin& p : pins_)
    if (p.blocks == n && p.last == s.hashes[n - 1]) {
      p.used = s.order;
      return;
    }
  // Shared prefixes only: the first request to mark one makes it a candidate, the second pins it.
  const std::pair<BlockHash, size_t> me{s.hashes[n - 1], n};
  if (const auto seen = std::find(pin_candidates_.begin(), pin_candidates_.end(), me); seen != pin_candidates_.end()) {
    pin_candidates_.erase(seen);
  } else {
    constexpr size_t kPinCandidates = 256;
    pin_candidates_.push_back(me);
    if (pin_candidates_.size() > kPinCandidates) pin_candidates_.pop_front();
    return;
  }
  const bool kivi = pool_->has_quantized_form();
  Pin pin;
  pin.last = s.hashes[n - 1];
  pin.used = s.order;
  for (size_t j = 0; j < n; ++j) {
    const KVPool::TokenRange tb = pool_->token_block(j);
    const auto ids = std::span<const int32_t>(s.seq).subspan(size_t(tb.start), size_t(tb.len));
    const size_t before = pin.held.size();
    if (pool_->hold_block(s.hashes[j], ids, pin.held)) {
      pin.bytes += kv_->held_bytes(pin.held.size() - before, false);
    } else if (kivi && j >= pool_->sink_blocks() && pool_->hold_block(s.hashes[j], ids, pin.held, true)) {
      pin.bytes += kv_->held_bytes(pin.held.size() - before, true);
    } else {
      pool_->release_held(pin.held);  // a block not published (or gone): nothing is pinned
      return;
    }
  }
  while (pinned_bytes_ + pin.bytes > cfg_.pin_bytes && unpin_oldest()) {
  }
  if (pinned_bytes_ + pin.bytes > cfg_.pin_bytes) {
    pool_->release_held(pin.held);
    return;
  }
  pin.blocks = n;
  pinned_bytes_ += pin.bytes;
  pins_.push_back(std::move(pin));
}

bool Scheduler::unpin_oldest() {
  if (pins_.empty()) return false;
  auto it = std::min_element(pins_.begin(), pins_.end(), [](const Pin& a, const Pin& b) { return a.used < b.used; });
  pool_->release_held(it->held);  // the blocks stay cached (findable) until the pool reuses them
  pinned_bytes_ -= it->bytes;
  pins_.erase(it);
  return true;
}

bool Scheduler::fits(const std::vector<Slot*>& batch, const std::vector<std::span<const int32_t>>& feeds) const {
  BlocksNeeded sum;
  for (size_t i = 0; i < batch.size(); ++i) kv_->add_need(batch[i]->session->cache(), int(feeds[i].size()), sum);
  return kv_->fits(sum);
}

// Every decoding sequence's next token and the oldest prefilling sequence's next chunk; without
// room, the chunk waits; false when even the decode tokens do not fit.
bool Scheduler::build_batch(std::vector<Slot*>& batch, std::vector<std::span<const int32_t>>& feeds) {
  batch.clear();
  feeds.clear();
  bool chunked = false;
  for (auto& s : running_) {
    if (s->done) continue;
    if (s->remaining() > 1 && chunked) continue;  // one prompt chunk a step
    if (s->session->position() == 0) adopt_at_turn(*s);
    const int64_t pos = s->session->position(), left = s->remaining();
    const int64_t n = next_chunk(*s);
    if (left > 1) chunked = true;
    batch.push_back(s.get());
    feeds.emplace_back(s->seq.data() + pos, size_t(n));
  }
  if (fits(batch, feeds)) return true;
  for (size_t i = 0; i < batch.size(); ++i)
    if (batch[i]->remaining() > 1) {
      batch.erase(batch.begin() + std::ptrdiff_t(i));
      feeds.erase(feeds.begin() + std::ptrdiff_t(i));
      break;
    }
  return !batch.empty() && fits(batch, feeds);
}

void Scheduler::preempt_youngest() {
  auto it = std::max_element(running_.begin(), running_.end(),
                             [](const auto& a, const auto& b) { return a->order < b->order; });
  std::unique_ptr<Slot> s = std::move(*it);
  running_.erase(it);
  if (exchange_) save_to_store(*s, true);
  remember_history(*s);
  s->session->release(*kv_);  // its blocks go back; the published ones stay findable for its return
  s->session.reset();
  ++live_.preempted;
  std::lock_guard lk(mu_);
  queue_.push_front(std::move(s));
}

namespace {
constexpr int kProbeEvery = 32;        // a sequence's declined drafts are verified anyway this often
constexpr int kMaxCostRows = 4096;     // passes wider than this are not measured
constexpr uint64_t kRemeasureEvery = 32;  // steps after which the plain width is measured again
}  // namespace

void Scheduler::step() {
  std::vector<Slot*> batch;
  std::vector<std::span<const int32_t>> feeds;
  while (!build_batch(batch, feeds)) {
    // Blocks the store is still sending from are the pool's again in a moment: wait for them first.
    if (exchange_ && exchange_->reclaim_pinned(*pool_, std::chrono::seconds(2)) > 0) continue;
    if (unpin_oldest()) continue;  // a pinned prefix gives way before a request is paused or fails
    if (running_.size() == 1) {
      finish(*running_[0], FinishReason::Error, "the KV pool is full (raise --kv-budget-mb)");
      return;
    }
    preempt_youngest();
  }
  // A speculating server prices its steps by the CPU time of this thread (speculative.h
  // thread_cpu_seconds): the drafting, the pass, the verifications and the samples, without the
  // time other work on the machine took the cores.
  const bool spec = cfg_.spec.type != SpecType::None;
  const double cpu0 = spec ? thread_cpu_seconds() : 0.0;
  if (spec) plan_drafts(batch, feeds);
  size_t prefill = 0, decode = 0;
  std::vector<Session*> sessions;
  std::vector<uint8_t> drafts;
  bool any_draft = false;
  for (size_t i = 0; i < batch.size(); ++i) {
    const bool draft = batch[i]->k > 0;
    (draft || feeds[i].size() == 1 ? decode : prefill) += feeds[i].size();
    sessions.push_back(batch[i]->session.get());
    drafts.push_back(draft ? 1 : 0);
    any_draft = any_draft || draft;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    Session::feed_batch(sessions, feeds, state_, any_draft ? std::span<const uint8_t>(drafts) : std::span<const uint8_t>());
  } catch (const KVPoolFull&) {
    for (Slot* s : batch) s->k = 0;
    preempt_youngest();  // fits() said it would fit: a KIVI estimate was short; nothing was changed
    return;
  } catch (const Error& e) {
    for (Slot* s : batch) s->k = 0;
    for (Slot* s : batch) finish(*s, FinishReason::Error, e.what());
    return;
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  live_.prefill_seconds += dt * double(prefill) / double(prefill + decode);
  live_.decode_seconds += dt * double(decode) / double(prefill + decode);
  live_.prefill_tokens += prefill;
  ++live_.steps;
  // Verifications first: they close their sessions' open steps (the kept tokens published, the
  // rejected ones dropped) before anything reads the histories.
  for (Slot* s : batch)
    if (s->k > 0) verify_drafts(*s);
  if (exchange_)
    for (Slot* s : batch) save_to_store(*s);
  if (cfg_.pin_bytes > 0)
    for (Slot* s : batch) pin_prefix(*s);
  for (Slot* s : batch)
    if (!s->done && s->remaining() == 0) sample_next(*s);
  if (spec && prefill + decode <= size_t(kMaxCostRows))
    step_costs_.record(int(prefill + decode), thread_cpu_seconds() - cpu0, live_.steps);
}

// ---------------------------------------------------------------------------------------------
// Speculation in the batch. A decoding sequence's pass row yields one token; each draft verified
// with it adds a row and yields a further token with the chance that it and every draft before it
// are kept (a^j for the j-th draft at acceptance a). Rows are cheap while the pass reads weights
// from memory and cost their full share once the batch is wide enough to be compute-bound, which
// this machine's measured step costs tell apart (step_costs_, in CPU seconds): a step takes the
// drafts, most promising first, that maximize its expected tokens per second, and none where no
// choice promises 3% over the plain step (best_batch_drafts).


void Scheduler::plan_drafts(const std::vector<Slot*>& batch, std::vector<std::span<const int32_t>>& feeds) {
  int rows = 0, decoding = 0;
  struct Offer {
    double yield;  // expected tokens the draft adds
    size_t slot;   // index in batch
  };
  std::vector<Offer> offers;
  for (size_t i = 0; i < batch.size(); ++i) {
    Slot& s = *batch[i];
    s.k = 0;
    s.deferred = 0;
    rows += int(feeds[i].size());
    if (!s.spec || s.remaining() != 1 || s.gen.done()) continue;
    ++decoding;
    const Session& ss = *s.session;
    const SpecOptions& o = s.spec->options();
    // The drafts and the token after them fit (every row's generator step fits as it would one
    // token at a time), and one append computes each row as single steps would.
    int room = std::min(o.draft_max, std::min(ss.max_draft_append(), ss.max_chunk()) - 1);
    while (room > 0 && !ss.fits(room + 2)) room = std::max(0, std::min(room / 2, room - 1));
    room = s.spec->draft_room(room);
    s.drafts.clear();
    s.cls = 0;
    // A draft model drafts as many tokens as asked, at a forward pass each: the step first decides
    // how many it takes, and only those are drafted (below).
    if (dynamic_cast<ModelDrafter*>(s.spec->drafter())) s.deferred = room;
    else s.cls = s.spec->propose(s.seq, room, s.drafts);
  }
  if (decoding == 0) return;
  const auto avail = [](const Slot& s) { return s.deferred > 0 ? s.deferred : int(s.drafts.size()); };
  for (size_t i = 0; i < batch.size(); ++i) {
    Slot& s = *batch[i];
    if (!s.spec || s.remaining() != 1 || s.gen.done()) continue;
    const SpecOptions& o = s.spec->options();
    if (avail(s) < std::max(1, o.draft_min)) {
      s.drafts.clear();
      s.deferred = 0;
      continue;
    }
    if (!o.adaptive) {
      s.k = avail(s);
      continue;
    }
    const double a = s.spec->acceptance(s.cls);
    double y = 1;
    for (int j = 0; j < avail(s) && (y *= a) > 0; ++j) offers.push_back({y, i});
  }
  if (!offers.empty()) {
    // Each sequence's offers fall with j (a < 1), so taking them by yield takes every sequence's
    // drafts in order.
    std::stable_sort(offers.begin(), offers.end(), [](const Offer& x, const Offer& y) { return x.yield > y.yield; });
    const int base = rows + [&] {
      int fixed = 0;
      for (Slot* s : batch) fixed += s->k;
      return fixed;
    }();
    // The plain width measured lately, or a plain step now: the rates compare against it, and a
    // figure taken in a slow moment would otherwise stand while drafts are always taken.
    if (!step_costs_.measured(base) || live_.steps - step_costs_.measured_at(base) > kRemeasureEvery)
      offers.clear();
    std::vector<double> yields(offers.size());
    for (size_t e = 0; e < offers.size(); ++e) yields[e] = offers[e].yield;
    const size_t take = best_batch_drafts(decoding, base, yields, step_costs_);
    for (size_t e = 0; e < take; ++e) ++batch[offers[e].slot]->k;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    Slot& s = *batch[i];
    if (avail(s) == 0 || !s.spec || s.remaining() != 1) continue;
    const SpecOptions& o = s.spec->options();
    if (s.k > 0 && s.k < o.draft_min) s.k = 0;
    if (s.k == 0 && o.adaptive && ++s.skipped >= kProbeEvery)
      s.k = std::min<int>(avail(s), std::max(2, o.draft_min));  // measure again: the text may have changed
    if (s.k == 0) {
      ++live_.spec_declined;
      continue;
    }
    s.skipped = 0;
  }
  draft_with_models(batch);
  // The drafted rows replace the plain ones; without room in the pool for them, a plain step.
  std::vector<std::span<const int32_t>> planned = feeds;
  for (size_t i = 0; i < batch.size(); ++i) {
    Slot& s = *batch[i];
    if (s.k == 0) continue;
    s.fed.assign(1, s.seq.back());
    s.fed.insert(s.fed.end(), s.drafts.begin(), s.drafts.begin() + s.k);
    planned[i] = s.fed;
  }
  if (fits(batch, planned)) {
    feeds = std::move(planned);
  } else {
    for (Slot* s : batch) s->k = 0;
  }
}

// The drafts a step took from sequences with a draft model (Slot::deferred), made now: for all of them
// in one batched pass of the draft model per draft position (engine/drafter_model.h draft_batched),
// or one sequence after another.
void Scheduler::draft_with_models(const std::vector<Slot*>& batch) {
  std::vector<DraftJob> jobs;
  std::vector<Slot*> slots;
  for (Slot* s : batch) {
    if (s->deferred == 0) continue;
    s->deferred = 0;
    if (s->k == 0) continue;
    auto* md = static_cast<ModelDrafter*>(s->spec->drafter());
    if (cfg_.spec_draft_batch) {
      jobs.push_back({md, s->seq, s->k, &s->drafts});
      slots.push_back(s);
      continue;
    }
    const int64_t passes = md->passes();
    s->cls = s->spec->propose(s->seq, s->k, s->drafts);
    live_.spec_draft_passes += uint64_t(md->passes() - passes);
    s->k = int(s->drafts.size()) >= std::max(1, s->spec->options().draft_min) ? int(s->drafts.size()) : 0;
  }
  if (jobs.empty()) return;
  const double t0 = thread_cpu_seconds();
  live_.spec_draft_passes += uint64_t(draft_batched(jobs, draft_state_));
  size_t n = 0;
  for (const DraftJob& j : jobs) n += j.out->size();
  const double per = n > 0 ? (thread_cpu_seconds() - t0) / double(n) : 0.0;
  for (Slot* s : slots) {
    if (!s->drafts.empty()) s->spec->note_draft_cost(per);
    s->k = int(s->drafts.size()) >= std::max(1, s->spec->options().draft_min) ? int(s->drafts.size()) : 0;
  }
}

// The drafts' rows through the sequence's generator (speculative.h: exactly the text of one token a
// step), the kept tokens kept in the session, the rest dropped from its cache.
void Scheduler::verify_drafts(Slot& s) {
  Session& ss = *s.session;
  const int k = s.k;
  s.k = 0;
  const size_t vocab = size_t(rt_.config().vocab_size);
  const int64_t p0 = ss.position() - (k + 1);
  spec_steps_.clear();
  const int kept = s.spec->verify(s.gen, ss.draft_rows(), vocab, ss.history(), p0,
                                  std::span<const int32_t>(s.fed).subspan(1), s.cls, spec_steps_);
  ss.commit_draft(kept + 1);
  live_.spec_drafted += uint64_t(k);
  live_.spec_accepted += uint64_t(kept);
  ++live_.spec_verifications;
  s.result.draft_n += k;
  s.result.draft_accepted += kept;
  for (Generator::Step& step : spec_steps_) take(s, step);
  if (s.gen.done()) return finish(s, finish_reason_of(s.gen.reason()), s.gen.error());
  for (const Generator::Step& step : spec_steps_) s.seq.push_back(step.id);
}

void Scheduler::sample_next(Slot& s) {
  const auto lg = s.session->last_logits();
  logits_.assign(lg.begin(), lg.end());
  Generator::Step step = s.gen.next(logits_, s.session->history(), s.session->fits(1));
  if (s.spec) s.spec->count_plain();
  take(s, step);
  if (s.gen.done()) return finish(s, finish_reason_of(s.gen.reason()), s.gen.error());
  s.seq.push_back(step.id);
}

// A generator step's token into the result and the client's callbacks.
void Scheduler::take(Slot& s, Generator::Step& step) {
  ++s.result.completion_tokens;
  ++live_.generated_tokens;
  if (step.accepted) s.result.tokens.push_back(step.id);
  if (step.accepted && step.logprob) {
    if (s.req.on_logprob) s.req.on_logprob(*step.logprob);
    s.result.logprobs.push_back(std::move(*step.logprob));
  }
  s.result.text += step.text;
  if (!step.text.empty() && s.req.on_text) s.req.on_text(step.text);
}

void Scheduler::finish(Slot& s, FinishReason r, std::string error) {
  if (s.done) return;
  if (r == FinishReason::Stop || r == FinishReason::Length) {
    const std::string rest = s.gen.finish();  // a stop string its last bytes complete makes it Stop
    s.result.text += rest;
    if (!rest.empty() && s.req.on_text) s.req.on_text(rest);
    s.result.stop_reason = s.gen.reason();
    s.result.stop_string = s.gen.stop_string();
    r = finish_reason_of(s.gen.reason());
  } else {
    s.gen.stop(r == FinishReason::Cancelled ? StopReason::Cancelled : StopReason::Error);
    s.result.stop_reason = s.gen.reason();
  }
  s.done = true;
  if (exchange_ && r != FinishReason::Error) save_to_store(s, true);
  if (r != FinishReason::Error) remember_history(s);
  if (suffix_cache_ && (r == FinishReason::Stop || r == FinishReason::Length))
    suffix_cache_->add(s.req.prompt, s.result.tokens);
  if (s.session) s.session->release(*kv_);  // the blocks go back now
  s.session.reset();
  s.spec.reset();  // and a draft model's cache with them
  s.result.reason = r;
  s.result.error = std::move(error);
  if (r == FinishReason::Cancelled) ++live_.cancelled;
  else if (r == FinishReason::Error) ++live_.failed;
  else ++live_.finished;
  publish_stats();  // whoever the reply reaches sees counters that include it
  if (s.req.on_done) s.req.on_done(s.result);
  std::lock_guard lk(mu_);
  if (live_requests_ > 0) --live_requests_;
  if (live_requests_ == 0) idle_.notify_all();
}

// Cancelled requests end (running or queued); ended ones leave the running set.
void Scheduler::reap() {
  for (auto& s : running_)
    if (s->cancelled()) finish(*s, FinishReason::Cancelled);
  std::erase_if(running_, [](const auto& s) { return s->done; });
  std::vector<std::unique_ptr<Slot>> gone;
  {
    std::lock_guard lk(mu_);
    for (auto it = queue_.begin(); it != queue_.end();)
      if ((*it)->cancelled()) {
        gone.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
  }
  for (auto& s : gone) finish(*s, FinishReason::Cancelled);
}

void Scheduler::publish_stats() {
  SchedulerStats s = live_;
  s.running = running_.size();
  s.blocks_total = pool_->dense().capacity() + pool_->quant().capacity();
  s.blocks_used = pool_->blocks_in_use();
  s.blocks_cached = pool_->dense().cached() + pool_->quant().cached();
  for (int c = 0; c < kRetentionClasses; ++c)
    s.blocks_cached_by[c] = pool_->dense().cached(Retention(c)) + pool_->quant().cached(Retention(c));
  size_t shared = 0;
  for (const BlockPool* p : {&pool_->dense(), &pool_->quant()})
    for (size_t id = 0; id < p->capacity(); ++id) shared += p->refs(int32_t(id)) > 1;
  s.blocks_shared = shared;
  s.pinned_prefixes = pins_.size();
  for (const auto& slot : running_)
    if (slot->spec && !slot->done)
      if (const auto* md = dynamic_cast<const ModelDrafter*>(slot->spec->drafter())) s.spec_draft_blocks += md->kv_blocks();
  for (const Pin& p : pins_) s.blocks_pinned += p.held.size();
  if (exchange_) {
    s.store = true;
    s.store_io = exchange_->store().stats();
  }
  std::lock_guard lk(mu_);
  s.requests = stats_.requests;
  stats_ = s;
}

}  // namespace ptllm
