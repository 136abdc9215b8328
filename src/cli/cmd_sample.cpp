// posttrainllm sample: generate text from a prompt, streamed to stdout; stats on stderr.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/prompt_cache.h"
#include "engine/session.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

namespace ptllm::cli {

namespace {

struct SampleArgs {
  std::string model_dir;
  std::string prompt;
  int tokens = 128;
  bool ignore_eos = false;
  bool seed_given = false;
  SamplingConfig sampling;
  RuntimeOptions runtime;
  std::string cache_prompt;
  std::string prompt_cache_dir;
  double prompt_cache_max_mb = 0;
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

void report_cache_load(const PromptCacheLoad& r) {
  for (const std::string& w : r.warnings) std::fprintf(stderr, "warning: prompt cache: %s\n", w.c_str());
  const std::string read = format_bytes(r.bytes_read);
  if (r.outcome == PromptCacheOutcome::Hit)
    std::fprintf(stderr, "prompt cache: hit, %lld tokens reused from %s (%s read)\n", (long long)r.reused,
                 r.file.c_str(), read.c_str());
  else if (r.outcome == PromptCacheOutcome::PartialHit)
    std::fprintf(stderr, "prompt cache: partial hit, %lld of %lld tokens reused from %s (%s read), %lld prefilled\n",
                 (long long)r.reused, (long long)r.prompt, r.file.c_str(), read.c_str(), (long long)(r.prompt - r.reused));
  else
    std::fprintf(stderr, "prompt cache: miss, %lld tokens prefilled\n", (long long)r.prompt);
}

void report_cache_save(const PromptCacheSave& r) {
  for (const std::string& w : r.warnings) std::fprintf(stderr, "warning: prompt cache: %s\n", w.c_str());
  for (const auto& s : r.saved)
    std::fprintf(stderr, "prompt cache: saved %lld tokens to %s (%s written)\n", (long long)s.tokens, s.path.c_str(),
                 format_bytes(s.bytes).c_str());
  const auto entries = std::count_if(r.pruned.removed.begin(), r.pruned.removed.end(),
                                     [](const std::filesystem::path& p) { return p.extension() == ".kvcache"; });
  if (entries > 0)
    std::fprintf(stderr, "prompt cache: removed %lld least recently used entries (%s) to stay under --prompt-cache-max-mb\n",
                 (long long)entries, format_bytes(r.pruned.bytes_freed).c_str());
}

// Decode speed over the first and the last kSpan steps of a long generation (under StreamingLLM the
// two should match: the window bounds the attention cost). A fixed ring of time points: no memory
// grows with the number of steps.
class StepRate {
 public:
  static constexpr int kSpan = 500;
  void start() { ring_[0] = Clock::now(); }
  void step() {
    ++steps_;
    ring_[size_t(steps_ % (kSpan + 1))] = Clock::now();
    if (steps_ == kSpan) first_s_ = seconds(ring_[size_t(kSpan)] - ring_[0]);
  }
  int steps() const { return steps_; }
  double first_tok_s() const { return kSpan / first_s_; }
  // Only meaningful once steps() >= kSpan: the newest point minus the one kSpan steps earlier.
  double last_tok_s() const {
    const auto newest = ring_[size_t(steps_ % (kSpan + 1))];
    const auto oldest = ring_[size_t((steps_ + 1) % (kSpan + 1))];
    return kSpan / seconds(newest - oldest);
  }

