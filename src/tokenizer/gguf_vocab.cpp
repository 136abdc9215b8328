#include "tokenizer/gguf_vocab.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <functional>
#include <set>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {

using nlohmann::json;

namespace {

const char* const kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}
json split(const std::string& regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
}
json sequence(std::vector<json> steps) { return {{"type", "Sequence"}, {"pretokenizers", std::move(steps)}}; }

// What a tokenizer.ggml.pre name stands for: the normalizer and pre-tokenizer of its models'
// tokenizer.json (the regexes as llama.cpp's llama-vocab.cpp and the models' own files write them).
struct PreTokenizerSpec {
  std::vector<std::string> names;  // the first is what the writer records
  json normalizer;                 // null: none
  json pre_tokenizer;
  bool ignore_merges = false;  // Llama 3: a word that is a token is not split
};

const std::vector<PreTokenizerSpec>& specs() {
  static const std::vector<PreTokenizerSpec> s = [] {
    const std::string llama3 =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    const std::string qwen2 =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    std::vector<PreTokenizerSpec> v;
    v.push_back({{"gpt-2", "default", "gpt2"}, nullptr, byte_level(true)});
    v.push_back({{"llama-bpe", "llama3"}, nullptr, sequence({split(llama3), byte_level(false)}), true});
    v.push_back({{"qwen2"}, {{"type", "NFC"}}, sequence({split(qwen2), byte_level(false)})});
    v.push_back({{"smollm"}, nullptr,
                 sequence({{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)})});
    v.push_back({{"deepseek-llm"}, nullptr,
                 sequence({split("[\r\n]"),
                           split("\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"),
                           split("\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+"), split("\\s+$"), split("[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"),
                           split("\\p{N}+"), byte_level(false)})});
    v.push_back({{"deepseek-v3"}, nullptr,
                 sequence({split("\\p{N}{1,3}"), split("[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"),
                           split("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
                                 " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
                           byte_level(false)})});
    return v;
  }();
  return s;
}

const PreTokenizerSpec* find_spec(const std::string& name) {
  for (const auto& s : specs())
    if (std::find(s.names.begin(), s.names.end(), name) != s.names.end()) return &s;
  return nullptr;
}

[[noreturn]] void fail(const GgufVocab& v, const std::string& key, const std::string& what) {
  throw Error(v.source + ": metadata '" + key + "': " + what);
}

GgufTokenType type_of(const GgufVocab& v, size_t id) {
  return v.types.empty() ? GgufTokenType::Normal : GgufTokenType(v.types[id]);
}

std::string token_at(const GgufVocab& v, std::optional<int32_t> id) { return v.tokens[size_t(*id)]; }

// Merges of a SentencePiece vocabulary from its scores, as transformers' SentencePieceExtractor
// orders them: each piece's splits into two pieces (sorted by the pieces' ids), then all of them by
// the piece's score, highest first (a stable sort: equal scores keep id order).
std::vector<std::string> spm_merges(const GgufVocab& v) {
  std::map<std::string, int32_t, std::less<>> ids;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const GgufTokenType t = type_of(v, i);
    if (t == GgufTokenType::Normal || t == GgufTokenType::UserDefined) ids.emplace(v.tokens[i], int32_t(i));
  }
  struct M {
    int32_t l, r;
    float score;
  };
  std::vector<M> all;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (type_of(v, i) != GgufTokenType::Normal) continue;
    const std::string& piece = v.tokens[i];
    std::vector<M> local;
    for (size_t k = 1; k < piece.size(); ++k) {
      auto l = ids.find(std::string_view(piece).substr(0, k));
      if (l == ids.end()) continue;
      auto r = ids.find(std::string_view(piece).substr(k));
      if (r == ids.end()) continue;
      local.push_back({l->second, r->second, v.scores.empty() ? 0.f : v.scores[i]});
    }
    std::sort(local.begin(), local.end(), [](const M& a, const M& b) { return a.l != b.l ? a.l < b.l : a.r < b.r; });
    all.insert(all.end(), local.begin(), local.end());
  }
  std::stable_sort(all.begin(), all.end(), [](const M& a, const M& b) { return a.score > b.score; });
  std::vector<std::string> out;
  out.reserve(all.size());
  for (const M& m : all) out.push_back(v.tokens[size_t(m.l)] + " " + v.tokens[size_t(m.r)]);
  return out;
}

}  // namespace

