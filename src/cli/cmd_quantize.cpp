// posttrainllm quantize MODEL_DIR OUT --format gguf --type Q8_0: a Hugging Face checkpoint written as
// one GGUF file (model/gguf_writer.h) that llama.cpp and this runtime load.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "model/gguf_writer.h"

namespace ptllm::cli {

namespace {

struct QuantizeArgs {
  std::string model_dir, out;
  std::string format = "gguf";
  std::string type = "Q8_0";
};

int run_quantize(const QuantizeArgs& a) {
  if (a.format != "gguf") throw UsageError("--format " + a.format + ": this build writes gguf");
  const GgmlType type = parse_gguf_write_type(a.type);
  const GgufWriteResult r = write_gguf_from_hf(a.model_dir, a.out, type);
  std::fprintf(stderr, "wrote %s: GGUF %s, %d tensors (%d in %s blocks, %d F16 for rows not a multiple of the block), %s\n",
               a.out.c_str(), a.type.c_str(), r.tensors, r.quantized, a.type.c_str(), r.fallback,
               format_bytes(r.bytes).c_str());
  return 0;
}

}  // namespace

Command add_quantize_command(CLI::App& root) {
  auto a = std::make_shared<QuantizeArgs>();
  CLI::App* app = root.add_subcommand("quantize", "Write a Hugging Face checkpoint as a GGUF file (--format gguf)");
  app->add_option("model_dir", a->model_dir, "Hugging Face model directory")->required();
  app->add_option("out", a->out, "The file to write (OUT.gguf)")->required();
  app->add_option("--format", a->format, "Output format: gguf")->check(CLI::IsMember({"gguf"}));
  app->add_option("--type", a->type, "GGUF tensor type of the 2-D weights: F32, F16, BF16, Q8_0, Q4_0")
      ->check(CLI::IsMember({"F32", "F16", "BF16", "Q8_0", "Q4_0"}));
  return {app, [a] { return run_quantize(*a); }};
}

}  // namespace ptllm::cli
