// KVStore over a directory: a file per token block, written by a thread of its own (see dir_store.h).
#include "store/dir_store.h"
#include "store/write_queue.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <system_error>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"

namespace ptllm::store {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kSuffix = ".kvblock";
// A bound on what one read allocates: far above any block (32 tokens of a 70B model's every layer,
// fp32, is about 80 MiB).
constexpr uint64_t kMaxBlockFileBytes = uint64_t(1) << 30;

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string mib_text(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1 << 20));
  return buf;
}

class DirStore final : public QueuedStore {
 public:
  DirStore(const DirStoreOptions& o, RateLimitedLog* log)
      : QueuedStore(o.queue_bytes), opts_(o), root_(o.dir / "blocks"), log_(log ? log : &own_log_) {
    total_bytes_ = scan_and_evict();
    start_writer("ptllm-dirstore");
  }
  ~DirStore() override { stop_writer(); }  // after every queued write was attempted

  // An absent file is handed as absent (the caller decides whether the run ends there:
  // BlockExchange::load asks for two forms of a block); the files after an unreadable one are not
  // read, and are answered absent.
  void lookup(std::span<const std::string> keys, const OnValue& on_value) override {
    if (keys.empty()) return;
    const auto t0 = Clock::now();
    double callback_seconds = 0;
    uint64_t bytes = 0;
    size_t read = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      const fs::path p = dir_store_path(opts_.dir, keys[i]);
      if (p.empty()) break;
      ++read;
      struct stat st {};
      if (::stat(p.c_str(), &st) != 0 && errno == ENOENT) {  // not written (or evicted): a plain miss
        if (!on_value(i, std::nullopt)) break;
        continue;
      }
      std::string value;
      try {
        value = read_whole_file(p, kMaxBlockFileBytes, "a block file");
      } catch (const Error& e) {
        fail(std::string("lookup: ") + e.what());
        break;
      }
      bytes += value.size();
      // The least recently used files go first when the directory is full: a hit is a use.
      ::utimensat(AT_FDCWD, p.c_str(), nullptr, 0);
      const auto c0 = Clock::now();
      const bool more = on_value(i, std::string_view(value));
      callback_seconds += std::chrono::duration<double>(Clock::now() - c0).count();
      if (!more) break;
    }
    count_lookup(read, std::chrono::duration<double>(Clock::now() - t0).count() - callback_seconds, bytes);
  }

  std::string describe() const override { return root_.string(); }

 private:
  void fail(const std::string& error) {
    count([](KVStoreStats& s) { ++s.errors; });
    log_->warn(error + " (a miss; generation goes on without the file)");
  }
  void dropped() {
    count([](KVStoreStats& s) { ++s.dropped_writes; });
  }

  // The writer thread's: one value to its file, atomically; the oldest files removed past the bound.
  void write_one(const std::string& key, const StoreValue& value) {
    const fs::path p = dir_store_path(opts_.dir, key);
    const size_t bytes = value.size();
    if (p.empty() || bytes > opts_.max_bytes) return dropped();
    std::error_code ec;
    fs::create_directories(p.parent_path(), ec);
    if (ec) {
      fail("cannot create " + p.parent_path().string() + ": " + ec.message());
      return dropped();
    }
    struct stat old {};
    const uint64_t replaced = ::stat(p.c_str(), &old) == 0 && S_ISREG(old.st_mode) ? uint64_t(old.st_size) : 0;
    try {
      AtomicFile f(p);
      value.each_part([&](std::string_view part) { f.write(part); });
      f.commit(AtomicFile::Sync::Atomic);
    } catch (const Error& e) {
      fail(std::string("write: ") + e.what());
      return dropped();
    }
    count([&](KVStoreStats& s) {
      ++s.writes;
      s.bytes_out += bytes;
    });
    total_bytes_ = total_bytes_ + bytes - std::min(replaced, total_bytes_ + bytes);
    // The running total is an estimate (another process may share the directory); a scan corrects it.
    if (total_bytes_ > opts_.max_bytes) total_bytes_ = scan_and_evict();
  }

  // Every block file under root_ (stale temporaries removed); when they take more than max_bytes, the
  // least recently used are removed until at most 90% is left (so that the next scan is far off).
  // Returns the bytes left.
  uint64_t scan_and_evict() {
    struct Entry {
      fs::path path;
      uint64_t bytes;
      int64_t mtime_ns;
    };
    std::vector<Entry> files;
    uint64_t total = 0;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec)) {
      if (it.depth() >= 1) it.disable_recursion_pending();  // blocks/<hh>/<file>: nothing deeper is ours
      const fs::path& p = it->path();
      const std::string name = p.filename().string();
      struct stat st {};
      if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (is_stale_temporary(p)) {
        fs::remove(p, ec);
        ec.clear();
        continue;
      }
      if (!name.ends_with(kSuffix)) continue;  // not ours: never counted, never removed
      files.push_back({p, uint64_t(st.st_size), int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
      total += uint64_t(st.st_size);
    }
    if (total <= opts_.max_bytes) return total;
    std::sort(files.begin(), files.end(), [](const Entry& a, const Entry& b) { return a.mtime_ns < b.mtime_ns; });
    const uint64_t target = opts_.max_bytes / 10 * 9;
    size_t removed = 0;
    uint64_t freed = 0;
    for (const Entry& e : files) {
      if (total <= target) break;
      if (fs::remove(e.path, ec)) {
        total -= e.bytes;
        freed += e.bytes;
        ++removed;
      }
      ec.clear();
    }
    std::fprintf(stderr, "prompt cache: removed %zu least recently used block files (%s) to stay under "
                 "--prompt-cache-max-mb, %s left\n", removed, mib_text(freed).c_str(), mib_text(total).c_str());
    std::fflush(stderr);
    return total;
  }

  void write_loop() override {
    std::vector<WriteQueue::Item> batch;
    while (take(batch, 1))  // false: stopping, and everything queued was attempted
      write_one(batch[0].key, batch[0].value);
  }

  DirStoreOptions opts_;
  fs::path root_;  // opts_.dir / "blocks"
  RateLimitedLog own_log_;
  RateLimitedLog* log_;
  uint64_t total_bytes_ = 0;  // the block files' bytes, as the writer thread knows them
};

}  // namespace