const std::vector<std::string>& gguf_pre_tokenizer_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& s : specs()) n.insert(n.end(), s.names.begin(), s.names.end());
    return n;
  }();
  return names;
}

GgufTokenizerJson gguf_vocab_to_json(const GgufVocab& v) {
  const size_t n = v.tokens.size();
  if (n == 0) fail(v, "tokenizer.ggml.tokens", "missing or empty");
  if (!v.scores.empty() && v.scores.size() != n)
    fail(v, "tokenizer.ggml.scores", std::to_string(v.scores.size()) + " entries for " + std::to_string(n) + " tokens");
  if (!v.types.empty() && v.types.size() != n)
    fail(v, "tokenizer.ggml.token_type", std::to_string(v.types.size()) + " entries for " + std::to_string(n) + " tokens");
  for (size_t i = 0; i < v.types.size(); ++i)
    if (v.types[i] < 0 || v.types[i] > 6)
      fail(v, "tokenizer.ggml.token_type", "entry " + std::to_string(i) + " is " + std::to_string(v.types[i]) + " (0..6)");
  for (const auto& [key, id] : {std::pair<const char*, std::optional<int32_t>>{"bos_token_id", v.bos},
                                {"eos_token_id", v.eos}, {"eot_token_id", v.eot},
                                {"unknown_token_id", v.unk}, {"padding_token_id", v.pad}})
    if (id && (*id < 0 || size_t(*id) >= n))
      fail(v, std::string("tokenizer.ggml.") + key, std::to_string(*id) + " is not a token id (" + std::to_string(n) + " tokens)");

  const bool spm = v.model == "llama";
  if (v.model != "gpt2" && !spm)
    fail(v, "tokenizer.ggml.model", "'" + v.model + "' is not supported (supported: gpt2, llama)");
  const PreTokenizerSpec* spec = nullptr;
  if (!spm) {
    spec = find_spec(v.pre.empty() ? "default" : v.pre);
    if (!spec) {
      std::string names;
      for (const auto& s : gguf_pre_tokenizer_names()) names += (names.empty() ? "" : ", ") + s;
      fail(v, "tokenizer.ggml.pre", "'" + v.pre + "' is not supported (supported: " + names + ")");
    }
  }

  json vocab = json::object();
  json added = json::array();
  bool any_byte = false;
  for (size_t i = 0; i < n; ++i) {
    const GgufTokenType t = type_of(v, i);
    if (!vocab.contains(v.tokens[i])) vocab[v.tokens[i]] = int32_t(i);  // a repeated string keeps its first id
    any_byte = any_byte || t == GgufTokenType::Byte;
    const bool special = t == GgufTokenType::Control || (spm && t == GgufTokenType::Unknown);
    if (special || t == GgufTokenType::UserDefined)
      added.push_back({{"id", int32_t(i)}, {"content", v.tokens[i]}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", special}});
  }
  json model = {{"type", "BPE"}, {"dropout", nullptr}, {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr}, {"vocab", std::move(vocab)}};
  GgufTokenizerJson out;
  json& root = out.tokenizer;
  root = json::object();
  root["version"] = "1.0";
  root["added_tokens"] = std::move(added);
  if (spm) {
    const bool prefix = v.add_space_prefix.value_or(true);
    model["merges"] = spm_merges(v);
    model["unk_token"] = v.unk ? json(token_at(v, v.unk)) : json(nullptr);
    model["fuse_unk"] = true;
    model["byte_fallback"] = any_byte;
    model["ignore_merges"] = false;
    json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}};
    root["normalizer"] = prefix ? json{{"type", "Sequence"},
                                       {"normalizers", {{{"type", "Prepend"}, {"prepend", kSpace}}, replace}}}
                                : replace;
    root["pre_tokenizer"] = nullptr;
    json decoders = {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}}};
    if (prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    root["decoder"] = {{"type", "Sequence"}, {"decoders", std::move(decoders)}};
  } else {
    for (size_t i = 0; i < v.merges.size(); ++i) {
      const std::string& m = v.merges[i];
      const size_t sp = m.find(' ', 1);  // a left part may itself be " "? no: byte-level has no spaces
      if (sp == std::string::npos || sp + 1 >= m.size() || m.find(' ', sp + 1) != std::string::npos)
        fail(v, "tokenizer.ggml.merges", "entry " + std::to_string(i) + " '" + m + "' is not \"left right\"");
    }
    model["merges"] = v.merges;
    model["unk_token"] = nullptr;
    model["fuse_unk"] = false;
    model["byte_fallback"] = false;
    model["ignore_merges"] = spec->ignore_merges;
    root["normalizer"] = spec->normalizer;
    root["pre_tokenizer"] = spec->pre_tokenizer;
    root["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  }
  root["post_processor"] = nullptr;
  root["model"] = std::move(model);

  json& cfg = out.config;
  cfg = json::object();
  if (v.bos) cfg["bos_token"] = token_at(v, v.bos);
  if (v.eos) cfg["eos_token"] = token_at(v, v.eos);
  if (v.unk) cfg["unk_token"] = token_at(v, v.unk);
  if (v.pad) cfg["pad_token"] = token_at(v, v.pad);
  // llama.cpp's defaults when the keys are absent: BOS for SentencePiece vocabularies, none for BPE.
  cfg["add_bos_token"] = v.add_bos.value_or(spm);
  cfg["add_eos_token"] = v.add_eos.value_or(false);
  if (v.chat_template) cfg["chat_template"] = *v.chat_template;
  return out;
}

namespace {

// Every field of the vocabulary, length-prefixed: what the tokenizer's fingerprint hashes. (Not the
// synthesized JSON's dump: a GGUF token may be any bytes, which JSON cannot serialize.)
std::string vocab_bytes(const GgufVocab& v) {
  std::string out;
  auto str = [&](const std::string& s) {
    const uint64_t n = s.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    out += s;
  };
  auto num = [&](int64_t x) { out.append(reinterpret_cast<const char*>(&x), sizeof x); };
  str("gguf vocabulary 1");
  str(v.model);
  str(v.pre);
  num(int64_t(v.tokens.size()));
  for (const auto& t : v.tokens) str(t);
  num(int64_t(v.scores.size()));
  out.append(reinterpret_cast<const char*>(v.scores.data()), v.scores.size() * sizeof(float));
  num(int64_t(v.types.size()));
  out.append(reinterpret_cast<const char*>(v.types.data()), v.types.size() * sizeof(int32_t));
  num(int64_t(v.merges.size()));
  for (const auto& m : v.merges) str(m);
  for (const auto& id : {v.bos, v.eos, v.eot, v.unk, v.pad}) num(id ? *id : -1);
  for (const auto& b : {v.add_bos, v.add_eos, v.add_space_prefix}) num(b ? int64_t(*b) : -1);
  str(v.chat_template.value_or(""));
  return out;
}

}  // namespace

Tokenizer tokenizer_from_gguf_vocab(const GgufVocab& v) {
  const GgufTokenizerJson j = gguf_vocab_to_json(v);
  const std::string name = v.source + " (tokenizer.ggml.*)";
  return Tokenizer::from_json(j.tokenizer, j.config, name, name, vocab_bytes(v));
}

namespace {

// The fields of a pre-tokenizer or normalizer that change ids (trim_offsets changes only offsets).
json canonical(json j) {
  if (j.is_object()) {
    j.erase("trim_offsets");
    for (auto& [k, v] : j.items()) v = canonical(v);
  } else if (j.is_array()) {
    for (auto& v : j) v = canonical(v);
  }
  return j;
}

std::optional<int32_t> token_id(const json& cfg, const char* key, const std::map<std::string, int32_t>& ids) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return std::nullopt;
  std::string s;
  if (it->is_string()) s = it->get<std::string>();
  else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) s = (*it)["content"].get<std::string>();
  else return std::nullopt;
  auto f = ids.find(s);
  return f == ids.end() ? std::nullopt : std::optional<int32_t>(f->second);
}

}  // namespace

