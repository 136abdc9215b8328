// posttrainllm cache ls|inspect|prune: see and manage a prompt-cache directory (--prompt-cache-dir of
// sample, chat and serve: one block file per token block, store/dir_store.h), and inspect a
// --cache-prompt file.
#include <cstdio>
#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/file_io.h"
#include "engine/prompt_cache.h"
#include "persist/kv_store.h"
#include "store/dir_store.h"

namespace ptllm::cli {

namespace {

namespace fs = std::filesystem;

struct CacheArgs {
  std::string dir;
  std::vector<std::string> paths;
  double max_mb = -1;  // -1: not given
};

std::string kv_summary(const PromptCacheIdentity& id) {
  return id.kv.describe() + " (group " + std::to_string(id.kv.group_size) + ", residual " +
         std::to_string(id.kv.residual) + ", sink " + std::to_string(id.kv.sink) + ", window " +
         std::to_string(id.kv.window) + ", positions " + std::string(position_mode_name(id.kv.positions)) + ")";
}

std::string form_text(const BlockForm& f) {
  return std::string(kv_precision_name(f.precision)) + (is_kivi(f.precision) ? (f.quantized ? " groups" : " full") : "");
}

std::string short_hex(const Digest& d) { return to_hex(d).substr(0, 12); }

struct BlockRead {
  std::optional<BlockValueInfo> info;
  std::string problem;
};
BlockRead read_block_file(const fs::path& p) {
  BlockRead r;
  try {
    r.info = read_block_value(read_whole_file(p, uint64_t(1) << 30, "a block file"));
  } catch (const Error& e) {
    r.problem = e.what();
    if (r.problem.starts_with("not a block value")) r.problem = "not a block file nor a --cache-prompt file (bad magic)";
  }
  return r;
}

int run_ls(const CacheArgs& a) {
  std::vector<store::DirStoreFile> files = store::list_dir_store(a.dir);
  std::reverse(files.begin(), files.end());  // most recently used first
  struct Group {
    uint64_t blocks = 0, tokens = 0, bytes = 0;
    std::string forms;
  };
  std::map<std::string, Group> groups;
  uint64_t total = 0, damaged = 0;
  std::printf("%-14s %-34s %6s  %-12s %10s  %s\n", "IDENTITY", "BLOCK", "TOKENS", "KV", "SIZE", "LAST USED");
  for (const store::DirStoreFile& f : files) {
    total += f.bytes;
    const BlockRead r = read_block_file(f.path);
    const std::string name = f.path.filename().string();
    if (!r.info) {
      ++damaged;
      std::printf("%-49s damaged: %s\n", name.c_str(), r.problem.c_str());
      continue;
    }
    const BlockValueInfo& b = *r.info;
    const BlockHash& h = b.hash;
    char hash[40];
    std::snprintf(hash, sizeof hash, "%016llx%016llx", (unsigned long long)h.hi, (unsigned long long)h.lo);
    std::printf("%-14s %-34s %6zu  %-12s %10s  %s\n", short_hex(b.identity).c_str(), hash, b.ids.size(),
                form_text(b.form).c_str(), format_bytes(f.bytes).c_str(), iso_time(f.mtime_ns / 1000000).c_str());
    Group& g = groups[short_hex(b.identity)];
    ++g.blocks;
    g.tokens += b.form.quantized ? 0 : b.ids.size();
    g.bytes += f.bytes;
    const std::string form = form_text(b.form);
    if (g.forms.find(form) == std::string::npos) g.forms += (g.forms.empty() ? "" : ", ") + form;
  }
  for (const auto& [id, g] : groups)
    std::printf("identity %s: %llu blocks (%s), %s\n", id.c_str(), (unsigned long long)g.blocks, g.forms.c_str(),
                format_bytes(g.bytes).c_str());
  std::printf("%zu blocks, %s%s\n", files.size(), format_bytes(total).c_str(),
              damaged ? (", " + std::to_string(damaged) + " damaged").c_str() : "");
  return 0;
}

int inspect_block(const fs::path& p) {
  const BlockRead r = read_block_file(p);
  if (!r.info) {
    std::printf("  status: damaged: %s\n", r.problem.c_str());
    return 1;
  }
  const BlockValueInfo& b = *r.info;
  std::printf("  status: ok (checksum verified)\n");
  std::printf("  format version: %u (block value)\n", b.version);
  std::printf("  identity: %s\n", to_hex(b.identity).c_str());
  std::printf("  block hash: %016llx%016llx\n", (unsigned long long)b.hash.hi, (unsigned long long)b.hash.lo);
  std::printf("  kv: %s (%s)\n", std::string(kv_precision_name(b.form.precision)).c_str(),
              b.form.quantized ? "KIVI groups: codes, scales and zeros" : "full precision");
  std::printf("  tokens: %zu, payload %s\n", b.ids.size(), format_bytes(b.payload_bytes).c_str());
  std::string ids;
  for (size_t i = 0; i < std::min<size_t>(b.ids.size(), 16); ++i) {
    if (i) ids += ' ';
    ids += std::to_string(b.ids[i]);
  }
  std::printf("  ids: %s%s\n", ids.c_str(), b.ids.size() > 16 ? " ..." : "");
  return 0;
}

// A --cache-prompt file (one prompt's whole state).
int inspect_state_file(const fs::path& p) {
  std::string buffer;
  try {
    const CacheFile f = read_cache_file(p, buffer);
    const PromptCacheIdentity& id = f.identity;
    const size_t n = f.ids.size();
    std::printf("  status: ok (checksum verified)\n");
    std::printf("  format version: %u (prompt state)\n", f.version);
    std::printf("  model: %s (%s), vocab %d, %d layers, %d KV heads of %d\n", id.model_name.c_str(),
                id.arch_name.c_str(), id.vocab_size, id.n_layers, id.n_kv_heads, id.head_dim);
    std::printf("  kv: %s\n", kv_summary(id).c_str());
    std::printf("  config key: %s\n", to_hex(id.config_key).c_str());
    std::printf("  tokens: %zu, file %s (%.0f bytes per token), KV state %s\n", n, format_bytes(f.file_size).c_str(),
                double(f.file_size) / double(n), format_bytes(f.kv_state.size()).c_str());
    std::printf("  created: %s\n", iso_time(f.created_ms).c_str());
    return 0;
  } catch (const Error& e) {
    std::printf("  status: damaged: %s\n", e.what());
    return 1;
  }
}

int run_inspect(const CacheArgs& a) {
  std::vector<fs::path> files;
  for (const std::string& p : a.paths) {
    if (fs::is_directory(p))
      for (const store::DirStoreFile& f : store::list_dir_store(p)) files.push_back(f.path);
    else
      files.emplace_back(p);
  }
  int damaged = 0;
  for (const fs::path& p : files) {
    std::printf("%s\n", p.c_str());
    damaged += p.extension() == ".kvblock" || !is_prompt_cache_file(p) ? inspect_block(p) : inspect_state_file(p);
  }
  return damaged ? 1 : 0;
}

int run_prune(const CacheArgs& a) {
  std::vector<fs::path> temporaries;
  const std::vector<store::DirStoreFile> files = store::list_dir_store(a.dir, &temporaries);
  std::vector<fs::path> removed;
  uint64_t freed = 0, left = 0;
  std::error_code ec;
  auto remove = [&](const fs::path& p, uint64_t bytes) {
    if (fs::remove(p, ec)) {
      removed.push_back(p);
      freed += bytes;
    }
    ec.clear();
  };
  for (const fs::path& t : temporaries) remove(t, fs::file_size(t, ec));
  std::vector<store::DirStoreFile> good;
  for (const store::DirStoreFile& f : files) {
    if (read_block_file(f.path).info) {
      good.push_back(f);
      left += f.bytes;
    } else {
      remove(f.path, f.bytes);
    }
  }
  if (a.max_mb >= 0) {
    const uint64_t max = uint64_t(a.max_mb * 1024 * 1024);
    for (const store::DirStoreFile& f : good) {  // least recently used first
      if (left <= max) break;
      remove(f.path, f.bytes);
      left -= f.bytes;
    }
  }
  for (const fs::path& p : removed) std::printf("removed %s\n", p.c_str());
  std::printf("removed %zu files (%s), %s left\n", removed.size(), format_bytes(freed).c_str(),
              format_bytes(left).c_str());
  return 0;
}

}  // namespace

Command add_cache_command(CLI::App& root) {
  auto a = std::make_shared<CacheArgs>();
  CLI::App* app = root.add_subcommand("cache", "See and manage a prompt-cache directory (--prompt-cache-dir of sample, "
                                                "chat and serve)");
  app->require_subcommand(1);
  CLI::App* ls = app->add_subcommand("ls", "List the block files, most recently used first, and a line per identity");
  ls->add_option("dir", a->dir, "Prompt-cache directory")->required();
  CLI::App* inspect = app->add_subcommand("inspect", "Verify block files or --cache-prompt files (checksum included) "
                                                      "and print their header; exit code 1 if one is damaged");
  inspect->add_option("paths", a->paths, "Block files, --cache-prompt files, or directories (each block file)")->required();
  CLI::App* prune = app->add_subcommand("prune", "Remove damaged block files and temporary files left by a "
                                                  "crash; with --max-mb, least recently used blocks too");
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
