#pragma once
// Errors for untrusted input (files, flags): a message that names the file and the field.
// Internal invariants use assert / PTLLM_CHECK instead.
#include <stdexcept>
#include <string>

namespace ptllm {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A bad command-line value: the CLI exits with code 2 for these (usage errors), 1 for Error.
struct UsageError : Error {
  using Error::Error;
};

[[noreturn]] void fail_invariant(const char* expr, const char* file, int line);

}  // namespace ptllm

#define PTLLM_CHECK(cond) \
  do { if (!(cond)) ::ptllm::fail_invariant(#cond, __FILE__, __LINE__); } while (0)
