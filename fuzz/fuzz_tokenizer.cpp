// libFuzzer target: tokenizer.json (and, after the separator, tokenizer_config.json, then a text)
// -> Tokenizer; what loads encodes the text and decodes the ids, in one piece and streamed.
// A tokenizer file from the fuzzer may be slow to build (huge merges): inputs are bounded by -max_len.
#include "core/error.h"
#include "fuzz_input.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptllm;
  const auto parts = fuzz::split_input(data, size, 3);
  const std::filesystem::path dir = fuzz::scratch_dir() / "tok";
  static const bool made = std::filesystem::create_directories(dir) || true;
  (void)made;
  fuzz::write_file(dir / "tokenizer.json", parts[0]);
  if (parts[1].empty())
    std::filesystem::remove(dir / "tokenizer_config.json");
  else
    fuzz::write_file(dir / "tokenizer_config.json", parts[1]);
  try {
    const Tokenizer tok = Tokenizer::load(dir);
    const std::vector<int32_t> ids = tok.encode(parts[2]);
    const std::string text = tok.decode(ids);
    StreamingDetokenizer stream(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.finish();
    (void)text;
  } catch (const Error&) {
  }
  return 0;
}
