// libFuzzer target: the grammar engine (src/grammar). The first part of an input is a GBNF grammar,
// or, when it starts with '{', a JSON Schema that the converter turns into one (its output must
// always be a grammar the parser takes: anything else aborts); the second part is text fed to the
// matcher byte by byte, with can_end / has_nothing_left / state_key at every step. Every bound is a
// GrammarLimitError, never a hang or a crash.
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_input.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptllm;
  const auto parts = fuzz::split_input(data, size, 2);
  std::string gbnf(parts[0]);
  if (!gbnf.empty() && gbnf[0] == '{') {
    const auto schema = nlohmann::ordered_json::parse(gbnf, nullptr, false);
    if (schema.is_discarded()) return 0;
    grammar::SchemaOptions o;
    o.max_rules = 2000;
    try {
      gbnf = grammar::json_schema_to_gbnf(schema, o);
    } catch (const Error&) {
      return 0;
    }
    try {
      (void)grammar::Grammar::parse(gbnf);
    } catch (const Error&) {
      std::abort();  // the converter wrote a grammar its own parser refuses
    }
  }
  std::shared_ptr<const grammar::Grammar> g;
  try {
    g = grammar::Grammar::parse(gbnf);
  } catch (const Error&) {
    return 0;
  }
  grammar::Limits limits;
  limits.max_stacks = 256;
  limits.max_depth = 256;
  try {
    grammar::GrammarMatcher m(g, limits);
    for (char c : parts[1]) {
      (void)m.can_end();
      (void)m.has_nothing_left();
      (void)m.state_key();
      if (!m.accept_byte(static_cast<uint8_t>(c))) break;
    }
  } catch (const grammar::GrammarLimitError&) {
  }
  return 0;
}
