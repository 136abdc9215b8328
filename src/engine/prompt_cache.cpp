#include "engine/prompt_cache.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/sha256.h"
#include "engine/session.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {

namespace fs = std::filesystem;

namespace {

// Shortest prefix, and shortest rest, with which a dense cache's prefix is extended (see prefill()).
constexpr size_t kMinDensePiece = 16;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string read_small_file(const fs::path& p) { return read_whole_file(p, kMaxJsonConfigBytes, "a JSON file"); }

bool is_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

std::string preview(const Tokenizer& tok, std::span<const int32_t> ids) {
  constexpr size_t kIds = 48, kBytes = 120;
  std::string s = tok.decode(ids.first(std::min(ids.size(), kIds)));
  if (s.size() > kBytes || ids.size() > kIds) {
    size_t cut = std::min(s.size(), kBytes);
    while (cut > 0 && (uint8_t(s[cut]) & 0xC0) == 0x80) --cut;  // keep whole UTF-8 characters
    s = s.substr(0, cut) + "...";
  }
  std::replace_if(s.begin(), s.end(), [](char c) { return uint8_t(c) < 0x20; }, ' ');  // one line in `cache ls`
  return s;
}

nlohmann::json sidecar_json(const PromptCacheIdentity& id, std::span<const int32_t> ids, const fs::path& file,
                            uint64_t bytes, int64_t created_ms, const std::string& prompt_preview) {
  const Digest key = prompt_cache_key(id.config_key, ids);
  return {{"format_version", kPromptCacheVersion},
          {"file", file.filename().string()},
          {"key", to_hex(key)},
          {"config_key", to_hex(id.config_key)},
          {"model", id.model_name},
          {"architecture", id.arch_name},
          {"vocab_size", id.vocab_size},
          {"layers", id.n_layers},
          {"kv_heads", id.n_kv_heads},
          {"head_dim", id.head_dim},
          {"kv", id.kv.describe()},
          {"precision", kv_precision_name(id.kv.precision)},
          {"group_size", id.kv.group_size},
          {"residual", id.kv.residual},
          {"sink", id.kv.sink},
          {"window", id.kv.window},
          {"positions", position_mode_name(id.kv.positions)},
          {"tokens", ids.size()},
          {"bytes", bytes},
          {"prompt_preview", prompt_preview},
          {"created", iso_time(created_ms)},
          {"last_used", iso_time(created_ms)}};
}

void write_json(const fs::path& path, const nlohmann::json& j) {
  const std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  write_file_atomically(path, {text});
}

// Marks an entry used now: its mtime (what LRU pruning reads) and the sidecar's "last_used".
void touch_entry(const fs::path& kvcache) {
  const int64_t now = now_ms();
  if (::utimensat(AT_FDCWD, kvcache.c_str(), nullptr, 0) != 0) {
    if (errno == ENOENT) return;  // pruned by another process since it was read: nothing to mark
    throw Error(std::string("cannot touch: ") + std::strerror(errno));
  }
  const fs::path side = sidecar_path(kvcache);
  if (!is_prompt_cache_sidecar(side)) return;
  nlohmann::json j = nlohmann::json::parse(read_small_file(side), nullptr, false);
  if (j.is_object()) {
    j["last_used"] = iso_time(now);
    write_json(side, j);
  }
}

// Why a file with another config key does not fit this run, in the user's terms.
std::string mismatch(const PromptCacheIdentity& file, const PromptCacheIdentity& run) {
  auto shape = [](const PromptCacheIdentity& i) {
    return i.model_name + " (" + i.arch_name + ", vocab " + std::to_string(i.vocab_size) + ", " +
           std::to_string(i.n_layers) + " layers)";
  };
  if (shape(file) != shape(run)) return "written for model " + shape(file) + ", this run uses " + shape(run);
  if (file.kv.describe() != run.kv.describe())
    return "written with KV setting '" + file.kv.describe() + "', this run uses '" + run.kv.describe() + "'";
  auto blocks = [](const KVCacheConfig& kv) {
    return "--kv-group-size " + std::to_string(kv.group_size) + " --kv-residual " + std::to_string(kv.residual);
  };
  if (blocks(file.kv) != blocks(run.kv)) return "written with " + blocks(file.kv) + ", this run uses " + blocks(run.kv);
  return "written for other weights, config.json, tokenizer or build of posttrainllm";
}

}  // namespace



// ---------------------------------------------------------------------------------------------

struct PromptCache::Candidate {
  fs::path path;
  size_t tokens = 0;
};

PromptCache::PromptCache(PromptCacheOptions opts, PromptCacheIdentity id, const Tokenizer& tok)
    : opts_(std::move(opts)), id_(std::move(id)), tok_(tok) {}

