#pragma once
// Standard output that never loses data silently: a failed write (a full disk, a closed stdout) is
// an error; a reader that went away (EPIPE, `| head`) is not: the command stops writing and ends.
#include <string_view>

#include "core/error.h"

namespace ptllm::cli {

// A write of the command's output failed for another reason than EPIPE (main.cpp: exit code 1).
struct OutputError : Error {
  using Error::Error;
};

// Opens /dev/null read-only on each of fds 0, 1, 2 that is closed, before any other file is opened:
// a file opened later cannot take the number of stdout (its bytes would go into that file), and
// writes to a closed stdout fail (EBADF) instead of going nowhere.
void reserve_standard_streams();

// Writes and flushes. Returns false when the reader is gone (EPIPE); throws OutputError when the
// write failed otherwise.
bool write_stdout(std::string_view text);
bool flush_stdout();

// At the end of a command: flushes stdout and says whether everything written reached it, EPIPE
// excepted. The message ("cannot write the output to stdout: No space left on device") is empty
// when it did.
std::string stdout_failure();

}  // namespace ptllm::cli
