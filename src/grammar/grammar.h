#pragma once
// Grammar-constrained decoding: GBNF (llama.cpp's docs/grammars/README.md) compiled to a pushdown
// automaton over bytes, and token masks from a byte trie of the vocabulary.
//
// Compiled form: every rule is a list of alternatives; an alternative is a run of elements in one
// flat array, ended by an End element. An element is a character class (code point ranges, maybe
// negated) or a reference to a rule. Groups become helper rules, x* becomes S ::= x S | (empty),
// x{m,n} becomes m copies of x then n-m nested optionals. Left recursion (through nullable
// prefixes too) is refused at compile time, so expanding a stack always terminates.
//
// Matcher state: a set of stacks of positions in the flat array (the top is the next class to
// match; an empty stack means the grammar is complete), plus the partially read UTF-8 code point
// shared by all stacks. A multi-byte code point is matched byte by byte: after each byte, a stack
// survives iff its class holds some valid code point starting with the bytes read so far, so a
// rejected prefix is rejected at its first byte. Tail references are not pushed, so x* keeps the
// stack depth constant.
//
// Cost: one byte is O(stacks x depth) plus the expansion of the stacks that advanced. The number of
// stacks and their depth are bounded (Limits); passing a bound throws GrammarLimitError rather
// than growing without end (ambiguous grammars can multiply stacks); the matcher is then as it was
// before the byte.
//
// Token masks: the vocabulary's byte strings go into a trie once; a mask walks the trie depth
// first from a copy of the matcher, pruning a subtree at its first rejected byte and restoring the
// state on return. Special tokens are kept out of the trie: allowed iff can_end().
//
// Masks by stack top (StackTopMasks, after xgrammar's context-independent tokens, Dong et al. 2024):
// a mask is the union of its stacks' masks, and most of a stack's mask depends only on its top
// entries. Walking the trie from those top entries alone sorts every token as accepted (consumed
// without leaving them: accepted whatever lies below), rejected (refused before they could be
// left), or uncertain (refused after they could have been left); only the uncertain ones are
// checked against the whole state. The sorting is kept per top, and the tops recur across states
// that differ deeper down (a JSON string at any nesting depth).
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace ptllm::grammar {

// A malformed grammar: line and column (1-based, columns in bytes) of the problem.
struct GrammarError : Error {
  GrammarError(int line, int column, const std::string& message);
  int line;
  int column;
  std::string message;  // without the position
};

// A matcher passed one of its Limits.
struct GrammarLimitError : Error {
  using Error::Error;
};

struct CharClass {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // sorted, merged, inclusive
  bool negated = false;
  bool contains(uint32_t cp) const;
  // Some code point of [lo, hi] is in the class.
  bool intersects(uint32_t lo, uint32_t hi) const;
};

struct Element {
  enum class Kind : uint8_t { End, Char, Ref };
  Kind kind = Kind::End;
  uint32_t index = 0;  // Char: into classes; Ref: a rule id
};

class Grammar {
 public:
  // Throws GrammarError. `root`: the start rule.
  static std::shared_ptr<const Grammar> parse(std::string_view text, std::string_view root = "root");

  uint32_t root() const { return root_; }
  const std::vector<Element>& elements() const { return elements_; }
  const std::vector<CharClass>& classes() const { return classes_; }
  // rules()[r]: the start of each alternative of rule r in elements().
  const std::vector<std::vector<uint32_t>>& rules() const { return rules_; }
  const std::string& rule_name(uint32_t r) const { return names_[r]; }

 private:
  friend class Compiler;
  uint32_t root_ = 0;
  std::vector<Element> elements_;
  std::vector<CharClass> classes_;
  std::vector<std::vector<uint32_t>> rules_;
  std::vector<std::string> names_;
};

struct Limits {
  size_t max_stacks = 4096;
  size_t max_depth = 1024;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar, Limits limits = {});

  // Consumes b if it can follow; otherwise returns false and leaves the state as it was.
  bool accept_byte(uint8_t b);
  // All of s, or nothing (the state is unchanged when some byte is rejected).
  bool accept_string(std::string_view s);
  // The text so far is a whole sentence of the grammar (EOS may follow).
  bool can_end() const;
  // No byte can follow: the reply must end here.
  bool has_nothing_left() const;
  size_t stack_count() const { return stacks_.size(); }
  // The state as bytes: equal keys accept exactly the same continuations (a mask cache's key).
  std::string state_key() const;
  const Grammar& grammar() const { return *grammar_; }

  using Stack = std::vector<uint32_t>;
  const std::vector<Stack>& stacks() const { return stacks_; }
  const std::shared_ptr<const Grammar>& grammar_ptr() const { return grammar_; }
  const Limits& limits() const { return limits_; }
  bool mid_code_point() const { return need_ != 0; }
  // A matcher whose only stack is s (the top entries of another matcher's stack).
  static GrammarMatcher from_stack(std::shared_ptr<const Grammar> grammar, Stack s, Limits limits = {});

  // Copies are the rollback: save one, try bytes, assign it back.
  GrammarMatcher(const GrammarMatcher&) = default;
  GrammarMatcher& operator=(const GrammarMatcher&) = default;

 private:
  GrammarMatcher() = default;
  void expand(Stack& s, std::vector<Stack>& out) const;
  bool step_code_point(uint32_t cp);
  bool step_partial(uint32_t value, int remaining);
  void dedup(std::vector<Stack>& set) const;

  std::shared_ptr<const Grammar> grammar_;
  Limits limits_;
  std::vector<Stack> stacks_;
  uint32_t partial_ = 0;  // bits of the code point read so far
  int need_ = 0;          // continuation bytes still to come
  int length_ = 0;        // bytes of the code point being read
  std::vector<Stack> scratch_;
};

