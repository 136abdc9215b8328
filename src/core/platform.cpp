#include "core/platform.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

#if defined(__APPLE__)
#include <mach-o/dyld.h>

#include <cstdint>
#include <vector>
#endif

namespace ptllm {

std::filesystem::path executable_path() {
  std::error_code ec;
#if defined(__APPLE__)
  uint32_t size = 0;
  _NSGetExecutablePath(nullptr, &size);  // asks for the size
  std::vector<char> buf(size + 1, '\0');
  if (_NSGetExecutablePath(buf.data(), &size) != 0) return {};
  std::filesystem::path p = std::filesystem::canonical(buf.data(), ec);  // the path may hold links and ".."
  return ec ? std::filesystem::path{} : p;
#else
  std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path{} : p;
#endif
}

std::filesystem::path executable_file() {
#if defined(__linux__)
  return "/proc/self/exe";
#else
  return executable_path();
#endif
}

const char* open_fds_dir() {
#if defined(__linux__)
  return "/proc/self/fd";
#else
  return "/dev/fd";
#endif
}

size_t peak_rss_bytes() {
#if defined(__linux__)
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return size_t(std::stoull(line.substr(6))) * 1024;  // reported in kB
#endif
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0 || ru.ru_maxrss <= 0) return 0;
#if defined(__APPLE__)
  return size_t(ru.ru_maxrss);  // bytes on macOS
#else
  return size_t(ru.ru_maxrss) * 1024;  // kilobytes on Linux and the BSDs
#endif
}

bool reset_peak_rss() {
#if defined(__linux__)
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return bool(out);
#else
  return false;
#endif
}

bool env_switch(const char* name) {
  const char* e = std::getenv(name);
  return e && *e && std::string_view(e) != "0";
}

void* huge_page_alloc(size_t n, size_t huge_from) {
  const size_t huge = size_t(2) << 20;
  const size_t align = n >= huge_from ? huge : 64, rounded = (std::max<size_t>(n, 1) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
#ifdef MADV_HUGEPAGE
  if (p && align == huge) madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

}  // namespace ptllm
