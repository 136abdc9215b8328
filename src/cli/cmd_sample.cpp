// posttrainllm sample: generate text from a prompt, streamed to stdout; stats on stderr.
#include <signal.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/block_cache.h"
#include "cli/commands.h"
#include "cli/generation.h"
#include "cli/options.h"
#include "cli/output.h"
#include "cli/speculation.h"
#include "engine/runtime.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/thread_pool.h"
#include "engine/prompt_cache.h"
#include "engine/session.h"
#include "model/model.h"
#include "engine/conversation.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

namespace ptllm::cli {

namespace {

struct SampleArgs {
  std::string model_dir;
  std::string prompt;
  std::string prompt_file;
  CLI::Option* prompt_opt = nullptr;
  CLI::Option* file_opt = nullptr;
  bool escape = false;
  std::vector<std::string> stops;
  int tokens = 128;
  bool ignore_eos = false;
  std::string seed = "-1";  // -1 = random
  bool json = false;
  bool quiet = false;  // no model:, load:, prompt cache or footer lines (warnings stay)
  SamplingConfig sampling;
  GrammarArgs grammar;
  std::shared_ptr<const ConstraintSpec> constraint;
  RuntimeOptions runtime;
  std::string cache_prompt;
  std::string prompt_cache_dir;
  double prompt_cache_max_mb = 0;
  SpecArgs spec;
  SpecOptions spec_opts;  // validated from spec before the model loads
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

void report_cache_load(const PromptCacheLoad& r, bool quiet) {
  for (const std::string& w : r.warnings) std::fprintf(stderr, "warning: prompt cache: %s\n", w.c_str());
  if (quiet) return;
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

void report_cache_save(const PromptCacheSave& r, bool quiet) {
  for (const std::string& w : r.warnings) std::fprintf(stderr, "warning: prompt cache: %s\n", w.c_str());
  if (quiet) return;
  for (const auto& s : r.saved)
    std::fprintf(stderr, "prompt cache: saved %lld tokens to %s (%s written)\n", (long long)s.tokens, s.path.c_str(),
                 format_bytes(s.bytes).c_str());
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

// The prompt text: --prompt, or -f FILE ("-" = standard input) without its final newline (as llama.cpp).
std::string read_prompt(const SampleArgs& a) {
  if (a.prompt_opt->count() == 0 && a.file_opt->count() == 0)
    throw UsageError("give the prompt: -p TEXT, or -f FILE (- for standard input)");
  std::string text = a.prompt;
  if (a.file_opt->count()) {
    if (a.prompt_file == "-") {
      text = read_standard_input(kMaxTextBytes, "a prompt (--file -)");
    } else {
      std::error_code ec;
      if (!std::filesystem::exists(a.prompt_file, ec))
        throw Error(a.prompt_file + ": cannot open the prompt file (--file)");
      text = read_whole_file(a.prompt_file, kMaxTextBytes, "a prompt file (--file)");
    }
    if (!text.empty() && text.back() == '\n') text.pop_back();
  }
  return a.escape ? process_escapes(text) : text;
}


struct Generation : GeneratedText {
  StepRate rate;
  SpecStats spec;
};

struct Timing {
  double load_ms = 0;
  double prefill_ms = 0;
};

// The decode loop: samples from `logits` (the prompt's), streams text to stdout unless --json.
Generation generate(const SampleArgs& a, Session& session, const Tokenizer& tok, std::vector<int32_t> eos_ids,
                    std::span<float> logits, Clock::time_point t_prefill) {
  const auto t_decode = Clock::now();  // a grammar's vocabulary is built with the generator: its time counts
  GeneratorOptions o;
  o.sampling = a.sampling;
  o.stops = a.stops;
  o.eos_ids = std::move(eos_ids);
  o.ignore_eos = a.ignore_eos;
  o.max_tokens = a.tokens;
  o.constraint = a.constraint;
  Generator gen(tok, std::move(o));
  Speculator spec(a.spec_opts);
  Generation g;
  TextStream out(g, a.json);
  std::vector<Generator::Step> steps;
  // Each round feeds the last accepted id (and drafts after it, verified in the same pass) and
  // yields one step or more (engine/speculative.h).
  for (int i = 0; i < a.tokens && !gen.done();) {
    if (interrupted() || out.closed()) {
      gen.stop(interrupted() ? StopReason::Interrupted : StopReason::OutputClosed);
      break;
    }
    if (i == 0) {
      steps.assign(1, gen.next(logits, session.history(), session.fits(1)));
      g.ttft_ms = ms_since(t_prefill);
      g.rate.start();
    } else {
      const int32_t pending = steps.back().id;
      steps.clear();
      spec.round(session, gen, pending, steps);
    }
    for (const Generator::Step& st : steps) {
      out.emit(st.text);
      if (i++ > 0) g.rate.step();
    }
  }
  out.end(gen);
  g.decode_ms = ms_since(t_decode);
  g.spec = spec.stats();
  return g;
}

std::string stop_line(const SampleArgs& a, const Session& session, const Generation& g) {
  return "stopped: " + stop_reason_text(g.reason, g.stop_string, a.tokens, session.options().kv.ctx_size);
}

double decode_tok_s(const Generation& g, const Timing& t) {
  const int steps = std::max(0, g.sampled - 1);
  return steps > 0 ? steps / ((g.decode_ms - (g.ttft_ms - t.prefill_ms)) / 1000) : 0.0;
}

std::string kv_line(const Session& session) {
  const SessionOptions& so = session.options();
  if (!so.use_cache) return "kv cache: none (--no-cache: the whole sequence recomputed every step)";
  const KVCache& kv = session.cache();
  std::string stored = "stored " + std::to_string(kv.n_stored()) + " tokens";
  if (kv.n_stored() != kv.n_tokens())
    stored = "stored " + std::to_string(kv.n_stored()) + " of " + std::to_string(kv.n_tokens()) +
             (kv.config().streaming() ? " (StreamingLLM cap)" : " (sliding window)");
  return "kv cache: " + so.kv.describe() + ", " + stored + ", logical " + format_bytes(kv.logical_bytes()) +
         ", physical " + format_bytes(kv.physical_bytes()) + " (" + (so.kv.preallocate ? "preallocated" : "on demand") +
         (so.kv.streaming() ? "" : ", ctx " + std::to_string(so.kv.ctx_size)) + ")";
}

// The footer after the text: what a user compares with llama.cpp and mlx-lm (model: and load: came
// before the generation).
void print_footer(const SampleArgs& a, const Session& session, size_t prompt_tokens, const Generation& g,
                  const Timing& t) {
  std::fprintf(stderr, "\n%s\n", stop_line(a, session, g).c_str());
  std::fprintf(stderr, "prompt: %zu tokens, prefill %.1f tok/s, time to first token %.1f ms\n", prompt_tokens,
               double(prompt_tokens) / (t.prefill_ms / 1000), g.ttft_ms);
  std::fprintf(stderr, "decode: %d tokens, %.1f tok/s\n", g.sampled, decode_tok_s(g, t));
  if (g.rate.steps() >= 2 * StepRate::kSpan)
    std::fprintf(stderr, "decode speed: steps 1-%d %.1f tok/s, steps %d-%d %.1f tok/s\n", StepRate::kSpan,
                 g.rate.first_tok_s(), g.rate.steps() - StepRate::kSpan + 1, g.rate.steps(), g.rate.last_tok_s());
  if (const std::string sl = spec_line(a.spec_opts, g.spec); !sl.empty()) std::fprintf(stderr, "%s\n", sl.c_str());
  std::fprintf(stderr, "%s\n", kv_line(session).c_str());
  if (session.has_cache() && session.cache().shape().any_shared())
    std::fprintf(stderr, "%s\n", kv_layers_line(kv_layer_report(session.cache())).c_str());
}

void print_json(const SampleArgs& a, const std::filesystem::path& dir, const Session& session, size_t prompt_tokens,
                const Generation& g, const Timing& t) {
  nlohmann::json j = {{"model", dir.string()},
                      {"seed", a.sampling.seed},
                      {"prompt_tokens", prompt_tokens},
                      {"text", g.text},
                      {"tokens", g.tokens},
                      {"stop_reason", stop_reason_key(g.reason)}};
  if (g.reason == StopReason::StopString) j["stop_string"] = g.stop_string;
  j["timings"] = {{"load_ms", t.load_ms},
                  {"prefill_ms", t.prefill_ms},
                  {"ttft_ms", g.ttft_ms},
                  {"decode_ms", g.decode_ms},
                  {"prefill_tok_s", double(prompt_tokens) / (t.prefill_ms / 1000)},
                  {"decode_tokens", g.sampled},
                  {"decode_tok_s", decode_tok_s(g, t)}};
  j["speculative"] = spec_json(a.spec_opts, g.spec);
  const SessionOptions& so = session.options();
  if (so.use_cache) {
    const KVCache& kv = session.cache();
    j["kv_cache"] = {{"config", so.kv.describe()},        {"stored_tokens", kv.n_stored()},
                     {"tokens", kv.n_tokens()},           {"logical_bytes", kv.logical_bytes()},
                     {"physical_bytes", kv.physical_bytes()}, {"preallocated", so.kv.preallocate},
                     {"ctx_size", so.kv.ctx_size},        {"layers", kv_layers_json(kv_layer_report(kv))}};
  } else {
    j["kv_cache"] = nullptr;
  }
  // The JSON carries the text: no escape may be lost, invalid UTF-8 from a byte-level model included.
  write_stdout(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

// The prompt's ids; warns when the text already begins with BOS and the tokenizer adds it again.
std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids = tok.encode(text);
  if (ids.empty()) throw UsageError("the prompt encodes to no tokens; give -p or -f some text");
  const auto bos = tok.bos_id();
  if (bos && ids.size() >= 2 && ids[0] == *bos && ids[1] == *bos)
    std::fprintf(stderr,
                 "warning: the prompt begins with the BOS token %s and the tokenizer adds BOS again: the model "
                 "sees two BOS tokens (remove it from the prompt)\n",
                 tok.id_to_token(*bos).value_or("?").c_str());
  return ids;
}

int run_sample(SampleArgs& a) {
  a.spec_opts = spec_options(a.spec);
  if (a.spec_opts.type != SpecType::None && a.runtime.no_cache)
    throw UsageError("--spec-type " + a.spec.type + " verifies drafts against the KV cache: it cannot be combined with --no-cache");
  const std::string prompt_text = read_prompt(a);
  a.constraint = grammar_constraint(a.grammar);
  if (a.escape)
    for (std::string& s : a.stops) s = process_escapes(s);
  Timing t;
  const auto t_load = Clock::now();
  const std::filesystem::path dir = a.model_dir.empty() ? default_model_dir() : std::filesystem::path(a.model_dir);
  Runtime rt({dir, resolve_threads(a.runtime), true});
  const Model& model = rt.model();
  const Tokenizer& tok = rt.tokenizer();
  const ModelConfig& cfg = model.config();
  SessionOptions sopts = make_session_options(a.runtime, cfg);
  ThreadPool& pool = rt.pool();
  // --cache-prompt FILE (one whole-state file) wins over --prompt-cache-dir (serve's block store).
  BlockPromptCache blocks = open_block_prompt_cache(a.cache_prompt.empty() ? a.prompt_cache_dir : std::string(),
                                                    a.prompt_cache_max_mb, model, tok, sopts.kv);
  Session session(model, sopts, pool, blocks.pool());
  const auto draft = load_draft_model(a.spec, a.spec_opts, tok, dir.string(), pool, sopts.kv.ctx_size);
  t.load_ms = ms_since(t_load);

  const std::vector<int32_t> prompt = encode_prompt(tok, prompt_text);
  if (!session.fits(int64_t(prompt.size())))  // never under StreamingLLM or a model whose every layer slides
    throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens, more than --ctx-size " +
                std::to_string(sopts.kv.ctx_size));
  a.sampling.seed = a.seed == "-1" ? uint64_t(std::random_device{}()) : std::stoull(a.seed);
  if (!a.quiet) {
    std::fprintf(stderr, "model: %s (%s, %s), %d threads, seed %llu\n", dir.string().c_str(),
                 cfg.arch_name.c_str(), weights_text(model).c_str(), pool.size(),
                 static_cast<unsigned long long>(a.sampling.seed));
    std::fprintf(stderr, "load: %.1f ms\n", t.load_ms);
  }

  SigintGuard sigint;
  const auto t_prefill = Clock::now();
  const PromptCacheOptions pc_opts{a.cache_prompt};
  std::unique_ptr<PromptCache> prompt_cache;
  std::vector<float> first_logits;  // a restored state's logits, sampled as the cold run samples its own
  std::span<float> logits;
  if (pc_opts.enabled()) {
    prompt_cache = std::make_unique<PromptCache>(pc_opts, prompt_cache_identity(model, tok, sopts.kv));
    report_cache_load(prompt_cache->prefill(session, prompt), a.quiet);
    first_logits.assign(session.last_logits().begin(), session.last_logits().end());
    logits = first_logits;
  } else if (blocks.cache) {
    report_block_load(blocks.cache->prefill(session, prompt), blocks.root, a.quiet);
    first_logits.assign(session.last_logits().begin(), session.last_logits().end());
    logits = first_logits;
  } else {
    logits = session.feed(prompt);
  }
  t.prefill_ms = ms_since(t_prefill);
  const Generation g = generate(a, session, tok, stop_token_ids(dir, cfg, tok), logits, t_prefill);
  if (prompt_cache) report_cache_save(prompt_cache->finish(), a.quiet);
  if (blocks.cache) report_block_save(blocks.cache->finish(session), blocks.root, a.quiet);
  if (!a.quiet) print_footer(a, session, prompt.size(), g, t);
  if (a.json) print_json(a, dir, session, prompt.size(), g, t);
  return g.reason == StopReason::Interrupted ? 130 : 0;
}

}  // namespace

Command add_sample_command(CLI::App& root) {
  auto a = std::make_shared<SampleArgs>();
  CLI::App* app = root.add_subcommand("sample", "Generate text from a prompt");
  add_model_option(*app, a->model_dir, "Hugging Face model directory or .gguf file (default: the shipped models/kjv-tiny)");
  a->prompt_opt = app->add_option("--prompt,-p", a->prompt, "Prompt text");
  a->file_opt = app->add_option("--file,-f", a->prompt_file,
                                "Read the prompt from FILE (- = standard input; one final newline dropped)")
                    ->excludes(a->prompt_opt);
  app->add_flag("--escape,-e", a->escape, "Process escapes (\\n \\r \\t \\' \\\" \\\\ \\xHH) in the prompt and --stop");
  app->add_option("--stop", a->stops,
                  "Stop when the generated text contains STR; the text is printed up to it (repeatable)")
      ->check(CLI::Validator([](std::string& s) { return s.empty() ? std::string("an empty stop string") : ""; }, ""))
      ->default_str("");
  app->add_option("--tokens,-n", a->tokens, "Tokens to generate (fewer at EOS, a stop string, a full context)")
      ->check(integer_at_least(0));
  add_sampling_options(*app, a->sampling);
  add_grammar_options(*app, a->grammar);
  app->add_option("--seed,-s", a->seed, "RNG seed (-1 = random, printed in the footer)")
      ->check(CLI::Validator([](std::string& s) { return s == "-1" ? std::string() : unsigned_integer()(s); }, ""))
      ->type_name("INT");
  app->add_flag("--ignore-eos", a->ignore_eos, "Keep generating after EOS (EOS stays in the sequence)");
  app->add_flag("--json", a->json,
                "Print one JSON object on stdout (text, token ids, timings, stop reason, KV cache) instead of "
                "the streamed text");
  app->add_flag("--quiet,-q", a->quiet,
                "Only the text (or the JSON) and warnings: no model:, load:, prompt cache or footer lines on stderr");
  add_runtime_options(*app, a->runtime);
  add_spec_options(*app, a->spec);
  CLI::Option* no_cache = app->get_option("--no-cache");
  app->add_option("--cache-prompt", a->cache_prompt,
                  "Prompt cache file: reuse the state it holds for this prompt (or a prefix of it), then save "
                  "the prompt's state to it (wins over --prompt-cache-dir)")
      ->excludes(no_cache);
  CLI::Option* dir = app->add_option("--prompt-cache-dir", a->prompt_cache_dir,
                                     "Prompt cache directory (the block store of serve --prompt-cache-dir): reuse "
                                     "the prompt's longest cached prefix, save its blocks")
                         ->excludes(no_cache);
  app->add_option("--prompt-cache-max-mb", a->prompt_cache_max_mb,
                  "Keep --prompt-cache-dir under N MiB, removing least recently used blocks (default 1024)")
      ->check(number_at_least(0, /*exclusive=*/true))
      ->needs(dir);
  return {app, [a] { return run_sample(*a); }};
}

}  // namespace ptllm::cli
