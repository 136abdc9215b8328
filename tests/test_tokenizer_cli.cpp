// posttrainllm tokenize, run as a user would: llama-tokenize's "id -> 'piece'" lines and --ids, JSON
// out, --jsonl batches, --decode, --no-special, and exit codes 2 for bad flags and 1 for runtime errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace {

struct CliResult {
  int code;
  std::string out;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

CliResult run(const std::vector<std::string>& args) {
  std::string cmd = quote(PTLLM_BINARY) + " tokenize";
  for (const auto& a : args) cmd += " " + quote(a);
  cmd += " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  CliResult r{-1, ""};
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

const std::string kModel = std::string(PTLLM_SOURCE_DIR) + "/models/kjv-tiny";

fs::path temp_file(const std::string& name, const std::string& content) {
  const fs::path p =
      fs::temp_directory_path() / ("ptllm_tokenize_cli_" + std::to_string(getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << content;
  return p;
}

TEST(TokenizerCli, EncodeText) {
  EXPECT_EQ(run({kModel, "-p", "Hello, world!", "--ids"}).out, "[0, 42, 443, 81, 14, 1412, 3]\n");
  EXPECT_EQ(run({kModel, "--prompt", "Hello, world!", "--ids"}).out, "[0, 42, 443, 81, 14, 1412, 3]\n");
  EXPECT_EQ(run({kModel, "--text", "Hello, world!", "--ids"}).out, "[0, 42, 443, 81, 14, 1412, 3]\n");
  EXPECT_EQ(run({kModel, "-p", "Hello, world!", "--json"}).out, "[0,42,443,81,14,1412,3]\n");
  EXPECT_EQ(run({kModel, "-p", "Hello, world!", "--ids", "--no-special"}).out, "[42, 443, 81, 14, 1412, 3]\n");
  EXPECT_EQ(run({kModel + "/tokenizer.json", "-p", "", "--ids"}).out, "[0]\n");
  // <s> in the text is the special token, unless --no-parse-special.
  EXPECT_EQ(run({kModel, "-p", "<s>", "--no-special", "--ids"}).out, "[0]\n");
  EXPECT_NE(run({kModel, "-p", "<s>", "--no-special", "--no-parse-special", "--ids"}).out, "[0]\n");
}

// The default output is llama-tokenize's: the id right-aligned in 6 columns, then the token's text.
constexpr const char* kPiecesHello =
    "     0 -> '<s>'\n"
    "    42 -> 'H'\n"
    "   443 -> 'ell'\n"
    "    81 -> 'o'\n"
    "    14 -> ','\n"
    "  1412 -> ' world'\n"
    "     3 -> '!'\n";

TEST(TokenizerCli, PiecesByDefault) {
  EXPECT_EQ(run({kModel, "-p", "Hello, world!"}).out, kPiecesHello);
  EXPECT_EQ(run({kModel, "-p", "Hello, world!", "--show-count"}).out,
            std::string(kPiecesHello) + "Total number of tokens: 7\n");
  EXPECT_EQ(run({kModel, "-p", "Hello, world!", "--ids", "--show-count"}).out,
            "[0, 42, 443, 81, 14, 1412, 3]\nTotal number of tokens: 7\n");
  EXPECT_EQ(run({kModel, "-p", "x", "--ids", "--json"}).code, 2);
  EXPECT_EQ(run({kModel, "--decode", "1", "--ids"}).code, 2);
}

TEST(TokenizerCli, EncodeFileAndJsonl) {
  const fs::path text = temp_file("text.txt", "Hello, world!");
  EXPECT_EQ(run({kModel, "-f", text.string(), "--ids"}).out, "[0, 42, 443, 81, 14, 1412, 3]\n");
  EXPECT_EQ(run({kModel, "--file", text.string(), "--ids"}).out, "[0, 42, 443, 81, 14, 1412, 3]\n");
  const fs::path lines = temp_file("lines.jsonl", "\"Hello, world!\"\n\"\"\n\" \"\n");
  const CliResult r = run({kModel, "--jsonl", lines.string()});
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "[0,42,443,81,14,1412,3]\n[0]\n[0,223]\n");
  const fs::path bad = temp_file("bad.jsonl", "\"ok\"\n{\"text\": 1}\n");
  EXPECT_EQ(run({kModel, "--jsonl", bad.string()}).code, 1);
  fs::remove(text);
  fs::remove(lines);
  fs::remove(bad);
}

TEST(TokenizerCli, Decode) {
  EXPECT_EQ(run({kModel, "--decode", "0 42 443 81 14 1412 3"}).out, "Hello, world!\n");
  EXPECT_EQ(run({kModel, "--decode", "[0, 42, 443, 81, 14, 1412, 3]", "--keep-special"}).out,
            "<s>Hello, world!\n");
  EXPECT_EQ(run({kModel, "--decode", "223", "--json"}).out, "\" \"\n");
}

TEST(TokenizerCli, ExitCodes) {
  EXPECT_EQ(run({kModel}).code, 2);                                   // no input given
  EXPECT_EQ(run({kModel, "--text", "a", "--decode", "1"}).code, 2);   // two inputs
  EXPECT_EQ(run({kModel, "--decode", "1 x"}).code, 2);                // not an id
  EXPECT_EQ(run({kModel, "--text", "a", "--keep-special"}).code, 2);  // a decoding flag
  EXPECT_EQ(run({kModel + "/missing", "--text", "a"}).code, 1);
  EXPECT_EQ(run({kModel, "--file", "/nonexistent/file"}).code, 1);
}

}  // namespace
