#include "model/gguf_model.h"

#include <algorithm>
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

}  // namespace

ModelConfig gguf_model_config(const GgufFile& f) {
  ModelConfig c;
  const std::string arch = f.get_string("general.architecture");
  if (arch == "llama")
    c.arch = Architecture::Llama;
  else if (arch == "qwen2")
    c.arch = Architecture::Qwen2;
  else if (arch == "qwen3moe")
    c.arch = Architecture::Qwen3Moe;
  else
    f.fail_key("general.architecture", "unsupported architecture '" + arch + "' (supported: llama, qwen2, qwen3moe)");
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
  if (auto rd = f.opt_int(p + "rope.dimension_count", 0, kMaxHeadDim); rd && *rd != c.head_dim)
    f.fail_key(p + "rope.dimension_count", std::to_string(*rd) + ": partial rotary embeddings (head size " +
                                               std::to_string(c.head_dim) + ") are not supported");
  c.max_position_embeddings = int(f.opt_int(p + "context_length", 1, (int64_t(1) << 31) - 1).value_or(4096));
  if (auto eps = f.opt_float(p + "attention.layer_norm_rms_epsilon")) {
    if (!(*eps > 0 && *eps < 1)) f.fail_key(p + "attention.layer_norm_rms_epsilon", "must be in (0, 1)");
    c.rms_norm_eps = float(*eps);
  }
  if (auto base = f.opt_float(p + "rope.freq_base")) {
    if (!(*base > 1)) f.fail_key(p + "rope.freq_base", "must be more than 1");
    c.rope.theta = *base;
  }
  // llama.cpp writes Llama 3.1's scaling as a rope_freqs tensor (Model::load_gguf), not as keys; a
  // scaling it writes as keys (linear, yarn) is one this runtime does not compute.
  if (auto type = f.opt_string(p + "rope.scaling.type"); type && *type != "none")
    f.fail_key(p + "rope.scaling.type", "'" + *type + "' is not supported (supported: none, or llama3 as rope_freqs.weight)");
  if (auto factor = f.opt_float(p + "rope.scaling.factor"); factor && *factor != 1.0 && !f.find_tensor("rope_freqs.weight"))
    f.fail_key(p + "rope.scaling.factor", "rope scaling without a type is not supported");
  c.qkv_bias = c.arch == Architecture::Qwen2 || f.find_tensor("blk.0.attn_q.bias");
  c.o_bias = f.find_tensor("blk.0.attn_output.bias") != nullptr;
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
  c.kv_source.resize(size_t(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) c.kv_source[size_t(i)] = i;
  if (auto bos = f.opt_int("tokenizer.ggml.bos_token_id", 0, c.vocab_size - 1)) c.bos_token_id = int(*bos);
  for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"})
    if (auto id = f.opt_int(k, 0, c.vocab_size - 1)) c.eos_token_ids.push_back(int(*id));
  c.dtype = "GGUF";
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

bool gguf_qk_permuted(const GgufFile& f) { return f.opt_string("general.architecture") == "llama"; }

}  // namespace ptllm