PromptCache::~PromptCache() {
  if (pending_.valid()) pending_.wait();
}

std::vector<PromptCache::Candidate> PromptCache::candidates(std::span<const int32_t> prompt, int64_t grid,
                                                            PromptCacheLoad& load) const {
  const size_t N = prompt.size();
  auto usable = [&](size_t n) {
    if (n == N) return true;
    return grid > 1 ? int64_t(n) % grid == 0 : n >= kMinDensePiece && N - n >= kMinDensePiece;
  };
  std::vector<Candidate> out;
  if (!opts_.file.empty()) {
    std::error_code ec;
    if (!fs::exists(opts_.file, ec)) {
      if (ec) load.warnings.push_back("ignoring " + opts_.file.string() + ": " + ec.message());
      return out;
    }
    try {
      const CacheFile h = read_cache_header(opts_.file);
      if (h.identity.config_key != id_.config_key) throw Error(mismatch(h.identity, id_));
      if (is_prefix(h.ids, prompt) && usable(h.ids.size())) out.push_back({opts_.file, h.ids.size()});
    } catch (const Error& e) {
      load.warnings.push_back("ignoring " + opts_.file.string() + ": " + e.what());
    }
    return out;
  }
  // Only the entry under this prompt's own name is reported when unusable: the others may belong to
  // other models or builds sharing the directory.
  const std::string own = prompt_cache_file_name(id_, prompt);
  for (const CacheEntry& e : list_cache_dir(opts_.dir)) {
    const bool mine = e.path.filename() == own;
    if (!e.header) {
      if (mine) load.warnings.push_back("ignoring " + e.path.string() + ": " + e.problem);
      continue;
    }
    const CacheFile& h = *e.header;
    if (h.identity.config_key != id_.config_key) {
      if (mine) load.warnings.push_back("ignoring " + e.path.string() + ": " + mismatch(h.identity, id_));
      continue;
    }
    if (is_prefix(h.ids, prompt) && usable(h.ids.size())) out.push_back({e.path, h.ids.size()});
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) { return a.tokens > b.tokens; });
  return out;
}

void PromptCache::write_async(std::vector<Job> jobs, fs::path used, bool dir_ok) {
  if (pending_.valid()) pending_.wait();  // one write at a time: save() may follow prefill()
  pending_ = std::async(std::launch::async, [this, jobs = std::move(jobs), used, dir_ok]() {
    PromptCacheSave s;
    std::vector<fs::path> keep;
    std::optional<CacheDirLock> lock;
    if (dir_ok) lock.emplace(opts_.dir);
    for (const Job& j : jobs) {
      if (const auto why = not_replaceable(j.path)) {
        s.warnings.push_back("not saving " + j.path.string() + ": " + *why + " (left as it is)");
        continue;
      }
      const uint64_t size = cache_file_size(id_, j.ids.size(), j.kv_state.size());
      if (dir_ok && opts_.max_bytes && size > opts_.max_bytes) {
        s.warnings.push_back("not saving " + j.path.string() + ": its " + std::to_string(size) +
                             " bytes exceed --prompt-cache-max-mb");
        continue;
      }
      try {
        remove_stale_temporaries(j.path);
        const int64_t created = now_ms();
        const uint64_t bytes = write_cache_file(j.path, id_, created, j.ids, j.logits, j.kv_state);
        s.saved.push_back({j.path, int64_t(j.ids.size()), bytes});
        keep.push_back(j.path);
        if (dir_ok && !not_replaceable(sidecar_path(j.path), true))
          write_json(sidecar_path(j.path), sidecar_json(id_, j.ids, j.path, bytes, created, preview(tok_, j.ids)));
      } catch (const std::exception& e) {
        s.warnings.push_back("cannot save " + j.path.string() + ": " + e.what());
        break;  // the next write would fail the same way (a full disk, a missing directory)
      }
    }
    if (!used.empty()) {
      try {
        touch_entry(used);
        keep.push_back(used);
      } catch (const std::exception& e) {
        s.warnings.push_back("cannot mark " + used.string() + " as used: " + e.what());
      }
    }
    if (dir_ok && opts_.max_bytes) {
      try {
        s.pruned = prune_cache_dir(opts_.dir, {opts_.max_bytes, false, keep});
      } catch (const std::exception& e) {
        s.warnings.push_back(std::string("cannot prune: ") + e.what());
      }
    }
    return s;
  });
}

