// The server against hostile or careless input: bodies nested 100,000 deep, bodies over the limit
// sent chunked or gzip-compressed, nonsense Content-Length values, token ids past 32 bits; and the
// first-contact behaviours: any model name, CORS preflights, a port already in use, an empty API
// key, a template error without the server's paths.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <thread>

#include "chat/chat_template.h"
#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "serve_process.h"
#include "server_thread.h"
#include "server/http_server.h"
#include "test_util.h"

namespace ptllm {
namespace {

using server::json;

constexpr size_t kMaxBody = 256 * 1024;

class ServerLimits : public ::testing::Test, protected test::ServerThread {
 protected:
  static void SetUpTestSuite() {
    rt_ = new Runtime({test::repo_model("kjv-tiny"), 1, true});
    tmpl_ = new chat::ChatTemplate(chat::ChatTemplate::from_string(test::kChatML));
  }
  static void TearDownTestSuite() {
    delete rt_;
    delete tmpl_;
  }
  void start(const std::function<void(server::ServerConfig&)>& configure = {}) {
    SchedulerConfig sc;
    sc.session.kv.ctx_size = 256;
    sc.parallel = 2;
    sc.eos_ids = {1};
    server::ServerConfig cfg;
    cfg.model_name = "kjv-tiny";
    cfg.max_body_bytes = kMaxBody;
    cfg.timeout_s = 20;
    cfg.render_chat = [](const json& messages, const json&, const json&) { return test::render_chat(*tmpl_, messages); };
    if (configure) configure(cfg);
    serve(*rt_, sc, cfg);
    ASSERT_GT(port_, 0);
  }
  void TearDown() override { stop_serving(); }
  httplib::Client client() const { return ServerThread::client(60); }
  httplib::Result post(const std::string& path, const std::string& body,
                       const std::string& type = "application/json") const {
    return client().Post(path.c_str(), body, type.c_str());
  }
  bool healthy() const {
    const auto r = client().Get("/health");
    return r && r->status == 200;
  }
  // Sends `head` then `body` on a fresh connection and returns what comes back before the server
  // closes it or 10 s pass (sends give up after 2 s of a full window).
  std::string raw(const std::string& head, const std::string& body = "") const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return "";
    timeval snd{2, 0}, rcv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &snd, sizeof snd);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rcv, sizeof rcv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string got;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      const std::string all = head + body;
      for (size_t sent = 0; sent < all.size();) {
        const ssize_t n = ::send(fd, all.data() + sent, std::min<size_t>(all.size() - sent, 65536), MSG_NOSIGNAL);
        if (n <= 0) break;  // the server stopped reading
        sent += size_t(n);
      }
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(n));
    }
    ::close(fd);
    return got;
  }
  static Runtime* rt_;
  static chat::ChatTemplate* tmpl_;
};
Runtime* ServerLimits::rt_ = nullptr;
chat::ChatTemplate* ServerLimits::tmpl_ = nullptr;

void expect_error(const httplib::Result& r, int status, const std::string& message_part, const std::string& param = "") {
  ASSERT_TRUE(r) << "no response: " << httplib::to_string(r.error());
  EXPECT_EQ(r->status, status) << r->body;
  const json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find(message_part), std::string::npos) << r->body;
  if (!param.empty()) {
    EXPECT_EQ(j["error"]["param"], param) << r->body;
  }
}

// `{"key": [[[...]]]}`, `depth` brackets deep, with `inner` at the bottom.
std::string nested(const std::string& key, int depth, const std::string& inner = "") {
  return "{\"" + key + "\": " + std::string(size_t(depth), '[') + inner + std::string(size_t(depth), ']') + "}";
}

