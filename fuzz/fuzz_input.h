#pragma once
// What the reader fuzz targets share: an input split into parts, and files of a fixed scratch
// directory (the readers under test take paths, as the CLI gives them).
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace ptllm::fuzz {

// Parts of an input separated by this line (the seeds and the dictionaries use it too).
inline constexpr std::string_view kSeparator = "\n#----#\n";

inline std::vector<std::string_view> split_input(const uint8_t* data, size_t size, size_t max_parts) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t at = in.find(kSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(in.substr(0, at));
    in.remove_prefix(at + kSeparator.size());
  }
  parts.push_back(in);
  parts.resize(max_parts);  // missing parts are empty
  return parts;
}

// A directory of this process under /dev/shm (or the temp directory), created once.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    std::filesystem::path d = base / ("ptllm-fuzz-" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

inline std::string source_dir() { return PTLLM_SOURCE_DIR; }

}  // namespace ptllm::fuzz
