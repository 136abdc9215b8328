// The output of the commands that print what they compute (sample, chat, tokenize): a write that
// fails is an error with a non-zero exit code, never silently lost; a reader that went away
// (`| head`) is an ordinary end.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace ptllm {
namespace {

std::string cli(const std::string& args) { return test::binary() + " " + args; }
bool has(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

std::string tiny() { return test::repo_model("kjv-tiny").string(); }

// The commands under test; kjv-tiny has no chat template of its own.
struct CliOutputTest : ::testing::Test {
  test::TempDir tmp;
  std::vector<std::string> commands() {
    const auto tmpl = tmp.path / "t.jinja";
    std::ofstream(tmpl) << "{{ bos_token }}{% for m in messages %}{{ m.content }}\n{% endfor %}";
    const std::string chat = "chat --chat-template " + tmpl.string() + " -f - --temperature 0 -n 4 --threads 2";
    return {"sample -p 'In the beginning' -n 8 --temperature 0 --threads 2",
            "sample -p 'In the beginning' -n 8 --temperature 0 --threads 2 --json",
            chat,
            chat + " --json",
            "tokenize " + tiny() + " -p 'In the beginning'",
            "tokenize " + tiny() + " --decode '1 2 3'"};
  }
};

// Each command with stdout on a full disk, and with stdout closed (the inner redirection: run_command's
// own applies to the subshell).
TEST_F(CliOutputTest, AFullDiskIsAnErrorWithExitCode1) {
  for (const std::string& c : commands()) {
    SCOPED_TRACE(c);
    const auto r = test::run_command("(echo 'In the beginning' | " + cli(c) + " >/dev/full)");
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(has(r.err, "error: cannot write the output to stdout: No space left on device")) << r.err;
  }
}

TEST_F(CliOutputTest, AClosedStdoutIsAnErrorWithExitCode1) {
  for (const std::string& c : commands()) {
    SCOPED_TRACE(c);
    const auto r = test::run_command("(echo 'In the beginning' | " + cli(c) + " >&-)");
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(has(r.err, "error: cannot write the output: stdout is closed")) << r.err;
  }
}

// --help and the other commands' tables go through the same check at exit.
TEST_F(CliOutputTest, HelpOnAFullDiskIsAnError) {
  const auto r = test::run_command("(" + cli("sample --help") + " >/dev/full)");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, "error: cannot write the output to stdout")) << r.err;
}

// A reader that stops reading is no error: sample says so in its footer, tokenize stops quietly.
TEST_F(CliOutputTest, AReaderThatWentAwayIsNoError) {
  auto r = test::run_command("(" + cli("sample -p 'In the beginning' -n 300 --ignore-eos --temperature 0 --threads 2") +
                             " | head -c 1)");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "stopped: stdout was closed (nobody reads the output)")) << r.err;
  EXPECT_FALSE(has(r.err, "error:")) << r.err;
  std::string text;
  while (text.size() < (1 << 20)) text += "In the beginning God created the heaven and the earth.\n";
  std::ofstream(tmp.path / "big.txt") << text;
  // Ids of a megabyte of text fill the pipe; `exit` of the pipeline is the tokenizer's.
  r = test::run_command("bash -c 'set -o pipefail; " + cli("tokenize " + tiny() + " -f " + (tmp.path / "big.txt").string()) +
                        " | head -c 1 >/dev/null'");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

}  // namespace
}  // namespace ptllm
