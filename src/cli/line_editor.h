#pragma once
// Line editing and history on a terminal, through libedit's readline API when the build found
// libedit (pkg-config libedit); without it, chat reads a terminal as plain lines.
#include <memory>
#include <string>

#include "cli/chat_input.h"

namespace ptllm::cli {

// Whether this build has line editing.
bool line_editor_available();

// A LineReader over the terminal on standard input, with history: `history_file` (empty: none kept
// between runs) is read at start and rewritten after each line, its last kMaxHistory lines kept.
// Lines longer than max_bytes read as TooLong. Null when the build has no line editing.
std::unique_ptr<LineReader> make_line_editor(const std::string& history_file, size_t max_bytes);

inline constexpr int kMaxHistory = 1000;

}  // namespace ptllm::cli
