#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "core/sha256.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace ptllm {

using tok::json;
using tok::JsonPath;

namespace {

// TemplateProcessing's template for a single sequence: special tokens' ids, and the place of
// the sequence itself.
struct TemplateItem {
  bool is_sequence = false;
  std::vector<int32_t> ids;
};
using Template = std::vector<TemplateItem>;

std::string read_file(const std::filesystem::path& p, uint64_t max_bytes = kMaxJsonConfigBytes) {
  return read_whole_file(p, max_bytes, p.filename().string());
}

json parse_json(const std::string& bytes, const std::string& file) {
  try {
    return json::parse(bytes);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number such as 1e999
    throw Error(file + ": bad JSON: " + e.what());
  }
}

std::string sha256_hex(const std::string& a, const std::string& b) {
  Sha256 h;
  h.update(a);
  h.update(b);
  const Digest d = h.digest();
  return to_hex(d);
}

std::vector<tok::AddedToken> parse_added_tokens(const json& root, const JsonPath& file) {
  std::vector<tok::AddedToken> out;
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return out;
  const JsonPath at = file / "added_tokens";
  if (!it->is_array()) at.fail("expected an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const JsonPath ti = at[i];
    tok::AddedToken a;
    a.id = tok::to_id(tok::need(t, "id", ti), ti / "id");
    a.content = tok::get_string(t, "content", ti);
    a.single_word = tok::get_bool(t, "single_word", ti, false);
    a.lstrip = tok::get_bool(t, "lstrip", ti, false);
    a.rstrip = tok::get_bool(t, "rstrip", ti, false);
    a.special = tok::get_bool(t, "special", ti, false);
    a.normalized = tok::get_bool(t, "normalized", ti, !a.special);
    out.push_back(std::move(a));
  }
  return out;
}

Template parse_template(const json& j, const JsonPath& at) {
  const json& single = tok::need(j, "single", at);
  const JsonPath sat = at / "single";
  if (!single.is_array()) sat.fail("expected an array of pieces");
  const json& specials = tok::need(j, "special_tokens", at);
  Template t;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& piece = single[i];
    if (piece.contains("Sequence")) {
      t.push_back({true, {}});
      continue;
    }
    if (!piece.contains("SpecialToken"))
      sat[i].fail("expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    const std::string name = tok::get_string(piece["SpecialToken"], "id", sat[i] / "SpecialToken");
    const JsonPath spat = at / "special_tokens" / name;
    auto sp = specials.find(name);
    if (sp == specials.end()) spat.fail("missing");
    const json& ids = tok::need(*sp, "ids", spat);
    if (!ids.is_array()) (spat / "ids").fail("expected an array");
    TemplateItem item;
    for (size_t k = 0; k < ids.size(); ++k)
      item.ids.push_back(tok::to_id(ids[k], (spat / "ids")[k]));
    t.push_back(std::move(item));
  }
  return t;
}

// Post-processors in the order they apply; ByteLevel only trims offsets and adds nothing.
void parse_post_processor(const json& j, const JsonPath& at, std::vector<Template>& out) {
  const std::string type = tok::get_string(j, "type", at);
  if (type == "TemplateProcessing") {
    out.push_back(parse_template(j, at));
  } else if (type == "ByteLevel") {
    // only trims offsets: nothing to do for ids
  } else if (type == "Sequence") {
    at.check_nesting();
    const json& list = tok::need(j, "processors", at);
    if (!list.is_array()) (at / "processors").fail("expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      parse_post_processor(list[i], (at / "processors")[i], out);
  } else {
    tok::unsupported(at, "post_processor", type, "TemplateProcessing, ByteLevel, Sequence");
  }
}

// bos_token / eos_token of tokenizer_config.json: a string, {"content": ...}, or null. Anything else
// (an id, {"content": 7}) is refused: ignored, it would drop BOS from every prompt.
std::optional<std::string> config_token(const json& cfg, const char* key, const std::string& config_file) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  std::string got = it->dump();
  if (got.size() > 80) got = got.substr(0, 80) + "...";
  throw Error(config_file + ": " + key + ": expected the token's text, as a string or {\"content\": \"...\"}, got " +
              got);
}

}  // namespace

struct Tokenizer::Impl {
  std::unique_ptr<tok::Normalizer> normalizer;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;
  bool raw_bytes = false;  // words reach the model as raw bytes (deferred ByteLevel mapping)
  std::unique_ptr<tok::BpeModel> model;
  std::unique_ptr<tok::AddedVocab> added;
  std::vector<Template> post;
  std::unique_ptr<tok::DecoderPlan> decoder;
  std::optional<int32_t> bos, eos;
  std::string fingerprint;

