// Round trip on random valid UTF-8 (every script, emoji, whitespace runs, digits, combining
// marks, any code point): decode(encode(x)) == x for the byte-level tokenizers (NFC(x) for the
// one that normalizes), and the streaming detokenizer gives decode()'s text in whole characters.
// The four reference models share kjv-tiny's tokenizer; the added_tokens fixture is left out
// because its add_prefix_space adds a space that decoding keeps, as in tokenizers.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <thread>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace fs = std::filesystem;

namespace {

std::string random_text(std::mt19937& rng) {
  auto pick = [&](uint32_t lo, uint32_t hi) {
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
  };
  static const char* const kWhite[] = {" ",      "  ",   "   ",    "\t",     "\n",     "\n\n",
                                       "\r\n",   "\r",   "\u00a0", "\u3000", "\u2028", "\u180e",
                                       "\u200b", "\x0b", "\x0c",   "\u0085"};
  static const char* const kEmoji[] = {
      "😀", "👩‍👩‍👧‍👦", "👍🏽", "🇫🇷", "❤️", "🤖", "🫠"};
  static const char* const kWords[] = {"the",    "LORD",  "don't",           "I'M", "you're", "'s",
                                       "Straße", "naïve", "xxxxxxxxxxxxxxxx"};
  // Code point ranges of scripts: Latin-1, Greek, Cyrillic, Hebrew, Arabic, Devanagari (with its
  // vowel signs), Thai, Hiragana, CJK, Hangul, combining marks, math, emoji.
  static const std::pair<uint32_t, uint32_t> kScripts[] = {
      {0xC0, 0xFF},   {0x391, 0x3C9},   {0x410, 0x44F},     {0x5D0, 0x5EA},   {0x621, 0x64A},
      {0x915, 0x94D}, {0xE01, 0xE3A},   {0x3041, 0x3096},   {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3},
      {0x300, 0x36F}, {0x2200, 0x22FF}, {0x1F300, 0x1FAFF}, {0x660, 0x669},   {0xFF10, 0xFF5A}};
  std::string s;
  const int parts = static_cast<int>(pick(0, 14));
  for (int i = 0; i < parts; ++i) {
    switch (pick(0, 6)) {
      case 0: s += kWhite[pick(0, std::size(kWhite) - 1)]; break;
      case 1: s += kEmoji[pick(0, std::size(kEmoji) - 1)]; break;
      case 2: s += kWords[pick(0, std::size(kWords) - 1)]; break;
      case 3:
        for (uint32_t n = pick(1, 12); n > 0; --n) s += static_cast<char>('0' + pick(0, 9));
        break;
      case 4:
        for (uint32_t n = pick(1, 8); n > 0; --n) s += static_cast<char>(pick(0x20, 0x7E));
        break;
      case 5: {
        const auto [lo, hi] = kScripts[pick(0, std::size(kScripts) - 1)];
        for (uint32_t n = pick(1, 6); n > 0; --n) ptllm::tok::append_utf8(s, pick(lo, hi));
        break;
      }
      default: {  // any Unicode scalar value
        uint32_t c = pick(0x80, 0x10FFFF);
        if (c >= 0xD800 && c <= 0xDFFF) c -= 0x800;
        ptllm::tok::append_utf8(s, c);
      }
    }
  }
  return s;
}

void check_round_trip(const fs::path& path, bool normalizes) {
  const ptllm::Tokenizer tok = ptllm::Tokenizer::load(path);
  std::mt19937 rng(1234);
  // Special tokens in the text are encoded as text, so that decode() keeps them.
  const ptllm::EncodeOptions opts{.add_special = true, .parse_special = false};
  for (int i = 0; i < 400; ++i) {
    const std::string text = random_text(rng);
    ASSERT_TRUE(ptllm::tok::is_valid_utf8(text));
    const std::vector<int32_t> ids = tok.encode(text, opts);
    const std::string expected = normalizes ? ptllm::tok::nfc(text) : text;
    const std::string decoded = tok.decode(ids);
    ASSERT_EQ(decoded, expected) << path << " case " << i;

    ptllm::StreamingDetokenizer detok(tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = detok.push(id);
      ASSERT_TRUE(ptllm::tok::is_valid_utf8(piece)) << "a partial character was emitted";
      streamed += piece;
    }
    streamed += detok.finish();
    ASSERT_EQ(streamed, decoded) << path << " case " << i;
  }
}

const fs::path kData = fs::path(PTLLM_SOURCE_DIR) / "tests" / "data" / "tokenizers";

TEST(TokenizerRoundTrip, ReferenceModel) {
  check_round_trip(fs::path(PTLLM_SOURCE_DIR) / "models" / "kjv-tiny", false);
}
TEST(TokenizerRoundTrip, Llama3Style) { check_round_trip(kData / "llama3_style.json", false); }
TEST(TokenizerRoundTrip, SmolLMStyle) { check_round_trip(kData / "smollm_style.json", false); }
TEST(TokenizerRoundTrip, QwenStyleNormalizesToNfc) {
  check_round_trip(kData / "qwen_style.json", true);
}

// encode/decode are const and share one word cache: threads at once get the ids one thread gets.
TEST(TokenizerRoundTrip, ConcurrentEncode) {
  const ptllm::Tokenizer tok =
      ptllm::Tokenizer::load(fs::path(PTLLM_SOURCE_DIR) / "models" / "kjv-tiny");
  std::mt19937 rng(99);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back(random_text(rng));
  std::vector<std::vector<int32_t>> expected;
  for (const auto& t : texts) expected.push_back(tok.encode(t));
  const ptllm::Tokenizer fresh =
      ptllm::Tokenizer::load(fs::path(PTLLM_SOURCE_DIR) / "models" / "kjv-tiny");
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round)
        for (size_t i = t; i < texts.size(); i += 1 + t % 2)
          bad[t] += fresh.encode(texts[i]) != expected[i] ||
                    fresh.decode(expected[i]) != tok.decode(expected[i]);
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, (std::vector<int>{0, 0, 0, 0}));
}

}  // namespace
