// posttrainllm quantize: an F32/F16/BF16 checkpoint to the MLX affine layout (model/quantize.h;
// docs/quantization.md), or with --format gguf to one GGUF file that llama.cpp and this runtime load
// (model/gguf_writer.h; docs/gguf.md).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/thread_pool.h"
#include "engine/runtime.h"
#include "model/gguf_writer.h"
#include "model/gptq.h"
#include "model/quantize.h"

namespace ptllm::cli {

namespace {

struct QuantizeArgs {
  std::string model_dir, out_dir;
  std::optional<int> bits, group_size, embedding_bits;  // unset: resolve_quantize_options's defaults
  bool keep_embeddings = false;
  std::string method;  // empty: search, or gptq with --calib
  std::string recipe;
  std::string calib;       // --method gptq
  int calib_tokens = 32768;
  int calib_seq = 512;
  uint64_t seed = 42;
  double gptq_damp = 0.01;
  bool gptq_act_order = false;
  int threads = 0;
  std::string format = "mlx";
  std::string type = "Q8_0";  // --format gguf
};

// "\rquantize [##########----------]  50%  13.2 of 26.4 MiB", redrawn at most ten times a second.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  void update(size_t done, size_t total) {
    if (!enabled_ || total == 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    constexpr int kWidth = 30;
    const int filled = int(double(done) / double(total) * kWidth);
    std::string bar(size_t(filled), '#');
    bar.append(size_t(kWidth - filled), '-');
    std::fprintf(stderr, "\rquantize [%s] %3d%%  %s of %s", bar.c_str(), int(100.0 * double(done) / double(total)),
                 format_bytes(done).c_str(), format_bytes(total).c_str());
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  std::chrono::steady_clock::time_point last_{};
};

int run_gguf(const QuantizeArgs& a) {
  const GgufMix mix = parse_gguf_mix(a.type);
  const GgufWriteResult r = write_gguf_from_hf(a.model_dir, a.out_dir, mix);
  // "Q4_K 30, Q6_K 12, F32 17": how many tensors of each type.
  std::string types;
  for (const auto& [name, n] : r.by_type) types += (types.empty() ? "" : ", ") + name + " " + std::to_string(n);
  std::fprintf(stderr, "wrote %s: GGUF %s, %d tensors (%s; %d quantized, %d in a fallback type for their row width), %s\n",
               a.out_dir.c_str(), a.type.c_str(), r.tensors, types.c_str(), r.quantized, r.fallback,
               format_bytes(r.bytes).c_str());
  return 0;
}

// --method gptq's calibration: the text of --calib tokenized with the model's tokenizer (as eval
// reads text: no markup), cut into windows of --calib-seq tokens at seeded random places.
std::vector<std::vector<int32_t>> calibration(const QuantizeArgs& a) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(a.calib, ec))
    throw UsageError(a.calib + ": cannot read the file given to --calib (" +
                     (std::filesystem::exists(a.calib, ec) ? "not a regular file" : "no such file") + ")");
  const std::string text = read_whole_file(a.calib, kMaxTextBytes, "the file given to --calib");
  const Tokenizer tok = load_tokenizer(a.model_dir);
  const std::vector<int32_t> ids = tok.encode(text, {.add_special = false, .parse_special = false});
  if (ids.size() < 2) throw UsageError(a.calib + ": --calib text has " + std::to_string(ids.size()) +
                                       " tokens; calibration needs at least 2");
  return calibration_windows(ids, a.calib_tokens, a.calib_seq, a.seed, tok.bos_id());
}

int run_quantize(const QuantizeArgs& a) {
  if (a.format == "gguf") return run_gguf(a);
  QuantizeRequest req;
  req.bits = a.bits;
  req.group_size = a.group_size;
  req.embedding_bits = a.embedding_bits;
  req.keep_embeddings = a.keep_embeddings;
  req.calibration = !a.calib.empty();
  if (!a.method.empty())
    req.method = a.method == "search" ? QuantMethod::Search : a.method == "gptq" ? QuantMethod::Gptq : QuantMethod::Rtn;
  req.recipe = a.recipe == "mixed_2_6"   ? QuantRecipe::Mixed_2_6
               : a.recipe == "mixed_3_6" ? QuantRecipe::Mixed_3_6
               : a.recipe == "mixed_4_6" ? QuantRecipe::Mixed_4_6
                                         : QuantRecipe::None;
  QuantizeOptions o = resolve_quantize_options(req);
  if (o.method == QuantMethod::Gptq && a.calib.empty())
    throw UsageError("--method gptq needs --calib FILE (text to measure the layers' inputs on, e.g. training text; "
                     "never the evaluation text)");
  if (o.method != QuantMethod::Gptq && !a.calib.empty())
    throw UsageError("--calib is read by --method gptq only (this run: --method " + a.method + ")");
  ThreadPool pool(a.threads > 0 ? a.threads : ThreadPool::default_threads());
  ProgressBar bar(isatty(STDERR_FILENO) != 0);
  const auto t0 = std::chrono::steady_clock::now();
  if (o.method == QuantMethod::Gptq) {
    o.calibration = calibration(a);
    o.gptq_damp = a.gptq_damp;
    o.gptq_act_order = a.gptq_act_order;
    size_t n = 0;
    for (const auto& s : o.calibration) n += s.size();
    std::fprintf(stderr, "gptq: %zu calibration sequences of %d tokens (%zu tokens) from %s\n", o.calibration.size(),
                 int(o.calibration[0].size()), n, a.calib.c_str());
  }
  const QuantizeReport r =
      quantize_checkpoint(a.model_dir, a.out_dir, o, pool, [&](size_t done, size_t total) { bar.update(done, total); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "wrote %s: weights %s, %s (from %s, %.3f bits a weight), %d matrices quantized, %d left dense, %s%s%s, "
               "%.1f s\n",
               a.out_dir.c_str(), r.weight_format.c_str(), format_bytes(r.output_bytes).c_str(),
               format_bytes(r.source_bytes).c_str(), r.parameters > 0 ? 8.0 * double(r.output_bytes) / double(r.parameters) : 0.0,
               r.matrices_quantized, r.matrices_dense, std::string(quant_method_name(o.method)).c_str(),
               a.recipe.empty() ? "" : ", recipe ", a.recipe.c_str(), s);
  for (const auto& [module, spec] : r.quantization.overrides) {
    std::string what = "left dense";
    if (spec) {
      what = "q" + std::to_string(spec->bits) + " g" + std::to_string(spec->group_size);
      const bool embedding = module == "model.embed_tokens" || module == "lm_head";
      const int asked = embedding && o.embedding_group_size > 0 ? o.embedding_group_size : o.spec.group_size;
      if (spec->group_size != asked) what += " (the width is not a multiple of the group size)";
    }
    std::fprintf(stderr, "  %s: %s\n", module.c_str(), what.c_str());
  }
  std::fprintf(stderr, "expected quality: %s; measure it with: posttrainllm eval %s --baseline-model %s --text FILE\n",
               quality_class(o).c_str(), a.out_dir.c_str(), a.model_dir.c_str());
  return 0;
}

}  // namespace

