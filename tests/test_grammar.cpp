// The GBNF parser, the byte matcher and token masks (src/grammar/grammar.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <map>
#include <random>
#include <set>

#include "grammar/grammar.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace ptllm;
using namespace ptllm::grammar;

namespace {

bool matches(const std::shared_ptr<const Grammar>& g, std::string_view s) {
  GrammarMatcher m(g);
  return m.accept_string(s) && m.can_end();
}

bool matches(std::string_view grammar, std::string_view s) { return matches(Grammar::parse(grammar), s); }

GrammarError parse_error(std::string_view text) {
  try {
    Grammar::parse(text);
  } catch (const GrammarError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for: " << text;
  return GrammarError(0, 0, "");
}

// llama.cpp's grammars/json.gbnf in spirit, written here with bounded whitespace.
const char* kJson = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,16})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)";

const char* kArith = R"gbnf(
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor
)gbnf";

const std::vector<std::string>& kjv_vocab(std::vector<bool>* special = nullptr) {
  static std::vector<std::string> vocab;
  static std::vector<bool> spec;
  if (vocab.empty()) {
    const Tokenizer tok = Tokenizer::load(test::repo_model("kjv-tiny"));
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
      const int32_t ids[1] = {id};
      vocab.push_back(tok.decode(ids, false));
      spec.push_back(tok.is_special(id));
    }
  }
  if (special) *special = spec;
  return vocab;
}

std::vector<bool> brute_force_mask(const GrammarMatcher& m, const std::vector<std::string>& vocab,
                                   const std::vector<bool>& special) {
  std::vector<bool> out(vocab.size(), false);
  for (size_t id = 0; id < vocab.size(); ++id) {
    if (special[id]) { out[id] = m.can_end(); continue; }
    if (vocab[id].empty()) continue;
    GrammarMatcher c = m;
    out[id] = c.accept_string(vocab[id]);
  }
  return out;
}

}  // namespace

TEST(GrammarParse, Constructs) {
  EXPECT_TRUE(matches(R"(root ::= "ab" | "cd")", "cd"));
  EXPECT_FALSE(matches(R"(root ::= "ab" | "cd")", "ac"));
  EXPECT_TRUE(matches(R"(root ::= "a" ( "b" | "c" ) "d")", "acd"));
  EXPECT_TRUE(matches(R"(root ::= "a"* "b"+ "c"?)", "bbb"));
  EXPECT_TRUE(matches(R"(root ::= "a"* "b"+ "c"?)", "aabc"));
  EXPECT_FALSE(matches(R"(root ::= "a"* "b"+ "c"?)", "aac"));
  EXPECT_TRUE(matches(R"(root ::= [a-c]+ [^a-c])", "abcz"));
  EXPECT_FALSE(matches(R"(root ::= [a-c]+ [^a-c])", "abca"));
  EXPECT_TRUE(matches(R"(root ::= . . .)", "x\n\xCE\xB1"));
  EXPECT_TRUE(matches("root ::= x # a comment\nx ::= \"q\" # another\n", "q"));
  EXPECT_TRUE(matches("root ::= (\n  \"a\" |\n  \"b\"\n)\n", "b"));
  EXPECT_TRUE(matches("root ::=\n  \"a\" b\nb ::= \"b\"", "ab"));
  const auto lines = Grammar::parse("root ::= \"a\"\n  | \"b\" # comment\n\n  | \"c\"\nd ::= \"d\"\n");
  EXPECT_TRUE(matches(lines, "c"));
  EXPECT_FALSE(matches(lines, "d"));
}

TEST(GrammarParse, Escapes) {
  EXPECT_TRUE(matches(R"(root ::= "\n\t\r\\\"")", "\n\t\r\\\""));
  EXPECT_TRUE(matches(R"(root ::= "\x41\u03B1\U0001F600")", "A\xCE\xB1\xF0\x9F\x98\x80"));
  EXPECT_TRUE(matches(R"(root ::= [\]\-\\]+)", "]-\\"));
  EXPECT_TRUE(matches(R"(root ::= [\x30-\x39]{2})", "42"));
  EXPECT_TRUE(matches(R"(root ::= "α" [β-δ])", "αγ"));
}