// 100,000 nested brackets (200 KB) once overflowed an HTTP thread's stack, killing the server.
TEST_F(ServerLimits, DeeplyNestedJsonIsA400AndTheServerLives) {
  start();
  const int deep = 100000;
  expect_error(post("/detokenize", nested("tokens", deep)), 400, "more than 128 levels deep");
  expect_error(post("/tokenize", nested("content", deep)), 400, "more than 128 levels deep");
  expect_error(post("/v1/completions", nested("prompt", deep)), 400, "more than 128 levels deep");
  expect_error(post("/v1/completions", "{\"prompt\": \"x\", " + nested("stop", deep).substr(1)), 400,
               "more than 128 levels deep");
  expect_error(post("/v1/chat/completions", nested("messages", deep)), 400, "more than 128 levels deep");
  expect_error(post("/apply-template", nested("messages", deep)), 400, "more than 128 levels deep");
  // Brackets inside strings are text, not nesting.
  const auto ok = post("/tokenize", json({{"content", std::string(100000, '[')}}).dump());
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  // At the limit a body is parsed (and then refused for its type, not its depth).
  expect_error(post("/detokenize", nested("tokens", 127)), 400, "not a token id", "tokens");
  EXPECT_TRUE(healthy());
}

// What `curl -d` sends: a form-encoded JSON body over httplib's 8 KiB cap for forms.
TEST_F(ServerLimits, AFormEncodedBodyIsReadAsJson) {
  start();
  std::string words;
  for (int i = 0; i < 3000; ++i) words += "light ";
  const auto r = post("/tokenize", json({{"content", words}}).dump(), "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["tokens"].size(), rt_->tokenizer().encode(words, {.add_special = false}).size());
}

// A chunked body has no length to check up front: it is counted as it comes, and refused once over.
TEST_F(ServerLimits, AChunkedBodyOverTheLimitIs413) {
  start();
  const std::string piece(64 * 1024, ' ');
  std::string chunks;
  for (size_t sent = 0; sent < 4 * kMaxBody; sent += piece.size()) {
    char size[16];
    std::snprintf(size, sizeof size, "%zx\r\n", piece.size());
    chunks += size + piece + "\r\n";
  }
  chunks += "0\r\n\r\n";
  const std::string got = raw(
      "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
      chunks);
  EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << got.substr(0, 300);
  EXPECT_NE(got.find("larger than the limit of 262144 bytes"), std::string::npos) << got.substr(0, 600);
  // Under the limit, chunked is fine.
  const std::string body = json({{"content", "And God said"}}).dump();
  char size[16];
  std::snprintf(size, sizeof size, "%zx\r\n", body.size());
  const std::string small = raw(
      "POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n",
      size + body + "\r\n0\r\n\r\n");
  EXPECT_EQ(small.rfind("HTTP/1.1 200", 0), 0u) << small.substr(0, 300);
  EXPECT_TRUE(healthy());
}

// A gzip body is bounded by its decompressed size: 1 MiB of spaces is 1 KB on the wire.
TEST_F(ServerLimits, AGzipBodyIsBoundedWhenDecompressed) {
  start();
  httplib::Client c = client();
  c.set_compress(true);  // gzip the request body
  const auto bomb = c.Post("/tokenize", "{\"content\": \"" + std::string(4 * kMaxBody, ' ') + "\"}", "application/json");
  expect_error(bomb, 413, "larger than the limit");
  const auto ok = c.Post("/tokenize", json({{"content", "And God said"}}).dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  httplib::Client plain = client();
  expect_error(plain.Post("/tokenize", {{"Content-Encoding", "zstd"}}, "{}", "application/json"), 415,
               "Content-Encoding \"zstd\" is not supported");
  EXPECT_TRUE(healthy());
}

// httplib read Content-Length with strtoull: -5 and 2^64 were lengths it waited for.
TEST_F(ServerLimits, NonsenseContentLengthIsA400AtOnce) {
  start();
  for (const std::string len : {"-5", "18446744073709551616", "9e18", "12abc"}) {
    const std::string got = raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + len + "\r\n\r\n",
                                "{\"prompt\": \"x\"}");
    EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << len << ": " << got.substr(0, 300);
    EXPECT_NE(got.find("is not a byte count"), std::string::npos) << len << ": " << got.substr(0, 600);
  }
  // A length over the limit is refused before any of the body is read.
  const std::string big = raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9000000000000000000\r\n\r\n");
  EXPECT_EQ(big.rfind("HTTP/1.1 413", 0), 0u) << big.substr(0, 300);
  EXPECT_TRUE(healthy());
}

// 4294967301 once wrapped to the id 5.
TEST_F(ServerLimits, TokenIdsOutsideTheVocabularyAreRefusedInTheirJsonForm) {
  start();
  for (const std::string ids : {"[1, 4294967301]", "[1, -4294967291]", "[1, 18446744073709551615]", "[2147483648]"})
    expect_error(post("/v1/completions", "{\"prompt\": " + ids + ", \"max_tokens\": 1}"), 400,
                 "outside the vocabulary", "prompt");
  const auto ok = post("/v1/completions", R"({"prompt": [1, 5], "max_tokens": 1})");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST_F(ServerLimits, ContextErrorsNameTheFieldOfTheEndpoint) {
  start();
  std::string words;
  for (int i = 0; i < 200; ++i) words += "light and darkness ";
  expect_error(post("/v1/completions", json({{"prompt", words}}).dump()), 400, "the context holds 256", "prompt");
  expect_error(post("/v1/chat/completions", json({{"messages", json::array({{{"role", "user"}, {"content", words}}})}}).dump()),
               400, "the context holds 256", "messages");
}

TEST_F(ServerLimits, TokenizeNamesInvalidJson) {
  start();
  expect_error(post("/tokenize", "{\"content\": "), 400, "not valid JSON: parse error at line 1, column 13");
  expect_error(post("/detokenize", "{\"tokens\": [1,}"), 400, "not valid JSON: parse error at line 1");
  expect_error(post("/tokenize", "[1]"), 400, "must be a JSON object");
}

// Agent configurations send their own model names (gpt-4o-mini): served as this model by default.
TEST_F(ServerLimits, AnyModelNameIsServedUnlessStrict) {
  start();
  const auto r = post("/v1/completions", R"({"model": "gpt-4o-mini", "prompt": "And God said", "max_tokens": 2})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["model"], "kjv-tiny");
}

TEST_F(ServerLimits, StrictModelNameIs404) {
  start([](server::ServerConfig& c) { c.strict_model_name = true; });
  expect_error(post("/v1/completions", R"({"model": "gpt-4o-mini", "prompt": "x", "max_tokens": 2})"), 404,
               "does not exist");
  const auto ok = post("/v1/completions", R"({"model": "kjv-tiny", "prompt": "x", "max_tokens": 2})");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST_F(ServerLimits, CorsPreflightAndAllowedOrigin) {
  start([](server::ServerConfig& c) {
    c.cors_origin = "https://app.example";
    c.api_key = "k";
  });
  httplib::Client c = client();
  // A preflight carries no API key and is answered.
  const auto pre = c.Options("/v1/chat/completions", {{"Origin", "https://app.example"},
                                                      {"Access-Control-Request-Method", "POST"},
                                                      {"Access-Control-Request-Headers", "authorization,content-type"}});
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 204);
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Headers"), "authorization,content-type");
  const auto ok = c.Post("/tokenize", {{"Origin", "https://app.example"}, {"Authorization", "Bearer k"}},
                         R"({"content": "x"})", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  const auto other = c.Get("/v1/models", {{"Origin", "https://evil.example"}, {"Authorization", "Bearer k"}});
  ASSERT_TRUE(other);
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
}

// The chat page: its files are served without the key (a browser opening a page sends no header)
// with a Content-Security-Policy; every data endpoint still needs the key; off, / is a 404.
TEST_F(ServerLimits, ChatPageFilesNeedNoKeyButDataDoes) {
  start([](server::ServerConfig& c) { c.api_key = "k"; });
  httplib::Client c = client();
  const auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  const std::string csp = page->get_header_value("Content-Security-Policy");
  EXPECT_NE(csp.find("script-src 'self'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("connect-src 'self'"), std::string::npos) << csp;
  EXPECT_NE(page->body.find("<script src=\"/webui/app.js\""), std::string::npos);
  for (const char* path : {"/webui/app.js", "/webui/style.css", "/webui/marked.js", "/webui/purify.js",
                           "/webui/highlight.js", "/webui/highlight.css"}) {
    const auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << path;
    EXPECT_GT(r->body.size(), 500u) << path;
  }
  EXPECT_NE(c.Get("/webui/purify.js")->body.find("DOMPurify"), std::string::npos);
  EXPECT_NE(c.Get("/webui/highlight.js")->body.find("registerLanguage('python'"), std::string::npos);
  // An unknown file is asked for the key like any other path; with it, a 404.
  EXPECT_EQ(c.Get("/webui/other.js")->status, 401);
  EXPECT_EQ(c.Get("/webui/other.js", {{"Authorization", "Bearer k"}})->status, 404);
  for (const char* path : {"/metrics", "/v1/models"}) EXPECT_EQ(c.Get(path)->status, 401) << path;
  EXPECT_EQ(c.Post("/", "{}", "application/json")->status, 401);
}

TEST_F(ServerLimits, NoChatPageWithWebuiOff) {
  start([](server::ServerConfig& c) { c.webui = false; });
  httplib::Client c = client();
  for (const char* path : {"/", "/webui/app.js"}) {
    const auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 404) << path;
    EXPECT_NE(r->body.find("unknown endpoint"), std::string::npos) << r->body;
  }
}

TEST_F(ServerLimits, NoCorsOriginByDefault) {
  start();
  httplib::Client c = client();
  const auto pre = c.Options("/v1/models", {{"Origin", "https://app.example"}});
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 204);
  EXPECT_FALSE(pre->has_header("Access-Control-Allow-Origin"));
  const auto get = c.Get("/v1/models", {{"Origin", "https://app.example"}});
  ASSERT_TRUE(get);
  EXPECT_FALSE(get->has_header("Access-Control-Allow-Origin"));
}

// A client connected to the server's port that sends a request line, then a header byte every
// 200 ms for at most 20 s; `closed` counts those the server cut off.
std::thread trickler(int port, std::atomic<int>& closed) {
  return std::thread([port, &closed] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return;
    const std::string line = "GET /health HTTP/1.1\r\n";
    ::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
    for (int i = 0; i < 100; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (::send(fd, "X", 1, MSG_NOSIGNAL) != 1) {
        ++closed;
        break;
      }
    }
    ::close(fd);
  });
}

// As many trickling clients as HTTP threads once held them all: /health waited for ever. With every
// thread taken, a connection gets 2 s for its headers (not header_timeout_s, 10).
TEST_F(ServerLimits, TricklingClientsDoNotStallTheServer) {
  start([](server::ServerConfig& c) { c.http_threads = 2; });
  std::atomic<int> closed{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 2; ++i) clients.push_back(trickler(port_, closed));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both threads taken first
  httplib::Client c = client();
  c.set_read_timeout(6, 0);  // under header_timeout_s; the tricklers would hold the threads for 20 s
  const auto r = c.Get("/health");
  for (auto& t : clients) t.join();
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(closed, 2);
}

// A body sent a byte at a time restarted httplib's read timeout with every byte; it gets --timeout
// from its first byte to its last.
TEST_F(ServerLimits, ABodyTrickledPastTheTimeoutIs408) {
  start([](server::ServerConfig& c) { c.timeout_s = 1; });
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  timeval rcv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rcv, sizeof rcv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port_));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string head = "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{";
  ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), ssize_t(head.size()));
  std::string got;
  char buf[4096];
  for (int i = 0; i < 99 && got.empty(); ++i) {  // 20 s at most
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0;) got.append(buf, size_t(n));
    if (got.empty() && ::send(fd, " ", 1, MSG_NOSIGNAL) != 1) break;
  }
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(n));
  ::close(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 408", 0), 0u) << got.substr(0, 300);
  EXPECT_NE(got.find("did not arrive within 1 s (--timeout)"), std::string::npos) << got.substr(0, 600);
  EXPECT_TRUE(healthy());
}

