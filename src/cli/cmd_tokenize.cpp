// posttrainllm tokenize: encode text to ids or decode ids to text with a model's tokenizer, for
// checking a tokenizer from the shell (llama.cpp's llama-tokenize: the same flags and output) and for
// data preparation.
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
#include "cli/output.h"
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
  bool ids = false;
  bool show_count = false;
  CLI::Option *text_opt = nullptr, *file_opt = nullptr, *jsonl_opt = nullptr, *decode_opt = nullptr;
};

// False when nobody reads stdout any more (| head); a failed write throws OutputError.
bool write_out(const std::string& s) { return write_stdout(s); }

// As llama-tokenize prints them: "[1, 2, 3]" with --ids, else one "    42 -> 'piece'" line per token
// (the piece is the token's text decoded alone; a byte of an unfinished UTF-8 character shows as U+FFFD).
std::string ids_text(const Tokenizer& tok, const std::vector<int32_t>& ids, const TokenizeArgs& a) {
  if (a.json) return nlohmann::json(ids).dump() + "\n";
  std::string out;
  if (a.ids) {
    out = "[";
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
    out += "]\n";
  } else {
    char num[32];
    for (const int32_t id : ids) {
      std::snprintf(num, sizeof num, "%6d -> '", id);
      out += num + tok.decode(std::span(&id, 1), /*skip_special=*/false) + "'\n";
    }
  }
  if (a.show_count) out += "Total number of tokens: " + std::to_string(ids.size()) + "\n";
  return out;
}

// "-" is standard input.
std::string read_all(const std::string& path) {
  if (path == "-") return read_standard_input(kMaxTextBytes, "an input");
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
  if (modes != 1) throw UsageError("give exactly one of -p/--prompt TEXT, -f/--file FILE, --jsonl FILE, --decode IDS");
  const bool decoding = a.decode_opt->count() > 0;
  if (decoding && (a.no_special || a.no_parse_special || a.ids || a.show_count))
    throw UsageError("--no-special, --no-parse-special, --ids and --show-count are for encoding, not --decode");
  if (a.jsonl_opt->count() && (a.ids || a.show_count))
    throw UsageError("--jsonl prints a JSON array per line; --ids and --show-count go with -p or -f");
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
      out += nlohmann::json(tok.encode(j.get<std::string>(), opts)).dump() + "\n";
      if (out.size() > (1 << 20) && !write_out(std::exchange(out, {}))) return 0;
    }
    write_out(out);
    return 0;
  }
  const std::string text = a.text_opt->count() ? a.text : read_all(a.file);
  write_out(ids_text(tok, tok.encode(text, opts), a));
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& root) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* app = root.add_subcommand(
      "tokenize", "Encode text to token ids (or decode ids to text) with a model's tokenizer");
  add_model_option(*app, args->path, "model directory, tokenizer.json or .gguf file");
  args->text_opt = app->add_option("--prompt,-p,--text", args->text, "text to encode");
  args->file_opt =
      app->add_option("--file,-f", args->file, "encode the contents of this file (- for stdin)");
  args->jsonl_opt = app->add_option(
      "--jsonl", args->jsonl,
      "encode many texts: each line of this file is a JSON string; prints one JSON array per line");
  args->decode_opt =
      app->add_option("--decode", args->decode, "print the text of these ids (\"1 2 3\" or \"[1, 2, 3]\")");
  app->add_flag("--no-special", args->no_special,
                "no special tokens from the post-processor (add_special_tokens=False)");
  app->add_flag("--no-parse-special", args->no_parse_special,
                "encode special tokens written in the text as plain text");
  app->add_flag("--keep-special", args->keep_special, "--decode: keep special tokens in the text");
  auto* ids = app->add_flag("--ids", args->ids,
                            "print only the ids, as llama-tokenize --ids: [1, 2, 3] (default: one 'id -> piece' line "
                            "per token)");
  app->add_flag("--json", args->json, "print ids as a compact JSON array (a JSON string with --decode)")->excludes(ids);
  app->add_flag("--show-count", args->show_count, "end with the number of tokens (llama-tokenize's flag)");
  return {app, [args] { return run_tokenize(*args); }};
}

}  // namespace ptllm::cli
