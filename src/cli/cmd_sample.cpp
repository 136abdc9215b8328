// posttrainllm sample: generate text from a prompt, streamed to stdout; stats on stderr.
#include <chrono>
#include <cstdio>
#include <random>
#include <string>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/thread_pool.h"
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
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

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
  if (!sopts.kv.streaming() && int(prompt.size()) > sopts.kv.ctx_size)
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
  std::span<float> logits = session.feed(prompt);
  const double prefill_ms = ms_since(t_prefill);
  double ttft_ms = 0;
  int generated = 0;
  std::string stop_note;
  const auto t_decode = Clock::now();
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
    logits = session.feed({&next, 1});
  }
  std::string rest = detok.finish();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const double decode_ms = ms_since(t_decode);

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
  if (sopts.use_cache) {
    const KVCache& kv = session.cache();
    std::string stored = "stored " + std::to_string(kv.n_stored()) + " tokens";
    if (kv.n_stored() != kv.n_tokens())
      stored = "stored " + std::to_string(kv.n_stored()) + " of " + std::to_string(kv.n_tokens()) + " (StreamingLLM cap)";
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
  return {app, [a] { return run_sample(*a); }};
}

}  // namespace ptllm::cli
