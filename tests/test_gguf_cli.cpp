// Every command with a .gguf path where it takes a model directory, through the binary: quantize
// --format gguf writes it; sample, tokenize, eval, bench, chat read it (chat with the file's
// tokenizer.chat_template and the prompt cache keyed by the file).
#include <gtest/gtest.h>

#include <fstream>

#include "test_util.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string bin() { return test::binary(); }

struct GgufCli : ::testing::Test {
  test::TempDir tmp;
  fs::path dir = test::repo_model("kjv-tiny");

  fs::path quantize(const std::string& type, const fs::path& from) {
    const fs::path out = tmp.path / ("m-" + type + ".gguf");
    auto r = test::run_command(bin() + " quantize " + from.string() + " " + out.string() + " --format gguf --type " + type);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(has(r.err, "wrote " + out.string() + ": GGUF " + type)) << r.err;
    return out;
  }
};

TEST_F(GgufCli, SampleOfTheF32FileEqualsTheDirectorysAndQ8Runs) {
  const fs::path f32 = quantize("F32", dir), q8 = quantize("Q8_0", dir);
  const std::string args = " -p 'In the beginning God' -n 16 --temp 0 --threads 2 --json";
  auto a = test::run_command(bin() + " sample " + dir.string() + args);
  auto b = test::run_command(bin() + " sample " + f32.string() + args);
  auto c = test::run_command(bin() + " sample " + q8.string() + args);
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(json::parse(a.out)["tokens"], json::parse(b.out)["tokens"]);
  EXPECT_EQ(json::parse(c.out)["tokens"].size(), json::parse(a.out)["tokens"].size());
  EXPECT_TRUE(has(c.err, "model: " + q8.string() + " (llama, ")) << c.err;
}

// --type Q4_K_M: the summary counts each type (kjv-tiny's rows are too narrow for K blocks: Q5_0 and
// Q8_0, as llama-quantize falls back), and the file samples.
TEST_F(GgufCli, QuantizeQ4_K_MSaysWhichTypesItWrote) {
  const fs::path out = tmp.path / "k.gguf";
  auto r = test::run_command(bin() + " quantize " + dir.string() + " " + out.string() + " --format gguf --type Q4_K_M");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "GGUF Q4_K_M, 38 tensors (F32 9, Q5_0 24, Q8_0 5; 29 quantized, 28 in a fallback type")) << r.err;
  auto s = test::run_command(bin() + " sample " + out.string() + " -p 'In the beginning' -n 4 --temp 0 --threads 2");
  EXPECT_EQ(s.code, 0) << s.err;
}

TEST_F(GgufCli, TokenizeEvalAndBenchTakeTheFile) {
  const fs::path q8 = quantize("Q8_0", dir);
  const fs::path llama_cpp = test::repo_dir() / "tests/data/gguf/kjv-tiny-Q8_0.gguf";
  const std::string text = " --text 'In the beginning, caf\xc3\xa9 <s> 12345'";
  auto want = test::run_command(bin() + " tokenize " + dir.string() + text);
  ASSERT_EQ(want.code, 0) << want.err;
  for (const fs::path& f : {q8, llama_cpp}) {
    auto got = test::run_command(bin() + " tokenize " + f.string() + text);
    ASSERT_EQ(got.code, 0) << got.err;
    EXPECT_EQ(got.out, want.out) << f;
  }
  const fs::path txt = tmp.path / "t.txt";
  {
    std::ofstream out(txt);
    for (int i = 0; i < 4; ++i)
      out << "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
             "and darkness was upon the face of the deep.\n";
  }
  auto ev = test::run_command(bin() + " eval " + llama_cpp.string() + " --text " + txt.string() +
                              " --ppl-chunks 16 --max-chunks 2 --threads 2 --json");
  ASSERT_EQ(ev.code, 0) << ev.err;
  EXPECT_GT(json::parse(ev.out)["baseline"]["ppl"].get<double>(), 1.0);
  auto be = test::run_command(bin() + " bench " + q8.string() + " -p 8 -n 2 -r 1 --threads 2 --json");
  ASSERT_EQ(be.code, 0) << be.err;
}

