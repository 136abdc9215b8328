#pragma once
// Each command registers a CLI11 subcommand and returns how to run it once parsed.
#include <CLI/CLI.hpp>
#include <functional>

namespace ptllm::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // returns the process exit code
};

Command add_sample_command(CLI::App& root);
Command add_tokenize_command(CLI::App& root);
Command add_eval_command(CLI::App& root);
Command add_cache_command(CLI::App& root);
Command add_bench_command(CLI::App& root);
Command add_make_model_command(CLI::App& root);
Command add_template_command(CLI::App& root);
Command add_chat_command(CLI::App& root);
Command add_serve_command(CLI::App& root);
Command add_quantize_command(CLI::App& root);

}  // namespace ptllm::cli
