#pragma once
// What a generating command (sample now, chat next) shares: llama.cpp's prompt escapes, stop
// strings held back until they cannot begin a stop string, the stop reason, and Ctrl-C.
#include <signal.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/constraint.h"
#include "engine/generator.h"
#include "engine/stop_text.h"
#include "tokenizer/tokenizer.h"

namespace CLI {
class App;
}

namespace ptllm::cli {

// llama.cpp's -e: \n \r \t \' \" \\ and \xHH become the characters; other escapes stay as written.
std::string process_escapes(const std::string& in);

// StopText (stop strings held back until they cannot begin one) lives in engine/ (the server uses it too).
using ptllm::StopText;

// The stop reason and its JSON values are the generator's (engine/generator.h; output_closed: stdout
// was closed by its reader, `| head -c 100`).
using ptllm::StopReason;
using ptllm::stop_reason_key;
// What a footer says: "end of sequence (EOS)", "the token limit (--tokens 16)", ...
std::string stop_reason_text(StopReason r, const std::string& stop_string, int max_tokens, int ctx_size);

// llama.cpp's flags for constrained sampling: --grammar TEXT, --grammar-file F, --json-schema
// TEXT|@FILE (-j), --json-schema-file F; at most one of them.
struct GrammarArgs {
  std::string grammar, grammar_file, json_schema, json_schema_file;
};
void add_grammar_options(CLI::App& app, GrammarArgs& g);
// The constraint they ask for, or null. Throws UsageError naming the flag (and the file, line and
// column of a grammar's mistake, or the JSON Schema keyword that cannot be honoured).
std::shared_ptr<const ConstraintSpec> grammar_constraint(const GrammarArgs& g);

// What the decode loop of sample and chat produced.
struct GeneratedText {
  std::vector<int32_t> tokens;  // the ids of the text, fed to the session (a stopping EOS not included)
  std::string text;             // what was printed: special tokens left out, cut at a stop string
  int sampled = 0;              // ids sampled, a stopping EOS included
  StopReason reason = StopReason::TokenLimit;
  std::string stop_string;
  double ttft_ms = 0;
  double decode_ms = 0;
};

// A generation's text as it streams: kept in out.text and, unless quiet (--json), written to stdout
// at once. closed(): nobody reads stdout any more (EPIPE; SIGPIPE is ignored, main.cpp); any other
// failed write throws OutputError (cli/output.h).
class TextStream {
 public:
  TextStream(GeneratedText& out, bool quiet) : out_(out), quiet_(quiet) {}
  void emit(const std::string& text);
  bool closed() const { return closed_; }
  // The end of the generation: the generator's held-back text, its ids, count and stop reason into
  // out, and the line ended on a terminal.
  void end(Generator& gen);

 private:
  GeneratedText& out_;
  bool quiet_;
  bool closed_ = false;
};

// While alive, the first Ctrl-C sets interrupted() instead of ending the process (the caller stops
// the generation and prints its footer); SA_RESETHAND restores the default action, so a second
// Ctrl-C ends the process.
class SigintGuard {
 public:
  SigintGuard();
  ~SigintGuard();
  SigintGuard(const SigintGuard&) = delete;
  SigintGuard& operator=(const SigintGuard&) = delete;

 private:
  struct sigaction old_ {};
};
bool interrupted();
// Forgets a Ctrl-C once handled (chat: it stopped one reply; the next reply arms a new guard).
void clear_interrupted();

}  // namespace ptllm::cli
