#include "cli/generation.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <utility>

#include <CLI/CLI.hpp>

#include "cli/output.h"
#include "core/file_io.h"
#include "grammar/json_schema.h"

namespace ptllm::cli {

std::string process_escapes(const std::string& in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\' || i + 1 == in.size()) {
      out += in[i];
      continue;
    }
    const char c = in[++i];
    switch (c) {
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      default:
        if (c == 'x' && i + 2 < in.size() && std::isxdigit((unsigned char)in[i + 1]) &&
            std::isxdigit((unsigned char)in[i + 2])) {
          out += char(std::stoi(in.substr(i + 1, 2), nullptr, 16));
          i += 2;
        } else {
          out += '\\';
          out += c;  // unknown escapes stay as written
        }
    }
  }
  return out;
}


namespace {
volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_sigint(int) { g_interrupted = 1; }
}  // namespace

SigintGuard::SigintGuard() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGINT, &sa, &old_);
}

SigintGuard::~SigintGuard() {
  if (!g_interrupted) sigaction(SIGINT, &old_, nullptr);
}

bool interrupted() { return g_interrupted != 0; }

void clear_interrupted() { g_interrupted = 0; }


std::string stop_reason_text(StopReason r, const std::string& stop_string, int max_tokens, int ctx_size) {
  switch (r) {
    case StopReason::Eos: return "end of sequence (EOS)";
    case StopReason::StopString: return "the stop string " + nlohmann::json(stop_string).dump();
    case StopReason::TokenLimit: return "the token limit (--tokens " + std::to_string(max_tokens) + ")";
    case StopReason::ContextFull: return "the context is full (" + std::to_string(ctx_size) + " tokens, --ctx-size)";
    case StopReason::Grammar: return "the grammar is complete";
    case StopReason::Interrupted: return "interrupted (Ctrl-C)";
    case StopReason::OutputClosed: return "stdout was closed (nobody reads the output)";
    case StopReason::Cancelled: return "cancelled";
    case StopReason::Error: return "an error";
  }
  return "";
}

void TextStream::emit(const std::string& text) {
  out_.text += text;
  if (quiet_ || text.empty() || closed_) return;
  if (!write_stdout(text)) closed_ = true;
}

void TextStream::end(Generator& gen) {
  emit(gen.finish());
  out_.reason = gen.reason();
  out_.stop_string = gen.stop_string();
  out_.tokens = gen.tokens();
  out_.sampled = gen.sampled();
  if (!quiet_ && !closed_ && !write_stdout("\n")) closed_ = true;
}

void add_grammar_options(CLI::App& app, GrammarArgs& g) {
  CLI::Option* a = app.add_option("--grammar", g.grammar, "Constrain the output to a GBNF grammar (llama.cpp's syntax; root rule \"root\")");
  CLI::Option* b = app.add_option("--grammar-file", g.grammar_file, "Read the GBNF grammar from FILE");
  CLI::Option* c = app.add_option("--json-schema,-j", g.json_schema,
                                  "Constrain the output to JSON matching this JSON Schema (TEXT, or @FILE)");
  CLI::Option* d = app.add_option("--json-schema-file", g.json_schema_file, "Read the JSON Schema from FILE");
  a->excludes(b)->excludes(c)->excludes(d);
  b->excludes(c)->excludes(d);
  c->excludes(d);
}

namespace {

constexpr uint64_t kMaxGrammarBytes = uint64_t(16) << 20;

std::shared_ptr<const ConstraintSpec> spec_of(const std::string& gbnf, const std::string& where) {
  auto spec = std::make_shared<ConstraintSpec>();
  try {
    spec->grammar = compile_grammar(gbnf);
  } catch (const grammar::GrammarError& e) {
    throw UsageError(where + ": line " + std::to_string(e.line) + ", column " + std::to_string(e.column) + ": " +
                     e.message);
  }
  return spec;
}

}  // namespace

std::shared_ptr<const ConstraintSpec> grammar_constraint(const GrammarArgs& g) {
  if (!g.grammar.empty()) return spec_of(g.grammar, "--grammar");
  if (!g.grammar_file.empty())
    return spec_of(read_whole_file(g.grammar_file, kMaxGrammarBytes, "grammar"), "--grammar-file " + g.grammar_file);
  std::string flag = "--json-schema", text = g.json_schema;
  if (!g.json_schema_file.empty() || text.starts_with('@')) {
    const std::string path = g.json_schema_file.empty() ? text.substr(1) : g.json_schema_file;
    flag = (g.json_schema_file.empty() ? "--json-schema @" : "--json-schema-file ") + path;
    text = read_whole_file(path, kMaxGrammarBytes, "JSON Schema");
  }
  if (text.empty()) return nullptr;
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw UsageError(flag + ": not valid JSON (" + e.what() + ")");
  }
  try {
    return spec_of(grammar::json_schema_to_gbnf(schema), flag);
  } catch (const grammar::SchemaError& e) {
    throw UsageError(flag + ": " + e.what());
  }
}

}  // namespace ptllm::cli
