// Values that ask for more than a machine has: a thread count, a chat turn without a line end, a
// StreamingLLM window. Each is refused with the flag and its bound before anything is allocated.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace ptllm {
namespace {

std::string cli(const std::string& args) { return test::binary() + " " + args; }
bool has(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }
std::string tiny() { return test::repo_model("kjv-tiny").string(); }

TEST(CliLimitsTest, EveryThreadsFlagHasABound) {
  test::TempDir tmp;
  for (const std::string& c : std::vector<std::string>{"sample -p x", "chat", "eval --text x", "bench " + tiny(), "serve",
                               "quantize " + tiny() + " " + (tmp.path / "q").string(),
                               "make-model --shape smollm2-135m " + (tmp.path / "m").string()}) {
    SCOPED_TRACE(c);
    for (const char* flag : {" -t 100000", " --threads 1025"}) {
      const auto r = test::run_command(cli(c + flag));
      EXPECT_EQ(r.code, 2) << r.err;
      EXPECT_TRUE(has(r.err, "error: --threads: must be between 0 and 1024 (got ")) << r.err;
    }
  }
}

// Threads the system cannot start (here: their stacks past the address-space limit) are an error
// naming the count, not an abort.
TEST(CliLimitsTest, ThreadsTheSystemCannotStartAreAnError) {
  const auto r = test::run_command("sh -c 'ulimit -v 1500000; exec " +
                                   cli("sample -p \"In the beginning\" -n 2 --temperature 0 -t 1000") + "'");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, "error: cannot start 1000 threads (")) << r.err;
  EXPECT_TRUE(has(r.err, "give fewer with --threads")) << r.err;
}

struct ChatTurnTest : ::testing::Test {
  test::TempDir tmp;
  std::string chat(const std::string& args) {
    const auto tmpl = tmp.path / "t.jinja";
    std::ofstream(tmpl) << "{{ bos_token }}{% for m in messages %}{{ m.content }}\n{% endfor %}";
    return cli("chat " + tiny() + " --chat-template " + tmpl.string() + " --temperature 0 -n 2 --threads 2 " + args);
  }
};

// An endless line stops at the bound (1 GB of address space would not hold an unbounded one).
TEST_F(ChatTurnTest, AnEndlessTurnStopsAtTheBound) {
  const auto r = test::run_command("(ulimit -v 1000000; timeout 60 " + chat("") + " </dev/zero)");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, "error: standard input:1: a turn longer than --max-turn-bytes 4194304")) << r.err;
}

TEST_F(ChatTurnTest, MaxTurnBytesBoundsEachLine) {
  const auto conv = tmp.path / "conv.txt";
  std::ofstream(conv) << "In the beginning\n" << std::string(17, 'x') << "\n";  // 16 bytes, then 17
  const auto r = test::run_command(chat("--json --max-turn-bytes 16 -f " + conv.string()));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, "error: " + conv.string() + ":2: a turn longer than --max-turn-bytes 16")) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;  // turn 1 was answered
  const auto bad = test::run_command(chat("--max-turn-bytes 0"));
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_TRUE(has(bad.err, "--max-turn-bytes: must be at least 1 (got 0)")) << bad.err;
}

// The window is checked against the model before the cache sizes anything by it.
TEST(CliLimitsTest, AStreamingWindowPastTheModelsPositionsIsRefusedAtOnce) {
  const auto r = test::run_command("(ulimit -v 1000000; " +
                                   cli("sample -p x -n 1 --streaming-llm-window 2147483647") + ")");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "error: --streaming-llm-sink 0 + --streaming-llm-window 2147483647 is more than the "
                         "model's max_position_embeddings (2048, config.json)"))
      << r.err;
  const auto ok = test::run_command(cli("sample -p x -n 1 --streaming-llm-sink 4 --streaming-llm-window 2044"));
  EXPECT_EQ(ok.code, 0) << ok.err;
  // eval's cache specs too.
  test::TempDir tmp;
  std::ofstream(tmp.path / "t.txt") << "In the beginning God created the heaven and the earth.\n";
  const auto e = test::run_command("(ulimit -v 1000000; " + cli("eval --text " + (tmp.path / "t.txt").string() +
                                                                 " --configs 'fp32; sink4 w2147483647'") + ")");
  EXPECT_EQ(e.code, 2) << e.err;
  EXPECT_TRUE(has(e.err, "error: cache spec 'sink4 w2147483647': sink 4 + window 2147483647 is more than the "
                         "model's max_position_embeddings (2048)"))
      << e.err;
}

}  // namespace
}  // namespace ptllm

namespace ptllm {
namespace {

// serve's --context-overflow takes one of its values; --keep belongs to its stream mode only.
TEST(CliLimitsTest, ContextOverflowFlagsAreCheckedWithTheirNames) {
  const std::string serve = cli("serve " + test::repo_model("kjv-tiny").string() + " --port 0 ");
  const auto bad = test::run_command(serve + "--context-overflow drop");
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_TRUE(has(bad.err, "--context-overflow")) << bad.err;
  const auto keep = test::run_command(serve + "--keep 8");
  EXPECT_EQ(keep.code, 2) << keep.err;
  EXPECT_TRUE(has(keep.err, "--keep: the tokens kept when a prompt overflows the context, with --context-overflow "
                            "stream (here --context-overflow error)"))
      << keep.err;
}

}  // namespace
}  // namespace ptllm
