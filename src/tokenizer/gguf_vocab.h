#pragma once
// A GGUF file's embedded tokenizer (the tokenizer.ggml.* keys) as plain data, and its translation to
// and from the tokenizer.json this runtime already reads: a GGUF vocabulary becomes the same
// in-memory tokenizer its original tokenizer.json gives (docs/gguf.md has the mapping).
//
// - tokenizer.ggml.model "gpt2": byte-level BPE with merges; tokenizer.ggml.pre names the
//   pre-tokenizer (default/gpt-2, llama-bpe, qwen2, smollm, deepseek-llm, deepseek-v3), each mapped
//   to the normalizer and pre-tokenizer its models' tokenizer.json holds.
// - "llama": SentencePiece with scores. Its merges are derived as transformers' SentencePiece
//   converter derives them (every split of a piece into two pieces of the vocabulary, ranked by the
//   piece's score), which is the merge order of llama.cpp's SPM tokenizer (the highest-scoring
//   adjacent pair first).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ptllm {

class Tokenizer;

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class GgufTokenType : int32_t { Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

struct GgufVocab {
  std::string source;        // the file, for messages
  std::string model;         // tokenizer.ggml.model: "gpt2" or "llama"
  std::string pre;           // tokenizer.ggml.pre ("" when absent: default)
  std::vector<std::string> tokens;
  std::vector<float> scores;         // [tokens] or empty
  std::vector<int32_t> types;        // [tokens] GgufTokenType, or empty (all normal)
  std::vector<std::string> merges;   // "left right", gpt2 only
  std::optional<int32_t> bos, eos, eot, unk, pad;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
  std::optional<std::string> chat_template;  // tokenizer.chat_template
};

// The pre-tokenizer names this runtime maps (tokenizer.ggml.pre).
const std::vector<std::string>& gguf_pre_tokenizer_names();

// The equivalent tokenizer.json and tokenizer_config.json (bos_token, eos_token, add_bos_token,
// add_eos_token, chat_template). Throws Error naming the file and the key for what cannot be mapped
// (an unknown model or pre-tokenizer, a token id out of range, arrays of different lengths).
struct GgufTokenizerJson {
  nlohmann::json tokenizer;
  nlohmann::json config;
};
GgufTokenizerJson gguf_vocab_to_json(const GgufVocab& v);
Tokenizer tokenizer_from_gguf_vocab(const GgufVocab& v);

// The other way, for the writer: a tokenizer.json (and tokenizer_config.json, an empty object when
// absent) as llama.cpp's converter would record it. Throws Error naming `file` for a layout GGUF
// cannot express (an unrecognised pre-tokenizer, a normalizer other than the SentencePiece or NFC
// ones, a non-BPE model).
GgufVocab gguf_vocab_from_tokenizer_json(const nlohmann::json& tokenizer, const nlohmann::json& config,
                                         const std::string& file);

}  // namespace ptllm
