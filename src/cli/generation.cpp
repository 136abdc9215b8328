#include "cli/generation.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <utility>

#include "cli/output.h"

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

}  // namespace ptllm::cli
