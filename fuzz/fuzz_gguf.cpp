// libFuzzer target: the GGUF reader (header, metadata of every type, tensor infos, data offsets) on
// arbitrary bytes, then what a model load reads from it: ModelConfig from the {arch}.* keys and the
// embedded vocabulary translated to a tokenizer (small vocabularies also encode and decode a text).
#include <cstdlib>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptllm;
  try {
    const GgufFile f = GgufFile::parse(data, size, "fuzz.gguf");
    for (const GgufTensor& t : f.tensors()) {
      // Every byte a tensor claims must be readable (ASan checks the bounds of the input).
      volatile uint8_t sum = 0;
      if (t.nbytes) sum = sum + t.data[0] + t.data[t.nbytes - 1];
    }
    (void)f.header_bytes();
    try {
      // a config that loads holds what the forward pass indexes by
      const ModelConfig c = gguf_model_config(f);
      const int R = c.rotated_dims();
      if (R < 2 || R > c.head_dim || R % 2 != 0 || c.layer_kinds.size() != size_t(c.n_layers) ||
          (!c.layer_rope.empty() && c.layer_rope.size() != size_t(c.n_layers)))
        std::abort();
      // routed experts: what moe_forward indexes by (top_k within num_experts and kMaxTopK, layers in range)
      if (c.moe.enabled()) {
        const MoeConfig& m = c.moe;
        if (m.top_k < 1 || m.top_k > m.num_experts || m.top_k > kMaxTopK || m.intermediate_size < 1 ||
            m.decoder_sparse_step < 1)
          std::abort();
        for (int l : m.mlp_only_layers)
          if (l < 0 || l >= c.n_layers) std::abort();
      }
    } catch (const Error&) {
    }
    const GgufVocab v = gguf_vocab(f);
    const GgufTokenizerJson j = gguf_vocab_to_json(v);
    if (v.tokens.size() <= 4096) {
      const Tokenizer tok = tokenizer_from_gguf_vocab(v);
      const auto ids = tok.encode("Hello world, 123 <s> caf\xc3\xa9");
      (void)tok.decode(ids);
    }
  } catch (const Error&) {
  }
  return 0;
}
