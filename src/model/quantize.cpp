#include "model/quantize.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "core/file_io.h"
#include "core/thread_pool.h"
#include "model/affine_fit.h"
#include "model/gptq.h"
#include "model/model.h"
#include "model/safetensors_writer.h"

namespace ptllm {

namespace fs = std::filesystem;

std::string_view quant_method_name(QuantMethod m) {
  switch (m) {
    case QuantMethod::Rtn: return "rtn";
    case QuantMethod::Search: return "search";
    case QuantMethod::Gptq: return "gptq";
  }
  return "?";
}

namespace {

// v as the scale dtype stores it, read back.
float as_stored(float v, DType t) {
  switch (t) {
    case DType::BF16: return bf16_to_f32(f32_to_bf16(v));
    case DType::F16: return f16_to_f32(f32_to_f16(v));
    default: return v;
  }
}

void put(void* p, DType t, size_t i, float v) {
  auto* b = static_cast<uint8_t*>(p);
  if (t == DType::F32) {
    std::memcpy(b + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = t == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
  std::memcpy(b + 2 * i, &h, 2);
}

struct GroupFit {
  float scale = 0, bias = 0;  // as stored
  double err = 0;             // sum over the group of (scale * code + bias - x)^2
};

// Round to nearest of x[0..g) against (scale, bias), as the dequantization will read them (a float
// multiply-add). A zero or non-finite scale (an F16 underflow) gives every code 0, the value `bias`.
// imp: each input's weight in the error (null: all 1).
double encode(const float* x, int g, float scale, float bias, int nmax, uint8_t* q, const float* imp = nullptr) {
  double err = 0;
  for (int i = 0; i < g; ++i) {
    q[i] = affine_code(x[i], scale, bias, nmax);
    const double d = double(scale * float(q[i]) + bias) - double(x[i]);
    err += (imp ? double(imp[i]) : 1.0) * d * d;
  }
  return err;
}

GroupFit fit_rtn(const float* x, int g, int nmax, DType dt) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < g; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  // mlx's affine_quantize: the range over nmax steps (at least 1e-7); the edge of larger magnitude is
  // the bias and the scale points from it into the range; the scale is then nudged so that the edge
  // is an exact multiple of it, which puts 0.0 exactly on code -round(edge / scale).
  float scale = std::max((hi - lo) / float(nmax), 1e-7f);
  const bool side = std::abs(lo) > std::abs(hi);
  if (!side) scale = -scale;
  const float edge = side ? lo : hi;
  const float q0 = std::nearbyint(edge / scale);
  float bias = 0;
  if (q0 != 0) {
    scale = edge / q0;
    bias = edge;
  }
  return {as_stored(scale, dt), as_stored(bias, dt), 0};
}

// The least-squares (scale, bias) of x over codes q: minimizes sum imp_i (scale * q_i + bias - x_i)^2.
bool refit(const float* x, const uint8_t* q, int g, float& scale, float& bias, const float* imp = nullptr) {
  double sw = 0, sl = 0, sll = 0, sx = 0, slx = 0;
  for (int i = 0; i < g; ++i) {
    const double w = imp ? double(imp[i]) : 1.0, l = q[i];
    sw += w;
    sl += w * l;
    sll += w * l * l;
    sx += w * x[i];
    slx += w * l * double(x[i]);
  }
  const double det = sw * sll - sl * sl;
  if (!(det > 0)) return false;
  const double s = (sw * slx - sl * sx) / det;
  if (!(s > 0)) return false;
  scale = float(s);
  bias = float((sx - s * sl) / sw);
  return true;
}

GroupFit fit_search(const float* x, int g, int nmax, DType dt, uint8_t* q, uint8_t* tmp, const float* imp = nullptr) {
  GroupFit best = fit_rtn(x, g, nmax, dt);
  best.err = encode(x, g, best.scale, best.bias, nmax, q, imp);
  float lo = x[0], hi = x[0];
  for (int i = 1; i < g; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (!(hi > lo)) return best;
  // Inverse scales from (nmax - 1) to (nmax + 1) steps over the range (llama.cpp's rmin -1, rdelta
  // 0.1, 20 steps): each gives codes, the codes a least-squares scale and bias, and those codes
  // redone against the stored scale and bias and refitted once more (one Lloyd step).
  constexpr int kSteps = 20;
  for (int is = 0; is <= kSteps; ++is) {
    const float iscale = (float(nmax) - 1.f + 0.1f * float(is)) / (hi - lo);
    for (int i = 0; i < g; ++i) tmp[i] = uint8_t(std::clamp(std::nearbyint(iscale * (x[i] - lo)), 0.f, float(nmax)));
    for (int round = 0; round < 2; ++round) {
      float scale = 0, bias = 0;
      if (!refit(x, tmp, g, scale, bias, imp)) break;
      scale = as_stored(scale, dt);
      bias = as_stored(bias, dt);
      const double err = encode(x, g, scale, bias, nmax, tmp, imp);
      if (err < best.err) {
        best = {scale, bias, err};
        std::copy_n(tmp, g, q);
      }
    }
  }
  return best;
}

}  // namespace

AffineGroupFit affine_fit_group(const float* x, int g, int bits, QuantMethod m, DType scale_dtype) {
  PTLLM_CHECK(g > 0 && g <= 128 && m != QuantMethod::Gptq);
  const int nmax = (1 << bits) - 1;
  if (m == QuantMethod::Rtn) {
    const GroupFit f = fit_rtn(x, g, nmax, scale_dtype);
    return {f.scale, f.bias};
  }
  uint8_t q[128], tmp[128];
  const GroupFit f = fit_search(x, g, nmax, scale_dtype, q, tmp);
  return {f.scale, f.bias};
}

void affine_store(void* p, DType t, size_t i, float v) { put(p, t, i, v); }

void affine_pack_row(const uint8_t* q, int cols, int bits, uint32_t* words) {
  const size_t n_words = size_t(cols) * size_t(bits) / 32;
  std::fill_n(words, n_words, 0u);
  for (int j = 0; j < cols; ++j) {
    const size_t bit = size_t(j) * size_t(bits);
    const size_t w = bit / 32, sh = bit % 32;
    words[w] |= uint32_t(q[j]) << sh;
    if (sh + size_t(bits) > 32) words[w + 1] |= uint32_t(q[j]) >> (32 - sh);
  }
}

void affine_quantize_rows(const float* w, int rows, int cols, const AffineSpec& s, QuantMethod m, DType scale_dtype,
                          uint32_t* codes, void* scales, void* biases, const float* importance) {
  PTLLM_CHECK(affine_supported(s) && cols % s.group_size == 0);
  PTLLM_CHECK(scale_dtype == DType::F32 || scale_dtype == DType::F16 || scale_dtype == DType::BF16);
  PTLLM_CHECK(m != QuantMethod::Gptq);  // needs the inputs' statistics: model/gptq.h
  const int nmax = (1 << s.bits) - 1, g = s.group_size, groups = cols / g;
  const size_t words = size_t(cols) * size_t(s.bits) / 32;
  std::vector<uint8_t> q(static_cast<size_t>(cols)), tmp(static_cast<size_t>(g));
  for (int r = 0; r < rows; ++r) {
    const float* row = w + size_t(r) * size_t(cols);
    for (int k = 0; k < groups; ++k) {
      const float* x = row + size_t(k) * size_t(g);
      uint8_t* qk = q.data() + size_t(k) * size_t(g);
      GroupFit f;
      if (m == QuantMethod::Search) {
        f = fit_search(x, g, nmax, scale_dtype, qk, tmp.data(),
                       importance ? importance + size_t(k) * size_t(g) : nullptr);
      } else {
        f = fit_rtn(x, g, nmax, scale_dtype);
        encode(x, g, f.scale, f.bias, nmax, qk);
      }
      const size_t gi = size_t(r) * size_t(groups) + size_t(k);
      put(scales, scale_dtype, gi, f.scale);
      put(biases, scale_dtype, gi, f.bias);
    }
    affine_pack_row(q.data(), cols, s.bits, codes + size_t(r) * words);
  }
}

std::string_view quant_recipe_name(QuantRecipe r) {
  switch (r) {
    case QuantRecipe::None: return "none";
    case QuantRecipe::Mixed_2_6: return "mixed_2_6";
    case QuantRecipe::Mixed_3_6: return "mixed_3_6";
    case QuantRecipe::Mixed_4_6: return "mixed_4_6";
  }
  return "?";
}

RecipeBits recipe_bits(QuantRecipe r) {
  switch (r) {
    case QuantRecipe::None: return {};
    case QuantRecipe::Mixed_2_6: return {2, 6};
    case QuantRecipe::Mixed_3_6: return {3, 6};
    case QuantRecipe::Mixed_4_6: return {4, 6};
  }
  return {};
}

bool recipe_uses_more_bits(int layer, int n_layers) {
  // mlx-lm: index < n // 8 or index >= 7 * n // 8 or (index - n // 8) % 3 == 2 (Python's modulo:
  // never negative).
  const int eighth = n_layers / 8, d = layer - eighth;
  return layer < eighth || layer >= 7 * n_layers / 8 || ((d % 3) + 3) % 3 == 2;
}

namespace {

// The module paths whose `weight` is a matrix the forward pass multiplies by (model.cpp's Loader).
bool is_linear_module(const std::string& module) {
  if (module == "model.embed_tokens" || module == "lm_head") return true;
  for (const char* leaf : {".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.o_proj",
                           ".mlp.gate_proj", ".mlp.up_proj", ".mlp.down_proj", ".self_attn.qkv_proj",
                           ".mlp.gate_up_proj"})
    if (module.starts_with("model.layers.") && module.ends_with(leaf)) return true;
  // An expert's projections (model.layers.N.mlp.experts.E.gate_proj); the router (mlp.gate) stays
  // dense: it is small and its rounding would change which experts are chosen.
  if (module.starts_with("model.layers.") && module.find(".mlp.experts.") != std::string::npos)
    for (const char* leaf : {".gate_proj", ".up_proj", ".down_proj"})
      if (module.ends_with(leaf)) return true;
  return false;
}

// "model.layers.12.mlp.up_proj" -> 12; -1 for the embedding and the LM head.
int layer_of(const std::string& module) {
  if (!module.starts_with("model.layers.")) return -1;
  int li = 0;
  for (size_t i = 13; i < module.size() && module[i] != '.'; ++i) li = li * 10 + (module[i] - '0');
  return li;
}

// Which input a layer's matrix reads (model.h, MatmulInput).
MatmulInput site_of(const std::string& module) {
  if (module.ends_with("o_proj")) return MatmulInput::AttentionOutput;
  if (module.ends_with("_proj") && module.find(".self_attn.") != std::string::npos) return MatmulInput::Attention;
  if (module.ends_with("down_proj")) return MatmulInput::MlpDown;
  if (module.ends_with("gate_proj") || module.ends_with("up_proj")) return MatmulInput::Mlp;
  return MatmulInput::LmHead;
}

// The bits of a module under the options: the recipe's, then --embedding-bits for the embedding and
// the LM head.
int bits_of(const std::string& module, int n_layers, const QuantizeOptions& o) {
  const bool embedding = module == "model.embed_tokens" || module == "lm_head";
  int bits = o.spec.bits;
  if (o.recipe != QuantRecipe::None) {
    const RecipeBits rb = recipe_bits(o.recipe);
    const bool more = embedding || ((module.ends_with("v_proj") || module.ends_with("down_proj")) &&
                                    recipe_uses_more_bits(layer_of(module), n_layers));
    bits = more ? rb.high : rb.low;
  }
  if (embedding && o.embedding_bits > 0) bits = o.embedding_bits;
  return bits;
}

// Search's input weights for a matrix without calibration text: the RMSNorm gain in front of it,
// squared and scaled to mean 1 (an input the norm amplifies carries that much more of the output's
// error: the diagonal of H = x x^T up to the normalized activations' own spread). q/k/v read the
// attention norm, gate/up the MLP norm, the LM head the final norm; with tied embeddings the
// embedding is also the token lookup, whose error is unweighted, so it takes the mean of the two.
// o_proj, down_proj and an untied embedding have no norm in front: empty (all inputs alike).
std::vector<float> norm_importance(const Model& m, const std::string& module, bool tied_embedding) {
  std::string norm;
  const int li = layer_of(module);
  const std::string p = "model.layers." + std::to_string(li) + ".";
  if (li >= 0 && (module.ends_with("q_proj") || module.ends_with("k_proj") || module.ends_with("v_proj") ||
                  module.ends_with("qkv_proj")))
    norm = p + "input_layernorm.weight";
  else if (li >= 0 && (module.ends_with("gate_proj") || module.ends_with("up_proj")))
    norm = p + (m.config().sandwich_norms ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight");
  else if (module == "lm_head" || (module == "model.embed_tokens" && tied_embedding))
    norm = "model.norm.weight";
  if (norm.empty()) return {};
  const TensorView* t = m.files().find(norm);
  if (!t || t->shape.size() != 1) return {};
  std::vector<float> g(size_t(t->shape[0]));
  convert_to_f32(t->dtype, t->data, g.data(), g.size());
  if (m.config().norm_plus_one)
    for (float& v : g) v += 1.0f;  // Gemma's gain is (1 + weight)
  double mean = 0;
  for (float& v : g) {
    v *= v;
    mean += v;
  }
  mean /= double(g.size());
  if (!(mean > 0) || !std::isfinite(mean)) return {};
  const bool blend = module == "model.embed_tokens";
  for (float& v : g) v = blend ? 0.5f + 0.5f * float(v / mean) : float(v / mean);
  return g;
}

// The files beside the weights that a model directory carries over unchanged.
constexpr const char* kCopiedFiles[] = {"tokenizer.json",          "tokenizer_config.json", "generation_config.json",
                                        "special_tokens_map.json", "tokenizer.model",       "added_tokens.json",
                                        "vocab.json",              "merges.txt",            "chat_template.jinja",
                                        "chat_template.json"};

struct Item {
  const TensorView* t = nullptr;
  std::string module;              // set for a matrix that is quantized
  AffineSpec spec;
};

// One matrix in the layout: codes [rows][cols * bits / 32], scales and biases [rows][groups] in the
// source's dtype.
struct Quantized {
  std::vector<uint32_t> codes;
  std::vector<uint8_t> scales, biases;
  explicit Quantized(const Item& it) {
    const size_t rows = size_t(it.t->shape[0]), cols = size_t(it.t->shape[1]);
    codes.resize(rows * cols * size_t(it.spec.bits) / 32);
    scales.resize(rows * (cols / size_t(it.spec.group_size)) * dtype_size(it.t->dtype));
    biases.resize(scales.size());
  }
  WeightMatrix view(const Item& it) const {
    return affine_matrix(codes.data(), scales.data(), biases.data(), it.t->dtype, it.spec.bits, it.spec.group_size,
                         int(it.t->shape[0]), int(it.t->shape[1]));
  }
};

// Rtn or Search: rows independently, in parts over the pool. importance: Search's [cols] input
// weights, or empty.
Quantized quantize_rows(const Item& it, QuantMethod m, ThreadPool& pool, const std::vector<float>& importance = {}) {
  const TensorView& t = *it.t;
  Quantized out(it);
  const int rows = int(t.shape[0]), cols = int(t.shape[1]);
  const size_t words = size_t(cols) * size_t(it.spec.bits) / 32;
  const size_t groups = size_t(cols / it.spec.group_size), ssize = dtype_size(t.dtype);
  constexpr size_t kRowsPerPart = 16;
  pool.parallel_for((size_t(rows) + kRowsPerPart - 1) / kRowsPerPart, [&](size_t b, size_t e) {
    std::vector<float> x(kRowsPerPart * size_t(cols));  // [rows of the part][cols] the source as float32
    for (size_t p = b; p < e; ++p) {
      const size_t r0 = p * kRowsPerPart, n = std::min(kRowsPerPart, size_t(rows) - r0);
      convert_to_f32(t.dtype, t.data + r0 * size_t(cols) * ssize, x.data(), n * size_t(cols));
      affine_quantize_rows(x.data(), int(n), cols, it.spec, m, t.dtype, out.codes.data() + r0 * words,
                           out.scales.data() + r0 * groups * ssize, out.biases.data() + r0 * groups * ssize,
                           importance.empty() ? nullptr : importance.data());
    }
  });
  return out;
}

// Watches one stage of the calibration: the inputs of layer `layer`'s matrices (n_layers: the LM
// head's), into the accumulators of the sites wanted; the pass ends after the last of them.
class StageInputs final : public ForwardObserver {
 public:
  StageInputs(int layer, std::array<HessianAccumulator*, kMatmulInputs> acc, ThreadPool& pool)
      : layer_(layer), acc_(acc), pool_(pool) {
    for (int s = 0; s < kMatmulInputs; ++s)
      if (acc_[size_t(s)]) last_ = MatmulInput(s);
  }
  bool observe(int layer, MatmulInput site, const float* x, int T, int width) override {
    if (layer < layer_) return true;
    HessianAccumulator* a = acc_[size_t(site)];
    if (a) {
      PTLLM_CHECK(a->n() == width);
      a->add(x, T, pool_);
    }
    return site != last_;
  }

 private:
  int layer_;
  std::array<HessianAccumulator*, kMatmulInputs> acc_;
  ThreadPool& pool_;
  MatmulInput last_ = MatmulInput::Attention;
};

// GPTQ over the whole model, in stages: layer 0, 1, ..., then the LM head. A stage measures H for
// its matrices' inputs with every earlier stage's matrices already quantized (the model's matrices
// are pointed at the results as they come: the paper's sequential order, so that each layer corrects
// for the rounding of those before it), then solves each matrix. Matrices sharing an input share
// H and its factorization. With tied embeddings the embedding is the LM head and is solved with the
// head's H; an untied embedding (a lookup, no input to measure) takes the Search fit.
std::map<std::string, Quantized> quantize_gptq(Model& model, const std::vector<Item>& items,
                                               const QuantizeOptions& o, ThreadPool& pool,
                                               const std::function<void(size_t, size_t)>& progress) {
  const ModelConfig& c = model.config();
  if (o.calibration.empty()) throw Error("quantize: --method gptq needs calibration text (no sequences given)");
  if (c.moe.enabled())
    throw Error("quantize: --method gptq is not supported for mixture-of-experts models (" + c.arch_name +
                "): each expert sees only its routed rows; use --method search or rtn");
  const bool tied_head = c.tie_word_embeddings && !model.files().find("lm_head.weight");
  std::map<std::string, Quantized> out;
  size_t total = 0, done = 0;
  std::vector<std::vector<const Item*>> stages(size_t(c.n_layers) + 1);
  for (const Item& it : items) {
    if (it.module.empty()) continue;
    total += it.t->nbytes;
    const int li = layer_of(it.module);
    if (li >= 0)
      stages[size_t(li)].push_back(&it);
    else if (it.module == "lm_head" || tied_head)
      stages.back().push_back(&it);
    else {
      out.emplace(it.module, quantize_rows(it, QuantMethod::Search, pool));  // an untied embedding
      done += it.t->nbytes;
    }
  }
  for (int stage = 0; stage <= c.n_layers; ++stage) {
    const auto& mine = stages[size_t(stage)];
    if (mine.empty()) continue;
    std::array<std::unique_ptr<HessianAccumulator>, kMatmulInputs> acc;
    std::array<HessianAccumulator*, kMatmulInputs> ptrs{};
    for (const Item* it : mine) {
      const size_t s = size_t(site_of(it->module));
      if (!acc[s]) acc[s] = std::make_unique<HessianAccumulator>(int(it->t->shape[1]));
      ptrs[s] = acc[s].get();
    }
    StageInputs obs(stage, ptrs, pool);
    run_calibration(model, o.calibration, obs, pool);
    for (size_t s = 0; s < acc.size(); ++s) {
      if (!acc[s]) continue;
      std::string names;
      for (const Item* it : mine)
        if (size_t(site_of(it->module)) == s) names += (names.empty() ? "" : ", ") + it->module;
      const GptqFactor f = gptq_factor(acc[s]->h(), acc[s]->n(), o.gptq_damp, names, pool, o.gptq_act_order);
      for (const Item* it : mine) {
        if (size_t(site_of(it->module)) != s) continue;
        const TensorView& t = *it->t;
        const int rows = int(t.shape[0]), cols = int(t.shape[1]);
        std::vector<float> w(size_t(rows) * size_t(cols));  // [rows][cols] updated as the solve goes
        convert_to_f32(t.dtype, t.data, w.data(), w.size());
        Quantized q(*it);
        gptq_quantize_rows(w.data(), rows, cols, f, it->spec, QuantMethod::Search, t.dtype, q.codes.data(),
                           q.scales.data(), q.biases.data(), pool);
        const Quantized& kept = out.emplace(it->module, std::move(q)).first->second;
        model.replace_matrix(it->module, kept.view(*it));
        done += t.nbytes;
        if (progress) progress(done, total);
      }
    }
  }
  return out;
}

}  // namespace

QuantizeReport quantize_checkpoint(const fs::path& in, const fs::path& out, const QuantizeOptions& opts,
                                   ThreadPool& pool, const std::function<void(size_t, size_t)>& progress) {
  const int base_bits = opts.recipe != QuantRecipe::None ? recipe_bits(opts.recipe).low : opts.spec.bits;
  if (!affine_supported({base_bits, opts.spec.group_size}))
    throw Error("quantize: " + std::to_string(base_bits) + " bits in groups of " +
                std::to_string(opts.spec.group_size) + " is not a supported layout");
  if (opts.embedding_bits > 0 && !affine_supported({opts.embedding_bits, opts.spec.group_size}))
    throw Error("quantize: --embedding-bits " + std::to_string(opts.embedding_bits) +
                " is not a supported width (2, 3, 4, 5, 6 or 8)");
  if (opts.embedding_bits > 0 && opts.keep_embeddings)
    throw Error("quantize: --embedding-bits and --keep-embeddings ask for different embeddings; give one");
  const std::unique_ptr<Model> src = Model::load(in);  // every tensor checked against config.json
  const fs::path in_config = in / "config.json";
  if (src->config().quantization.quantized())
    throw Error(in_config.string() + ": the checkpoint is already quantized (field 'quantization'); quantize a F32, "
                                     "F16 or BF16 one");
  // The text model of a multimodal checkpoint keeps its tensors under language_model: its matrices
  // would be copied unquantized, so it is refused rather than written as if quantized.
  if (!src->files().find("model.embed_tokens.weight"))
    throw Error(in_config.string() + ": architectures '" + src->config().arch_name +
                "': the text model's tensors are not under model. (a multimodal checkpoint); quantize is for "
                "causal LM checkpoints");
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out)) throw Error(out.string() + ": cannot create the directory (" + ec.message() + ")");
  if (fs::equivalent(in, out, ec)) throw Error(out.string() + ": is the source directory; write to another one");

  // The plan: which matrices are quantized with which bits and group, and the tensors of the output
  // in order. A module whose spec is not the default gets an entry of its own in config.json.
  QuantizationConfig qc;
  qc.base = AffineSpec{base_bits, opts.spec.group_size};
  QuantizeReport rep;
  std::vector<Item> items;
  std::vector<TensorDecl> decls;
  size_t total = 0;
  const int n_layers = src->config().n_layers;
  for (const auto& f : src->files().files()) {
    rep.source_bytes += f->size();
    for (const auto& [name, t] : f->tensors()) {
      total += t.nbytes;
      int64_t elems = 1;
      for (int64_t d : t.shape) elems *= d;
      rep.parameters += elems;
      Item it{&t, "", *qc.base};
      const std::string module = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : "";
      if (!module.empty() && t.shape.size() == 2 && is_linear_module(module)) {
        const int cols = int(t.shape[1]);
        const bool embedding = module == "model.embed_tokens" || module == "lm_head";
        // The widest supported group no wider than asked that divides the width (mlx-lm would leave
        // such a matrix dense; a narrower group keeps it quantized and is still its layout).
        const int asked = embedding && opts.embedding_group_size > 0 ? opts.embedding_group_size : opts.spec.group_size;
        int group = 0;
        for (int gs : kAffineGroupSizes)
          if (gs <= asked && cols % gs == 0) group = gs;
        if ((embedding && opts.keep_embeddings) || group == 0) {
          qc.overrides[module] = std::nullopt;
          ++rep.matrices_dense;
        } else {
          it.module = module;
          it.spec = {bits_of(module, n_layers, opts), group};
          if (it.spec != *qc.base) qc.overrides[module] = it.spec;
          ++rep.matrices_quantized;
        }
      }
      if (it.module.empty()) {
        decls.push_back({name, t.dtype, t.shape});
      } else {
        const int64_t rows = t.shape[0], cols = t.shape[1];
        decls.push_back({name, DType::U32, {rows, cols * it.spec.bits / 32}});
        decls.push_back({it.module + ".scales", t.dtype, {rows, cols / it.spec.group_size}});
        decls.push_back({it.module + ".biases", t.dtype, {rows, cols / it.spec.group_size}});
      }
      items.push_back(std::move(it));
    }
  }

  // GPTQ needs the whole model's calibration before any matrix is final: every result is kept (the
  // output's size in memory) and written below. The other methods quantize a matrix as it is written.
  std::map<std::string, Quantized> solved;
  if (opts.method == QuantMethod::Gptq) solved = quantize_gptq(*src, items, opts, pool, progress);

  const bool tied_embedding = src->config().tie_word_embeddings && !src->files().find("lm_head.weight");
  const fs::path weights = out / "model.safetensors";
  SafetensorsWriter writer(weights, std::move(decls), {{"format", "mlx"}});
  size_t done = 0;
  for (const Item& it : items) {
    const TensorView& t = *it.t;
    if (it.module.empty()) {
      writer.write({reinterpret_cast<const char*>(t.data), t.nbytes});
    } else {
      auto found = solved.find(it.module);
      std::vector<float> imp;
      if (opts.method == QuantMethod::Search)
        imp = norm_importance(*src, it.module, tied_embedding);
      if (!imp.empty() && imp.size() != size_t(t.shape[1])) imp.clear();
      const Quantized q = found != solved.end() ? std::move(found->second) : quantize_rows(it, opts.method, pool, imp);
      writer.write({reinterpret_cast<const char*>(q.codes.data()), q.codes.size() * sizeof(uint32_t)});
      writer.write({reinterpret_cast<const char*>(q.scales.data()), q.scales.size()});
      writer.write({reinterpret_cast<const char*>(q.biases.data()), q.biases.size()});
    }
    done += t.nbytes;
    if (progress) progress(done, total);
  }
  rep.output_bytes = writer.commit();

  // config.json as it was, plus the quantization (mlx-lm writes both keys).
  nlohmann::json cfg = nlohmann::json::parse(read_whole_file(in_config, kMaxJsonConfigBytes, "config.json"));
  cfg["quantization"] = qc.to_json();
  cfg["quantization_config"] = qc.to_json();
  write_file_atomically(out / "config.json", {cfg.dump(2), "\n"});
  // The tokenizer and generation files copied as every other output is written: a temporary, fsync,
  // rename (a killed run leaves no half-copied tokenizer.json).
  for (const char* name : kCopiedFiles) {
    if (!fs::exists(in / name)) continue;
    write_file_atomically(out / name, {read_whole_file(in / name, uint64_t(1) << 30, name)});
  }
  rep.quantization = qc;
  rep.weight_format = Model::load(out)->weight_format();  // what was written reads back
  return rep;
}

}  // namespace ptllm

namespace ptllm {

QuantizeOptions resolve_quantize_options(const QuantizeRequest& r) {
  QuantizeOptions o;
  o.recipe = r.recipe;
  const int bits = r.recipe != QuantRecipe::None ? recipe_bits(r.recipe).low : r.bits.value_or(4);
  o.spec.bits = bits;
  o.spec.group_size = r.group_size.value_or(bits < 8 ? 32 : 64);
  o.keep_embeddings = r.keep_embeddings;
  o.embedding_bits = r.embedding_bits.value_or(!r.keep_embeddings && bits <= 4 ? 6 : 0);
  o.method = r.method.value_or(r.calibration ? QuantMethod::Gptq : QuantMethod::Search);
  return o;
}

std::string quality_class(const QuantizeOptions& o) {
  const int bits = o.recipe != QuantRecipe::None ? recipe_bits(o.recipe).low : o.spec.bits;
  const int emb = o.keep_embeddings ? 16 : o.embedding_bits > 0 ? o.embedding_bits
                  : o.recipe != QuantRecipe::None ? recipe_bits(o.recipe).high : bits;
  const bool fitted = o.method != QuantMethod::Rtn;
  if (bits >= 8) return "near-lossless, llama.cpp Q8_0's class (8 bits: kjv-small PPL within 0.05% of bf16)";
  if (bits >= 5) return "between the 4-bit default and 8 bits (not measured on kjv-small)";
  if (bits == 4 && emb >= 6 && fitted && (o.spec.group_size <= 32 || o.method == QuantMethod::Gptq))
    return emb == 6 ? "llama.cpp Q4_K_M's class (kjv-small: PPL at most +0.47% over bf16, in fewer bytes)"
                    : "llama.cpp Q4_K_M's class (kjv-small: PPL at most +0.47% over bf16, in more bytes)";
  if (bits == 4 && (emb >= 6 || o.spec.group_size <= 32 || fitted))
    return "llama.cpp Q4_0's class (kjv-small: PPL about +1% over bf16)";
  if (bits == 4) return "below llama.cpp Q4_0 (kjv-small: PPL +2.3% over bf16 at 4 bits, groups of 64, rtn)";
  return "lossy: " + std::to_string(bits) + "-bit codes (not measured on kjv-small)";
}

}  // namespace ptllm