fs::path dir_store_path(const fs::path& dir, std::string_view key) {
  const size_t a = key.find(':');
  const size_t b = a == std::string_view::npos ? a : key.find(':', a + 1);
  if (b == std::string_view::npos) return {};
  std::string_view name = key.substr(0, a), id = key.substr(a + 1, b - a - 1), hash = key.substr(b + 1);
  // A block's quantized form (kv_store_key's ":q") goes beside its full-precision one.
  const bool quantized = hash.ends_with(":q");
  if (quantized) hash.remove_suffix(2);
  if (name.empty() || name.size() > 64 || name[0] == '.' || id.size() != 32 || hash.size() != 32 || !is_hex(id) ||
      !is_hex(hash))
    return {};
  for (char c : name)
    if (c <= ' ' || c > '~' || c == '/' || c == ':') return {};
  std::string file(name);
  file += '-';
  file += id;
  file += '-';
  file += hash;
  if (quantized) file += "-q";
  file += kSuffix;
  return dir / "blocks" / std::string(hash.substr(0, 2)) / file;
}

std::vector<DirStoreFile> list_dir_store(const fs::path& dir, std::vector<fs::path>* temporaries) {
  const fs::path root = dir / "blocks";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) throw Error(root.string() + ": no block directory (" + (ec ? ec.message() : "absent") + ")");
  std::vector<DirStoreFile> files;
  fs::recursive_directory_iterator it(root, ec), end;
  if (ec) throw Error("cannot read " + root.string() + ": " + ec.message());
  for (; !ec && it != end; it.increment(ec)) {
    if (it.depth() >= 1) it.disable_recursion_pending();  // blocks/<hh>/<file>: nothing deeper is ours
    const fs::path& p = it->path();
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (is_stale_temporary(p)) {
      if (temporaries) temporaries->push_back(p);
      continue;
    }
    if (!p.filename().string().ends_with(kSuffix)) continue;
    files.push_back({p, uint64_t(st.st_size), int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
  }
  if (ec) throw Error("cannot read " + root.string() + ": " + ec.message());
  std::sort(files.begin(), files.end(), [](const DirStoreFile& a, const DirStoreFile& b) { return a.mtime_ns < b.mtime_ns; });
  return files;
}

std::unique_ptr<KVStore> open_dir_store(const DirStoreOptions& opts, RateLimitedLog* log) {
  const fs::path root = opts.dir / "blocks";
  const std::string flag = "--prompt-cache-dir " + opts.dir.string();
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw UsageError(flag + ": cannot create the directory " + root.string() + ": " + ec.message());
  if (!fs::is_directory(root, ec)) throw UsageError(flag + ": " + root.string() + " is not a directory");
  try {
    AtomicFile probe(root / "probe");  // removed again when destroyed uncommitted
    probe.write("x");
  } catch (const Error& e) {
    throw UsageError(flag + ": the directory is not writable (" + e.what() + ")");
  }
  if (opts.max_bytes == 0) throw UsageError("--prompt-cache-max-mb: must be more than 0");
  return std::make_unique<DirStore>(opts, log);
}

}  // namespace ptllm::store
