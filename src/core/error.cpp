#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace ptllm {

void fail_invariant(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "internal error: %s failed at %s:%d\n", expr, file, line);
  std::abort();
}

}  // namespace ptllm
