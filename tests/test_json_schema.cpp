// The JSON Schema to GBNF converter (src/grammar/json_schema.h): each keyword, each refusal, and
// the corpus in tests/data/json_schemas/ (random sentences of each grammar validate; hand-written
// valid instances are accepted and invalid ones rejected).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "json_schema_check.h"
#include "test_util.h"

using namespace ptllm;
using namespace ptllm::grammar;
using ptllm::test::ojson;

namespace {

std::shared_ptr<const Grammar> compile(const std::string& schema, const SchemaOptions& o = {}) {
  return Grammar::parse(json_schema_to_gbnf(ojson::parse(schema), o));
}

bool accepts(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept_string(text) && m.can_end();
}

SchemaError error_of(const std::string& schema, const SchemaOptions& o = {}) {
  try {
    json_schema_to_gbnf(ojson::parse(schema), o);
  } catch (const SchemaError& e) {
    return e;
  }
  ADD_FAILURE() << "no SchemaError for " << schema;
  return SchemaError("", "", "");
}

// Accepts each of `yes` and none of `no`.
void expect(const std::string& schema, const std::vector<std::string>& yes, const std::vector<std::string>& no) {
  auto g = compile(schema);
  for (const auto& s : yes) EXPECT_TRUE(accepts(g, s)) << schema << " should accept " << s;
  for (const auto& s : no) EXPECT_FALSE(accepts(g, s)) << schema << " should reject " << s;
}

}  // namespace

TEST(JsonSchema, Types) {
  expect(R"({"type":"string"})", {R"("")", R"("abc")", R"("a\"b\\c\/\n\t\u00e9\uD83D\uDE00")", "\"\xC3\xA9\""},
         {R"(abc)", "\"a\nb\"", R"("\x")", R"("\uD800")", R"("\uDC00\uD800")", R"(")", "1"});
  expect(R"({"type":"integer"})", {"0", "-7", "1234567890123456"}, {"01", "-", "1.5", "1e3", "\"1\"", "12345678901234567"});
  expect(R"({"type":"number"})", {"0", "-0.5", "3.25e-7", "1E+10", "42"}, {"01", ".5", "1.", "1e", "+1", "NaN"});
  expect(R"({"type":"boolean"})", {"true", "false"}, {"True", "1", "null"});
  expect(R"({"type":"null"})", {"null"}, {"nul", "0"});
  expect(R"({"type":["string","null"]})", {"null", "\"x\""}, {"1"});
  expect(R"({"type":["integer","boolean"]})", {"12", "true"}, {"1.5", "null"});
  expect(R"({})", {"{}", "[1,\"a\",null]", "true", "-2.5", R"({"a":{"b":[]}})"}, {"", "{", "nul"});
  expect(R"(true)", {"[]", "3"}, {"x"});
}

TEST(JsonSchema, ObjectModeIsAnyObject) {
  for (const std::string& gbnf : {json_object_gbnf(), json_schema_to_gbnf(ojson::parse(R"({"type":"object"})"))}) {
    auto g = Grammar::parse(gbnf);
    EXPECT_TRUE(accepts(g, "{}"));
    EXPECT_TRUE(accepts(g, R"({"a": [1, {"b": null}], "c": "d"})"));
    EXPECT_TRUE(accepts(g, "{\n  \"k\": true\n}"));
    EXPECT_FALSE(accepts(g, "[]"));
    EXPECT_FALSE(accepts(g, "\"x\""));
    EXPECT_FALSE(accepts(g, R"({"a" 1})"));
    EXPECT_FALSE(accepts(g, R"({"a":1,})"));
  }
}

TEST(JsonSchema, WhitespaceIsBounded) {
  const std::string s = R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})";
  expect(s, {R"({"a":1})", R"({ "a" : 1 })", "{\n  \"a\": 1\n}", "{\n" + std::string(19, ' ') + "\"a\":1}"},
         {R"({  "a":1})", "{\n" + std::string(20, ' ') + "\"a\":1}", "{\n\n\"a\":1}", R"( {"a":1})", R"({"a":1} )"});
  SchemaOptions compact;
  compact.max_whitespace = 0;
  auto g = compile(s, compact);
  EXPECT_TRUE(accepts(g, R"({"a":1})"));
  EXPECT_FALSE(accepts(g, R"({ "a":1})"));
}

