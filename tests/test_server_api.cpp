// The OpenAI JSON layer alone (server/api.h): request fields to plain structs, errors naming the
// field, responses and chunks in OpenAI's shapes, the Prometheus text.
#include <gtest/gtest.h>

#include "server/api.h"

namespace ptllm::server {
namespace {

ApiError error_of(const std::string& body, Endpoint ep = Endpoint::Chat) {
  try {
    parse_request(body, ep, 7);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

TEST(ServerApi, ChatFieldsBecomeGenerationParams) {
  const ApiRequest r = parse_request(R"({"model": "m", "messages": [{"role": "system", "content": "s"},
      {"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_completion_tokens": 9, "temperature": 0.5,
      "top_p": 0.9, "top_k": 5, "min_p": 0.1, "repeat_penalty": 1.1, "seed": 42, "stop": ["a", "bc"],
      "presence_penalty": 0.5, "frequency_penalty": -0.25, "repeat_last_n": 32,
      "stream": true, "stream_options": {"include_usage": true}, "tools": [{"type": "function", "function": {"name": "f"}}], "n": 1})",
                                     Endpoint::Chat, 7);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.params.max_tokens, 9);
  EXPECT_TRUE(r.max_tokens_given);
  EXPECT_FLOAT_EQ(r.params.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.params.sampling.top_p, 0.9f);
  EXPECT_EQ(r.params.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(r.params.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.params.sampling.repeat_penalty, 1.1f);
  EXPECT_FLOAT_EQ(r.params.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.params.sampling.frequency_penalty, -0.25f);
  EXPECT_EQ(r.params.sampling.repeat_last_n, 32);
  EXPECT_EQ(r.params.sampling.seed, 42u);
  EXPECT_EQ(r.params.stops, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.tools.is_array());
}

TEST(ServerApi, DefaultsAndPrompts) {
  const ApiRequest chat = parse_request(R"({"messages": [{"role": "user", "content": "x"}], "stop": "END"})", Endpoint::Chat, 7);
  EXPECT_FALSE(chat.max_tokens_given);
  EXPECT_EQ(chat.params.sampling.seed, 7u);  // the server's seed when the body gives none
  EXPECT_EQ(chat.params.stops, std::vector<std::string>{"END"});
  EXPECT_TRUE(chat.tools.is_null());
  const ApiRequest text = parse_request(R"({"prompt": ["In the beginning"]})", Endpoint::Completion, 7);
  EXPECT_EQ(text.prompt_text, "In the beginning");
  EXPECT_EQ(text.params.max_tokens, 16);  // OpenAI's default for completions
  const ApiRequest ids = parse_request(R"({"prompt": [5, 6, 7], "max_tokens": 3})", Endpoint::Completion, 7);
  EXPECT_EQ(ids.prompt_ids, (std::vector<int32_t>{5, 6, 7}));
}

// Found by fuzz_request: a number past double's range is nlohmann's out_of_range, not a parse_error.
TEST(ServerApi, ANumberPastDoublesRangeIsABadRequest) {
  const ApiError e = error_of(R"({"prompt": ["one"], "repeat_penalty": 1e999})", Endpoint::Completion);
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("the request body is not valid JSON: number overflow"), std::string::npos) << e.message;
}

TEST(ServerApi, ErrorsNameTheField) {
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})").param, "tools");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})").param,
            "tools[0].function");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "f"}},
            {"type": "function", "function": {"description": "no name"}}]})").param,
            "tools[1].function.name");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "stop": [""]})").param, "stop");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})").param, "stop");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})").param, "max_tokens");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "top_p": 1.5})").param, "top_p");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "seed": "1"})").param, "seed");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})").param, "stream");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 2.5})").param,
            "presence_penalty");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": "1"})").param,
            "frequency_penalty");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})").param, "messages[0].content[0]");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user"}]})").param, "messages[0].content");
  EXPECT_EQ(error_of(R"({})").param, "messages");
  EXPECT_EQ(error_of(R"({"prompt": ""})", Endpoint::Completion).param, "prompt");
  EXPECT_EQ(error_of(R"({"prompt": ["a", "b"]})", Endpoint::Completion).param, "prompt");
  EXPECT_EQ(error_of(R"({"prompt": 5})", Endpoint::Completion).param, "prompt");
  const ApiError e = error_of("{\"messages\": 1");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.body()["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(e.body()["error"]["code"].is_null());
}

TEST(ServerApi, ResponsesAndChunks) {
  const ApiRequest chat = parse_request(R"({"messages": [{"role": "user", "content": "x"}]})", Endpoint::Chat, 7);
  RequestResult res;
  res.reason = FinishReason::Stop;
  res.text = "hello";
  res.prompt_tokens = 10;
  res.cached_tokens = 8;
  res.completion_tokens = 3;
  const json r = response_json(chat, res, "id1", 5, "m");
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "hello");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["total_tokens"], 13);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
  const json first = chunk_json(chat, "he", nullptr, true, "id1", 5, "m");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "he");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  res.reason = FinishReason::Length;
  const json last = chunk_json(chat, "", &res, false, "id1", 5, "m");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(usage_chunk_json(chat, res, "id1", 5, "m")["choices"].empty());
  const ApiRequest text = parse_request(R"({"prompt": "x"})", Endpoint::Completion, 7);
  EXPECT_EQ(response_json(text, res, "id2", 5, "m")["choices"][0]["text"], "hello");
}

TEST(ServerApi, MetricsText) {
  SchedulerStats s;
  s.requests = 3;
  s.prompt_tokens = 100;
  s.cached_tokens = 25;
  s.blocks_total = 64;
  s.blocks_used = 10;
  const std::string t = metrics_text(s, 8);
  EXPECT_NE(t.find("# TYPE ptllm_requests_total counter\nptllm_requests_total 3\n"), std::string::npos);
  EXPECT_NE(t.find("ptllm_prefix_cache_hit_ratio 0.25\n"), std::string::npos);
  EXPECT_NE(t.find("ptllm_kv_blocks_free 54\n"), std::string::npos);
  EXPECT_NE(t.find("ptllm_parallel_slots 8\n"), std::string::npos);
}

}  // namespace
}  // namespace ptllm::server
