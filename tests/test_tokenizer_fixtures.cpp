// Hand-made tokenizer.json fixtures (tests/data/tokenizers) for what the reference models do not
// use: SentencePiece-style normalizer and decoder, byte fallback, unk fusing, Metaspace, added
// tokens with lstrip/rstrip/single_word/normalized, ignore_merges, the Llama 3 and Qwen2 Split
// regexes, Digits, NFC. cases.json holds what Hugging Face tokenizers gives for each; the tests
// below spell out the main behaviours by hand as well. Then loading errors and
// tokenizer_config.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using ptllm::EncodeOptions;
using ptllm::Tokenizer;
using Ids = std::vector<int32_t>;

namespace {

const fs::path kData = fs::path(PTLLM_SOURCE_DIR) / "tests" / "data" / "tokenizers";

Tokenizer fixture(const std::string& name) { return Tokenizer::load(kData / (name + ".json")); }

int32_t id(const Tokenizer& tok, const std::string& token) {
  auto v = tok.token_to_id(token);
  EXPECT_TRUE(v.has_value()) << "no token " << token;
  return v.value_or(-1);
}

// A scratch directory of this test's own (tests run in parallel processes, maybe of several
// build directories).
fs::path scratch() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::temp_directory_path() / ("ptllm_tokenizer_" + std::string(info->name()) +
                                                    "_" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

std::string stream_decode(const Tokenizer& tok, const Ids& ids) {
  ptllm::StreamingDetokenizer detok(tok);
  std::string out;
  for (int32_t i : ids) out += detok.push(i);
  return out + detok.finish();
}

TEST(TokenizerFixtures, MatchHuggingFaceTokenizers) {
  std::ifstream in(kData / "cases.json");
  const auto doc = nlohmann::json::parse(in);
  std::map<std::string, Tokenizer> loaded;
  size_t n = 0;
  for (const auto& c : doc["cases"]) {
    const std::string name = c["tokenizer"];
    auto it = loaded.find(name);
    if (it == loaded.end()) it = loaded.emplace(name, Tokenizer::load(kData / name)).first;
    const Tokenizer& tok = it->second;
    const std::string text = c["text"];
    const Ids ids = c["ids"];
    EXPECT_EQ(tok.encode(text), ids) << name << ": " << text;
    EXPECT_EQ(tok.encode(text, {.add_special = false}), c["ids_no_special"].get<Ids>())
        << name << ": " << text;
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << name << ": " << text;
    EXPECT_EQ(stream_decode(tok, ids), c["decoded"].get<std::string>()) << name << ": " << text;
    ++n;
  }
  EXPECT_EQ(loaded.size(), 7u);
  EXPECT_GE(n, 80u);
}

// Llama 2: Prepend ▁ + spaces to ▁, no pre-tokenizer, byte fallback, BOS template.
TEST(TokenizerFixtures, SentencePieceNormalizerAndByteFallback) {
  const Tokenizer tok = fixture("sentencepiece_bpe");
  const int32_t bos = id(tok, "<s>");
  EXPECT_EQ(tok.encode("hello world"), (Ids{bos, id(tok, "▁hello"), id(tok, "▁world")}));
  // ü is not in the vocab: its two UTF-8 bytes become byte tokens.
  EXPECT_EQ(tok.encode("ü", {.add_special = false}),
            (Ids{id(tok, "▁"), id(tok, "<0xC3>"), id(tok, "<0xBC>")}));
  // The normalizer runs on each piece between special tokens, so the text after <s> gets its
  // own ▁ (tokenizers' "legacy" behaviour).
  EXPECT_EQ(tok.encode("hello <s> world", {.add_special = false}),
            (Ids{id(tok, "▁hello"), id(tok, "▁"), bos, id(tok, "▁"), id(tok, "▁world")}));
  // Decoding: ▁ back to space, byte runs to text, and only the very first space stripped.
  EXPECT_EQ(tok.decode(tok.encode("  über 東京")), "  über 東京");
  EXPECT_EQ(tok.decode(Ids{id(tok, "<0xE6>"), id(tok, "<0x9D>")}), "\uFFFD\uFFFD");  // cut-off 東
}

// SentencePiece models converted with legacy=False (Mistral v0.3): Metaspace with
// prepend_scheme "first", a ▁ only at the start of the input.
TEST(TokenizerFixtures, MetaspacePrependFirst) {
  const Tokenizer tok = fixture("metaspace_first");
  EXPECT_EQ(tok.encode("hello world", {.add_special = false}),
            (Ids{id(tok, "▁hello"), id(tok, "▁world")}));
  // After a special token at the start, the text does not begin the input: no ▁.
  EXPECT_EQ(tok.encode("[INST]hello", {.add_special = false}),
            (Ids{id(tok, "[INST]"), id(tok, "h"), id(tok, "el"), id(tok, "lo")}));
}

// Metaspace pre-tokenizer and decoder; no byte fallback, so unknown characters become <unk>,
// and a run of them one <unk> (fuse_unk). The template adds BOS and EOS.
TEST(TokenizerFixtures, MetaspaceUnknownFused) {
  const Tokenizer tok = fixture("metaspace_unk");
  const int32_t unk = id(tok, "<unk>");
  EXPECT_EQ(tok.encode("üü hello"),
            (Ids{id(tok, "<s>"), id(tok, "▁"), unk, id(tok, "▁hello"), id(tok, "</s>")}));
  EXPECT_EQ(tok.encode("ab", {.add_special = false}),
            (Ids{id(tok, "▁"), id(tok, "a"), id(tok, "b")}));
  // The Metaspace decoder drops the ▁ of the first token only.
  EXPECT_EQ(tok.decode(Ids{id(tok, "▁hello"), id(tok, "▁world")}), "hello world");
}

// ignore_merges: a word that is in the vocab is one token even if the merges never build it.
TEST(TokenizerFixtures, IgnoreMerges) {
  const Tokenizer llama3 = fixture("llama3_style");  // ignore_merges: true
  const Tokenizer smollm = fixture("smollm_style");  // same merges, ignore_merges: false
  EXPECT_EQ(llama3.encode("abc", {.add_special = false}), (Ids{id(llama3, "abc")}));
  EXPECT_EQ(smollm.encode("abc"), (Ids{id(smollm, "a"), id(smollm, "bc")}));
}

// Llama 3: the Split regex groups digits by three; the BOS comes from a TemplateProcessing
// inside a post-processor Sequence.
TEST(TokenizerFixtures, Llama3SplitRegex) {
  const Tokenizer tok = fixture("llama3_style");
  const int32_t bos = id(tok, "<|begin_of_text|>");
  EXPECT_EQ(tok.encode("12345"), (Ids{bos, id(tok, "123"), id(tok, "4"), id(tok, "5")}));
  EXPECT_EQ(tok.encode(""), (Ids{bos}));
  EXPECT_EQ(tok.encode("hi<|eot_id|>", {.add_special = false}),
            (Ids{id(tok, "h"), id(tok, "i"), id(tok, "<|eot_id|>")}));
}

// SmolLM2: Digits(individual) before the ByteLevel regex.
TEST(TokenizerFixtures, DigitsSplitOneByOne) {
  const Tokenizer tok = fixture("smollm_style");
  EXPECT_EQ(tok.encode("123"), (Ids{id(tok, "1"), id(tok, "2"), id(tok, "3")}));
}

// Qwen2: NFC first, so a decomposed é encodes like the precomposed one.
TEST(TokenizerFixtures, NfcNormalizer) {
  const Tokenizer tok = fixture("qwen_style");
  EXPECT_EQ(tok.encode("he\u0301llo"), tok.encode("h\u00e9llo"));
  EXPECT_EQ(tok.decode(tok.encode("A\u030a")), "\u00c5");
}

TEST(TokenizerFixtures, AddedTokenOptions) {
  const Tokenizer tok = fixture("added_tokens");
  const int32_t mask = id(tok, "<mask>"), w = id(tok, "[w]");
  const int32_t sp = id(tok, "Ġ");
  // lstrip/rstrip: <mask> takes the spaces around it. ByteLevel's add_prefix_space then gives
  // "a" and "b" a leading space each, as pieces of their own.
  EXPECT_EQ(tok.encode("a  <mask>  b"), (Ids{id(tok, "Ġa"), mask, sp, id(tok, "b")}));
  // single_word: matched only between non-word characters.
  EXPECT_EQ(tok.encode("x [w] y"), (Ids{sp, id(tok, "x"), sp, w, sp, id(tok, "y")}));
  const Ids glued = tok.encode("x[w]y");
  EXPECT_EQ(std::count(glued.begin(), glued.end(), w), 0);
  // normalized=true tokens are looked for in the normalized text (the normalizer maps X to x);
  // normalized=false ones in the raw text.
  EXPECT_EQ(tok.encode("boX"), (Ids{id(tok, "box")}));
  EXPECT_EQ(tok.encode("MiX"), (Ids{id(tok, "MiX")}));
  // Leftmost-longest: "<|sp|>x" (not special) wins over "<|sp|>" (special).
  EXPECT_EQ(tok.encode("<|sp|>x"), (Ids{id(tok, "<|sp|>x")}));
}

TEST(TokenizerFixtures, ParseSpecialOff) {
  const Tokenizer tok = fixture("added_tokens");
  const int32_t special = id(tok, "<|sp|>");
  EXPECT_EQ(tok.encode("<|sp|> a"), (Ids{special, id(tok, "Ġa")}));
  const Ids plain = tok.encode("<|sp|> a", {.parse_special = false});
  EXPECT_EQ(std::count(plain.begin(), plain.end(), special), 0);
  EXPECT_EQ(tok.decode(plain), " <|sp|> a");
  // Tokens that are not special are still matched, as tokenizers does.
  EXPECT_EQ(tok.encode("[w]", {.parse_special = false}), (Ids{id(tok, "[w]")}));
}

TEST(TokenizerFixtures, VocabularyQueries) {
  const Tokenizer tok = fixture("added_tokens");
  const int32_t last = id(tok, "<|sp|>x");
  EXPECT_EQ(tok.vocab_size(), last + 1);  // the added tokens lie past the model's vocab
  EXPECT_TRUE(tok.is_special(id(tok, "<mask>")));
  EXPECT_FALSE(tok.is_special(id(tok, "[w]")));
  EXPECT_EQ(tok.id_to_token(id(tok, "Ġa")), "Ġa");
  EXPECT_FALSE(tok.id_to_token(tok.vocab_size()).has_value());
  EXPECT_FALSE(tok.bos_id().has_value());  // no tokenizer_config.json
  // decode skips ids outside the vocabulary, as tokenizers does.
  EXPECT_EQ(tok.decode(Ids{id(tok, "Ġa"), tok.vocab_size() + 5}), " a");
  EXPECT_EQ(tok.decode(Ids{id(tok, "<mask>"), id(tok, "Ġa")}, /*skip_special=*/false), "<mask> a");
}

// transformers rebuilds the post-processor as "[bos] $A [eos]" when tokenizer_config.json says
// add_bos_token or add_eos_token; bos_token may be a string or an AddedToken object.
TEST(TokenizerFixtures, ConfigAddBosAndEos) {
  const fs::path dir = scratch();
  fs::copy_file(kData / "smollm_style.json", dir / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  write(dir / "tokenizer_config.json",
        R"({"add_bos_token": true, "add_eos_token": true,
            "bos_token": {"content": "<|im_start|>", "special": true}, "eos_token": "<|endoftext|>"})");
  const Tokenizer tok = Tokenizer::load(dir);
  const int32_t bos = id(tok, "<|im_start|>"), eos = id(tok, "<|endoftext|>");
  EXPECT_EQ(tok.bos_id(), bos);
  EXPECT_EQ(tok.eos_id(), eos);
  EXPECT_EQ(tok.encode("abc"), (Ids{bos, id(tok, "a"), id(tok, "bc"), eos}));
  EXPECT_EQ(tok.encode("abc", {.add_special = false}), (Ids{id(tok, "a"), id(tok, "bc")}));
  // Reading the directory or its tokenizer.json is the same; the config is part of the fingerprint.
  EXPECT_EQ(Tokenizer::load(dir / "tokenizer.json").encode("abc"), tok.encode("abc"));
  const std::string before = tok.fingerprint();
  write(dir / "tokenizer_config.json", R"({"add_bos_token": false})");
  const Tokenizer plain = Tokenizer::load(dir);
  EXPECT_EQ(plain.encode("abc"), (Ids{id(tok, "a"), id(tok, "bc")}));
  EXPECT_NE(plain.fingerprint(), before);
  fs::remove_all(dir);
}

// Invalid UTF-8 is replaced by U+FFFD per maximal invalid subsequence before encoding.
TEST(TokenizerFixtures, InvalidUtf8Input) {
  const Tokenizer tok = Tokenizer::load(fs::path(PTLLM_SOURCE_DIR) / "models" / "kjv-tiny");
  const std::pair<std::string, std::string> cases[] = {
      {"a\xff"
       "b",
       "a\uFFFD"
       "b"},
      {"\xe2\x82", "\uFFFD"},                  // cut-off €: one replacement
      {"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"},  // a surrogate: three
      {"\xc0\xaf!", "\uFFFD\uFFFD!"},          // overlong
      {"x\xf0\x9f\x98", "x\uFFFD"},
  };
  for (const auto& [bad, fixed] : cases) {
    EXPECT_EQ(tok.encode(bad), tok.encode(fixed));
    EXPECT_EQ(tok.decode(tok.encode(bad)), fixed);
  }
}

// ---- loading errors: the file, the field and the unsupported type are named ----

nlohmann::json minimal() {
  return nlohmann::json::parse(R"({
    "version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null,
    "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
}

void expect_load_error(const nlohmann::json& j, const std::vector<std::string>& needles) {
  const fs::path p = scratch() / "tokenizer.json";
  write(p, j.dump());
  try {
    Tokenizer::load(p);
    ADD_FAILURE() << "loaded: " << j.dump();
  } catch (const ptllm::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
  fs::remove_all(p.parent_path());
}

TEST(TokenizerFixtures, MinimalLoads) {
  const fs::path p = scratch() / "tokenizer.json";
  write(p, minimal().dump());
  const Tokenizer tok = Tokenizer::load(p);
  EXPECT_EQ(tok.encode("ab"), (Ids{2}));
  EXPECT_EQ(tok.decode(Ids{0, 1}),
            "a b");  // no decoder: tokens joined with spaces, as tokenizers does
  fs::remove_all(p.parent_path());
}

TEST(TokenizerFixtures, UnsupportedComponentsAreNamed) {
  auto j = minimal();
  j["model"]["type"] = "WordPiece";
  expect_load_error(j, {"model", "unsupported model type 'WordPiece'"});
  j = minimal();
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_load_error(j, {"normalizer", "'Lowercase'"});
  j = minimal();
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Whitespace"}}}}};
  expect_load_error(j, {"pre_tokenizer.pretokenizers[0]", "'Whitespace'"});
  j = minimal();
  j["post_processor"] = {{"type", "RobertaProcessing"}};
  expect_load_error(j, {"post_processor", "'RobertaProcessing'"});
  j = minimal();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_load_error(j, {"decoder", "'WordPiece'"});
  j = minimal();
  j["model"]["dropout"] = 0.1;
  expect_load_error(j, {"model.dropout", "dropout"});
}

TEST(TokenizerFixtures, MalformedFilesAreNamed) {
  auto j = minimal();
  j["model"]["merges"] = {"a c"};
  expect_load_error(j, {"model.merges[0]", "'c' is not in the vocab"});
  j = minimal();
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "(unclosed"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  expect_load_error(j, {"pre_tokenizer.pattern", "regex does not compile"});
  j = minimal();
  j["model"].erase("vocab");
  expect_load_error(j, {"model.vocab", "missing"});
  j = minimal();
  j["model"]["vocab"]["b"] = 2000000000;  // would size the id table for two billion entries
  expect_load_error(j, {"model.vocab.b", "expected a token id"});

  const fs::path dir = scratch();
  write(dir / "tokenizer.json", "{\"model\": ");
  EXPECT_THROW(
      {
        try {
          Tokenizer::load(dir);
        } catch (const ptllm::Error& e) {
          EXPECT_NE(std::string(e.what()).find("bad JSON"), std::string::npos) << e.what();
          throw;
        }
      },
      ptllm::Error);
  fs::remove_all(dir);
  try {
    Tokenizer::load(dir / "nowhere");
    ADD_FAILURE();
  } catch (const ptllm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nowhere"), std::string::npos) << e.what();
  }
}

}  // namespace
