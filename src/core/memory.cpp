#include "core/memory.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace ptllm {

std::optional<size_t> available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    size_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return size_t(pages) * size_t(page);
  return std::nullopt;
}

std::string memory_size_text(size_t bytes) {
  char buf[48];
  if (bytes >= (size_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / double(size_t(1) << 30));
  else if (bytes >= (size_t(1) << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(size_t(1) << 20));
  else
    std::snprintf(buf, sizeof buf, "%zu KiB", (bytes + 1023) / 1024);
  return buf;
}

}  // namespace ptllm
