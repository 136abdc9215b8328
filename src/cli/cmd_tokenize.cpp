// posttrainllm tokenize: encode text to ids or decode ids to text with a model's tokenizer, for
// checking a tokenizer from the shell (llama.cpp's tokenize tool) and for data preparation.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/file_io.h"
#include "engine/runtime.h"
#include "tokenizer/tokenizer.h"

namespace ptllm::cli {

namespace {

struct TokenizeArgs {
  std::string path;
  std::string text, file, jsonl, decode;
  bool no_special = false;
  bool no_parse_special = false;
  bool keep_special = false;
  bool json = false;
  CLI::Option *text_opt = nullptr, *file_opt = nullptr, *jsonl_opt = nullptr, *decode_opt = nullptr;
};

void write_out(const std::string& s) { std::fwrite(s.data(), 1, s.size(), stdout); }

std::string ids_line(const std::vector<int32_t>& ids, bool as_json) {
  if (as_json) return nlohmann::json(ids).dump() + "\n";
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out + "\n";
}

// "-" is standard input.
std::string read_all(const std::string& path) {
  if (path == "-") {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  return read_whole_file(path, kMaxTextBytes, "an input file");
}

// "1 2 3", "1,2,3" or "[1, 2, 3]".
std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::string cur;
  auto take = [&] {
    if (cur.empty()) return;
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(cur, &used);
    } catch (const std::exception&) {
    }
    if (used != cur.size() || v < 0 || v > 0x7FFFFFFF)
      throw UsageError("--decode: '" + cur + "' is not a token id");
    ids.push_back(static_cast<int32_t>(v));
    cur.clear();
  };
  for (char c : s) {
    if (c == ' ' || c == ',' || c == '\t' || c == '\n' || c == '\r' || c == '[' || c == ']')
      take();
    else
      cur += c;
  }
  take();
  return ids;
}

int run_tokenize(const TokenizeArgs& a) {
  const int modes = (a.text_opt->count() > 0) + (a.file_opt->count() > 0) +
                    (a.jsonl_opt->count() > 0) + (a.decode_opt->count() > 0);
  if (modes != 1) throw UsageError("give exactly one of --text, --file, --jsonl, --decode");
  const bool decoding = a.decode_opt->count() > 0;
  if (decoding && (a.no_special || a.no_parse_special))
    throw UsageError("--no-special and --no-parse-special are for encoding, not --decode");
  if (!decoding && a.keep_special) throw UsageError("--keep-special goes with --decode");

  if (a.path.empty()) throw UsageError("give the model directory or tokenizer.json: tokenize PATH, or -m PATH");
  const Tokenizer tok = load_tokenizer(a.path);
  EncodeOptions opts;
  opts.add_special = !a.no_special;
  opts.parse_special = !a.no_parse_special;

  if (decoding) {
    const std::vector<int32_t> ids = parse_ids(a.decode);
    for (int32_t id : ids)
      if (id >= tok.vocab_size())
        std::fprintf(stderr, "warning: id %d is outside the vocabulary (%d), skipped\n", id,
                     tok.vocab_size());
    const std::string text = tok.decode(ids, !a.keep_special);
    write_out(a.json ? nlohmann::json(text).dump() + "\n" : text + "\n");
    return 0;
  }
  if (a.jsonl_opt->count()) {
    // One JSON string per line in, one JSON array of ids per line out.
    std::istringstream in(read_all(a.jsonl));
    std::string line, out;
    for (size_t n = 1; std::getline(in, line); ++n) {
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_string())
        throw Error(a.jsonl + ":" + std::to_string(n) + ": expected a JSON string");
      out += ids_line(tok.encode(j.get<std::string>(), opts), true);
      if (out.size() > (1 << 20)) write_out(std::exchange(out, {}));
    }
    write_out(out);
    return 0;
  }
  const std::string text = a.text_opt->count() ? a.text : read_all(a.file);
  write_out(ids_line(tok.encode(text, opts), a.json));
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& root) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* app = root.add_subcommand(
      "tokenize", "Encode text to token ids (or decode ids to text) with a model's tokenizer");
  add_model_option(*app, args->path, "model directory, tokenizer.json or .gguf file");
  args->text_opt = app->add_option("--text", args->text, "text to encode");
  args->file_opt =
      app->add_option("--file", args->file, "encode the contents of this file (- for stdin)");
  args->jsonl_opt = app->add_option(
      "--jsonl", args->jsonl,
      "encode many texts: each line of this file is a JSON string; prints one JSON array per line");
  args->decode_opt =
      app->add_option("--decode", args->decode, "print the text of these ids (\"1 2 3\")");
  app->add_flag("--no-special", args->no_special,
                "no special tokens from the post-processor (add_special_tokens=False)");
  app->add_flag("--no-parse-special", args->no_parse_special,
                "encode special tokens written in the text as plain text");
  app->add_flag("--keep-special", args->keep_special, "--decode: keep special tokens in the text");
  app->add_flag("--json", args->json, "print ids as a JSON array (a JSON string with --decode)");
  return {app, [args] { return run_tokenize(*args); }};
}

}  // namespace ptllm::cli