 private:
  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  std::array<Clock::time_point, kSpan + 1> ring_{};
  int steps_ = 0;
  double first_s_ = 0;
};

int run_sample(SampleArgs& a) {
  const auto t_load = Clock::now();
  const std::filesystem::path dir = a.model_dir.empty() ? default_model_dir() : std::filesystem::path(a.model_dir);
  auto model = Model::load(dir);
  Tokenizer tok = Tokenizer::load(dir);
  const ModelConfig& cfg = model->config();
  SessionOptions sopts = make_session_options(a.runtime, cfg);
  ThreadPool pool(resolve_threads(a.runtime));
  Session session(*model, sopts, pool);
  const double load_ms = ms_since(t_load);

  std::vector<int32_t> prompt = tok.encode(a.prompt);
  if (prompt.empty()) throw UsageError("the prompt encodes to no tokens; give --prompt some text");
  if (!session.fits(int64_t(prompt.size())))  // never under StreamingLLM or a model whose every layer slides
    throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens, more than --ctx-size " +
                std::to_string(sopts.kv.ctx_size));
  if (!a.seed_given) a.sampling.seed = std::random_device{}();
  Sampler sampler(a.sampling);
  StreamingDetokenizer detok(tok);
  auto is_eos = [&](int32_t id) {
    for (int e : cfg.eos_token_ids)
      if (id == e) return true;
    return tok.eos_id() && *tok.eos_id() == id;
  };

  const auto t_prefill = Clock::now();
  const PromptCacheOptions pc_opts{a.cache_prompt, a.prompt_cache_dir,
                                   uint64_t(a.prompt_cache_max_mb * 1024 * 1024)};
  std::unique_ptr<PromptCache> prompt_cache;
  std::vector<float> first_logits;  // a restored state's logits, sampled as the cold run samples its own
  std::span<float> logits;
  if (pc_opts.enabled()) {
    prompt_cache = std::make_unique<PromptCache>(pc_opts, prompt_cache_identity(*model, tok, sopts.kv), tok);
    report_cache_load(prompt_cache->prefill(session, prompt));
    first_logits.assign(session.last_logits().begin(), session.last_logits().end());
    logits = first_logits;
  } else {
    logits = session.feed(prompt);
  }
  const double prefill_ms = ms_since(t_prefill);
  double ttft_ms = 0;
  int generated = 0;
  std::string stop_note;
  const auto t_decode = Clock::now();
  StepRate rate;
  for (int i = 0; i < a.tokens; ++i) {
    const int32_t next = sampler.sample(logits, session.history());
    if (i == 0) ttft_ms = ms_since(t_prefill);
    ++generated;
    if (is_eos(next) && !a.ignore_eos) break;
    std::string piece = detok.push(next);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (i + 1 == a.tokens) break;
    if (!session.fits(1)) {
      stop_note = "stopped: the context is full (" + std::to_string(sopts.kv.ctx_size) + " tokens, --ctx-size)";
      break;
    }
    if (i == 0) rate.start();
    logits = session.feed({&next, 1});
    rate.step();
  }
  std::string rest = detok.finish();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const double decode_ms = ms_since(t_decode);
  if (prompt_cache) report_cache_save(prompt_cache->finish());