TEST(GrammarParse, Counts) {
  const auto g = Grammar::parse(R"(root ::= "a"{3} "b"{2,} "c"{1,3} ("de"){0,2})");
  EXPECT_TRUE(matches(g, "aaabbc"));
  EXPECT_TRUE(matches(g, "aaabbbbbcccdede"));
  EXPECT_FALSE(matches(g, "aabbc"));
  EXPECT_FALSE(matches(g, "aaabc"));
  EXPECT_FALSE(matches(g, "aaabbcccc"));
  EXPECT_FALSE(matches(g, "aaabbcdedede"));
  EXPECT_FALSE(matches(g, "aaabbcd"));
  EXPECT_TRUE(matches(R"(root ::= [0-9]{ 2 , 3 })", "123"));
}

TEST(GrammarParse, Errors) {
  {
    GrammarError e = parse_error("root ::= \"a\" foo\n");
    EXPECT_EQ(e.line, 1);
    EXPECT_EQ(e.column, 14);
    EXPECT_NE(e.message.find("undefined rule 'foo'"), std::string::npos) << e.message;
    EXPECT_STREQ(e.what(), "grammar: line 1, column 14: undefined rule 'foo'");
  }
  {
    GrammarError e = parse_error("start ::= \"a\"\n");
    EXPECT_NE(e.message.find("no rule 'root'"), std::string::npos) << e.message;
  }
  {
    GrammarError e = parse_error("root ::= a\na ::= \"x\" )\n");
    EXPECT_EQ(e.line, 2);
    EXPECT_EQ(e.column, 11);
    EXPECT_NE(e.message.find("expected the end of the rule"), std::string::npos) << e.message;
  }
  {
    GrammarError e = parse_error("root ::= \"a\n");
    EXPECT_EQ(e.line, 1);
    EXPECT_EQ(e.column, 10);
    EXPECT_NE(e.message.find("unterminated string"), std::string::npos) << e.message;
  }
  {
    GrammarError e = parse_error("root ::= [a-z\n");
    EXPECT_NE(e.message.find("expected"), std::string::npos) << e.message;
  }
  {
    GrammarError e = parse_error("root ::= (\"a\" | \"b\"\n\n");
    EXPECT_EQ(e.line, 3);
    EXPECT_NE(e.message.find("expected ')'"), std::string::npos) << e.message;
  }
  {
    GrammarError e = parse_error("root ::= \"a\"{3,2}");
    EXPECT_EQ(e.column, 13);
    EXPECT_NE(e.message.find("n < m"), std::string::npos) << e.message;
  }
  {
    GrammarError e = parse_error("root = \"a\"");
    EXPECT_EQ(e.column, 6);
    EXPECT_NE(e.message.find("expected '::='"), std::string::npos) << e.message;
  }
  {
    GrammarError e = parse_error("root ::= \"\\q\"");
    EXPECT_NE(e.message.find("unknown escape"), std::string::npos) << e.message;
  }
  {
    GrammarError e = parse_error("root ::= expr\nexpr ::= expr \"+\" num | num\nnum ::= [0-9]+\n");
    EXPECT_EQ(e.line, 2);
    EXPECT_EQ(e.column, 1);
    EXPECT_NE(e.message.find("'expr' is left-recursive"), std::string::npos) << e.message;
  }
  {
    // Through a nullable prefix.
    GrammarError e = parse_error("root ::= a\na ::= b a \"x\" | \"y\"\nb ::= \"z\"?\n");
    EXPECT_NE(e.message.find("'a' is left-recursive"), std::string::npos) << e.message;
  }
  {
    GrammarError e = parse_error("root ::= \"a\"\nroot ::= \"b\"\n");
    EXPECT_EQ(e.line, 2);
    EXPECT_NE(e.message.find("defined twice"), std::string::npos) << e.message;
  }
  {
    GrammarError e = parse_error("root ::= \"ab\\");
    EXPECT_NE(e.message.find("unexpected end of input"), std::string::npos) << e.message;
  }
  {
    GrammarError e = parse_error("root ::= \"a\" | ]");
    EXPECT_EQ(e.column, 16);
    EXPECT_NE(e.message.find("expected an element"), std::string::npos) << e.message;
  }
  EXPECT_NO_THROW(Grammar::parse("main ::= \"a\"", "main"));
}

