#include "model/config.h"

#include <algorithm>
#include <cmath>
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
    case Architecture::Qwen3: return "qwen3";
    case Architecture::Gemma3: return "gemma3";
    case Architecture::Phi3: return "phi3";
    case Architecture::SmolLM3: return "smollm3";
    case Architecture::YocoLlama: return "yoco_llama";
    case Architecture::Qwen3Moe: return "qwen3_moe";
  }
  return "?";
}

namespace {

struct Reader {
  const json& j;
  const std::string& file;
  std::string prefix = {};  // "text_config." when reading a multimodal config's text part

  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    throw Error(file + ": field '" + prefix + key + "' " + what);
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

// One RoPE description (a rope_parameters / rope_scaling object, or null for the default) into out.
// where: the key path for messages ("rope_parameters", "rope_parameters.full_attention", ...).
// out.theta holds the fallback theta on entry.
void parse_rope_params(const Reader& r, const json* params, const std::string& where, const ModelConfig& c,
                       RopeConfig& out) {
  if (!params) return;
  if (!params->is_object()) r.bad(where, "must be an object or null");
  if (params->contains("rope_theta")) out.theta = r.positive_number(*params, "rope_theta");
  std::string type = "default";
  if (params->contains("rope_type") && (*params)["rope_type"].is_string())
    type = (*params)["rope_type"].get<std::string>();
  else if (params->contains("type") && (*params)["type"].is_string())
    type = (*params)["type"].get<std::string>();
  auto number_or = [&](const char* key, double dflt) {
    return params->contains(key) && !(*params)[key].is_null() ? r.positive_number(*params, key) : dflt;
  };
  if (type == "default") {
    out.type = RopeType::Default;
  } else if (type == "linear") {
    out.type = RopeType::Linear;
    out.factor = r.positive_number(*params, "factor");
  } else if (type == "llama3") {
    out.type = RopeType::Llama3;
    out.factor = r.positive_number(*params, "factor");
    out.low_freq_factor = r.positive_number(*params, "low_freq_factor");
    out.high_freq_factor = r.positive_number(*params, "high_freq_factor");
    out.original_max_position = int(r.positive_number(*params, "original_max_position_embeddings"));
    if (out.high_freq_factor <= out.low_freq_factor) r.bad("high_freq_factor", "must be larger than low_freq_factor");
  } else if (type == "longrope") {
    // transformers' _compute_longrope_parameters; Phi-3 (4.x) keeps original_max_position_embeddings
    // at the top level.
    out.type = RopeType::LongRope;
    const size_t n = size_t(c.rotated_dims() / 2);
    for (const char* key : {"short_factor", "long_factor"}) {
      const std::string name = where + "." + key;
      if (!params->contains(key) || !(*params)[key].is_array()) r.bad(name, "must be a list of numbers");
      const json& a = (*params)[key];
      if (a.size() != n)
        r.bad(name, "has " + std::to_string(a.size()) + " entries, the rotated dims (" +
                        std::to_string(c.rotated_dims()) + ") need " + std::to_string(n));
      std::vector<double>& v = std::string(key) == "short_factor" ? out.short_factor : out.long_factor;
      for (const json& x : a) {
        if (!x.is_number() || !(x.get<double>() > 0)) r.bad(name, "must hold positive numbers, got " + x.dump());
        v.push_back(x.get<double>());
      }
    }
    double original = 0;
    if (params->contains("original_max_position_embeddings"))
      original = r.positive_number(*params, "original_max_position_embeddings");
    else if (r.has("original_max_position_embeddings"))
      original = r.positive_number(r.j, "original_max_position_embeddings");
    else
      r.bad("original_max_position_embeddings", "is missing (rope type longrope needs it)");
    out.original_max_position = int(original);
    const double factor = number_or("factor", double(c.max_position_embeddings) / original);
    out.factor = factor;
    out.attention_factor = number_or(
        "attention_factor", factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(original)));
  } else {
    r.bad(where + ".rope_type", "'" + type + "' is not supported (supported: default, linear, llama3, longrope)");
  }
}

// 5.x: rope_parameters {rope_theta, rope_type, ...}; 4.x: rope_theta + rope_scaling {rope_type|type, ...}.
void parse_rope(const Reader& r, ModelConfig& c) {
  const json& j = r.j;
  if (r.has("rope_theta")) c.rope.theta = r.positive_number(j, "rope_theta");
  if (r.has("rope_parameters"))
    parse_rope_params(r, &j["rope_parameters"], "rope_parameters", c, c.rope);
  else if (r.has("rope_scaling"))
    parse_rope_params(r, &j["rope_scaling"], "rope_scaling", c, c.rope);
}

// Gemma 3's two RoPEs. 5.x: rope_parameters {"full_attention": {...}, "sliding_attention": {...}};
// 4.x: rope_theta and rope_scaling for the global (full) layers, rope_local_base_freq (default
// 10000) for the local (sliding) ones; theta defaults 1e6 global (Gemma3TextConfig).
void parse_gemma_rope(const Reader& r, ModelConfig& c) {
  const json& j = r.j;
  c.rope.theta = 1000000.0;
  c.rope_local.theta = 10000.0;
  if (r.has("rope_theta")) c.rope.theta = r.positive_number(j, "rope_theta");
  if (r.has("rope_local_base_freq")) c.rope_local.theta = r.positive_number(j, "rope_local_base_freq");
  if (r.has("rope_parameters") && j["rope_parameters"].is_object() &&
      (j["rope_parameters"].contains("full_attention") || j["rope_parameters"].contains("sliding_attention"))) {
    const json& p = j["rope_parameters"];
    for (const auto& [key, value] : p.items())
      if (key != "full_attention" && key != "sliding_attention")
        r.bad("rope_parameters." + key, "is not a layer type (expected full_attention, sliding_attention)");
    if (p.contains("full_attention") && !p["full_attention"].is_null())
      parse_rope_params(r, &p["full_attention"], "rope_parameters.full_attention", c, c.rope);
    if (p.contains("sliding_attention") && !p["sliding_attention"].is_null())
      parse_rope_params(r, &p["sliding_attention"], "rope_parameters.sliding_attention", c, c.rope_local);
    return;
  }
  if (r.has("rope_parameters"))
    parse_rope_params(r, &j["rope_parameters"], "rope_parameters", c, c.rope);
  else if (r.has("rope_scaling"))
    parse_rope_params(r, &j["rope_scaling"], "rope_scaling", c, c.rope);
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
// - Gemma 3: layer_types, or sliding_window_pattern; Phi-3: every layer when sliding_window is set.
// - Qwen2, Qwen3, SmolLM3 (Qwen2Config / Qwen3Config.__post_init__): sliding_window counts only with
//   use_sliding_window (default false); layer_types, when absent, is "sliding_attention" for layers
//   i >= max_window_layers (default 28) and "full_attention" below. A layer listed as sliding with no window is full.
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
    case Architecture::Phi3:
      // Phi3Attention applies config.sliding_window (default None) to every layer.
      if (!r.has("sliding_window")) break;
      window = r.positive_int("sliding_window");
      listed.assign(size_t(c.n_layers), AttentionKind::Sliding);
      break;
    case Architecture::Gemma3: {
      // Gemma3TextConfig: layer_types, else every sliding_window_pattern-th layer (default 6) full and
      // the others sliding; sliding_window default 4096.
      window = parse_window(r);
      if (!listed.empty()) break;
      int pattern = 6;
      if (r.has("sliding_window_pattern")) pattern = r.positive_int("sliding_window_pattern");
      for (int i = 0; i < c.n_layers; ++i)
        listed.push_back((i + 1) % pattern != 0 ? AttentionKind::Sliding : AttentionKind::Full);
      break;
    }
    case Architecture::Qwen2:
    case Architecture::Qwen3:
    case Architecture::SmolLM3: {
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

// SmolLM3's no_rope_layers: per layer 1 = RoPE, 0 = none (SmolLM3Attention: use_rope =
// no_rope_layers[i]); absent, every no_rope_layer_interval-th layer (default 4) has none.
void parse_no_rope_layers(const Reader& r, ModelConfig& c) {
  c.layer_rope.assign(size_t(c.n_layers), LayerRope::Main);
  if (r.has("no_rope_layers")) {
    const json& a = r.j["no_rope_layers"];
    if (!a.is_array() || a.size() != size_t(c.n_layers))
      r.bad("no_rope_layers", "must be a list of num_hidden_layers (" + std::to_string(c.n_layers) + ") 0 / 1 entries");
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_number_integer() || (a[i] != 0 && a[i] != 1))
        r.bad("no_rope_layers[" + std::to_string(i) + "]", "must be 0 or 1, got " + a[i].dump());
      if (a[i] == 0) c.layer_rope[i] = LayerRope::None;
    }
    return;
  }
  const int interval = r.has("no_rope_layer_interval") ? r.positive_int("no_rope_layer_interval") : 4;
  for (int i = 0; i < c.n_layers; ++i)
    if ((i + 1) % interval == 0) c.layer_rope[size_t(i)] = LayerRope::None;
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

namespace {

// Gemma3TextConfig's defaults: hub configs leave out the fields that have them (a multimodal
// checkpoint's text_config often lists only a few).
json gemma3_text_defaults() {
  return json{{"vocab_size", 262208},        {"hidden_size", 2304},         {"intermediate_size", 9216},
              {"num_hidden_layers", 26},     {"num_attention_heads", 8},    {"num_key_value_heads", 4},
              {"head_dim", 256},             {"max_position_embeddings", 131072}, {"rms_norm_eps", 1e-6},
              {"query_pre_attn_scalar", 256}, {"sliding_window", 4096},     {"tie_word_embeddings", true}};
}

}  // namespace

ModelConfig ModelConfig::from_json(const json& outer, const std::string& file) {
  if (!outer.is_object()) throw Error(file + ": not a JSON object");
  const Reader ro{outer, file};
  if (!ro.has("architectures") || !outer["architectures"].is_array() || outer["architectures"].empty() ||
      !outer["architectures"][0].is_string())
    ro.bad("architectures", "is missing (expected e.g. [\"LlamaForCausalLM\"])");
  const std::string arch_name = outer["architectures"][0].get<std::string>();
  // Gemma 3: its defaults under what the file says; a Gemma3ForConditionalGeneration checkpoint's
  // text model is its text_config (the vision tower is not run).
  json merged;
  std::string prefix;
  if (arch_name == "Gemma3ForCausalLM" || arch_name == "Gemma3ForConditionalGeneration") {
    merged = gemma3_text_defaults();
    if (arch_name == "Gemma3ForConditionalGeneration") {
      if (!ro.has("text_config") || !outer["text_config"].is_object())
        ro.bad("text_config", "is missing (a Gemma3ForConditionalGeneration config holds its text model there)");
      merged.update(outer["text_config"]);
      for (const char* k : {"bos_token_id", "eos_token_id", "quantization", "quantization_config", "dtype", "torch_dtype"})
        if (outer.contains(k) && !merged.contains(k)) merged[k] = outer[k];
      prefix = "text_config.";
    } else {
      merged.update(outer);
    }
  }
  const json& j = merged.is_null() ? outer : merged;
  Reader r{j, file, prefix};
  ModelConfig c;
  c.arch_name = arch_name;
  if (c.arch_name == "LlamaForCausalLM")
    c.arch = Architecture::Llama;
  else if (c.arch_name == "MistralForCausalLM")
    c.arch = Architecture::Mistral;
  else if (c.arch_name == "Qwen2ForCausalLM")
    c.arch = Architecture::Qwen2;
  else if (c.arch_name == "Qwen3ForCausalLM")
    c.arch = Architecture::Qwen3;
  else if (c.arch_name == "Gemma3ForCausalLM" || c.arch_name == "Gemma3ForConditionalGeneration")
    c.arch = Architecture::Gemma3;
  else if (c.arch_name == "Phi3ForCausalLM")
    c.arch = Architecture::Phi3;
  else if (c.arch_name == "SmolLM3ForCausalLM")
    c.arch = Architecture::SmolLM3;
  else if (c.arch_name == "YocoLlamaForCausalLM")
    c.arch = Architecture::YocoLlama;
  else if (c.arch_name == "Qwen3MoeForCausalLM")
    c.arch = Architecture::Qwen3Moe;
  else
    throw Error(file + ": architecture '" + c.arch_name +
                "' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                "Qwen3ForCausalLM, Qwen3MoeForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration (text), "
                "Phi3ForCausalLM, SmolLM3ForCausalLM, YocoLlamaForCausalLM)");

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
  } else if (c.arch == Architecture::Qwen3) {
    c.head_dim = 128;  // Qwen3Config's default, not hidden_size / num_attention_heads
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
  if (c.arch == Architecture::Gemma3) {
    // Gemma3MLP reads hidden_activation (hidden_act is not used)
    const std::string act = r.has("hidden_activation") && j["hidden_activation"].is_string()
                                ? j["hidden_activation"].get<std::string>()
                                : "gelu_pytorch_tanh";
    if (act != "gelu_pytorch_tanh" && act != "gelu_new")
      r.bad("hidden_activation", "'" + act + "' is not supported (supported: gelu_pytorch_tanh)");
    c.activation = Activation::GeluTanh;
  } else if (r.has("hidden_act") && j["hidden_act"] != "silu") {
    r.bad("hidden_act", "'" + j["hidden_act"].dump() + "' is not supported (supported: silu)");
  }
  // partial_rotary_factor: top level (4.x) or in rope_parameters (5.x); only Phi-3 rotates part of a head.
  {
    const json* prf = r.has("partial_rotary_factor") ? &j["partial_rotary_factor"] : nullptr;
    if (!prf && r.has("rope_parameters") && j["rope_parameters"].is_object() &&
        j["rope_parameters"].contains("partial_rotary_factor") && !j["rope_parameters"]["partial_rotary_factor"].is_null())
      prf = &j["rope_parameters"]["partial_rotary_factor"];
    if (prf) {
      if (!prf->is_number() || !(prf->get<double>() > 0) || prf->get<double>() > 1)
        r.bad("partial_rotary_factor", "must be a number in (0, 1], got " + prf->dump());
      if (prf->get<double>() != 1.0 && c.arch != Architecture::Phi3)
        r.bad("partial_rotary_factor", "(" + prf->dump() + ") is not supported for " + c.arch_name);
      c.rotary_dim = int(double(c.head_dim) * prf->get<double>());  // transformers: int(head_dim * factor)
      if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0)
        r.bad("partial_rotary_factor", "gives " + std::to_string(c.rotary_dim) + " rotated dims of " +
                                           std::to_string(c.head_dim) + " (must be even and at least 2)");
      if (c.rotary_dim == c.head_dim) c.rotary_dim = 0;
    }
  }
  switch (c.arch) {
    case Architecture::Qwen2:
      c.qkv_bias = true;
      break;
    case Architecture::Llama:
    case Architecture::YocoLlama:
      c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
      c.mlp_bias = r.boolean("mlp_bias", false);
      break;
    case Architecture::Qwen3:
      // Qwen3Attention: attention_bias on q, k, v and o alike; q_norm / k_norm always.
      c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
      c.qk_norm = true;
      break;
    case Architecture::Gemma3: {
      c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
      c.qk_norm = c.norm_plus_one = c.sandwich_norms = true;
      // Gemma3TextScaledWordEmbedding: embed_scale = hidden_size ** 0.5, a float32 buffer
      c.embed_scale = float(std::sqrt(double(c.hidden_size)));
      c.query_pre_attn_scalar = r.positive_number(j, "query_pre_attn_scalar");
      if (r.has("final_logit_softcapping")) c.final_logit_softcapping = float(r.positive_number(j, "final_logit_softcapping"));
      if (r.has("attn_logit_softcapping"))
        r.bad("attn_logit_softcapping", "(" + j["attn_logit_softcapping"].dump() + ") is not supported (only null)");
      if (r.boolean("use_bidirectional_attention", false))
        r.bad("use_bidirectional_attention", "is not supported (a causal decoder only)");
      break;
    }
    case Architecture::Phi3:
      // Phi3Attention / Phi3MLP: fused projections, no biases
      c.fused_qkv = c.fused_gate_up = true;
      if (r.has("num_kv_shared_layers")) r.bad("num_kv_shared_layers", "is not supported with a fused qkv_proj");
      break;
    case Architecture::SmolLM3:
      c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
      c.mlp_bias = r.boolean("mlp_bias", false);
      break;
    case Architecture::Mistral:
      break;
    case Architecture::Qwen3Moe:
      // Qwen3MoeAttention is Qwen3's; the feed-forward blocks are routed experts (model/moe.h).
      c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
      c.qk_norm = true;
      parse_moe_config(j, file, c.n_layers, c.moe);
      break;
  }
  if (c.arch == Architecture::Gemma3)
    parse_gemma_rope(r, c);
  else
    parse_rope(r, c);
  if (c.rotary_dim > 0 && c.rope.type != RopeType::Default && c.rope.type != RopeType::LongRope)
    r.bad("partial_rotary_factor", "with this rope type is not supported (default or longrope only)");
  parse_attention_kinds(r, c);
  if (c.arch == Architecture::Gemma3)
    for (AttentionKind k : c.layer_kinds) c.layer_rope.push_back(k == AttentionKind::Sliding ? LayerRope::Local : LayerRope::Main);
  if (c.arch == Architecture::SmolLM3) parse_no_rope_layers(r, c);
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
