// make-model's synthetic byte-level BPE: exactly the vocabulary's size, every text round-trips, the
// specials sit at the shape's ids, and the GGUF writer records a token for every embedding row
// (padding a tokenizer shorter than vocab_size as llama.cpp's converter does).
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/synthetic.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

namespace ptllm {
namespace {

Tokenizer load(const nlohmann::json& tok, const nlohmann::json& cfg = nlohmann::json::object()) {
  return Tokenizer::from_json(tok, cfg, "synthetic", "synthetic config", tok.dump());
}

// Qwen3-30B-A3B's layout: 151,936 ids, <|endoftext|> at 151643, <|im_end|> at 151645 (regular tokens
// around and after them), so pairs and triples of bytes both occur.
TEST(SyntheticTokenizer, HasExactlyTheVocabularysIdsAndRoundTripsText) {
  const nlohmann::json j = tok::synthetic_byte_level_bpe(151936, {{151643, "<|endoftext|>"}, {151645, "<|im_end|>"}});
  const Tokenizer t = load(j, {{"eos_token", "<|im_end|>"}});
  EXPECT_EQ(t.vocab_size(), 151936);
  EXPECT_EQ(j["model"]["vocab"].size() + j["added_tokens"].size(), 151936u);
  std::set<int> ids;
  for (const auto& [text, id] : j["model"]["vocab"].items()) ids.insert(id.get<int>());
  EXPECT_EQ(ids.size(), 151934u);  // distinct ids, none taken twice
  EXPECT_EQ(*ids.rbegin(), 151935);
  EXPECT_FALSE(ids.count(151643));
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 151643);
  EXPECT_TRUE(t.is_special(151645));
  EXPECT_EQ(t.eos_id(), 151645);
  EXPECT_EQ(t.id_to_token(151644), "!o{");  // regular: pair 1 * 256 + 79 ("!o") and byte 91
  const std::string text = "Hello world, caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87\n\ttabs 12345 <|im_end|>";
  const std::vector<int32_t> ids_of = t.encode(text);
  EXPECT_LT(ids_of.size(), text.size());  // merges apply: fewer tokens than bytes
  EXPECT_EQ(ids_of.back(), 151645);       // the special matched as one token
  EXPECT_EQ(t.decode(ids_of, false), text);
  // every ASCII byte and characters of two, three and four bytes encode and decode back
  std::string all;
  for (int b = 1; b < 128; ++b) all += char(b);
  all += "\xc3\xbf\xe2\x82\xac\xf0\x9f\x98\x80";
  EXPECT_EQ(t.decode(t.encode(all), false), all);
}

TEST(SyntheticTokenizer, RefusesSizesItCannotFill) {
  EXPECT_THROW(tok::synthetic_byte_level_bpe(200, {}), Error);
  EXPECT_THROW(tok::synthetic_byte_level_bpe(512, {{512, "<s>"}}), Error);
  EXPECT_THROW(tok::synthetic_byte_level_bpe(512, {{0, "a"}}), Error);  // "a" is a regular token
  EXPECT_EQ(load(tok::synthetic_byte_level_bpe(256, {})).vocab_size(), 256);
}

std::string cli(const std::string& args) { return test::binary() + " " + args; }

GgufVocab gguf_vocab_of(const std::filesystem::path& p) { return gguf_vocab(GgufFile::open(p)); }

// make-model's checkpoint is complete: its tokenizer loads, and its GGUF copy names one token per row.
TEST(SyntheticTokenizer, MakeModelWritesItAndGgufCopiesKeepEveryId) {
  test::TempDir dir;
  auto r = test::run_command(cli("make-model --shape tiny --threads 1 " + dir.path.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const Tokenizer t = Tokenizer::load(dir.path);
  EXPECT_EQ(t.vocab_size(), 512);
  EXPECT_EQ(t.token_to_id("<s>"), 0);
  EXPECT_EQ(t.eos_id(), 1);
  const auto g = dir.path / "m.gguf";
  r = test::run_command(cli("quantize " + dir.path.string() + " " + g.string() + " --format gguf --type Q8_0"));
  ASSERT_EQ(r.code, 0) << r.err;
  const GgufVocab v = gguf_vocab_of(g);
  ASSERT_EQ(v.tokens.size(), 512u);
  EXPECT_EQ(v.pre, "gpt-2");
  EXPECT_EQ(v.merges.size(), 512u - 2 - 256);
  EXPECT_EQ(v.types[0], int32_t(GgufTokenType::Control));

  // A tokenizer 12 ids short of vocab_size (Qwen's case): the copy pads with unused tokens.
  nlohmann::json j = test::read_json(dir.path / "tokenizer.json");
  auto& vocab = j["model"]["vocab"];
  for (auto it = vocab.begin(); it != vocab.end();) it = it.value().get<int>() >= 500 ? vocab.erase(it) : std::next(it);
  auto& merges = j["model"]["merges"];
  merges.erase(merges.end() - 12, merges.end());
  std::ofstream(dir.path / "tokenizer.json") << j.dump();
  r = test::run_command(cli("quantize " + dir.path.string() + " " + g.string() + " --format gguf --type Q8_0"));
  ASSERT_EQ(r.code, 0) << r.err;
  const GgufVocab padded = gguf_vocab_of(g);
  ASSERT_EQ(padded.tokens.size(), 512u);
  EXPECT_EQ(padded.tokens[499], t.id_to_token(499));
  EXPECT_EQ(padded.tokens[500], "[PAD500]");
  EXPECT_EQ(padded.types[511], int32_t(GgufTokenType::Unused));
}

}  // namespace
}  // namespace ptllm
