#pragma once
// `posttrainllm serve` as a child process on a free loopback port (--port 0, the port read from its
// stderr), stopped with SIGTERM by stop() or killed by the destructor.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace ptllm::test {

// Starts args[0] with args (stdin and stdout inherited; `fa` redirects as it says): the pid, 0 if
// it could not start.
inline pid_t spawn(std::vector<std::string> args, const posix_spawn_file_actions_t* fa) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  return posix_spawn(&pid, argv[0], fa, nullptr, argv.data(), environ) == 0 ? pid : 0;
}

// Waits up to 60 s for `pid` to exit (a bound, not a timing assertion); past it the process is
// killed and false returned. `status` gets waitpid's.
inline bool wait_exit(pid_t pid, int& status) {
  for (int i = 0; i < 6000; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return false;
}

struct ServeProcess {
  // `serve MODEL --port 0 -t 1 -np 2 -c 1024 EXTRA...` (512 tokens a sequence), stderr to log_file.
  ServeProcess(const std::filesystem::path& model, const std::vector<std::string>& extra,
               const std::filesystem::path& log_file)
      : err(log_file.string()) {
    const std::string bin = binary();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<std::string> args = {bin, "serve", model.string(), "--port", "0", "-t", "1", "-np", "2", "-c", "1024"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid = spawn(args, &fa);
    posix_spawn_file_actions_destroy(&fa);
    const std::regex listening("listening on http://127\\.0\\.0\\.1:(\\d+)");
    for (int i = 0; i < 6000 && port == 0 && pid > 0; ++i) {  // a bound, not a timing assertion
      std::smatch m;
      const std::string text = log();
      if (std::regex_search(text, m, listening)) port = std::stoi(m[1]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~ServeProcess() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  std::string log() const {
    std::ifstream in(err);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // SIGTERM; the exit code (-1: not a normal exit). A server still running 60 s later is killed
  // and fails the test, rather than holding it until ctest's timeout.
  int stop() {
    if (pid <= 0) return -1;  // kill(0) would signal the test's own process group
    kill(pid, SIGTERM);
    int status = 0;
    const bool exited = wait_exit(pid, status);
    if (!exited) ADD_FAILURE() << "the server was still running 60 s after SIGTERM:\n" << log();
    pid = 0;
    return exited && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  httplib::Result post(const std::string& path, const std::string& body) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    return c.Post(path.c_str(), body, "application/json");
  }
  // The 200 answer's JSON; a test failure (and an empty object) otherwise.
  nlohmann::ordered_json post_ok(const std::string& path, const nlohmann::ordered_json& body) const {
    const auto r = post(path, body.dump());
    if (!r || r->status != 200) {
      ADD_FAILURE() << path << ": no answer: " << (r ? r->body : std::string("no response"));
      return nlohmann::ordered_json::object();
    }
    return nlohmann::ordered_json::parse(r->body);
  }
  // A metric's value on /metrics, -1 when absent.
  double metric(const std::string& name) const {
    httplib::Client c("127.0.0.1", port);
    const auto r = c.Get("/metrics");
    const std::string key = "\n" + name + " ";
    const size_t at = r ? r->body.find(key) : std::string::npos;
    return at == std::string::npos ? -1 : std::stod(r->body.substr(at + key.size()));
  }

  std::string err;
  pid_t pid = 0;
  int port = 0;
};

}  // namespace ptllm::test
