// The Jinja-subset interpreter piece by piece: the lexer (whitespace control, line numbers), the
// parser (precedence, errors), values (Python printing), and the evaluator over every tag, filter,
// test and operator: tests/data/chat_unit_cases.json rendered by Jinja2 into
// tests/data/chat_unit_expected.jsonl (scripts/render_chat_templates.py). Also the limits that
// keep hostile templates from crashing or hanging.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "chat/eval.h"
#include "chat/json_value.h"
#include "chat/lexer.h"
#include "chat/parser.h"
#include "chat/pystr.h"
#include "test_util.h"

using namespace ptllm::chat;

namespace {

std::string render_str(const std::string& src, const Json& ctx = Json::object(), RenderOptions opt = {}) {
  const Program p = parse_template(src, "t");
  return render(p, from_json(ctx).as_dict(), opt);
}

// The error a template raises, or "" if it renders.
std::string error_of(const std::string& src, RenderOptions opt = {}) {
  try {
    render_str(src, Json::object(), opt);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "";
}

TEST(ChatLexer, TokensAndLines) {
  const auto t = tokenize("a\n{{ x.y|f(1, 'z') }}\n{% if b %}", "t");
  std::vector<std::string> texts;
  for (const auto& tok : t) texts.push_back(tok.text);
  EXPECT_EQ(texts, (std::vector<std::string>{"a\n", "", "x", ".", "y", "|", "f", "(", "1", ",", "z", ")",
                                              "", "\n", "", "if", "b", "", ""}));
  EXPECT_EQ(t[8].type, Tok::Int);
  EXPECT_EQ(t[8].ival, 1);
  EXPECT_EQ(t[10].type, Tok::String);
  EXPECT_EQ(t[15].line, 3);
  EXPECT_EQ(t.back().type, Tok::Eof);
}

TEST(ChatLexer, WhitespaceControl) {
  // trim_blocks eats one newline after %}, lstrip_blocks the indentation before {%.
  EXPECT_EQ(render_str("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  EXPECT_EQ(render_str("a  {{- 'b' -}}  \n c"), "abc");
  EXPECT_EQ(render_str("a\n{#- c -#}\nb"), "ab");
  EXPECT_EQ(render_str("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(render_str("x\n"), "x");  // keep_trailing_newline=False
  EXPECT_EQ(render_str("x\r\ny"), "x\ny");
}

TEST(ChatLexer, Errors) {
  EXPECT_NE(error_of("{{ 'abc }}").find("line 1: unexpected end of string"), std::string::npos);
  EXPECT_NE(error_of("\n\n{# x").find("line 3: missing end of comment tag"), std::string::npos);
  EXPECT_NE(error_of("{{ ] }}").find("unexpected ']'"), std::string::npos);
  EXPECT_NE(error_of("{{ 99999999999999999999 }}").find("integer literal too large"), std::string::npos);
  EXPECT_NE(error_of("{{ '\\x4' }}").find("truncated escape"), std::string::npos);
}

TEST(ChatParser, PrecedenceAsJinja2) {
  EXPECT_EQ(render_str("{{ 1 + 2 * 3 }} {{ 2 ** 3 ** 2 }} {{ not 1 == 2 }} {{ true or false and false }}"),
            "7 64 True True");
  EXPECT_EQ(render_str("{{ ' a '|trim + 'b' }} {{ -2|abs }} {{ [1, 2]|length is odd }}"), "ab 2 False");
  EXPECT_EQ(render_str("{{ 'x' if false else 'y' if true else 'z' }}"), "y");
}

TEST(ChatParser, ErrorsCarryTheLine) {
  EXPECT_NE(error_of("ok\n{% for x in %}{% endfor %}").find("line 2"), std::string::npos);
  EXPECT_NE(error_of("{% if x %}").find("expected 'elif' or 'else' or 'endif'"), std::string::npos);
  EXPECT_NE(error_of("{% endif %}").find("unexpected 'endif'"), std::string::npos);
  EXPECT_NE(error_of("{% include 'x' %}").find("unsupported tag 'include'"), std::string::npos);
  EXPECT_NE(error_of("{% continue %}").find("outside of a loop"), std::string::npos);
  EXPECT_NE(error_of("{{ f(a=1, 2) }}").find("positional argument follows keyword"), std::string::npos);
  EXPECT_NE(error_of("{% macro m(a=1, b) %}{% endmacro %}").find("non-default argument"), std::string::npos);
  EXPECT_NE(error_of("{{ }}").find("expected an expression"), std::string::npos);
}

TEST(ChatParser, DeepNestingFailsCleanly) {
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("too deep"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '-') + "1 }}").find("too deep"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(3000, '[') + std::string(3000, ']') + " }}").find("too deep"), std::string::npos);
  std::string ifs;
  for (int i = 0; i < 3000; ++i) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("too deep"), std::string::npos);
  EXPECT_EQ(render_str("{{ " + std::string(30, '(') + "1" + std::string(30, ')') + " }}"), "1");
}

TEST(ChatValue, PythonPrinting) {
  EXPECT_EQ(format_float(1.0), "1.0");
  EXPECT_EQ(format_float(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(format_float(1e16), "1e+16");
  EXPECT_EQ(format_float(1.5e-5), "1.5e-05");
  EXPECT_EQ(format_float(0.0001), "0.0001");
  EXPECT_EQ(format_float(-0.0), "-0.0");
  EXPECT_EQ(format_float(123456789012345678.0), "1.2345678901234568e+17");
  EXPECT_EQ(repr_string("it's"), "\"it's\"");
  EXPECT_EQ(repr_string("a'\"b\n"), "'a\\'\"b\\n'");
  EXPECT_EQ(from_json(Json::parse(R"({"a": [1, 2.0, null, true, "x"]})")).repr(), "{'a': [1, 2.0, None, True, 'x']}");
  EXPECT_TRUE(equals(Value::integer(1), Value::real(1.0)));
  EXPECT_TRUE(equals(Value::boolean(true), Value::integer(1)));
  EXPECT_FALSE(equals(Value::string("1"), Value::integer(1)));
}

TEST(ChatValue, JsonDumpsAsPython) {
  JsonDumpOptions o;
  const Value v = from_json(Json::parse(R"({"b": [1, {"c": "é\u0001"}], "a": {}, "e": [], "f": 1.0})"));
  EXPECT_EQ(dump_json(v, o), R"({"b": [1, {"c": "é\u0001"}], "a": {}, "e": [], "f": 1.0})");
  o.ensure_ascii = true;
  EXPECT_EQ(dump_json(Value::string("é🌍"), o), R"("\u00e9\ud83c\udf0d")");
  o = {};
  o.indent = "  ";
  o.item_sep = ",";
  o.sort_keys = true;
  EXPECT_EQ(dump_json(v, o), "{\n  \"a\": {},\n  \"b\": [\n    1,\n    {\n      \"c\": \"é\\u0001\"\n    }\n  ],\n  \"e\": [],\n  \"f\": 1.0\n}");
}

TEST(ChatPystr, CodePointsAndInvalidUtf8) {
  EXPECT_EQ(pystr::length("héllo🌍"), 6u);
  EXPECT_EQ(pystr::slice("héllo", pystr::slice_indices(5, std::nullopt, std::nullopt, -1)), "olléh");
  const std::string bad = "a\xff\xc3";  // invalid bytes survive a round trip
  EXPECT_EQ(pystr::encode(pystr::decode(bad)), bad);
  EXPECT_EQ(pystr::length(bad), 3u);
  EXPECT_EQ(pystr::split(" a  b ", std::nullopt, -1), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(pystr::title("hello wORLD 2nd"), "Hello World 2Nd");
}

// Every tag, filter, test and operator, against Jinja2's own output.
TEST(ChatEval, UnitCasesRenderAsJinja2) {
  std::ifstream in(ptllm::test::repo_dir() / "tests" / "data" / "chat_unit_expected.jsonl");
  size_t n = 0, errors = 0;
  RenderOptions opt;
  opt.now = 1721995200;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const Json c = Json::parse(line);
    SCOPED_TRACE(c["name"].get<std::string>() + ": " + c["template"].get<std::string>());
    ++n;
    std::string got, err;
    try {
      got = render_str(c["template"], c["context"], opt);
    } catch (const TemplateError& e) {
      err = e.what();
    }
    if (c.contains("error")) {
      EXPECT_FALSE(err.empty()) << "rendered " << got << "; Jinja2: " << c["error"].get<std::string>();
      ++errors;
    } else {
      EXPECT_EQ(err, "");
      EXPECT_EQ(got, c["output"].get<std::string>());
    }
  }
  EXPECT_GT(n, 100u);
  std::printf("[ chat ] %zu unit cases (%zu errors) as Jinja2\n", n, errors);
}

TEST(ChatEval, RuntimeErrorsCarryTheLine) {
  EXPECT_EQ(error_of("a\nb\n{{ 1 + 'x' }}"), "template t, line 3: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(error_of("{% for m in [1] %}\n{{ m.x.y }}{% endfor %}"), "template t, line 2: '1' has no attribute 'x'");
  EXPECT_EQ(error_of("{{ x|nofilter }}"), "template t, line 1: No filter named 'nofilter'.");
}

TEST(ChatEval, LimitsStopRunawayTemplates) {
  RenderOptions small;
  small.max_steps = 100000;
  EXPECT_NE(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", small)
                .find("evaluation budget"), std::string::npos);
  small.max_output_bytes = 1000;
  EXPECT_NE(error_of("{% for i in range(2000) %}x{% endfor %}", small).find("size limit"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 1000000000000 }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("recursion"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ [1][::0] }}").find("step cannot be zero"), std::string::npos);
  EXPECT_EQ(render_str("{{ ('' * 9223372036854775807)|length }}{{ [][::-9223372036854775807 - 1] }}"), "0[]");
  EXPECT_NE(error_of("{{ range(-9223372036854775807 - 1, 9223372036854775807, 1)|length }}").find("Range too big"), std::string::npos);
  EXPECT_EQ(render_str("{{ range(0, 9223372036854775807, 9223372036854775807)|list }}"), "[0]");
}

// Values cannot nest without bound (deep recursion when printing or freeing them), and a
// namespace cannot hold a namespace (no cycles).
TEST(ChatEval, NestingIsBounded) {
  EXPECT_NE(error_of("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}")
                .find("nested too deeply"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(x=1) %}{% for i in range(100000) %}{% set ns.x = [ns.x.count] %}{% endfor %}")
                .find("nested too deeply"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace() %}{% set ns.me = ns %}").find("cannot hold another namespace"), std::string::npos);
  EXPECT_NE(error_of("{% set a = namespace() %}{% set b = namespace(a=[a]) %}").find("cannot hold another namespace"), std::string::npos);
  std::string deep = std::string(300, '[') + std::string(300, ']');
  EXPECT_THROW(from_json(Json::parse(deep)), ptllm::Error);
  EXPECT_EQ(render_str("{{ x|length }}", Json::parse("{\"x\": " + std::string(100, '[') + std::string(100, ']') + "}")), "1");
}

// Mutated real templates: any outcome is fine except a crash (the sanitizer build checks UB).
TEST(ChatEval, MutatedTemplatesNeverCrash) {
  const auto dir = ptllm::test::repo_dir() / "tests" / "data" / "chat_templates";
  std::mt19937 rng(17);
  const std::string alphabet = "{}%#-+()[]'\"|.,:=~*/ \n\\abcxyz019";
  const Json ctx = Json::parse(R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
      {"role": "assistant", "content": "a", "tool_calls": [{"id": "abcdefghi", "function": {"name": "f", "arguments": {"x": 1}}}]},
      {"role": "tool", "tool_call_id": "abcdefghi", "content": "r"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}],
      "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  RenderOptions opt;
  opt.max_steps = 200000;
  opt.max_output_bytes = 1 << 20;
  size_t rendered = 0, refused = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".jinja") continue;
    std::ifstream in(entry.path());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string src = ss.str();
    for (int k = 0; k < 60; ++k) {
      std::string m = src;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !m.empty(); ++e) {
        const size_t at = rng() % m.size();
        switch (rng() % 3) {
          case 0: m[at] = alphabet[rng() % alphabet.size()]; break;
          case 1: m.erase(at, 1 + rng() % 8); break;
          default: m.insert(at, 1, alphabet[rng() % alphabet.size()]);
        }
      }
      try {
        render_str(m, ctx, opt);
        ++rendered;
      } catch (const ptllm::Error&) {
        ++refused;
      }
    }
  }
  EXPECT_GT(rendered + refused, 500u);
}

}  // namespace
