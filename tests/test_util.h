#pragma once
// Paths and small helpers shared by the tests.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace ptllm::test {

// A ChatML template, for models that ship none.
inline constexpr const char* kChatML =
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Genesis 1:1-6: a prompt of several 32-token KV blocks for the kjv models.
inline constexpr const char* kGenesis =
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
    "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God "
    "said, Let there be light: and there was light. And God saw the light, that it was good: and God divided the "
    "light from the darkness. And God called the light Day, and the darkness he called Night. And the evening "
    "and the morning were the first day. And God said, Let there be a firmament in the midst of the waters, and "
    "let it divide the waters from the waters.";

// The sanitized tests' build for CI (fuzz/CMakeLists.txt ptllm_sanitized_tests: unoptimized, ASan and
// UBSan, which run the loops ten to a hundred times slower) defines PTLLM_TEST_LIGHT: the long
// randomized and many-step tests then run a fraction of their cases there. The Release tests run
// them all.
#ifdef PTLLM_TEST_LIGHT
inline constexpr bool kLightTests = true;
#else
inline constexpr bool kLightTests = false;
#endif
// `full` in the Release tests, about a fifth of it (at least `least`) in the light build.
constexpr int light_or(int full, int least = 1) { return kLightTests ? std::max(least, full / 5) : full; }

// n draws of N(0, sd^2) from a seeded generator: the kernels' tests' random matrices and rows.
inline std::vector<float> normal(size_t n, float sd, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

inline std::filesystem::path repo_dir() { return PTLLM_SOURCE_DIR; }
inline std::filesystem::path repo_model(const std::string& name) { return repo_dir() / "models" / name; }
// ../shared beside the repository (kjv-small and the corpus live only there); PTLLM_SHARED overrides.
inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("PTLLM_SHARED")) return env;
  return repo_dir().parent_path() / "shared";
}
inline std::filesystem::path shared_model(const std::string& name) { return shared_dir() / "models" / name; }

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

template <typename T>
std::vector<T> tensor_values(const SafetensorsFile& f, const std::string& name) {
  const TensorView& t = f.tensors().at(name);
  std::vector<T> out(t.nbytes / sizeof(T));
  std::memcpy(out.data(), t.data, t.nbytes);
  return out;
}

// A fresh empty directory under the system temp dir, removed by the destructor.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ptllm-test-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace ptllm::test

namespace ptllm::test {

struct RawTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::string bytes;
};

// Writes a safetensors file; `header_override` replaces the computed JSON header when non-empty.
inline void write_safetensors(const std::filesystem::path& path, const std::vector<RawTensor>& tensors,
                              const std::string& header_override = "") {
  nlohmann::json h = nlohmann::json::object();
  size_t off = 0;
  for (const auto& t : tensors) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string header = header_override.empty() ? h.dump() : header_override;
  if (header_override.empty()) header.append((8 - header.size() % 8) % 8, ' ');  // as the reference writer pads
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(char((n >> (8 * i)) & 0xff));
  out << header;
  for (const auto& t : tensors) out << t.bytes;
}

// Every tensor of a safetensors file, as RawTensor (to rewrite a model with one thing changed).
inline std::vector<RawTensor> read_raw(const std::filesystem::path& path) {
  SafetensorsFile f(path);
  std::vector<RawTensor> out;
  for (const auto& [name, t] : f.tensors())
    out.push_back({name, std::string(dtype_name(t.dtype)), t.shape,
                   std::string(reinterpret_cast<const char*>(t.data), t.nbytes)});
  return out;
}

// Runs a shell command; returns the exit code and fills stdout / stderr.
struct RunResult {
  int code = -1;
  std::string out, err;
};
inline RunResult run_command(const std::string& cmd) {
  TempDir tmp;
  const auto out_path = tmp.path / "out", err_path = tmp.path / "err";
  int status = std::system((cmd + " >" + out_path.string() + " 2>" + err_path.string() + " </dev/null").c_str());
  RunResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

// Next-token NLL at every position of `logits` [n][vocab] for ids[1..n] (teacher forcing).
inline std::vector<double> nll_of(std::span<const float> logits, const std::vector<int32_t>& ids, int V) {
  std::vector<double> out;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* row = logits.data() + t * size_t(V);
    const float mx = *std::max_element(row, row + V);
    double lse = 0;
    for (int i = 0; i < V; ++i) lse += std::exp(double(row[i]) - mx);
    out.push_back(std::log(lse) + mx - row[ids[t + 1]]);
  }
  return out;
}

inline double mean(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v;
  return s / double(x.size());
}

inline std::string binary() { return PTLLM_BINARY; }

}  // namespace ptllm::test
