#pragma once
// The speculative-decoding options of sample and chat (llama-server's spellings) and their report.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/speculative.h"

namespace ptllm::cli {

struct SpecArgs {
  std::string type = "none";
  std::string model_draft;  // --model-draft: refused until a draft model is supported
  SpecOptions opts;
  bool fixed = false;
};

void add_spec_options(CLI::App& app, SpecArgs& a);
// The validated options (throws UsageError naming the flag).
SpecOptions spec_options(const SpecArgs& a);
// "speculation: ngram, drafted 120, accepted 96 (80.0%), 30 verification steps (4.20 tokens each),
// 12 plain steps"; "" when off.
std::string spec_line(const SpecOptions& o, const SpecStats& s);
nlohmann::json spec_json(const SpecOptions& o, const SpecStats& s);

}  // namespace ptllm::cli
