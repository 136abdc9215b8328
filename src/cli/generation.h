#pragma once
// What a generating command (sample now, chat next) shares: llama.cpp's prompt escapes, stop
// strings held back until they cannot begin a stop string, the stop reason, and Ctrl-C.
#include <signal.h>

#include <string>
#include <vector>

#include "engine/stop_text.h"

namespace ptllm::cli {

// llama.cpp's -e: \n \r \t \' \" \\ and \xHH become the characters; other escapes stay as written.
std::string process_escapes(const std::string& in);

// StopText (stop strings held back until they cannot begin one) lives in engine/ (the server uses it too).
using ptllm::StopText;

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
