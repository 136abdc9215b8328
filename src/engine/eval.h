#pragma once
// Quality of a KV-cache configuration, measured through the cached path: the text is fed
// teacher-forced the way generation feeds it (a prefill, then one token or one chunk per step), and
// every prediction is compared with the fp32 full-cache baseline of the same run. The baseline and
// each configuration run their own Session in lockstep, so the baseline's next-token distribution is
// compared position by position without being stored ([tokens][vocab] would not fit for big vocabs).
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/kv_report.h"
#include "engine/session.h"

namespace ptllm {

// A named cache configuration. kv.ctx_size == 0: sized for each stream, so the whole text fits.
struct CacheSpec {
  std::string name;  // the spec as written (tokens joined by single spaces), or describe() of the flags
  KVCacheConfig kv;
};

// Space-separated tokens applied on top of `base` (the command-line flags): a precision (fp32 fp16
// bf16 int8 int4 int2), g<N> (group size), r<N> (KIVI residual), sink<N> and w<N> (StreamingLLM),
// pos=absolute|cache. E.g. "int4 g32 r128", "int4 sink4 w508 pos=cache". Throws UsageError naming
// the token (unknown, bad value, a setting given twice) or the invalid combination.
CacheSpec parse_cache_spec(std::string_view spec, const KVCacheConfig& base);
// Specs separated by ';'; empty entries are skipped, none at all is a UsageError.
std::vector<CacheSpec> parse_cache_specs(std::string_view list, const KVCacheConfig& base);
// kv with ctx_size 0 ("sized for each stream") given the capacity for `tokens` tokens.
KVCacheConfig sized_for(KVCacheConfig kv, int tokens);

// How a stream is fed: one batched pass of `prefill` tokens (0: none), then `chunk` tokens per step.
struct FeedPlan {
  int prefill = 0;
  int chunk = 1;
};

// A configuration's records, one per prediction, in the order of Evaluator::positions().
struct ConfigRecord {
  CacheSpec spec;
  std::vector<double> nll;         // [n] next-token NLL (nats)
  std::vector<double> kl;          // [n] KL(baseline || configuration) of the next-token distributions
  std::vector<uint8_t> top1_same;  // [n] 1 when the argmax equals the baseline's
  // The cache at the end of the last stream scored.
  size_t kv_logical_bytes = 0;
  size_t kv_physical_bytes = 0;
  int stored_tokens = 0;
  KVLayerReport kv_layers;  // which layers store K/V, the bytes of each
  double seconds = 0;  // in this configuration's forward passes
};

class Evaluator {
 public:
  // baseline_model: the model the fp32 full-cache baseline runs (null: `model` itself), e.g. the
  // bf16 original of a quantized `model`, so that the KL and the top-1 agreement measure the weights'
  // quantization and the cache's together. Its vocabulary must be `model`'s.
  Evaluator(const Model& model, std::vector<CacheSpec> configs, ThreadPool& pool,
            const Model* baseline_model = nullptr);

  // Feeds all of `ids` (token 0 included: a BOS is the caller's choice) to the baseline and to every
  // configuration, each in a fresh Session, and scores the predictions of tokens first_scored+1 ..
  // n-1 (llama.cpp's perplexity scores only a chunk's second half). Throws Error naming the
  // configuration when its Session fails (context full) or its logits are not finite.
  void score_stream(std::span<const int32_t> ids, const FeedPlan& plan, int first_scored = 0);
  // Called by score_stream after each step with the tokens that step fed (for progress reports).
  void set_progress(std::function<void(int tokens)> fn) { progress_ = std::move(fn); }

  // [n] position of each predicted token within its stream (1 .. stream length - 1).
  const std::vector<int32_t>& positions() const { return positions_; }
  const std::vector<double>& baseline_nll() const { return base_nll_; }  // [n]
  double baseline_seconds() const { return base_seconds_; }
  const std::vector<ConfigRecord>& configs() const { return configs_; }
  size_t streams() const { return streams_; }

 private:
  const Model& model_;
  const Model& baseline_model_;
  ThreadPool& pool_;
  std::vector<ConfigRecord> configs_;
  std::vector<int32_t> positions_;
  std::vector<double> base_nll_;
  double base_seconds_ = 0;
  size_t streams_ = 0;
  std::function<void(int)> progress_;
};

// Mean NLL over a range of positions, both ends inclusive.
struct NllBucket {
  int start = 0;
  int end = 0;
  size_t count = 0;
  double mean_nll = 0;
};
// Buckets 0-511, 512-1023, 1024-2047, 2048-4095, ... (each twice the last), those holding a prediction.
std::vector<NllBucket> nll_buckets(std::span<const int32_t> positions, std::span<const double> nll);
// Means over bins [k*width, (k+1)*width - 1] (the plot's points), those holding a prediction.
std::vector<NllBucket> nll_bins(std::span<const int32_t> positions, std::span<const double> nll, int width);

double mean(std::span<const double> v);
// q in [0, 1], linear interpolation between closest ranks (numpy's default). v must not be empty.
double quantile(std::vector<double> v, double q);

// What the report prints for one configuration.
struct ConfigSummary {
  double mean_nll = 0, ppl = 0;
  double delta_nll = 0, delta_ppl_pct = 0;  // vs the baseline
  double kl_mean = 0, kl_median = 0, kl_p99 = 0, kl_max = 0;
  double top1_agreement = 0;  // fraction of predictions, 0..1
  std::vector<NllBucket> buckets;
};
ConfigSummary summarize(const ConfigRecord& c, const Evaluator& ev);

// Greedy continuation of `prompt` for n tokens (EOS is not special: both runs compare n tokens):
// the prompt in one batched pass, then one token per step. kv.ctx_size == 0: prompt + n.
std::vector<int32_t> greedy_tokens(const Model& model, const KVCacheConfig& kv, std::span<const int32_t> prompt, int n,
                                   ThreadPool& pool);
// Percentage of `want` that `got` reproduces before the first difference (the seed's greedy prefix match).
double prefix_match_pct(std::span<const int32_t> want, std::span<const int32_t> got);

// The documents of a file that separates them with a record-separator line ("\x1e", as ../shared/corpus
// does); a document keeps its last newline; blank documents are dropped.
std::vector<std::string> split_documents(std::string_view text);

}  // namespace ptllm
