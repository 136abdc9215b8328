#include "cli/chat_input.h"

#include <cctype>
#include <cstdio>

#include "core/error.h"

namespace ptllm::cli {

LineReader::Status StreamLineReader::read(std::string& line, const char* prompt) {
  if (prompt_ && prompt != nullptr) {
    std::fputs(prompt, stdout);
    std::fflush(stdout);
  }
  line.clear();
  std::streambuf* sb = in_.rdbuf();
  bool any = false;
  for (int c; (c = sb->sbumpc()) != std::char_traits<char>::eof();) {
    any = true;
    if (c == '\n') break;
    if (line.size() == max_bytes_) {
      line.clear();
      // A script's input may have no line end at all: only a person's line is skipped to its end.
      if (prompt_)
        while (c != '\n' && c != std::char_traits<char>::eof()) c = sb->sbumpc();
      return Status::TooLong;
    }
    line += char(c);
  }
  if (!any) {
    if (prompt_) std::fputc('\n', stdout);  // Ctrl-D: end the prompt's line
    return Status::End;
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return Status::Line;
}

const char* chat_commands_help() {
  return "commands:\n"
         "  /help        this list\n"
         "  /reset       start over (the system prompt is kept)\n"
         "  /clear       start over and clear the screen\n"
         "  /regen       drop the last reply and generate it again\n"
         "  /read FILE   send the text of FILE as the next message\n"
         "  /save FILE   write the conversation so far to FILE (JSON: the list of messages)\n"
         "  /paste       send the lines up to one that is \"\"\" or /end as one message (or start with \"\"\")\n"
         "  /exit        end the chat (or Ctrl-D)\n"
         "a line ending in \\ continues on the next line; a line starting with // sends the rest, from its second /\n";
}

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

ChatCommand command_named(const std::string& name) {
  static const struct {
    const char* name;
    ChatCommand command;
  } kCommands[] = {{"help", ChatCommand::Help},   {"reset", ChatCommand::Reset}, {"clear", ChatCommand::Clear},
                   {"regen", ChatCommand::Regen}, {"read", ChatCommand::Read},   {"save", ChatCommand::Save},
                   {"exit", ChatCommand::Exit}};
  for (const auto& c : kCommands)
    if (name == c.name) return c.command;
  return ChatCommand::Unknown;
}

ChatInput message(std::string text) {
  ChatInput m;
  m.kind = ChatInput::Kind::Message;
  m.text = std::move(text);
  return m;
}

bool opens_paste(const std::string& s) { return s == "\"\"\"" || s == "/paste"; }
bool closes_paste(const std::string& s) { return s == "\"\"\"" || s == "/end"; }

}  // namespace

bool TurnReader::line(std::string& s, const char* prompt) {
  ++line_no_;
  switch (lines_.read(s, prompt)) {
    case LineReader::Status::End:
      return false;
    case LineReader::Status::TooLong:
      if (!interactive_) too_long();
      over_ = true;
      s.clear();
      return true;
    case LineReader::Status::Line:
      return true;
  }
  return false;
}

void TurnReader::too_long() {
  const std::string what = name_ + ":" + std::to_string(line_no_) + ": a turn longer than --max-turn-bytes " +
                           std::to_string(max_bytes_);
  if (!interactive_) throw Error(what + " (give each turn on a line of its own, or raise the limit)");
  std::fprintf(stderr, "error: %s (the message was dropped)\n", what.c_str());
}

void TurnReader::append(std::string& turn, const std::string& piece) {
  if (over_ || turn.size() + piece.size() > max_bytes_) {
    if (!over_ && !interactive_) too_long();
    over_ = true;
    return;
  }
  turn += piece;
}

ChatInput TurnReader::next() {
  for (;;) {
    over_ = false;
    std::string first;
    if (!line(first, "> ")) return {};
    if (!over_ && !first.empty()) lines_.remember(first);
    std::string turn;
    if (!over_ && opens_paste(trim(first))) {
      // A block: every line as it is, commands and backslashes included. The end of the input ends it too.
      bool any = false;
      for (std::string s; line(s, "");) {
        if (closes_paste(trim(s))) break;
        if (any) append(turn, "\n");
        append(turn, s);
        any = true;
      }
      if (over_) {
        too_long();
        continue;
      }
      if (turn.empty()) continue;
      return message(std::move(turn));
    }
    turn = first;
    for (std::string s = first; !s.empty() && s.back() == '\\';) {
      if (!over_) turn.back() = '\n';
      if (!line(s, "... ")) break;
      if (!over_ && !s.empty()) lines_.remember(s);
      append(turn, s);
    }
    if (over_) {
      too_long();
      continue;
    }
    if (turn.empty()) continue;
    if (turn.starts_with("//")) return message(turn.substr(1));
    if (turn.size() > 1 && turn[0] == '/' && std::isalpha(static_cast<unsigned char>(turn[1]))) {
      const size_t end = turn.find_first_of(" \t\n");
      ChatInput c;
      c.kind = ChatInput::Kind::Command;
      c.text = end == std::string::npos ? "" : trim(turn.substr(end));
      c.word = turn.substr(0, end);
      c.command = command_named(c.word.substr(1));
      return c;
    }
    return message(std::move(turn));
  }
}

}  // namespace ptllm::cli
