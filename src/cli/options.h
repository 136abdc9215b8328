#pragma once
// Options shared by the commands (the runtime options of the commands that run a model, the model
// argument, number validators), and the command-line preprocessing every command goes through.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/kv_report.h"
#include "engine/session.h"
#include "sample/sampler.h"

namespace ptllm::cli {

struct RuntimeOptions {
  int threads = 0;          // 0 = all cores
  int ctx_size = 0;         // 0 = default_ctx_size(model)
  bool preallocate = true;
  bool no_cache = false;
  std::string kv_quantize = "fp32";
  bool kv_quantize_given = false;
  std::string cache_type_k, cache_type_v;  // llama.cpp's -ctk/-ctv as typed; empty = not given
  int group_size = 32;
  int residual = 128;
  int sink = 0;
  int window = -1;          // -1 = not given
  std::string positions;    // empty = default_positions()
  // x rounded to bf16 in the BF16 weights' products (kernels/panels.h): on by default for GGUF files.
  bool bf16_activations = false, no_bf16_activations = false;
};

void add_runtime_options(CLI::App& app, RuntimeOptions& o);
// --temperature, --top-k, --top-p, --min-p and the penalties (sample and chat; the seed is the command's).
void add_sampling_options(CLI::App& app, SamplingConfig& s);
// Validated session options for a model (throws UsageError for bad values).
SessionOptions make_session_options(const RuntimeOptions& o, const ModelConfig& cfg);
int resolve_threads(const RuntimeOptions& o);

// The model directory as a positional MODEL or -m/--model MODEL (llama.cpp's flag); not both.
void add_model_option(CLI::App& app, std::string& dir, const std::string& description);

// Number validators with short messages ("must be at least 0", "'abc' is not a number"): CLI11's
// NonNegativeNumber and PositiveNumber print the type's maximum, a 300-digit number for a double.
CLI::Validator integer_at_least(long long lo, long long hi = 2147483647);
CLI::Validator integer_between(long long lo, long long hi);
CLI::Validator unsigned_integer();  // a 64-bit seed
CLI::Validator number_at_least(double lo, bool exclusive = false);
CLI::Validator number_between(double lo, double hi);

// --threads: 0 (all cores) to kMaxThreads. More threads than cores only slow the kernels down; the
// bound keeps a typo (-t 100000) from asking the system for a hundred thousand threads.
inline constexpr int kMaxThreads = 1024;
CLI::Validator thread_count();

// Rewrites argv before CLI11 sees it (CLI11 would read llama.cpp's -cnv as -c nv): llama.cpp's
// multi-letter single-dash flags are mapped to their long names where this runtime has them
// (-ctk -> --cache-type-k) or refused with a message naming them. Also refuses an unknown command
// by name. Throws UsageError. `root` must have every command registered.
std::vector<std::string> preprocess_args(const CLI::App& root, int argc, char** argv);

// "posttrainllm 0.1.0 (git 15792fa, Release, GCC 12.2.0, kernels avx512)".
std::string version_text();

// The model shipped in the repository (models/kjv-tiny), found next to the binary or the source tree.
std::filesystem::path default_model_dir();

std::string format_bytes(size_t bytes);
// "weights q4 g64 (BF16 scales), 15.20 MiB": the model: lines of every command.
std::string weights_text(const Model& model);
// "kv layers: 5 of 8 store K/V; logical by layer: 0 64.0 KiB, ..., 4 1.00 MiB; layers 5, 6, 7 read
// layer 4's" (the footers of sample and bench, the table of eval, for a model whose layers share K/V).
std::string kv_layers_line(const KVLayerReport& r);

}  // namespace ptllm::cli
