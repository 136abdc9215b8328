#pragma once
// What a generating command (sample now, chat next) shares: llama.cpp's prompt escapes, stop
// strings held back until they cannot begin a stop string, the stop reason, and Ctrl-C.
#include <signal.h>

#include <string>
#include <vector>

namespace ptllm::cli {

// llama.cpp's -e: \n \r \t \' \" \\ and \xHH become the characters; other escapes stay as written.
std::string process_escapes(const std::string& in);

// Holds back generated text that could be the start of a stop string, so what is printed never
// holds one and ends where the first stop string begins (llama.cpp's stop/antiprompt handling).
// Stop strings must not be empty.
class StopText {
 public:
  explicit StopText(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Appends a piece of generated text; returns the text now safe to print.
  std::string push(const std::string& piece);
  // What is held back, at the end of a generation that met no stop string.
  std::string finish();
  // The end of a generation: `rest` (the detokenizer's last text) pushed, then what is held back
  // unless a stop string was met; the text to print.
  std::string close(const std::string& rest);
  bool stopped() const { return stopped_; }
  const std::string& found() const { return found_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  std::string found_;
  bool stopped_ = false;
};

enum class StopReason { Eos, StopString, TokenLimit, ContextFull, Interrupted };
// "eos", "stop_string", "token_limit", "context_full", "interrupted" (the JSON values).
const char* stop_reason_key(StopReason r);
// What a footer says: "end of sequence (EOS)", "the token limit (--tokens 16)", ...
std::string stop_reason_text(StopReason r, const std::string& stop_string, int max_tokens, int ctx_size);

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
