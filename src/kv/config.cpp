#include "kv/config.h"

#include <algorithm>
#include <charconv>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace ptllm {

std::string_view kv_precision_name(KVPrecision p) {
  switch (p) {
    case KVPrecision::F32: return "fp32";
    case KVPrecision::F16: return "fp16";
    case KVPrecision::BF16: return "bf16";
    case KVPrecision::Int8: return "int8";
    case KVPrecision::Int4: return "int4";
    case KVPrecision::Int2: return "int2";
  }
  return "?";
}

std::optional<KVPrecision> parse_kv_precision(std::string_view s) {
  for (KVPrecision p : {KVPrecision::F32, KVPrecision::F16, KVPrecision::BF16, KVPrecision::Int8, KVPrecision::Int4,
                        KVPrecision::Int2})
    if (s == kv_precision_name(p)) return p;
  return std::nullopt;
}

int kivi_bits(KVPrecision p) {
  switch (p) {
    case KVPrecision::Int8: return 8;
    case KVPrecision::Int4: return 4;
    case KVPrecision::Int2: return 2;
    default: return 0;
  }
}

DType dense_dtype(KVPrecision p) {
  switch (p) {
    case KVPrecision::F16: return DType::F16;
    case KVPrecision::BF16: return DType::BF16;
    default: return DType::F32;
  }
}

std::string_view position_mode_name(PositionMode m) { return m == PositionMode::Cache ? "cache" : "absolute"; }

PositionMode default_positions(const KVCacheConfig& c) {
  return c.streaming() ? PositionMode::Cache : PositionMode::Absolute;
}

void KVCacheConfig::validate() const {
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw UsageError(msg);
  };
  need(group_size >= 1 && group_size <= 4096, "--kv-group-size must be between 1 and 4096");
  need(!is_kivi(precision) || (residual >= 0 && residual % group_size == 0),
       "--kv-residual (" + std::to_string(residual) + ") must be a non-negative multiple of --kv-group-size (" +
           std::to_string(group_size) + ")");
  need(sink >= 0, "--streaming-llm-sink must not be negative");
  need(window >= 0, "--streaming-llm-window must not be negative");
  need(sink == 0 || window > 0, "--streaming-llm-sink needs --streaming-llm-window M > 0");
  need(ctx_size > 0, "--ctx-size must be positive");
  need(!streaming() || sink < ctx_size,
       "--streaming-llm-sink (" + std::to_string(sink) + ") must be smaller than --ctx-size (" +
           std::to_string(ctx_size) + ")");
}

std::string KVCacheConfig::describe() const {
  std::string s(kv_precision_name(precision));
  if (is_kivi(precision)) s += " g" + std::to_string(group_size) + " r" + std::to_string(residual);
  if (streaming()) s += " sink" + std::to_string(sink) + " w" + std::to_string(window);
  // Cache positions always named; absolute ones where they are not the default (under StreamingLLM),
  // so that the text parses back to these settings.
  if (positions == PositionMode::Cache) s += " pos=cache";
  else if (streaming()) s += " pos=absolute";
  return s;
}

bool KVShape::any_shared() const {
  for (int l = 0; l < int(kv_source.size()); ++l)
    if (kv_source[size_t(l)] != l) return true;
  return false;
}

bool KVShape::any_window() const {
  return std::any_of(layer_window.begin(), layer_window.end(), [](int w) { return w > 0; });
}

