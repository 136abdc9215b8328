#pragma once
// The speculative-decoding options of sample and chat (llama-server's spellings) and their report.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <memory>
#include <string>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

#include "engine/speculative.h"

namespace ptllm::cli {

struct SpecArgs {
  std::string type = "none";
  std::string model_draft;  // --model-draft: a directory or a GGUF file
  SpecOptions opts;
  bool fixed = false;
};

void add_spec_options(CLI::App& app, SpecArgs& a);
// The validated options (throws UsageError naming the flag). --model-draft alone means --spec-type draft.
SpecOptions spec_options(const SpecArgs& a);

// A draft model loaded for --model-draft, its vocabulary checked against the target's.
struct DraftModel {
  std::unique_ptr<Model> model;
};
// Loads --model-draft when given (null otherwise) and points `o` at it; the draft runs on `pool`
// with a cache of ctx_size tokens. Throws UsageError naming both models when the vocabularies differ.
std::unique_ptr<DraftModel> load_draft_model(const SpecArgs& a, SpecOptions& o, const Tokenizer& target,
                                             const std::string& target_name, ThreadPool& pool, int ctx_size);
// "speculation: ngram, drafted 120, accepted 96 (80.0%), 30 verification steps (4.20 tokens each),
// 12 plain steps"; "" when off.
std::string spec_line(const SpecOptions& o, const SpecStats& s);
nlohmann::json spec_json(const SpecOptions& o, const SpecStats& s);

}  // namespace ptllm::cli
