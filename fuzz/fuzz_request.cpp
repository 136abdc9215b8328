// libFuzzer target: the server's request JSON (server/api.cpp, server/agent_apis.cpp) on arbitrary
// bytes, as a chat, a completion, a Responses and a Messages request. A request that parses is
// answered the way the server answers it: its messages rendered through a fixed ChatML template (with
// its tools), then a response, a stream chunk and a usage chunk built from a made-up result; every one
// must serialize. The same bytes are also a model's reply to the reply parser (engine/chat_output.h)
// of every tool-call format, whole and cut in two: both ways must give the same split.
#include <cstdlib>

#include "chat/chat_template.h"
#include "core/error.h"
#include "engine/chat_output.h"
#include "server/agent_apis.h"
#include "server/api.h"

namespace {
const char* const kChatML =
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] if m['content'] is string else '' }}"
    "<|im_end|>\n{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptllm;
  using namespace ptllm::server;
  static const chat::ChatTemplate tmpl = chat::ChatTemplate::from_string(kChatML, "chatml", chat::Json::object());
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (const Endpoint e : {Endpoint::Chat, Endpoint::Completion}) {
    ApiRequest r;
    try {
      r = parse_request(body, e, 1234);
    } catch (const ApiError& err) {
      (void)err.body().dump(-1, ' ', false, json::error_handler_t::replace);
      continue;
    }
    if (e == Endpoint::Chat) {
      chat::ChatRequest cr;
      cr.messages = chat::Json::parse(r.messages.dump());
      if (!r.tools.is_null()) cr.tools = chat::Json::parse(r.tools.dump());
      cr.add_generation_prompt = true;
      chat::RenderOptions opt;
      opt.now = 0;
      opt.max_steps = 200000;
      opt.max_output_bytes = 1 << 20;
      try {
        (void)tmpl.render(cr, opt);
      } catch (const Error&) {
      }
    }
    RequestResult res;
    res.text = "x";
    res.prompt_tokens = int64_t(r.prompt_ids.size() + r.prompt_text.size());
    (void)response_json(r, res, "id", 0, r.model).dump(-1, ' ', false, json::error_handler_t::replace);
    OutputDelta d;
    d.content = "y";
    (void)chunk_json(r, d, nullptr, true, "id", 0, r.model).dump(-1, ' ', false, json::error_handler_t::replace);
    (void)usage_chunk_json(r, res, "id", 0, r.model).dump(-1, ' ', false, json::error_handler_t::replace);
  }
  static ResponseStore store(4);
  for (const AgentApi api : {AgentApi::Responses, AgentApi::Messages}) {
    try {
      auto reply = parse_agent_request(api, body, 1, "m", store);
      RequestResult res;
      res.reason = FinishReason::Stop;
      ChatOutputParser out(reply->request.output);
      out.finish();
      (void)reply->response(res, out).dump(-1, ' ', false, json::error_handler_t::replace);
      for (const auto& e : reply->begin(1)) (void)e.data.dump(-1, ' ', false, json::error_handler_t::replace);
      for (const auto& e : reply->end(res, out)) (void)e.data.dump(-1, ' ', false, json::error_handler_t::replace);
    } catch (const ApiError& err) {
      (void)err.body().dump(-1, ' ', false, json::error_handler_t::replace);
    }
  }
  // The bytes as a reply: whole, and cut where the first byte says.
  const size_t cut = size > 0 ? data[0] % (size + 1) : 0;
  for (const ToolCallFormat f : {ToolCallFormat::Hermes, ToolCallFormat::Llama3, ToolCallFormat::Mistral,
                                 ToolCallFormat::Qwen3Coder}) {
    ChatOutputOptions o;
    o.format.tools = f;
    o.format.reasoning = true;
    o.parse_tools = true;
    o.parse_reasoning = true;
    o.tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}}}}])");
    ChatOutputParser whole(o), split(o);
    whole.push(body);
    whole.finish();
    split.push(body.substr(0, cut));
    split.push(body.substr(cut));
    split.finish();
    if (whole.content() != split.content() || whole.reasoning() != split.reasoning() ||
        whole.calls().size() != split.calls().size())
      std::abort();
    for (const ToolCall& c : whole.calls())
      if (!json::parse(c.arguments, nullptr, false).is_object()) std::abort();
  }
  return 0;
}
