#include "cli/output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace ptllm::cli {

namespace {
int g_errno = 0;               // the last failed write's errno (0 = none)
bool g_stdout_closed = false;  // fd 1 was closed when the process started
}  // namespace

void reserve_standard_streams() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int got = open("/dev/null", O_RDONLY | O_CLOEXEC);  // the lowest free number: fd itself
    if (got >= 0 && got != fd) {
      dup2(got, fd);
      close(got);
    }
    if (fd == STDOUT_FILENO) g_stdout_closed = true;
  }
}

bool flush_stdout() {
  if (std::fflush(stdout) != 0)
    g_errno = errno;
  else if (!std::ferror(stdout))
    return true;
  if (g_errno == EPIPE) return false;
  if (g_stdout_closed) throw OutputError("cannot write the output: stdout is closed");
  // g_errno is 0 when the failed write was not ours (CLI11's --help through std::cout).
  throw OutputError(std::string("cannot write the output to stdout") +
                    (g_errno != 0 ? std::string(": ") + std::strerror(g_errno) : std::string()));
}

bool write_stdout(std::string_view text) {
  errno = 0;
  if (!text.empty() && std::fwrite(text.data(), 1, text.size(), stdout) != text.size()) g_errno = errno;
  return flush_stdout();
}

std::string stdout_failure() {
  try {
    flush_stdout();
  } catch (const OutputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace ptllm::cli
