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
  OutputDelta he;
  he.content = "he";
  const json first = chunk_json(chat, he, nullptr, true, "id1", 5, "m");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "he");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  res.reason = FinishReason::Length;
  const json last = chunk_json(chat, OutputDelta{}, &res, false, "id1", 5, "m");
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

namespace ptllm::server {
namespace {

ApiError refused(const std::string& body, Endpoint ep = Endpoint::Chat) {
  try {
    parse_request(body, ep, 1);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

const char* kTools = R"("tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])";

TEST(ServerApiAgents, ToolChoiceAndResponseFormat) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_TRUE(parse_request("{" + msgs + "," + kTools + R"(, "tool_choice": "none"})", Endpoint::Chat, 1).tool_choice_none);
  EXPECT_FALSE(parse_request("{" + msgs + "," + kTools + R"(, "tool_choice": "auto"})", Endpoint::Chat, 1).tool_choice_none);
  EXPECT_FALSE(parse_request("{" + msgs + R"(, "parallel_tool_calls": false})", Endpoint::Chat, 1).parallel_tool_calls);
  EXPECT_TRUE(parse_request("{" + msgs + "," + kTools + R"(, "tool_choice": "required"})", Endpoint::Chat, 1).tool_choice_required);
  EXPECT_EQ(refused("{" + msgs + R"(, "tool_choice": "required"})").param, "tool_choice");  // no tools
  EXPECT_EQ(refused("{" + msgs + "," + kTools + R"(, "tool_choice": "always"})").param, "tool_choice");
  const ApiError unknown =
      refused("{" + msgs + "," + kTools + R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}}})");
  EXPECT_EQ(unknown.param, "tool_choice.function.name");
  EXPECT_NE(unknown.message.find("nope"), std::string::npos);
  EXPECT_EQ(parse_request("{" + msgs + "," + kTools + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})",
                          Endpoint::Chat, 1).tool_choice_name,
            "get_weather");
  EXPECT_EQ(parse_request("{" + msgs + R"(, "response_format": {"type": "text"}})", Endpoint::Chat, 1).constraint.kind,
            OutputConstraint::Kind::None);
  EXPECT_EQ(parse_request("{" + msgs + R"(, "response_format": {"type": "json_object"}})", Endpoint::Chat, 1).constraint.kind,
            OutputConstraint::Kind::AnyObject);
  const ApiRequest js = parse_request(
      "{" + msgs + R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}})",
      Endpoint::Chat, 1);
  EXPECT_EQ(js.constraint.kind, OutputConstraint::Kind::Schema);
  EXPECT_EQ(js.constraint.schema, json({{"type", "integer"}}));
  EXPECT_EQ(refused("{" + msgs + R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})").param,
            "response_format.json_schema.schema");
  EXPECT_EQ(refused("{" + msgs + R"(, "response_format": {"type": "xml"}})").param, "response_format.type");
  EXPECT_EQ(parse_request("{" + msgs + R"(, "reasoning_format": "none"})", Endpoint::Chat, 1).reasoning, false);
  EXPECT_EQ(refused("{" + msgs + R"(, "reasoning_format": "loud"})").param, "reasoning_format");
  EXPECT_EQ(parse_request("{" + msgs + R"(, "chat_template_kwargs": {"enable_thinking": false}})", Endpoint::Chat, 1)
                .template_kwargs["enable_thinking"],
            false);
}

TEST(ServerApiAgents, NoFieldIsSilentlyIgnored) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  for (const char* f : {R"("top_logprobs": 3)",
                        R"("functions": [])", R"("reasoning_effort": "high")", R"("frobnicate": 1)",
                        R"("prediction": {"type": "content", "content": "x"})"}) {
    const ApiError e = refused("{" + msgs + ", " + f + "}");
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(f, "\"" + e.param + "\"" + std::string(f).substr(e.param.size() + 2)) << e.message;
  }
  for (const char* f : {R"("echo": true)", R"("best_of": 2)", R"("suffix": "x")", R"("logprobs": 21)"})
    EXPECT_EQ(refused(std::string(R"({"prompt": "x", )") + f + "}", Endpoint::Completion).status, 400) << f;
  // Metadata and neutral values are accepted.
  parse_request("{" + msgs + R"(, "user": "u", "metadata": {"a": "b"}, "store": false, "service_tier": "auto",
                 "logprobs": false, "logit_bias": {}, "stream_options": {"include_usage": true}})",
                Endpoint::Chat, 1);
  EXPECT_TRUE(parse_request("{" + msgs + R"(, "ignore_eos": true})", Endpoint::Chat, 1).params.ignore_eos);
}

