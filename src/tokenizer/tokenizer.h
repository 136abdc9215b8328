#pragma once
// Hugging Face tokenizer.json (BPE models: byte-level and SentencePiece-style), modelled on the
// `tokenizers` Rust library so that encode() gives the same ids and decode() the same text.
// What is supported, and how invalid UTF-8 is handled: docs/tokenizer.md.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ptllm {

struct EncodeOptions {
  // Post-processor special tokens (BOS ...); false = add_special_tokens=False.
  bool add_special = true;
  // Match special added tokens in the text; false = treat them as plain text (tokenizers'
  // encode_special_tokens=True: added tokens that are not special are still matched).
  bool parse_special = true;
};

class Tokenizer {
 public:
  // path: a model directory (reads tokenizer.json and, if present, tokenizer_config.json) or a
  // tokenizer.json file (its sibling tokenizer_config.json is read when the file is named
  // tokenizer.json). Throws ptllm::Error naming the file and the problem (missing file, bad JSON,
  // unsupported component type: which one).
  static Tokenizer load(const std::filesystem::path& path);
  // The same from parsed documents: `root` a tokenizer.json, `config` a tokenizer_config.json (an
  // empty object: none); `file` and `config_file` name them in errors; the fingerprint is the
  // SHA-256 of fingerprint_bytes (a GGUF file's vocabulary, for one).
  static Tokenizer from_json(const nlohmann::json& root, const nlohmann::json& config, const std::string& file,
                             const std::string& config_file, const std::string& fingerprint_bytes);

  // Invalid UTF-8 in `text` is first replaced by U+FFFD per maximal invalid subsequence (what
  // Python's bytes.decode("utf-8", "replace") gives a tokenizers user).
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opts = {}) const;
  // decode(ids, skip_special_tokens) of tokenizers; ids unknown to the vocabulary are skipped.
  std::string decode(std::span<const int32_t> ids, bool skip_special = true) const;

  int32_t vocab_size() const;             // highest id + 1, added tokens included
  // Each id's bytes as it adds them to a text after other tokens (raw: a byte-level token may hold
  // part of a UTF-8 character); special tokens give their text; ids outside the vocabulary "".
  std::vector<std::string> token_bytes() const;
  std::optional<int32_t> bos_id() const;  // from tokenizer_config bos_token if present
  std::optional<int32_t> eos_id() const;
  bool is_special(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;  // the vocabulary string
  std::string fingerprint() const;  // hex SHA-256 over tokenizer.json then tokenizer_config.json

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  // Immutable after load except the word cache, which is internally locked: copies share it,
  // and encode/decode are safe from any number of threads.
  std::shared_ptr<const Impl> impl_;
  friend class StreamingDetokenizer;
};

// Incremental decode for generation. The concatenation of every push() and finish() equals
// decode() of all the ids pushed; each push() returns only whole UTF-8 characters.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tok, bool skip_special = true);
  ~StreamingDetokenizer();
  StreamingDetokenizer(StreamingDetokenizer&&) noexcept;
  StreamingDetokenizer& operator=(StreamingDetokenizer&&) noexcept;

  // Text newly completed by this token: only whole UTF-8 characters. Not after finish().
  std::string push(int32_t id);
  // The rest at end of generation (incomplete bytes become U+FFFD); later calls return "".
  std::string finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ptllm