  std::optional<int32_t> token_to_id(std::string_view token) const {
    if (const tok::AddedToken* t = added->find(token)) return t->id;
    return model->token_to_id(token);
  }

  // The string decode() sees for an id: an added token's content, else the vocab entry.
  const std::string* token_of(int32_t id) const {
    if (const tok::AddedToken* t = added->find(id)) return &t->content;
    return model->id_to_token(id);
  }

  bool is_special(int32_t id) const {
    const tok::AddedToken* t = added->find(id);
    return t && t->special;
  }

  // Raw text between added tokens: normalize, look for the normalized added tokens, then
  // pre-tokenize and encode what is left word by word.
  void encode_segment(std::string_view seg, bool at_start, bool parse_special,
                      std::vector<int32_t>& ids) const {
    std::string normalized;
    if (normalizer) {
      normalized.assign(seg);
      normalizer->normalize(normalized);
      seg = normalized;
    }
    auto word = [&](std::string_view w, bool) { model->encode_word(w, raw_bytes, ids); };
    added->split(
        seg, /*normalized_set=*/true, parse_special, [&](int32_t id) { ids.push_back(id); },
        [&](std::string_view piece, size_t offset) {
          const bool piece_at_start = at_start && offset == 0;
          if (pre_tokenizer)
            pre_tokenizer->split(piece, piece_at_start, word);
          else
            word(piece, piece_at_start);
        });
  }

  std::vector<int32_t> post_process(std::vector<int32_t> ids, bool add_special) const {
    for (const Template& t : post) {
      std::vector<int32_t> out;
      out.reserve(ids.size() + 4);
      for (const TemplateItem& item : t) {
        if (item.is_sequence)
          out.insert(out.end(), ids.begin(), ids.end());
        else if (add_special)
          out.insert(out.end(), item.ids.begin(), item.ids.end());
      }
      ids = std::move(out);
    }
    return ids;
  }
};

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  fs::path json_path = path, config_path;
  if (fs::is_directory(path)) {
    json_path = path / "tokenizer.json";
    config_path = path / "tokenizer_config.json";
  } else if (path.filename() == "tokenizer.json") {
    config_path = path.parent_path() / "tokenizer_config.json";
  }
  if (!fs::exists(json_path)) throw Error(json_path.string() + ": no such file");
  const std::string file = json_path.string();
  const std::string bytes = read_file(json_path, kMaxTokenizerJsonBytes);
  std::string config_bytes;
  json config = json::object();
  if (!config_path.empty() && fs::exists(config_path)) {
    config_bytes = read_file(config_path);
    config = parse_json(config_bytes, config_path.string());
    if (!config.is_object()) throw Error(config_path.string() + ": expected a JSON object");
  }

  return from_json(parse_json(bytes, file), config, file, config_path.string(), bytes + config_bytes);
}