TEST(ServerApiAgents, LogitBias) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  const ApiRequest r = parse_request("{" + msgs + R"(, "logit_bias": {"5": -100, "17": 2.5}})", Endpoint::Chat, 1);
  ASSERT_EQ(r.params.logit_bias.size(), 2u);
  EXPECT_EQ(r.params.logit_bias[0], std::make_pair(int32_t(5), -100.0f));
  EXPECT_EQ(r.params.logit_bias[1], std::make_pair(int32_t(17), 2.5f));
  for (const char* bad : {R"({"x": 1})", R"({"-1": 1})", R"({"5": 101})", R"({"5": "1"})", R"([1])", R"({"4294967301": 1})"})
    EXPECT_EQ(refused("{" + msgs + R"(, "logit_bias": )" + bad + "}").param, "logit_bias") << bad;
}

TEST(ServerApiAgents, Logprobs) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  ApiRequest chat = parse_request("{" + msgs + R"(, "logprobs": true, "top_logprobs": 2})", Endpoint::Chat, 1);
  EXPECT_TRUE(chat.logprobs);
  EXPECT_EQ(chat.params.top_logprobs, 2);
  EXPECT_EQ(parse_request("{" + msgs + "}", Endpoint::Chat, 1).params.top_logprobs, -1);
  EXPECT_EQ(refused("{" + msgs + R"(, "top_logprobs": 2})").param, "top_logprobs");
  ApiRequest text = parse_request(R"({"prompt": "x", "logprobs": 3})", Endpoint::Completion, 1);
  EXPECT_EQ(text.params.top_logprobs, 3);
  std::vector<TokenLogprob> lps(2);
  lps[0].chosen = {5, "ab", -0.5f};
  lps[0].top = {{5, "ab", -0.5f}, {6, "c", -1.5f}};
  lps[1].chosen = {7, "d", -0.25f};
  const json c = logprobs_json(chat, lps, 0);
  ASSERT_EQ(c["content"].size(), 2u);
  EXPECT_EQ(c["content"][0]["token"], "ab");
  EXPECT_EQ(c["content"][0]["bytes"], json({97, 98}));
  EXPECT_EQ(c["content"][0]["top_logprobs"][1]["token"], "c");
  const json t = logprobs_json(text, lps, 10);
  EXPECT_EQ(t["tokens"], json({"ab", "d"}));
  EXPECT_EQ(t["text_offset"], json({10, 12}));
  EXPECT_EQ(t["top_logprobs"][0]["c"], -1.5f);
  EXPECT_TRUE(logprobs_json(parse_request("{" + msgs + "}", Endpoint::Chat, 1), lps, 0).is_null());
}

TEST(ServerApiAgents, HistoryWithCalls) {
  const ApiRequest r = parse_request(R"({"messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]})",
                                     Endpoint::Chat, 1);
  // The template sees the arguments as an object.
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["arguments"], json({{"city", "Paris"}}));
  const ApiError bad_args = refused(R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
      "function": {"name": "f", "arguments": "{city: Paris"}}]}]})");
  EXPECT_EQ(bad_args.param, "messages[0].tool_calls[0].function.arguments");
  EXPECT_EQ(refused(R"({"messages": [{"role": "tool", "content": "18 C"}]})").param, "messages[0].tool_call_id");
  EXPECT_EQ(refused(R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})").param,
            "messages[0].tool_calls");
}

TEST(ServerApiAgents, ReplyWithCallsAndReasoning) {
  ApiRequest r = parse_request(std::string(R"({"messages": [{"role": "user", "content": "x"}], )") + kTools + "}",
                               Endpoint::Chat, 1);
  r.output.format.tools = ToolCallFormat::Hermes;
  r.output.format.reasoning = true;
  r.output.parse_tools = true;
  r.output.parse_reasoning = true;
  RequestResult res;
  res.reason = FinishReason::Stop;
  res.text = "<think>Paris?</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const json out = response_json(r, res, "id", 1, "m");
  const json& msg = out["choices"][0]["message"];
  EXPECT_TRUE(msg["content"].is_null());
  EXPECT_EQ(msg["reasoning_content"], "Paris?");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(out["choices"][0]["finish_reason"], "tool_calls");
  // Cut off by max_tokens inside the call: text, "length".
  res.reason = FinishReason::Length;
  res.text = "<tool_call>\n{\"name\": \"get_wea";
  const json cut = response_json(r, res, "id", 1, "m");
  EXPECT_EQ(cut["choices"][0]["message"]["content"], res.text);
  EXPECT_FALSE(cut["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "length");
}

}  // namespace
}  // namespace ptllm::server
