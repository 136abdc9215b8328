#pragma once
// A synthetic byte-level BPE tokenizer of any vocabulary size, for random-weight checkpoints
// (make-model): every text encodes (any byte is a token) and decodes back, and other runtimes load it
// (llama.cpp through a GGUF copy), but its merges are not learned from any text.
#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace ptllm::tok {

// tokenizer.json (the `tokenizers` library's format) with exactly `vocab` ids: `specials` (id ->
// text) are special added tokens, every other id a regular token of GPT-2's byte-level layout (its
// ByteLevel pre-tokenizer and byte table). The regular tokens in id order: the 256 bytes (printable
// ASCII first), then every pair of bytes, then every pair followed by a byte, each made by the merge
// of its two parts, ranked in id order. vocab - specials.size() must be at least 256.
nlohmann::json synthetic_byte_level_bpe(int vocab, const std::map<int, std::string>& specials);

}  // namespace ptllm::tok
