#pragma once
// What memory this machine has left, for refusing a size that cannot fit before allocating it.
#include <cstddef>
#include <optional>
#include <string>

namespace ptllm {

// MemAvailable from /proc/meminfo (what can be allocated without swapping), else the physical
// memory; nullopt where neither is known.
std::optional<size_t> available_memory_bytes();
// "1.5 GiB", "320.0 MiB", "12 KiB": for messages.
std::string memory_size_text(size_t bytes);

}  // namespace ptllm