// shutdown() once waited for trickling clients (each byte restarts httplib's read timeout).
TEST_F(ServerLimits, ShutdownDoesNotWaitForTricklingClients) {
  // Threads to spare and header_timeout_s 10: only the shutdown cuts the tricklers.
  start([](server::ServerConfig& c) { c.http_threads = 4; });
  std::atomic<int> closed{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 2; ++i) clients.push_back(trickler(port_, closed));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  srv_->shutdown(std::chrono::seconds(1));
  thread_.join();
  // A bound far from the tricklers' 20 s, not a timing measurement.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  for (auto& t : clients) t.join();
  EXPECT_EQ(closed, 2);
}

// A loopback connection to `port` with 10 s receive and 2 s send timeouts; -1 when it fails.
int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval snd{2, 0}, rcv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &snd, sizeof snd);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rcv, sizeof rcv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
  ::close(fd);
  return -1;
}

struct RawResponse {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;
};

// Reads up to `n` responses with a Content-Length from `fd`, as many as come before the server
// closes the connection or 10 s pass without a byte.
std::vector<RawResponse> read_responses(int fd, size_t n) {
  std::vector<RawResponse> out;
  std::string got;
  char buf[4096];
  while (out.size() < n) {
    const size_t end = got.find("\r\n\r\n");
    if (end != std::string::npos) {
      RawResponse r;
      r.head = got.substr(0, end + 2);
      r.status = std::atoi(r.head.c_str() + 9);
      const size_t at = r.head.find("Content-Length: ");
      const size_t length = at == std::string::npos ? 0 : std::stoul(r.head.substr(at + 16));
      if (got.size() >= end + 4 + length) {
        r.body = got.substr(end + 4, length);
        got.erase(0, end + 4 + length);
        out.push_back(std::move(r));
        continue;
      }
    }
    const ssize_t k = ::recv(fd, buf, sizeof buf, 0);
    if (k <= 0) break;
    got.append(buf, size_t(k));
  }
  return out;
}

