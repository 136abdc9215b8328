// The streaming detokenizer on tokens that split characters: byte-level tokens holding one byte
// of an emoji each, SentencePiece byte-fallback runs, cut-off and invalid sequences, and the
// leading space that SentencePiece decoding strips only at the start of the whole text.
#include <gtest/gtest.h>

#include <filesystem>

#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

namespace {

const fs::path kModels = fs::path(PTLLM_SOURCE_DIR) / "models";
const fs::path kData = fs::path(PTLLM_SOURCE_DIR) / "tests" / "data" / "tokenizers";

std::vector<std::string> pushes(const ptllm::Tokenizer& tok, const Ids& ids,
                                bool skip_special = true) {
  ptllm::StreamingDetokenizer detok(tok, skip_special);
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(detok.push(id));
  out.push_back(detok.finish());
  return out;
}

// kjv-tiny has no token for 😀: it is four byte tokens, and nothing shows until the last.
TEST(TokenizerStream, ByteLevelEmojiAcrossTokens) {
  const auto tok = ptllm::Tokenizer::load(kModels / "kjv-tiny");
  const Ids ids = tok.encode(" 😀!", {.add_special = false});
  ASSERT_EQ(ids.size(), 6u);  // Ġ, four bytes, !
  EXPECT_EQ(pushes(tok, ids), (std::vector<std::string>{" ", "", "", "", "😀", "!", ""}));
}

TEST(TokenizerStream, ByteLevelCutOffAndInvalid) {
  const auto tok = ptllm::Tokenizer::load(kModels / "kjv-tiny");
  const Ids emoji = tok.encode("😀", {.add_special = false});
  ASSERT_EQ(emoji.size(), 4u);
  // Generation stops after three of the four bytes: the tail becomes U+FFFD at finish().
  EXPECT_EQ(pushes(tok, {emoji[0], emoji[1], emoji[2]}),
            (std::vector<std::string>{"", "", "", "\uFFFD"}));
  // A byte sequence broken by another token: the broken part is U+FFFD right away.
  const int32_t a = tok.encode("a", {.add_special = false}).at(0);
  EXPECT_EQ(pushes(tok, {emoji[0], emoji[1], a}),
            (std::vector<std::string>{"", "", "\uFFFDa", ""}));
  EXPECT_EQ(tok.decode(Ids{emoji[0], emoji[1], a}), "\uFFFDa");
  ptllm::StreamingDetokenizer detok(tok);
  EXPECT_EQ(detok.push(emoji[0]), "");
  EXPECT_EQ(detok.finish(), "\uFFFD");
  EXPECT_EQ(detok.finish(), "");  // finishing twice adds nothing
}

// SentencePiece byte fallback: a run of <0xXX> tokens is held until it ends (a later byte could
// still make the run invalid, which turns every byte of it into U+FFFD); the leading space of the
// first token is stripped, later ones are kept.
TEST(TokenizerStream, SentencePieceByteRuns) {
  const auto tok = ptllm::Tokenizer::load(kData / "sentencepiece_bpe.json");
  auto id = [&](const char* t) { return tok.token_to_id(t).value(); };
  const Ids ids = {id("<s>"), id("▁"),      id("<0xC3>"), id("<0xBC>"), id("b"),
                   id("▁"),   id("<0xE6>"), id("<0x9D>"), id("<0xB1>")};
  EXPECT_EQ(pushes(tok, ids),
            (std::vector<std::string>{"", "", "", "", "üb", " ", "", "", "", "東"}));
  EXPECT_EQ(tok.decode(ids), "üb 東");
  // Special tokens are skipped, or shown when asked for.
  EXPECT_EQ(pushes(tok, {id("<s>"), id("▁hello")}, false),
            (std::vector<std::string>{"<s>", " hello", ""}));
}

TEST(TokenizerStream, MetaspaceDecoderFirstTokenOnly) {
  const auto tok = ptllm::Tokenizer::load(kData / "metaspace_unk.json");
  const Ids ids = tok.encode("hello world", {.add_special = false});
  EXPECT_EQ(pushes(tok, ids), (std::vector<std::string>{"hello", " world", ""}));
}

}  // namespace