TEST(JsonSchema, PropertiesInOrderOptionalOmitted) {
  const std::string s = R"({"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"string"},"m":{"type":"boolean"}},"required":["a"]})";
  expect(s, {R"({"a":"x"})", R"({"z":1,"a":"x"})", R"({"a":"x","m":true})", R"({"z":1,"a":"x","m":false})"},
         {R"({})", R"({"z":1})", R"({"a":"x","z":1})", R"({"m":true,"a":"x"})", R"({"a":"x","a":"y"})", R"({"a":"x",})",
          R"({,"a":"x"})", R"({"a":"x","q":1})"});
  // All optional: any subset in order, the empty object too.
  expect(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}}})",
         {"{}", R"({"a":1})", R"({"b":1})", R"({"c":1})", R"({"a":1,"c":3})", R"({"a":1,"b":2,"c":3})"},
         {R"({"b":1,"a":2})", R"({"a":1,,"c":3})", R"({"c":1,"c":1})"});
}

TEST(JsonSchema, ManyOptionalPropertiesStayCheap) {
  // 30 optional properties: the grammar is linear in their number and the matcher keeps few stacks.
  ojson s = {{"type", "object"}, {"properties", ojson::object()}};
  for (int i = 0; i < 30; ++i) s["properties"]["p" + std::to_string(i)] = {{"type", "integer"}};
  const std::string gbnf = json_schema_to_gbnf(s);
  EXPECT_LT(std::count(gbnf.begin(), gbnf.end(), '\n'), 100);
  auto g = Grammar::parse(gbnf);
  GrammarMatcher m(g);
  size_t most = 0;
  for (char c : std::string(R"({"p3": 1, "p7": 2, "p8": 3, "p29": 4})")) {
    ASSERT_TRUE(m.accept_byte(static_cast<uint8_t>(c))) << c;
    most = std::max(most, m.stack_count());
  }
  EXPECT_TRUE(m.can_end());
  EXPECT_LE(most, 40u);
}

TEST(JsonSchema, AdditionalProperties) {
  // Absent: only the declared properties are written (a valid subset; see json_schema.h).
  expect(R"({"type":"object","properties":{"a":{"type":"integer"}}})", {R"({"a":1})", "{}"}, {R"({"b":1})"});
  expect(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":false})", {R"({"a":1})"}, {R"({"a":1,"b":2})"});
  expect(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true})",
         {R"({"a":1,"b":[null]})", R"({"ab":"x"})", R"({"":1})"}, {R"({"a":"x"})", R"({"b":1,"a":1})"});
  expect(R"({"type":"object","properties":{"id":{"type":"string"}},"additionalProperties":{"type":"number"}})",
         {R"({"id":"x","n":1.5,"m":2})", R"({"i":1,"idx":2})"}, {R"({"n":"x"})", R"({"id":1})", R"({"x":1,"id":"y"})"});
  expect(R"({"type":"object","additionalProperties":{"type":"boolean"}})", {"{}", R"({"x":true,"y":false})"}, {R"({"x":1})"});
}

TEST(JsonSchema, EnumAndConst) {
  expect(R"({"enum":["red","green",3,null,{"a":[1]}]})", {R"("red")", "3", "null", R"({"a":[1]})"}, {R"("blue")", "4", R"({"a":[2]})"});
  expect(R"({"type":"string","enum":["a","b",1]})", {R"("a")"}, {"1"});
  expect(R"({"const":"fixed"})", {R"("fixed")"}, {R"("other")"});
  // Written as nlohmann::json writes it: UTF-8 as is, the escapes JSON requires.
  expect(R"({"const":"q\"\\\n\u00e9"})", {"\"q\\\"\\\\\\n\xC3\xA9\""}, {R"("q")", R"("q\"\\\n\u00e9")"});
}

TEST(JsonSchema, AnyOfOneOfAllOf) {
  expect(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]})", {"5", R"("ab")"}, {R"("abc")", "true"});
  expect(R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"a"},"x":{"type":"integer"}},"required":["kind","x"]},
                      {"type":"object","properties":{"kind":{"const":"b"},"y":{"type":"string"}},"required":["kind","y"]}]})",
         {R"({"kind":"a","x":1})", R"({"kind":"b","y":"s"})"}, {R"({"kind":"a","y":"s"})", R"({"kind":"c","x":1})"});
  expect(R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                      {"properties":{"b":{"type":"string"}},"required":["b"]}]})",
         {R"({"a":1,"b":"x"})"}, {R"({"a":1})", R"({"b":"x"})"});
  // Siblings of anyOf apply to each branch.
  expect(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"anyOf":[{"required":["a"]},{"required":["b"]}]})",
         {R"({"a":1})", R"({"b":1})", R"({"a":1,"b":2})"}, {"{}"});
  EXPECT_EQ(error_of(R"({"oneOf":[{"type":"number"},{"type":"integer"}]})").keyword, "oneOf");
  EXPECT_EQ(error_of(R"({"allOf":[{"type":"string"},{"type":"integer"}]})").keyword, "allOf");
}

