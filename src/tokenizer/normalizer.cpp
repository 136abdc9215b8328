#include "tokenizer/normalizer.h"

#include <vector>

#include "tokenizer/unicode.h"

namespace ptllm::tok {
namespace {

class Nfc final : public Normalizer {
 public:
  void normalize(std::string& s) const override { s = nfc(s); }
};

class Replace final : public Normalizer {
 public:
  Replace(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& s) const override { s = pattern_.replace_all(s, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

// Prepends to non-empty text only (an empty split stays empty).
class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& s) const override {
    for (const auto& n : steps_) n->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> parse_normalizer(const json& j, const JsonPath& at) {
  const std::string type = get_string(j, "type", at);
  if (type == "NFC") return std::make_unique<Nfc>();
  if (type == "Replace")
    return std::make_unique<Replace>(get_pattern(j, at), get_string(j, "content", at));
  if (type == "Prepend") return std::make_unique<Prepend>(get_string(j, "prepend", at));
  if (type == "Sequence") {
    at.check_nesting();
    const json& list = need(j, "normalizers", at);
    if (!list.is_array()) (at / "normalizers").fail("expected an array");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back(parse_normalizer(list[i], (at / "normalizers")[i]));
    return std::make_unique<Sequence>(std::move(steps));
  }
  unsupported(at, "normalizer", type, "NFC, Replace, Prepend, Sequence");
}

}  // namespace ptllm::tok
