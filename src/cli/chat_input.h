#pragma once
// The input side of `posttrainllm chat`: lines from a stream or a line editor, joined into turns
// (a trailing backslash continues a line; /paste or """ reads a block) and split into messages and
// commands. Nothing here knows the model; cmd_chat.cpp carries the commands out.
#include <cstddef>
#include <istream>
#include <string>
#include <utility>

namespace ptllm::cli {

// One physical line at a time, from wherever the turns come from.
class LineReader {
 public:
  enum class Status { Line, TooLong, End };
  virtual ~LineReader() = default;
  // The next line, without its line ending, into `line`. TooLong: the line is over max_bytes (what
  // was read of it is dropped; the rest is skipped only where skipping ends, on a terminal).
  virtual Status read(std::string& line, const char* prompt) = 0;
  // A line the user typed, for the history (line editors only).
  virtual void remember(const std::string& line) {}
};

// A std::istream read in pieces, never holding more than max_bytes of a line (`chat < /dev/zero` has
// no line end). With a prompt (a terminal without a line editor) the prompt goes to stdout and the
// rest of a long line is skipped.
class StreamLineReader : public LineReader {
 public:
  StreamLineReader(std::istream& in, size_t max_bytes, bool prompt) : in_(in), max_bytes_(max_bytes), prompt_(prompt) {}
  Status read(std::string& line, const char* prompt) override;

 private:
  std::istream& in_;
  size_t max_bytes_;
  bool prompt_;
};

enum class ChatCommand { Help, Reset, Clear, Regen, Read, Save, Exit, Unknown };

struct ChatInput {
  enum class Kind { End, Message, Command };
  Kind kind = Kind::End;
  std::string text;  // Message: the user's turn. Command: the argument (the rest of the line, trimmed)
  ChatCommand command = ChatCommand::Unknown;
  std::string word;  // Command: as typed, "/help"
};

// The help text of the commands, one per line.
const char* chat_commands_help();

// Turns from a LineReader. A turn longer than max_bytes throws ptllm::Error naming `name` and the
// line (scripts); when `interactive` it is reported on stderr and dropped instead.
class TurnReader {
 public:
  TurnReader(LineReader& lines, size_t max_bytes, std::string name, bool interactive)
      : lines_(lines), max_bytes_(max_bytes), name_(std::move(name)), interactive_(interactive) {}
  ChatInput next();

 private:
  // One line; false at the end. A line over the limit sets `over_` and reads as empty.
  bool line(std::string& s, const char* prompt);
  void too_long();
  // Appends `piece` to `turn` unless that passes the limit (then `over_`).
  void append(std::string& turn, const std::string& piece);

  LineReader& lines_;
  size_t max_bytes_;
  std::string name_;
  bool interactive_;
  size_t line_no_ = 0;
  bool over_ = false;
};

}  // namespace ptllm::cli
