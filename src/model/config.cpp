#include "model/config.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "core/json_text.h"

namespace ptllm {

using nlohmann::json;

std::string_view architecture_name(Architecture a) {
  switch (a) {
    case Architecture::Llama: return "llama";
    case Architecture::Mistral: return "mistral";
    case Architecture::Qwen2: return "qwen2";
    case Architecture::YocoLlama: return "yoco_llama";
    case Architecture::Qwen3Moe: return "qwen3_moe";
  }
  return "?";
}

namespace {

struct Reader {
  const json& j;
  const std::string& file;

  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    throw Error(file + ": field '" + key + "' " + what);
  }
  bool has(const std::string& key) const { return j.contains(key) && !j[key].is_null(); }
  int positive_int(const std::string& key) const {
    if (!has(key)) bad(key, "is missing");
    const json& v = j[key];
    if (!v.is_number_integer() || v.get<long long>() <= 0 || v.get<long long>() > (1LL << 31) - 1)
      bad(key, "must be a positive integer, got " + v.dump());
    return v.get<int>();
  }
  double positive_number(const json& obj, const std::string& key) const {
    if (!obj.contains(key) || !obj[key].is_number() || !(obj[key].get<double>() > 0))
      bad(key, "must be a positive number" + (obj.contains(key) ? ", got " + obj[key].dump() : std::string(" (missing)")));
    return obj[key].get<double>();
  }
  bool boolean(const std::string& key, bool dflt) const {
    if (!has(key)) return dflt;
    if (!j[key].is_boolean()) bad(key, "must be true or false, got " + j[key].dump());
    return j[key].get<bool>();
  }
};

void parse_rope(const Reader& r, ModelConfig& c) {
  const json& j = r.j;
  // 5.x: rope_parameters {rope_theta, rope_type, ...}; 4.x: rope_theta + rope_scaling {rope_type|type, ...}.
  const json* params = nullptr;
  if (r.has("rope_parameters")) {
    params = &j["rope_parameters"];
    if (!params->is_object()) r.bad("rope_parameters", "must be an object");
  } else if (r.has("rope_scaling")) {
    params = &j["rope_scaling"];
    if (!params->is_object()) r.bad("rope_scaling", "must be an object or null");
  }
  if (params && params->contains("rope_theta"))
    c.rope.theta = r.positive_number(*params, "rope_theta");
  else if (r.has("rope_theta"))
    c.rope.theta = r.positive_number(j, "rope_theta");
  if (!params) return;
  std::string type = "default";
  if (params->contains("rope_type") && (*params)["rope_type"].is_string())
    type = (*params)["rope_type"].get<std::string>();
  else if (params->contains("type") && (*params)["type"].is_string())
    type = (*params)["type"].get<std::string>();
  if (type == "default") {
    c.rope.type = RopeType::Default;
  } else if (type == "llama3") {
    c.rope.type = RopeType::Llama3;
    c.rope.factor = r.positive_number(*params, "factor");
    c.rope.low_freq_factor = r.positive_number(*params, "low_freq_factor");
    c.rope.high_freq_factor = r.positive_number(*params, "high_freq_factor");
    c.rope.original_max_position = int(r.positive_number(*params, "original_max_position_embeddings"));
    if (c.rope.high_freq_factor <= c.rope.low_freq_factor)
      r.bad("high_freq_factor", "must be larger than low_freq_factor");
  } else {
    r.bad(r.has("rope_parameters") ? "rope_parameters.rope_type" : "rope_scaling.rope_type",
          "'" + type + "' is not supported (supported: default, llama3)");
  }
}

// transformers' default sliding_window for Mistral and Qwen2 when config.json does not have the key.
constexpr int kDefaultSlidingWindow = 4096;

// layer_types (transformers 5): one "full_attention" / "sliding_attention" per layer. Checked for
// every architecture that carries it, read only where transformers reads it (Qwen2).
std::vector<AttentionKind> parse_layer_types(const Reader& r, int n_layers) {
  const json& lt = r.j["layer_types"];
  if (!lt.is_array()) r.bad("layer_types", "must be a list of \"full_attention\" / \"sliding_attention\", got " + lt.dump());
  if (lt.size() != size_t(n_layers))
    r.bad("layer_types", "has " + std::to_string(lt.size()) + " entries, num_hidden_layers is " + std::to_string(n_layers));
  std::vector<AttentionKind> kinds;
  for (size_t i = 0; i < lt.size(); ++i) {
    const std::string key = "layer_types[" + std::to_string(i) + "]";
    if (lt[i] == "full_attention")
      kinds.push_back(AttentionKind::Full);
    else if (lt[i] == "sliding_attention")
      kinds.push_back(AttentionKind::Sliding);
    else
      r.bad(key, lt[i].dump() + " is not supported (supported: full_attention, sliding_attention)");
  }
  return kinds;
}

// sliding_window: a positive number of tokens; null: none; absent: transformers' default.
std::optional<int> parse_window(const Reader& r) {
  if (!r.j.contains("sliding_window")) return kDefaultSlidingWindow;
  if (r.j["sliding_window"].is_null()) return std::nullopt;
  return r.positive_int("sliding_window");
}

// Which layers slide, as transformers decides it:
// - Llama: none (LlamaAttention has no window).
// - Mistral: every layer when sliding_window is set (MistralModel applies config.sliding_window to
//   all layers and ignores layer_types).
// - Qwen2 (Qwen2Config.__post_init__): sliding_window counts only with use_sliding_window (default
//   false); layer_types, when absent, is "sliding_attention" for layers i >= max_window_layers
//   (default 28) and "full_attention" below. A layer listed as sliding with no window is full.
void parse_attention_kinds(const Reader& r, ModelConfig& c) {
  std::vector<AttentionKind> listed;
  if (r.has("layer_types")) listed = parse_layer_types(r, c.n_layers);
  std::optional<int> window;
  switch (c.arch) {
    case Architecture::Llama:
      break;
    case Architecture::Qwen3Moe:
      // Qwen3MoeConfig: sliding_window counts only with use_sliding_window, and then in every layer
      // (Qwen3MoeAttention takes config.sliding_window; no layer_types).
      if (!r.boolean("use_sliding_window", false)) break;
      window = parse_window(r);
      if (window) listed.assign(size_t(c.n_layers), AttentionKind::Sliding);
      break;
    case Architecture::YocoLlama:
      // modeling_yoco.py's yoco_layout: layer_types as listed (absent: all full); a sliding layer needs
      // sliding_window >= 1.
      if (listed.empty()) break;
      if (std::find(listed.begin(), listed.end(), AttentionKind::Sliding) == listed.end()) break;
      if (!r.has("sliding_window")) r.bad("sliding_window", "is missing (layer_types lists sliding_attention layers)");
      window = r.positive_int("sliding_window");
      break;
    case Architecture::Mistral:
      window = parse_window(r);
      if (window) listed.assign(size_t(c.n_layers), AttentionKind::Sliding);
      break;
    case Architecture::Qwen2: {
      if (!r.boolean("use_sliding_window", false)) break;
      window = parse_window(r);
      if (!window || !listed.empty()) break;
      int max_window_layers = 28;
      if (r.has("max_window_layers")) {
        const json& v = r.j["max_window_layers"];
        if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > (1LL << 31) - 1)
          r.bad("max_window_layers", "must be a non-negative integer, got " + v.dump());
        max_window_layers = v.get<int>();
      }
      for (int i = 0; i < c.n_layers; ++i)
        listed.push_back(i >= max_window_layers ? AttentionKind::Sliding : AttentionKind::Full);
      break;
    }
  }
  c.layer_kinds.assign(size_t(c.n_layers), AttentionKind::Full);
  if (!window) return;
  c.layer_kinds = listed;
  const bool any = std::find(listed.begin(), listed.end(), AttentionKind::Sliding) != listed.end();
  c.sliding_window = any ? *window : 0;
}