TEST(JsonSchema, RefsAndRecursion) {
  const std::string list = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/node"})";
  expect(list, {R"({"v":1,"next":null})", R"({"v":1,"next":{"v":2,"next":{"v":3,"next":null}}})"},
         {R"({"v":1})", R"({"v":1,"next":{"v":2}})"});
  const std::string tree = R"({"type":"object","properties":{"name":{"type":"string"},
      "children":{"type":"array","items":{"$ref":"#"}}},"required":["name"]})";
  expect(tree, {R"({"name":"a","children":[{"name":"b"},{"name":"c","children":[]}]})"}, {R"({"name":"a","children":[1]})"});
  expect(R"({"definitions":{"pos":{"type":"integer","minimum":1}},"type":"array","items":{"$ref":"#/definitions/pos"}})",
         {"[1,2]"}, {"[0]"});
  const SchemaError e = error_of(R"({"properties":{"a":{"$ref":"#/$defs/missing"}}})");
  EXPECT_EQ(e.keyword, "$ref");
  EXPECT_EQ(e.path, "/properties/a");
  EXPECT_EQ(error_of(R"({"$ref":"https://example.com/s.json"})").keyword, "$ref");
}

TEST(JsonSchema, Arrays) {
  expect(R"({"type":"array","items":{"type":"integer"}})", {"[]", "[1]", "[1, 2,\n  3]"}, {"[1,]", "[,1]", "[\"a\"]"});
  expect(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})", {"[1,2]", "[1,2,3]"}, {"[1]", "[1,2,3,4]", "[]"});
  expect(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}]})", {"[]", R"(["a"])", R"(["a",1])"},
         {R"([1])", R"(["a",1,2])"});
  expect(R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"boolean"},"minItems":2})",
         {R"(["a",true])", R"(["a",true,false])"}, {R"(["a"])", R"(["a",1])"});
  expect(R"({"type":"array","items":[{"type":"integer"}],"additionalItems":false})", {"[1]", "[]"}, {"[1,2]"});
  expect(R"({"type":"array"})", {"[]", R"([1,"x",{"a":null}])"}, {"{}"});
  expect(R"({"type":"array","maxItems":0})", {"[]"}, {"[1]"});
}

TEST(JsonSchema, StringLengthsCountCodePoints) {
  // An escape is one character; so is a surrogate pair and a multi-byte UTF-8 character.
  expect(R"({"type":"string","minLength":2,"maxLength":3})",
         {R"("ab")", R"("abc")", R"("\n\t")", "\"\xC3\xA9\xE4\xB8\xAD\"", R"("\uD83D\uDE00x")", "\"\xF0\x9F\x98\x80z\""},
         {R"("a")", R"("abcd")", R"("\n")", "\"\xC3\xA9\"", R"("\u00e9\u00e9\u00e9\u00e9")"});
  expect(R"({"type":"string","maxLength":0})", {R"("")"}, {R"("a")"});
}