  // Footer: what a user compares with llama.cpp and mlx-lm.
  const int decode_steps = std::max(0, generated - 1);
  std::fprintf(stderr, "\n");
  if (!stop_note.empty()) std::fprintf(stderr, "%s\n", stop_note.c_str());
  std::fprintf(stderr, "model: %s (%s, %s weights), %d threads, seed %llu\n", dir.string().c_str(),
               cfg.arch_name.c_str(), format_bytes(model->weight_bytes()).c_str(), pool.size(),
               static_cast<unsigned long long>(a.sampling.seed));
  std::fprintf(stderr, "load: %.1f ms\n", load_ms);
  std::fprintf(stderr, "prompt: %zu tokens, prefill %.1f tok/s, time to first token %.1f ms\n", prompt.size(),
               double(prompt.size()) / (prefill_ms / 1000), ttft_ms);
  std::fprintf(stderr, "decode: %d tokens, %.1f tok/s\n", generated,
               decode_steps > 0 ? decode_steps / ((decode_ms - (ttft_ms - prefill_ms)) / 1000) : 0.0);
  if (rate.steps() >= 2 * StepRate::kSpan)
    std::fprintf(stderr, "decode speed: steps 1-%d %.1f tok/s, steps %d-%d %.1f tok/s\n", StepRate::kSpan,
                 rate.first_tok_s(), rate.steps() - StepRate::kSpan + 1, rate.steps(), rate.last_tok_s());
  if (sopts.use_cache) {
    const KVCache& kv = session.cache();
    std::string stored = "stored " + std::to_string(kv.n_stored()) + " tokens";
    if (kv.n_stored() != kv.n_tokens())
      stored = "stored " + std::to_string(kv.n_stored()) + " of " + std::to_string(kv.n_tokens()) +
               (kv.config().streaming() ? " (StreamingLLM cap)" : " (sliding window)");
    std::fprintf(stderr, "kv cache: %s, %s, logical %s, physical %s (%s%s)\n", sopts.kv.describe().c_str(),
                 stored.c_str(), format_bytes(kv.logical_bytes()).c_str(), format_bytes(kv.physical_bytes()).c_str(),
                 sopts.kv.preallocate ? "preallocated" : "on demand",
                 sopts.kv.streaming() ? "" : (", ctx " + std::to_string(sopts.kv.ctx_size)).c_str());
  } else {
    std::fprintf(stderr, "kv cache: none (--no-cache: the whole sequence recomputed every step)\n");
  }
  return 0;
}

}  // namespace

Command add_sample_command(CLI::App& root) {
  auto a = std::make_shared<SampleArgs>();
  CLI::App* app = root.add_subcommand("sample", "Generate text from a prompt");
  app->add_option("model_dir", a->model_dir, "Hugging Face model directory (default: the shipped models/kjv-tiny)");
  app->add_option("--prompt,-p", a->prompt, "Prompt text")->required();
  app->add_option("--tokens,-n", a->tokens, "Tokens to generate")->check(CLI::NonNegativeNumber);
  app->add_option("--temperature,--temp", a->sampling.temperature, "Sampling temperature (0 = greedy)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--top-k", a->sampling.top_k, "Keep the K most likely tokens (0 = off)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--top-p", a->sampling.top_p, "Nucleus sampling threshold (1 = off)")->check(CLI::Range(0.0, 1.0));
  app->add_option("--min-p", a->sampling.min_p, "Drop tokens below P times the top probability (0 = off)")
      ->check(CLI::Range(0.0, 1.0));
  app->add_option("--repeat-penalty", a->sampling.repeat_penalty, "Penalty for recent tokens (1 = off)")
      ->check(CLI::PositiveNumber);
  app->add_option("--repeat-last-n", a->sampling.repeat_last_n, "Tokens the penalty looks back over (-1 = all)")
      ->check(CLI::Range(-1, 1 << 30));
  app->add_option("--seed,-s", a->sampling.seed, "RNG seed (default: random, printed)")
      ->each([a](const std::string&) { a->seed_given = true; });
  app->add_flag("--ignore-eos", a->ignore_eos, "Keep generating after EOS (EOS stays in the sequence)");
  add_runtime_options(*app, a->runtime);
  CLI::Option* no_cache = app->get_option("--no-cache");
  app->add_option("--cache-prompt", a->cache_prompt,
                  "Prompt cache file: reuse the state it holds for this prompt (or a prefix of it), then save "
                  "the prompt's state to it (wins over --prompt-cache-dir)")
      ->excludes(no_cache);
  CLI::Option* dir = app->add_option("--prompt-cache-dir", a->prompt_cache_dir,
                                     "Prompt cache directory: reuse the longest cached prefix of the prompt, save "
                                     "the prompt's state")
                         ->excludes(no_cache);
  app->add_option("--prompt-cache-max-mb", a->prompt_cache_max_mb,
                  "Keep --prompt-cache-dir under N MiB, removing least recently used entries")
      ->check(CLI::PositiveNumber)
      ->needs(dir);
  return {app, [a] { return run_sample(*a); }};
}

}  // namespace ptllm::cli