// num_kv_shared_layers (YOCO / Gemma 3n): the last n layers read the K/V of the last non-shared layer
// of their own kind (modeling_yoco.py's yoco_layout). A donor must be earlier and of the same kind:
// a layout with none is an error naming the field.
void parse_kv_sharing(const Reader& r, ModelConfig& c) {
  c.kv_source.resize(size_t(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) c.kv_source[size_t(i)] = i;
  if (!r.has("num_kv_shared_layers")) return;
  const json& v = r.j["num_kv_shared_layers"];
  if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() >= c.n_layers)
    r.bad("num_kv_shared_layers", "must be an integer in [0, " + std::to_string(c.n_layers - 1) +
                                      "] (num_hidden_layers is " + std::to_string(c.n_layers) + "), got " + v.dump());
  c.num_kv_shared_layers = v.get<int>();
  const int first_shared = c.n_layers - c.num_kv_shared_layers;
  for (int i = first_shared; i < c.n_layers; ++i) {
    const AttentionKind kind = c.layer_kinds[size_t(i)];
    int donor = -1;
    for (int j = 0; j < first_shared; ++j)
      if (c.layer_kinds[size_t(j)] == kind) donor = j;
    if (donor < 0)
      r.bad("num_kv_shared_layers",
            "(" + std::to_string(c.num_kv_shared_layers) + ") makes layer " + std::to_string(i) + " (" +
                (kind == AttentionKind::Sliding ? "sliding_attention" : "full_attention") +
                ") read K/V from an earlier non-shared layer of the same kind, and layer_types has none");
    c.kv_source[size_t(i)] = donor;
  }
}

