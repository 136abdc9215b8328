#include "model/gguf_writer.h"

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numbers>

#include "core/error.h"
#include "core/file_io.h"
#include "kernels/ggml.h"
#include "model/config.h"
#include "model/gguf_model.h"
#include "model/safetensors.h"
#include "tokenizer/gguf_vocab.h"

namespace ptllm {

namespace {

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

GgufValue scalar(GgufType t) {
  GgufValue v;
  v.type = t;
  return v;
}

}  // namespace

void gguf_append_value(std::string& out, const GgufValue& v) {
  switch (v.type) {
    case GgufType::U8: put<uint8_t>(out, uint8_t(v.u)); break;
    case GgufType::I8: put<int8_t>(out, int8_t(v.i)); break;
    case GgufType::U16: put<uint16_t>(out, uint16_t(v.u)); break;
    case GgufType::I16: put<int16_t>(out, int16_t(v.i)); break;
    case GgufType::U32: put<uint32_t>(out, uint32_t(v.u)); break;
    case GgufType::I32: put<int32_t>(out, int32_t(v.i)); break;
    case GgufType::U64: put<uint64_t>(out, v.u); break;
    case GgufType::I64: put<int64_t>(out, v.i); break;
    case GgufType::F32: put<float>(out, float(v.f)); break;
    case GgufType::F64: put<double>(out, v.f); break;
    case GgufType::Bool: put<uint8_t>(out, v.b ? 1 : 0); break;
    case GgufType::String: put_string(out, v.str); break;
    case GgufType::Array:
      put<uint32_t>(out, uint32_t(v.elem));
      put<uint64_t>(out, v.array.size());
      for (const GgufValue& e : v.array) gguf_append_value(out, e);
      break;
  }
}

void GgufBuilder::add(const std::string& key, GgufValue v) { kv_.emplace_back(key, std::move(v)); }
void GgufBuilder::add_string(const std::string& key, const std::string& s) {
  GgufValue v = scalar(GgufType::String);
  v.str = s;
  add(key, std::move(v));
}
void GgufBuilder::add_u32(const std::string& key, uint32_t x) {
  GgufValue v = scalar(GgufType::U32);
  v.u = x;
  v.i = int64_t(x);
  add(key, std::move(v));
}
void GgufBuilder::add_f32(const std::string& key, float x) {
  GgufValue v = scalar(GgufType::F32);
  v.f = x;
  add(key, std::move(v));
}
void GgufBuilder::add_bool(const std::string& key, bool x) {
  GgufValue v = scalar(GgufType::Bool);
  v.b = x;
  add(key, std::move(v));
}
void GgufBuilder::add_strings(const std::string& key, const std::vector<std::string>& xs) {
  GgufValue v = scalar(GgufType::Array);
  v.elem = GgufType::String;
  for (const auto& s : xs) {
    GgufValue e = scalar(GgufType::String);
    e.str = s;
    v.array.push_back(std::move(e));
  }
  add(key, std::move(v));
}
void GgufBuilder::add_f32s(const std::string& key, const std::vector<float>& xs) {
  GgufValue v = scalar(GgufType::Array);
  v.elem = GgufType::F32;
  for (float x : xs) {
    GgufValue e = scalar(GgufType::F32);
    e.f = x;
    v.array.push_back(e);
  }
  add(key, std::move(v));
}
void GgufBuilder::add_i32s(const std::string& key, const std::vector<int32_t>& xs) {
  GgufValue v = scalar(GgufType::Array);
  v.elem = GgufType::I32;
  for (int32_t x : xs) {
    GgufValue e = scalar(GgufType::I32);
    e.i = x;
    v.array.push_back(e);
  }
  add(key, std::move(v));
}

void GgufBuilder::add_tensor(const std::string& name, std::vector<uint64_t> dims, GgmlType type, Fill fill) {
  const GgmlTypeInfo info = ggml_type_info(type);
  PTLLM_CHECK(!info.name.empty() && !dims.empty() && dims[0] % uint64_t(info.block_elems) == 0);
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  tensors_.push_back({name, std::move(dims), type, n / uint64_t(info.block_elems) * uint64_t(info.block_bytes),
                      std::move(fill)});
}

std::string GgufBuilder::header(uint32_t alignment) const {
  std::string h;
  put<uint32_t>(h, 0x46554747);  // "GGUF"
  put<uint32_t>(h, 3);
  put<uint64_t>(h, tensors_.size());
  put<uint64_t>(h, kv_.size());
  for (const auto& [k, v] : kv_) {
    put_string(h, k);
    put<uint32_t>(h, uint32_t(v.type));
    gguf_append_value(h, v);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(h, t.name);
    put<uint32_t>(h, uint32_t(t.dims.size()));
    for (uint64_t d : t.dims) put<uint64_t>(h, d);
    put<uint32_t>(h, uint32_t(t.type));
    put<uint64_t>(h, offset);
    offset += (t.nbytes + alignment - 1) / alignment * alignment;
  }
  h.resize((h.size() + alignment - 1) / alignment * alignment, '\0');
  return h;
}

uint64_t GgufBuilder::write(const std::filesystem::path& path, uint32_t alignment) const {
  AtomicFile out(path);
  out.write(header(alignment));
  std::vector<uint8_t> buf;
  for (const Tensor& t : tensors_) {
    const uint64_t padded = (t.nbytes + alignment - 1) / alignment * alignment;
    buf.assign(size_t(padded), 0);
    t.fill(buf.data());
    out.write({reinterpret_cast<const char*>(buf.data()), buf.size()});
  }
  return out.commit();
}

namespace {

// Llama 3.1's frequency divisors as the converter computes them (rope_freqs.weight): inv_freq_i is
// divided by factor_i.
std::vector<float> llama3_rope_factors(const RopeConfig& r, int head_dim) {
  std::vector<float> f;
  const double low_wavelen = r.original_max_position / r.low_freq_factor;
  const double high_wavelen = r.original_max_position / r.high_freq_factor;
  for (int i = 0; i < head_dim / 2; ++i) {
    const float base = float(1.0 / std::pow(r.theta, double(float(2 * i) / float(head_dim))));
    const double wavelen = 2 * std::numbers::pi / double(base);
    if (wavelen < high_wavelen) {
      f.push_back(1.f);
    } else if (wavelen > low_wavelen) {
      f.push_back(float(r.factor));
    } else {
      const double smooth =
          (r.original_max_position / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      f.push_back(float(1.0 / ((1 - smooth) / r.factor + smooth)));
    }
  }
  return f;
}

nlohmann::json read_json(const std::filesystem::path& p, uint64_t limit, bool optional) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) {
    if (optional) return nlohmann::json::object();
    throw Error(p.string() + ": no such file");
  }
  nlohmann::json j = nlohmann::json::parse(read_whole_file(p, limit, p.filename().string()), nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(p.string() + ": not a valid JSON object");
  return j;
}

// One row of floats in a GGUF tensor type.
void write_row(GgmlType t, const float* row, int64_t cols, uint8_t* o) {
  switch (t) {
    case GgmlType::F32: std::memcpy(o, row, size_t(cols) * sizeof(float)); break;
    case GgmlType::F16:
      for (int64_t k = 0; k < cols; ++k) {
        const uint16_t h = f32_to_f16(row[k]);
        std::memcpy(o + 2 * k, &h, 2);
      }
      break;
    case GgmlType::BF16:
      for (int64_t k = 0; k < cols; ++k) {
        const uint16_t h = f32_to_bf16(row[k]);
        std::memcpy(o + 2 * k, &h, 2);
      }
      break;
    default: ggml_quantize_row(t, row, int(cols), o); break;
  }
}

void add_vocab(GgufBuilder& b, const GgufVocab& v) {
  b.add_string("tokenizer.ggml.model", v.model);
  if (v.model == "gpt2") b.add_string("tokenizer.ggml.pre", v.pre);
  b.add_strings("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) b.add_f32s("tokenizer.ggml.scores", v.scores);
  b.add_i32s("tokenizer.ggml.token_type", v.types);
  if (v.model == "gpt2") b.add_strings("tokenizer.ggml.merges", v.merges);
  if (v.bos) b.add_u32("tokenizer.ggml.bos_token_id", uint32_t(*v.bos));
  if (v.eos) b.add_u32("tokenizer.ggml.eos_token_id", uint32_t(*v.eos));
  if (v.unk) b.add_u32("tokenizer.ggml.unknown_token_id", uint32_t(*v.unk));
  if (v.pad) b.add_u32("tokenizer.ggml.padding_token_id", uint32_t(*v.pad));
  if (v.add_bos) b.add_bool("tokenizer.ggml.add_bos_token", *v.add_bos);
  if (v.add_eos) b.add_bool("tokenizer.ggml.add_eos_token", *v.add_eos);
  if (v.add_space_prefix) b.add_bool("tokenizer.ggml.add_space_prefix", *v.add_space_prefix);
  if (v.chat_template) b.add_string("tokenizer.chat_template", *v.chat_template);
}

}  // namespace

GgufWriteResult write_gguf_from_hf(const std::filesystem::path& dir, const std::filesystem::path& out,
                                   GgufMix mix) {
  const ModelConfig c = ModelConfig::load(dir / "config.json");
  const std::string cfg_file = (dir / "config.json").string();
  if (c.arch_name == "Gemma3ForConditionalGeneration")
    throw Error(cfg_file + ": architectures 'Gemma3ForConditionalGeneration': the writer takes causal LM checkpoints "
                "(its text model's tensors are under language_model)");
  if (c.arch == Architecture::YocoLlama || c.num_kv_shared_layers > 0)
    throw Error(cfg_file + ": architectures '" + c.arch_name + "' (cross-layer KV sharing): GGUF has no such architecture");
  const bool gemma = c.arch == Architecture::Gemma3, phi3 = c.arch == Architecture::Phi3,
             smollm3 = c.arch == Architecture::SmolLM3;
  if (c.sliding_window > 0 && c.arch != Architecture::Mistral && !gemma && !phi3)
    throw Error(cfg_file + ": sliding_window on " + c.arch_name + ": not written to GGUF (Mistral, Gemma 3, Phi-3 only)");
  const bool moe = c.arch == Architecture::Qwen3Moe;
  const bool qwen = c.arch == Architecture::Qwen2 || c.arch == Architecture::Qwen3 || moe;
  const std::string arch = moe ? std::string("qwen3moe")
                               : std::string(qwen || gemma || phi3 || smollm3 ? architecture_name(c.arch) : "llama");
  // llama.cpp's converter permutes Q/K for its llama architecture and the ones it converts as llama
  const bool permute = arch == "llama" || smollm3;
  // What llama.cpp's GGUF cannot say is refused, so that the file means the same to llama.cpp.
  int swa_period = 0;
  if (gemma) {
    const double natural = c.n_layers == 62 ? double(c.hidden_size) / c.n_heads : double(c.head_dim);
    if (c.query_pre_attn_scalar != natural)
      throw Error(cfg_file + ": query_pre_attn_scalar " + std::to_string(c.query_pre_attn_scalar) +
                  ": GGUF gemma3 has no such key (llama.cpp scales by 1/sqrt(head_dim), " +
                  std::to_string(int(natural)) + " here)");
    if (c.sliding_window > 0) {
      // llama.cpp: layer i slides unless i % period == period - 1
      for (int period = 1; period <= c.n_layers + 1 && swa_period == 0; ++period) {
        bool same = true;
        for (int i = 0; i < c.n_layers; ++i)
          same &= (c.layer_kinds[size_t(i)] == AttentionKind::Sliding) == (i % period < period - 1);
        if (same) swa_period = period;
      }
      if (swa_period == 0)
        throw Error(cfg_file + ": layer_types: not a period (every n-th layer global), which is all GGUF gemma3 can say");
    }
    if (c.rope_local.type != RopeType::Default)
      throw Error(cfg_file + ": the sliding layers' rope scaling: GGUF gemma3 has no such key");
  }
  if (smollm3)
    for (int i = 0; i < c.n_layers; ++i)
      if ((c.rope_of(i) == LayerRope::None) != ((i + 1) % 4 == 0))
        throw Error(cfg_file + ": no_rope_layers: llama.cpp's smollm3 takes every 4th layer as the one without RoPE, "
                    "and this model's layout differs (layer " + std::to_string(i) + ")");
  if (c.rope.type == RopeType::Linear && !gemma)
    throw Error(cfg_file + ": rope type linear on " + c.arch_name + ": not written to GGUF");
  if (c.rope.type == RopeType::LongRope && !phi3)
    throw Error(cfg_file + ": rope type longrope on " + c.arch_name + ": not written to GGUF");

  // The tokenizer first: a layout GGUF cannot name fails before any weight is read.
  const nlohmann::json tok = read_json(dir / "tokenizer.json", kMaxTokenizerJsonBytes, false);
  const nlohmann::json tcfg = read_json(dir / "tokenizer_config.json", kMaxJsonConfigBytes, true);
  GgufVocab vocab = gguf_vocab_from_tokenizer_json(tok, tcfg, (dir / "tokenizer.json").string());
  // GGUF readers size the embedding by the token list: pad it to vocab_size with unused tokens, as
  // llama.cpp's converter does (Qwen's tokenizers have 151,669 ids for 151,936 rows).
  if (vocab.tokens.size() > size_t(c.vocab_size))
    throw Error((dir / "tokenizer.json").string() + ": " + std::to_string(vocab.tokens.size()) +
                " tokens, more than the config's vocab_size " + std::to_string(c.vocab_size));
  if (vocab.types.empty()) vocab.types.assign(vocab.tokens.size(), int32_t(GgufTokenType::Normal));
  for (size_t i = vocab.tokens.size(); i < size_t(c.vocab_size); ++i) {
    vocab.tokens.push_back("[PAD" + std::to_string(i) + "]");
    vocab.types.push_back(int32_t(GgufTokenType::Unused));
    if (!vocab.scores.empty()) vocab.scores.push_back(0.f);
  }

  auto files = std::make_shared<WeightFiles>(WeightFiles::open(dir));
  GgufBuilder b;
  b.add_string("general.architecture", arch);
  b.add_string("general.type", "model");
  b.add_string("general.name", std::filesystem::absolute(dir).lexically_normal().filename().string());
  b.add_u32("general.alignment", kGgufDefaultAlignment);
  const std::string p = arch + ".";
  b.add_u32(p + "block_count", uint32_t(c.n_layers));
  b.add_u32(p + "context_length", uint32_t(c.max_position_embeddings));
  b.add_u32(p + "embedding_length", uint32_t(c.hidden_size));
  b.add_u32(p + "feed_forward_length", uint32_t(c.intermediate_size));
  b.add_u32(p + "attention.head_count", uint32_t(c.n_heads));
  b.add_u32(p + "attention.head_count_kv", uint32_t(c.n_kv_heads));
  b.add_f32(p + "rope.freq_base", float(c.rope.theta));
  b.add_f32(p + "attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  b.add_u32(p + "attention.key_length", uint32_t(c.head_dim));
  b.add_u32(p + "attention.value_length", uint32_t(c.head_dim));
  if (c.sliding_window > 0) b.add_u32(p + "attention.sliding_window", uint32_t(c.sliding_window));
  b.add_u32(p + "vocab_size", uint32_t(c.vocab_size));
  b.add_u32(p + "rope.dimension_count", uint32_t(c.rotated_dims()));
  if (gemma) {
    if (c.final_logit_softcapping > 0) b.add_f32(p + "final_logit_softcapping", c.final_logit_softcapping);
    if (swa_period > 0) b.add_u32(p + "attention.sliding_window_pattern", uint32_t(swa_period));
    b.add_f32(p + "rope.freq_base_swa", float(c.rope_local.theta));
    if (c.rope.type == RopeType::Linear) {
      b.add_string(p + "rope.scaling.type", "linear");
      b.add_f32(p + "rope.scaling.factor", float(c.rope.factor));
    }
  }
  if (phi3) {
    if (c.sliding_window == 0) b.add_u32(p + "attention.sliding_window", 0);  // the converter's "none"
    if (c.rope.type == RopeType::LongRope) {
      b.add_f32(p + "rope.scaling.attn_factor", float(c.rope.attention_factor));
      b.add_u32(p + "rope.scaling.original_context_length", uint32_t(c.rope.original_max_position));
    }
  }
  if (moe) {
    b.add_u32(p + "expert_count", uint32_t(c.moe.num_experts));
    b.add_u32(p + "expert_used_count", uint32_t(c.moe.top_k));
    b.add_u32(p + "expert_feed_forward_length", uint32_t(c.moe.intermediate_size));
    // llama.cpp's qwen3moe graph always renormalizes; the key keeps a model that does not (read by
    // this runtime's loader) from being taken for one that does.
    b.add_bool(p + "expert_weights_norm", c.moe.norm_topk_prob);
  }
  b.add_u32("general.file_type", gguf_mix_file_type(mix));
  if (gguf_mix_quantized(mix)) b.add_u32("general.quantization_version", 2);
  add_vocab(b, vocab);

  GgufWriteResult res;
  const bool tied = c.tie_word_embeddings && !files->find("lm_head.weight");
  // llama.cpp's LLM_TYPE_70B, the one model size its choice of types depends on.
  const bool llama_70b = !qwen && c.n_layers == 80 && c.n_heads != c.n_kv_heads;
  // One HF tensor -> one GGUF tensor. perm_head_dim > 0: rows permuted as the converter does.
  // role/layer: where a matrix sits, for the mix's choice of its type (vectors are F32).
  auto tensor = [&](const std::string& hf, const std::string& name, bool matrix, int perm_head_dim,
                    GgufRole role = GgufRole::AttnQ, int layer = 0, float shift = 0.0f) {
    const TensorView& t = files->get(hf);
    if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
      throw Error(t.file->string() + ": tensor '" + hf + "' has dtype " + std::string(dtype_name(t.dtype)) +
                  " (the writer reads F32, F16, BF16)");
    if (t.shape.size() != (matrix ? 2u : 1u))
      throw Error(t.file->string() + ": tensor '" + hf + "' has shape " + t.shape_str() + " (expected " +
                  (matrix ? "2" : "1") + " dimensions)");
    // A permuted vector (a Q/K bias) is handled as a column: its elements are the rows.
    const bool column = !matrix && perm_head_dim > 0;
    const int64_t rows = matrix || column ? t.shape[0] : 1;
    const int64_t cols = column ? 1 : t.shape.back();
    GgmlType out_type = GgmlType::F32;
    if (matrix) {
      const GgufTypeChoice ch = gguf_mix_tensor_type(mix, {role, layer, c.n_layers, cols, tied, llama_70b});
      out_type = ch.type;
      if (ch.fell_back) ++res.fallback;
      if (ggml_type_info(out_type).block_elems > 1) ++res.quantized;
    }
    ++res.by_type[std::string(ggml_type_info(out_type).name)];
    std::vector<int> src_row;
    if (perm_head_dim > 0) src_row = gguf_permuted_rows(int(rows), perm_head_dim);
    std::vector<uint64_t> dims(t.shape.rbegin(), t.shape.rend());
    const TensorView* tv = &t;
    b.add_tensor(name, dims, out_type, [tv, rows, cols, out_type, src_row, shift](uint8_t* dst) {
      const GgmlTypeInfo info = ggml_type_info(out_type);
      const size_t row_bytes = size_t(cols) / size_t(info.block_elems) * size_t(info.block_bytes);
      const size_t esize = dtype_size(tv->dtype);
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t from = src_row.empty() ? r : src_row[size_t(r)];
        convert_to_f32(tv->dtype, tv->data + size_t(from) * size_t(cols) * esize, row.data(), size_t(cols));
        if (shift != 0.0f)
          for (float& x : row) x += shift;  // Gemma's (1 + weight), in float32 as llama.cpp's converter adds it
        uint8_t* o = dst + size_t(r) * row_bytes;
        switch (out_type) {
          case GgmlType::F32: std::memcpy(o, row.data(), row_bytes); break;
          case GgmlType::F16:
            for (int64_t k = 0; k < cols; ++k) {
              const uint16_t h = f32_to_f16(row[size_t(k)]);
              std::memcpy(o + 2 * k, &h, 2);
            }
            break;
          case GgmlType::BF16:
            for (int64_t k = 0; k < cols; ++k) {
              const uint16_t h = f32_to_bf16(row[size_t(k)]);
              std::memcpy(o + 2 * k, &h, 2);
            }
            break;
          default: ggml_quantize_row(out_type, row.data(), int(cols), o); break;
        }
      }
    });
    ++res.tensors;
  };

  // A sparse layer: the router as ffn_gate_inp (F32: llama-quantize leaves it unquantized) and the
  // experts stacked into ffn_{gate,up,down}_exps [cols, rows, experts], from the hub's one module per
  // expert or transformers 5's fused gate_up_proj / down_proj.
  auto expert_stacks = [&](int i, const std::string& h, const std::string& g) {
    const int64_t E = c.moe.num_experts, I = c.moe.intermediate_size, H = c.hidden_size;
    {
      const TensorView& r = files->get(h + "mlp.gate.weight");
      if (r.shape != std::vector<int64_t>{E, H})
        throw Error(r.file->string() + ": tensor '" + r.name + "' has shape " + r.shape_str() + ", config.json implies [" +
                    std::to_string(E) + ", " + std::to_string(H) + "]");
    }
    {
      const TensorView* r = &files->get(h + "mlp.gate.weight");
      if (r->dtype != DType::F32 && r->dtype != DType::F16 && r->dtype != DType::BF16)
        throw Error(r->file->string() + ": tensor '" + r->name + "' has dtype " + std::string(dtype_name(r->dtype)) +
                    " (the writer reads F32, F16, BF16)");
      b.add_tensor(g + "ffn_gate_inp.weight", {uint64_t(H), uint64_t(E)}, GgmlType::F32, [r](uint8_t* dst) {
        convert_to_f32(r->dtype, r->data, reinterpret_cast<float*>(dst), size_t(r->nbytes / dtype_size(r->dtype)));
      });
      ++res.tensors;
      ++res.by_type["F32"];
    }
    const bool fused = files->find(h + "mlp.experts.gate_up_proj") != nullptr;
    struct Src {
      const TensorView* t;
      int64_t row0;
    };
    auto stack = [&](const char* kind, const std::string& name, int64_t rows, int64_t cols, GgufRole role) {
      std::vector<Src> src;
      for (int64_t e = 0; e < E; ++e) {
        const TensorView* t;
        int64_t row0 = 0;
        if (fused) {
          const bool down = std::string(kind) == "down";
          t = &files->get(h + (down ? "mlp.experts.down_proj" : "mlp.experts.gate_up_proj"));
          const std::vector<int64_t> want = down ? std::vector<int64_t>{E, H, I} : std::vector<int64_t>{E, 2 * I, H};
          if (t->shape != want)
            throw Error(t->file->string() + ": tensor '" + t->name + "' has shape " + t->shape_str() +
                        " (config.json implies another)");
          row0 = down ? e * H : e * 2 * I + (std::string(kind) == "up" ? I : 0);
        } else {
          t = &files->get(h + "mlp.experts." + std::to_string(e) + "." + kind + "_proj.weight");
          if (t->shape != std::vector<int64_t>{rows, cols})
            throw Error(t->file->string() + ": tensor '" + t->name + "' has shape " + t->shape_str() + ", config.json implies [" +
                        std::to_string(rows) + ", " + std::to_string(cols) + "]");
        }
        if (t->dtype != DType::F32 && t->dtype != DType::F16 && t->dtype != DType::BF16)
          throw Error(t->file->string() + ": tensor '" + t->name + "' has dtype " + std::string(dtype_name(t->dtype)) +
                      " (the writer reads F32, F16, BF16)");
        src.push_back({t, row0});
      }
      const GgufTypeChoice ch = gguf_mix_tensor_type(mix, {role, i, c.n_layers, cols, tied, false});
      if (ch.fell_back) ++res.fallback;
      if (ggml_type_info(ch.type).block_elems > 1) ++res.quantized;
      ++res.by_type[std::string(ggml_type_info(ch.type).name)];
      const GgmlType out_type = ch.type;
      b.add_tensor(name, {uint64_t(cols), uint64_t(rows), uint64_t(E)}, out_type, [src, rows, cols, out_type](uint8_t* dst) {
        const GgmlTypeInfo info = ggml_type_info(out_type);
        const size_t row_bytes = size_t(cols) / size_t(info.block_elems) * size_t(info.block_bytes);
        std::vector<float> row(static_cast<size_t>(cols));
        for (const Src& s : src)
          for (int64_t r = 0; r < rows; ++r, dst += row_bytes) {
            const size_t esize = dtype_size(s.t->dtype);
            convert_to_f32(s.t->dtype, s.t->data + size_t(s.row0 + r) * size_t(cols) * esize, row.data(), size_t(cols));
            write_row(out_type, row.data(), cols, dst);
          }
      });
      ++res.tensors;
    };
    stack("gate", g + "ffn_gate_exps.weight", I, H, GgufRole::FfnGate);
    stack("up", g + "ffn_up_exps.weight", I, H, GgufRole::FfnUp);
    stack("down", g + "ffn_down_exps.weight", H, I, GgufRole::FfnDown);
  };

  tensor("model.embed_tokens.weight", "token_embd.weight", true, 0, GgufRole::TokenEmbd);
  // A norm gain: Gemma's (1 + weight) written with its 1, as llama.cpp's converter does.
  auto norm = [&](const std::string& hf, const std::string& name) {
    tensor(hf, name, false, 0, GgufRole::AttnQ, 0, c.norm_plus_one ? 1.0f : 0.0f);
  };
  norm("model.norm.weight", "output_norm.weight");
  if (c.rope.type == RopeType::LongRope) {
    for (auto [name, src] : {std::pair{"rope_factors_long.weight", &c.rope.long_factor},
                             std::pair{"rope_factors_short.weight", &c.rope.short_factor}}) {
      auto v = std::make_shared<std::vector<float>>(src->begin(), src->end());
      b.add_tensor(name, {uint64_t(v->size())}, GgmlType::F32,
                   [v](uint8_t* dst) { std::memcpy(dst, v->data(), v->size() * sizeof(float)); });
      ++res.tensors;
      ++res.by_type["F32"];
    }
  }
  if (!tied) tensor("lm_head.weight", "output.weight", true, 0, GgufRole::Output);
  if (c.rope.type == RopeType::Llama3) {
    auto factors = std::make_shared<std::vector<float>>(llama3_rope_factors(c.rope, c.head_dim));
    b.add_tensor("rope_freqs.weight", {uint64_t(factors->size())}, GgmlType::F32,
                 [factors](uint8_t* dst) { std::memcpy(dst, factors->data(), factors->size() * sizeof(float)); });
    ++res.tensors;
    ++res.by_type["F32"];
  }
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string h = "model.layers." + std::to_string(i) + ".", g = "blk." + std::to_string(i) + ".";
    norm(h + "input_layernorm.weight", g + "attn_norm.weight");
    if (c.sandwich_norms) {
      norm(h + "post_attention_layernorm.weight", g + "post_attention_norm.weight");
      norm(h + "pre_feedforward_layernorm.weight", g + "ffn_norm.weight");
      norm(h + "post_feedforward_layernorm.weight", g + "post_ffw_norm.weight");
    } else {
      norm(h + "post_attention_layernorm.weight", g + "ffn_norm.weight");
    }
    if (c.fused_qkv) {
      tensor(h + "self_attn.qkv_proj.weight", g + "attn_qkv.weight", true, 0, GgufRole::AttnQkv, i);
    } else {
      tensor(h + "self_attn.q_proj.weight", g + "attn_q.weight", true, permute ? c.head_dim : 0, GgufRole::AttnQ, i);
      tensor(h + "self_attn.k_proj.weight", g + "attn_k.weight", true, permute ? c.head_dim : 0, GgufRole::AttnK, i);
      tensor(h + "self_attn.v_proj.weight", g + "attn_v.weight", true, 0, GgufRole::AttnV, i);
    }
    tensor(h + "self_attn.o_proj.weight", g + "attn_output.weight", true, 0, GgufRole::AttnOutput, i);
    if (c.qkv_bias) {
      tensor(h + "self_attn.q_proj.bias", g + "attn_q.bias", false, permute ? c.head_dim : 0);
      tensor(h + "self_attn.k_proj.bias", g + "attn_k.bias", false, permute ? c.head_dim : 0);
      tensor(h + "self_attn.v_proj.bias", g + "attn_v.bias", false, 0);
    }
    if (c.o_bias) tensor(h + "self_attn.o_proj.bias", g + "attn_output.bias", false, 0);
    if (c.qk_norm) {
      norm(h + "self_attn.q_norm.weight", g + "attn_q_norm.weight");
      norm(h + "self_attn.k_norm.weight", g + "attn_k_norm.weight");
    }
    if (c.moe.sparse(i)) {
      expert_stacks(i, h, g);
      continue;
    }
    if (c.fused_gate_up) {
      tensor(h + "mlp.gate_up_proj.weight", g + "ffn_up.weight", true, 0, GgufRole::FfnUp, i);
    } else {
      tensor(h + "mlp.gate_proj.weight", g + "ffn_gate.weight", true, 0, GgufRole::FfnGate, i);
      tensor(h + "mlp.up_proj.weight", g + "ffn_up.weight", true, 0, GgufRole::FfnUp, i);
    }
    tensor(h + "mlp.down_proj.weight", g + "ffn_down.weight", true, 0, GgufRole::FfnDown, i);
    if (c.mlp_bias) {
      tensor(h + "mlp.gate_proj.bias", g + "ffn_gate.bias", false, 0);
      tensor(h + "mlp.up_proj.bias", g + "ffn_up.bias", false, 0);
      tensor(h + "mlp.down_proj.bias", g + "ffn_down.bias", false, 0);
    }
  }
  res.bytes = b.write(out);
  return res;
}

}  // namespace ptllm
