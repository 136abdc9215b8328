#pragma once
// The two other APIs agents speak, mapped onto the chat path: OpenAI's Responses API
// (POST /v1/responses, the Agents SDK's default) and Anthropic's Messages API (POST /v1/messages).
// A request becomes a chat request (same template, same prefix reuse, same reply parser); the reply
// is written back in the API's own shape, whole or as its server-sent events.
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "server/api.h"

namespace ptllm::server {

enum class AgentApi { Responses, Messages };

// One server-sent event: its name (the `event:` line) and its data.
struct SseEvent {
  std::string name;
  json data;
};

// Responses kept for previous_response_id: the conversation each ended with, in chat messages.
// Bounded: past `capacity` the oldest is forgotten.
class ResponseStore {
 public:
  explicit ResponseStore(size_t capacity = 256) : capacity_(capacity) {}
  void put(const std::string& id, json messages);
  std::optional<json> get(const std::string& id) const;

 private:
  mutable std::mutex mu_;
  size_t capacity_;
  std::deque<std::string> order_;
  std::unordered_map<std::string, json> items_;
};

// The reply of one request in its API's shape.
class AgentReply {
 public:
  virtual ~AgentReply() = default;
  // The whole response (not streamed); `out` is the reply split by the request's parser.
  virtual json response(const RequestResult& res, const ChatOutputParser& out) = 0;
  // Streamed: the opening events, the events of each delta, the closing ones.
  virtual std::vector<SseEvent> begin(int64_t prompt_tokens) = 0;
  virtual std::vector<SseEvent> delta(const OutputDelta& d) = 0;
  virtual std::vector<SseEvent> end(const RequestResult& res, const ChatOutputParser& out) = 0;
  // An error in the API's shape.
  virtual json error_body(const ApiError& e) const = 0;
  ApiRequest request;
};

// Parses a body of `api` into a chat request and the writer of its reply (throws ApiError naming the
// API's own fields; the server's sampling defaults under the request's). `store` keeps and finds responses for previous_response_id.
std::unique_ptr<AgentReply> parse_agent_request(AgentApi api, const std::string& body, uint64_t seed,
                                                const std::string& model, ResponseStore& store,
                                                const RequestDefaults& defaults = {});

// Anthropic's error shape, for errors before a request is parsed.
json anthropic_error_body(const ApiError& e);

}  // namespace ptllm::server
