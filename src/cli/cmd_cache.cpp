// posttrainllm cache ls|inspect|prune: see and manage a prompt-cache directory (--prompt-cache-dir).
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/file_io.h"
#include "engine/prompt_cache.h"

namespace ptllm::cli {

namespace {

namespace fs = std::filesystem;

struct CacheArgs {
  std::string dir;
  std::vector<std::string> paths;
  double max_mb = -1;  // -1: not given
};

// The sidecar's field, or "" when the sidecar is missing or unreadable (it is informational only).
std::string sidecar_field(const fs::path& kvcache, const char* key) {
  const fs::path side = sidecar_path(kvcache);
  if (!is_prompt_cache_sidecar(side)) return "";
  const nlohmann::json j = nlohmann::json::parse(read_whole_file(side, kMaxJsonConfigBytes, "a sidecar"), nullptr, false);
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

std::string kv_summary(const PromptCacheIdentity& id) {
  return id.kv.describe() + " (group " + std::to_string(id.kv.group_size) + ", residual " +
         std::to_string(id.kv.residual) + ", sink " + std::to_string(id.kv.sink) + ", window " +
         std::to_string(id.kv.window) + ", positions " + std::string(position_mode_name(id.kv.positions)) + ")";
}

int run_ls(const CacheArgs& a) {
  const std::vector<CacheEntry> entries = list_cache_dir(a.dir);
  uint64_t total = 0;
  std::printf("%-36s %7s  %-22s %10s  %-20s  %s\n", "ENTRY", "TOKENS", "KV", "SIZE", "LAST USED", "PROMPT");
  for (const CacheEntry& e : entries) {
    total += e.bytes;
    const std::string name = e.path.filename().string();
    if (!e.header) {
      std::printf("%-36s damaged: %s\n", name.c_str(), e.problem.c_str());
      continue;
    }
    std::printf("%-36s %7zu  %-22s %10s  %-20s  %s\n", name.c_str(), e.header->ids.size(),
                e.header->identity.kv.describe().c_str(), format_bytes(e.bytes).c_str(), iso_time(e.last_used_ms).c_str(),
                sidecar_field(e.path, "prompt_preview").c_str());
  }
  std::printf("%zu entries, %s\n", entries.size(), format_bytes(total).c_str());
  return 0;
}

int run_inspect(const CacheArgs& a) {
  std::vector<fs::path> files;
  for (const std::string& p : a.paths) {
    if (fs::is_directory(p))
      for (const CacheEntry& e : list_cache_dir(p)) files.push_back(e.path);
    else
      files.emplace_back(p);
  }
  int damaged = 0;
  std::string buffer;
  for (const fs::path& p : files) {
    std::printf("%s\n", p.c_str());
    try {
      const CacheFile f = read_cache_file(p, buffer);
      const PromptCacheIdentity& id = f.identity;
      const size_t n = f.ids.size();
      std::printf("  status: ok (checksum verified)\n");
      std::printf("  format version: %u\n", f.version);
      std::printf("  model: %s (%s), vocab %d, %d layers, %d KV heads of %d\n", id.model_name.c_str(),
                  id.arch_name.c_str(), id.vocab_size, id.n_layers, id.n_kv_heads, id.head_dim);
      std::printf("  kv: %s\n", kv_summary(id).c_str());
      std::printf("  config key: %s\n", to_hex(id.config_key).c_str());
      std::printf("  key: %s\n", to_hex(prompt_cache_key(id.config_key, f.ids)).c_str());
      std::printf("  tokens: %zu, file %s (%.0f bytes per token), KV state %s\n", n, format_bytes(f.file_size).c_str(),
                  double(f.file_size) / double(n), format_bytes(f.kv_state.size()).c_str());
      std::printf("  created: %s\n", iso_time(f.created_ms).c_str());
      const std::string used = sidecar_field(p, "last_used"), prompt = sidecar_field(p, "prompt_preview");
      if (!used.empty()) std::printf("  last used: %s\n", used.c_str());
      if (!prompt.empty()) std::printf("  prompt: %s\n", prompt.c_str());
      std::string ids;
      for (size_t i = 0; i < std::min<size_t>(n, 16); ++i) {
        if (i) ids += ' ';
        ids += std::to_string(f.ids[i]);
      }
      std::printf("  ids: %s%s\n", ids.c_str(), n > 16 ? " ..." : "");
    } catch (const Error& e) {
      std::printf("  status: damaged: %s\n", e.what());
      ++damaged;
    }
  }
  return damaged ? 1 : 0;
}

int run_prune(const CacheArgs& a) {
  PruneOptions opts;
  opts.remove_damaged = true;
  if (a.max_mb >= 0) opts.max_bytes = uint64_t(a.max_mb * 1024 * 1024);
  const CacheDirLock lock(a.dir);  // not in the middle of another process's save
  const PruneResult r = prune_cache_dir(a.dir, opts);
  for (const fs::path& p : r.removed) std::printf("removed %s\n", p.c_str());
  std::printf("removed %zu files (%s), %s left\n", r.removed.size(), format_bytes(r.bytes_freed).c_str(),
              format_bytes(r.bytes_left).c_str());
  return 0;
}

}  // namespace

Command add_cache_command(CLI::App& root) {
  auto a = std::make_shared<CacheArgs>();
  CLI::App* app = root.add_subcommand("cache", "See and manage a prompt-cache directory (--prompt-cache-dir)");
  app->require_subcommand(1);
  CLI::App* ls = app->add_subcommand("ls", "List the entries, most recently used first (headers only)");
  ls->add_option("dir", a->dir, "Prompt-cache directory")->required();
  CLI::App* inspect = app->add_subcommand("inspect", "Verify cache files (checksum included) and print their header; "
                                                      "exit code 1 if one is damaged");
  inspect->add_option("paths", a->paths, "Cache files, or directories (each entry)")->required();
  CLI::App* prune = app->add_subcommand("prune", "Remove damaged entries, orphan sidecars and temporary files "
                                                  "left by a crash; with --max-mb, least recently used entries too");
  prune->add_option("dir", a->dir, "Prompt-cache directory")->required();
  prune->add_option("--max-mb", a->max_mb, "Keep at most N MiB (default: no limit)")
      ->check(number_at_least(0))
      ->default_str("");
  return {app, [a, ls, inspect, prune] {
            if (ls->parsed()) return run_ls(*a);
            if (inspect->parsed()) return run_inspect(*a);
            return run_prune(*a);
          }};
}

}  // namespace ptllm::cli
