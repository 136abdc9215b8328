// posttrainllm quantize: an F32/F16/BF16 checkpoint to the MLX affine layout (model/quantize.h;
// docs/quantization.md), or with --format gguf to one GGUF file that llama.cpp and this runtime load
// (model/gguf_writer.h; docs/gguf.md).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/gguf_writer.h"
#include "model/quantize.h"

namespace ptllm::cli {

namespace {

struct QuantizeArgs {
  std::string model_dir, out_dir;
  int bits = 4;
  int group_size = 64;
  bool keep_embeddings = false;
  std::string method = "rtn";
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

int run_quantize(const QuantizeArgs& a) {
  if (a.format == "gguf") return run_gguf(a);
  QuantizeOptions o;
  o.spec = {a.bits, a.group_size};
  o.keep_embeddings = a.keep_embeddings;
  o.method = a.method == "search" ? QuantMethod::Search : QuantMethod::Rtn;
  ThreadPool pool(a.threads > 0 ? a.threads : ThreadPool::default_threads());
  ProgressBar bar(isatty(STDERR_FILENO) != 0);
  const auto t0 = std::chrono::steady_clock::now();
  const QuantizeReport r =
      quantize_checkpoint(a.model_dir, a.out_dir, o, pool, [&](size_t done, size_t total) { bar.update(done, total); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "wrote %s: weights %s, %s (from %s), %d matrices quantized, %d left dense, %s, %.1f s\n",
               a.out_dir.c_str(), r.weight_format.c_str(), format_bytes(r.output_bytes).c_str(),
               format_bytes(r.source_bytes).c_str(), r.matrices_quantized, r.matrices_dense,
               std::string(quant_method_name(o.method)).c_str(), s);
  for (const auto& [module, spec] : r.quantization.overrides)
    std::fprintf(stderr, "  %s: %s\n", module.c_str(),
                 spec ? ("q" + std::to_string(spec->bits) + " g" + std::to_string(spec->group_size) +
                         " (the width is not a multiple of the group size)")
                            .c_str()
                      : "left dense");
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
  app->add_option("--bits", a->bits, "Bits per weight code")->check(CLI::IsMember({2, 3, 4, 5, 6, 8}));
  app->add_option("--group-size", a->group_size, "Weights sharing one scale and bias")
      ->check(CLI::IsMember({32, 64, 128}));
  app->add_flag("--keep-embeddings", a->keep_embeddings,
                "Leave model.embed_tokens and lm_head in their float dtype");
  app->add_option("--method", a->method,
                  "rtn: mlx's round-to-nearest scales and biases; search: the best of a small grid per group "
                  "(lower squared error, slower)")
      ->check(CLI::IsMember({"rtn", "search"}));
  app->add_option("--threads,-t", a->threads, "Threads (0 = all cores)")->check(integer_at_least(0));
  return {app, [a] { return run_quantize(*a); }};
}

}  // namespace ptllm::cli
