#pragma once
// Streaming weights from memory. A decode step reads every matrix once, each thread its own run front
// to back. The hardware prefetchers stop at each 4 KiB page, and the first read of the next page then
// waits for its translation and for memory. One software prefetch every few KiB of the stream, 8 KiB
// ahead, starts the next pages early. Prefetching every line instead of it was slower on a Zen 5;
// the AVX-512 packed products do both, the AVX2 ones every line alone (kernels/x86/ggml_kernels_impl.h,
// kAheadBytes).
#include <cstddef>

namespace ptllm {

inline constexpr size_t kTouchAheadBytes = 8192;
// At most this many bytes of a stream between two touches (one to two a page).
inline constexpr size_t kTouchEveryBytes = 3584;

// A prefetch of the line kTouchAheadBytes past p (never faults). Always inlined, as every helper
// that only prefetches: GCC finds a copy left out of line `const` and deletes the calls to it.
[[gnu::always_inline]] inline void touch_ahead(const void* p) {
  __builtin_prefetch(static_cast<const char*>(p) + kTouchAheadBytes);
}

// How many units of `unit_bytes` a stream reads between touches.
constexpr int touch_every(size_t unit_bytes) {
  return unit_bytes >= kTouchEveryBytes ? 1 : int(kTouchEveryBytes / unit_bytes);
}

}  // namespace ptllm
