// Crash safety of the prompt-cache writers (`sample --prompt-cache-dir`, the block store of
// store/dir_store.h): writers killed with SIGKILL at random points leave every block file either
// complete and valid or absent, and no temporary that a later run trips over; 8 concurrent writers
// (4 on one prompt, 4 on others) with --prompt-cache-max-mb all succeed and leave only valid files,
// within the bound once a later run has scanned the directory.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/file_io.h"
#include "persist/kv_store.h"
#include "test_util.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Each over 50 tokens: its first block is taken from the cache by a later run (the rest over 17).
const std::vector<std::string> kPrompts = {
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness "
    "was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God said, Let there "
    "be light",
    "And God said, Let there be light: and there was light. And God saw the light, that it was good: and God divided "
    "the light from the darkness. And God called the light Day, and the darkness he called Night.",
    "And God said, Let there be a firmament in the midst of the waters, and let it divide the waters from the "
    "waters. And God made the firmament, and divided the waters which were under the firmament from the waters "
    "which were above the firmament: and it was so.",
    "And God said, Let the waters under the heaven be gathered together unto one place, and let the dry land "
    "appear: and it was so. And God called the dry land Earth; and the gathering together of the waters called he "
    "Seas.",
};

std::vector<std::string> sample_args(const std::string& prompt, const fs::path& dir, const std::string& max_mb) {
  std::vector<std::string> a = {test::binary(), "sample", (test::repo_model("kjv-tiny")).string(), "-p", prompt,
                                "-n", "2", "--temperature", "0", "--threads", "1", "--prompt-cache-dir", dir.string()};
  if (!max_mb.empty()) {
    a.push_back("--prompt-cache-max-mb");
    a.push_back(max_mb);
  }
  return a;
}

