#include "engine/speculative.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include "core/error.h"
#include "engine/drafter_model.h"
#include "engine/drafter_suffix.h"
#include "engine/session.h"

namespace ptllm {

const char* spec_type_name(SpecType t) {
  switch (t) {
    case SpecType::None: return "none";
    case SpecType::Ngram: return "ngram";
    case SpecType::Suffix: return "suffix";
    case SpecType::Draft: return "draft";
  }
  return "none";
}

SpecType parse_spec_type(const std::string& s) {
  if (s == "none") return SpecType::None;
  if (s == "ngram") return SpecType::Ngram;
  if (s == "suffix") return SpecType::Suffix;
  if (s == "draft") return SpecType::Draft;
  throw UsageError("--spec-type " + s + ": unknown drafter (available: none, ngram, suffix, draft)");
}

void SpecStats::add(const SpecStats& o) {
  drafted += o.drafted;
  accepted += o.accepted;
  verify_steps += o.verify_steps;
  verify_tokens += o.verify_tokens;
  plain_steps += o.plain_steps;
}

// ---------------------------------------------------------------------------------------------

NgramDrafter::NgramDrafter(int ngram_min, int ngram_max) : min_(std::max(1, ngram_min)), max_(std::max(min_, ngram_max)) {}

int NgramDrafter::draft(std::span<const int32_t> h, int max, std::vector<int32_t>& out) {
  out.clear();
  const int64_t L = int64_t(h.size());
  for (int n = int(std::min<int64_t>(max_, L - 1)); n >= min_; --n) {
    const int32_t* tail = h.data() + (L - n);
    // The most recent earlier occurrence: start i < L - n.
    for (int64_t i = L - n - 1; i >= 0; --i) {
      if (h[size_t(i)] != tail[0] || !std::equal(tail, tail + n, h.data() + i)) continue;
      // What followed it, read on through the draft itself once it reaches the end (a loop).
      for (int64_t t = i + n; int(out.size()) < max; ++t)
        out.push_back(t < L ? h[size_t(t)] : out[size_t(t - L)]);
      return n;
    }
  }
  return 0;
}

std::unique_ptr<Drafter> make_drafter(const SpecOptions& o) {
  switch (o.type) {
    case SpecType::None: return nullptr;
    case SpecType::Ngram: return std::make_unique<NgramDrafter>(o.ngram_min, o.ngram_max);
    case SpecType::Suffix: return std::make_unique<SuffixDrafter>(8, 0.1, o.suffix_cache);
    case SpecType::Draft:
      if (!o.draft_model || !o.draft_pool) throw UsageError("--spec-type draft needs a draft model (--model-draft)");
      return std::make_unique<ModelDrafter>(*o.draft_model, *o.draft_pool, o.draft_ctx);
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

namespace {
constexpr double kAlphaPrior = 0.5;
constexpr double kEma = 0.15;            // weight of the newest measurement
constexpr double kEmaDown = 0.5;         // ... of a pass cost measured below the average
constexpr int kProbeEvery = 32;          // a declined draft is verified anyway this often ...
constexpr int kProbeMost = 256;          // ... doubling after each probe that did not pay, up to this
constexpr int64_t kPlainEvery = 64;      // a plain step this often, to keep its cost measured
constexpr int kPlainFirst = 3;           // plain steps measured before the first draft
constexpr double kPriorRowCost = 0.1;    // an unmeasured further row, in passes of the nearest width
}  // namespace

void PassCosts::record(int T, double seconds, uint64_t now) {
  if (T <= 0 || seconds <= 0) return;
  if (T > widest_) {  // the first pass this wide grows the buffers it runs in
    widest_ = T;
    return;
  }
  if (int(est_.size()) <= T) {
    est_.resize(size_t(T) + 1, 0.0);
    at_.resize(size_t(T) + 1, 0);
    n_.resize(size_t(T) + 1, 0);
  }
  double& est = est_[size_t(T)];
  at_[size_t(T)] = now;
  ++n_[size_t(T)];
  // CPU time errs upwards (a cold cache, a page fault, an interrupt; the first steps after a
  // prompt), so a lower measurement moves the average further than a higher one.
  if (est <= 0) est = seconds;
  else if (seconds < est) est += kEmaDown * (std::max(seconds, est / 2) - est);
  else est += kEma * (std::min(seconds, est * 2) - est);
}

void PassCosts::set(int T, double seconds) {
  if (int(est_.size()) <= T) {
    est_.resize(size_t(T) + 1, 0.0);
    at_.resize(size_t(T) + 1, 0);
    n_.resize(size_t(T) + 1, 0);
  }
  est_[size_t(T)] = seconds;
  n_[size_t(T)] = 1;
  widest_ = std::max(widest_, T);
}

double PassCosts::cost(int T) const {
  if (measured(T)) return est_[size_t(T)];
  int lo = 0, hi = 0;
  for (int t = 1; t < int(est_.size()); ++t) {
    if (est_[size_t(t)] <= 0) continue;
    if (t < T) lo = t;
    else if (hi == 0) hi = t;
  }
  const auto c = [&](int t) { return est_[size_t(t)]; };
  if (lo > 0 && hi > 0) return c(lo) + (c(hi) - c(lo)) * double(T - lo) / double(hi - lo);
  if (lo > 0) return c(lo) * (1 + kPriorRowCost * (T - lo));  // optimistic until measured
  if (hi > 0) return c(hi);
  return 1 + kPriorRowCost * (T - 1);
}

int best_draft_count(double a, int avail, int k_min, const PassCosts& c, double draft_cost, double min_gain) {
  const int lo = std::max(1, k_min);
  if (avail < lo) return 0;
  const double step = c.cost(1);
  double best = min_gain, yield = 1, term = 1;
  int best_k = 0;
  for (int k = 1; k <= avail; ++k) {
    term *= a;
    yield += term;
    const double gain = yield / (c.cost(k + 1) / step + k * draft_cost);
    if (k >= lo && gain > best) {
      best = gain;
      best_k = k;
    }
  }
  return best_k;
}

size_t best_batch_drafts(int decoding, int base, std::span<const double> yields, const PassCosts& c,
                         double min_gain) {
  if (decoding <= 0) return 0;
  double best = min_gain * decoding / c.cost(base), tokens = decoding;
  size_t take = 0;
  for (size_t e = 0; e < yields.size(); ++e) {
    tokens += yields[e];
    const double rate = tokens / c.cost(base + int(e) + 1);
    if (rate > best) best = rate, take = e + 1;
  }
  return take;
}

Speculator::Speculator(const SpecOptions& o) : o_(o), drafter_(make_drafter(o)) {
  if (o_.draft_max < 0) throw UsageError("--spec-draft-max must be at least 0");
  if (o_.draft_min < 0) throw UsageError("--spec-draft-min must be at least 0");
  if (drafter_) alpha_.assign(size_t(drafter_->classes()), kAlphaPrior);
}

namespace {
// An estimate moved by a measurement: an average, but one measurement moves it at most by half or
// double (a loaded machine delays a step now and then; those outliers must not switch speculation off).
void update(double& est, double x, double first_guess) {
  if (est <= 0) est = first_guess;
  est += kEma * (std::clamp(x, est / 2, est * 2) - est);
}
}  // namespace

int Speculator::choose(int avail, int cls) const {
  const int lo = std::max(1, o_.draft_min);
  if (avail < lo) return 0;
  if (!o_.adaptive) return avail;
  const double a = alpha_[size_t(std::clamp(cls, 0, int(alpha_.size()) - 1))];
  return best_draft_count(a, avail, lo, costs_, drafter_ && drafter_->costly() ? draft_cost() : 0.0);
}

void Speculator::plain(Session& s, Generator& gen, int32_t pending, std::vector<Generator::Step>& steps) {
  const double t0 = thread_cpu_seconds();
  std::span<float> logits = s.feed({&pending, 1});
  steps.push_back(gen.next(logits, s.history(), s.fits(1)));
  costs_.record(1, thread_cpu_seconds() - t0);
  ++stats_.plain_steps;
}

double Speculator::draft_cost() const {
  if (!costs_.measured(1) || draft_s_ <= 0) return kPriorRowCost;
  return draft_s_ / costs_.cost(1);
}

int Speculator::draft_room(int room) {
  if (!drafter_ || room <= 0) return 0;
  if (!drafter_->costly() || !o_.adaptive) return room;
  int cap = choose(room, 0);
  probing_ = false;
  if (cap == 0 && room >= std::max(1, o_.draft_min) && ++skipped_ >= probe_every_) {
    cap = std::min(room, std::max(2, o_.draft_min));
    probing_ = true;
  }
  if (cap > 0) skipped_ = 0;
  return cap;
}

int Speculator::propose(std::span<const int32_t> seq, int room, std::vector<int32_t>& out) {
  out.clear();
  if (!drafter_ || room <= 0) return 0;
  const double t0 = thread_cpu_seconds();
  const int cls = drafter_->draft(seq, room, out);
  if (!out.empty()) {
    const double per = (thread_cpu_seconds() - t0) / double(out.size());
    update(draft_s_, per, per);
  }
  return cls;
}

void Speculator::note_draft_cost(double per) {
  if (per > 0) update(draft_s_, per, per);
}

int Speculator::verify(Generator& gen, std::span<float> rows, size_t vocab, std::span<const int32_t> hist, int64_t p0,
                       std::span<const int32_t> drafts, int cls, std::vector<Generator::Step>& steps) {
  const int k = int(drafts.size());
  const size_t first = steps.size();
  int kept = 0;  // drafts kept
  bool judged_last = false;  // the last draft verified was rejected (not cut by the generator's end)
  for (int j = 0; j <= k; ++j) {
    steps.push_back(gen.next(rows.subspan(size_t(j) * vocab, vocab), hist.first(size_t(p0 + j + 1)), true));
    if (gen.done() || j == k) break;
    if (steps.back().id != drafts[size_t(j)]) {
      judged_last = true;
      break;
    }
    ++kept;
  }
  stats_.drafted += k;
  stats_.accepted += kept;
  ++stats_.verify_steps;
  stats_.verify_tokens += int64_t(steps.size() - first);
  // The chance a draft of this class is kept: each judged draft is one Bernoulli observation.
  const int judged = kept + (judged_last ? 1 : 0);
  if (judged > 0) {
    double& a = alpha_[size_t(std::clamp(cls, 0, int(alpha_.size()) - 1))];
    for (int i = 0; i < judged; ++i) a += kEma * ((i < kept ? 1.0 : 0.0) - a);
    a = std::clamp(a, 0.0, 0.98);
  }
  // A probe that leaves drafting unprofitable waits twice as long for the next (prose a draft model
  // rarely guesses pays for fewer probes); one that makes it pay restores the interval.
  if (probing_) {
    probing_ = false;
    const int lo = std::max(1, o_.draft_min);
    const bool pays = best_draft_count(acceptance(cls), std::max(lo, 4), lo, costs_,
                                       drafter_ && drafter_->costly() ? draft_cost() : 0.0) > 0;
    probe_every_ = pays ? kProbeEvery : std::min(2 * probe_every_, kProbeMost);
  }
  return kept;
}

void Speculator::round(Session& s, Generator& gen, int32_t pending, std::vector<Generator::Step>& steps) {
  if (!drafter_ || gen.done()) return plain(s, gen, pending, steps);
  const int64_t rounds = stats_.verify_steps + stats_.plain_steps;
  // Room: the drafts and the token after them fit (so every row's generator step fits as it would
  // one token at a time), and one append computes each row as single steps would.
  int room = std::min(o_.draft_max, s.max_draft_append() - 1);
  while (room > 0 && !s.fits(room + 2)) room = std::max(0, std::min(room / 2, room - 1));
  // The one-token step is what every width is priced against: measured a few times first (the
  // first steps after a prompt run on cold caches), then again every kPlainEvery rounds.
  if (room <= 0 || (o_.adaptive && (costs_.samples(1) < kPlainFirst || rounds % kPlainEvery == kPlainEvery - 1)))
    return plain(s, gen, pending, steps);

  // The round's cost: the pass, the generator's steps and, for a drafter whose drafts are nearly
  // free, the drafting (a draft model's is priced apart: draft_cost).
  double t0 = thread_cpu_seconds();
  room = draft_room(room);
  if (room <= 0) return plain(s, gen, pending, steps);
  ctx_.assign(s.history().begin(), s.history().end());
  ctx_.push_back(pending);
  const int cls = propose(ctx_, room, drafts_);
  if (drafter_->costly()) t0 = thread_cpu_seconds();
  int k = drafter_->costly() ? (int(drafts_.size()) >= std::max(1, o_.draft_min) ? int(drafts_.size()) : 0)
                             : choose(int(drafts_.size()), cls);
  if (!drafter_->costly()) probing_ = false;  // a costly drafter's probe was decided in draft_room
  if (k == 0 && !drafts_.empty() && int(drafts_.size()) >= std::max(1, o_.draft_min) && ++skipped_ >= probe_every_) {
    k = std::min<int>(int(drafts_.size()), 2);  // measure again now and then: the text may have changed
    probing_ = true;
  }
  if (k == 0) return plain(s, gen, pending, steps);
  skipped_ = 0;

  fed_.assign(1, pending);
  fed_.insert(fed_.end(), drafts_.begin(), drafts_.begin() + k);
  const size_t vocab = s.last_logits().size();
  const int64_t p0 = s.position();
  std::span<float> rows = s.feed_draft(fed_);
  const int kept = verify(gen, rows, vocab, s.history(), p0, std::span<const int32_t>(drafts_).first(size_t(k)), cls, steps);
  s.commit_draft(kept + 1);
  costs_.record(k + 1, thread_cpu_seconds() - t0);
}

}  // namespace ptllm
