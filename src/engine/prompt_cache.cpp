#include "engine/prompt_cache.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/session.h"
#include "kernels/ops.h"

namespace ptllm {

namespace fs = std::filesystem;

namespace {

// Shortest prefix, and shortest rest, with which a dense cache's prefix is extended (see prefill()):
// longer than the batches the matmul computes another way (kMatmulSmallRows).
constexpr size_t kMinDensePiece = kMatmulSmallRows + 1;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool is_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
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

PromptCache::PromptCache(PromptCacheOptions opts, PromptCacheIdentity id) : opts_(std::move(opts)), id_(std::move(id)) {
  PTLLM_CHECK(opts_.enabled());
}

PromptCache::~PromptCache() {
  if (pending_.valid()) pending_.wait();
}

// Whether the file's header says its state can be restored for `prompt`: it is this run's key, and
// its ids are a prefix of the prompt that can be extended exactly.
bool PromptCache::header_fits(std::span<const int32_t> prompt, int64_t grid, PromptCacheLoad& load) const {
  const size_t N = prompt.size();
  auto usable = [&](size_t n) {
    if (n == N) return true;
    return grid > 1 ? int64_t(n) % grid == 0 : n >= kMinDensePiece && N - n >= kMinDensePiece;
  };
  std::error_code ec;
  if (!fs::exists(opts_.file, ec)) {
    if (ec) load.warnings.push_back("ignoring " + opts_.file.string() + ": " + ec.message());
    return false;
  }
  try {
    const CacheFile h = read_cache_header(opts_.file);
    if (h.identity.config_key != id_.config_key) throw Error(mismatch(h.identity, id_));
    return is_prefix(h.ids, prompt) && usable(h.ids.size());
  } catch (const Error& e) {
    load.warnings.push_back("ignoring " + opts_.file.string() + ": " + e.what());
    return false;
  }
}

void PromptCache::write_async(Job job) {
  if (pending_.valid()) pending_.wait();  // one write at a time
  pending_ = std::async(std::launch::async, [this, job = std::move(job)]() {
    PromptCacheSave s;
    const fs::path& path = opts_.file;
    if (const auto why = not_replaceable(path)) {
      s.warnings.push_back("not saving " + path.string() + ": " + *why + " (left as it is)");
      return s;
    }
    try {
      remove_stale_temporaries(path);
      const uint64_t bytes = write_cache_file(path, id_, now_ms(), job.ids, job.logits, job.kv_state);
      s.saved.push_back({path, int64_t(job.ids.size()), bytes});
    } catch (const std::exception& e) {
      s.warnings.push_back("cannot save " + path.string() + ": " + e.what());
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
  // every row was computed in a batch of more than kMatmulSmallRows rows, as in a cold prefill of the
  // whole prompt: so both pieces are longer than that (a file of more tokens than that was written
  // after such feeds only, so all its rows were).
  const int64_t grid = session.cache().has_policy() ? session.cache().max_append() : 1;

  const fs::path& path = opts_.file;
  if (header_fits(prompt, grid, load)) {
    try {
      std::string buffer;
      const CacheFile f = read_cache_file(path, buffer);
      if (f.identity.config_key != id_.config_key) throw Error(mismatch(f.identity, id_));
      if (f.identity.vocab_size != id_.vocab_size) throw Error("holds logits for another vocabulary");
      if (!is_prefix(f.ids, prompt)) throw Error("changed while being read");
      session.restore(f.ids, f.kv_state, f.logits);
      load.reused = int64_t(f.ids.size());
      load.file = path;
      load.bytes_read = f.file_size;
    } catch (const std::exception& e) {  // ptllm::Error, or a filesystem or allocation failure: still the cold path
      // A file removed since its header was read is a plain miss, said nowhere.
      std::error_code ec;
      if (fs::exists(path, ec) || ec) load.warnings.push_back("ignoring " + path.string() + ": " + e.what());
    }
  }
  const int64_t P = load.reused;
  load.outcome = P == N ? PromptCacheOutcome::Hit : P > 0 ? PromptCacheOutcome::PartialHit : PromptCacheOutcome::Miss;
  if (P == N) return load;

  session.feed(prompt.subspan(size_t(P)));
  Job j{std::vector<int32_t>(prompt.begin(), prompt.end()), {}, {}};
  const auto logits = session.last_logits();
  j.logits.assign(logits.begin(), logits.end());
  session.cache().serialize(j.kv_state);
  write_async(std::move(j));
  return load;
}

PromptCacheSave PromptCache::finish() { return pending_.valid() ? pending_.get() : PromptCacheSave{}; }

}  // namespace ptllm
