// The reference models' golden.json, computed by transformers: every tokenizer[] case encodes to
// the same ids and decodes to the same text, prompts[] encode the same, and greedy_ids decode to
// greedy_text, in one piece and streamed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

std::string stream_decode(const ptllm::Tokenizer& tok, const std::vector<int32_t>& ids) {
  ptllm::StreamingDetokenizer detok(tok);
  std::string out;
  for (int32_t id : ids) out += detok.push(id);
  return out + detok.finish();
}

void check_model(const fs::path& dir) {
  const ptllm::Tokenizer tok = ptllm::Tokenizer::load(dir);
  const nlohmann::json golden = read_json(dir / "golden.json");
  ASSERT_GE(golden["tokenizer"].size(), 10u);
  for (const auto& c : golden["tokenizer"]) {
    const std::string text = c["text"];
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), ids) << "text: " << text;
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << "text: " << text;
    EXPECT_EQ(stream_decode(tok, ids), c["decoded"].get<std::string>()) << "text: " << text;
  }
  ASSERT_FALSE(golden["prompts"].empty());
  for (const auto& p : golden["prompts"]) {
    EXPECT_EQ(tok.encode(p["text"].get<std::string>()), p["ids"].get<std::vector<int32_t>>());
    const auto greedy = p["greedy_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.decode(greedy), p["greedy_text"].get<std::string>());
    EXPECT_EQ(stream_decode(tok, greedy), p["greedy_text"].get<std::string>());
  }
  // The shared tokenizer: <s>=0, </s>=1, <pad>=2, vocab 8192 (../shared/models/README.md).
  EXPECT_EQ(tok.vocab_size(), 8192);
  EXPECT_EQ(tok.bos_id(), 0);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.token_to_id("<pad>"), 2);
  EXPECT_TRUE(tok.is_special(0) && tok.is_special(1) && tok.is_special(2));
  EXPECT_FALSE(tok.is_special(3));
}

class TokenizerGolden : public testing::TestWithParam<std::string> {};

TEST_P(TokenizerGolden, MatchesTransformers) {
  check_model(fs::path(PTLLM_SOURCE_DIR) / "models" / GetParam());
}

INSTANTIATE_TEST_SUITE_P(RepoModels, TokenizerGolden,
                         testing::Values("kjv-tiny", "qwen2-tiny", "mistral-tiny",
                                         "llama-mha-ropescaled-tiny"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

TEST(TokenizerGoldenShared, KjvSmall) {
  const fs::path dir = fs::path(PTLLM_SOURCE_DIR) / ".." / "shared" / "models" / "kjv-small";
  if (!fs::exists(dir / "golden.json")) GTEST_SKIP() << "no " << dir << " on this machine";
  check_model(dir);
}

TEST(TokenizerGoldenShared, FingerprintCoversBothFiles) {
  const fs::path dir = fs::path(PTLLM_SOURCE_DIR) / "models";
  const std::string a = ptllm::Tokenizer::load(dir / "kjv-tiny").fingerprint();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  // Same bytes, same fingerprint; the bare tokenizer.json (no config read) differs.
  EXPECT_EQ(a, ptllm::Tokenizer::load(dir / "qwen2-tiny").fingerprint());
  const fs::path bare =
      fs::temp_directory_path() / ("ptllm_tok_fingerprint_" + std::to_string(getpid()) + ".json");
  fs::copy_file(dir / "kjv-tiny" / "tokenizer.json", bare, fs::copy_options::overwrite_existing);
  EXPECT_NE(a, ptllm::Tokenizer::load(bare).fingerprint());
  fs::remove(bare);
}

}  // namespace
