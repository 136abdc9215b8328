#pragma once
// Stop strings for a generation's streamed text (sample, chat and the server).
#include <string>
#include <vector>

namespace ptllm {

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

}  // namespace ptllm
