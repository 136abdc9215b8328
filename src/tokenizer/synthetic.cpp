#include "tokenizer/synthetic.h"

#include <vector>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace ptllm::tok {

nlohmann::json synthetic_byte_level_bpe(int vocab_size, const std::map<int, std::string>& specials) {
  using nlohmann::json;
  const auto& unicode = byte_to_unicode();
  std::vector<int> byte_order;  // printable ASCII first: short ASCII texts get multi-byte tokens
  for (int b = 0x20; b < 0x7f; ++b) byte_order.push_back(b);
  for (int b = 0; b < 256; ++b)
    if (b < 0x20 || b >= 0x7f) byte_order.push_back(b);
  auto byte = [&](size_t i) -> const std::string& { return unicode[size_t(byte_order[i])]; };
  for (const auto& [id, text] : specials)
    if (id < 0 || id >= vocab_size || text.empty())
      throw Error("synthetic tokenizer: special token '" + text + "' at id " + std::to_string(id) + " outside [0, " +
                  std::to_string(vocab_size) + ")");
  const int64_t regular = int64_t(vocab_size) - int64_t(specials.size());
  if (regular < 256 || regular > 256 + 256 * 256 + 256 * 256 * 256)
    throw Error("synthetic tokenizer: " + std::to_string(vocab_size) + " ids with " +
                std::to_string(specials.size()) + " special ones leave " + std::to_string(regular) +
                " regular tokens (256 to 16,843,008)");

  json vocab = json::object(), merges = json::array();
  int id = 0;
  for (size_t q = 0; q < size_t(regular); ++q, ++id) {
    while (specials.count(id)) ++id;
    if (q < 256) {
      vocab[byte(q)] = id;
      continue;
    }
    std::string left, right;
    if (q < 256 + 65536) {
      left = byte((q - 256) / 256);
      right = byte((q - 256) % 256);
    } else {  // a pair (made above: its id is lower) and a byte
      const size_t r = q - 256 - 65536;
      left = byte(r / 65536) + byte(r / 256 % 256);
      right = byte(r % 256);
    }
    vocab[left + right] = id;
    merges.push_back(left + " " + right);  // byte-level pieces never hold an ASCII space
  }
  json added = json::array();
  for (const auto& [i, text] : specials) {
    if (vocab.contains(text)) throw Error("synthetic tokenizer: special token '" + text + "' is a regular token");
    added.push_back({{"id", i}, {"content", text}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", byte_level},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

}  // namespace ptllm::tok
