#include "server/http_server.h"

#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0  // macOS: SIGPIPE is ignored process-wide instead (cli/main.cpp)
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/platform.h"
#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "server/agent_apis.h"
#include "server/structured.h"
#include "server/webui.h"
#include "tokenizer/tokenizer.h"

namespace ptllm::server {

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, e.body()); }

ApiError error_of(int status, std::string message, std::string type, std::string code = {}) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

// Constant time in the expected key's length whatever `given` holds (no early exit on a mismatch).
bool same_secret(const std::string& given, const std::string& expected) {
  unsigned char diff = given.size() != expected.size();
  for (size_t i = 0; i < expected.size(); ++i)
    diff |= static_cast<unsigned char>((i < given.size() ? given[i] : 0) ^ expected[i]);
  return diff == 0;
}

// What the scheduler's thread hands one HTTP thread: text as it comes, then the result.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::string text;
  std::optional<RequestResult> result;
  std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);

  void push(std::string_view t) {
    std::lock_guard lk(mu);
    text += t;
    cv.notify_one();
  }
  void finish(const RequestResult& r) {
    std::lock_guard lk(mu);
    result = r;
    cv.notify_one();
  }
  std::vector<TokenLogprob> logprobs;  // arrived, not yet sent
  void push_logprob(const TokenLogprob& lp) {
    std::lock_guard lk(mu);
    logprobs.push_back(lp);
  }
  std::vector<TokenLogprob> take_logprobs() {
    std::lock_guard lk(mu);
    return std::exchange(logprobs, {});
  }
  // Waits up to `wait` for news; takes the text so far and, at the end, the result.
  std::pair<std::string, std::optional<RequestResult>> next(std::chrono::milliseconds wait) {
    std::unique_lock lk(mu);
    cv.wait_for(lk, wait, [&] { return !text.empty() || result.has_value(); });
    std::pair<std::string, std::optional<RequestResult>> out{std::exchange(text, {}), std::nullopt};
    if (result && out.first.empty()) out.second = result;
    return out;
  }
  RequestResult wait_result() {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return result.has_value(); });
    return *result;
  }
  // The result if it comes within `wait`.
  std::optional<RequestResult> wait_result_for(std::chrono::milliseconds wait) {
    std::unique_lock lk(mu);
    cv.wait_for(lk, wait, [&] { return result.has_value(); });
    return result;
  }
  // Ended with an error (refused by the scheduler before a token came).
  bool failed() {
    std::lock_guard lk(mu);
    return result.has_value() && result->reason == FinishReason::Error;
  }
};

// The numeric host and port of a socket's end, as httplib writes them into a Request.
bool socket_end(int fd, bool peer, std::string& host, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  auto* sa = reinterpret_cast<sockaddr*>(&addr);
  if ((peer ? ::getpeername(fd, sa, &len) : ::getsockname(fd, sa, &len)) != 0) return false;
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (::getnameinfo(sa, len, h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV) != 0) return false;
  host = h;
  port = std::atoi(p);
  return true;
}