namespace {

enum class TokenForm {
  Word,    // exactly the key: "fp32"
  Number,  // the key then digits: "g32", "sink4"
  Value,   // the key then a word: "pos=cache"
};

struct SpecArg {
  std::string_view token;  // as written
  std::string_view text;   // what follows the key
  int number = 0;          // TokenForm::Number
};

// One token form of a cache spec; a new cache option is one more row. apply returns false for a
// value it does not accept; KVCacheConfig::validate() checks the combination afterwards.
struct SpecToken {
  std::string_view key;
  TokenForm form;
  std::string_view usage;    // for the list of known tokens
  std::string_view setting;  // two tokens that set the same setting conflict
  bool (*apply)(KVCacheConfig&, const SpecArg&);
};

constexpr auto set_precision = [](KVCacheConfig& c, const SpecArg& a) {
  c.precision = *parse_kv_precision(a.token);  // the rows below are exactly the precision names
  return true;
};

constexpr SpecToken kSpecTokens[] = {
    {"fp32", TokenForm::Word, "fp32", "precision", set_precision},
    {"fp16", TokenForm::Word, "fp16", "precision", set_precision},
    {"bf16", TokenForm::Word, "bf16", "precision", set_precision},
    {"int8", TokenForm::Word, "int8", "precision", set_precision},
    {"int4", TokenForm::Word, "int4", "precision", set_precision},
    {"int2", TokenForm::Word, "int2", "precision", set_precision},
    {"g", TokenForm::Number, "g<N>", "group size",
     [](KVCacheConfig& c, const SpecArg& a) { return c.group_size = a.number, true; }},
    {"r", TokenForm::Number, "r<N>", "residual",
     [](KVCacheConfig& c, const SpecArg& a) { return c.residual = a.number, true; }},
    {"sink", TokenForm::Number, "sink<N>", "sink", [](KVCacheConfig& c, const SpecArg& a) { return c.sink = a.number, true; }},
    {"w", TokenForm::Number, "w<N>", "window", [](KVCacheConfig& c, const SpecArg& a) { return c.window = a.number, true; }},
    {"pos=", TokenForm::Value, "pos=absolute|cache", "positions",
     [](KVCacheConfig& c, const SpecArg& a) {
       if (a.text != "absolute" && a.text != "cache") return false;
       c.positions = a.text == "cache" ? PositionMode::Cache : PositionMode::Absolute;
       return true;
     }},
};

std::string known_tokens() {
  std::string s;
  for (const auto& t : kSpecTokens) (s += s.empty() ? "" : " ") += t.usage;
  return s;
}

// The row a token matches, with its argument filled in; nullptr when none does.
const SpecToken* match_token(std::string_view tok, SpecArg& arg) {
  arg.token = tok;
  for (const auto& t : kSpecTokens) {
    if (t.form == TokenForm::Word) {
      if (tok == t.key) return &t;
      continue;
    }
    if (!tok.starts_with(t.key) || tok.size() == t.key.size()) continue;
    arg.text = tok.substr(t.key.size());
    if (t.form == TokenForm::Value) return &t;
    if (!std::all_of(arg.text.begin(), arg.text.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    auto [end, ec] = std::from_chars(arg.text.data(), arg.text.data() + arg.text.size(), arg.number);
    if (ec != std::errc() || end != arg.text.data() + arg.text.size())
      throw UsageError("the number in '" + std::string(tok) + "' is too large");
    return &t;
  }
  return nullptr;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }


}  // namespace

std::string kv_config_tokens() { return known_tokens(); }

KVCacheConfig parse_kv_config(std::string_view text, const KVCacheConfig& base) {
  KVCacheConfig out = base;
  std::vector<std::pair<std::string_view, std::string_view>> set;  // (setting, token that set it)
  size_t i = 0;
  while (i < text.size()) {
    if (is_space(text[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && !is_space(text[j])) ++j;
    const std::string_view tok = text.substr(i, j - i);
    i = j;
    SpecArg arg;
    const SpecToken* t = match_token(tok, arg);
    if (!t) throw UsageError("unknown token '" + std::string(tok) + "' (known: " + known_tokens() + ")");
    for (const auto& [setting, by] : set)
      if (setting == t->setting)
        throw UsageError("'" + std::string(tok) + "' sets the " + std::string(setting) + " already set by '" +
                         std::string(by) + "'");
    set.emplace_back(t->setting, tok);
    if (!t->apply(out, arg))
      throw UsageError("bad value in '" + std::string(tok) + "' (expected " + std::string(t->usage) + ")");
  }
  // A text is self-contained: without pos=, the default for its window applies.
  if (std::none_of(set.begin(), set.end(), [](const auto& s) { return s.first == "positions"; }))
    out.positions = default_positions(out);
  return out;
}

}  // namespace ptllm