TEST(JsonSchema, Patterns) {
  expect(R"({"type":"string","pattern":"^[a-z]+(-[a-z0-9]+)*$"})", {R"("ab")", R"("ab-c1-d")"}, {R"("")", R"("Ab")", R"("ab-")"});
  expect(R"({"type":"string","pattern":"^\\d{3}-\\d{4}$"})", {R"("555-1234")"}, {R"("55-1234")", R"("555-12345")"});
  // Unanchored: anything around a match.
  expect(R"({"type":"string","pattern":"ab"})", {R"("ab")", R"("xxaby")"}, {R"("a b")"});
  expect(R"({"type":"string","pattern":"^(?:foo|ba[rz])?x{2,}$"})", {R"("xx")", R"("fooxxx")", R"("bazxx")"}, {R"("foox")", R"("barx")"});
  // Characters JSON escapes: a quote in the class is written \", a newline \n.
  expect(R"({"type":"string","pattern":"^[^a]$"})", {R"("\"")", R"("\n")", R"("b")", "\"\xC3\xA9\""}, {R"("a")", R"("")"});
  expect(R"({"type":"string","pattern":"^.$"})", {R"("x")", R"("\t")"}, {R"("\n")", R"("\r")", R"("xy")"});
  expect(R"({"type":"string","pattern":"^\\w+@\\w+\\.com$"})", {R"("a_1@b.com")"}, {R"("a@b.org")"});
  expect(R"({"type":"string","pattern":"^[\\u0041-\\u0043\\s]+$"})", {R"("AB C")", R"("A\tC")"}, {R"("D")"});
  // With length bounds: patterns whose matches all fit, or one class repeated.
  expect(R"({"type":"string","pattern":"^[a-z]+$","maxLength":4})", {R"("a")", R"("abcd")"}, {R"("")", R"("abcde")", R"("aB")"});
  expect(R"({"type":"string","pattern":"^\\d*$","minLength":2,"maxLength":3})", {R"("12")", R"("123")"}, {R"("1")", R"("1234")"});
  expect(R"({"type":"string","pattern":"^[A-Z]{2,3}$","maxLength":3})", {R"("AB")", R"("ABC")"}, {R"("A")"});
  expect(R"({"type":"string","pattern":"^[a-z]{5,}$","maxLength":6})", {R"("abcde")", R"("abcdef")"}, {R"("abcd")", R"("abcdefg")"});
  EXPECT_EQ(error_of(R"({"type":"string","pattern":"^a+b$","maxLength":4})").keyword, "maxLength");
  EXPECT_EQ(error_of(R"({"type":"string","pattern":"^([a-z]+){2}$","maxLength":4})").keyword, "maxLength");
  expect(R"({"type":"string","pattern":"^([a-z]+)$","maxLength":2})", {R"("ab")"}, {R"("abc")"});
  EXPECT_EQ(error_of(R"({"type":"string","pattern":"[a-z]+","maxLength":4})").keyword, "maxLength");
  EXPECT_EQ(error_of(R"({"type":"string","pattern":"^[a-z]{5}$","maxLength":4})").keyword, "maxLength");
  EXPECT_EQ(error_of(R"({"type":"string","pattern":"^[a-z]+$","minLength":3000})").keyword, "minLength");
  for (const char* bad : {R"((?=a))", R"((?<n>a))", R"(a\1)", R"(\bword)", R"(a^b)", R"(a$b)", R"(\p{L})", R"([[:alpha:]])", R"(a{2)", R"(*a)"}) {
    ojson s = {{"type", "string"}, {"pattern", bad}};
    try {
      json_schema_to_gbnf(s);
      ADD_FAILURE() << "accepted pattern " << bad;
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.keyword, "pattern") << bad;
      EXPECT_NE(std::string(e.what()).find("\"pattern\""), std::string::npos) << e.what();
    }
  }
}

TEST(JsonSchema, Formats) {
  expect(R"({"type":"string","format":"date"})", {R"("2024-02-29")", R"("2000-02-29")", R"("2023-12-31")", R"("2023-04-30")"},
         {R"("2023-02-29")", R"("1900-02-29")", R"("2023-04-31")", R"("2023-13-01")", R"("2023-00-10")", R"("2023-1-01")"});
  expect(R"({"type":"string","format":"time"})", {R"("23:59:59Z")", R"("00:00:00.123+05:30")"},
         {R"("24:00:00Z")", R"("12:60:00Z")", R"("12:00:00")"});
  expect(R"({"type":"string","format":"date-time"})", {R"("2024-01-15T08:30:00Z")", R"("2024-01-15T08:30:00.5-07:00")"},
         {R"("2024-01-15 08:30:00Z")", R"("2024-01-15")"});
  expect(R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567e89b12d3a456426614174000")"});
  expect(R"({"type":"string","format":"email"})", {R"("a.b+c@example.co.uk")"}, {R"("a@b")", R"("@b.com")", R"("a@-b.com")"});
  EXPECT_EQ(error_of(R"({"type":"string","format":"uri"})").keyword, "format");
  // Length bounds that the format implies are accepted; others refused.
  expect(R"({"type":"string","format":"date-time","maxLength":40})", {R"("2024-01-15T08:30:00.123456+01:00")"}, {R"("x")"});
  expect(R"({"type":"string","format":"uuid","minLength":36,"maxLength":36})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {});
  EXPECT_EQ(error_of(R"({"type":"string","format":"date-time","maxLength":25})").keyword, "maxLength");
  EXPECT_EQ(error_of(R"({"type":"string","format":"email","maxLength":254})").keyword, "maxLength");
}