// The socket of the connection `req` came on, or -1. httplib 0.11.4 gives a handler no handle on
// it (later versions have Request::is_connection_closed), but the request carries both ends'
// addresses, and (local port, remote address, remote port) is one connection among the process's
// sockets. The descriptor stays this connection's while its handler runs: httplib closes it after.
int connection_socket(const httplib::Request& req) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(open_fds_dir(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    char* tail = nullptr;
    const long fd = std::strtol(name.c_str(), &tail, 10);
    if (tail == name.c_str() || *tail != '\0') continue;
    struct stat st {};
    if (::fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    std::string host;
    int port = 0;
    if (!socket_end(int(fd), false, host, port) || port != req.local_port) continue;
    if (!socket_end(int(fd), true, host, port) || port != req.remote_port || host != req.remote_addr) continue;
    return int(fd);
  }
  return -1;
}

// Whether the client closed its side (or reset the connection). Bytes waiting (a pipelined next
// request) are not a close. A client that only shuts down its sending side looks closed too; HTTP
// clients do not do that while they wait for an answer.
bool peer_closed(int fd) {
  pollfd p{fd, short(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// Set while this HTTP thread answers a request without reading all of its body (over the limit,
// malformed framing, refused before it was read): the connection then ends after the reply. The
// pre-routing handler, the route's handler and the logger run on the connection's thread.
thread_local bool t_close_after_reply = false;

// The connection ends after this reply, instead of reading the rest of the body or parsing it as
// the next request.
void close_after_reply(httplib::Response& res) {
  res.set_header("Connection", "close");
  t_close_after_reply = true;
}

// Closes a connection whose request body was not read without losing the reply: a socket closed
// with unread bytes sends a reset, which can reach the client before it has read the reply. So the
// reply is followed by a FIN and the client's bytes are dropped until it closes, for at most 2 s;
// after that httplib closes whatever is left.
void linger_close(int fd) {
  ::shutdown(fd, SHUT_WR);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  char buf[16384];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) < 0) break;
    if (p.revents == 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return;  // the client closed: httplib's next read sees the end
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return;
  }
  ::shutdown(fd, SHUT_RD);
}

ApiError too_large_error(size_t max_body_bytes) {
  return error_of(413, "the request body is larger than the limit of " + std::to_string(max_body_bytes) +
                           " bytes (--max-body-mb)",
                  "invalid_request_error", "payload_too_large");
}

// What httplib 0.11.4 would get wrong in a request's framing, checked before it reads a body. It
// reads Content-Length with strtoull: "-5" and 2^64 become a length near 2^64 that it then waits for,
// "9e18" becomes 9 (the rest read as a next request). An encoding it does not know reaches the
// handler as if there were none. A multipart body goes to a parser this server has no callbacks for.
std::optional<ApiError> framing_error(const httplib::Request& req, size_t max_body_bytes) {
  const size_t lengths = req.get_header_value_count("Content-Length");
  for (size_t i = 0; i < lengths; ++i) {
    const std::string v = req.get_header_value("Content-Length", i);
    if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos ||
        v != req.get_header_value("Content-Length", 0))
      return error_of(400, "Content-Length " + dump(json(v)) + " is not a byte count", "invalid_request_error");
    if (std::stoull(v) > max_body_bytes) return too_large_error(max_body_bytes);
  }
  if (req.has_header("Content-Encoding")) {
    const std::string enc = req.get_header_value("Content-Encoding");
    if (enc != "gzip" && enc != "deflate" && enc != "br" && enc != "identity")
      return error_of(415, "Content-Encoding " + dump(json(enc)) + " is not supported (gzip, deflate, br or none)",
                      "invalid_request_error", "unsupported_media_type");
  }
  if (req.is_multipart_form_data())
    return error_of(415, "multipart bodies are not supported: send the request as JSON", "invalid_request_error",
                    "unsupported_media_type");
  return std::nullopt;
}

// The connections httplib serves, watched from a thread of their own. httplib 0.11.4 reads a
// request's headers a byte per read, and each read has its own timeout, so a client that sends a
// header byte a second holds an HTTP thread for ever, and as many such clients as threads stall
// every other request (/health too) and the shutdown, which joins the threads.
class ConnectionWatch {
 public:
  using Clock = std::chrono::steady_clock;
  using Key = std::pair<std::string, int>;  // the client's address and port

  // A request's headers were read (the pre-routing handler), or its reply written (the logger).
  void started(const httplib::Request& req) {
    std::lock_guard lk(mu_);
    conns_[{req.remote_addr, req.remote_port}].busy = true;
  }
  void ended(const httplib::Request& req) {
    std::lock_guard lk(mu_);
    Conn& c = conns_[{req.remote_addr, req.remote_port}];
    c.busy = false;
    c.since = Clock::now();
  }

  // Shuts down the connections to `port` that have been between requests for longer than
  // `timeout` (all of them once `stopping`) while a thread reads them: the thread's recv returns at
  // once and the thread is free. A connection still waiting for a thread holds the bytes it sent
  // unread (FIONREAD), and is left to wait its turn. When every one of the `threads` HTTP threads is
  // taken, 2 s is the bound: a client sends its headers at once, and others are waiting.
  void sweep(int port, std::chrono::seconds timeout, int threads, bool stopping) {
    struct Open {
      int fd;
      Key key;
      Conn conn;
      bool held;  // a thread reads it or answers it
    };
    std::vector<Open> open;
    std::error_code ec;
    const auto now = Clock::now();
    std::lock_guard lk(mu_);
    for (std::filesystem::directory_iterator it(open_fds_dir(), ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      char* tail = nullptr;
      const long fd = std::strtol(name.c_str(), &tail, 10);
      if (tail == name.c_str() || *tail != '\0') continue;
      struct stat st {};
      std::string host;
      int p = 0;
      if (::fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
      if (!socket_end(int(fd), false, host, p) || p != port) continue;
      if (!socket_end(int(fd), true, host, p)) continue;  // the listening socket
      const Key key{host, p};
      const auto old = conns_.find(key);
      const Conn c = old != conns_.end() ? old->second : Conn{now, false};
      int unread = 0;
      open.push_back({int(fd), key, c, c.busy || (::ioctl(int(fd), FIONREAD, &unread) == 0 && unread == 0)});
    }
    const long held = std::count_if(open.begin(), open.end(), [](const Open& o) { return o.held; });
    if (held >= threads) timeout = std::min(timeout, std::chrono::seconds(2));
    std::map<Key, Conn> seen;
    for (const Open& o : open) {
      if (!o.conn.busy && (stopping || (o.held && now - o.conn.since > timeout))) ::shutdown(o.fd, SHUT_RDWR);
      seen[o.key] = o.conn;
    }
    conns_ = std::move(seen);  // closed connections are forgotten
  }

 private:
  struct Conn {
    Clock::time_point since;  // connected, or its last reply written
    bool busy = false;        // a request's headers read, its reply not yet written
  };
  std::mutex mu_;
  std::map<Key, Conn> conns_;
};

// Most bytes of one line of a request's head (the request line or a header, its CRLF included), and
// of the whole head; past either the request is answered 431 and its connection closed. The line
// bound is httplib's own (it answers a longer line 414 or 400, but only once the line has ended).
constexpr size_t kMaxHeadLine = 8192;
constexpr size_t kMaxHead = 65536;

// Set on the accepting thread while it refuses a connection past --max-connections.
thread_local bool t_refuse_connection = false;
// Set by the logger when a reply said Connection: close: its connection ends after it.
thread_local bool t_reply_closes = false;

// Reads and drops what the client sent (at most 1 MiB); true once it has closed its side.
bool drain(int fd) {
  char buf[16384];
  for (int i = 0; i < 64; ++i) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
  return false;
}

// A whole reply that ends its connection, for answers written beside httplib's own.
std::string closing_reply(const ApiError& e, const char* reason) {
  const std::string body = dump(e.body());
  return "HTTP/1.1 " + std::to_string(e.status) + " " + reason +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

// One connection's bytes, read through one buffer for all of its requests. httplib 0.11.4 reads
// each request through a stream of its own whose read-ahead buffer (4 KiB) goes with it, so the
// bytes of pipelined requests it had read were lost. A request's head is counted as it is read:
// httplib reads a head line into a buffer without a bound until its newline.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int fd, int read_timeout_ms, int write_timeout_ms)
      : fd_(fd), read_ms_(read_timeout_ms), write_ms_(write_timeout_ms) {}

  // The next bytes are a request's head, counted until its blank line.
  void start_request() {
    in_head_ = true;
    head_ = line_ = run_ = 0;
  }
  // The error of a head past a bound, or nullptr. The stream then reads and writes nothing more.
  const ApiError* head_too_large() const { return too_large_ ? &error_ : nullptr; }
  // Bytes of the client's not yet read by httplib, in the buffer or the socket.
  bool unread() const {
    int n = 0;
    return off_ < len_ || (::ioctl(fd_, FIONREAD, &n) == 0 && n > 0);
  }
  // Waits up to `wait` for the next request's first byte (or the client's close); false when the
  // wait ends or `stop()` says so.
  template <class Stop>
  bool wait_request(std::chrono::milliseconds wait, Stop stop) const {
    const auto end = std::chrono::steady_clock::now() + wait;
    while (off_ == len_) {
      if (stop() || std::chrono::steady_clock::now() > end) return false;
      if (ready(POLLIN, 50)) return true;
    }
    return true;
  }

  bool is_readable() const override { return off_ < len_ || ready(POLLIN, read_ms_); }
  // httplib's test: a client that closed its side is not written to (a stream stops there).
  bool is_writable() const override {
    if (!ready(POLLOUT, write_ms_)) return false;
    if (!ready(POLLIN, 0)) return true;
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
  }
  ssize_t read(char* ptr, size_t size) override {
    if (too_large_ || line_too_long_) return -1;
    if (off_ == len_) {
      if (!ready(POLLIN, read_ms_)) return -1;
      const ssize_t n = ::recv(fd_, buf_, sizeof buf_, 0);
      if (n <= 0) return n;
      off_ = 0;
      len_ = size_t(n);
    }
    size_t n = std::min(size, len_ - off_);
    if (in_head_ && !count_head(n)) return -1;
    std::memcpy(ptr, buf_ + off_, n);
    off_ += n;
    // After the head httplib reads a line (a chunk's size) a byte at a time, and body bytes in
    // larger reads but for a chunk's last byte, just before the line that ends the chunk: so a run
    // of one-byte reads without a newline is a line, bounded as a head's line (the body then
    // fails to read: 400).
    if (!in_head_) {
      if (size != 1 || ptr[0] == '\n') {
        run_ = 0;
      } else if (++run_ > kMaxHeadLine) {
        line_too_long_ = true;
        return -1;
      }
    }
    return ssize_t(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (too_large_ || !is_writable()) return -1;
    return ::send(fd_, ptr, size, MSG_NOSIGNAL);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { socket_end(fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { socket_end(fd_, false, ip, port); }
  int socket() const override { return fd_; }

 private:
  bool ready(short events, int ms) const {
    pollfd p{fd_, events, 0};
    int r;
    while ((r = ::poll(&p, 1, ms)) < 0 && errno == EINTR) {
    }
    return r > 0;
  }
  // Counts the next `n` head bytes (httplib reads a head a byte at a time), ending `n` at the blank
  // line that ends the head; false past a bound.
  bool count_head(size_t& n) {
    for (size_t i = 0; i < n; ++i) {
      const char c = buf_[off_ + i];
      ++head_;
      if (++line_ > kMaxHeadLine || head_ > kMaxHead) {
        too_large_ = true;
        error_ = error_of(431,
                          line_ > kMaxHeadLine
                              ? "a request line or header is longer than " + std::to_string(kMaxHeadLine) + " bytes"
                              : "the request line and headers are longer than " + std::to_string(kMaxHead) +
                                    " bytes together",
                          "invalid_request_error", "request_header_fields_too_large");
        return false;
      }
      const bool blank = c == '\n' && line_ == 2 && prev_ == '\r' && head_ > 2;
      prev_ = c;
      if (c == '\n') line_ = 0;
      if (blank) {
        in_head_ = false;
        n = i + 1;
      }
    }
    return true;
  }

  int fd_;
  int read_ms_, write_ms_;
  char buf_[16384];
  size_t off_ = 0, len_ = 0;  // buf_[off_, len_) is read from the socket, not yet by httplib
  bool in_head_ = false;
  size_t head_ = 0, line_ = 0;  // bytes of the head, and of its current line
  char prev_ = 0;               // the head's last byte counted
  size_t run_ = 0;              // one-byte reads since the last newline, after the head
  bool too_large_ = false;
  bool line_too_long_ = false;
  ApiError error_;
};

// httplib's server with its connection loop replaced (Server::process_and_close_socket is
// virtual): one ConnectionStream a connection, whose requests are read in turn (pipelining), a
// bound on each request's head (431), and connections past --max-connections refused (503).
class ConnectionServer final : public httplib::Server {
 public:
  ~ConnectionServer() override { close_refused(true); }
  size_t max_connections = 0;

  // Closes the refused connections whose client has closed, or that were refused 2 s ago (all).
  void close_refused(bool all) {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lk(mu_);
    std::erase_if(refused_, [&](const std::pair<int, std::chrono::steady_clock::time_point>& r) {
      if (!all && now < r.second && !drain(r.first)) return false;
      ::close(r.first);
      return true;
    });
  }

 private:
  bool process_and_close_socket(int sock) override {
    if (t_refuse_connection) return refuse(sock);
    ConnectionStream strm(sock, int(read_timeout_sec_ * 1000 + read_timeout_usec_ / 1000),
                          int(write_timeout_sec_ * 1000 + write_timeout_usec_ / 1000));
    const auto stopped = [this] { return svr_sock_ == INVALID_SOCKET; };
    for (size_t left = keep_alive_max_count_; left > 0; --left) {
      if (!strm.wait_request(std::chrono::seconds(keep_alive_timeout_sec_), stopped)) break;
      strm.start_request();
      t_reply_closes = false;
      bool closed = false;
      const bool ok = process_request(strm, left == 1, closed, nullptr);
      if (const ApiError* e = strm.head_too_large()) {
        const std::string reply = closing_reply(*e, "Request Header Fields Too Large");
        ::send(sock, reply.data(), reply.size(), MSG_NOSIGNAL);
        break;
      }
      if (!ok || closed || t_reply_closes) break;
    }
    // Bytes left unread (the rest of a refused head, a request past the last one) would turn the
    // close into a reset, which can destroy the last reply before the client reads it.
    if (strm.unread()) linger_close(sock);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return true;
  }

  // 503 at once, on the accepting thread: the request is not read. The socket is closed once the
  // client closes its side, or after 2 s (by close_refused), so the reply is not lost to a reset;
  // at most max_connections of them wait so, and the others are closed at once.
  bool refuse(int sock) {
    const std::string reply = closing_reply(
        error_of(503,
                 "the server has " + std::to_string(max_connections) +
                     " connections open, its limit (--max-connections " + std::to_string(max_connections) +
                     "): retry later",
                 "server_error", "too_many_connections"),
        "Service Unavailable");
    ::send(sock, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(sock, SHUT_WR);
    std::lock_guard lk(mu_);
    if (refused_.size() >= max_connections) {
      ::close(sock);
      return false;
    }
    refused_.emplace_back(sock, std::chrono::steady_clock::now() + std::chrono::seconds(2));
    return false;
  }

  std::mutex mu_;
  std::vector<std::pair<int, std::chrono::steady_clock::time_point>> refused_;  // (socket, when to close it)
};

// httplib's thread pool, counting the connections it holds (waiting for a thread, or served). Past
// `cap` a new connection is refused by the accepting thread itself, at once: queued, it would hold a
// file descriptor until a thread took it, and clients reconnecting in a storm could take them all.
class ConnectionQueue final : public httplib::TaskQueue {
 public:
  ConnectionQueue(size_t threads, size_t cap) : cap_(cap), pool_(threads) {}
  // `fn` is httplib's call of process_and_close_socket for the connection just accepted.
  void enqueue(std::function<void()> fn) override {
    if (open_ >= cap_) {
      t_refuse_connection = true;
      fn();
      t_refuse_connection = false;
      return;
    }
    ++open_;
    pool_.enqueue([this, fn = std::move(fn)] {
      fn();
      --open_;
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  const size_t cap_;
  std::atomic<size_t> open_{0};
  httplib::ThreadPool pool_;
};

// An HTTP/1.0 client reads no chunked coding, and httplib 0.11.4 closes its connection after the
// reply (unless it asked for Keep-Alive) without saying so. A stream goes to it unchunked (httplib
// writes a provider without a length as it comes) and ends with the connection.
void reply_to_http10(const httplib::Request& req, httplib::Response& res) {
  if (req.version != "HTTP/1.0") return;
  const bool stream = res.is_chunked_content_provider_;
  if (stream) {
    res.is_chunked_content_provider_ = false;  // what Response::set_content_provider without a length sets
    res.headers.erase("Transfer-Encoding");
    res.headers.erase("Content-Encoding");  // set for a chunked reply only
  }
  if (stream || req.get_header_value("Connection") != "Keep-Alive") {
    res.headers.erase("Keep-Alive");
    if (res.get_header_value("Connection") != "close") res.set_header("Connection", "close");
  }
}

// A request the scheduler ended without an answer, as an HTTP error.
ApiError result_error(const RequestResult& r) {
  if (r.reason == FinishReason::Cancelled)
    return error_of(503, r.error.empty() ? "the request was cancelled (the server is shutting down)" : r.error,
                    "server_error", "unavailable");
  return error_of(400, r.error, "invalid_request_error");
}

std::string random_id(const char* prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard lk(mu);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
  return buf;
}

uint64_t random_seed() {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard lk(mu);
  return rng();
}

}  // namespace

struct HttpServer::Impl {
  Runtime& rt;
  Scheduler& sch;
  ServerConfig cfg;
  ConnectionServer http;
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;  // generation requests not yet answered; under mu
  ResponseStore responses;  // /v1/responses kept for previous_response_id
  int port = 0;       // bound
  int threads = 0;    // HTTP threads
  ConnectionWatch watch;
  std::atomic<bool> stopping{false};
  std::atomic<bool> listener_closed{false};

  // httplib's stop() does nothing until listen_after_bind() has marked the server running, so a
  // SIGTERM just after the bind would be lost: whichever of shutdown() and run()'s watcher first
  // sees it running closes the listening socket.
  void close_listener() {
    if (stopping && http.is_running() && !listener_closed.exchange(true)) http.stop();
  }

  Impl(Runtime& r, Scheduler& s, ServerConfig c) : rt(r), sch(s), cfg(std::move(c)) {}

  void enter() {
    std::lock_guard lk(mu);
    ++in_flight;
  }
  void leave() {
    std::lock_guard lk(mu);
    if (--in_flight == 0) cv.notify_all();
  }

  void setup();
  bool authorized(const httplib::Request& req, httplib::Response& res);
  bool admit(const httplib::Request& req, httplib::Response& res);
  void allow_origin(const httplib::Request& req, httplib::Response& res) const;
  bool read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader);
  std::string chat_prompt(const ApiRequest& r);
  std::vector<int32_t> prompt_ids(ApiRequest& r);
  std::shared_ptr<Channel> submit(ApiRequest& r, int64_t& prompt_tokens, std::string* overflow = nullptr);
  std::string fit_context(ApiRequest& r, std::vector<int32_t>& prompt, int64_t ctx);
  int64_t system_prefix(const ApiRequest& r, const std::vector<int32_t>& prompt);
  std::vector<RetentionSpan> retention_spans(const ApiRequest& r, const std::vector<int32_t>& prompt);
  std::once_flag token_bytes_once;
  std::vector<std::string> token_bytes;  // the tokenizer's, for retention_spans
  RequestResult wait_result(const httplib::Request& req, Channel& ch);
  void generate(const httplib::Request& req, httplib::Response& res, Endpoint ep);
  void agent(const httplib::Request& req, httplib::Response& res, AgentApi api);
  void stream_agent(httplib::Response& res, std::shared_ptr<AgentReply> reply, std::shared_ptr<Channel> ch,
                    int64_t prompt_tokens);
  void respond(const httplib::Request& req, httplib::Response& res, const ApiRequest& r, Channel& ch);
  void stream(httplib::Response& res, const ApiRequest& r, std::shared_ptr<Channel> ch);
  void apply_template(const httplib::Request& req, httplib::Response& res);
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);
};

bool HttpServer::Impl::authorized(const httplib::Request& req, httplib::Response& res) {
  if (cfg.api_key.empty() || req.path == "/health") return true;
  // The chat page's files are the same for everyone and hold no data; a browser cannot send a header
  // when it opens a page, so they are served without the key, and the page sends the key with every
  // request for data.
  if (cfg.webui && req.method != "POST" && webui::find(req.path)) return true;
  const std::string auth = req.get_header_value("Authorization");
  const std::string bearer = "Bearer ";
  const std::string given = auth.rfind(bearer, 0) == 0 ? auth.substr(bearer.size()) : std::string();
  if (same_secret(given, cfg.api_key)) return true;
  // Anthropic's clients send the key as x-api-key.
  if (req.has_header("x-api-key") && same_secret(req.get_header_value("x-api-key"), cfg.api_key)) return true;
  send_error(res, error_of(401, auth.empty() ? "missing API key: send the header Authorization: Bearer KEY"
                                             : "invalid API key",
                           "authentication_error", "invalid_api_key"));
  return false;
}

// Access-Control-Allow-Origin on every answer (errors too, so that a page can read them), when
// --cors-origin allows the request's origin.
void HttpServer::Impl::allow_origin(const httplib::Request& req, httplib::Response& res) const {
  if (cfg.cors_origin.empty()) return;
  if (cfg.cors_origin == "*") return res.set_header("Access-Control-Allow-Origin", "*");
  res.set_header("Vary", "Origin");
  if (req.get_header_value("Origin") == cfg.cors_origin) res.set_header("Access-Control-Allow-Origin", cfg.cors_origin);
}

// Before httplib reads a body: CORS preflights, the methods served, the body's framing, the API key.
// False when the request is answered here.
bool HttpServer::Impl::admit(const httplib::Request& req, httplib::Response& res) {
  t_close_after_reply = false;
  watch.started(req);
  allow_origin(req, res);
  if (req.method == "OPTIONS") {  // a browser's preflight carries no API key
    res.status = 204;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    const std::string asked = req.get_header_value("Access-Control-Request-Headers");
    res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
    res.set_header("Access-Control-Max-Age", "600");
    return false;
  }
  std::optional<ApiError> refused;
  if (req.method != "GET" && req.method != "HEAD" && req.method != "POST")
    refused = error_of(405, "the method " + req.method + " is not served (GET, POST, OPTIONS)", "invalid_request_error");
  else
    refused = framing_error(req, cfg.max_body_bytes);
  if (!refused && authorized(req, res)) return true;
  if (refused) send_error(res, *refused);
  if (refused || req.method == "POST") close_after_reply(res);  // its body, if any, is not read
  return false;
}

// Reads the body as it streams, whatever its Content-Type (httplib's own reading caps a form-encoded
// one, what `curl -d` sends, at 8 KiB, and does not bound a chunked one), counting the bytes after
// Content-Encoding is undone. Fills req.body; false once the request is answered with an error.
bool HttpServer::Impl::read_body(const httplib::Request& req, httplib::Response& res,
                                 const httplib::ContentReader& reader) {
  std::string body;
  bool too_large = false, too_slow = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(cfg.timeout_s);
  const bool ok = reader([&](const char* data, size_t n) {
    if (body.size() + n > cfg.max_body_bytes) return !(too_large = true);
    if (std::chrono::steady_clock::now() > deadline) return !(too_slow = true);  // a body trickled byte by byte
    body.append(data, n);
    return true;
  });
  if (ok) {
    // httplib hands a handler a const view of its own, non-const Request.
    const_cast<httplib::Request&>(req).body = std::move(body);
    return true;
  }
  close_after_reply(res);
  if (too_large) send_error(res, too_large_error(cfg.max_body_bytes));
  else if (too_slow)
    send_error(res, error_of(408, "the request body did not arrive within " + std::to_string(cfg.timeout_s) +
                                      " s (--timeout)", "invalid_request_error", "timeout"));
  else
    send_error(res, error_of(400, "the request body could not be read (it ended early, or a chunk or its "
                                  "compressed stream is malformed)", "invalid_request_error"));
  return false;
}

void HttpServer::Impl::setup() {
  // httplib's default socket options add SO_REUSEPORT, with which a second server binds a port in use
  // and the kernel splits the connections between the two; SO_REUSEADDR alone still allows a restart
  // while the old connections linger in TIME_WAIT.
  http.set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  http.set_payload_max_length(cfg.max_body_bytes);
  http.set_read_timeout(cfg.timeout_s, 0);
  http.set_write_timeout(cfg.timeout_s, 0);
  http.set_keep_alive_timeout(5);
  // Replies go out at once: with Nagle on, a reply written in parts waits for the client's delayed ACK
  // (40 ms on Linux) before its last part.
  http.set_tcp_nodelay(true);
  threads = cfg.http_threads > 0 ? cfg.http_threads : 2 * sch.config().parallel + 4;
  http.max_connections = size_t(cfg.max_connections > 0 ? cfg.max_connections : 4 * threads);
  http.new_task_queue = [this] { return new ConnectionQueue(size_t(threads), http.max_connections); };
  http.set_post_routing_handler(reply_to_http10);
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {  // after the reply is written
    watch.ended(req);
    t_reply_closes = res.get_header_value("Connection") == "close";
    if (!std::exchange(t_close_after_reply, false)) return;
    if (const int fd = connection_socket(req); fd >= 0) linger_close(fd);
  });
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return admit(req, res) ? httplib::Server::HandlerResponse::Unhandled : httplib::Server::HandlerResponse::Handled;
  });
  // Statuses httplib sets itself (404, 413, 400 for an unreadable request) get an OpenAI body.
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) return send_error(res, too_large_error(cfg.max_body_bytes));
    if (res.status == 404)
      return send_error(res, error_of(404, "unknown endpoint " + req.method + " " + req.path,
                                      "invalid_request_error", "not_found"));
    send_error(res, error_of(res.status, "the request could not be read", "invalid_request_error"));
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_error(res, error_of(500, "internal server error", "server_error"));
  });
  // Every POST body is read by read_body (bounded as it streams), then handled as `handler(req, res)`.
  auto with_body = [this](auto handler) {
    return [this, handler](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      if (read_body(req, res, reader)) handler(req, res);
    };
  };
  http.Post("/v1/chat/completions", with_body([this](const auto& q, auto& s) { generate(q, s, Endpoint::Chat); }));
  http.Post("/v1/completions", with_body([this](const auto& q, auto& s) { generate(q, s, Endpoint::Completion); }));
  http.Post("/v1/responses", with_body([this](const auto& q, auto& s) { agent(q, s, AgentApi::Responses); }));
  http.Post("/v1/messages", with_body([this](const auto& q, auto& s) { agent(q, s, AgentApi::Messages); }));
  http.Post("/apply-template", with_body([this](const auto& q, auto& s) { apply_template(q, s); }));
  http.Post("/tokenize", with_body([this](const auto& q, auto& s) { tokenize(q, s); }));
  http.Post("/detokenize", with_body([this](const auto& q, auto& s) { detokenize(q, s); }));
  // Any other path: 404 without reading the body (httplib would read a chunked one with no bound).
  http.Post(".*", [](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader&) {
    close_after_reply(res);
    send_error(res, error_of(404, "unknown endpoint POST " + req.path, "invalid_request_error", "not_found"));
  });
  http.Get("/health", [](const auto&, auto& s) { send_json(s, 200, {{"status", "ok"}}); });
  if (cfg.webui) {
    http.Get("/|/webui/.*", [](const httplib::Request& req, httplib::Response& res) {
      const webui::Asset* a = webui::find(req.path);
      if (!a) {
        res.status = 404;  // the error handler writes the body
        return;
      }
      res.set_content(a->body.data(), a->body.size(), std::string(a->content_type).c_str());
      // Replies are untrusted text: scripts come from this server's files only (none inline), and the
      // page reaches nothing but this server (no images, fonts or requests elsewhere).
      res.set_header("Content-Security-Policy",
                     "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                     "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
      res.set_header("X-Content-Type-Options", "nosniff");
      res.set_header("Referrer-Policy", "no-referrer");
      res.set_header("Cache-Control", "no-cache");  // a rebuilt binary's page is loaded at once
    });
  }
  http.Get("/v1/models", [this](const auto&, auto& s) {
    const json model = {{"id", cfg.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "posttrainllm"}};
    send_json(s, 200, {{"object", "list"}, {"data", json::array({model})}});
  });
  http.Get("/metrics", [this](const auto&, auto& s) {
    s.set_content(metrics_text(sch.stats(), sch.config().parallel), "text/plain; version=0.0.4");
  });
}

std::vector<int32_t> HttpServer::Impl::prompt_ids(ApiRequest& r) {
  const Tokenizer& tok = rt.tokenizer();
  if (r.endpoint == Endpoint::Completion) {
    if (r.prompt_text.empty()) {
      for (int32_t id : r.prompt_ids)
        if (id < 0 || id >= rt.config().vocab_size)
          throw bad_request("prompt: token id " + std::to_string(id) + " is outside the vocabulary", "prompt");
      return r.prompt_ids;
    }
    return tok.encode(r.prompt_text);  // as `posttrainllm sample` encodes -p (BOS added when the model wants it)
  }
  const std::string text = chat_prompt(r);
  // How the reply is read: calls parsed when the request offers tools (tool_choice not "none"),
  // reasoning split off when the template has it, starting inside it when the prompt opened it.
  r.output = chat_output_options(cfg.output_format, r.reasoning.value_or(cfg.reasoning),
                                 r.tool_choice_none ? json() : r.tools, r.parallel_tool_calls, text);
  r.params.keep_special = needs_special_text(r.output);
  // The template writes the special tokens itself (as `posttrainllm chat` encodes its turns).
  return tok.encode(text, {.add_special = false});
}

// The prompt text of a chat request: messages and tools through the chat template.
std::string HttpServer::Impl::chat_prompt(const ApiRequest& r) {
  if (!cfg.render_chat)
    throw bad_request("this model has no usable chat template: restart the server with --chat-template NAME or "
                      "FILE, or use /v1/completions");
  try {
    return cfg.render_chat(r.messages, r.tools, r.template_kwargs);
  } catch (const Error& e) {
    throw bad_request(std::string("the chat template refused the messages: ") + e.what(), "messages");
  }
}

// llama-server's /apply-template: a chat request's prompt as the template renders it, nothing
// generated (to see what a model is given, tools included).
void HttpServer::Impl::apply_template(const httplib::Request& req, httplib::Response& res) {
  try {
    const ApiRequest r = parse_request(req.body, Endpoint::Chat, 0);
    send_json(res, 200, {{"prompt", chat_prompt(r)}});
  } catch (const ApiError& e) {
    send_error(res, e);
  }
}

// Checks a parsed request, queues it, and returns its channel (enter() done; leave() is the caller's).
namespace {
bool is_system_role(const json& m) {
  const json& role = m.is_object() && m.contains("role") ? m["role"] : json();
  return role == "system" || role == "developer";
}
}  // namespace

// The tokens of a chat prompt that its system messages and tools render to: the prefix the prompt
// shares with the rendering of those alone (0 when there are none, or the template needs a user turn).
int64_t HttpServer::Impl::system_prefix(const ApiRequest& r, const std::vector<int32_t>& prompt) {
  ApiRequest sys = r;
  json only;
  for (const json& m : r.messages)
    if (is_system_role(m)) only.push_back(m);
  if (only.is_null() && (r.tools.is_null() || r.tools.empty())) return 0;
  sys.messages = only.is_null() ? json::array() : only;
  std::vector<int32_t> p;
  try {
    p = prompt_ids(sys);
  } catch (const ApiError&) {
    return 0;
  }
  int64_t k = 0;
  while (k < int64_t(std::min(p.size(), prompt.size())) && p[size_t(k)] == prompt[size_t(k)]) ++k;
  return k;
}

// The retention classes of a chat prompt's tokens (kv/block_pool.h Retention): the system prompt and
// tools System, user messages User, assistant and tool messages Transient. The template renders the
// messages in order, so where message k begins is where the rendering of the messages before it
// stops sharing the prompt's text (rendered once per change of class); a token belongs to the message
// its first byte is in. A rendering the template refuses (some require a user message last) merges
// its two neighbours, taking the lower class. Approximate only in which class a boundary token gets:
// it decides what is evicted first, never what a reply is.
std::vector<RetentionSpan> HttpServer::Impl::retention_spans(const ApiRequest& r, const std::vector<int32_t>& prompt) {
  if (!cfg.render_chat || !r.messages.is_array() || r.messages.empty()) return {};
  std::call_once(token_bytes_once, [&] { token_bytes = rt.tokenizer().token_bytes(); });
  std::string text;  // the prompt's text as its tokens spell it, and where each token starts
  std::vector<size_t> starts;
  starts.reserve(prompt.size());
  for (int32_t id : prompt) {
    starts.push_back(text.size());
    if (id >= 0 && size_t(id) < token_bytes.size()) text += token_bytes[size_t(id)];
  }
  auto class_of = [](const json& m) {
    if (is_system_role(m)) return Retention::System;
    return m.is_object() && m.value("role", "") == "user" ? Retention::User : Retention::Transient;
  };
  auto shared_chars = [&](const json& messages) -> std::optional<size_t> {
    try {
      const std::string t = cfg.render_chat(messages, r.tools, r.template_kwargs);
      return size_t(std::mismatch(t.begin(), t.end(), text.begin(), text.end()).second - text.begin());
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
  auto token_at = [&](size_t chars) { return int64_t(std::lower_bound(starts.begin(), starts.end(), chars) - starts.begin()); };
  std::vector<RetentionSpan> spans;
  // The system messages with the tools rendered alone: the prefix pinned (system_prefix) is System.
  json system = json::array();
  for (const json& m : r.messages)
    if (is_system_role(m)) system.push_back(m);
  if (!system.empty() || (r.tools.is_array() && !r.tools.empty()))
    if (const auto c = shared_chars(system); c && *c > 0) spans.push_back({token_at(*c), Retention::System});
  const json& ms = r.messages;
  Retention cls = class_of(ms[0]);
  for (size_t k = 1; k <= ms.size(); ++k) {
    if (k < ms.size() && class_of(ms[k]) == cls) continue;
    std::optional<size_t> end;
    if (k < ms.size()) {
      end = shared_chars(json(std::vector<json>(ms.begin(), ms.begin() + std::ptrdiff_t(k))));
      if (!end) {  // merged with the next message: the lower class
        cls = std::min(cls, class_of(ms[k]));
        continue;
      }
    }
    const int64_t e = end ? token_at(*end) : int64_t(prompt.size());
    if (spans.empty() || e > spans.back().end) {
      if (!spans.empty() && spans.back().cls == cls) spans.back().end = e;
      else spans.push_back({e, cls});
    }
    if (k < ms.size()) cls = class_of(ms[k]);
  }
  return spans;
}

// --context-overflow shift or stream on a prompt that does not fit `ctx` tokens: rewrites the
// request's prompt so that it does, leaving room for the reply (max_tokens when given, at most half
// the context; else a quarter of it), and returns what was dropped (for the log and the
// X-Context-Overflow header); throws the 400 context_length_exceeded when it cannot.
std::string HttpServer::Impl::fit_context(ApiRequest& r, std::vector<int32_t>& prompt, int64_t ctx) {
  const int64_t room = r.max_tokens_given ? std::clamp<int64_t>(r.params.max_tokens, 1, ctx / 2) : std::max<int64_t>(1, ctx / 4);
  const int64_t budget = ctx - room;
  const char* field = r.endpoint == Endpoint::Chat ? "messages" : "prompt";
  auto too_long = [&](const std::string& why) {
    return bad_request("the prompt has " + std::to_string(prompt.size()) + " tokens; the context holds " +
                           std::to_string(ctx) + " (--context-overflow " +
                           (cfg.context_overflow == ContextOverflow::Shift ? "shift" : "stream") + ": " + why + ")",
                       field, "context_length_exceeded");
  };
  const int64_t n0 = int64_t(prompt.size());
  if (cfg.context_overflow == ContextOverflow::Shift) {
    if (r.endpoint != Endpoint::Chat)
      throw too_long("shift drops whole chat turns, and a completion prompt has none; use stream");
    // Turns: a user message and what follows it up to the next user message. The system messages and
    // tools stay; the oldest turns go, never the last one.
    json kept = r.messages;
    size_t dropped = 0;
    while (int64_t(prompt.size()) > budget) {
      size_t first = 0;
      while (first < kept.size() && is_system_role(kept[first])) ++first;
      size_t end = first + 1;
      while (end < kept.size() && !(kept[end].is_object() && kept[end].value("role", "") == "user")) ++end;
      if (first >= kept.size() || end >= kept.size())
        throw too_long("the system prompt, the tools and the last turn alone take " + std::to_string(prompt.size()) +
                       " tokens, with " + std::to_string(room) + " left for the reply");
      dropped += end - first;
      kept.erase(kept.begin() + std::ptrdiff_t(first), kept.begin() + std::ptrdiff_t(end));
      r.messages = kept;
      prompt = prompt_ids(r);
    }
    return "shift; dropped_messages=" + std::to_string(dropped) +
           "; dropped_tokens=" + std::to_string(n0 - int64_t(prompt.size()));
  }
  // stream: the kept prefix, then the most recent tokens.
  const int64_t keep = r.endpoint == Endpoint::Chat ? system_prefix(r, prompt) : std::min<int64_t>(cfg.keep, n0);
  if (keep >= budget)
    throw too_long("the kept prefix alone takes " + std::to_string(keep) + " tokens, with " + std::to_string(room) +
                   " left for the reply");
  const int64_t tail = budget - keep;
  prompt.erase(prompt.begin() + std::ptrdiff_t(keep), prompt.end() - std::ptrdiff_t(tail));
  return "stream; kept_prefix=" + std::to_string(keep) + "; dropped_tokens=" + std::to_string(n0 - int64_t(prompt.size()));
}

std::shared_ptr<Channel> HttpServer::Impl::submit(ApiRequest& r, int64_t& prompt_tokens, std::string* overflow) {
  if (cfg.strict_model_name && !r.model.empty() && r.model != cfg.model_name)
    throw error_of(404, "the model " + json(r.model).dump() + " does not exist; this server serves " +
                            json(cfg.model_name).dump(),
                   "invalid_request_error", "model_not_found");
  for (const auto& [id, bias] : r.params.logit_bias)
    if (id >= rt.config().vocab_size)
      throw bad_request("logit_bias: token id " + std::to_string(id) + " is outside the vocabulary (" +
                            std::to_string(rt.config().vocab_size) + " tokens)",
                        "logit_bias");
  const SpecOptions& spec = sch.config().spec;
  if (spec.type == SpecType::None) {
    for (const auto& [name, v] : {std::pair{"speculative.n_max", r.params.spec_draft_max},
                                  std::pair{"speculative.n_min", r.params.spec_draft_min}})
      if (v > 0)
        throw bad_request(std::string(name) + ": this server does not speculate (start it with --spec-type ngram or "
                          "suffix)", name);
  } else {
    const int most = r.params.spec_draft_max >= 0 ? r.params.spec_draft_max : spec.draft_max;
    const int least = r.params.spec_draft_min >= 0 ? r.params.spec_draft_min : spec.draft_min;
    if (most > 0 && least > most)
      throw bad_request("speculative.n_min " + std::to_string(least) + " is more than speculative.n_max " +
                            std::to_string(most),
                        r.params.spec_draft_min >= 0 ? "speculative.n_min" : "speculative.n_max");
  }
  Request sr;
  sr.prompt = prompt_ids(r);
  r.params.constraint = request_constraint(r, rt.tokenizer());
  const KVCacheConfig& kv = sch.config().session.kv;
  int64_t n = int64_t(sr.prompt.size());
  if (n == 0) throw bad_request("the prompt encodes to no tokens");
  sr.cache_reuse = r.cache_reuse.value_or(cfg.defaults.cache_reuse);
  if (const std::string e = cache_reuse_error(sr.cache_reuse, kv, r.cache_reuse ? "n_cache_reuse" : "--cache-reuse");
      !e.empty())
    throw bad_request(e, "n_cache_reuse");
  if (!kv.streaming() && n >= kv.ctx_size && cfg.context_overflow != ContextOverflow::Error) {
    const std::string what = fit_context(r, sr.prompt, kv.ctx_size);
    // shift: what follows the dropped turns is taken from the earlier history by shifting it, in runs
    // of at least a block, unless the request asks otherwise (n_cache_reuse 0: recomputed, exact).
    if (cfg.context_overflow == ContextOverflow::Shift && !r.cache_reuse)
      sr.cache_reuse = std::max(sr.cache_reuse, kv.group_size);
    std::fprintf(stderr, "context overflow: a prompt of %lld tokens: %s\n", static_cast<long long>(n), what.c_str());
    if (overflow) *overflow = what;
    n = int64_t(sr.prompt.size());
  }
  if (!kv.streaming() && n >= kv.ctx_size)
    throw bad_request("the prompt has " + std::to_string(n) + " tokens; the context holds " +
                          std::to_string(kv.ctx_size) + " (the prompt and at least one generated token)",
                      r.endpoint == Endpoint::Chat ? "messages" : "prompt", "context_length_exceeded");
  if (!r.max_tokens_given) r.params.max_tokens = int(kv.streaming() ? kv.ctx_size : kv.ctx_size - n);
  sr.params = r.params;
  if (sch.config().pin_bytes > 0 && r.endpoint == Endpoint::Chat) sr.pin_tokens = system_prefix(r, sr.prompt);
  if (r.endpoint == Endpoint::Chat) sr.retention = retention_spans(r, sr.prompt);
  auto ch = std::make_shared<Channel>();
  sr.cancel = ch->cancel;
  sr.on_text = [ch](std::string_view t) { ch->push(t); };
  sr.on_done = [ch](const RequestResult& rr) { ch->finish(rr); };
  if (r.logprobs) sr.on_logprob = [ch](const TokenLogprob& lp) { ch->push_logprob(lp); };
  prompt_tokens = n;
  enter();
  sch.submit(std::move(sr));
  return ch;
}

void HttpServer::Impl::generate(const httplib::Request& req, httplib::Response& res, Endpoint ep) {
  try {
    ApiRequest r = parse_request(req.body, ep, random_seed(), cfg.defaults);
    int64_t n = 0;
    std::string overflow;
    auto ch = submit(r, n, &overflow);
    if (!overflow.empty()) res.set_header("X-Context-Overflow", overflow);
    // A stream, unless the request already failed (then an HTTP error status, as without "stream").
    // A request that already ended well (a short reply, its prompt from the pool) is streamed too: a
    // client asking for a stream always gets one.
    if (r.stream && !ch->failed()) return stream(res, r, ch);  // leave() when the stream ends
    respond(req, res, r, *ch);
    leave();
  } catch (const ApiError& e) {
    send_error(res, e);
  }
}

// /v1/responses and /v1/messages: the chat path, the reply in the API's shape.
void HttpServer::Impl::agent(const httplib::Request& req, httplib::Response& res, AgentApi api) {
  std::shared_ptr<AgentReply> reply;
  try {
    reply = parse_agent_request(api, req.body, random_seed(), cfg.model_name, responses, cfg.defaults);
    int64_t n = 0;
    std::string overflow;
    auto ch = submit(reply->request, n, &overflow);
    if (!overflow.empty()) res.set_header("X-Context-Overflow", overflow);
    if (reply->request.stream && !ch->failed()) return stream_agent(res, reply, ch, n);  // leave() at its end
    const RequestResult rr = wait_result(req, *ch);
    leave();
    if (rr.reason == FinishReason::Error || rr.reason == FinishReason::Cancelled) {
      const ApiError e = result_error(rr);
      return send_json(res, e.status, reply->error_body(e));
    }
    ChatOutputParser out(reply->request.output);
    out.push(rr.text);
    out.finish();
    send_json(res, 200, reply->response(rr, out));
  } catch (const ApiError& e) {
    send_json(res, e.status, api == AgentApi::Messages ? anthropic_error_body(e) : e.body());
  }
}

// Events in the API's SSE shape (event: NAME / data: JSON); no [DONE] line.
void HttpServer::Impl::stream_agent(httplib::Response& res, std::shared_ptr<AgentReply> reply,
                                    std::shared_ptr<Channel> ch, int64_t prompt_tokens) {
  struct State {
    bool started = false;
    ChatOutputParser parser;
    explicit State(const ChatOutputOptions& o) : parser(o) {}
  };
  auto st = std::make_shared<State>(reply->request.output);
  res.set_header("Cache-Control", "no-cache");
  auto provider = [ch, st, reply, prompt_tokens](size_t, httplib::DataSink& sink) {
    auto send = [&](const std::vector<SseEvent>& events) {
      std::string out;
      for (const SseEvent& e : events) out += "event: " + e.name + "\ndata: " + dump(e.data) + "\n\n";
      return out.empty() || sink.write(out.data(), out.size());
    };
    auto gone = [&] {
      ch->cancel->store(true);
      return false;
    };
    if (!st->started) {
      st->started = true;
      if (!send(reply->begin(prompt_tokens))) return gone();
    }
    auto [text, result] = ch->next(std::chrono::milliseconds(500));
    if (!sink.is_writable()) return gone();
    OutputDelta d = st->parser.push(text);
    if (result) {
      d.append(st->parser.finish());
    }
    if (d.empty() && !result) {  // text held back by the parser needs no keep-alive
      static const std::string ping = ": waiting\n\n";
      return !text.empty() || sink.write(ping.data(), ping.size()) ? true : gone();
    }
    if (!send(reply->delta(d))) return gone();
    if (!result) return true;
    if (result->reason == FinishReason::Error || result->reason == FinishReason::Cancelled) {
      send({{"error", reply->error_body(result_error(*result))}});
    } else if (!send(reply->end(*result, st->parser))) {
      return gone();
    }
    sink.done();
    return true;
  };
  res.set_chunked_content_provider("text/event-stream", provider, [this, ch](bool ok) {
    if (!ok) ch->cancel->store(true);
    leave();
  });
}

// While the reply is generated the connection is watched (every 50 ms): a client gone cancels the
// request, as a failed write cancels a streamed one, so its blocks go back at the next step.
RequestResult HttpServer::Impl::wait_result(const httplib::Request& req, Channel& ch) {
  std::optional<RequestResult> done = ch.wait_result_for(std::chrono::milliseconds(50));
  if (!done) {
    const int fd = connection_socket(req);
    while (!done) {
      if (fd >= 0 && peer_closed(fd)) {
        ch.cancel->store(true);
        done = ch.wait_result();  // at the scheduler's next step
        break;
      }
      done = ch.wait_result_for(std::chrono::milliseconds(50));
    }
  }
  return *done;
}

void HttpServer::Impl::respond(const httplib::Request& req, httplib::Response& res, const ApiRequest& r, Channel& ch) {
  const RequestResult rr = wait_result(req, ch);
  if (rr.reason == FinishReason::Error || rr.reason == FinishReason::Cancelled) return send_error(res, result_error(rr));
  send_json(res, 200, response_json(r, rr, random_id(r.endpoint == Endpoint::Chat ? "chatcmpl-" : "cmpl-"),
                                    int64_t(std::time(nullptr)), cfg.model_name));
}

// SSE: data: {chunk}\n\n ... data: [DONE]\n\n. A client gone (a failed write) cancels the request;
// its blocks go back at the scheduler's next step.
void HttpServer::Impl::stream(httplib::Response& res, const ApiRequest& r, std::shared_ptr<Channel> ch) {
  struct State {
    bool first = true;
    std::string id;
    int64_t created = 0;
    std::optional<ChatOutputParser> parser;  // chat: the reply split as it streams
    size_t calls = 0;                        // tool calls sent
    std::vector<TokenLogprob> logprobs;      // with logprobs: received, not yet sent
    size_t text_offset = 0;                  // completions' text_offset of the next one
  };
  auto st = std::make_shared<State>();
  st->id = random_id(r.endpoint == Endpoint::Chat ? "chatcmpl-" : "cmpl-");
  st->created = int64_t(std::time(nullptr));
  res.set_header("Cache-Control", "no-cache");
  if (r.endpoint == Endpoint::Chat) st->parser.emplace(r.output);
  auto provider = [this, r, ch, st](size_t, httplib::DataSink& sink) {
    auto send = [&](const std::string& payload) {
      const std::string event = (payload.starts_with(':') ? payload : "data: " + payload) + "\n\n";
      return sink.write(event.data(), event.size());
    };
    auto gone = [&] {
      ch->cancel->store(true);
      return false;
    };
    // A delta as chunks: text and reasoning in one, then each call's id and name, then its arguments.
    // The log-probabilities received so far ride on the next chunk.
    auto with_logprobs = [&](json chunk) {
      if (r.logprobs && !st->logprobs.empty() && !chunk["choices"].empty()) {
        chunk["choices"][0]["logprobs"] = logprobs_json(r, st->logprobs, st->text_offset);
        for (const TokenLogprob& lp : st->logprobs) st->text_offset += lp.chosen.text.size();
        st->logprobs.clear();
      }
      return chunk;
    };
    auto send_delta = [&](OutputDelta d) {
      std::vector<ToolCall> calls = std::move(d.calls);
      if (st->first || !d.content.empty() || !d.reasoning.empty()) {
        if (!send(dump(with_logprobs(chunk_json(r, d, nullptr, st->first, st->id, st->created, cfg.model_name)))))
          return false;
        st->first = false;
      }
      for (ToolCall& c : calls) {
        OutputDelta head;
        std::string args = std::exchange(c.arguments, {});
        head.calls.push_back(std::move(c));
        if (!send(dump(chunk_json(r, head, nullptr, st->first, st->id, st->created, cfg.model_name, st->calls))) ||
            !send(dump(tool_arguments_chunk_json(r, st->calls, args, st->id, st->created, cfg.model_name))))
          return false;
        st->first = false;
        ++st->calls;
      }
      return true;
    };
    auto [text, result] = ch->next(std::chrono::milliseconds(500));
    if (!sink.is_writable()) return gone();
    for (TokenLogprob& lp : ch->take_logprobs()) st->logprobs.push_back(std::move(lp));
    OutputDelta d;
    if (st->parser) {
      d = st->parser->push(text);
      if (result) {
        d.append(st->parser->finish());
      }
    } else {
      d.content = std::move(text);
    }
    // Nothing new (queued, a long prefill, or text held back): an SSE comment, which clients
    // ignore, so that a client gone meanwhile is noticed by a failed write and its request cancelled.
    if (!st->first && d.empty() && !result) return !text.empty() || send(": waiting") ? true : gone();
    if (!send_delta(std::move(d))) return gone();
    if (!result) return true;
    if (result->reason == FinishReason::Error || result->reason == FinishReason::Cancelled) {
      send(dump(result_error(*result).body()));
    } else {
      if (!send(dump(with_logprobs(chunk_json(r, {}, &*result, false, st->id, st->created, cfg.model_name, 0,
                                              st->calls > 0)))))
        return gone();
      if (r.include_usage && !send(dump(usage_chunk_json(r, *result, st->id, st->created, cfg.model_name))))
        return gone();
    }
    send("[DONE]");
    sink.done();
    return true;
  };
  res.set_chunked_content_provider("text/event-stream", provider, [this, ch](bool ok) {
    if (!ok) ch->cancel->store(true);
    leave();
  });
}

void HttpServer::Impl::tokenize(const httplib::Request& req, httplib::Response& res) {
  json body;
  try {
    body = parse_json_object(req.body);
  } catch (const ApiError& e) {
    return send_error(res, e);
  }
  const auto content = body.find("content");
  if (content == body.end() || !content->is_string())
    return send_error(res, bad_request("content: expected a string", "content"));
  bool special = false;
  if (const auto it = body.find("add_special"); it != body.end()) {
    if (!it->is_boolean()) return send_error(res, bad_request("add_special: expected a boolean", "add_special"));
    special = it->get<bool>();
  }
  send_json(res, 200, {{"tokens", rt.tokenizer().encode(content->get<std::string>(), {.add_special = special})}});
}

void HttpServer::Impl::detokenize(const httplib::Request& req, httplib::Response& res) {
  json body;
  try {
    body = parse_json_object(req.body);
  } catch (const ApiError& e) {
    return send_error(res, e);
  }
  const auto tokens = body.find("tokens");
  if (tokens == body.end() || !tokens->is_array()) return send_error(res, bad_request("tokens: expected an array of token ids", "tokens"));
  std::vector<int32_t> ids;
  for (const json& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= rt.config().vocab_size)
      return send_error(res, bad_request("tokens: " + t.dump() + " is not a token id of this model", "tokens"));
    ids.push_back(t.get<int32_t>());
  }
  send_json(res, 200, {{"content", rt.tokenizer().decode(ids)}});
}

HttpServer::HttpServer(Runtime& rt, Scheduler& scheduler, ServerConfig cfg)
    : impl_(std::make_unique<Impl>(rt, scheduler, std::move(cfg))) {
  impl_->setup();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  Impl& m = *impl_;
  const int port = m.cfg.port == 0 ? m.http.bind_to_any_port(m.cfg.host) : m.cfg.port;
  if (m.cfg.port != 0 && !m.http.bind_to_port(m.cfg.host, m.cfg.port)) {
    throw Error("cannot listen on " + m.cfg.host + ":" + std::to_string(m.cfg.port) +
                ": the address is in use (another server?) or not this machine's (--host, --port)");
  }
  if (port < 0) throw Error("cannot listen on " + m.cfg.host + " (--host)");
  m.port = port;
  return port;
}

void HttpServer::run() {
  Impl& m = *impl_;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watcher([&] {
    std::unique_lock lk(mu);
    for (int tick = 0; !cv.wait_for(lk, std::chrono::milliseconds(100), [&] { return done; }); ++tick) {
      if (m.stopping || tick % 5 == 0)
        m.watch.sweep(m.port, std::chrono::seconds(m.cfg.header_timeout_s), m.threads, m.stopping);
      m.http.close_refused(false);
      m.close_listener();
    }
  });
  m.http.listen_after_bind();  // returns once every HTTP thread has ended
  {
    std::lock_guard lk(mu);
    done = true;
  }
  cv.notify_one();
  watcher.join();
  m.http.close_refused(true);
}

void HttpServer::shutdown(std::chrono::milliseconds grace) {
  Impl& m = *impl_;
  const bool drained = m.sch.drain(grace);  // new requests now end at once with 503
  if (!drained) m.sch.stop();               // past the grace: what still runs is cancelled
  {
    std::unique_lock lk(m.mu);
    m.cv.wait_for(lk, std::chrono::seconds(5), [&] { return m.in_flight == 0; });  // the last chunks written
  }
  m.stopping = true;  // connections between requests are shut down, so that no thread waits on a client
  m.close_listener();
}

}  // namespace ptllm::server