// Starts the binary with stdout and stderr to files (or /dev/null); returns its pid.
pid_t spawn(const std::vector<std::string>& args, const fs::path& out = "/dev/null", const fs::path& err = "/dev/null") {
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in = ::open("/dev/null", O_RDONLY);
    if (o < 0 || e < 0 || in < 0) _exit(126);
    dup2(in, 0);
    dup2(o, 1);
    dup2(e, 2);
    std::vector<char*> argv;
    for (const std::string& s : args) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct DirCheck {
  int blocks = 0, temporaries = 0, damaged = 0;
  uint64_t bytes = 0;  // the block files
  std::vector<std::string> problems;
};

// Every *.kvblock under dir/blocks/<hh>/ must verify completely (read_block_value: its checksum).
DirCheck check_dir(const fs::path& dir) {
  DirCheck c;
  if (!fs::exists(dir / "blocks")) return c;
  for (const auto& e : fs::recursive_directory_iterator(dir / "blocks")) {
    if (e.is_directory()) continue;
    const std::string name = e.path().filename().string();
    if (temporary_writer(name)) {
      ++c.temporaries;
    } else if (name.ends_with(".kvblock")) {
      ++c.blocks;
      c.bytes += fs::file_size(e.path());
      try {
        read_block_value(read_whole_file(e.path(), uint64_t(1) << 30, "a block file"));
      } catch (const Error& err) {
        ++c.damaged;
        c.problems.push_back(name + ": " + err.what());
      }
    } else {
      c.problems.push_back(name + ": unexpected file");
    }
  }
  return c;
}

std::string cold_output(const std::string& prompt, const fs::path& scratch) {
  std::vector<std::string> a = sample_args(prompt, scratch, "");
  a.resize(a.size() - 2);  // no cache
  const fs::path out = scratch / "cold.out";
  EXPECT_EQ(wait_exit(spawn(a, out)), 0);
  return slurp(out);
}

TEST(CrashSafetyTest, WritersKilledAtRandomPointsLeaveOnlyValidFiles) {
  test::TempDir tmp;
  const fs::path dir = tmp.path / "cache", scratch = tmp.path / "scratch";
  fs::create_directories(scratch);
  std::vector<std::string> cold;
  for (const std::string& p : kPrompts) cold.push_back(cold_output(p, scratch));
  // How long one run takes here, so that the kills spread over the whole of a run (load, prefill,
  // the save in the background, the exit).
  const auto t0 = Clock::now();
  ASSERT_EQ(wait_exit(spawn(sample_args(kPrompts[0], scratch / "timing", ""))), 0);
  const double run_us = double(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
  fs::remove_all(scratch / "timing");

  // Until 200 writers have been killed: each kill at a random point of a run, whose length is
  // re-estimated from the runs that finished first (the machine may be loaded).
  std::mt19937 rng(22);
  constexpr int kKills = 200, kMaxRuns = 800;
  int killed = 0, finished = 0, runs = 0;
  double est_us = run_us;
  while (killed < kKills && runs < kMaxRuns) {
    const int i = runs++;
    // Each writer a new prompt (a new entry) or a known one (its entry replaced, or touched).
    const std::string prompt = kPrompts[size_t(i) % kPrompts.size()] + (i % 3 == 0 ? "" : " " + std::to_string(i));
    const auto start = Clock::now();
    const pid_t pid = spawn(sample_args(prompt, dir, i % 2 ? "0.5" : ""));
    std::this_thread::sleep_for(std::chrono::microseconds(int64_t(std::uniform_real_distribution<double>(0.1, 1.0)(rng) * est_us)));
    const bool was_running = ::kill(pid, SIGKILL) == 0;
    const int code = wait_exit(pid);
    if (code == -SIGKILL && was_running) {
      ++killed;
    } else {
      ++finished;
      EXPECT_EQ(code, 0);
      const double took = double(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count());
      est_us = 0.7 * est_us + 0.3 * took;
    }
  }
  std::printf("[   INFO   ] %d writers killed, %d finished first (a run took %.0f ms at first)\n", killed, finished,
              run_us / 1000);
  EXPECT_EQ(killed, kKills);
  const DirCheck after = check_dir(dir);
  std::printf("[   INFO   ] %d block files, %d temporaries of killed writers\n", after.blocks, after.temporaries);
  EXPECT_EQ(after.damaged, 0) << testing::PrintToString(after.problems);
  EXPECT_TRUE(after.problems.empty()) << testing::PrintToString(after.problems);
  EXPECT_GT(after.blocks, 0);

  // A later run over what was left: its output is the cold one, and opening the directory removes
  // every temporary of a killed writer (their pids are gone) and nothing valid.
  for (size_t k = 0; k < kPrompts.size(); ++k) {
    const fs::path out = scratch / "hot.out", err = scratch / "hot.err";
    ASSERT_EQ(wait_exit(spawn(sample_args(kPrompts[k], dir, "100"), out, err)), 0) << slurp(err);
    EXPECT_EQ(slurp(out), cold[k]) << slurp(err);
    EXPECT_EQ(slurp(err).find("warning"), std::string::npos) << slurp(err);
  }
  const DirCheck final_check = check_dir(dir);
  EXPECT_EQ(final_check.temporaries, 0);
  EXPECT_EQ(final_check.damaged, 0) << testing::PrintToString(final_check.problems);
  const auto prune = test::run_command(test::binary() + " cache prune " + dir.string());
  EXPECT_EQ(prune.code, 0) << prune.err;
  const DirCheck pruned = check_dir(dir);
  EXPECT_TRUE(pruned.problems.empty()) << testing::PrintToString(pruned.problems);
  EXPECT_EQ(pruned.blocks, final_check.blocks);  // nothing valid removed
}

TEST(CrashSafetyTest, EightConcurrentWritersWithPruningAllSucceed) {
  test::TempDir tmp;
  const fs::path dir = tmp.path / "cache";
  constexpr uint64_t kBoundMb4 = 1;  // --prompt-cache-max-mb 0.25: room for about two entries
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<pid_t> pids;
    std::vector<fs::path> errs;
    for (int i = 0; i < 8; ++i) {
      // 4 on the same key, 4 on keys of their own.
      const std::string prompt = i < 4 ? kPrompts[0] : kPrompts[size_t(i - 4)] + " round " + std::to_string(round);
      errs.push_back(tmp.path / ("err" + std::to_string(i)));
      pids.push_back(spawn(sample_args(prompt, dir, "0.25"), "/dev/null", errs.back()));
    }
    for (size_t i = 0; i < pids.size(); ++i) {
      EXPECT_EQ(wait_exit(pids[i]), 0) << slurp(errs[i]);
      const std::string err = slurp(errs[i]);
      EXPECT_EQ(err.find("warning"), std::string::npos) << err;
    }
    DirCheck c = check_dir(dir);
    EXPECT_TRUE(c.problems.empty()) << testing::PrintToString(c.problems);
    EXPECT_EQ(c.temporaries, 0);
    EXPECT_GE(c.blocks, 1);
    // Each writer bounds what it knows of; the next one to open the directory bounds the whole of it.
    ASSERT_EQ(wait_exit(spawn(sample_args(kPrompts[0], dir, "0.25"))), 0);
    c = check_dir(dir);
    EXPECT_TRUE(c.problems.empty()) << testing::PrintToString(c.problems);
    EXPECT_LE(c.bytes, kBoundMb4 * (uint64_t(1) << 20) / 4);
  }
}

}  // namespace
}  // namespace ptllm