TEST_F(GgufCli, ChatUsesTheFilesTemplateAndThePromptCacheKeysTheFile) {
  // A kjv-tiny with a chat template, written to GGUF.
  const fs::path m = tmp.path / "chat-model";
  fs::create_directories(m);
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"})
    fs::copy_file(dir / f, m / f);
  json cfg = test::read_json(dir / "tokenizer_config.json");
  cfg["chat_template"] = "{{ bos_token }}{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
                         "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}";
  std::ofstream(m / "tokenizer_config.json") << cfg.dump();
  const fs::path g = quantize("Q8_0", m);
  const fs::path conv = tmp.path / "conv.txt";
  // A turn of more than 50 tokens: its first whole block is taken by a later launch.
  std::ofstream(conv) << "In the beginning God created the heaven and the earth. And the earth was without form, and "
                         "void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face "
                         "of the waters.\n";
  const std::string args = " --threads 2 -f " + conv.string() + " --temperature 0 -n 4 --json --prompt-cache-dir " +
                           (tmp.path / "cache").string();
  auto cold = test::run_command(bin() + " chat " + g.string() + args);
  ASSERT_EQ(cold.code, 0) << cold.err;
  EXPECT_TRUE(has(cold.err, "tokenizer.chat_template")) << cold.err;
  auto hot = test::run_command(bin() + " chat " + g.string() + args);
  ASSERT_EQ(hot.code, 0) << hot.err;
  EXPECT_TRUE(has(hot.err, "restored from the prompt cache")) << hot.err;
  EXPECT_EQ(json::parse(hot.out)["tokens"], json::parse(cold.out)["tokens"]);
  bool blocks = false;
  for (const auto& e : fs::recursive_directory_iterator(tmp.path / "cache" / "blocks"))
    blocks = blocks || e.path().extension() == ".kvblock";
  EXPECT_TRUE(blocks);
  // The file rewritten (another type, same name): the cache is not reused.
  fs::remove(g);
  auto r = test::run_command(bin() + " quantize " + m.string() + " " + g.string() + " --format gguf --type Q4_0");
  ASSERT_EQ(r.code, 0) << r.err;
  auto other = test::run_command(bin() + " chat " + g.string() + args);
  ASSERT_EQ(other.code, 0) << other.err;
  EXPECT_FALSE(has(other.err, "restored from the prompt cache")) << other.err;

  // A file without a template: chat uses the built-in chatml and says so.
  const fs::path plain = quantize("Q4_0", dir);
  auto no = test::run_command(bin() + " chat " + plain.string() + " -f " + conv.string() + " -n 2");
  EXPECT_EQ(no.code, 0) << no.err;
  EXPECT_TRUE(has(no.err, "has no chat template; using the built-in chatml")) << no.err;
}

TEST_F(GgufCli, BadInputsAreClearErrors) {
  auto t = test::run_command(bin() + " quantize " + dir.string() + " " + (tmp.path / "x.gguf").string() + " --type Q4_K");
  EXPECT_EQ(t.code, 2) << t.err;
  EXPECT_TRUE(has(t.err, "--type")) << t.err;
  const fs::path junk = tmp.path / "junk.gguf";
  std::ofstream(junk) << "GGUF\x03";
  auto s = test::run_command(bin() + " sample " + junk.string() + " -p x -n 1");
  EXPECT_EQ(s.code, 1);
  EXPECT_TRUE(has(s.err, junk.string() + ": version")) << s.err;
  // A directory with config.json only: the writer names the missing tokenizer.json.
  auto bare = test::run_command(bin() + " quantize " + test::repo_dir().string() + "/tests/data/mistral-swa-tiny " +
                                (tmp.path / "y.gguf").string() + " --format gguf");
  EXPECT_EQ(bare.code, 1) << bare.err;
  EXPECT_TRUE(has(bare.err, "tokenizer.json: no such file")) << bare.err;
  EXPECT_FALSE(fs::exists(tmp.path / "y.gguf"));
}

}  // namespace
}  // namespace ptllm