TEST(JsonSchema, IntegerRangesAreExact) {
  struct Case {
    std::string bounds;
    int64_t lo, hi;
  };
  const std::vector<Case> cases = {
      {R"("minimum":0,"maximum":100)", 0, 100},       {R"("minimum":-37,"maximum":1234)", -37, 1234},
      {R"("minimum":-999,"maximum":-10)", -999, -10}, {R"("exclusiveMinimum":5,"exclusiveMaximum":19)", 6, 18},
      {R"("minimum":7)", 7, INT64_MAX},                {R"("maximum":-3)", INT64_MIN, -3},
      {R"("minimum":1.5,"maximum":9.9)", 2, 9},       {R"("minimum":5,"exclusiveMinimum":true,"maximum":10)", 6, 10},
      {R"("minimum":100,"maximum":100)", 100, 100},   {R"("minimum":1,"maximum":1000000)", 1, 1000000},
  };
  for (const auto& c : cases) {
    auto g = compile(R"({"type":"integer",)" + c.bounds + "}");
    for (int64_t v = -1500; v <= 1500; ++v)
      ASSERT_EQ(accepts(g, std::to_string(v)), v >= c.lo && v <= c.hi) << c.bounds << " value " << v;
    std::vector<int64_t> probes = {999999, 1000001, -1000001, 123456789012345, -123456789012345};
    if (c.lo != INT64_MIN) probes.insert(probes.end(), {c.lo, c.lo - 1});
    if (c.hi != INT64_MAX) probes.insert(probes.end(), {c.hi, c.hi + 1});
    for (int64_t v : probes)
      EXPECT_EQ(accepts(g, std::to_string(v)), v >= c.lo && v <= c.hi) << c.bounds << " value " << v;
    EXPECT_FALSE(accepts(g, "01"));
    EXPECT_FALSE(accepts(g, "-0"));
  }
  EXPECT_EQ(error_of(R"({"type":"integer","minimum":10,"maximum":5})").keyword, "minimum");
}

TEST(JsonSchema, NumberRangesAreExact) {
  struct Case {
    std::string bounds;
    double lo, hi;
    bool lo_ex, hi_ex;
  };
  const double inf = 1e300;
  const std::vector<Case> cases = {
      {R"("minimum":0)", 0, inf, false, false},
      {R"("minimum":0,"maximum":1)", 0, 1, false, false},
      {R"("exclusiveMinimum":0,"maximum":100)", 0, 100, true, false},
      {R"("minimum":-5,"exclusiveMaximum":5)", -5, 5, false, true},
      {R"("exclusiveMinimum":-3,"exclusiveMaximum":-1)", -3, -1, true, true},
      {R"("maximum":-2)", -inf, -2, false, false},
      {R"("exclusiveMaximum":0)", -inf, 0, false, true},
      {R"("minimum":7,"maximum":7)", 7, 7, false, false},
      {R"("minimum":2,"exclusiveMinimum":true,"maximum":4,"exclusiveMaximum":true)", 2, 4, true, true},
      {R"("minimum":-12,"maximum":40,"exclusiveMinimum":-12)", -12, 40, true, false},
  };
  std::vector<std::string> probes = {"0", "-0", "0.0", "-0.0", "0.5", "-0.5", "1e2", "0.000001", "-0.000001"};
  for (int i = -45; i <= 105; ++i) {
    probes.push_back(std::to_string(i));
    for (const char* f : {".0", ".00", ".25", ".5", ".999999", ".000001", ".0000000000001"}) probes.push_back(std::to_string(i) + f);
  }
  for (const auto& c : cases) {
    auto g = compile(R"({"type":"number",)" + c.bounds + "}");
    for (const auto& p : probes) {
      const double v = std::stod(p);
      const bool want = p.find('e') == std::string::npos && (c.lo_ex ? v > c.lo : v >= c.lo) && (c.hi_ex ? v < c.hi : v <= c.hi);
      // Never an invalid value; every valid one with up to 6 decimals (the grammar bounds the
      // digits to 15 significant ones), except the spelling "-0" of zero.
      const size_t dot = p.find('.');
      const bool short_form = dot == std::string::npos || p.size() - dot - 1 <= 6;
      if (accepts(g, p)) EXPECT_TRUE(want) << c.bounds << " accepts " << p;
      else EXPECT_FALSE(want && short_form && !(p.rfind("-0", 0) == 0 && v == 0)) << c.bounds << " rejects " << p;
    }
  }
  EXPECT_EQ(error_of(R"({"type":"number","minimum":0.5})").keyword, "minimum");
  EXPECT_EQ(error_of(R"({"type":"number","exclusiveMaximum":1.25})").keyword, "exclusiveMaximum");
  EXPECT_EQ(error_of(R"({"type":"number","minimum":3,"maximum":2})").keyword, "minimum");
}

