#pragma once
// Reading files this runtime did not write, and writing files other runs read back.
//
// Readers never block and never grow without bound: a path is opened with O_NONBLOCK and checked with
// fstat to be a regular file (a FIFO, a device or a directory is an error, never a hang), and its size
// is checked against a limit before anything is allocated.
//
// Writers are crash-safe: a temporary file in the same directory, fsync, rename, fsync of the
// directory, so that no reader ever sees a partial file under the final name. A temporary is named
// "<final name>.tmp-<pid>-<8 hex digits>", so that a later run recognises one left by a killed writer
// (is_stale_temporary) and removes it.
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace ptllm {

// Size limits of the files read whole (a limit is a bound on memory, far above any real file).
inline constexpr uint64_t kMaxJsonConfigBytes = uint64_t(64) << 20;     // config.json, *_config.json, index
inline constexpr uint64_t kMaxTokenizerJsonBytes = uint64_t(512) << 20;  // tokenizer.json
inline constexpr uint64_t kMaxTextBytes = uint64_t(1) << 30;             // eval --text, prompt files

// "a FIFO", "a directory", "a character device", ... for messages.
std::string file_type_name(unsigned mode);

// An open, regular, readable file: the descriptor and its size. Throws ptllm::Error "PATH: problem"
// ("problem" alone without path_in_errors, for callers that name the file themselves).
class RegularFile {
 public:
  explicit RegularFile(const std::filesystem::path& path, bool path_in_errors = true);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  // Reads exactly n bytes at offset (throws when the file is shorter than it was).
  void read_at(char* dst, size_t n, uint64_t offset) const;

 private:
  std::string prefix_;  // "PATH: " or ""
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The whole file, at most max_bytes ("PATH: is N bytes, more than the limit of M bytes for WHAT").
std::string read_whole_file(const std::filesystem::path& path, uint64_t max_bytes, std::string_view what);

// Standard input to its end, at most max_bytes ("standard input: more than the limit of M bytes for
// WHAT"): read in pieces, so that an endless input (/dev/zero) stops at the limit.
std::string read_standard_input(uint64_t max_bytes, std::string_view what);

// A file written in pieces and then committed atomically (the streaming form of
// write_file_atomically, for outputs too large to hold in memory: make-model's weights).
// Destroyed without commit() (an exception, an early return), it removes its temporary.
class AtomicFile {
 public:
  explicit AtomicFile(const std::filesystem::path& path);  // creates the temporary; throws ptllm::Error
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(std::string_view bytes);  // throws ptllm::Error (the temporary removed)
  // What commit() guarantees: Durable (fsync of the file and of its directory: the file survives a
  // power loss) or Atomic (the rename only: no reader ever sees a partial file, but a power loss may
  // leave a torn one; for files that verify themselves on every read, such as the server's block
  // files, where a torn file is a miss).
  enum class Sync { Durable, Atomic };
  // [fsync,] rename over the final name[, fsync of the directory]. Returns the bytes written.
  uint64_t commit(Sync sync = Sync::Durable);

 private:
  [[noreturn]] void fail(const std::string& what, int err);
  std::filesystem::path path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

// A temporary file beside `path`, fsync, rename, fsync of the directory. Returns the bytes written;
// throws ptllm::Error (the temporary removed) on any failure, a full disk or a file-size limit included.
uint64_t write_file_atomically(const std::filesystem::path& path, std::initializer_list<std::string_view> parts);

// If `name` is a temporary of write_file_atomically(): the pid of its writer.
std::optional<int> temporary_writer(std::string_view name);
// A temporary left by a writer that is gone (its pid no longer runs), or older than max_age_s
// (a pid can be reused).
bool is_stale_temporary(const std::filesystem::path& path, int64_t max_age_s = 3600);
// Removes the stale temporaries of `path` ("<path>.tmp-<pid>-<hex>" beside it): a writer of one
// file that was killed leaves one, which the next write of that file clears. Errors are ignored.
void remove_stale_temporaries(const std::filesystem::path& path);

}  // namespace ptllm