GgufVocab gguf_vocab_from_tokenizer_json(const json& tok, const json& config, const std::string& file) {
  GgufVocab v;
  v.source = file;
  auto bad = [&](const std::string& what) -> Error { return Error(file + ": " + what); };
  if (!tok.is_object() || !tok.contains("model") || !tok["model"].is_object()) throw bad("no \"model\" object");
  const json& m = tok["model"];
  if (m.value("type", std::string("BPE")) != "BPE") throw bad("model type '" + m.value("type", std::string()) + "': GGUF vocabularies are written for BPE models only");
  if (!m.contains("vocab") || !m["vocab"].is_object()) throw bad("model.vocab is not an object");
  // Ids: the model's vocab and the added tokens, dense from 0.
  std::map<int32_t, std::string> by_id;
  for (const auto& [t, id] : m["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) throw bad("model.vocab['" + t + "']: not a token id");
    by_id[id.get<int32_t>()] = t;
  }
  std::map<int32_t, json> added;
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array())
    for (const auto& a : tok["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content"))
        throw bad("added_tokens: an entry without id and content");
      added[a["id"].get<int32_t>()] = a;
      by_id[a["id"].get<int32_t>()] = a["content"].get<std::string>();
    }
  if (by_id.empty()) throw bad("model.vocab is empty");
  const int32_t n = by_id.rbegin()->first + 1;
  v.tokens.resize(size_t(n));
  v.types.assign(size_t(n), int32_t(GgufTokenType::Normal));
  for (int32_t i = 0; i < n; ++i) {
    auto it = by_id.find(i);
    if (it == by_id.end()) {  // a gap, as llama.cpp's converter fills one
      v.tokens[size_t(i)] = "[PAD" + std::to_string(i) + "]";
      v.types[size_t(i)] = int32_t(GgufTokenType::Unused);
      continue;
    }
    v.tokens[size_t(i)] = it->second;
    if (auto a = added.find(i); a != added.end())
      v.types[size_t(i)] = int32_t(a->second.value("special", false) ? GgufTokenType::Control : GgufTokenType::UserDefined);
  }
  std::map<std::string, int32_t> ids;
  for (int32_t i = n - 1; i >= 0; --i) ids[v.tokens[size_t(i)]] = i;

  std::vector<std::string> merges;
  if (m.contains("merges") && m["merges"].is_array())
    for (const auto& x : m["merges"]) {
      if (x.is_string()) merges.push_back(x.get<std::string>());
      else if (x.is_array() && x.size() == 2 && x[0].is_string() && x[1].is_string())
        merges.push_back(x[0].get<std::string>() + " " + x[1].get<std::string>());
      else throw bad("model.merges: an entry that is neither \"a b\" nor [\"a\", \"b\"]");
    }

  const json normalizer = tok.contains("normalizer") ? canonical(tok["normalizer"]) : json(nullptr);
  const json pre = tok.contains("pre_tokenizer") ? canonical(tok["pre_tokenizer"]) : json(nullptr);
  const bool byte_fallback = m.value("byte_fallback", false);
  if (byte_fallback || (pre.is_null() && normalizer.is_object())) {
    // SentencePiece layout (Llama 2, Mistral v0.1): normalizer [Prepend ▁, Replace " " -> ▁] (or the
    // Replace alone), no pre-tokenizer. Scores from the merge ranks: a piece made by merge r scores
    // -r, so that reading the file back ranks the merges as they were.
    const json replace = canonical({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}});
    const json with_prefix =
        canonical({{"type", "Sequence"}, {"normalizers", {{{"type", "Prepend"}, {"prepend", kSpace}}, replace}}});
    if (!pre.is_null() || (normalizer != replace && normalizer != with_prefix))
      throw bad("a SentencePiece-style tokenizer is written to GGUF only with the normalizer "
                "Sequence[Prepend \"\xe2\x96\x81\", Replace \" \" -> \"\xe2\x96\x81\"] and no pre-tokenizer (Llama 2's layout)");
    v.model = "llama";
    v.add_space_prefix = normalizer == with_prefix;
    v.scores.assign(size_t(n), 0.f);
    std::set<std::string> made;
    for (size_t r = 0; r < merges.size(); ++r) {
      const size_t sp = merges[r].find(' ');
      const std::string piece = merges[r].substr(0, sp) + merges[r].substr(sp + 1);
      if (auto it = ids.find(piece); it != ids.end() && made.insert(piece).second)
        v.scores[size_t(it->second)] = -float(r + 1);
    }
    for (int32_t i = 0; i < n; ++i) {
      const std::string& t = v.tokens[size_t(i)];
      if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t.back() == '>') v.types[size_t(i)] = int32_t(GgufTokenType::Byte);
      // A multi-byte piece no merge makes would be made by the score order's merges: ranked last.
      else if (v.types[size_t(i)] == int32_t(GgufTokenType::Normal) && !made.count(t) && t.size() > 1)
        v.scores[size_t(i)] = -1e9f;
    }
    if (auto u = m.find("unk_token"); u != m.end() && u->is_string()) {
      auto it = ids.find(u->get<std::string>());
      if (it == ids.end()) throw bad("model.unk_token is not a token");
      v.unk = it->second;
      v.types[size_t(it->second)] = int32_t(GgufTokenType::Unknown);
    }
  } else {
    v.model = "gpt2";
    v.merges = std::move(merges);
    for (const auto& s : specs()) {
      const json want_norm = canonical(s.normalizer);
      if (canonical(s.pre_tokenizer) == pre && want_norm == normalizer && s.ignore_merges == m.value("ignore_merges", false)) {
        v.pre = s.names.front();
        break;
      }
    }
    if (v.pre.empty())
      throw bad("the normalizer and pre-tokenizer match none that tokenizer.ggml.pre can name (" +
                [] {
                  std::string s;
                  for (const auto& x : specs()) s += (s.empty() ? "" : ", ") + x.names.front();
                  return s;
                }() +
                ")");
  }
  v.bos = token_id(config, "bos_token", ids);
  v.eos = token_id(config, "eos_token", ids);
  v.pad = token_id(config, "pad_token", ids);
  if (!v.unk) v.unk = token_id(config, "unk_token", ids);
  // BOS as the tokenizer adds it: tokenizer_config's add_bos_token, else the post-processor's template.
  if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
    v.add_bos = config["add_bos_token"].get<bool>();
  } else {
    v.add_bos = false;
    std::function<void(const json&)> scan = [&](const json& p) {
      if (!p.is_object()) return;
      if (p.value("type", std::string()) == "TemplateProcessing" && p.contains("single") && p["single"].is_array() &&
          !p["single"].empty() && p["single"][0].contains("SpecialToken")) {
        const json& st = p["single"][0]["SpecialToken"];
        if (st.is_object() && st.contains("id") && st["id"].is_string()) {
          auto it = ids.find(st["id"].get<std::string>());
          if (it != ids.end()) {
            v.add_bos = true;
            v.bos = it->second;
          }
        }
      }
      if (p.contains("processors") && p["processors"].is_array())
        for (const auto& q : p["processors"]) scan(q);
    };
    if (tok.contains("post_processor")) scan(tok["post_processor"]);
  }
  v.add_eos = config.contains("add_eos_token") && config["add_eos_token"].is_boolean() && config["add_eos_token"].get<bool>();
  if (config.contains("chat_template") && config["chat_template"].is_string())
    v.chat_template = config["chat_template"].get<std::string>();
  return v;
}

}  // namespace ptllm
