// libFuzzer target: the streaming detokenizer on arbitrary id sequences (out-of-range and
// negative ids included) with fixed real tokenizers: the concatenation of push() and finish()
// must equal decode() of the same ids, and every push() must return whole UTF-8 characters.
#include <cstdlib>
#include <cstring>

#include "fuzz_input.h"
#include "tokenizer/tokenizer.h"

namespace {

bool whole_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = uint8_t(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptllm;
  static const std::vector<Tokenizer> toks = [] {
    std::vector<Tokenizer> t;
    for (const char* m : {"kjv-tiny", "qwen2-tiny", "mistral-tiny"})
      t.push_back(Tokenizer::load(fuzz::source_dir() + "/models/" + m));
    return t;
  }();
  if (size == 0) return 0;
  const Tokenizer& tok = toks[data[0] % toks.size()];
  const bool skip_special = (data[0] & 4) != 0;
  std::vector<int32_t> ids;
  for (size_t i = 1; i + 2 <= size; i += 2) {
    uint16_t v;
    std::memcpy(&v, data + i, 2);
    // Mostly ids of the vocabulary, sometimes past it or negative.
    ids.push_back(v >= 0xFF00 ? int32_t(v) - 0x10000 : int32_t(v % (tok.vocab_size() + 8)));
  }
  StreamingDetokenizer stream(tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    if (!whole_utf8(piece)) std::abort();
    streamed += piece;
  }
  streamed += stream.finish();
  if (streamed != tok.decode(ids, skip_special)) std::abort();
  return 0;
}
