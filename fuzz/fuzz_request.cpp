// libFuzzer target: the server's request JSON (server/api.cpp) on arbitrary bytes, as a chat and as a
// completion request. A request that parses is answered the way the server answers it: its messages
// rendered through a fixed ChatML template (with its tools), then a response, a stream chunk and a
// usage chunk built from a made-up result; every one must serialize.
#include "chat/chat_template.h"
#include "core/error.h"
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
    (void)chunk_json(r, "y", nullptr, true, "id", 0, r.model).dump(-1, ' ', false, json::error_handler_t::replace);
    (void)usage_chunk_json(r, res, "id", 0, r.model).dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return 0;
}
