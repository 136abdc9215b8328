#pragma once
// What the operating system is asked where POSIX has no common call: Linux reads /proc, macOS has
// its own calls. The one place for them outside the guarded spots docs/arm64.md lists.
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <new>

namespace ptllm {

// The running program's file (Linux: /proc/self/exe; macOS: _NSGetExecutablePath), or an empty path
// where the system does not say.
std::filesystem::path executable_path();
// A path to stat the running program's file by: on Linux /proc/self/exe, which still names that
// file once another is put in its place; elsewhere executable_path().
std::filesystem::path executable_file();
// A folder whose entries are named by this process's open descriptors (Linux: /proc/self/fd; macOS
// and the BSDs: /dev/fd).
const char* open_fds_dir();
// The process's peak resident set in bytes (Linux: VmHWM of /proc/self/status, which
// reset_peak_rss restarts; elsewhere getrusage's ru_maxrss), 0 where unknown.
size_t peak_rss_bytes();
// Restarts the peak at the current resident set (Linux: /proc/self/clear_refs); false where the
// system cannot.
bool reset_peak_rss();

// n bytes for a large buffer streamed whole (packed weights, the bandwidth test), freed with
// std::free, or null where out of memory: from `huge_from` bytes on (4 MiB unless told), 2 MiB-aligned,
// rounded up to 2 MiB and advised onto transparent huge pages (Linux's MADV_HUGEPAGE), so its pages
// are faulted in 2 MiB at a time and the stream misses the TLB less; smaller ones cache-line aligned.
// Advice only.
void* huge_page_alloc(size_t n, size_t huge_from = size_t(4) << 20);

// A std::vector allocator for activations (ForwardState): buffers of 1 MiB and more on huge pages
// (huge_page_alloc), so a session's first prompt faults its activations in 2 MiB at a time instead
// of 4 KiB (a quarter of kjv-small's 512-token prefill went to those faults).
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    void* p = huge_page_alloc(n * sizeof(T), size_t(1) << 20);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) noexcept { std::free(p); }
  friend bool operator==(const HugePageAllocator&, const HugePageAllocator&) { return true; }
};

// Whether the environment variable `name` is set to something other than "" and "0" (the runtime's
// PTLLM_NO_* and PTLLM_* switches).
bool env_switch(const char* name);

}  // namespace ptllm
