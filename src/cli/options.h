#pragma once
// Options shared by the commands that run a model (sample now; eval and bench later), filled in one place.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>

#include "engine/session.h"

namespace ptllm::cli {

struct RuntimeOptions {
  int threads = 0;          // 0 = all cores
  int ctx_size = 0;         // 0 = default_ctx_size(model)
  bool preallocate = true;
  bool no_cache = false;
  std::string kv_quantize = "fp32";
  int group_size = 32;
  int residual = 128;
  int sink = 0;
  int window = -1;          // -1 = not given
  std::string positions;    // empty = default_positions()
};

void add_runtime_options(CLI::App& app, RuntimeOptions& o);
// Validated session options for a model (throws UsageError for bad values).
SessionOptions make_session_options(const RuntimeOptions& o, const ModelConfig& cfg);
int resolve_threads(const RuntimeOptions& o);

// The model shipped in the repository (models/kjv-tiny), found next to the binary or the source tree.
std::filesystem::path default_model_dir();

std::string format_bytes(size_t bytes);

}  // namespace ptllm::cli