// Shape arithmetic from untrusted numbers, in 64 bits and bounded before anything is sized by it:
// the forward pass computes q_dim() and kv_dim() in int, and a product that wraps (134217732 heads
// of 128 is 2^34 + 512, exactly 128 in 32 bits) would pass the tensor shape checks and then write out
// of bounds; a layer count is an allocation before the first tensor is looked up. The bounds are
// far above any real checkpoint (hidden 16384 and 126 layers for Llama 3.1 405B).
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxWidth = int64_t(1) << 20;  // hidden, intermediate, heads * head_dim
constexpr int64_t kMaxVocab = int64_t(1) << 24;

void check_shape_bounds(const Reader& r, const ModelConfig& c) {
  auto at_most = [&](const std::string& key, int64_t v, int64_t max) {
    if (v > max) r.bad(key, "is " + std::to_string(v) + ", more than " + std::to_string(max) + " (the most this build supports)");
  };
  at_most("num_hidden_layers", c.n_layers, kMaxLayers);
  at_most("vocab_size", c.vocab_size, kMaxVocab);
  at_most("hidden_size", c.hidden_size, kMaxWidth);
  at_most("intermediate_size", c.intermediate_size, kMaxWidth);
  at_most("head_dim", c.head_dim, kMaxWidth);
  for (const auto& [key, heads] : {std::pair<const char*, int64_t>{"num_attention_heads", c.n_heads},
                                   std::pair<const char*, int64_t>{"num_key_value_heads", c.n_kv_heads}}) {
    const int64_t width = heads * int64_t(c.head_dim);  // both below 2^31: no overflow in 64 bits
    if (width > kMaxWidth)
      r.bad(key, "(" + std::to_string(heads) + ") * head_dim (" + std::to_string(c.head_dim) + ") = " +
                     std::to_string(width) + ", more than " + std::to_string(kMaxWidth) +
                     " (the widest attention this build supports)");
  }
}

}  // namespace

std::vector<int> ModelConfig::layer_windows() const {
  std::vector<int> w(size_t(n_layers), 0);
  for (size_t i = 0; i < layer_kinds.size() && i < w.size(); ++i)
    if (layer_kinds[i] == AttentionKind::Sliding) w[i] = sliding_window;
  return w;
}

