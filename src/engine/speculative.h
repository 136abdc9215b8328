#pragma once
// Speculative decoding: a drafter proposes the tokens likely to follow, the target model verifies
// them and the token after them in one forward pass (decode is memory-bound: k + 1 rows cost little
// more than one), and the generator keeps the longest prefix it agrees with.
//
// Exactness: every drafter here proposes one definite token per position (a point mass q), and the
// target's token at each verified row is drawn by the generator itself, with its processors,
// penalties and sampler, from the logits of exactly the history it would have seen one token at a
// time. A draft is kept while the drawn token equals it. For a point-mass q this is speculative
// sampling (Leviathan et al. 2023, Chen et al. 2023): the draft d is kept with probability
// min(1, p(d) / q(d)) = p(d), and a rejected position is drawn from norm(max(0, p - q)), which is p
// without d renormalized, exactly what a draw from p that is not d is. So the output has the
// target's distribution, and with the same seed it is the same text token for token as without
// speculation (the random stream is consumed by the same draws in the same order).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/generator.h"

namespace ptllm {

class Session;
class Model;
class SuffixCache;
class ThreadPool;

enum class SpecType { None, Ngram, Suffix, Draft };
// "none", "ngram", "suffix", "draft".
const char* spec_type_name(SpecType t);
// Parses --spec-type; throws UsageError naming the value otherwise.
SpecType parse_spec_type(const std::string& s);

struct SpecOptions {
  SpecType type = SpecType::None;
  int draft_max = 16;    // the most tokens drafted for one verification
  int draft_min = 1;     // fewer drafted tokens than this: a plain step instead
  bool adaptive = true;  // false: verify every draft offered, whatever it measured
  int ngram_max = 4;     // prompt lookup: the longest n-gram matched
  int ngram_min = 1;     // and the shortest
  // Draft: the draft model (same vocabulary as the target), the threads it runs on, its cache's
  // capacity in tokens (engine/drafter_model.h).
  const Model* draft_model = nullptr;
  ThreadPool* draft_pool = nullptr;
  int draft_ctx = 4096;
  // Suffix: the recent replies of the server's other requests, drafted from too (null: none).
  const SuffixCache* suffix_cache = nullptr;
};

// Proposes the tokens likely to follow a sequence.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to `max` tokens to follow `history` into `out` (cleared first). Returns a confidence class
  // for the adaptivity to keep acceptance apart by (the prompt-lookup drafter: the n-gram length).
  virtual int draft(std::span<const int32_t> history, int max, std::vector<int32_t>& out) = 0;
  virtual int classes() const = 0;  // confidence classes draft() returns: 0 .. classes() - 1
  // Whether a drafted token costs a forward pass (a draft model): then no more are drafted than
  // the measurements favour verifying.
  virtual bool costly() const { return false; }
};

// Prompt lookup: the longest of the last n tokens (ngram_max down to ngram_min) that occurred
// earlier in the sequence (prompt and reply), most recent occurrence first, and the tokens that
// followed it; a match close to the end continues into its own draft (a repeated loop).
class NgramDrafter : public Drafter {
 public:
  NgramDrafter(int ngram_min, int ngram_max);
  int draft(std::span<const int32_t> history, int max, std::vector<int32_t>& out) override;
  int classes() const override { return max_ + 1; }

 private:
  int min_, max_;
};

std::unique_ptr<Drafter> make_drafter(const SpecOptions& o);

// Seconds of CPU time the calling thread has used. The adaptivity prices passes in it: the thread
// that runs a pass computes its share of every product and waits for the pool's other threads by
// spinning, so unloaded it is the pass's wall time; on a machine shared with other work it leaves
// out the time the thread was preempted, and the time it gave its core away waiting for a
// preempted worker, which stretch a pass's wall time at random by several steps' worth.
double thread_cpu_seconds();

// The measured cost of a forward pass (and the work around it) of each width T, an average per
// width. A width not measured is taken between the nearest measured ones, or past the widest a
// tenth of that pass a further row (decode of a large model is memory-bound), an optimistic guess
// that its first measurement corrects.
class PassCosts {
 public:
  // A pass of T rows cost `seconds`, at step `now` of the caller's count. The first pass wider than
  // any before grows the buffers it runs in: not counted. One measurement moves the average at most
  // by half or double, one below it by half its distance, one above by 0.15 of it.
  void record(int T, double seconds, uint64_t now = 0);
  double cost(int T) const;
  bool measured(int T) const { return T > 0 && T < int(est_.size()) && est_[size_t(T)] > 0; }
  uint64_t measured_at(int T) const { return measured(T) ? at_[size_t(T)] : 0; }
  int samples(int T) const { return measured(T) ? n_[size_t(T)] : 0; }  // measurements counted
  // For tests: the average of width T set outright.
  void set(int T, double seconds);

 private:
  std::vector<double> est_;    // [T] seconds (0: not measured)
  std::vector<uint64_t> at_;   // [T] the step that last measured it
  std::vector<int> n_;         // [T] measurements counted
  int widest_ = 0;
};