TEST(GrammarMatch, Json) {
  const auto g = Grammar::parse(kJson);
  EXPECT_TRUE(matches(g, R"({"a": [1, 2.5, -3e10, true, null], "b": {"c": "d\n\u00e9"}})"));
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_TRUE(matches(g, "{\"é漢\": \"\xF0\x9F\x98\x80\"}"));
  EXPECT_FALSE(matches(g, R"({"a": 01})"));
  EXPECT_FALSE(matches(g, R"({"a": [1,]})"));
  EXPECT_FALSE(matches(g, R"({"a" 1})"));
  EXPECT_FALSE(matches(g, R"([1])"));
  EXPECT_FALSE(matches(g, "{\"a\": \"\x01\"}"));
  GrammarMatcher m(g);
  EXPECT_TRUE(m.accept_string("{\"a\": tr"));
  EXPECT_FALSE(m.accept_string("x"));
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept_string("ue}"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.has_nothing_left());  // whitespace may follow
}

TEST(GrammarMatch, Arithmetic) {
  const auto g = Grammar::parse(kArith);
  EXPECT_TRUE(matches(g, "1+2*(3-4)/-5"));
  EXPECT_TRUE(matches(g, "((((7))))"));
  EXPECT_FALSE(matches(g, "1+"));
  EXPECT_FALSE(matches(g, "(1"));
  EXPECT_FALSE(matches(g, "1+*2"));
  GrammarMatcher m(g);
  EXPECT_FALSE(m.accept_string("1+)"));
  EXPECT_TRUE(m.accept_string("1+"));  // unchanged by the failed string
  EXPECT_TRUE(m.accept_string("2"));
  EXPECT_TRUE(m.can_end());
}

TEST(GrammarMatch, NothingLeft) {
  GrammarMatcher m(Grammar::parse(R"(root ::= "yes" | "no")"));
  EXPECT_FALSE(m.has_nothing_left());
  EXPECT_TRUE(m.accept_string("no"));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.has_nothing_left());
  EXPECT_FALSE(m.accept_byte('x'));
}

TEST(GrammarMatch, UnicodeClasses) {
  const auto g = Grammar::parse(R"(root ::= [α-ω]+)");
  EXPECT_TRUE(matches(g, "αβγω"));
  EXPECT_FALSE(matches(g, "αa"));
  EXPECT_FALSE(matches(g, "Α"));  // capital alpha U+0391
  GrammarMatcher m(g);
  // α is CE B1, ω is CF 89: a lead byte is accepted only when some completion is in the class.
  EXPECT_FALSE(m.accept_byte(0xCD));
  EXPECT_TRUE(m.accept_byte(0xCE));
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept_byte(0x91));  // U+0391
  EXPECT_TRUE(m.accept_byte(0xB1));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.accept_byte(0xCF));
  EXPECT_FALSE(m.accept_byte(0x8A));  // U+03CA, past ω
  EXPECT_TRUE(m.accept_byte(0x89));

  const auto neg = Grammar::parse(R"(root ::= [^α-ωa]+)");
  EXPECT_TRUE(matches(neg, "bΑ漢\xF0\x9F\x98\x80"));
  EXPECT_FALSE(matches(neg, "bβ"));
  EXPECT_FALSE(matches(neg, "a"));
  GrammarMatcher n(neg);
  EXPECT_TRUE(n.accept_byte(0xCE));   // CE 80..B0 are outside the class
  EXPECT_FALSE(n.accept_byte(0xB2));  // β
  EXPECT_TRUE(n.accept_byte(0x91));
  // Invalid UTF-8 never matches, not even '.': overlong forms, surrogates, stray continuations.
  GrammarMatcher any(Grammar::parse("root ::= .*"));
  EXPECT_FALSE(any.accept_byte(0xC0));
  EXPECT_FALSE(any.accept_byte(0x80));
  EXPECT_TRUE(any.accept_byte(0xED));
  EXPECT_FALSE(any.accept_byte(0xA0));  // U+D800..
  EXPECT_TRUE(any.accept_byte(0x9F));
  EXPECT_TRUE(any.accept_byte(0xBF));
  EXPECT_TRUE(any.can_end());
}

TEST(GrammarMatch, LimitsThrow) {
  // An ambiguous grammar: every split of the a's is a stack.
  const auto g = Grammar::parse(R"(root ::= x
x ::= "a" x "b" | "a" x | "")");
  GrammarMatcher m(g, Limits{64, 32});
  EXPECT_THROW(
      {
        for (int i = 0; i < 100; ++i) m.accept_byte('a');
      },
      GrammarLimitError);
}