ModelConfig ModelConfig::from_json(const json& j, const std::string& file) {
  if (!j.is_object()) throw Error(file + ": not a JSON object");
  Reader r{j, file};
  ModelConfig c;
  if (!r.has("architectures") || !j["architectures"].is_array() || j["architectures"].empty() ||
      !j["architectures"][0].is_string())
    r.bad("architectures", "is missing (expected e.g. [\"LlamaForCausalLM\"])");
  c.arch_name = j["architectures"][0].get<std::string>();
  if (c.arch_name == "LlamaForCausalLM")
    c.arch = Architecture::Llama;
  else if (c.arch_name == "MistralForCausalLM")
    c.arch = Architecture::Mistral;
  else if (c.arch_name == "Qwen2ForCausalLM")
    c.arch = Architecture::Qwen2;
  else if (c.arch_name == "YocoLlamaForCausalLM")
    c.arch = Architecture::YocoLlama;
  else if (c.arch_name == "Qwen3MoeForCausalLM")
    c.arch = Architecture::Qwen3Moe;
  else
    throw Error(file + ": architecture '" + c.arch_name +
                "' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                "YocoLlamaForCausalLM, Qwen3MoeForCausalLM)");

  c.vocab_size = r.positive_int("vocab_size");
  c.hidden_size = r.positive_int("hidden_size");
  c.intermediate_size = r.positive_int("intermediate_size");
  c.n_layers = r.positive_int("num_hidden_layers");
  c.n_heads = r.positive_int("num_attention_heads");
  c.n_kv_heads = r.has("num_key_value_heads") ? r.positive_int("num_key_value_heads") : c.n_heads;
  if (c.n_heads % c.n_kv_heads != 0)
    r.bad("num_key_value_heads", "(" + std::to_string(c.n_kv_heads) + ") must divide num_attention_heads (" +
                                     std::to_string(c.n_heads) + ")");
  if (r.has("head_dim")) {
    c.head_dim = r.positive_int("head_dim");
  } else {
    if (c.hidden_size % c.n_heads != 0)
      r.bad("head_dim", "is missing and hidden_size is not a multiple of num_attention_heads");
    c.head_dim = c.hidden_size / c.n_heads;
  }
  if (c.head_dim % 2 != 0) r.bad("head_dim", "must be even for RoPE");
  check_shape_bounds(r, c);
  c.max_position_embeddings = r.has("max_position_embeddings") ? r.positive_int("max_position_embeddings") : 4096;
  if (r.has("rms_norm_eps")) c.rms_norm_eps = float(r.positive_number(j, "rms_norm_eps"));
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  if (r.has("hidden_act") && j["hidden_act"] != "silu")
    r.bad("hidden_act", "'" + j["hidden_act"].dump() + "' is not supported (supported: silu)");
  switch (c.arch) {
    case Architecture::Qwen2:
      c.qkv_bias = true;
      break;
    case Architecture::Llama:
    case Architecture::YocoLlama:
      c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
      c.mlp_bias = r.boolean("mlp_bias", false);
      break;
    case Architecture::Mistral:
      break;
    case Architecture::Qwen3Moe:
      c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
      parse_moe_config(j, file, c.n_layers, c.moe);
      break;
  }
  parse_rope(r, c);
  parse_attention_kinds(r, c);
  parse_kv_sharing(r, c);
  // mlx-lm writes both keys with the same object; `quantization` is the one its loader reads.
  for (const char* key : {"quantization", "quantization_config"})
    if (r.has(key)) {
      c.quantization = QuantizationConfig::from_json(j[key], file, key);
      break;
    }
  if (r.has("dtype") && j["dtype"].is_string())
    c.dtype = j["dtype"].get<std::string>();
  else if (r.has("torch_dtype") && j["torch_dtype"].is_string())
    c.dtype = j["torch_dtype"].get<std::string>();
  if (r.has("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_token_id = j["bos_token_id"].get<int>();
  if (r.has("eos_token_id")) {
    const json& e = j["eos_token_id"];
    if (e.is_number_integer()) {
      c.eos_token_ids.push_back(e.get<int>());
    } else if (e.is_array()) {
      for (const auto& x : e)
        if (x.is_number_integer()) c.eos_token_ids.push_back(x.get<int>());
    }
  }
  return c;
}

ModelConfig ModelConfig::load(const std::filesystem::path& config_json) {
  std::error_code ec;
  if (!std::filesystem::exists(config_json, ec))
    throw Error(config_json.string() + ": cannot open (is this a Hugging Face model directory?)");
  const json j = parse_json_text(read_whole_file(config_json, kMaxJsonConfigBytes, "config.json"), config_json.string());
  return from_json(j, config_json.string());
}

}  // namespace ptllm
