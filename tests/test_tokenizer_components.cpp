// The pipeline stages one at a time, against the examples of tokenizers' own documentation and
// unit tests (split.rs, normalizer.rs, metaspace.rs, byte_level.rs, digits.rs, the decoders),
// plus NFC, UTF-8 repair and the Oniguruma-compatible regex classes.
#include <gtest/gtest.h>

#include <vector>

#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

using namespace ptllm::tok;
using Pieces = std::vector<std::string>;

namespace {

const JsonPath kAt{"test", ""};

Pieces pre_tokenize(const json& config, const std::string& text) {
  bool deferred = false;
  const auto p = parse_pre_tokenizer(config, kAt, false, &deferred);
  Pieces out;
  p->split(text, true, [&](std::string_view s, bool) { out.emplace_back(s); });
  return out;
}

json split(const json& pattern, const char* behavior, bool invert) {
  return {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
}

std::string decode(const json& config, const Pieces& tokens) {
  DecoderPlan plan(config, kAt);
  auto s = plan.start();
  for (const auto& t : tokens) s->push(t);
  s->finish();
  return s->take();
}

// split.rs: the delimiter behaviours on "How are you doing?" with the inverted pattern
// \w+|[^\w\s]+ (which matches the spaces).
TEST(TokenizerComponents, SplitBehaviours) {
  const json words = {{"Regex", "\\w+|[^\\w\\s]+"}};
  const std::string text = "How are you doing?";
  EXPECT_EQ(pre_tokenize(split(words, "Removed", true), text),
            (Pieces{"How", "are", "you", "doing", "?"}));
  EXPECT_EQ(pre_tokenize(split(words, "Isolated", true), text),
            (Pieces{"How", " ", "are", " ", "you", " ", "doing", "?"}));
  EXPECT_EQ(pre_tokenize(split(words, "MergedWithPrevious", true), text),
            (Pieces{"How ", "are ", "you ", "doing", "?"}));
  EXPECT_EQ(pre_tokenize(split(words, "MergedWithNext", true), text),
            (Pieces{"How", " are", " you", " doing", "?"}));
  EXPECT_EQ(pre_tokenize(split(words, "Contiguous", true), text),
            (Pieces{"How", " ", "are", " ", "you", " ", "doing?"}));
}

// normalizer.rs: "the-final--countdown" split on "-".
TEST(TokenizerComponents, SplitOnLiteral) {
  const json dash = {{"String", "-"}};
  const std::string text = "the-final--countdown";
  EXPECT_EQ(pre_tokenize(split(dash, "Removed", false), text),
            (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(pre_tokenize(split(dash, "Isolated", false), text),
            (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split(dash, "MergedWithPrevious", false), text),
            (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split(dash, "MergedWithNext", false), text),
            (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pre_tokenize(split(dash, "Contiguous", false), text),
            (Pieces{"the", "-", "final", "--", "countdown"}));
}

// byte_level.rs: the GPT-2 regex, the byte stand-ins, add_prefix_space.
TEST(TokenizerComponents, ByteLevelPreTokenizer) {
  const json no_prefix = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  EXPECT_EQ(
      pre_tokenize(no_prefix, "Hello my friend, how is your day going?"),
      (Pieces{"Hello", "Ġmy", "Ġfriend", ",", "Ġhow", "Ġis", "Ġyour", "Ġday", "Ġgoing", "?"}));
  EXPECT_EQ(pre_tokenize(no_prefix, "Hello there\nHello there"),
            (Pieces{"Hello", "Ġthere", "Ċ", "Hello", "Ġthere"}));
  EXPECT_EQ(pre_tokenize(no_prefix, "Hello there       dear"),
            (Pieces{"Hello", "Ġthere", "ĠĠĠĠĠĠ", "Ġdear"}));
  EXPECT_EQ(pre_tokenize(no_prefix, "i⭢j"), (Pieces{"i", "âŃ¢", "j"}));
  const json prefix_no_regex = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}};
  EXPECT_EQ(pre_tokenize(prefix_no_regex, "Hello my"), (Pieces{"ĠHelloĠmy"}));
  EXPECT_EQ(pre_tokenize(prefix_no_regex, " Hello"), (Pieces{"ĠHello"}));
}

// metaspace.rs
TEST(TokenizerComponents, MetaspacePreTokenizer) {
  const json always = {
      {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(pre_tokenize(always, "Hey friend!"), (Pieces{"▁Hey", "▁friend!"}));
  EXPECT_EQ(pre_tokenize(always, "Hey   friend!"), (Pieces{"▁Hey", "▁", "▁", "▁friend!"}));
  const json never = {
      {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "never"}, {"split", false}};
  EXPECT_EQ(pre_tokenize(never, "Hey friend!"), (Pieces{"Hey▁friend!"}));
  // The pre-prepend_scheme spelling.
  const json legacy = {{"type", "Metaspace"}, {"replacement", "▁"}, {"add_prefix_space", false}};
  EXPECT_EQ(pre_tokenize(legacy, "Hey friend!"), (Pieces{"Hey", "▁friend!"}));
}

// digits.rs
TEST(TokenizerComponents, DigitsPreTokenizer) {
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", true}}, "Hey 123 friend!"),
            (Pieces{"Hey ", "1", "2", "3", " friend!"}));
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", false}}, "Hey 123 friend!"),
            (Pieces{"Hey ", "123", " friend!"}));
}

TEST(TokenizerComponents, Normalizers) {
  auto run = [](const json& config, std::string s) {
    parse_normalizer(config, kAt)->normalize(s);
    return s;
  };
  const json llama2 = {{"type", "Sequence"},
                       {"normalizers",
                        {{{"type", "Prepend"}, {"prepend", "▁"}},
                         {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}};
  EXPECT_EQ(run(llama2, "Hey friend"), "▁Hey▁friend");
  EXPECT_EQ(run(llama2, ""), "");  // Prepend leaves empty text alone
  EXPECT_EQ(run({{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}},
                "This     is   a         test"),
            "This is a test");
  // Content is literal ($1 is not expanded in tokenizers 0.23).
  EXPECT_EQ(run({{"type", "Replace"}, {"pattern", {{"Regex", "(l)(e)"}}}, {"content", "$1"}}, "le"),
            "$1");
  EXPECT_EQ(run({{"type", "NFC"}}, "e\u0301"), "\u00e9");
}

// byte_fallback.rs, strip.rs, metaspace.rs, replace.rs, byte_level.rs.
TEST(TokenizerComponents, Decoders) {
  const json fallback = {{"type", "ByteFallback"}};
  EXPECT_EQ(decode(fallback, {"Hey", "friend!"}), "Heyfriend!");
  EXPECT_EQ(decode(fallback, {"<0x61>"}), "a");
  EXPECT_EQ(decode(fallback, {"<0xE5>"}), "\uFFFD");
  EXPECT_EQ(decode(fallback, {"<0xE5>", "<0x8f>"}), "\uFFFD\uFFFD");
  EXPECT_EQ(decode(fallback, {"<0xE5>", "<0x8f>", "<0xab>", "a"}), "叫a");
  EXPECT_EQ(decode(fallback, {"<0xE5>", "<0x8f>", "a"}), "\uFFFD\uFFFDa");

  EXPECT_EQ(decode({{"type", "Strip"}, {"content", "H"}, {"start", 1}, {"stop", 0}},
                   {"Hey", " friend!", "HHH"}),
            "ey friend!HH");
  EXPECT_EQ(
      decode({{"type", "Strip"}, {"content", "y"}, {"start", 0}, {"stop", 1}}, {"Hey", " friend!"}),
      "He friend!");

  const json meta = {
      {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(decode(meta, {"▁Hey", "▁friend!"}), "Hey friend!");
  json meta_never = meta;
  meta_never["prepend_scheme"] = "never";
  EXPECT_EQ(decode(meta_never, {"▁Hey", "▁friend!"}), " Hey friend!");

  EXPECT_EQ(decode({{"type", "Replace"}, {"pattern", {{"String", "_"}}}, {"content", " "}},
                   {"hello", "_hello"}),
            "hello hello");
  EXPECT_EQ(decode({{"type", "ByteLevel"}},
                   {"Hello", "Ġmy", "Ġfriend", ",", "Ġhow", "Ġis", "Ġyour", "Ġday", "Ġgoing", "?"}),
            "Hello my friend, how is your day going?");
  // The SentencePiece chain: Strip after Fuse removes one space from the whole text only.
  const json sp = {{"type", "Sequence"},
                   {"decoders",
                    {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}},
                     {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  EXPECT_EQ(decode(sp, {"▁Hey", "▁friend", "<0x21>"}), "Hey friend!");
  EXPECT_EQ(decode(sp, {"▁", "▁Hey"}), " Hey");
  EXPECT_EQ(decode(nullptr, {"a", "b"}), "a b");  // no decoder
}

// UAX #15 examples: composition, Hangul, blocked marks, exclusions, reordering.
TEST(TokenizerComponents, Nfc) {
  EXPECT_EQ(nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(nfc("\u212b"), "\u00c5");                // Angstrom sign: singleton
  EXPECT_EQ(nfc("\u1e0b\u0323"), "\u1e0d\u0307");    // d + dot above + dot below
  EXPECT_EQ(nfc("q\u0307\u0323"), "q\u0323\u0307");  // reordered, nothing to compose
  EXPECT_EQ(nfc("\u1100\u1161\u11a8"), "\uac01");    // Hangul L V T
  EXPECT_EQ(nfc("\uac00\u11a8"), "\uac01");          // LV + T
  EXPECT_EQ(nfc("\u0915\u093c"), "\u0915\u093c");    // composition exclusion (U+0958)
  EXPECT_EQ(nfc("\u0958"), "\u0915\u093c");
  EXPECT_EQ(nfc("\u0301e"), "\u0301e");       // a leading mark stays
  EXPECT_EQ(nfc("a\u0302\u0323"), "\u1ead");  // reordered, then composed twice
}

TEST(TokenizerComponents, Utf8Repair) {
  EXPECT_TRUE(is_valid_utf8("héllo 😀"));
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));
  EXPECT_EQ(to_valid_utf8("a\x80"
                          "b"),
            "a\uFFFD"
            "b");
  EXPECT_EQ(to_valid_utf8("\xf4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");  // above U+10FFFF
  EXPECT_EQ(to_valid_utf8("\xe2\x82x"), "\uFFFDx");
  // Streaming: a character split across pushes comes out whole, once complete.
  Utf8Repairer r;
  std::string out;
  r.push("\xe2", out);
  r.push("\x82", out);
  EXPECT_EQ(out, "");
  r.push("\xac!", out);
  EXPECT_EQ(out, "€!");
  r.push("\xf0\x9f", out);
  r.finish(out);
  EXPECT_EQ(out, "€!\uFFFD");
}

std::vector<std::pair<size_t, size_t>> matches(const Pattern& p, std::string_view s) {
  std::vector<std::pair<size_t, size_t>> m;
  p.for_each_match(s, [&](size_t a, size_t b) { m.emplace_back(a, b); });
  return m;
}

// Oniguruma's classes (measured against tokenizers): \s leaves out U+180E, \w takes in marks
// and circled letters but not ①, Ruby's \h is a hex digit. Empty matches follow Rust find_iter.
TEST(TokenizerComponents, OnigurumaCompatibleRegex) {
  const Pattern space = Pattern::regex("\\s+", "test");
  EXPECT_TRUE(matches(space, "a\u180eb").empty());
  EXPECT_EQ(matches(space, "a\u3000\u2028b").size(), 1u);
  const Pattern word = Pattern::regex("\\w+", "test");
  EXPECT_EQ(matches(word, "\u24b6e\u0301"), (std::vector<std::pair<size_t, size_t>>{{0, 6}}));
  EXPECT_TRUE(matches(word, "\u2460").empty());
  EXPECT_EQ(matches(Pattern::regex("\\h+", "test"), "xa0F9z"),
            (std::vector<std::pair<size_t, size_t>>{{1, 5}}));
  EXPECT_EQ(matches(Pattern::regex("a*", "test"), "baab"),
            (std::vector<std::pair<size_t, size_t>>{{0, 0}, {1, 3}, {4, 4}}));
  EXPECT_TRUE(matches(Pattern::regex("a*", "test"), "").empty());
  EXPECT_EQ(Pattern::literal("ab").replace_all("xabyab", "-"), "x-y-");
  EXPECT_EQ(Pattern::literal("").replace_all("abc", "-"), "-a-b-c-");  // as an empty regex
  EXPECT_THROW(Pattern::regex("(", "where"), ptllm::Error);
}

}  // namespace