TEST(GrammarMask, MatchesBruteForce) {
  std::vector<bool> special;
  const auto& kjv = kjv_vocab(&special);
  ASSERT_GT(kjv.size(), 100u);
  // kjv-tiny's pieces are whole characters; byte tokens and split characters reach the states
  // inside a multi-byte code point.
  std::vector<std::string> vocab = kjv;
  for (int b = 1; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  for (const char* piece : {"\xCE", "\xB1\xCE", "\xCF\x89", "\xE6\xBC", "\xA2", "\xF0\x9F\x98", "\x80."})
    vocab.push_back(piece);
  special.resize(vocab.size(), false);
  const TokenTrie trie(vocab, special);
  const char* grammars[] = {kJson, kArith, R"(root ::= ([a-z ]+ "." " "?){1,3})",
                            R"(root ::= [^α-ω\n]{0,12} "\n" [α-ω]*)"};
  std::mt19937 rng(1234);
  int states = 0;
  size_t uncertain_tokens = 0;  // the 1-entry tops leave tokens to check: that path runs
  for (const char* text : grammars) {
    const auto g = Grammar::parse(text);
    // The masks by stack top, keeping 1, 2 or 6 entries (fewer: more tokens left uncertain).
    StackTopMasks tops1(trie, vocab, 1), tops2(trie, vocab, 2), tops6(trie, vocab, 6);
    for (int walk = 0; walk < 10; ++walk) {
      GrammarMatcher m(g);
      for (int step = 0; step < 12; ++step) {
        const std::vector<bool> mask = trie.allowed(m);
        ASSERT_EQ(mask, brute_force_mask(m, vocab, special)) << text << " step " << step;
        ASSERT_EQ(tops1.allowed(m), mask) << text << " step " << step;
        ASSERT_EQ(tops2.allowed(m), mask) << text << " step " << step;
        ASSERT_EQ(tops6.allowed(m), mask) << text << " step " << step;
        ++states;
        std::vector<size_t> ok;
        for (size_t id = 0; id < mask.size(); ++id)
          if (mask[id] && !special[id]) ok.push_back(id);
        if (ok.empty()) break;
        ASSERT_TRUE(m.accept_string(vocab[ok[rng() % ok.size()]]));
      }
    }
    uncertain_tokens += tops1.uncertain_tokens();
  }
  EXPECT_GE(states, 200);
  EXPECT_GT(uncertain_tokens, 0u);
}

TEST(GrammarMask, JsonWalksParse) {
  std::vector<bool> special;
  const auto& vocab = kjv_vocab(&special);
  const TokenTrie trie(vocab, special);
  const auto g = Grammar::parse(kJson);
  std::mt19937 rng(99);
  int ends = 0;
  for (int walk = 0; walk < 40; ++walk) {
    GrammarMatcher m(g);
    std::string text;
    for (int step = 0; step < 60; ++step) {
      if (m.can_end()) {
        ++ends;
        EXPECT_TRUE(nlohmann::json::accept(text)) << text;
        if (rng() % 3 == 0) break;
      }
      const std::vector<bool> mask = trie.allowed(m);
      std::vector<size_t> ok;
      for (size_t id = 0; id < mask.size(); ++id)
        if (mask[id] && !special[id]) ok.push_back(id);
      if (ok.empty()) break;
      // Half the time close something when possible, so that walks reach the end of a value.
      std::vector<size_t> closing;
      for (size_t id : ok)
        if (vocab[id] == "\"" || vocab[id] == "}" || vocab[id] == "]") closing.push_back(id);
      const auto& pick = !closing.empty() && rng() % 2 == 0 ? closing : ok;
      const std::string& piece = vocab[pick[rng() % pick.size()]];
      ASSERT_TRUE(m.accept_string(piece));
      text += piece;
    }
  }
  EXPECT_GE(ends, 10);
}

TEST(GrammarMatch, CommentsInsideGroups) {
  // The layout of the GBNF guide's chess example: a parenthesized root across lines with comments.
  const auto g = Grammar::parse(R"gbnf(
# a numbered list of moves
root ::= (
    # the first line
    "1. " move " " move "\n"

    # then more, numbered with one or two digits
    ([1-9] [0-9]? ". " move " " move "\n")+
)
move ::= (pawn | piece | castle) [+#]?   # check or mate
pawn ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBRQ])?
piece ::= [NBRQK] [a-h]? [1-8]? "x"? [a-h] [1-8]
castle ::= "O-O" "-O"?
)gbnf");
  EXPECT_TRUE(matches(g, "1. e4 e5\n2. Nf3 Nc6\n10. O-O-O Qxd8#\n"));
  EXPECT_FALSE(matches(g, "1. e4 e5\n"));  // at least one more line
  EXPECT_FALSE(matches(g, "1. e9 e5\n2. d4 d5\n"));
}

