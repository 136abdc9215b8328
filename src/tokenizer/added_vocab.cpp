#include "tokenizer/added_vocab.h"

#include <algorithm>
#include <tuple>

#include "tokenizer/normalizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace ptllm::tok {
namespace {

// The character that ends at byte `end` (s valid UTF-8, end > 0).
char32_t char_before(std::string_view s, size_t end, size_t* start = nullptr) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  if (start) *start = i;
  size_t j = i;
  return next_char(s, j);
}

// Start of the run of whitespace that ends at `end`.
size_t trailing_space_start(std::string_view s, size_t end) {
  while (end > 0) {
    size_t start;
    if (!is_white_space(char_before(s, end, &start))) break;
    end = start;
  }
  return end;
}

// End of the run of whitespace that starts at `begin`.
size_t leading_space_end(std::string_view s, size_t begin) {
  while (begin < s.size()) {
    size_t next = begin;
    if (!is_white_space(next_char(s, next))) break;
    begin = next;
  }
  return begin;
}

}  // namespace

void AddedVocab::Trie::add(std::string_view pattern, int32_t token) {
  int32_t node = 0;
  for (char c : pattern) {
    const auto b = static_cast<unsigned char>(c);
    auto& next = nodes[node].next;
    auto it = std::find_if(next.begin(), next.end(), [&](const auto& e) { return e.first == b; });
    if (it != next.end()) {
      node = it->second;
    } else {
      next.emplace_back(b, static_cast<int32_t>(nodes.size()));
      node = static_cast<int32_t>(nodes.size());
      nodes.emplace_back();
    }
  }
  if (nodes[node].token < 0) nodes[node].token = token;  // the first of equal patterns wins
  starts[static_cast<unsigned char>(pattern[0])] = true;
}

std::pair<size_t, int32_t> AddedVocab::Trie::longest_at(std::string_view s, size_t i) const {
  std::pair<size_t, int32_t> best{i, -1};
  int32_t node = 0;
  for (size_t k = i; k < s.size(); ++k) {
    const auto b = static_cast<unsigned char>(s[k]);
    const auto& next = nodes[node].next;
    auto it = std::find_if(next.begin(), next.end(), [&](const auto& e) { return e.first == b; });
    if (it == next.end()) break;
    node = it->second;
    if (nodes[node].token >= 0) best = {k + 1, nodes[node].token};
  }
  return best;
}

AddedVocab::AddedVocab(std::vector<AddedToken> tokens, const Normalizer* normalizer)
    : tokens_(std::move(tokens)) {
  // tokenizers builds its matchers from the special tokens first, then the others.
  std::vector<size_t> order(tokens_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_partition(order.begin(), order.end(), [&](size_t i) { return tokens_[i].special; });
  for (size_t i : order) {
    const AddedToken& t = tokens_[i];
    max_id_ = std::max(max_id_, t.id);
    by_id_.emplace(t.id, i);
    by_content_.emplace(t.content, i);
    if (t.content.empty()) continue;  // tokenizers ignores these
    if (!t.normalized) {
      raw_.add(t.content, static_cast<int32_t>(i));
      continue;
    }
    std::string pattern = t.content;
    if (normalizer) normalizer->normalize(pattern);
    if (!pattern.empty()) normalized_.add(pattern, static_cast<int32_t>(i));
  }
}

const AddedToken* AddedVocab::find(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocab::find(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

void AddedVocab::split(std::string_view s, bool normalized_set, bool parse_special,
                       FunctionRef<void(int32_t)> on_token,
                       FunctionRef<void(std::string_view, size_t)> on_text) const {
  const Trie& trie = normalized_set ? normalized_ : raw_;
  size_t text_start = 0;  // start of the text not yet emitted
  size_t pos = 0;         // where the search for the next match resumes
  while (pos < s.size()) {
    // Leftmost match, longest at that position; matches never overlap.
    size_t start = pos, stop = pos;
    int32_t index = -1;
    for (; start < s.size(); ++start) {
      if (!trie.starts[static_cast<unsigned char>(s[start])]) continue;
      std::tie(stop, index) = trie.longest_at(s, start);
      if (index >= 0) break;
    }
    if (index < 0) break;
    pos = stop;
    const AddedToken& t = tokens_[index];
    if (t.special && !parse_special) continue;
    if (t.single_word) {
      const bool word_before = start > 0 && is_word_char(char_before(s, start));
      size_t after = stop;
      const bool word_after = stop < s.size() && is_word_char(next_char(s, after));
      if (word_before || word_after) continue;
    }
    if (t.lstrip) start = std::max(trailing_space_start(s, start), text_start);
    if (t.rstrip) stop = leading_space_end(s, stop);
    if (text_start < start) on_text(s.substr(text_start, start - text_start), text_start);
    on_token(t.id);
    text_start = stop;
  }
  if (text_start < s.size()) on_text(s.substr(text_start), text_start);
}

}  // namespace ptllm::tok
