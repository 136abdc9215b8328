#pragma once
// Grammar-constrained sampling: a grammar (src/grammar) applied to a generation as a mask on each
// step's logits, so that every sampled token keeps the text a prefix of the grammar's language.
//
// The vocabulary is seen as bytes: each id's raw bytes (Tokenizer::token_bytes) in a trie, built
// once per tokenizer and shared by every request. Special tokens stay out of the trie: an EOS id
// is allowed only where the grammar can end; another special token only where the grammar names
// its text (ConstraintSpec::special_ids: Mistral's [TOOL_CALLS]) and the text fits.
//
// A lazy constraint (llama.cpp's trigger idea) leaves the text free until a trigger string appears
// in the output; the grammar then matches the text from the trigger's first byte on, and once it
// is complete and nothing can follow, the text is free again until the next trigger. A constraint
// that is not lazy ends the reply when its grammar is complete and nothing can follow.
#include <cstdint>
#include <memory>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <span>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {

class GrammarVocab {
 public:
  uint64_t serial() const { return serial_; }  // unique in the process (a mask cache's key)
  explicit GrammarVocab(const Tokenizer& tok);
  // The tokenizer's, built on first use and kept while any request holds it (keyed by the
  // tokenizer's fingerprint).
  static std::shared_ptr<const GrammarVocab> of(const Tokenizer& tok);

  size_t size() const { return bytes_.size(); }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  const std::vector<std::string>& all_bytes() const { return bytes_; }
  bool special(int32_t id) const { return special_[size_t(id)]; }
  const std::vector<int32_t>& special_ids() const { return special_ids_; }
  const grammar::TokenTrie& trie() const { return trie_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  std::vector<int32_t> special_ids_;
  grammar::TokenTrie trie_;
  uint64_t serial_;
};

// A token mask as 64-bit words (bit id % 64 of word id / 64: allowed), and whether it allows a
// token that is not special.
struct TokenMask {
  std::vector<uint64_t> bits;
  bool any_plain = false;
};

// Masks of a grammar by matcher state and vocabulary, shared by every request using the grammar
// (the grammar cache keeps it): in a JSON string or a long repetition the state recurs, and a
// recurring state's mask is a lookup. A state not seen yet is computed by stack top
// (grammar::StackTopMasks, kept here per vocabulary), so states that differ only deep in their
// stacks share most of the work. Bounded in bytes; full, it starts over.
class MaskCache {
 public:
  std::shared_ptr<const TokenMask> get(const std::string& key);
  void put(const std::string& key, std::shared_ptr<const TokenMask> mask);
  grammar::StackTopMasks& tops(const std::shared_ptr<const GrammarVocab>& vocab);

 private:
  static constexpr size_t kMaxBytes = size_t(32) << 20;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const TokenMask>> masks_;
  size_t bytes_ = 0;
  // Per vocabulary (by serial): the vocabulary kept alive with the sortings that point into it.
  std::map<uint64_t, std::pair<std::shared_ptr<const GrammarVocab>, std::unique_ptr<grammar::StackTopMasks>>> tops_;
};

struct ConstraintSpec {
  std::shared_ptr<const grammar::Grammar> grammar;
  // Non-empty: lazy, from the first of these strings on (the grammar matches the trigger too).
  std::vector<std::string> triggers;
  // Special tokens the grammar may produce by their text.
  std::vector<int32_t> special_ids;
  grammar::Limits limits;
};

// A GBNF grammar compiled once and kept by its text (a bounded cache: a repeated schema or grammar
// costs nothing). Throws grammar::GrammarError (line and column), and a GrammarError at 1:1 when
// the grammar's language is empty (no text at all matches it).
std::shared_ptr<const grammar::Grammar> compile_grammar(std::string_view gbnf);
// No finite text matches the root rule (every alternative needs a rule that never ends).
bool empty_language(const grammar::Grammar& g);

// One generation's constraint state.
class Constraint {
 public:
  Constraint(std::shared_ptr<const ConstraintSpec> spec, std::shared_ptr<const GrammarVocab> vocab);

  // Sets the logit of every token that cannot come next to -infinity. `eos_ids` are allowed iff
  // the grammar can end here (always while a lazy constraint waits for its trigger). Returns
  // false when no token at all can come next.
  bool mask(std::span<float> logits, std::span<const int32_t> eos_ids);
  // The sampled id (not an ending EOS). An id that mask() allowed always fits.
  void accept(int32_t id);
  // The grammar is complete and no byte can follow: the reply must end (never for a lazy one).
  bool complete() const { return complete_; }
  // The grammar is applied to the next token (not waiting for a trigger).
  bool active() const { return matcher_.has_value(); }

 private:
  void arm(std::string_view text);  // a trigger met: the grammar from its first byte
  std::shared_ptr<const ConstraintSpec> spec_;
  std::shared_ptr<const GrammarVocab> vocab_;
  std::optional<grammar::GrammarMatcher> matcher_;
  std::shared_ptr<MaskCache> masks_;
  std::string tail_;  // lazy, waiting: the last bytes of the output, where a trigger may begin
  size_t longest_trigger_ = 0;
  bool complete_ = false;
};

}  // namespace ptllm
