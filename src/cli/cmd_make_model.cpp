// posttrainllm make-model: a random-weight checkpoint in the Hugging Face layout (config.json +
// model.safetensors) with the exact shapes of a real model, so speed can be measured at real sizes
// without downloading anything. Weights: normal with std 0.02 (biases too), norms 1. The tokenizer is a
// synthetic byte-level BPE of exactly the vocabulary's size (its merges are not a real model's), so
// that every command and other runtimes (llama.cpp, from a GGUF copy) load the checkpoint.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/thread_pool.h"
#include "model/safetensors_writer.h"
#include "tokenizer/synthetic.h"

namespace ptllm::cli {

namespace {

// The config.json values of the real models (their Hugging Face configs), plus a tiny one for tests.
struct ModelShape {
  const char* name;
  const char* architecture;
  int vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, max_position;
  double rope_theta;
  bool llama3_rope;  // Llama 3.1+ frequency scaling (factor 32, low 1, high 4, original 8192)
  bool tie_embeddings;
  double rms_norm_eps;
  int bos, eos;
  // Routed experts (Qwen3-MoE): 0 experts for a dense model.
  int experts = 0, experts_per_token = 0, moe_intermediate = 0;
};

const ModelShape kShapes[] = {
    {"tiny", "LlamaForCausalLM", 512, 64, 160, 2, 4, 2, 16, 1024, 10000.0, false, true, 1e-5, 0, 1},
    {"smollm2-135m", "LlamaForCausalLM", 49152, 576, 1536, 30, 9, 3, 64, 8192, 100000.0, false, true, 1e-5, 0, 0},
    {"qwen2.5-0.5b", "Qwen2ForCausalLM", 151936, 896, 4864, 24, 14, 2, 64, 32768, 1000000.0, false, true, 1e-6,
     151643, 151643},
    {"llama-3.2-1b", "LlamaForCausalLM", 128256, 2048, 8192, 16, 32, 8, 64, 131072, 500000.0, true, true, 1e-5, 128000,
     128001},
    {"qwen3-30b-a3b", "Qwen3MoeForCausalLM", 151936, 2048, 6144, 48, 32, 4, 128, 40960, 1000000.0, false, false, 1e-6,
     151643, 151645, 128, 8, 768},
};

std::vector<std::string> shape_names() {
  std::vector<std::string> out;
  for (const auto& s : kShapes) out.push_back(s.name);
  return out;
}

// `name` is one of shape_names() (CLI11 checks it).
const ModelShape& find_shape(const std::string& name) {
  const ModelShape* found = nullptr;
  for (const auto& s : kShapes)
    if (name == s.name) found = &s;
  PTLLM_CHECK(found);
  return *found;
}

struct MakeModelArgs {
  std::string shape;
  std::string dtype = "bf16";
  std::string out_dir;
  uint64_t seed = 0;
  int threads = 0;
  int layers = 0;  // > 0: this many layers instead of the shape's
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  enum Init { Normal, Ones } init;
  size_t numel() const {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    return n;
  }
};

std::vector<TensorSpec> tensor_specs(const ModelShape& s) {
  const int64_t H = s.hidden, I = s.intermediate, Q = int64_t(s.heads) * s.head_dim, KV = int64_t(s.kv_heads) * s.head_dim;
  const bool qwen = std::string(s.architecture) == "Qwen2ForCausalLM";
  const bool qwen3 = std::string(s.architecture) == "Qwen3MoeForCausalLM";  // q_norm / k_norm, experts
  const int64_t E = s.experts, EI = s.moe_intermediate;
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", {s.vocab, H}, TensorSpec::Normal});
  for (int i = 0; i < s.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "input_layernorm.weight", {H}, TensorSpec::Ones});
    t.push_back({p + "self_attn.q_proj.weight", {Q, H}, TensorSpec::Normal});
    t.push_back({p + "self_attn.k_proj.weight", {KV, H}, TensorSpec::Normal});
    t.push_back({p + "self_attn.v_proj.weight", {KV, H}, TensorSpec::Normal});
    if (qwen) {
      t.push_back({p + "self_attn.q_proj.bias", {Q}, TensorSpec::Normal});
      t.push_back({p + "self_attn.k_proj.bias", {KV}, TensorSpec::Normal});
      t.push_back({p + "self_attn.v_proj.bias", {KV}, TensorSpec::Normal});
    }
    t.push_back({p + "self_attn.o_proj.weight", {H, Q}, TensorSpec::Normal});
    if (qwen3) {
      t.push_back({p + "self_attn.q_norm.weight", {s.head_dim}, TensorSpec::Ones});
      t.push_back({p + "self_attn.k_norm.weight", {s.head_dim}, TensorSpec::Ones});
    }
    t.push_back({p + "post_attention_layernorm.weight", {H}, TensorSpec::Ones});
    if (E > 0) {  // the hub's layout: one module per expert
      t.push_back({p + "mlp.gate.weight", {E, H}, TensorSpec::Normal});
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        t.push_back({x + "gate_proj.weight", {EI, H}, TensorSpec::Normal});
        t.push_back({x + "up_proj.weight", {EI, H}, TensorSpec::Normal});
        t.push_back({x + "down_proj.weight", {H, EI}, TensorSpec::Normal});
      }
      continue;
    }
    t.push_back({p + "mlp.gate_proj.weight", {I, H}, TensorSpec::Normal});
    t.push_back({p + "mlp.up_proj.weight", {I, H}, TensorSpec::Normal});
    t.push_back({p + "mlp.down_proj.weight", {H, I}, TensorSpec::Normal});
  }
  t.push_back({"model.norm.weight", {H}, TensorSpec::Ones});
  if (!s.tie_embeddings) t.push_back({"lm_head.weight", {s.vocab, H}, TensorSpec::Normal});
  return t;
}

