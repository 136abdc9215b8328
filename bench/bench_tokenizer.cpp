// Tokenizer throughput on one core: encode (the whole text at once, and line by line as data
// preparation does), decode, and streaming detokenization; bytes/s counts bytes of text.
//
//   bench_tokenizer [benchmark flags] [TOKENIZER_PATH [TEXT_FILE]]
//   PTLLM_TOKENIZER=... PTLLM_BENCH_TEXT=... bench_tokenizer [benchmark flags]
// Defaults: models/kjv-tiny and ../shared/corpus/train.txt (relative to the source tree).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

std::string setting(int argc, char** argv, int index, const char* env, const std::string& dflt) {
  if (argc > index) return argv[index];
  if (const char* v = std::getenv(env)) return v;
  return dflt;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line + "\n");
  return lines;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);  // leaves only the arguments that are not its flags
  const std::string src = PTLLM_SOURCE_DIR;
  const std::string tok_path = setting(argc, argv, 1, "PTLLM_TOKENIZER", src + "/models/kjv-tiny");
  const std::string text_path =
      setting(argc, argv, 2, "PTLLM_BENCH_TEXT", src + "/../shared/corpus/train.txt");

  static const ptllm::Tokenizer tok = ptllm::Tokenizer::load(tok_path);
  std::ifstream in(text_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "bench_tokenizer: cannot open %s\n", text_path.c_str());
    return 1;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  static const std::string text = ss.str();
  static const std::vector<std::string> lines = split_lines(text);
  static const std::vector<int32_t> ids = tok.encode(text);
  std::fprintf(stderr, "tokenizer %s, text %s: %zu bytes, %zu tokens\n", tok_path.c_str(),
               text_path.c_str(), text.size(), ids.size());
  const auto bytes = static_cast<int64_t>(text.size());

  benchmark::RegisterBenchmark("Encode/whole_text", [bytes](benchmark::State& state) {
    for (auto _ : state) benchmark::DoNotOptimize(tok.encode(text));
    state.SetBytesProcessed(state.iterations() * bytes);
  })->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("Encode/line_by_line", [bytes](benchmark::State& state) {
    for (auto _ : state)
      for (const std::string& line : lines) benchmark::DoNotOptimize(tok.encode(line));
    state.SetBytesProcessed(state.iterations() * bytes);
  })->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("Decode", [bytes](benchmark::State& state) {
    for (auto _ : state) benchmark::DoNotOptimize(tok.decode(ids));
    state.SetBytesProcessed(state.iterations() * bytes);
  })->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("StreamingDetokenizer", [bytes](benchmark::State& state) {
    for (auto _ : state) {
      ptllm::StreamingDetokenizer detok(tok);
      size_t n = 0;
      for (int32_t id : ids) n += detok.push(id).size();
      n += detok.finish().size();
      benchmark::DoNotOptimize(n);
    }
    state.SetBytesProcessed(state.iterations() * bytes);
  })->Unit(benchmark::kMillisecond);

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
