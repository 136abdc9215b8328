#pragma once
// A Model from a GGUF file (model/gguf.h): hyperparameters from the `{arch}.*` keys, the tensors of
// llama.cpp's naming read in place (quantized blocks as WeightFormat::Ggml views, F32/F16/BF16 as
// dense ones), and the Q/K row order of llama.cpp's converter undone. docs/gguf.md.
#include "model/config.h"
#include "model/gguf.h"
#include "tokenizer/gguf_vocab.h"

namespace ptllm {

// general.architecture llama or qwen2 and the `{arch}.*` keys -> ModelConfig (tensor shapes not yet
// checked). Throws Error naming the file and the key.
ModelConfig gguf_model_config(const GgufFile& f);

// The tokenizer.ggml.* keys and tokenizer.chat_template (the types checked, naming the key).
GgufVocab gguf_vocab(const GgufFile& f);

// Whether the file's Q and K rows are in llama.cpp's order: its converter permutes them for the
// llama architecture so that its RoPE, which rotates adjacent pairs (x[2j], x[2j+1]), matches
// transformers' rotate_half, which pairs x[j] with x[j + head_dim/2].
bool gguf_qk_permuted(const GgufFile& f);

// Undoes that permutation on projected rows instead of on the weights (no copy of a quantized
// matrix): x [T][heads][head_dim] in the converter's order, each head's element 2j + i moved to
// i * head_dim/2 + j (i in {0, 1}), which is the order the safetensors weights give.
void gguf_unpermute_heads(float* x, int T, int heads, int head_dim);
// The converter's permutation itself (the writer applies it to rows of weights): row
// h*D + i*D/2 + j of the transformers order goes to h*D + 2j + i. Returns the source row of each
// destination row: [rows].
std::vector<int> gguf_permuted_rows(int rows, int head_dim);

}  // namespace ptllm
