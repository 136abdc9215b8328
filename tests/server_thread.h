// An HTTP server in the test's own process: a Scheduler and its HttpServer on a free loopback port,
// served by one thread, for tests that look inside the server while it runs (tests that need a real
// process use serve_process.h).
#pragma once

#include <httplib.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "chat/chat_template.h"
#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "server/http_server.h"
#include "test_util.h"

namespace ptllm::test {

// `messages` rendered by `tmpl` with the generation prompt: a ServerConfig::render_chat.
inline std::string render_chat(const chat::ChatTemplate& tmpl, const server::json& messages) {
  chat::ChatRequest r;
  r.messages = messages;
  r.add_generation_prompt = true;
  return tmpl.render(r);
}

// Fixtures derive from it (members keep the fixtures' names) or hold one.
class ServerThread {
 public:
  ServerThread() = default;
  ServerThread(const ServerThread&) = delete;
  ServerThread& operator=(const ServerThread&) = delete;
  ~ServerThread() { stop_serving(); }

  // Serves `cfg` (its port replaced by a free one) over a new scheduler; port_ stays 0 when binding failed.
  void serve(Runtime& rt, const SchedulerConfig& sc, server::ServerConfig cfg) {
    sch_ = std::make_unique<Scheduler>(rt, sc);
    cfg.port = 0;
    srv_ = std::make_unique<server::HttpServer>(rt, *sch_, cfg);
    port_ = srv_->bind();
    if (port_ > 0) thread_ = std::thread([this] { srv_->run(); });
  }
  void stop_serving() {
    if (srv_) srv_->shutdown(std::chrono::seconds(5));
    if (thread_.joinable()) thread_.join();
    srv_.reset();
    sch_.reset();
    port_ = 0;
  }
  httplib::Client client(int read_timeout_s = 120) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(read_timeout_s, 0);
    return c;
  }

 protected:
  std::unique_ptr<Scheduler> sch_;
  std::unique_ptr<server::HttpServer> srv_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace ptllm::test
