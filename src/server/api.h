#pragma once
// The OpenAI API's JSON, in and out, with no HTTP: a request body becomes a plain ApiRequest (or an
// ApiError naming the field and the problem), a RequestResult becomes a response or a stream chunk.
// The HTTP layer (server/http_server.cpp) only moves bytes between these and the Scheduler.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/chat_output.h"
#include "engine/scheduler.h"

namespace ptllm::server {

using json = nlohmann::ordered_json;  // key order kept: the chat template sees messages as sent

// An error crossing the HTTP boundary: a status and OpenAI's {"error": {message, type, code, param}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string code;   // "" -> null
  std::string param;  // the offending field, "" -> null
  json body() const;
};

ApiError bad_request(std::string message, std::string param = {}, std::string code = {});

enum class Endpoint { Chat, Completion };

// Structured output as a request asks for it; the server compiles it once the prompt's reply
// format is known (server/structured.h).
struct OutputConstraint {
  enum class Kind { None, Grammar, Schema, AnyObject };
  Kind kind = Kind::None;
  std::string grammar;  // Grammar: GBNF text
  json schema;          // Schema: a JSON Schema
  std::string param;    // the field it came from ("grammar", "json_schema", "response_format.json_schema.schema")
};

struct ApiRequest {
  Endpoint endpoint = Endpoint::Chat;
  std::string model;            // as sent ("" when absent)
  json messages;                // chat: the validated messages
  json tools;                   // chat: null or the tools list, passed to the template
  bool tool_choice_none = false;  // chat: tool_choice "none": calls are not parsed out of the reply
  bool tool_choice_required = false;  // chat: "required" or a named function: the reply is calls
  std::string tool_choice_name;       // chat: the named function, the only one the reply may call
  OutputConstraint constraint;
  bool parallel_tool_calls = true;
  std::optional<bool> reasoning;  // chat: reasoning_format "none" (false) or "deepseek"/"auto" (true)
  json template_kwargs = json::object();  // chat: chat_template_kwargs
  ChatOutputOptions output;     // chat: how the reply is split (set by the server once the prompt is rendered)
  std::string prompt_text;      // completion: a text prompt
  std::vector<int32_t> prompt_ids;  // completion: a prompt of token ids
  GenerationParams params;
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;        // log-probabilities in the reply (params.top_logprobs alternatives)
  // n_cache_reuse (llama.cpp's): the shortest run of an earlier history shifted to a new position
  // (Request::cache_reuse); unset: the server's --cache-reuse.
  std::optional<int> cache_reuse;
};

// Deepest nesting of arrays and objects a request body may have. Copying, rendering and printing
// a JSON value recurse once per level, so a body of 100,000 nested brackets (200 KB) would overflow
// an HTTP thread's stack; tool schemas, the deepest thing a client sends, nest a few dozen levels.
inline constexpr int kMaxJsonDepth = 128;

// A request body as JSON: a 400 (an ApiError) when it is not valid JSON (with the line and column),
// nests deeper than kMaxJsonDepth, or is not an object.
json parse_json_object(const std::string& body);

// What a request gets for the fields it leaves out (serve's --temp, --top-k, --top-p, --min-p,
// --repeat-penalty, -n). Sampling defaults are llama-server's.
struct RequestDefaults {
  SamplingConfig sampling;
  int max_tokens = -1;  // -1: chat until the context is full, completions 16
  int cache_reuse = 0;  // --cache-reuse: what a request without n_cache_reuse gets
};

// Parses and checks a body; throws ApiError. The seed is `seed` unless the body gives one.
ApiRequest parse_request(const std::string& body, Endpoint endpoint, uint64_t seed,
                         const RequestDefaults& defaults = {});

// The response of a finished request: chat.completion (its reply split by r.output) or
// text_completion.
json response_json(const ApiRequest& r, const RequestResult& res, const std::string& id, int64_t created,
                   const std::string& model);
// A streamed chunk: `delta` (chat: the first chunk carries the role; calls as delta.tool_calls,
// `calls_before` of them sent earlier), or the last one with the finish reason (res not null;
// `any_calls`: the reply had calls).
json chunk_json(const ApiRequest& r, const OutputDelta& delta, const RequestResult* res, bool first,
                const std::string& id, int64_t created, const std::string& model, size_t calls_before = 0,
                bool any_calls = false);
// A streamed piece of call `index`'s arguments (after the chunk with its id and name).
json tool_arguments_chunk_json(const ApiRequest& r, size_t index, const std::string& arguments, const std::string& id,
                               int64_t created, const std::string& model);
json usage_json(const RequestResult& res);
// llama-server's `timings` fields of speculation, draft_n and draft_n_accepted (null when the request
// did not speculate).
json timings_json(const RequestResult& res);
// choice.logprobs for these tokens (null without logprobs): chat's {"content": [...]}, or
// completions' {tokens, token_logprobs, top_logprobs, text_offset}, offsets from text_offset.
json logprobs_json(const ApiRequest& r, std::span<const TokenLogprob> lps, size_t text_offset);
// The usage-only chunk of stream_options.include_usage (choices empty).
json usage_chunk_json(const ApiRequest& r, const RequestResult& res, const std::string& id, int64_t created,
                      const std::string& model);
// "stop" or "length" for OpenAI (a cancelled or failed request has no finish reason); "tool_calls"
// when the model stopped after calls.
const char* openai_finish_reason(FinishReason r, bool calls = false);

// GET /metrics: the Prometheus text exposition of the scheduler's counters and the pool.
std::string metrics_text(const SchedulerStats& s, int parallel);

}  // namespace ptllm::server