// httplib 0.11.4 read each request through a stream with a read-ahead buffer of its own, dropped
// with the request: of requests sent back to back on one connection only the first was answered.
TEST_F(ServerLimits, PipelinedRequestsAreAllAnsweredInOrder) {
  start();
  const std::vector<std::string> texts = {"In the beginning", "And God said", "Let there be light"};
  auto tokenize = [](const std::string& text) {
    const std::string body = json({{"content", text}}).dump();
    return "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  };
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  // What each request must get, in order: "" for /health, else the text whose tokens come back.
  for (const std::vector<std::string>& sequence :
       {std::vector<std::string>{"", texts[0]}, {texts[0], "", texts[1], "", texts[2]}}) {
    std::string all;
    for (const std::string& s : sequence) all += s.empty() ? health : tokenize(s);
    const int fd = connect_loopback(port_);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, all.data(), all.size(), MSG_NOSIGNAL), ssize_t(all.size()));  // one send()
    const std::vector<RawResponse> got = read_responses(fd, sequence.size());
    ::close(fd);
    ASSERT_EQ(got.size(), sequence.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].status, 200) << i << ": " << got[i].head << got[i].body;
      const json j = json::parse(got[i].body);
      if (sequence[i].empty()) {
        EXPECT_EQ(j, json({{"status", "ok"}})) << i;
      } else {
        EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(),
                  rt_->tokenizer().encode(sequence[i], {.add_special = false})) << i;
      }
    }
  }
  EXPECT_TRUE(healthy());
}

