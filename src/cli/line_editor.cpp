#include "cli/line_editor.h"

#ifdef PTLLM_HAVE_LIBEDIT
#include <editline/readline.h>
#include <sys/stat.h>
#include <unistd.h>

#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#endif

namespace ptllm::cli {

#ifdef PTLLM_HAVE_LIBEDIT

namespace {

// libedit edits multibyte text only under a UTF-8 LC_CTYPE; the rest of the program keeps the C
// locale (the tokenizer's byte classes must not depend on the user's locale).
class CtypeFromEnvironment {
 public:
  CtypeFromEnvironment() {
    if (const char* cur = std::setlocale(LC_CTYPE, nullptr)) saved_ = cur;
    std::setlocale(LC_CTYPE, "");
  }
  ~CtypeFromEnvironment() { std::setlocale(LC_CTYPE, saved_.c_str()); }

 private:
  std::string saved_ = "C";
};

class EditLineReader : public LineReader {
 public:
  EditLineReader(std::string history_file, size_t max_bytes) : history_(std::move(history_file)), max_bytes_(max_bytes) {
    // The prompt and the echo go where a person sees them: stdout, or stderr when stdout is redirected.
    rl_outstream = isatty(STDOUT_FILENO) ? stdout : stderr;
    CtypeFromEnvironment ctype;
    rl_initialize();
    using_history();
    stifle_history(kMaxHistory);
    if (!history_.empty()) read_history(history_.c_str());  // a missing file is an empty history
  }

  Status read(std::string& line, const char* prompt) override {
    char* s = nullptr;
    {
      CtypeFromEnvironment ctype;
      s = readline(prompt == nullptr ? "" : prompt);
    }
    line.clear();
    if (s == nullptr) {
      std::fputc('\n', rl_outstream);  // Ctrl-D: end the prompt's line
      std::fflush(rl_outstream);
      return Status::End;
    }
    const size_t n = std::strlen(s);
    if (n <= max_bytes_) line.assign(s, n);
    std::free(s);
    if (n > max_bytes_) return Status::TooLong;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return Status::Line;
  }

  void remember(const std::string& line) override {
    if (line == last_) return;  // no runs of one line
    last_ = line;
    add_history(line.c_str());
    if (history_.empty()) return;
    // What a person typed is theirs alone: the file is readable by its owner only.
    const mode_t old = umask(077);
    const int rc = write_history(history_.c_str());
    umask(old);
    if (rc != 0 && !warned_) {
      std::fprintf(stderr, "warning: cannot write the history file %s (--history-file, --no-history)\n",
                   history_.c_str());
      warned_ = true;
    }
  }

 private:
  std::string history_;
  size_t max_bytes_;
  std::string last_;
  bool warned_ = false;
};

}  // namespace

bool line_editor_available() { return true; }

std::unique_ptr<LineReader> make_line_editor(const std::string& history_file, size_t max_bytes) {
  return std::make_unique<EditLineReader>(history_file, max_bytes);
}

#else

bool line_editor_available() { return false; }

std::unique_ptr<LineReader> make_line_editor(const std::string&, size_t) { return nullptr; }

#endif

}  // namespace ptllm::cli
