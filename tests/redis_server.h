#pragma once
// A redis-server of the test's own (Debian's redis-server package): a free loopback port, no
// persistence, a temporary directory; stopped (or killed, or paused) by the test. available() is
// false when redis-server is not installed (the tests then skip).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

extern char** environ;

namespace ptllm::test {

inline std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t at = 0;
  while (at <= p.size()) {
    const size_t end = std::min(p.find(':', at), p.size());
    const std::filesystem::path c = std::filesystem::path(p.substr(at, end - at)) / name;
    if (::access(c.c_str(), X_OK) == 0) return c.string();
    at = end + 1;
  }
  return "";
}

// A loopback port nothing listens on now (bound, read back, closed).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// The first line of a Redis's answer to an inline command ("ACL SETUSER default -mget" gives "+OK"),
// on a connection of its own; empty when nothing answered within 200 ms.
inline std::string redis_reply(int port, const std::string& command) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{0, 200000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  std::string line;
  const std::string out = command + "\r\n";
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::write(fd, out.data(), out.size()) == ssize_t(out.size())) {
    char c = 0;
    while (line.size() < 512 && ::read(fd, &c, 1) == 1 && c != '\r') line += c;
  }
  ::close(fd);
  return line;
}

// Whether a Redis on the port answers PING with +PONG.
inline bool redis_pings(int port) { return redis_reply(port, "PING") == "+PONG"; }

class RedisServer {
 public:
  static bool available() { return !find_in_path("redis-server").empty(); }
  // On a free port; a port another test's server took between free_port() and the bind (ctest runs
  // tests side by side) is given up for another.
  RedisServer() : port_(free_port()) {
    for (int attempt = 0; attempt < 5 && !start(); ++attempt) {
      stop();
      port_ = free_port();
    }
  }
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  bool running() const { return pid_ > 0; }
  // Started and answering PING (false after 20 s without an answer).
  bool start() {
    const std::string exe = find_in_path("redis-server"), port = std::to_string(port_), dir = dir_.path.string();
    std::vector<std::string> args = {exe,   "--port", port,  "--bind",      "127.0.0.1", "--save", "",
                                     "--appendonly", "no", "--dir", dir, "--daemonize", "no", "--loglevel", "warning", "--logfile", dir + "/redis.log"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, exe.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
      pid_ = 0;
      return false;
    }
    for (int i = 0; i < 400; ++i) {
      // A server that could not bind exits; one answering PING must be this one, still running a
      // moment later (not another test's on the same port).
      if (redis_pings(port_)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (alive()) return true;
      }
      if (!alive()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  void stop(int sig = SIGTERM) {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, sig);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = 0;
  }
  void kill() { stop(SIGKILL); }
  // Whether the process started last is still running (reaped, and forgotten, once it has exited).
  bool alive() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == 0) return true;
    pid_ = 0;
    return false;
  }
  void pause() { ::kill(pid_, SIGSTOP); }    // accepts connections (the kernel does) but never answers
  void resume() { ::kill(pid_, SIGCONT); }

 private:
  TempDir dir_;
  int port_;
  pid_t pid_ = 0;
};

}  // namespace ptllm::test
