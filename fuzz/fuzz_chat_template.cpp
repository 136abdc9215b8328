// libFuzzer target: the chat-template interpreter (lexer, parser, evaluator) on an arbitrary
// template text, rendered over an arbitrary messages JSON (after the separator) and a fixed one.
// Bounded steps and output: a runaway template is a TemplateError, never a hang.
#include "chat/chat_template.h"
#include "core/error.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptllm;
  const auto parts = fuzz::split_input(data, size, 2);
  chat::ChatTemplate t;
  try {
    t = chat::ChatTemplate::from_string(std::string(parts[0]), "fuzz",
                                        chat::Json{{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  } catch (const Error&) {
    return 0;
  }
  chat::RenderOptions opt;
  opt.now = 0;
  opt.max_steps = 200000;
  opt.max_output_bytes = 1 << 20;
  std::vector<chat::Json> inputs = {chat::Json::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])")};
  const chat::Json fuzzed = chat::Json::parse(parts[1], nullptr, false);
  if (!fuzzed.is_discarded()) inputs.push_back(fuzzed);
  for (const chat::Json& j : inputs) {
    chat::ChatRequest r;
    if (j.is_object()) {
      r.messages = j.contains("messages") ? j["messages"] : chat::Json::array();
      if (j.contains("tools")) r.tools = j["tools"];
      if (j.contains("kwargs") && j["kwargs"].is_object()) r.kwargs = j["kwargs"];
    } else {
      r.messages = j;
    }
    r.add_generation_prompt = true;
    try {
      (void)t.render(r, opt);
    } catch (const Error&) {
    }
  }
  return 0;
}