// The vocabulary's byte strings in a trie, built once per vocabulary.
class TokenTrie {
 public:
  // special[id]: kept out of the trie (allowed iff can_end()); may be empty or shorter than vocab.
  TokenTrie(const std::vector<std::string>& vocab, const std::vector<bool>& special);
  size_t vocab_size() const { return n_vocab_; }

  // allowed[id] for every id of the vocabulary; empty tokens are never allowed.
  std::vector<bool> allowed(const GrammarMatcher& m) const;
  // Sorts the tokens for a matcher built from a stack's top entries (StackTopMasks): accepted[id]
  // when m consumes the token; `uncertain` gets the ids m refuses after a prefix where it could
  // end (the entries below the top could take over there). The rest are refused in any context.
  void classify(const GrammarMatcher& m, std::vector<bool>& accepted, std::vector<int32_t>& uncertain) const;
  const std::vector<int32_t>& special_ids() const { return special_ids_; }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, uint32_t>> children;  // sorted by byte
    std::vector<int32_t> ids;                            // tokens ending here
  };
  void walk(uint32_t node, size_t depth, bool ended, GrammarMatcher& m, std::vector<GrammarMatcher>& saved,
            std::vector<bool>& accepted, std::vector<int32_t>* uncertain) const;
  void collect(uint32_t node, std::vector<int32_t>& out) const;
  std::vector<Node> nodes_;
  std::vector<int32_t> special_ids_;
  size_t n_vocab_ = 0;
};

// TokenTrie::allowed computed through the sorting by stack top above, cached per top. Thread-safe;
// the trie and the vocabulary's bytes must outlive it. Bounded in bytes; full, it starts over.
class StackTopMasks {
 public:
  StackTopMasks(const TokenTrie& trie, const std::vector<std::string>& vocab, size_t top_entries = 6)
      : trie_(trie), vocab_(vocab), top_entries_(top_entries) {}
  // Equal to trie.allowed(m) for every state.
  std::vector<bool> allowed(const GrammarMatcher& m);
  size_t tops() const;            // sortings kept now
  size_t uncertain_tokens() const;  // tokens they left to check against whole states

 private:
  struct Sorted {
    std::vector<bool> accepted;
    std::vector<int32_t> uncertain;
  };
  static constexpr size_t kMaxBytes = size_t(64) << 20;
  const TokenTrie& trie_;
  const std::vector<std::string>& vocab_;
  size_t top_entries_;
  mutable std::mutex mu_;
  std::map<std::vector<uint32_t>, std::shared_ptr<const Sorted>> sorted_;  // top entries (+ whole-stack flag)
  size_t bytes_ = 0;
};

}  // namespace ptllm::grammar
