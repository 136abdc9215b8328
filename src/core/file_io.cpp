#include "core/file_io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "core/error.h"

namespace ptllm {

namespace fs = std::filesystem;

namespace {

std::string errno_text(int err) { return std::strerror(err); }

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

constexpr std::string_view kTempMark = ".tmp-";

}  // namespace

std::string file_type_name(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
  }
  return "not a regular file";
}

RegularFile::RegularFile(const fs::path& path, bool path_in_errors)
    : prefix_(path_in_errors ? path.string() + ": " : std::string()) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. It changes
  // nothing for a regular file.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) throw Error(prefix_ + "cannot open: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw Error(prefix_ + "cannot stat: " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw Error(prefix_ + "is " + file_type_name(st.st_mode) + ", not a regular file");
  }
  size_ = uint64_t(st.st_size);
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

void RegularFile::read_at(char* dst, size_t n, uint64_t offset) const {
  while (n > 0) {
    const ssize_t got = ::pread(fd_, dst, std::min<size_t>(n, size_t(1) << 30), off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error(prefix_ + "cannot read: " + errno_text(errno));
    if (got == 0) throw Error(prefix_ + "truncated while reading");
    dst += got;
    n -= size_t(got);
    offset += uint64_t(got);
  }
}

std::string read_whole_file(const fs::path& path, uint64_t max_bytes, std::string_view what) {
  const RegularFile f(path);
  if (f.size() > max_bytes)
    throw Error(path.string() + ": is " + std::to_string(f.size()) + " bytes, more than the limit of " +
                std::to_string(max_bytes) + " bytes for " + std::string(what));
  std::string out(size_t(f.size()), '\0');
  f.read_at(out.data(), out.size(), 0);
  return out;
}

std::string read_standard_input(uint64_t max_bytes, std::string_view what) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t got = ::read(STDIN_FILENO, buf, sizeof buf);
    if (got == 0) return out;
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error("standard input: cannot read: " + errno_text(errno));
    }
    if (out.size() + size_t(got) > max_bytes)
      throw Error("standard input: more than the limit of " + std::to_string(max_bytes) + " bytes for " +
                  std::string(what));
    out.append(buf, size_t(got));
  }
}

AtomicFile::AtomicFile(const fs::path& path) : path_(path) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char suffix[48];
  std::snprintf(suffix, sizeof suffix, "%.*s%d-%08llx", int(kTempMark.size()), kTempMark.data(), int(::getpid()),
                static_cast<unsigned long long>(rng() & 0xffffffffu));
  tmp_ = path.string() + suffix;
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot create " + tmp_.string() + ": " + errno_text(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::fail(const std::string& what, int err) {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  ::unlink(tmp_.c_str());
  throw Error(what + ": " + errno_text(err));
}

void AtomicFile::write(std::string_view bytes) {
  PTLLM_CHECK(fd_ >= 0);
  while (!bytes.empty()) {
    // A file-size limit gives EFBIG here (SIGXFSZ is ignored by the CLI), a full disk ENOSPC.
    const ssize_t n = ::write(fd_, bytes.data(), std::min<size_t>(bytes.size(), size_t(1) << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot write " + path_.string(), errno);
    if (n == 0) fail("cannot write " + path_.string(), EIO);
    bytes.remove_prefix(size_t(n));
    written_ += uint64_t(n);
  }
}

uint64_t AtomicFile::commit(Sync sync) {
  PTLLM_CHECK(fd_ >= 0);
  if (sync == Sync::Durable && ::fsync(fd_) != 0) fail("cannot sync " + path_.string(), errno);
  if (::close(std::exchange(fd_, -1)) != 0) fail("cannot write " + path_.string(), errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    throw Error("cannot rename to " + path_.string() + ": " + errno_text(err));
  }
  if (sync == Sync::Atomic) return written_;
  // The rename itself is durable only once the directory is synced.
  const fs::path parent = path_.has_parent_path() ? path_.parent_path() : fs::path(".");
  Fd dir(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.fd >= 0) ::fsync(dir.fd);
  return written_;
}

uint64_t write_file_atomically(const fs::path& path, std::initializer_list<std::string_view> parts) {
  AtomicFile f(path);
  for (std::string_view p : parts) f.write(p);
  return f.commit();
}

std::optional<int> temporary_writer(std::string_view name) {
  const size_t at = name.rfind(kTempMark);
  if (at == std::string_view::npos || at == 0) return std::nullopt;
  std::string_view rest = name.substr(at + kTempMark.size());  // "<pid>-<8 hex>"
  const size_t dash = rest.find('-');
  if (dash == std::string_view::npos || dash == 0 || rest.size() - dash - 1 != 8) return std::nullopt;
  int pid = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + dash, pid);
  if (ec != std::errc() || end != rest.data() + dash || pid <= 0) return std::nullopt;
  for (char c : rest.substr(dash + 1))
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return std::nullopt;
  return pid;
}

bool is_stale_temporary(const fs::path& path, int64_t max_age_s) {
  const std::optional<int> pid = temporary_writer(path.filename().string());
  if (!pid) return false;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (*pid != ::getpid() && ::kill(*pid, 0) != 0 && errno == ESRCH) return true;  // its writer is gone
  const int64_t age = int64_t(std::chrono::duration_cast<std::chrono::seconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count()) -
                      int64_t(st.st_mtim.tv_sec);
  return age > max_age_s;
}

void remove_stale_temporaries(const fs::path& path) {
  const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const std::string prefix = path.filename().string() + std::string(kTempMark);
  std::error_code ec;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(prefix) && temporary_writer(name) && is_stale_temporary(it->path()))
      ::unlink(it->path().c_str());
  }
}

}  // namespace ptllm