// The drafts worth verifying for a sequence: of k = k_min..avail, the k maximizing the expected
// tokens of a verification, 1 + a + a^2 + ... + a^k (a: the chance a draft is kept), over its cost
// in plain steps, cost(k + 1) / cost(1) plus k * draft_cost (drafting a token, in plain steps);
// 0 when no k promises min_gain over a plain step.
int best_draft_count(double a, int avail, int k_min, const PassCosts& c, double draft_cost, double min_gain = 1.03);
// The drafts worth verifying in a batched step of `base` rows that decodes `decoding` sequences:
// `yields` holds every offered draft's expected tokens (a sequence's j-th draft: a^j), largest first;
// the first n of them are taken, n maximizing (decoding + their sum) / cost(base + n), 0 when none
// promises min_gain over the plain step's decoding / cost(base).
size_t best_batch_drafts(int decoding, int base, std::span<const double> yields, const PassCosts& c,
                         double min_gain = 1.03);

// What speculation did for one generation.
struct SpecStats {
  int64_t drafted = 0;   // drafted tokens verified
  int64_t accepted = 0;  // of them kept
  int64_t verify_steps = 0;  // forward passes that verified drafts
  int64_t verify_tokens = 0; // tokens those passes produced (kept drafts plus the target's own)
  int64_t plain_steps = 0;   // one-token steps (nothing drafted, or drafting judged not to pay)
  double acceptance() const { return drafted > 0 ? double(accepted) / double(drafted) : 0.0; }
  double tokens_per_verify() const { return verify_steps > 0 ? double(verify_tokens) / double(verify_steps) : 0.0; }
  void add(const SpecStats& o);
};

// One sequence's speculation: the drafter, the measured acceptance and costs, the counters.
class Speculator {
 public:
  explicit Speculator(const SpecOptions& o);
  bool enabled() const { return drafter_ != nullptr; }
  Drafter* drafter() const { return drafter_.get(); }
  const SpecOptions& options() const { return o_; }

  // Feeds `pending` (the id the generator just accepted, not fed yet) and, when drafting is
  // judged to pay, the drafted tokens after it, in one pass; runs `gen` over the rows while its
  // tokens agree with the drafts and appends each step to `steps` (at least one). The session then
  // holds every kept token and last_logits() follow the last; if the generator is not done, the
  // last step's id is the next pending one. Needs the session to fit one more token (the caller's
  // generator checked it).
  void round(Session& s, Generator& gen, int32_t pending, std::vector<Generator::Step>& steps);
  const SpecStats& stats() const { return stats_; }

  // The scheduler's side (engine/scheduler.cpp), where the drafts of several sequences are verified in
  // one batched pass: drafting and verification apart, the pass in between.
  // Up to `room` drafts to follow `seq` (the history and the pending id) into `out`; returns the
  // drafter's confidence class.
  int propose(std::span<const int32_t> seq, int room, std::vector<int32_t>& out);
  // Drafting measured outside propose() (the scheduler's batched draft model): CPU seconds a token.
  void note_draft_cost(double seconds_per_token);
  // The measured chance that a drafted token of class `cls` is kept.
  double acceptance(int cls) const { return alpha_[size_t(std::clamp(cls, 0, int(alpha_.size()) - 1))]; }
  // Runs `gen` over rows [drafts.size() + 1][vocab] (the logits after the pending id and after each
  // draft; `hist`: the history with the pending id and the drafts fed, from position p0 on) while
  // its tokens agree with the drafts, appending each step to `steps`; records the counters and the
  // acceptance. Returns the drafts kept: the caller keeps kept + 1 fed tokens.
  int verify(Generator& gen, std::span<float> rows, size_t vocab, std::span<const int32_t> hist, int64_t p0,
             std::span<const int32_t> drafts, int cls, std::vector<Generator::Step>& steps);
  // The most tokens worth drafting now, of `room` (all of them for a drafter whose drafts are nearly
  // free; 0: a plain step); counts a declined draft towards the next probe.
  int draft_room(int room);
  // A one-token step taken for this sequence (counted as a plain step).
  void count_plain() { ++stats_.plain_steps; }

  // The verification size the measurements favour for `avail` drafted tokens of class `cls`
  // (0: a plain step pays best). Public for tests.
  int choose(int avail, int cls) const;
  // For tests: the measured costs and acceptance, injected.
  PassCosts& costs() { return costs_; }
  void set_acceptance(int cls, double a) { alpha_[size_t(std::clamp(cls, 0, int(alpha_.size()) - 1))] = a; }

 private:
  void plain(Session& s, Generator& gen, int32_t pending, std::vector<Generator::Step>& steps);
  SpecOptions o_;
  std::unique_ptr<Drafter> drafter_;
  SpecStats stats_;
  std::vector<int32_t> ctx_, drafts_, fed_;
  std::vector<double> alpha_;  // per confidence class: the chance a drafted token is kept (EMA)
  // The measured costs of passes of each width (CPU seconds, a round's drafting and generator
  // steps included): small models that fit in cache are compute-bound and pay for every row, and
  // matmul changes products with T (docs/performance.md), so no formula in T holds everywhere.
  PassCosts costs_;
  double draft_cost() const;   // drafting one token, in one-token steps of the target
  double draft_s_ = 0;         // drafting one token (EMA; 0: not measured yet)
  int skipped_ = 0;            // drafts declined in a row (a verification is tried now and then)
  int probe_every_ = 32;       // declined drafts before the next probe (engine/speculative.cpp)
  bool probing_ = false;       // the verification under way is a probe
};

}  // namespace ptllm