nlohmann::json config_json(const ModelShape& s, const std::string& torch_dtype) {
  const bool qwen = std::string(s.architecture) == "Qwen2ForCausalLM";
  const bool moe = s.experts > 0;
  nlohmann::json j = {{"architectures", {s.architecture}},
                      {"model_type", moe ? "qwen3_moe" : qwen ? "qwen2" : "llama"},
                      {"vocab_size", s.vocab},
                      {"hidden_size", s.hidden},
                      {"intermediate_size", s.intermediate},
                      {"num_hidden_layers", s.layers},
                      {"num_attention_heads", s.heads},
                      {"num_key_value_heads", s.kv_heads},
                      {"head_dim", s.head_dim},
                      {"max_position_embeddings", s.max_position},
                      {"rms_norm_eps", s.rms_norm_eps},
                      {"rope_theta", s.rope_theta},
                      {"tie_word_embeddings", s.tie_embeddings},
                      {"hidden_act", "silu"},
                      {"bos_token_id", s.bos},
                      {"eos_token_id", s.eos},
                      {"torch_dtype", torch_dtype},
                      {"use_cache", true}};
  if (s.llama3_rope)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 32.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
  else
    j["rope_scaling"] = nullptr;
  if (moe) {
    j["attention_bias"] = false;
    j["num_experts"] = s.experts;
    j["num_experts_per_tok"] = s.experts_per_token;
    j["moe_intermediate_size"] = s.moe_intermediate;
    j["norm_topk_prob"] = true;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::json::array();
    j["use_sliding_window"] = false;
  } else if (!qwen) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  }
  return j;
}

// Standard normal quantiles at (i + 0.5) / 65536: a 16-bit random index gives a normal sample
// (tails cut at 4.3 sigma), far faster than Box-Muller for a billion weights.
const std::vector<float>& normal_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (size_t i = 0; i < t.size(); ++i) {
      const double p = (double(i) + 0.5) / double(t.size());
      double lo = -10, hi = 10;  // bisection on Phi(z) = erfc(-z / sqrt 2) / 2
      for (int it = 0; it < 60; ++it) {
        const double mid = 0.5 * (lo + hi);
        (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
      }
      t[i] = float(0.5 * (lo + hi));
    }
    return t;
  }();
  return table;
}

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr size_t kChunk = size_t(1) << 20;  // elements generated from one seed

