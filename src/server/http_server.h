#pragma once
// The OpenAI-compatible HTTP server (cpp-httplib): each request reads as one path, parse JSON
// (server/api.h) -> render the chat template -> tokenize -> Scheduler -> respond or stream (SSE).
// The engine sees plain structs; a client sees OpenAI-shaped errors, never a path or a trace.
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "engine/chat_output.h"
#include "server/api.h"

namespace ptllm {
class Runtime;
class Scheduler;
}  // namespace ptllm

namespace ptllm::server {

// What a prompt longer than the context gets (--context-overflow): a 400 context_length_exceeded
// (error); the oldest chat turns dropped whole, the system prompt and tools kept (shift); or the
// prompt's kept prefix (the system prompt and tools, or the first --keep tokens) and its most recent
// tokens, the middle dropped, as StreamingLLM's sinks and window (stream).
enum class ContextOverflow { Error, Shift, Stream };

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;              // 0: any free port (bind() says which)
  std::string api_key;          // "": no authentication
  std::string model_name;       // the id /v1/models lists and responses carry
  bool strict_model_name = false;  // a request naming another model: 404 (else it is served as this one)
  std::string cors_origin;      // Access-Control-Allow-Origin: "" none, "*" any, else that one origin
  bool webui = true;            // the chat page at / (server/webui.h); false: / is a 404
  RequestDefaults defaults;     // what a request leaves out
  size_t max_body_bytes = size_t(8) << 20;  // larger bodies (after Content-Encoding is undone): 413
  int http_threads = 0;         // connections served at once (0: 2 x parallel + 4); more wait in line
  int max_connections = 0;      // connections open at once, waiting ones included (0: 4 x http threads); more: 503
  int timeout_s = 60;           // read and write timeouts of a connection (slow clients)
  // Most seconds a connection may spend between requests (its next request's headers included)
  // before it is closed; more than httplib's 5 s keep-alive wait, which closes idle ones first.
  int header_timeout_s = 10;
  // messages, tools (null when none) and chat_template_kwargs to the prompt text; throws ptllm::Error
  // when the template refuses them. Empty: no template could be loaded, and
  // /v1/chat/completions says so.
  std::function<std::string(const json& messages, const json& tools, const json& kwargs)> render_chat;
  // How replies are split into content, reasoning and tool calls (from the template, or
  // --tool-call-format); `reasoning`: false for --reasoning-format none.
  OutputFormat output_format;
  bool reasoning = true;
  ContextOverflow context_overflow = ContextOverflow::Error;
  int keep = 4;  // stream: tokens kept at the start of a completion prompt (a chat's: its system prompt)
};

class HttpServer {
 public:
  HttpServer(Runtime& rt, Scheduler& scheduler, ServerConfig cfg);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the socket; returns the port (the chosen one for port 0). Throws ptllm::Error.
  int bind();
  // Serves until shutdown(); returns then.
  void run();
  // Graceful stop (SIGTERM): new generation requests get 503, those in flight run to their end
  // (at most `grace`, then they are cancelled), then the listener closes and run() returns.
  void shutdown(std::chrono::milliseconds grace = std::chrono::seconds(30));

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ptllm::server
