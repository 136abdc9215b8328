// posttrainllm: command dispatch. Exit codes: 0 ok, 1 runtime error (bad file, a failed write of the
// output, ...), 2 usage error; `sample` interrupted by Ctrl-C exits 130 after its footer.
#include <csignal>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/output.h"
#include "core/error.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"posttrainllm: LLM inference with a composable KV-cache engine"};
  app.require_subcommand(1);
  app.set_version_flag("--version", ptllm::cli::version_text(), "Print the version and build, then exit");
  // Every command: defaults shown in --help; a repeated option takes its last value (as llama.cpp).
  app.failure_message([](const CLI::App* cmd, const CLI::Error& e) {
    return "error: " + std::string(e.what()) + "\nRun with --help for more information.\n";
  });
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::vector<ptllm::cli::Command> commands = {
      ptllm::cli::add_sample_command(app),
      ptllm::cli::add_tokenize_command(app),
      ptllm::cli::add_eval_command(app),
      ptllm::cli::add_cache_command(app),
      ptllm::cli::add_bench_command(app),
      ptllm::cli::add_make_model_command(app),
      ptllm::cli::add_template_command(app),
      ptllm::cli::add_chat_command(app),
      ptllm::cli::add_serve_command(app),
      ptllm::cli::add_quantize_command(app),
  };
  for (auto& c : commands) c.app->set_version_flag("--version", ptllm::cli::version_text(), "Print the version and build");
  std::vector<std::string> args;
  try {
    args = ptllm::cli::preprocess_args(app, argc, argv);
  } catch (const ptllm::UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  try {
    app.parse(int(ptrs.size()), ptrs.data());
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
  for (auto& c : commands)
    if (c.app->parsed()) return c.run();
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  ptllm::cli::reserve_standard_streams();
  // A save that reaches `ulimit -f` gets EFBIG (a one-line warning, the temporary removed) instead
  // of SIGXFSZ killing the run; a closed stdout (`| head -c 1`) gets EPIPE (sample stops generating)
  // instead of SIGPIPE killing the process in the middle of a save.
  std::signal(SIGXFSZ, SIG_IGN);
  std::signal(SIGPIPE, SIG_IGN);
  int code = 0;
  try {
    code = run(argc, argv);
  } catch (const ptllm::UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  // Output still buffered (--help, a table, the last line) and writes that failed unchecked.
  const std::string failure = ptllm::cli::stdout_failure();
  if (failure.empty()) return code;
  std::fprintf(stderr, "error: %s\n", failure.c_str());
  return code == 0 ? 1 : code;
}
