// libFuzzer target: tokenizer_config.json (bos/eos tokens, add_bos_token, chat_template) on
// arbitrary bytes, beside a fixed small tokenizer.json (tests/data/tokenizers/sentencepiece_bpe.json: a large one
// would make every input slow); what loads encodes a fixed text,
// and the chat template it carries (if any) is parsed and rendered over one message.
#include "chat/chat_template.h"
#include "core/error.h"
#include "fuzz_input.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptllm;
  const std::filesystem::path dir = fuzz::scratch_dir() / "tokcfg";
  static const bool made = [&] {
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(fuzz::source_dir() + "/tests/data/tokenizers/sentencepiece_bpe.json", dir / "tokenizer.json",
                               std::filesystem::copy_options::overwrite_existing);
    return true;
  }();
  (void)made;
  fuzz::write_file(dir / "tokenizer_config.json", {reinterpret_cast<const char*>(data), size});
  try {
    const Tokenizer tok = Tokenizer::load(dir);
    (void)tok.encode("In the beginning God created the heaven and the earth.");
  } catch (const Error&) {
  }
  try {
    const chat::ChatTemplate t = chat::ChatTemplate::load((dir / "tokenizer_config.json").string());
    chat::ChatRequest r;
    r.messages = chat::Json::parse(R"([{"role": "user", "content": "Hi"}])");
    r.add_generation_prompt = true;
    chat::RenderOptions opt;
    opt.now = 0;
    opt.max_steps = 200000;
    opt.max_output_bytes = 1 << 20;
    (void)t.render(r, opt);
  } catch (const Error&) {
  }
  return 0;
}