// Elements [first, first + n) of a tensor, converted to `dtype` into out. Each chunk of kChunk
// elements has its own seed, so the values do not depend on the thread count.
void fill(const TensorSpec& t, size_t tensor_index, uint64_t seed, DType dtype, size_t first, size_t n, uint8_t* out) {
  const std::vector<float>& table = normal_table();
  std::vector<float> v(n);
  if (t.init == TensorSpec::Ones) {
    std::fill(v.begin(), v.end(), 1.0f);
  } else {
    PTLLM_CHECK(first % kChunk == 0);
    uint64_t state = seed ^ (uint64_t(tensor_index) << 32) ^ (first / kChunk) * 0x632be59bd9b4e019ull;
    for (size_t i = 0; i < n; i += 4) {
      const uint64_t r = splitmix64(state);
      for (size_t j = 0; j < 4 && i + j < n; ++j) v[i + j] = 0.02f * table[(r >> (16 * j)) & 0xffff];
    }
  }
  switch (dtype) {
    case DType::F32: std::memcpy(out, v.data(), n * 4); break;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(v[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      break;
    default:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(v[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      break;
  }
}

// The special tokens at the shape's bos and eos ids, named as in the real model's tokenizer.
struct SpecialNames {
  const char* bos;
  const char* eos;
  bool add_bos;
};
SpecialNames special_names(const ModelShape& s) {
  const std::string arch = s.architecture, name = s.name;
  if (name.rfind("llama-3", 0) == 0) return {"<|begin_of_text|>", "<|end_of_text|>", true};
  if (arch.rfind("Qwen", 0) == 0) return {"<|endoftext|>", s.eos == s.bos ? "<|endoftext|>" : "<|im_end|>", false};
  if (s.bos == s.eos) return {"<|endoftext|>", "<|endoftext|>", false};
  return {"<s>", "</s>", false};
}

// tokenizer.json and tokenizer_config.json: a byte-level BPE of exactly s.vocab ids, the specials at
// the shape's bos and eos ids.
std::pair<nlohmann::json, nlohmann::json> synthetic_tokenizer(const ModelShape& s) {
  const SpecialNames sp = special_names(s);
  nlohmann::json tok = tok::synthetic_byte_level_bpe(s.vocab, {{s.bos, sp.bos}, {s.eos, sp.eos}});
  nlohmann::json cfg = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                        {"bos_token", sp.bos},
                        {"eos_token", sp.eos},
                        {"add_bos_token", sp.add_bos},
                        {"add_eos_token", false},
                        {"model_max_length", s.max_position}};
  return {std::move(tok), std::move(cfg)};
}

int run_make_model(const MakeModelArgs& a) {
  namespace fs = std::filesystem;
  ModelShape shape = find_shape(a.shape);
  if (a.layers > 0) shape.layers = a.layers;
  const DType dtype = a.dtype == "f32" ? DType::F32 : a.dtype == "f16" ? DType::F16 : DType::BF16;
  const char* torch_dtype = a.dtype == "f32" ? "float32" : a.dtype == "f16" ? "float16" : "bfloat16";
  const size_t esize = dtype_size(dtype);
  const fs::path dir(a.out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw Error(dir.string() + ": cannot create the directory (" + ec.message() + ")");

  // Written to a temporary name, synced and renamed (core/file_io.h): an interrupted run leaves no
  // half model behind.
  const std::vector<TensorSpec> specs = tensor_specs(shape);
  std::vector<TensorDecl> decls;
  size_t params = 0;
  for (const auto& t : specs) {
    decls.push_back({t.name, dtype, t.shape});
    params += t.numel();
  }
  const fs::path weights = dir / "model.safetensors";
  SafetensorsWriter out(weights, std::move(decls), {{"format", "pt"}});

  ThreadPool pool(a.threads > 0 ? a.threads : ThreadPool::default_threads());
  constexpr size_t kBatchChunks = 32;  // chunks generated in parallel, then written (64 MiB of bf16)
  std::vector<uint8_t> buf(kBatchChunks * kChunk * esize);
  for (size_t ti = 0; ti < specs.size(); ++ti) {
    const TensorSpec& t = specs[ti];
    const size_t n = t.numel();
    for (size_t first = 0; first < n; first += kBatchChunks * kChunk) {
      const size_t count = std::min(n - first, kBatchChunks * kChunk);
      pool.parallel_for((count + kChunk - 1) / kChunk, [&](size_t b, size_t e) {
        for (size_t c = b; c < e; ++c) {
          const size_t s = c * kChunk, m = std::min(kChunk, count - s);
          fill(t, ti, a.seed, dtype, first + s, m, buf.data() + s * esize);
        }
      });
      out.write({reinterpret_cast<const char*>(buf.data()), count * esize});
    }
  }
  out.commit();
  write_file_atomically(dir / "config.json", {config_json(shape, torch_dtype).dump(2), "\n"});
  const auto [tok, tok_cfg] = synthetic_tokenizer(shape);
  write_file_atomically(dir / "tokenizer.json", {tok.dump(), "\n"});
  write_file_atomically(dir / "tokenizer_config.json", {tok_cfg.dump(2), "\n"});
  std::fprintf(stderr, "wrote %s: %s shape, %d layers, %s, %.1f M parameters, %s\n", dir.string().c_str(),
               shape.name, shape.layers, torch_dtype, double(params) / 1e6, format_bytes(fs::file_size(weights)).c_str());
  return 0;
}

}  // namespace

Command add_make_model_command(CLI::App& root) {
  auto a = std::make_shared<MakeModelArgs>();
  CLI::App* app = root.add_subcommand("make-model", "Write a random-weight checkpoint with the shapes of a real model");
  app->add_option("out_dir", a->out_dir, "Directory to write config.json and model.safetensors into")->required();
  app->add_option("--shape", a->shape, "Model shape")->required()->check(CLI::IsMember(shape_names()));
  app->add_option("--dtype", a->dtype, "Weight dtype: bf16, f16 or f32")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}));
  app->add_option("--seed", a->seed, "Seed of the random weights")->check(unsigned_integer());
  app->add_option("--layers", a->layers, "Layers (default: the shape's), for a smaller model of the same width")
      ->check(CLI::Range(1, 4096));
  app->add_option("--threads,-t", a->threads, "Threads generating the weights (0 = all cores)")
      ->check(thread_count());
  return {app, [a] { return run_make_model(*a); }};
}

}  // namespace ptllm::cli
