#include "cli/options.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "core/thread_pool.h"

namespace ptllm::cli {

void add_runtime_options(CLI::App& app, RuntimeOptions& o) {
  app.add_option("--threads,-t", o.threads, "Threads for the heavy kernels (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--ctx-size,-c", o.ctx_size,
                 "KV-cache capacity in tokens (default: min(max_position_embeddings, 4096))")
      ->check(CLI::PositiveNumber);
  auto* pre = app.add_flag("--kv-preallocate", o.preallocate, "Reserve the whole KV capacity at start (default)");
  app.add_flag("--no-kv-preallocate{false}", o.preallocate, "Take KV blocks as the context grows")->excludes(pre);
  app.add_flag("--no-cache", o.no_cache, "Recompute the whole sequence every step (the reference path)");
  app.add_option("--kv-quantize", o.kv_quantize, "KV storage: fp32, fp16, bf16, or KIVI int8, int4, int2")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16", "int8", "int4", "int2"}));
  app.add_option("--kv-group-size", o.group_size, "Tokens per KV block and KIVI group (default 32)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--kv-residual", o.residual,
                 "KIVI: recent tokens kept full precision, a multiple of the group size (default 128)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--streaming-llm-sink", o.sink, "StreamingLLM: first tokens kept forever")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--streaming-llm-window", o.window, "StreamingLLM: recent tokens kept beyond the sinks")
      ->check(CLI::PositiveNumber);
  app.add_option("--streaming-positions", o.positions,
                 "RoPE under StreamingLLM: cache (K rotated by its cache slot; the default with a window) or "
                 "absolute (K rotated at its absolute position; the default without)")
      ->check(CLI::IsMember({"absolute", "cache"}));
}

SessionOptions make_session_options(const RuntimeOptions& o, const ModelConfig& cfg) {
  SessionOptions s;
  s.kv.ctx_size = o.ctx_size > 0 ? o.ctx_size : default_ctx_size(cfg);
  s.kv.preallocate = o.preallocate;
  s.kv.precision = *parse_kv_precision(o.kv_quantize);
  s.kv.group_size = o.group_size;
  s.kv.residual = o.residual;
  s.kv.sink = o.sink;
  s.kv.window = std::max(0, o.window);
  s.kv.positions = o.positions.empty()     ? default_positions(s.kv)
                   : o.positions == "cache" ? PositionMode::Cache
                                            : PositionMode::Absolute;
  s.use_cache = !o.no_cache;
  s.kv.validate();
  return s;
}

int resolve_threads(const RuntimeOptions& o) { return o.threads > 0 ? o.threads : ThreadPool::default_threads(); }

std::filesystem::path default_model_dir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
      fs::path cand = dir / "models" / "kjv-tiny";
      if (fs::exists(cand / "config.json")) return cand;
    }
  }
  return fs::path(PTLLM_SOURCE_DIR) / "models" / "kjv-tiny";
}

std::string format_bytes(size_t bytes) {
  char buf[64];
  if (bytes < 1024)
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else if (bytes < 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(bytes) / 1024);
  else if (bytes < size_t(1024) * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / (1024 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / (1024.0 * 1024 * 1024));
  return buf;
}

}  // namespace ptllm::cli
