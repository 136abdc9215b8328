#include "engine/eval.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>

#include "core/error.h"
#include "sample/sampler.h"

namespace ptllm {

namespace {

// ---- scoring -----------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// out[i] = log softmax(x)[i], in double (small KL values drown in float rounding).
// Returns false when the logits are not all finite (the seed's NaN bug class must not pass silently).
bool log_softmax(const float* x, int n, double* out) {
  const double mx = *std::max_element(x, x + n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  const double lse = mx + std::log(sum);
  if (!std::isfinite(lse)) return false;
  for (int i = 0; i < n; ++i) out[i] = double(x[i]) - lse;
  return std::all_of(out, out + n, [](double v) { return std::isfinite(v); });
}

// Means of nll grouped by bucket_of(position) -> [start, end].
template <typename BucketOf>
std::vector<NllBucket> grouped_means(std::span<const int32_t> positions, std::span<const double> nll, BucketOf bucket_of) {
  PTLLM_CHECK(positions.size() == nll.size());
  std::map<int, NllBucket> by_start;
  for (size_t i = 0; i < positions.size(); ++i) {
    const auto [start, end] = bucket_of(positions[i]);
    NllBucket& b = by_start[start];
    b.start = start;
    b.end = end;
    ++b.count;
    b.mean_nll += nll[i];
  }
  std::vector<NllBucket> out;
  for (auto& [start, b] : by_start) {
    b.mean_nll /= double(b.count);
    out.push_back(b);
  }
  return out;
}

}  // namespace

namespace {
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
}  // namespace

CacheSpec parse_cache_spec(std::string_view spec, const KVCacheConfig& base) {
  const std::string where = "cache spec '" + std::string(spec) + "': ";
  CacheSpec out{"", base};
  for (size_t i = 0; i < spec.size();) {  // the name: the tokens joined by single spaces
    if (is_space(spec[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < spec.size() && !is_space(spec[j])) ++j;
    (out.name += out.name.empty() ? "" : " ") += spec.substr(i, j - i);
    i = j;
  }
  if (out.name.empty()) throw UsageError("empty cache spec (known tokens: " + kv_config_tokens() + ")");
  try {
    out.kv = parse_kv_config(spec, base);
    sized_for(out.kv, 1).validate();
  } catch (const UsageError& e) {
    throw UsageError(where + e.what());
  }
  return out;
}

std::vector<CacheSpec> parse_cache_specs(std::string_view list, const KVCacheConfig& base) {
  std::vector<CacheSpec> out;
  size_t i = 0;
  while (i <= list.size()) {
    const size_t j = std::min(list.find(';', i), list.size());
    std::string_view entry = list.substr(i, j - i);
    while (!entry.empty() && is_space(entry.front())) entry.remove_prefix(1);
    while (!entry.empty() && is_space(entry.back())) entry.remove_suffix(1);
    if (!entry.empty()) out.push_back(parse_cache_spec(entry, base));
    i = j + 1;
  }
  if (out.empty()) throw UsageError("no cache configuration in '" + std::string(list) + "'");
  return out;
}

KVCacheConfig sized_for(KVCacheConfig kv, int tokens) {
  // validate() wants sink < ctx_size even under StreamingLLM, where the capacity is not used.
  if (kv.ctx_size == 0) kv.ctx_size = std::max(tokens, kv.sink + 1);
  return kv;
}

Evaluator::Evaluator(const Model& model, std::vector<CacheSpec> configs, ThreadPool& pool, const Model* baseline_model)
    : model_(model), baseline_model_(baseline_model ? *baseline_model : model), pool_(pool) {
  PTLLM_CHECK(baseline_model_.config().vocab_size == model_.config().vocab_size);
  for (auto& spec : configs) {
    ConfigRecord rec;
    rec.spec = std::move(spec);
    configs_.push_back(std::move(rec));
  }
}

void Evaluator::score_stream(std::span<const int32_t> ids, const FeedPlan& plan, int first_scored) {
  PTLLM_CHECK(plan.prefill >= 0 && plan.chunk >= 1 && first_scored >= 0 && !ids.empty());
  const int n = int(ids.size());
  const int V = model_.config().vocab_size;
  auto failed = [](const ConfigRecord& c, const std::string& what) {
    return Error("configuration '" + c.spec.name + "': " + what);
  };

  SessionOptions base_opts;  // fp32, the whole stream in the cache
  base_opts.kv.precision = KVPrecision::F32;
  base_opts.kv.ctx_size = n;
  Session base(baseline_model_, base_opts, pool_);
  std::vector<std::unique_ptr<Session>> sessions;
  for (const auto& c : configs_) {
    SessionOptions o;
    o.kv = sized_for(c.spec.kv, n);
    try {
      sessions.push_back(std::make_unique<Session>(model_, o, pool_));
    } catch (const Error& e) {
      throw failed(c, e.what());
    }
  }

  std::vector<std::span<float>> logits(configs_.size());
  // [V] baseline log p and p, configuration log p
  std::vector<double> lb(static_cast<size_t>(V)), pb(static_cast<size_t>(V)), lc(static_cast<size_t>(V));
  for (int i = 0; i < n;) {
    const int T = std::min(n - i, i == 0 && plan.prefill > 0 ? plan.prefill : plan.chunk);
    const auto tokens = ids.subspan(size_t(i), size_t(T));
    auto t0 = Clock::now();
    const std::span<float> base_logits = base.feed_all(tokens);
    base_seconds_ += seconds_since(t0);
    for (size_t k = 0; k < configs_.size(); ++k) {
      t0 = Clock::now();
      try {
        logits[k] = sessions[k]->feed_all(tokens);
      } catch (const Error& e) {
        throw failed(configs_[k], e.what());
      }
      configs_[k].seconds += seconds_since(t0);
    }
    for (int r = 0; r < T; ++r) {
      const int j = i + r;  // logits row j predicts token j + 1
      if (j < first_scored || j + 1 >= n) continue;
      const int32_t target = ids[size_t(j) + 1];
      const float* brow = base_logits.data() + size_t(r) * size_t(V);
      if (!log_softmax(brow, V, lb.data()))
        throw Error("the fp32 baseline produced non-finite logits at position " + std::to_string(j));
      for (int v = 0; v < V; ++v) pb[size_t(v)] = std::exp(lb[size_t(v)]);
      const int32_t base_top = argmax(std::span<const float>(brow, size_t(V)));
      positions_.push_back(j + 1);
      base_nll_.push_back(-lb[size_t(target)]);
      for (size_t k = 0; k < configs_.size(); ++k) {
        const float* crow = logits[k].data() + size_t(r) * size_t(V);
        if (!log_softmax(crow, V, lc.data()))
          throw failed(configs_[k], "non-finite logits at position " + std::to_string(j));
        double kl = 0;
        for (int v = 0; v < V; ++v) kl += pb[size_t(v)] * (lb[size_t(v)] - lc[size_t(v)]);
        ConfigRecord& rec = configs_[k];
        rec.nll.push_back(-lc[size_t(target)]);
        rec.kl.push_back(std::max(0.0, kl));  // KL >= 0; a nearly equal pair can round below
        rec.top1_same.push_back(argmax(std::span<const float>(crow, size_t(V))) == base_top);
      }
    }
    i += T;
    if (progress_) progress_(T);
  }
  for (size_t k = 0; k < configs_.size(); ++k) {
    const KVCache& kv = sessions[k]->cache();
    configs_[k].kv_logical_bytes = kv.logical_bytes();
    configs_[k].kv_physical_bytes = kv.physical_bytes();
    configs_[k].stored_tokens = kv.n_stored();
    configs_[k].kv_layers = kv_layer_report(kv);
  }
  ++streams_;
}

std::vector<NllBucket> nll_buckets(std::span<const int32_t> positions, std::span<const double> nll) {
  return grouped_means(positions, nll, [](int32_t p) {
    if (p < 512) return std::pair{0, 511};
    int start = 512;
    while (p >= 2 * start) start *= 2;
    return std::pair{start, 2 * start - 1};
  });
}

std::vector<NllBucket> nll_bins(std::span<const int32_t> positions, std::span<const double> nll, int width) {
  PTLLM_CHECK(width > 0);
  return grouped_means(positions, nll, [width](int32_t p) {
    const int start = p / width * width;
    return std::pair{start, start + width - 1};
  });
}

double mean(std::span<const double> v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

double quantile(std::vector<double> v, double q) {
  PTLLM_CHECK(!v.empty() && q >= 0 && q <= 1);
  std::sort(v.begin(), v.end());
  const double rank = q * double(v.size() - 1);
  const size_t lo = size_t(rank);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (rank - double(lo)) * (v[hi] - v[lo]);
}

ConfigSummary summarize(const ConfigRecord& c, const Evaluator& ev) {
  PTLLM_CHECK(!c.nll.empty() && c.nll.size() == ev.baseline_nll().size());
  ConfigSummary s;
  const double base_nll = mean(ev.baseline_nll());
  s.mean_nll = mean(c.nll);
  s.ppl = std::exp(s.mean_nll);
  s.delta_nll = s.mean_nll - base_nll;
  s.delta_ppl_pct = (std::exp(s.delta_nll) - 1) * 100;  // ppl / base_ppl - 1
  s.kl_mean = mean(c.kl);
  s.kl_median = quantile(c.kl, 0.5);
  s.kl_p99 = quantile(c.kl, 0.99);
  s.kl_max = *std::max_element(c.kl.begin(), c.kl.end());
  s.top1_agreement = double(std::count(c.top1_same.begin(), c.top1_same.end(), 1)) / double(c.top1_same.size());
  s.buckets = nll_buckets(ev.positions(), c.nll);
  return s;
}

std::vector<int32_t> greedy_tokens(const Model& model, const KVCacheConfig& kv, std::span<const int32_t> prompt, int n,
                                   ThreadPool& pool) {
  PTLLM_CHECK(!prompt.empty() && n >= 0);
  SessionOptions o;
  o.kv = sized_for(kv, int(prompt.size()) + n);
  Session s(model, o, pool);
  std::vector<int32_t> out;
  if (n == 0) return out;
  std::span<float> logits = s.feed(prompt);
  for (int i = 0; i < n; ++i) {
    const int32_t next = argmax(logits);
    out.push_back(next);
    if (i + 1 < n) logits = s.feed({&next, 1});
  }
  return out;
}

double prefix_match_pct(std::span<const int32_t> want, std::span<const int32_t> got) {
  if (want.empty()) return 100.0;
  const auto diff = std::mismatch(want.begin(), want.end(), got.begin(), got.end()).first;
  return 100.0 * double(diff - want.begin()) / double(want.size());
}

std::vector<std::string> split_documents(std::string_view text) {
  std::vector<std::string> docs;
  std::string cur;
  auto flush = [&] {
    if (!std::all_of(cur.begin(), cur.end(), is_space)) docs.push_back(cur);
    cur.clear();
  };
  size_t i = 0;
  while (i < text.size()) {
    const size_t nl = text.find('\n', i);
    const size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
    const std::string_view line = text.substr(i, end - i);
    if (line == "\x1e" || line == "\x1e\n" || line == "\x1e\r\n")
      flush();
    else
      cur += line;
    i = end;
  }
  flush();
  return docs;
}

}  // namespace ptllm