TEST(GrammarMatch, DepthLimitLeavesStateUnchanged) {
  GrammarMatcher m(Grammar::parse(kArith), Limits{4096, 16});
  std::string opened;
  bool threw = false;
  for (int i = 0; i < 40 && !threw; ++i) {
    try {
      ASSERT_TRUE(m.accept_byte('('));
      opened += '(';
    } catch (const GrammarLimitError&) {
      threw = true;
    }
  }
  ASSERT_TRUE(threw);
  EXPECT_LT(opened.size(), 16u);
  // The byte that passed the bound was not taken: the parentheses read so far can still be closed.
  ASSERT_TRUE(m.accept_byte('1'));
  EXPECT_TRUE(m.accept_string(std::string(opened.size(), ')')));
  EXPECT_TRUE(m.can_end());
}

namespace {

// A reference recognizer over the compiled form: the end positions of a rule from a position,
// memoized (terminates because left recursion is refused). Independent of the matcher's stacks.
struct Reference {
  const Grammar& g;
  std::vector<uint32_t> cps;
  std::map<std::pair<uint32_t, size_t>, std::set<size_t>> memo;

  std::set<size_t> seq(uint32_t pos, size_t i) {
    const Element& e = g.elements()[pos];
    if (e.kind == Element::Kind::End) return {i};
    std::set<size_t> out;
    if (e.kind == Element::Kind::Char) {
      if (i < cps.size() && g.classes()[e.index].contains(cps[i])) out = seq(pos + 1, i + 1);
      return out;
    }
    for (size_t j : rule(e.index, i)) {
      auto rest = seq(pos + 1, j);
      out.insert(rest.begin(), rest.end());
    }
    return out;
  }
  std::set<size_t> rule(uint32_t r, size_t i) {
    auto it = memo.find({r, i});
    if (it != memo.end()) return it->second;
    std::set<size_t> out;
    for (uint32_t start : g.rules()[r]) {
      auto ends = seq(start, i);
      out.insert(ends.begin(), ends.end());
    }
    memo[{r, i}] = out;
    return out;
  }
};

}  // namespace

TEST(GrammarMatch, AgreesWithReferenceOnRandomStrings) {
  struct Case {
    const char* grammar;
    std::vector<std::string> alphabet;  // one character each
    std::vector<uint32_t> values;       // its code point
  };
  const std::vector<Case> cases = {
      {kArith, {"1", "0", "+", "-", "*", "(", ")"}, {'1', '0', '+', '-', '*', '(', ')'}},
      {R"(root ::= "a"{2,4} ("bc"){0,2} [ab]+ "c"?)", {"a", "b", "c"}, {'a', 'b', 'c'}},
      {R"(root ::= ([α-γ] | "ω" [^α-γ])* "!")", {"α", "β", "ω", "a", "漢", "!"}, {0x3B1, 0x3B2, 0x3C9, 'a', 0x6F22, '!'}},
      {R"gbnf(root ::= "[" (v ("," v)*)? "]"
v ::= [0-9] | root)gbnf", {"[", "]", ",", "1"}, {'[', ']', ',', '1'}},
  };
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    const auto g = Grammar::parse(c.grammar);
    int accepted = 0;
    for (int trial = 0; trial < 400; ++trial) {
      std::vector<size_t> picks(rng() % 9);
      for (size_t& p : picks) p = rng() % c.alphabet.size();
      std::string text;
      for (size_t p : picks) text += c.alphabet[p];
      Reference ref{*g, {}, {}};
      for (size_t p : picks) ref.cps.push_back(c.values[p]);
      const bool expected = ref.rule(g->root(), 0).count(ref.cps.size()) > 0;
      GrammarMatcher m(g);
      const bool got = m.accept_string(text) && m.can_end();
      ASSERT_EQ(got, expected) << c.grammar << " on '" << text << "'";
      accepted += expected;
    }
    EXPECT_GT(accepted, 0) << c.grammar;
  }
}
