// posttrainllm: command dispatch. Exit codes: 0 ok, 1 runtime error (bad file, ...), 2 usage error.
#include <cstdio>
#include <exception>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"posttrainllm: LLM inference with a composable KV-cache engine"};
  app.require_subcommand(1);
  std::vector<ptllm::cli::Command> commands = {
      ptllm::cli::add_sample_command(app),
      ptllm::cli::add_tokenize_command(app),
      ptllm::cli::add_eval_command(app),
      ptllm::cli::add_cache_command(app),
      ptllm::cli::add_bench_command(app),
      ptllm::cli::add_make_model_command(app),
      ptllm::cli::add_template_command(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    for (auto& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const ptllm::UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 2;
}