// An HTTP/1.0 client cannot read a chunked body: its stream comes unchunked and ends with the
// connection.
TEST_F(ServerLimits, AStreamToAnHttp10ClientIsNotChunked) {
  start();
  const std::string body = R"({"prompt": "In the beginning", "max_tokens": 4, "temperature": 0, "stream": true})";
  const std::string got = raw("POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: " +
                                  std::to_string(body.size()) + "\r\n\r\n",
                              body);
  const size_t end = got.find("\r\n\r\n");
  ASSERT_NE(end, std::string::npos) << got;
  const std::string head = got.substr(0, end + 2), events = got.substr(end + 4);
  EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
  EXPECT_EQ(head.find("Transfer-Encoding"), std::string::npos) << head;
  EXPECT_EQ(head.find("Content-Length"), std::string::npos) << head;
  EXPECT_NE(head.find("Connection: close\r\n"), std::string::npos) << head;
  // Only events: "data: ..." lines, each followed by a blank line; no chunk sizes between them.
  size_t data = 0;
  for (size_t at = 0; at < events.size();) {
    const size_t nl = events.find("\n\n", at);
    ASSERT_NE(nl, std::string::npos) << events.substr(at);
    const std::string line = events.substr(at, nl - at);
    ASSERT_EQ(line.rfind("data: ", 0), 0u) << line;
    if (line != "data: [DONE]") {
      EXPECT_TRUE(json::parse(line.substr(6)).contains("choices")) << line;
    }
    ++data;
    at = nl + 2;
  }
  EXPECT_GE(data, 3u) << events;
  EXPECT_TRUE(events.ends_with("data: [DONE]\n\n")) << events;
  // One that asks to keep the connection: the stream still ends with it, not with the keep-alive wait.
  const auto t0 = std::chrono::steady_clock::now();
  const std::string kept = raw("POST /v1/completions HTTP/1.0\r\nConnection: Keep-Alive\r\nContent-Length: " +
                                   std::to_string(body.size()) + "\r\n\r\n",
                               body);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  EXPECT_EQ(kept.find("Transfer-Encoding"), std::string::npos) << kept.substr(0, 300);
  EXPECT_TRUE(kept.ends_with("data: [DONE]\n\n")) << kept;
  // An HTTP/1.1 client still gets chunks.
  const std::string chunked = raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " +
                                      std::to_string(body.size()) + "\r\n\r\n",
                                  body);
  EXPECT_NE(chunked.find("Transfer-Encoding: chunked\r\n"), std::string::npos) << chunked.substr(0, 300);
}