TEST(JsonSchema, MetadataIgnoredUnknownRefused) {
  expect(R"({"$schema":"https://json-schema.org/draft/2020-12/schema","$id":"x","title":"T","description":"D",
             "examples":[1],"default":1,"$comment":"c","deprecated":true,"readOnly":true,"writeOnly":false,"type":"integer"})",
         {"1"}, {"\"1\""});
  for (const char* kw : {"patternProperties", "not", "if", "uniqueItems", "multipleOf", "minProperties", "maxProperties",
                         "contains", "propertyNames", "dependentRequired", "unevaluatedProperties", "nullable", "$anchor"}) {
    ojson s = {{"type", "object"}, {"properties", {{"a", {{"type", "string"}, {kw, 1}}}}}};
    const SchemaError e = error_of(s.dump());
    EXPECT_EQ(e.keyword, kw);
    EXPECT_EQ(e.path, "/properties/a");
    EXPECT_EQ(std::string(e.what()), std::string("unsupported JSON Schema keyword \"") + kw + "\" at /properties/a");
  }
}

TEST(JsonSchema, MalformedKeywordValuesAreSchemaErrors) {
  // Each wrong-typed keyword value is a SchemaError naming the keyword, never another exception.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"x({"type":5})x", "type"},
      {R"x({"type":[]})x", "type"},
      {R"x({"type":["string",3]})x", "type"},
      {R"x({"type":"object","properties":5})x", "properties"},
      {R"x({"type":"object","properties":{"a":{}},"required":"a"})x", "required"},
      {R"x({"type":"object","properties":{"a":{}},"required":[1]})x", "required"},
      {R"x({"type":"object","required":{"a":1}})x", "required"},
      {R"x({"type":"object","properties":{"a":5}})x", ""},
      {R"x({"type":"object","additionalProperties":5})x", "additionalProperties"},
      {R"x({"enum":3})x", "enum"},
      {R"x({"enum":[]})x", "enum"},
      {R"x({"anyOf":{}})x", "anyOf"},
      {R"x({"oneOf":[]})x", "oneOf"},
      {R"x({"allOf":[5]})x", "allOf"},
      {R"x({"allOf":{}})x", "allOf"},
      {R"x({"$ref":5})x", "$ref"},
      {R"x({"$ref":"#/no/such"})x", "$ref"},
      {R"x({"$ref":"#/$defs/a~"})x", "$ref"},
      {R"x({"type":"array","prefixItems":5})x", "prefixItems"},
      {R"x({"type":"array","items":5})x", ""},
      {R"x({"type":"array","minItems":"2"})x", "minItems"},
      {R"x({"type":"array","maxItems":-1})x", "maxItems"},
      {R"x({"type":"array","minItems":3,"maxItems":2})x", "minItems"},
      {R"x({"type":"string","minLength":1.5})x", "minLength"},
      {R"x({"type":"string","maxLength":null})x", "maxLength"},
      {R"x({"type":"string","pattern":5})x", "pattern"},
      {R"x({"type":"string","pattern":"(a"})x", "pattern"},
      {R"x({"type":"string","pattern":"[a"})x", "pattern"},
      {R"x({"type":"string","pattern":"a)"})x", "pattern"},
      {R"x({"type":"string","pattern":"[z-a]"})x", "pattern"},
      {R"x({"type":"string","pattern":"a{3,1}"})x", "pattern"},
      {R"x({"type":"string","pattern":"\\u{110000}"})x", "pattern"},
      {R"x({"type":"string","format":5})x", "format"},
      {R"x({"type":"integer","minimum":"0"})x", "minimum"},
      {R"x({"type":"number","maximum":true})x", "maximum"},
      {R"x({"type":"integer","minimum":1e300})x", "minimum"},
      {R"x({"const":1,"enum":[1]})x", "const"},
      {R"x({"enum":["a"],"minLength":1})x", "minLength"},
      {R"x(5)x", ""},
      {R"x("string")x", ""},
  };
  for (const auto& [schema, keyword] : cases) {
    try {
      json_schema_to_gbnf(ojson::parse(schema));
      ADD_FAILURE() << "accepted " << schema;
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.keyword, keyword) << schema << ": " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << schema << " threw another exception: " << e.what();
    }
  }
}

TEST(JsonSchema, BoundsOnSizeAndDepth) {
  SchemaOptions small;
  small.max_rules = 50;
  ojson s = {{"type", "object"}, {"properties", ojson::object()}};
  for (int i = 0; i < 100; ++i) s["properties"]["p" + std::to_string(i)] = {{"type", "string"}, {"maxLength", i + 1}};
  EXPECT_EQ(error_of(s.dump(), small).keyword, "max_rules");
  std::string deep = R"({"type":"integer"})";
  for (int i = 0; i < 100; ++i) deep = R"({"type":"array","items":)" + deep + "}";
  const SchemaError e = error_of(deep);
  EXPECT_EQ(e.keyword, "max_depth");
  EXPECT_NE(std::string(e.what()).find("deeper than 64"), std::string::npos);
  EXPECT_EQ(error_of(R"({"type":"string","maxLength":5000000})").keyword, "maxLength");
  small.max_rules = 1500;
  EXPECT_EQ(error_of(R"({"type":"string","maxLength":100000})", small).keyword, "max_rules");
}

TEST(JsonSchema, LargeCountsAreExact) {
  // Counts above the GBNF parser's {m,n} bound are built from chunks of 1000.
  for (auto [lo, hi] : std::vector<std::pair<int, int>>{{0, 2500}, {1001, 3003}, {2000, 2000}, {1500, -1}, {0, 1999}, {999, 1001}}) {
    ojson s = {{"type", "string"}};
    if (lo) s["minLength"] = lo;
    if (hi >= 0) s["maxLength"] = hi;
    auto g = Grammar::parse(json_schema_to_gbnf(s));
    const int top = hi >= 0 ? hi : lo + 1200;
    for (int n : {0, 1, 998, 999, 1000, 1001, 1002, 1499, 1500, 1501, 1998, 1999, 2000, 2001, 2499, 2500, 2501, 3002, 3003, 3004}) {
      if (n > top + 1) continue;
      const bool want = n >= lo && (hi < 0 || n <= hi);
      EXPECT_EQ(accepts(g, "\"" + std::string(static_cast<size_t>(n), 'a') + "\""), want) << lo << ".." << hi << " length " << n;
    }
  }
  auto g = compile(R"({"type":"array","items":{"type":"integer"},"minItems":1200,"maxItems":2100})");
  auto arr = [](int n) {
    std::string t = "[";
    for (int i = 0; i < n; ++i) t += i ? ",1" : "1";
    return t + "]";
  };
  EXPECT_FALSE(accepts(g, arr(1199)));
  EXPECT_TRUE(accepts(g, arr(1200)));
  EXPECT_TRUE(accepts(g, arr(2100)));
  EXPECT_FALSE(accepts(g, arr(2101)));
}

TEST(JsonSchema, BuilderCombinesSchemas) {
  SchemaGrammarBuilder b;
  const std::string weather = b.add(ojson::parse(R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})"), "weather");
  const std::string sum = b.add(ojson::parse(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"]})"), "sum");
  const std::string ws = b.whitespace();
  b.add_rule("root", "\"<tool_call>\" ( \"{\\\"name\\\": \\\"weather\\\", \\\"arguments\\\": \" " + weather +
                         " | \"{\\\"name\\\": \\\"sum\\\", \\\"arguments\\\": \" " + sum + " ) " + ws + " \"}</tool_call>\"");
  auto g = Grammar::parse(b.gbnf());
  EXPECT_TRUE(accepts(g, R"(<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>)"));
  EXPECT_TRUE(accepts(g, R"(<tool_call>{"name": "sum", "arguments": {"a": 1, "b": 2}}</tool_call>)"));
  EXPECT_FALSE(accepts(g, R"(<tool_call>{"name": "sum", "arguments": {"city": "Paris"}}</tool_call>)"));
  // A refused schema leaves the builder as it was.
  const std::string before = b.gbnf();
  EXPECT_THROW(b.add(ojson::parse(R"({"type":"object","properties":{"x":{"not":{}}}})"), "bad"), SchemaError);
  EXPECT_EQ(b.gbnf(), before);
  // Taken names get a suffix.
  EXPECT_EQ(b.add_rule("root", "\"x\""), "root-2");
  EXPECT_EQ(b.add_rule("tool_call", "\"x\""), "tool_call");
  EXPECT_EQ(b.add_rule("a b", "\"x\""), "a-b");
  // A caller's rule named like a shared one is not taken for it.
  SchemaGrammarBuilder c;
  c.add_rule("ws", "\"WS\"");
  c.add_rule("string", "\"S\"");
  const std::string r = c.add(ojson::parse(R"({"type":"array","items":{"type":"string"}})"), "list");
  c.add_rule("root", r);
  auto g2 = Grammar::parse(c.gbnf());
  EXPECT_TRUE(accepts(g2, R"([ "a", "b" ])"));
  EXPECT_FALSE(accepts(g2, "[WSS]"));
}

TEST(JsonSchema, EdgeCases) {
  // A property whose schema is false never appears.
  expect(R"({"type":"object","properties":{"a":false,"b":{"type":"integer"}}})", {R"({"b":1})", "{}"}, {R"({"a":1})"});
  EXPECT_EQ(error_of(R"({"type":"object","properties":{"a":false},"required":["a"]})").keyword, "required");
  // A reference cycle that writes nothing.
  EXPECT_EQ(error_of(R"({"$ref":"#"})").keyword, "$ref");
  EXPECT_EQ(error_of(R"({"anyOf":[{"$ref":"#"},{"type":"null"}]})").keyword, "$ref");
  EXPECT_EQ(error_of(R"({"type":"strin"})").keyword, "type");
  // Required keys that properties lacks: any value, or additionalProperties' schema.
  expect(R"({"type":"object","required":["a"]})", {R"({"a":[1,{"b":null}]})", R"({"a":1})"}, {"{}", R"({"b":1})"});
  expect(R"({"type":"object","properties":{"x":{"type":"integer"}},"required":["id","x"],"additionalProperties":{"type":"string"}})",
         {R"({"x":1,"id":"s"})", R"({"x":1,"id":"s","more":"t"})"}, {R"({"x":1,"id":2})", R"({"x":1})"});
  EXPECT_EQ(error_of(R"({"type":"object","properties":{"x":{}},"required":["y"],"additionalProperties":false})").keyword, "required");
  EXPECT_EQ(error_of(R"(false)").keyword, "false");
}

namespace {

std::filesystem::path corpus_dir() { return test::repo_dir() / "tests" / "data" / "json_schemas"; }

std::vector<std::filesystem::path> corpus_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.path().extension() == ".json" && e.path().string().find("/unsupported/") == std::string::npos) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

ojson read_ojson(const std::filesystem::path& p) {
  std::ifstream f(p);
  return ojson::parse(f);
}

}  // namespace

// Every corpus schema converts; its random sentences parse and validate; its known valid instances
// (compact and indented) are accepted and its invalid ones rejected, byte by byte.
TEST(JsonSchemaCorpus, SupportedSchemas) {
  const auto files = corpus_files(corpus_dir());
  ASSERT_GE(files.size(), 200u);
  size_t sentences = 0;
  for (const auto& path : files) {
    SCOPED_TRACE(path.filename().string());
    const ojson doc = read_ojson(path);
    ASSERT_TRUE(doc.contains("schema"));
    const ojson& schema = doc["schema"];
    std::shared_ptr<const Grammar> g;
    try {
      g = Grammar::parse(json_schema_to_gbnf(schema));
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    const test::SchemaChecker checker(schema);
    for (const auto& v : doc.value("valid", ojson::array())) {
      ASSERT_EQ(checker.check(v), "") << v.dump();
      EXPECT_TRUE(accepts(g, v.dump())) << v.dump();
      EXPECT_TRUE(accepts(g, v.dump(2))) << v.dump(2);
    }
    for (const auto& v : doc.value("invalid", ojson::array())) {
      EXPECT_NE(checker.check(v), "") << "corpus says invalid but it validates: " << v.dump();
      EXPECT_FALSE(accepts(g, v.dump())) << v.dump();
    }
    for (const auto& t : doc.value("invalid_text", ojson::array())) EXPECT_FALSE(accepts(g, t.get<std::string>())) << t;
    test::GrammarSampler sampler(g);
    std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(path.filename().string())));
    for (int i = 0; i < 40; ++i) {
      const std::string text = sampler.sample(rng, 60 + static_cast<size_t>(i) * 10);
      ASSERT_TRUE(accepts(g, text)) << "the matcher rejects a sentence of its grammar: " << text;
      ojson v;
      try {
        v = ojson::parse(text);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "not JSON: " << text << ": " << e.what();
        continue;
      }
      EXPECT_EQ(checker.check(v), "") << text;
      ++sentences;
    }
  }
  EXPECT_GT(sentences, 8000u);
}

// Each schema of unsupported/ is refused, naming the keyword its file names.
TEST(JsonSchemaCorpus, UnsupportedSchemasAreRefused) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(corpus_dir() / "unsupported")) {
    if (e.path().extension() != ".json") continue;
    SCOPED_TRACE(e.path().filename().string());
    const ojson doc = read_ojson(e.path());
    try {
      json_schema_to_gbnf(doc["schema"]);
      ADD_FAILURE() << "accepted";
    } catch (const SchemaError& err) {
      EXPECT_EQ(err.keyword, doc["keyword"].get<std::string>()) << err.what();
    }
    ++n;
  }
  EXPECT_GE(n, 10u);
}