Tokenizer Tokenizer::from_json(const json& root, const json& config, const std::string& file,
                               const std::string& config_file, const std::string& fingerprint_bytes) {
  auto impl = std::make_shared<Impl>();
  impl->fingerprint = sha256_hex(fingerprint_bytes, "");
  const JsonPath at{file, ""};
  try {
    if (!root.is_object()) at.fail("expected a JSON object");
    const json& model = tok::need(root, "model", at);
    const JsonPath mat = at / "model";
    // Files written before "type" existed hold a BPE model without it.
    const std::string type = model.contains("type") ? tok::get_string(model, "type", mat) : "BPE";
    if (type != "BPE") tok::unsupported(mat, "model", type, "BPE");
    impl->model = std::make_unique<tok::BpeModel>(model, mat);

    const json null_json;
    auto component = [&](const char* key) -> const json& {
      auto it = root.find(key);
      return it == root.end() ? null_json : *it;
    };
    if (const json& n = component("normalizer"); !n.is_null())
      impl->normalizer = tok::parse_normalizer(n, at / "normalizer");
    if (const json& p = component("pre_tokenizer"); !p.is_null())
      impl->pre_tokenizer = tok::parse_pre_tokenizer(
          p, at / "pre_tokenizer", impl->model->accepts_raw_bytes(), &impl->raw_bytes);
    if (const json& p = component("post_processor"); !p.is_null())
      parse_post_processor(p, at / "post_processor", impl->post);
    impl->decoder = std::make_unique<tok::DecoderPlan>(component("decoder"), at / "decoder");
    impl->added =
        std::make_unique<tok::AddedVocab>(parse_added_tokens(root, at), impl->normalizer.get());
  } catch (const json::exception& e) {
    throw Error(file + ": " + e.what());
  }

  // A bos_token or eos_token that is not a token would silently drop BOS (the output changes): refused.
  for (const auto& [key, slot] : {std::pair<const char*, std::optional<int32_t>*>{"bos_token", &impl->bos},
                                  std::pair<const char*, std::optional<int32_t>*>{"eos_token", &impl->eos}}) {
    if (auto t = config_token(config, key, config_file)) {
      *slot = impl->token_to_id(*t);
      if (!*slot)
        throw Error(config_file + ": " + key + " '" + *t + "' is not a token of " + file);
    }
  }
  // transformers replaces the post-processor with "[bos] $A [eos]" when the config says
  // add_bos_token or add_eos_token (an absent one counts as false).
  if (config.contains("add_bos_token") || config.contains("add_eos_token")) {
    const JsonPath cat{config_file, ""};
    Template t;
    if (tok::get_bool(config, "add_bos_token", cat, false) && impl->bos)
      t.push_back({false, {*impl->bos}});
    t.push_back({true, {}});
    if (tok::get_bool(config, "add_eos_token", cat, false) && impl->eos)
      t.push_back({false, {*impl->eos}});
    impl->post = {std::move(t)};
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& opts) const {
  std::string repaired;
  if (!tok::is_valid_utf8(text)) {
    repaired = tok::to_valid_utf8(text);
    text = repaired;
  }
  const Impl& im = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  im.added->split(
      text, /*normalized_set=*/false, opts.parse_special, [&](int32_t id) { ids.push_back(id); },
      [&](std::string_view seg, size_t offset) {
        im.encode_segment(seg, offset == 0, opts.parse_special, ids);
      });
  return im.post_process(std::move(ids), opts.add_special);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  auto stream = impl_->decoder->start();
  for (int32_t id : ids) {
    const std::string* t = impl_->token_of(id);
    if (t && !(skip_special && impl_->is_special(id))) stream->push(*t);
  }
  stream->finish();
  return stream->take();
}

std::vector<std::string> Tokenizer::token_bytes() const {
  const int32_t n = vocab_size();
  std::vector<std::string> out(size_t(std::max(n, 0)));
  auto raw = [&](std::initializer_list<const std::string*> tokens) {
    auto stream = impl_->decoder->start(/*raw=*/true);
    for (const std::string* t : tokens) stream->push(*t);
    stream->finish();
    return stream->take();
  };
  // A token's bytes in the middle of a text: decoders treat the first token apart (Metaspace
  // drops its leading space, Strip trims the text's start), so each token is decoded after a
  // fixed ordinary one and that one's own text is cut off.
  const std::string* lead = nullptr;
  std::string lead_text;
  for (int32_t id = 0; id < n && !lead; ++id) {
    const std::string* t = impl_->token_of(id);
    if (!t || impl_->is_special(id)) continue;
    std::string text = raw({t});
    if (!text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c > ' ' && c < 127; })) {
      lead = t;
      lead_text = std::move(text);
    }
  }
  for (int32_t id = 0; id < n; ++id) {
    const std::string* t = impl_->token_of(id);
    if (!t) continue;
    if (!lead) {
      out[size_t(id)] = raw({t});
      continue;
    }
    std::string both = raw({lead, t});
    out[size_t(id)] = both.compare(0, lead_text.size(), lead_text) == 0 ? both.substr(lead_text.size()) : raw({t});
  }
  return out;
}

int32_t Tokenizer::vocab_size() const {
  return std::max(impl_->model->max_id(), impl_->added->max_id()) + 1;
}
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::is_special(int32_t id) const { return impl_->is_special(id); }
std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->token_to_id(token);
}
std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const std::string* t = impl_->token_of(id);
  if (!t) return std::nullopt;
  return *t;
}
std::string Tokenizer::fingerprint() const { return impl_->fingerprint; }

struct StreamingDetokenizer::State {
  std::shared_ptr<const Tokenizer::Impl> impl;
  bool skip_special;
  std::unique_ptr<tok::DecodeStream> stream;
};

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tok, bool skip_special)
    : state_(std::make_unique<State>(State{tok.impl_, skip_special, tok.impl_->decoder->start()})) {
}
StreamingDetokenizer::~StreamingDetokenizer() = default;
StreamingDetokenizer::StreamingDetokenizer(StreamingDetokenizer&&) noexcept = default;
StreamingDetokenizer& StreamingDetokenizer::operator=(StreamingDetokenizer&&) noexcept = default;

std::string StreamingDetokenizer::push(int32_t id) {
  const std::string* t = state_->impl->token_of(id);
  if (t && !(state_->skip_special && state_->impl->is_special(id))) state_->stream->push(*t);
  return state_->stream->take();
}

std::string StreamingDetokenizer::finish() {
  state_->stream->finish();
  return state_->stream->take();
}

}  // namespace ptllm