Command add_quantize_command(CLI::App& root) {
  auto a = std::make_shared<QuantizeArgs>();
  CLI::App* app = root.add_subcommand(
      "quantize", "Write an MLX-layout quantized copy of an F32/F16/BF16 checkpoint, or a GGUF file (--format gguf)");
  app->add_option("model_dir", a->model_dir, "Model directory to read (config.json, safetensors, tokenizer)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app->add_option("out_dir", a->out_dir, "Directory to write the quantized checkpoint into (--format gguf: the file)")
      ->required();
  app->add_option("--format", a->format, "mlx: MLX-layout safetensors (--bits, --group-size); gguf: one GGUF file (--type)")
      ->check(CLI::IsMember({"mlx", "gguf"}));
  app->add_option("--type", a->type, "--format gguf: file type: F32, F16, BF16, Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K "
                  "(the quantized ones choose each tensor's type as llama-quantize does)")
      ->check(CLI::IsMember({"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K"}));
  app->add_option("--bits", a->bits, "Bits per weight code (default 4)")->check(CLI::IsMember({2, 3, 4, 5, 6, 8}));
  app->add_option("--group-size", a->group_size, "Weights sharing one scale and bias (default 32 below 8 bits, 64 at 8)")
      ->check(CLI::IsMember({32, 64, 128}));
  app->add_flag("--keep-embeddings", a->keep_embeddings,
                "Leave model.embed_tokens and lm_head in their float dtype");
  app->add_option("--method", a->method,
                  "rtn: mlx's round-to-nearest scales and biases; search (the default without --calib): the best of "
                  "a small grid per group, inputs weighted by the norm in front; gptq (the default with --calib): "
                  "GPTQ on calibration text (the best, slowest)")
      ->check(CLI::IsMember({"rtn", "search", "gptq"}));
  auto* emb = app->add_option("--embedding-bits", a->embedding_bits,
                              "Bits of model.embed_tokens and lm_head (default 6 when the other matrices have 4 or "
                              "fewer, else theirs; 0: theirs; a per-module entry in config.json)")
                  ->check(CLI::IsMember({0, 2, 3, 4, 5, 6, 8}));
  emb->excludes(app->get_option("--keep-embeddings"));
  auto* recipe = app->add_option("--recipe", a->recipe,
                                 "mlx-lm's mixed recipes: mixed_N_6 quantizes at N bits but v_proj and down_proj of "
                                 "some layers and the LM head (with tied embeddings the embedding) at 6")
                     ->check(CLI::IsMember({"mixed_2_6", "mixed_3_6", "mixed_4_6"}));
  recipe->excludes(app->get_option("--bits"));
  app->add_option("--calib", a->calib, "--method gptq: a text file to calibrate on (training text, never the "
                                       "evaluation text)");
  app->add_option("--calib-tokens", a->calib_tokens, "--method gptq: calibration tokens (default 32768)")
      ->check(integer_at_least(1));
  app->add_option("--calib-seq", a->calib_seq, "--method gptq: tokens a calibration sequence (default 512, BOS first)")
      ->check(integer_at_least(2));
  app->add_option("--seed", a->seed, "--method gptq: which windows of --calib are taken (default 42)");
  app->add_option("--gptq-damp", a->gptq_damp,
                  "--method gptq: dampening added to H's diagonal, a fraction of its mean (default 0.01)")
      ->check(CLI::Range(0.0, 1.0));
  app->add_flag("--gptq-act-order", a->gptq_act_order,
                "--method gptq: solve the columns by decreasing input energy (groups fitted up front)");
  app->add_option("--threads,-t", a->threads, "Threads (0 = all cores)")->check(thread_count());
  return {app, [a] { return run_quantize(*a); }};
}

}  // namespace ptllm::cli
