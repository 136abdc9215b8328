#include "model/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

// The metadata half of model/gguf_model.h: no forward pass, so the fuzzer links it alone.
namespace ptllm {

namespace {

// Bounds as config.json's (model/config.cpp): far above any real checkpoint, and below what the
// forward pass's int arithmetic holds.
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxWidth = int64_t(1) << 20;
constexpr int64_t kMaxHeadDim = 1024;

// llama.cpp's qwen3moe: expert_count experts, expert_used_count chosen by softmax, their weights
// renormalized (its graph passes norm_w = true; an expert_weights_norm key, where written, says so),
// each expert_feed_forward_length wide. A layer without ffn_gate_inp has the dense MLP (mlp_only_layers).
void gguf_moe_config(const GgufFile& f, const std::string& p, ModelConfig& c) {
  MoeConfig& m = c.moe;
  m.num_experts = int(f.get_int(p + "expert_count", 1, int64_t(1) << 16));
  m.top_k = int(f.get_int(p + "expert_used_count", 1, std::min<int64_t>(m.num_experts, kMaxTopK)));
  if (auto ff = f.opt_int(p + "expert_feed_forward_length", 1, kMaxWidth))
    m.intermediate_size = int(*ff);
  else
    m.intermediate_size = c.intermediate_size / m.top_k;  // llama.cpp's fallback
  m.norm_topk_prob = f.opt_bool(p + "expert_weights_norm").value_or(true);
  if (auto n = f.opt_int(p + "expert_shared_count", 0, int64_t(1) << 16); n && *n > 0)
    f.fail_key(p + "expert_shared_count", "shared experts are not supported");
  if (auto sc = f.opt_float(p + "expert_weights_scale"); sc && *sc != 0.0 && *sc != 1.0)
    f.fail_key(p + "expert_weights_scale", "scaled expert weights are not supported");
  if (auto g = f.opt_int(p + "expert_gating_func", 0, 16); g && *g != 1)  // LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX
    f.fail_key(p + "expert_gating_func", std::to_string(*g) + ": gating other than softmax is not supported");
  m.decoder_sparse_step = 1;
  m.mlp_only_layers.clear();
  for (int i = 0; i < c.n_layers; ++i)
    if (!f.find_tensor("blk." + std::to_string(i) + ".ffn_gate_inp.weight")) m.mlp_only_layers.push_back(i);
}

bool nonzero(const GgufValue& v) { return v.b || v.u != 0 || v.i != 0; }

// Gemma 3 as llama.cpp reads it: sliding layers by attention.sliding_window_pattern (a period, default
// 6: layer i slides unless i % period == period - 1; or one flag per layer), their RoPE base
// rope.freq_base_swa (default 10000, unscaled); the global layers' rope.freq_base and linear scaling;
// final_logit_softcapping; embeddings scaled by sqrt(embedding_length). The norms' (1 + weight) is
// already in the file (the converter adds the 1), and the attention scale is 1/sqrt(key_length):
// llama.cpp's rule (but for the 27B shape, which it scales by 1/sqrt(embedding_length / head_count)).
void gguf_gemma3(const GgufFile& f, const std::string& p, ModelConfig& c) {
  c.sandwich_norms = true;
  c.activation = Activation::GeluTanh;
  c.embed_scale = float(std::sqrt(double(c.hidden_size)));
  if (c.n_layers == 62) c.query_pre_attn_scalar = double(c.hidden_size) / double(c.n_heads);
  if (auto cap = f.opt_float(p + "final_logit_softcapping")) {
    if (!(*cap >= 0)) f.fail_key(p + "final_logit_softcapping", "must not be negative");
    c.final_logit_softcapping = float(*cap);
  }
  if (auto cap = f.opt_float(p + "attn_logit_softcapping"); cap && *cap != 0)
    f.fail_key(p + "attn_logit_softcapping", "is not supported");
  c.rope_local.theta = 10000.0;
  if (auto base = f.opt_float(p + "rope.freq_base_swa")) {
    if (!(*base > 1)) f.fail_key(p + "rope.freq_base_swa", "must be more than 1");
    c.rope_local.theta = *base;
  }
  if (c.sliding_window > 0) {
    std::vector<AttentionKind> kinds;
    const std::string key = p + "attention.sliding_window_pattern";
    const GgufValue* v = f.find(key);
    if (v && v->type == GgufType::Array) {
      const GgufValue* a = f.opt_array(key, {GgufType::Bool, GgufType::I32, GgufType::U32, GgufType::U8, GgufType::I8});
      if (a->array.size() != size_t(c.n_layers)) f.fail_key(key, "must have block_count entries");
      for (const GgufValue& e : a->array) kinds.push_back(nonzero(e) ? AttentionKind::Sliding : AttentionKind::Full);
    } else {
      const int period = int(f.opt_int(key, 1, 1 << 20).value_or(6));
      for (int i = 0; i < c.n_layers; ++i)
        kinds.push_back(i % period < period - 1 ? AttentionKind::Sliding : AttentionKind::Full);
    }
    c.layer_kinds = kinds;
  }
  c.layer_rope.clear();
  for (AttentionKind k : c.layer_kinds) c.layer_rope.push_back(k == AttentionKind::Sliding ? LayerRope::Local : LayerRope::Main);
}

// Phi-3 as llama.cpp's converter writes it: fused attn_qkv and ffn_up (gate then up), partial rotary
// (rope.dimension_count), LongRoPE as rope_factors_short / rope_factors_long tensors with
// rope.scaling.attn_factor and rope.scaling.original_context_length (Model::load_gguf reads the
// factors).
void gguf_phi3(const GgufFile& f, const std::string& p, ModelConfig& c) {
  c.fused_qkv = f.find_tensor("blk.0.attn_qkv.weight") != nullptr;
  c.fused_gate_up = f.find_tensor("blk.0.ffn_gate.weight") == nullptr;
  if (f.find_tensor("rope_factors_long.weight") || f.find_tensor("rope_factors_short.weight")) {
    c.rope.type = RopeType::LongRope;
    c.rope.original_max_position = int(f.get_int(p + "rope.scaling.original_context_length", 1, (int64_t(1) << 31) - 1));
    c.rope.attention_factor = f.opt_float(p + "rope.scaling.attn_factor").value_or(1.0);
    if (!(c.rope.attention_factor > 0)) f.fail_key(p + "rope.scaling.attn_factor", "must be positive");
  }
}

}  // namespace

ModelConfig gguf_model_config(const GgufFile& f) {
  ModelConfig c;
  const std::string arch = f.get_string("general.architecture");
  if (arch == "llama")
    c.arch = Architecture::Llama;
  else if (arch == "qwen2")
    c.arch = Architecture::Qwen2;
  else if (arch == "qwen3")
    c.arch = Architecture::Qwen3;
  else if (arch == "qwen3moe")
    c.arch = Architecture::Qwen3Moe;
  else if (arch == "gemma3")
    c.arch = Architecture::Gemma3;
  else if (arch == "phi3")
    c.arch = Architecture::Phi3;
  else if (arch == "smollm3")
    c.arch = Architecture::SmolLM3;
  else
    f.fail_key("general.architecture", "unsupported architecture '" + arch +
                                           "' (supported: llama, qwen2, qwen3, qwen3moe, gemma3, phi3, smollm3)");
  c.arch_name = arch;
  const std::string p = arch + ".";
  c.n_layers = int(f.get_int(p + "block_count", 1, kMaxLayers));
  c.hidden_size = int(f.get_int(p + "embedding_length", 1, kMaxWidth));
  c.intermediate_size = int(f.get_int(p + "feed_forward_length", 1, kMaxWidth));
  c.n_heads = int(f.get_int(p + "attention.head_count", 1, kMaxWidth));
  c.n_kv_heads = int(f.opt_int(p + "attention.head_count_kv", 1, kMaxWidth).value_or(c.n_heads));
  if (c.n_heads % c.n_kv_heads != 0)
    f.fail_key(p + "attention.head_count_kv", "(" + std::to_string(c.n_kv_heads) + ") must divide " + p +
                                                  "attention.head_count (" + std::to_string(c.n_heads) + ")");
  if (auto kl = f.opt_int(p + "attention.key_length", 2, kMaxHeadDim)) {
    c.head_dim = int(*kl);
  } else {
    if (c.hidden_size % c.n_heads != 0)
      f.fail_key(p + "attention.key_length", "missing, and " + p + "embedding_length is not a multiple of " + p +
                                                 "attention.head_count");
    c.head_dim = c.hidden_size / c.n_heads;
  }
  if (c.head_dim % 2 != 0) f.fail_key(p + "attention.key_length", "must be even for RoPE");
  if (int64_t(c.n_heads) * c.head_dim > kMaxWidth)
    f.fail_key(p + "attention.head_count", "times the head size is more than " + std::to_string(kMaxWidth));
  if (auto vl = f.opt_int(p + "attention.value_length", 1, kMaxHeadDim); vl && *vl != c.head_dim)
    f.fail_key(p + "attention.value_length", std::to_string(*vl) + " differs from the key length " +
                                                 std::to_string(c.head_dim) + " (not supported)");
  if (auto rd = f.opt_int(p + "rope.dimension_count", 0, kMaxHeadDim); rd && *rd != c.head_dim) {
    if (c.arch != Architecture::Phi3 || *rd < 2 || *rd % 2 != 0 || *rd > c.head_dim)
      f.fail_key(p + "rope.dimension_count", std::to_string(*rd) + ": partial rotary embeddings (head size " +
                                                 std::to_string(c.head_dim) + ") are supported for phi3 only (an even count)");
    c.rotary_dim = int(*rd);
  }
  c.max_position_embeddings = int(f.opt_int(p + "context_length", 1, (int64_t(1) << 31) - 1).value_or(4096));
  if (auto eps = f.opt_float(p + "attention.layer_norm_rms_epsilon")) {
    if (!(*eps > 0 && *eps < 1)) f.fail_key(p + "attention.layer_norm_rms_epsilon", "must be in (0, 1)");
    c.rms_norm_eps = float(*eps);
  }
  if (auto base = f.opt_float(p + "rope.freq_base")) {
    if (!(*base > 1)) f.fail_key(p + "rope.freq_base", "must be more than 1");
    c.rope.theta = *base;
  }
  // llama.cpp writes Llama 3.1's scaling as a rope_freqs tensor (Model::load_gguf), not as keys;
  // Gemma 3's linear scaling of its global layers as rope.scaling.type linear. Other scalings written
  // as keys (yarn) are ones this runtime does not compute.
  const auto scaling_type = f.opt_string(p + "rope.scaling.type");
  const auto scaling_factor = f.opt_float(p + "rope.scaling.factor");
  if (scaling_type && *scaling_type == "linear" && c.arch == Architecture::Gemma3) {
    if (scaling_factor && *scaling_factor != 1.0) {
      if (!(*scaling_factor > 0)) f.fail_key(p + "rope.scaling.factor", "must be positive");
      c.rope.type = RopeType::Linear;
      c.rope.factor = *scaling_factor;
    }
  } else if (scaling_type && *scaling_type != "none") {
    f.fail_key(p + "rope.scaling.type", "'" + *scaling_type +
                                            "' is not supported (supported: none, linear for gemma3, or llama3 as rope_freqs.weight)");
  } else if (scaling_factor && *scaling_factor != 1.0 && !f.find_tensor("rope_freqs.weight")) {
    f.fail_key(p + "rope.scaling.factor", "rope scaling without a type is not supported");
  }
  c.qkv_bias = c.arch == Architecture::Qwen2 || f.find_tensor("blk.0.attn_q.bias");
  c.o_bias = f.find_tensor("blk.0.attn_output.bias") != nullptr;
  c.qk_norm = c.arch == Architecture::Qwen3 || c.arch == Architecture::Qwen3Moe || c.arch == Architecture::Gemma3;
  c.mlp_bias = f.find_tensor("blk.0.ffn_up.bias") != nullptr;
  c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
  if (c.arch == Architecture::Qwen3Moe) gguf_moe_config(f, p, c);
  const GgufTensor* embd = f.find_tensor("token_embd.weight");
  if (!embd) throw Error(f.name() + ": tensor 'token_embd.weight' is missing");
  // The vocabulary size is read from this tensor, so its first dim is checked against the metadata
  // here: a swapped tensor would otherwise pass on a vocabulary of hidden_size tokens.
  if (embd->dims.size() != 2 || int64_t(embd->dims[0]) != c.hidden_size) {
    const bool swapped = embd->dims.size() == 2 && int64_t(embd->dims[1]) == c.hidden_size;
    throw Error(f.name() + ": tensor 'token_embd.weight' has dims " + embd->dims_str() + ", expected [" +
                std::to_string(c.hidden_size) + ", n_vocab] ([" + p + "embedding_length, tokens])" +
                (swapped ? ": its two dims are swapped" : ""));
  }
  c.vocab_size = int(embd->dims[1]);
  if (auto sw = f.opt_int(p + "attention.sliding_window", 0, int64_t(1) << 30)) c.sliding_window = int(*sw);
  c.layer_kinds.assign(size_t(c.n_layers), c.sliding_window > 0 ? AttentionKind::Sliding : AttentionKind::Full);
  if (c.arch == Architecture::Gemma3) gguf_gemma3(f, p, c);
  if (c.arch == Architecture::Phi3) gguf_phi3(f, p, c);
  if (c.arch == Architecture::SmolLM3) {
    // llama.cpp's smollm3: every 4th layer without RoPE (hard-wired); this runtime's writer also
    // records the per-layer list (smollm3.no_rope_layers, 1 = RoPE) for other layouts.
    c.layer_rope.assign(size_t(c.n_layers), LayerRope::Main);
    if (const GgufValue* a = f.opt_array(p + "no_rope_layers", {GgufType::I32, GgufType::U32, GgufType::I8, GgufType::U8})) {
      if (a->array.size() != size_t(c.n_layers)) f.fail_key(p + "no_rope_layers", "must have block_count entries");
      for (size_t i = 0; i < a->array.size(); ++i)
        if (!nonzero(a->array[i])) c.layer_rope[i] = LayerRope::None;
    } else {
      for (int i = 0; i < c.n_layers; ++i)
        if ((i + 1) % 4 == 0) c.layer_rope[size_t(i)] = LayerRope::None;
    }
  }
  c.kv_source.resize(size_t(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) c.kv_source[size_t(i)] = i;
  if (auto bos = f.opt_int("tokenizer.ggml.bos_token_id", 0, c.vocab_size - 1)) c.bos_token_id = int(*bos);
  for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"})
    if (auto id = f.opt_int(k, 0, c.vocab_size - 1)) c.eos_token_ids.push_back(int(*id));
  c.dtype = "GGUF";
  c.gguf = true;
  if (auto ft = f.opt_int("general.file_type", 0, 1 << 20)) {
    // llama.cpp's LLAMA_FTYPE_* names (informational, as config.json's torch_dtype)
    static const std::map<int64_t, const char*> names = {
        {0, "F32"},     {1, "F16"},     {2, "Q4_0"},    {3, "Q4_1"},    {7, "Q8_0"},    {8, "Q5_0"},
        {9, "Q5_1"},    {10, "Q2_K"},   {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"}, {14, "Q4_K_S"},
        {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"},   {32, "BF16"}};
    auto it = names.find(*ft);
    c.dtype = "GGUF " + (it != names.end() ? std::string(it->second) : "file_type " + std::to_string(*ft));
  }
  return c;
}

GgufVocab gguf_vocab(const GgufFile& f) {
  GgufVocab v;
  v.source = f.name();
  v.model = f.opt_string("tokenizer.ggml.model").value_or("");
  if (v.model.empty()) f.fail_key("tokenizer.ggml.model", "missing (the file has no embedded tokenizer)");
  v.pre = f.opt_string("tokenizer.ggml.pre").value_or("");
  if (const GgufValue* t = f.opt_array("tokenizer.ggml.tokens", {GgufType::String}))
    for (const GgufValue& e : t->array) v.tokens.push_back(e.str);
  if (const GgufValue* s = f.opt_array("tokenizer.ggml.scores", {GgufType::F32, GgufType::F64}))
    for (const GgufValue& e : s->array) v.scores.push_back(float(e.f));
  if (const GgufValue* t = f.opt_array("tokenizer.ggml.token_type", {GgufType::I32, GgufType::U32, GgufType::I8,
                                                                     GgufType::U8, GgufType::I16, GgufType::U16}))
    for (const GgufValue& e : t->array) v.types.push_back(int32_t(std::clamp<int64_t>(e.i, -1, 1 << 20)));
  if (const GgufValue* m = f.opt_array("tokenizer.ggml.merges", {GgufType::String}))
    for (const GgufValue& e : m->array) v.merges.push_back(e.str);
  const int64_t n = int64_t(v.tokens.size());
  auto id = [&](const char* key) -> std::optional<int32_t> {
    if (auto i = f.opt_int(key, 0, std::max<int64_t>(n - 1, 0))) return int32_t(*i);
    return std::nullopt;
  };
  v.bos = id("tokenizer.ggml.bos_token_id");
  v.eos = id("tokenizer.ggml.eos_token_id");
  v.eot = id("tokenizer.ggml.eot_token_id");
  v.unk = id("tokenizer.ggml.unknown_token_id");
  v.pad = id("tokenizer.ggml.padding_token_id");
  v.add_bos = f.opt_bool("tokenizer.ggml.add_bos_token");
  v.add_eos = f.opt_bool("tokenizer.ggml.add_eos_token");
  v.add_space_prefix = f.opt_bool("tokenizer.ggml.add_space_prefix");
  v.chat_template = f.opt_string("tokenizer.chat_template");
  return v;
}

// llama.cpp's converter permutes Q/K rows for its llama architecture and the ones converted as
// llama (smollm3).
bool gguf_qk_permuted(const GgufFile& f) {
  const auto arch = f.opt_string("general.architecture");
  return arch == "llama" || arch == "smollm3";
}

}  // namespace ptllm
