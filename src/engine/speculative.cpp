#include "engine/speculative.h"

#include <algorithm>
#include <cmath>

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

namespace {
constexpr double kAlphaPrior = 0.5;
constexpr double kEma = 0.15;            // weight of the newest measurement
constexpr int kProbeEvery = 32;          // a declined draft is verified anyway this often
constexpr int64_t kPlainEvery = 64;      // a plain step this often, to keep its cost measured
constexpr double kMinGain = 1.03;        // a verification must promise this over a plain step
constexpr double kPriorRowCost = 0.1;    // an unmeasured further row, in one-token steps
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Speculator::Speculator(const SpecOptions& o) : o_(o), drafter_(make_drafter(o)) {
  if (o_.draft_max < 0) throw UsageError("--spec-draft-max must be at least 0");
  if (o_.draft_min < 0) throw UsageError("--spec-draft-min must be at least 0");
  if (drafter_) alpha_.assign(size_t(drafter_->classes()), kAlphaPrior);
  cost_.assign(size_t(std::max(0, o_.draft_max)) + 2, 0.0);
}

double Speculator::cost(int T) const {
  if (T < int(cost_.size()) && cost_[size_t(T)] > 0) return cost_[size_t(T)];
  // Unmeasured: between the nearest measured widths; beyond them, a tenth of a step a further row
  // (decode is memory-bound on large models) from the nearest one.
  int lo = 1, hi = 0;
  double c_lo = 1, c_hi = 0;
  for (int t = 2; t < int(cost_.size()); ++t) {
    if (cost_[size_t(t)] <= 0) continue;
    if (t < T) lo = t, c_lo = cost_[size_t(t)];
    else if (hi == 0) hi = t, c_hi = cost_[size_t(t)];
  }
  if (hi > 0) return c_lo + (c_hi - c_lo) * double(T - lo) / double(hi - lo);
  return c_lo + kPriorRowCost * (T - lo);
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
  // Tokens a verification of k drafts yields, 1 + a + a^2 + ... + a^k, against its cost 1 + extra k.
  const double a = alpha_[size_t(std::clamp(cls, 0, int(alpha_.size()) - 1))];
  double best = kMinGain, yield = 1, term = 1;
  int best_k = 0;
  for (int k = 1; k <= avail; ++k) {
    term *= a;
    yield += term;
    const double gain = yield / (cost(k + 1) + (drafter_ && drafter_->costly() ? k * draft_cost() : 0.0));
    if (k >= lo && gain > best) {
      best = gain;
      best_k = k;
    }
  }
  return best_k;
}

void Speculator::plain(Session& s, Generator& gen, int32_t pending, std::vector<Generator::Step>& steps) {
  const auto t0 = Clock::now();
  std::span<float> logits = s.feed({&pending, 1});
  const double dt = seconds_since(t0);
  if (step_s_ <= 0) step_s_ = dt;
  update(step_s_, dt, dt);
  ++stats_.plain_steps;
  steps.push_back(gen.next(logits, s.history(), s.fits(1)));
}

double Speculator::draft_cost() const {
  if (step_s_ <= 0 || draft_s_ <= 0) return kPriorRowCost;
  return draft_s_ / step_s_;
}

int Speculator::draft_room(int room) {
  if (!drafter_ || room <= 0) return 0;
  if (!drafter_->costly() || !o_.adaptive) return room;
  int cap = choose(room, 0);
  if (cap == 0 && room >= std::max(1, o_.draft_min) && ++skipped_ >= kProbeEvery) cap = std::min(room, std::max(2, o_.draft_min));
  return cap;
}

int Speculator::propose(std::span<const int32_t> seq, int room, std::vector<int32_t>& out) {
  out.clear();
  if (!drafter_ || room <= 0) return 0;
  const auto t0 = Clock::now();
  const int cls = drafter_->draft(seq, room, out);
  if (!out.empty()) {
    const double per = seconds_since(t0) / double(out.size());
    update(draft_s_, per, per);
  }
  return cls;
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
  return kept;
}

void Speculator::round(Session& s, Generator& gen, int32_t pending, std::vector<Generator::Step>& steps) {
  if (!drafter_ || gen.done()) return plain(s, gen, pending, steps);
  const int64_t rounds = stats_.verify_steps + stats_.plain_steps;
  // Room: the drafts and the token after them fit (so every row's generator step fits as it would
  // one token at a time), and one append computes each row as single steps would.
  int room = std::min(o_.draft_max, s.max_draft_append() - 1);
  while (room > 0 && !s.fits(room + 2)) room = std::max(0, std::min(room / 2, room - 1));
  if (room <= 0 || (o_.adaptive && (step_s_ == 0 || rounds % kPlainEvery == kPlainEvery - 1)))
    return plain(s, gen, pending, steps);

  room = draft_room(room);
  if (room <= 0) return plain(s, gen, pending, steps);
  ctx_.assign(s.history().begin(), s.history().end());
  ctx_.push_back(pending);
  const int cls = propose(ctx_, room, drafts_);
  int k = drafter_->costly() ? (int(drafts_.size()) >= std::max(1, o_.draft_min) ? int(drafts_.size()) : 0)
                             : choose(int(drafts_.size()), cls);
  if (k == 0 && !drafts_.empty() && int(drafts_.size()) >= std::max(1, o_.draft_min) && ++skipped_ >= kProbeEvery)
    k = std::min<int>(int(drafts_.size()), 2);  // measure again now and then: the text may have changed
  if (k == 0) return plain(s, gen, pending, steps);
  skipped_ = 0;

  fed_.assign(1, pending);
  fed_.insert(fed_.end(), drafts_.begin(), drafts_.begin() + k);
  const size_t vocab = s.last_logits().size();
  const int64_t p0 = s.position();
  const auto t0 = Clock::now();
  std::span<float> rows = s.feed_draft(fed_);
  const double dt = seconds_since(t0);
  const int kept = verify(gen, rows, vocab, s.history(), p0, std::span<const int32_t>(drafts_).first(size_t(k)), cls, steps);
  s.commit_draft(kept + 1);
  // The first pass wider than any before grows the buffers it runs in: not a measurement.
  if (k + 1 > widest_) {
    widest_ = k + 1;
  } else if (step_s_ > 0) {
    update(cost_[size_t(k + 1)], std::max(1.0, dt / step_s_), cost(k + 1));
  }
}

}  // namespace ptllm