PromptCacheLoad PromptCache::prefill(Session& session, std::span<const int32_t> prompt) {
  PTLLM_CHECK(session.history().empty() && session.has_cache() && !prompt.empty());
  PromptCacheLoad load;
  const int64_t N = int64_t(prompt.size());
  load.prompt = N;
  // Which cached prefixes can be extended into exactly the state of a cold prefill (docs/prompt-cache.md):
  // KIVI, StreamingLLM and sliding layers apply their policy between fed chunks, which a cold prefill
  // feeds at multiples of max_append() from position 0: only a prefix on that grid gives the same
  // sequence of forward calls.
  // A dense cache has no policy, and its rows do not depend on how the prompt was split as long as
  // both pieces are long enough for the batched matmul path (ops.cpp uses a gemv below 5 rows).
  const int64_t grid = session.cache().has_policy() ? session.cache().max_append() : 1;

  bool dir_ok = opts_.file.empty() && !opts_.dir.empty();
  if (dir_ok) {
    std::error_code ec;
    fs::create_directories(opts_.dir, ec);
    if (ec) {
      load.warnings.push_back("cannot use " + opts_.dir.string() + ": " + ec.message());
      dir_ok = false;
    }
  }
  std::vector<Candidate> cands;
  if (!opts_.file.empty() || dir_ok) {
    try {
      cands = candidates(prompt, grid, load);
    } catch (const Error& e) {
      load.warnings.push_back(e.what());
      dir_ok = false;
    }
  }
  for (const Candidate& c : cands) {
    try {
      std::string buffer;
      const CacheFile f = read_cache_file(c.path, buffer);
      if (f.identity.config_key != id_.config_key) throw Error(mismatch(f.identity, id_));
      if (f.identity.vocab_size != id_.vocab_size) throw Error("holds logits for another vocabulary");
      if (!is_prefix(f.ids, prompt)) throw Error("changed while being read");
      session.restore(f.ids, f.kv_state, f.logits);
      load.reused = int64_t(f.ids.size());
      load.file = c.path;
      load.bytes_read = f.file_size;
      break;
    } catch (const std::exception& e) {  // ptllm::Error, or a filesystem or allocation failure: still the cold path
      // A file another process pruned since the listing is a plain miss, said nowhere.
      std::error_code ec;
      if (!fs::exists(c.path, ec) && !ec) continue;
      load.warnings.push_back("ignoring " + c.path.string() + ": " + e.what());
    }
  }
  const int64_t P = load.reused;
  load.outcome = P == N ? PromptCacheOutcome::Hit : P > 0 ? PromptCacheOutcome::PartialHit : PromptCacheOutcome::Miss;

  std::vector<Job> jobs;
  auto snapshot = [&](int64_t n, fs::path path) {
    Job j{std::move(path), std::vector<int32_t>(prompt.begin(), prompt.begin() + n), {}, {}};
    const auto logits = session.last_logits();
    j.logits.assign(logits.begin(), logits.end());
    session.cache().serialize(j.kv_state);
    jobs.push_back(std::move(j));
  };
  if (P < N) {
    // A checkpoint on the grid, so that a longer prompt later can extend this one exactly.
    const int64_t A = grid > 1 ? N / grid * grid : 0;
    if (dir_ok && A > P && A < N) {
      session.feed(prompt.subspan(size_t(P), size_t(A - P)));
      const fs::path cp = opts_.dir / prompt_cache_file_name(id_, prompt.first(size_t(A)));
      std::error_code ec;
      if (!fs::exists(cp, ec)) snapshot(A, cp);
      session.feed(prompt.subspan(size_t(A)));
    } else {
      session.feed(prompt.subspan(size_t(P)));
    }
    if (!opts_.file.empty())
      snapshot(N, opts_.file);
    else if (dir_ok)
      snapshot(N, opts_.dir / prompt_cache_file_name(id_, prompt));
  }
  const fs::path used = dir_ok && P > 0 ? load.file : fs::path();
  if (jobs.empty() && used.empty() && !(dir_ok && opts_.max_bytes)) return load;

  write_async(std::move(jobs), used, dir_ok);
  return load;
}

void PromptCache::save(const Session& session) {
  PTLLM_CHECK(session.has_cache() && !session.history().empty() && !session.last_logits().empty());
  const bool dir_ok = opts_.file.empty() && !opts_.dir.empty();
  const std::vector<int32_t>& ids = session.history();
  Job j{opts_.file.empty() ? opts_.dir / prompt_cache_file_name(id_, ids) : opts_.file, ids, {}, {}};
  const auto logits = session.last_logits();
  j.logits.assign(logits.begin(), logits.end());
  session.cache().serialize(j.kv_state);
  std::vector<Job> jobs;
  jobs.push_back(std::move(j));
  write_async(std::move(jobs), {}, dir_ok);
}

PromptCacheSave PromptCache::finish() { return pending_.valid() ? pending_.get() : PromptCacheSave{}; }

}  // namespace ptllm