// httplib read a request line or a header until its newline, whatever its length.
TEST_F(ServerLimits, OversizedHeadersAre431AtOnce) {
  start();
  const auto t0 = std::chrono::steady_clock::now();
  const std::string long_line = raw("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(100000, 'a') + "\r\n\r\n");
  EXPECT_EQ(long_line.rfind("HTTP/1.1 431", 0), 0u) << long_line.substr(0, 300);
  EXPECT_NE(long_line.find("8192 bytes"), std::string::npos) << long_line.substr(0, 600);
  const std::string long_target = raw("GET /" + std::string(20000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(long_target.rfind("HTTP/1.1 431", 0), 0u) << long_target.substr(0, 300);
  // A line that never ends: the answer comes without waiting for its end, and the connection closes.
  const std::string endless = raw("GET /health HTTP/1.1\r\nX-Big: " + std::string(1 << 20, 'a'));
  EXPECT_EQ(endless.rfind("HTTP/1.1 431", 0), 0u) << endless.substr(0, 300);
  // Lines under the bound, 80 KB of them together.
  std::string many;
  for (int i = 0; i < 80; ++i) many += "X-H" + std::to_string(i) + ": " + std::string(1000, 'b') + "\r\n";
  const std::string total = raw("GET /health HTTP/1.1\r\nHost: x\r\n" + many + "\r\n");
  EXPECT_EQ(total.rfind("HTTP/1.1 431", 0), 0u) << total.substr(0, 300);
  EXPECT_NE(total.find("65536 bytes"), std::string::npos) << total.substr(0, 600);
  // Each ended with the server's close, not with raw()'s 10 s receive timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  // Under both bounds: answered.
  std::string some;
  for (int i = 0; i < 40; ++i) some += "X-H" + std::to_string(i) + ": " + std::string(1000, 'b') + "\r\n";
  const std::string fine = raw("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + some + "\r\n");
  EXPECT_EQ(fine.rfind("HTTP/1.1 200", 0), 0u) << fine.substr(0, 300);
  EXPECT_TRUE(healthy());
}

// A chunk's size line is bounded as a header line is: httplib read it until its newline.
TEST_F(ServerLimits, AnEndlessChunkSizeLineIsA400AtOnce) {
  start();
  const auto t0 = std::chrono::steady_clock::now();
  const std::string got = raw("POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
                              std::string(1 << 20, '0'));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));  // not raw()'s 10 s wait
  EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << got.substr(0, 300);
  EXPECT_NE(got.find("could not be read"), std::string::npos) << got.substr(0, 600);
  EXPECT_TRUE(healthy());
}

// Connections past --max-connections are answered 503 at once and closed; others are served.
TEST_F(ServerLimits, ConnectionsPastTheCapGet503) {
  start([](server::ServerConfig& c) {
    c.http_threads = 2;
    c.max_connections = 3;
  });
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) {
    idle.push_back(connect_loopback(port_));
    ASSERT_GE(idle.back(), 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // accepted (the watcher cuts them after 2 s)
  const auto t0 = std::chrono::steady_clock::now();
  const std::string refused = raw("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(refused.rfind("HTTP/1.1 503", 0), 0u) << refused.substr(0, 300);
  EXPECT_NE(refused.find("Connection: close\r\n"), std::string::npos) << refused.substr(0, 300);
  EXPECT_NE(refused.find("--max-connections 3"), std::string::npos) << refused;
  for (int fd : idle) ::close(fd);
  bool served = false;
  for (int i = 0; i < 50 && !served; ++i) {  // the idle ones' threads see them closed
    served = raw("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").rfind("HTTP/1.1 200", 0) == 0;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(served);
}

// cpp-httplib set SO_REUSEPORT: a second server on a port in use started and shared its connections.
TEST(ServeCommandLimits, ASecondServerOnABusyPortExitsWithTheAddress) {
  test::TempDir tmp;
  test::ServeProcess first(test::repo_model("kjv-tiny"), {}, tmp.path / "first.log");
  ASSERT_GT(first.port, 0) << first.log();
  const std::string port = std::to_string(first.port);
  // timeout: were the second server to start, the test ends instead of waiting for it.
  const auto second = test::run_command("timeout 120 " + test::binary() + " serve " +
                                        test::repo_model("kjv-tiny").string() + " -t 1 -np 1 --port " + port);
  EXPECT_NE(second.code, 0);
  EXPECT_NE(second.code, 124) << "the second server started";
  EXPECT_NE(second.err.find("cannot listen on 127.0.0.1:" + port + ": the address is in use"), std::string::npos)
      << second.err;
  EXPECT_EQ(first.stop(), 0);
}

TEST(ServeCommandLimits, AnEmptyApiKeyIsRefusedAndAnExposedHostWarns) {
  // timeout: a server that started anyway (listening on every interface) ends with the test.
  const auto r = test::run_command("timeout 60 " + test::binary() + " serve --host 0.0.0.0 --api-key ''");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--api-key: the key is empty"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("warning: --host 0.0.0.0 without --api-key"), std::string::npos) << r.err;
}

// 100,000 threads once aborted the process ("terminate called without an active exception").
TEST(ServeCommandLimits, TooManyThreadsIsAUsageError) {
  for (const char* cmd : {" serve --threads 100000", " sample -p x -t 100000"}) {
    const auto r = test::run_command(test::binary() + cmd);
    EXPECT_EQ(r.code, 2) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("between 0 and 1024"), std::string::npos) << cmd << ": " << r.err;
  }
}

// A template error reaches the client with the template's file name and line, not the server's paths.
TEST(ServeCommandLimits, TemplateErrorsDoNotShowTheServersPaths) {
  test::TempDir tmp;
  const auto file = tmp.path / "strict.jinja";
  std::ofstream(file) << "{% for m in messages %}{{ m['content'] }}\n"
                         "{% if m['role'] == 'system' %}{{ raise_exception('no system messages') }}{% endif %}"
                         "{% endfor %}";
  test::ServeProcess srv(test::repo_model("kjv-tiny"), {"--chat-template", file.string()}, tmp.path / "log");
  ASSERT_GT(srv.port, 0) << srv.log();
  const auto r = srv.post("/apply-template", R"({"messages": [{"role": "system", "content": "x"}]})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("strict.jinja, line 2: no system messages"), std::string::npos) << r->body;
  EXPECT_EQ(r->body.find(tmp.path.string()), std::string::npos) << r->body;
}

// serve --temp and -n are the defaults of a request that leaves temperature and max_tokens out.
TEST(ServeCommandLimits, SamplingFlagsAreTheRequestDefaults) {
  test::TempDir tmp;
  test::ServeProcess srv(test::repo_model("kjv-tiny"), {"--temp", "0", "-n", "5"}, tmp.path / "log");
  ASSERT_GT(srv.port, 0) << srv.log();
  const auto defaulted = srv.post_ok("/v1/completions", {{"prompt", "In the beginning"}});
  const auto greedy = srv.post_ok("/v1/completions", {{"prompt", "In the beginning"}, {"temperature", 0}, {"max_tokens", 5}});
  EXPECT_EQ(defaulted["choices"][0]["text"], greedy["choices"][0]["text"]);
  EXPECT_EQ(defaulted["usage"]["completion_tokens"], greedy["usage"]["completion_tokens"]);
  EXPECT_EQ(defaulted["usage"]["completion_tokens"], 5) << defaulted.dump();
  // A request's own value wins.
  const auto two = srv.post_ok("/v1/completions", {{"prompt", "In the beginning"}, {"max_tokens", 2}});
  EXPECT_EQ(two["usage"]["completion_tokens"], 2);
}

// --max-connections reaches the server: one idle connection open, the next gets 503.
TEST(ServeCommandLimits, MaxConnectionsIsTheServersCap) {
  test::TempDir tmp;
  test::ServeProcess srv(test::repo_model("kjv-tiny"), {"--max-connections", "1", "--threads-http", "1"},
                         tmp.path / "log");
  ASSERT_GT(srv.port, 0) << srv.log();
  const int idle = connect_loopback(srv.port);
  ASSERT_GE(idle, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // accepted
  const int fd = connect_loopback(srv.port);
  ASSERT_GE(fd, 0);
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  ::send(fd, get.data(), get.size(), MSG_NOSIGNAL);
  const std::vector<RawResponse> got = read_responses(fd, 1);
  ::close(fd);
  ::close(idle);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, 503) << got[0].head;
  EXPECT_NE(got[0].body.find("--max-connections 1"), std::string::npos) << got[0].body;
  EXPECT_EQ(srv.stop(), 0);
}

// The server's resident memory in KiB (VmRSS), 0 when unknown.
long rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return 0;
}

// Ten 2 MB bodies nested a million deep once took the server from 100 MB to 640 MB, where it stayed.
TEST(ServeCommandLimits, DeeplyNestedBodiesDoNotGrowTheServersMemory) {
  test::TempDir tmp;
  test::ServeProcess srv(test::repo_model("kjv-tiny"), {}, tmp.path / "log");
  ASSERT_GT(srv.port, 0) << srv.log();
  const std::string deep = "{\"messages\": " + std::string(1000000, '[') + std::string(1000000, ']') + "}";
  // One first, so that what a first request allocates for good is in the baseline.
  ASSERT_TRUE(srv.post("/v1/chat/completions", deep));
  const long before = rss_kib(srv.pid);
  ASSERT_GT(before, 0);
  // At once, so that several HTTP threads (and their malloc arenas) read one each.
  std::vector<std::string> answers(10);
  std::vector<std::thread> clients;
  for (std::string& a : answers)
    clients.emplace_back([&srv, &deep, &a] {
      const auto r = srv.post("/v1/chat/completions", deep);
      a = r ? std::to_string(r->status) + " " + r->body : "no response";
    });
  for (auto& t : clients) t.join();
  for (const std::string& a : answers) {
    EXPECT_EQ(a.rfind("400 ", 0), 0u) << a;
    EXPECT_NE(a.find("more than 128 levels deep"), std::string::npos) << a;
  }
  const long after = rss_kib(srv.pid);
  EXPECT_LT(after - before, 64 * 1024) << before << " KiB before, " << after << " KiB after";
  EXPECT_EQ(srv.stop(), 0);
}

// -c is llama-server's: the context of all the sequences together (ServeProcess: -np 2 -c 1024).
TEST(ServeCommandLimits, CtxSizeIsSharedByTheSequences) {
  test::TempDir tmp;
  test::ServeProcess srv(test::repo_model("kjv-tiny"), {}, tmp.path / "log");
  ASSERT_GT(srv.port, 0) << srv.log();
  EXPECT_NE(srv.log().find("2 parallel sequences of 512 tokens"), std::string::npos) << srv.log();
  std::string words;
  for (int i = 0; i < 200; ++i) words += "light and darkness ";
  const auto r = srv.post("/v1/completions", nlohmann::ordered_json({{"prompt", words}}).dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("the context holds 512"), std::string::npos) << r->body;
  const auto small = test::run_command(test::binary() + " serve -np 4 -c 6 --port 0");
  EXPECT_EQ(small.code, 2);
  EXPECT_NE(small.err.find("--ctx-size 6 is too small for --parallel 4"), std::string::npos)
      << small.err;
}

}  // namespace
}  // namespace ptllm
