#include "model/model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numbers>
#include <optional>

#include <sys/mman.h>

#include "core/error.h"
#include "core/platform.h"
#include "core/thread_pool.h"
#include "kernels/affine.h"
#include "kernels/ggml.h"
#include "kernels/panels.h"
#include "kv/kv_cache.h"
#include "model/gguf_model.h"
#include "model/weight_rows.h"

namespace ptllm {

std::vector<float> rope_inv_freq(const RopeConfig& rope, int head_dim, bool long_factors) {
  const int half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    // transformers: 1 / base ** (arange(0, dim, 2) / dim), in float32
    const float expo = float(2 * i) / float(head_dim);
    inv[size_t(i)] = float(1.0 / std::pow(rope.theta, double(expo)));
  }
  if (rope.type == RopeType::Linear)
    for (auto& f : inv) f = float(double(f) / rope.factor);
  if (rope.type == RopeType::LongRope) {
    // 1 / (ext_factor_i * base ** (2i / dim)): the short factors, or the long ones past the original length
    const std::vector<double>& ext = long_factors ? rope.long_factor : rope.short_factor;
    PTLLM_CHECK(ext.size() == size_t(half));
    for (int i = 0; i < half; ++i) {
      const float expo = float(2 * i) / float(head_dim);
      inv[size_t(i)] = float(1.0 / (double(float(ext[size_t(i)])) * double(float(std::pow(rope.theta, double(expo))))));
    }
  }
  if (rope.type == RopeType::Llama3) {
    // Llama 3.1 frequency scaling: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
    const double old_ctx = rope.original_max_position;
    const double low_wavelen = old_ctx / rope.low_freq_factor;
    const double high_wavelen = old_ctx / rope.high_freq_factor;
    for (auto& f : inv) {
      const double wavelen = 2 * std::numbers::pi / double(f);
      double scaled = wavelen > low_wavelen ? double(f) / rope.factor : double(f);
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const double smooth = (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
        scaled = (1 - smooth) * scaled / rope.factor + smooth * scaled;
      }
      f = float(scaled);
    }
  }
  return inv;
}

namespace {

struct Loader {
  const WeightFiles& files;
  const ModelConfig& cfg;
  std::vector<std::unique_ptr<float[]>>& aligned_copies;
  std::string config_file;  // for messages

  [[noreturn]] static void bad(const TensorView& t, const std::string& what) {
    throw Error(t.file->string() + ": tensor '" + t.name + "' " + what);
  }
  static void check_shape(const TensorView& t, const std::vector<int64_t>& shape, const std::string& implied_by) {
    TensorView want;
    want.shape = shape;
    if (t.shape != want.shape) bad(t, "has shape " + t.shape_str() + ", " + implied_by + " implies " + want.shape_str());
  }
  static bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

  const TensorView& tensor(const std::string& name, std::vector<int64_t> shape) const {
    const TensorView& t = files.get(name);
    if (t.dtype == DType::U32) bad(t, "has dtype U32 (quantized codes), but this tensor is never quantized");
    check_shape(t, shape, "config.json");
    if (!is_float(t.dtype))
      bad(t, "has dtype " + std::string(dtype_name(t.dtype)) + " (supported: F32, F16, BF16)");
    return t;
  }
  // The tensor's bytes, or an aligned copy of them: the format does not promise aligned data (writers
  // pad the header to 8 bytes, but a file may not), so a misaligned tensor is copied once instead of
  // being read misaligned.
  const void* aligned(const TensorView& t) const {
    if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) == 0) return t.data;
    const size_t words = (t.nbytes + sizeof(float) - 1) / sizeof(float);
    aligned_copies.emplace_back(new float[words]);
    std::memcpy(aligned_copies.back().get(), t.data, t.nbytes);
    return aligned_copies.back().get();
  }
  WeightMatrix matrix(const std::string& name, int rows, int cols) const {
    const TensorView& t = tensor(name, {rows, cols});
    return dense_matrix(t.dtype, aligned(t), rows, cols);
  }
  // A linear layer or the embedding, `module` its path ("model.layers.0.mlp.down_proj"): dense, or
  // MLX affine when config.json's quantization says so and the file has its scales (quantization.h).
  // stack > 0: a 3-D tensor [stack][rows][cols] of experts (mlx-lm's switch_mlp, transformers 5's
  // fused experts), returned as one [stack * rows][cols] matrix (model/moe.h, stacked_expert).
  WeightMatrix linear(const std::string& module, int rows, int cols, int stack = 0) const {
    auto dims = [&](std::vector<int64_t> d) {
      if (stack > 0) d.insert(d.begin(), stack);
      return d;
    };
    const int total = stack > 0 ? stack * rows : rows;
    const QuantizationConfig& q = cfg.quantization;
    const std::optional<AffineSpec>* own = q.override_for(module);
    const TensorView* scales = files.find(module + ".scales");
    const bool wanted = own ? own->has_value() : (q.quantized() && scales);
    if (!wanted) {
      if (scales)
        bad(*scales, "exists, but config.json " +
                         std::string(q.quantized() ? "quantization lists '" + module + "' as not quantized (false)"
                                                   : "has no quantization (or quantization_config)"));
      const TensorView& w = files.get(module + ".weight");
      if (w.dtype == DType::U32)
        bad(w, "has dtype U32 (quantized codes), but " +
                   (!q.quantized() ? config_file + " has no quantization"
                    : own         ? config_file + "'s quantization lists '" + module + "' as not quantized (false)"
                                  : "'" + module + ".scales' is missing"));
      const TensorView& t = tensor(module + ".weight", dims({rows, cols}));
      return dense_matrix(t.dtype, aligned(t), total, cols);
    }
    const AffineSpec s = own ? **own : *q.base;
    const std::string implied = "config.json (" + std::to_string(cols) + " input features, quantization bits " +
                                std::to_string(s.bits) + " group_size " + std::to_string(s.group_size) + ")";
    const TensorView& w = files.get(module + ".weight");
    if (cols % s.group_size != 0)
      throw Error(config_file + ": quantization of '" + module + "' (group_size " + std::to_string(s.group_size) +
                  ") does not divide its " + std::to_string(cols) + " input features");
    if (w.dtype != DType::U32)
      bad(w, "has dtype " + std::string(dtype_name(w.dtype)) + ", but config.json quantizes '" + module + "' (" +
                 std::to_string(s.bits) + " bits): expected U32 codes");
    check_shape(w, dims({rows, int64_t(cols) * s.bits / 32}), implied);
    const TensorView& sc = files.get(module + ".scales");
    const TensorView& bi = files.get(module + ".biases");
    for (const TensorView* t : {&sc, &bi}) {
      if (!is_float(t->dtype))
        bad(*t, "has dtype " + std::string(dtype_name(t->dtype)) + " (supported: F32, F16, BF16)");
      check_shape(*t, dims({rows, cols / s.group_size}), implied);
    }
    if (bi.dtype != sc.dtype)
      bad(bi, "has dtype " + std::string(dtype_name(bi.dtype)) + ", its scales " + std::string(dtype_name(sc.dtype)) +
                  " (the layout has one dtype for both)");
    return affine_matrix(aligned(w), aligned(sc), aligned(bi), sc.dtype, s.bits, s.group_size, total, cols);
  }
  // A sparse layer's router and experts, `p` the layer's prefix, in any of the layouts checkpoints use:
  // one module per expert (the hub's), transformers 5's fused gate_up_proj / down_proj, mlx-lm's
  // switch_mlp stacks (quantized or not).
  MoeWeights moe(const std::string& p) const {
    const int H = cfg.hidden_size, E = cfg.moe.num_experts, I = cfg.moe.intermediate_size;
    MoeWeights m;
    m.router = linear(p + "mlp.gate", E, H);
    m.gate.resize(size_t(E));
    m.up.resize(size_t(E));
    m.down.resize(size_t(E));
    if (files.find(p + "mlp.switch_mlp.gate_proj.weight")) {
      const WeightMatrix g = linear(p + "mlp.switch_mlp.gate_proj", I, H, E);
      const WeightMatrix u = linear(p + "mlp.switch_mlp.up_proj", I, H, E);
      const WeightMatrix d = linear(p + "mlp.switch_mlp.down_proj", H, I, E);
      for (int e = 0; e < E; ++e) {
        m.gate[size_t(e)] = stacked_expert(g, e, I);
        m.up[size_t(e)] = stacked_expert(u, e, I);
        m.down[size_t(e)] = stacked_expert(d, e, H);
      }
    } else if (files.find(p + "mlp.experts.gate_up_proj") || files.find(p + "mlp.experts.gate_up_proj.weight")) {
      // transformers 5: gate_up_proj [E][2 * inter][hidden] (gate rows first), down_proj [E][hidden][inter]
      const std::string gu = files.find(p + "mlp.experts.gate_up_proj") ? p + "mlp.experts.gate_up_proj"
                                                                         : p + "mlp.experts.gate_up_proj.weight";
      const std::string dn = files.find(p + "mlp.experts.down_proj") ? p + "mlp.experts.down_proj"
                                                                      : p + "mlp.experts.down_proj.weight";
      const TensorView& a = tensor(gu, {E, 2 * int64_t(I), H});
      const TensorView& b = tensor(dn, {E, H, I});
      const WeightMatrix g = dense_matrix(a.dtype, aligned(a), E * 2 * I, H);
      const WeightMatrix d = dense_matrix(b.dtype, aligned(b), E * H, I);
      for (int e = 0; e < E; ++e) {
        m.gate[size_t(e)] = weight_rows(g, 2 * e * I, I);
        m.up[size_t(e)] = weight_rows(g, 2 * e * I + I, I);
        m.down[size_t(e)] = stacked_expert(d, e, H);
      }
    } else {
      for (int e = 0; e < E; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        m.gate[size_t(e)] = linear(x + "gate_proj", I, H);
        m.up[size_t(e)] = linear(x + "up_proj", I, H);
        m.down[size_t(e)] = linear(x + "down_proj", H, I);
      }
    }
    return m;
  }
  std::vector<float> vec(const std::string& name, int n) const {
    const TensorView& t = tensor(name, {n});
    std::vector<float> out(static_cast<size_t>(n));
    convert_to_f32(t.dtype, t.data, out.data(), size_t(n));
    return out;
  }
  // An RMSNorm gain: Gemma's scale by (1 + weight), added here once in float32 as transformers does.
  std::vector<float> norm(const std::string& name, int n) const {
    std::vector<float> w = vec(name, n);
    if (cfg.norm_plus_one)
      for (float& x : w) x = 1.0f + x;
    return w;
  }
};

// The text model's tensor names in a checkpoint: "model.layers.0..." and "lm_head" for a causal LM;
// a Gemma3ForConditionalGeneration checkpoint keeps them under language_model (transformers 4.x:
// "language_model.model.", "language_model.lm_head"; 5.x: "model.language_model.", "lm_head"). Its
// vision tower's tensors are not read.
struct TensorNames {
  std::string body = "model.", head = "lm_head";
  static TensorNames of(const WeightFiles& files) {
    TensorNames n;
    if (files.find("model.embed_tokens.weight") || files.find("model.embed_tokens.scales")) return n;
    for (const char* p : {"language_model.model.", "model.language_model."})
      if (files.find(std::string(p) + "embed_tokens.weight")) {
        n.body = p;
        n.head = std::string(p) == "language_model.model." ? "language_model.lm_head" : "lm_head";
      }
    return n;
  }
};


}  // namespace

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir) {
  if (is_gguf_path(dir)) return load_gguf(dir);
  if (!std::filesystem::is_directory(dir)) throw Error(dir.string() + ": not a model directory (does not exist)");
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->cfg_ = ModelConfig::load(dir / "config.json");
  m->files_ = WeightFiles::open(dir);
  const ModelConfig& c = m->cfg_;
  Loader L{m->files_, c, m->aligned_copies_, (dir / "config.json").string()};
  const int H = c.hidden_size, I = c.intermediate_size;
  const TensorNames names = TensorNames::of(m->files_);
  m->embed_ = L.linear(names.body + "embed_tokens", c.vocab_size, H);
  if (c.tie_word_embeddings && !m->files_.find(names.head + ".weight"))
    m->lm_head_ = m->embed_;
  else
    m->lm_head_ = L.linear(names.head, c.vocab_size, H);
  m->final_norm_ = L.norm(names.body + "norm.weight", H);
  m->layers_.resize(size_t(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = names.body + "layers." + std::to_string(i) + ".";
    LayerWeights& lw = m->layers_[size_t(i)];
    lw.attn_norm = L.norm(p + "input_layernorm.weight", H);
    if (c.sandwich_norms) {
      // Gemma 3: input_layernorm -> attention -> post_attention_layernorm -> residual;
      // pre_feedforward_layernorm -> MLP -> post_feedforward_layernorm -> residual
      lw.post_attn_norm = L.norm(p + "post_attention_layernorm.weight", H);
      lw.mlp_norm = L.norm(p + "pre_feedforward_layernorm.weight", H);
      lw.post_mlp_norm = L.norm(p + "post_feedforward_layernorm.weight", H);
    } else {
      lw.mlp_norm = L.norm(p + "post_attention_layernorm.weight", H);
    }
    const bool own_kv = c.stores_kv(i);
    if (c.fused_qkv) {
      // (config.cpp refuses num_kv_shared_layers with a fused qkv_proj: every layer stores its K/V)
      const WeightMatrix qkv = L.linear(p + "self_attn.qkv_proj", c.q_dim() + 2 * c.kv_dim(), H);
      lw.wq = weight_rows(qkv, 0, c.q_dim());
      lw.wk = weight_rows(qkv, c.q_dim(), c.kv_dim());
      lw.wv = weight_rows(qkv, c.q_dim() + c.kv_dim(), c.kv_dim());
    } else {
      lw.wq = L.linear(p + "self_attn.q_proj", c.q_dim(), H);
    }
    if (!c.fused_qkv && own_kv) {
      lw.wk = L.linear(p + "self_attn.k_proj", c.kv_dim(), H);
      lw.wv = L.linear(p + "self_attn.v_proj", c.kv_dim(), H);
    } else if (!c.fused_qkv) {
      // A KV-shared layer (num_kv_shared_layers) reads its donor's K/V: weights of its own would be
      // silently unused, so a file carrying them is not the model config.json describes.
      for (const char* t : {"k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias", "k_proj.scales",
                            "v_proj.scales"})
        if (const TensorView* tv = m->files_.find(p + "self_attn." + t))
          throw Error(tv->file->string() + ": tensor '" + p + "self_attn." + t + "' exists, but layer " +
                      std::to_string(i) + " reads layer " + std::to_string(c.kv_source[size_t(i)]) +
                      "'s K/V (config.json num_kv_shared_layers " + std::to_string(c.num_kv_shared_layers) + ")");
    }
    lw.wo = L.linear(p + "self_attn.o_proj", H, c.q_dim());
    if (c.qkv_bias) {
      lw.bq = L.vec(p + "self_attn.q_proj.bias", c.q_dim());
      if (own_kv) {
        lw.bk = L.vec(p + "self_attn.k_proj.bias", c.kv_dim());
        lw.bv = L.vec(p + "self_attn.v_proj.bias", c.kv_dim());
      }
    }
    if (c.o_bias) lw.bo = L.vec(p + "self_attn.o_proj.bias", H);
    if (c.qk_norm) {
      lw.q_norm = L.norm(p + "self_attn.q_norm.weight", c.head_dim);
      if (own_kv) lw.k_norm = L.norm(p + "self_attn.k_norm.weight", c.head_dim);
    }
    if (c.moe.sparse(i)) {
      lw.moe = L.moe(p);
      continue;
    }
    if (c.fused_gate_up) {
      // transformers' Phi3MLP: gate, up = gate_up_proj(x).chunk(2)
      const WeightMatrix gu = L.linear(p + "mlp.gate_up_proj", 2 * I, H);
      lw.w_gate = weight_rows(gu, 0, I);
      lw.w_up = weight_rows(gu, I, I);
    } else {
      lw.w_gate = L.linear(p + "mlp.gate_proj", I, H);
      lw.w_up = L.linear(p + "mlp.up_proj", I, H);
    }
    lw.w_down = L.linear(p + "mlp.down_proj", H, I);
    if (c.mlp_bias) {
      lw.b_gate = L.vec(p + "mlp.gate_proj.bias", I);
      lw.b_up = L.vec(p + "mlp.up_proj.bias", I);
      lw.b_down = L.vec(p + "mlp.down_proj.bias", H);
    }
  }
  m->init_rope();
  if (c.num_kv_shared_layers > 0) m->cross_layer_ = c.n_layers - c.num_kv_shared_layers - 1;
  m->pack_panels();
  return m;
}

namespace {
// How a matrix is repacked at load, if it is.
enum class Repack { None, Ggml, Affine, Panels };
}  // namespace

void Model::pack_panels() {
  // Which matrices are repacked, chosen before any is (the three formats are disjoint): llama.cpp's
  // block types but Q2_K and Q3_K in 16-row groups (kernels/ggml.h; with AMX too, whose bf16 copies
  // of their rows made prefill slower than the packed products), MLX affine in 16-row groups
  // (kernels/affine.h), BF16 in panels (kernels/panels.h).
  const bool affine = affine_pack_wanted(), panels = panels_wanted();
  const auto kind = [&](const WeightMatrix& w) {
    if (ggml_pack_fit(w) && ggml_pack_wanted(w.ggml)) return Repack::Ggml;
    if (affine && affine_pack_fit(w)) return Repack::Affine;
    if (panels && panels_fit(w)) return Repack::Panels;
    return Repack::None;
  };
  const auto bytes = [](const WeightMatrix& w, Repack k) {
    return k == Repack::Ggml ? ggml_packed_bytes(w) : k == Repack::Panels ? panels_bytes(w) : w.nbytes();
  };
  struct Job {
    WeightMatrix* w;
    Repack kind;
    size_t offset;
  };
  // One buffer on huge pages for all of them, in the order a forward pass reads them: a decode step
  // streams it front to back, and the matrices under 4 MiB (a 1B model's q, k, v and o) get huge
  // pages too without rounding each up to 2 MiB. Each starts on a 4 KiB boundary.
  std::vector<Job> jobs;
  size_t total = 0;
  const auto add = [&](WeightMatrix* w) {
    const Repack k = kind(*w);
    if (k == Repack::None) return;
    jobs.push_back({w, k, total});
    total += (bytes(*w, k) + 4095) / 4096 * 4096;
  };
  for (LayerWeights& lw : layers_)
    for (WeightMatrix* w : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down}) add(w);
  const bool tied = lm_head_.data == embed_.data;
  add(&lm_head_);  // the embedding's rows are read from it when tied (an affine one keeps the file's)
  if (jobs.empty()) return;
  // Llama-3.2-1B's packing spent most of its time in the kernel clearing 4 KiB pages.
  uint8_t* const arena = static_cast<uint8_t*>(huge_page_alloc(total, 0));
  if (!arena) throw Error("out of memory: " + std::to_string(total) + " bytes for the packed weight matrices");
  packed_bytes_.reset(arena);
  ThreadPool pool(ThreadPool::default_threads());
  for (const Job& j : jobs) {
    WeightMatrix& w = *j.w;
    uint8_t* const p = arena + j.offset;
    const size_t n = bytes(w, j.kind);
    switch (j.kind) {
      case Repack::Ggml:
        pool.parallel_for(size_t(w.rows / kGgmlPackRows), [&](size_t b, size_t e) { ggml_pack(w, p, int(b), int(e)); });
        if (gguf_) gguf_->release(w.data, w.nbytes());  // the file's blocks are not read again
        w = ggml_packed_matrix(w.ggml, p, w.rows, w.cols);
        ++ggml_packed_;
        break;
      case Repack::Affine: {
        pool.parallel_for(size_t(w.rows / kAffinePackRows), [&](size_t b, size_t e) { affine_pack(w, p, int(b), int(e)); });
        const size_t gbytes = size_t(w.rows) * size_t(w.cols / w.group_size) * dtype_size(w.dtype);
        for (const auto& f : files_.files()) {  // the file's pages of the matrix: dropped from memory
          f->release(w.data, size_t(w.rows) * w.row_bytes());
          f->release(w.scales, gbytes);
          f->release(w.biases, gbytes);
        }
        // Tied: the embedding keeps reading its rows from the file's layout (a page faulted in again
        // when a lookup touches it).
        if (&w == &lm_head_) head_repacked_ = head_tied();
        w = affine_packed_matrix(w, p);
        ++affine_packed_;
        break;
      }
      case Repack::Panels:
        ptllm::pack_panels(w, p, pool);
        // The file's pages of the matrix are not read again: dropped from this process's memory (a
        // later read, by a quantizer, maps them in again).
        for (const auto& f : files_.files()) f->release(w.data, n);
        if (gguf_) gguf_->release(w.data, n);
        w = panels_matrix(p, w.rows, w.cols);
        ++panel_packed_;
        break;
      case Repack::None:
        break;
    }
  }
  if (tied && jobs.back().w == &lm_head_ && jobs.back().kind != Repack::Affine) embed_ = lm_head_;
}

void Model::replace_matrix(const std::string& module, const WeightMatrix& w) {
  WeightMatrix* target = nullptr;
  if (module == "model.embed_tokens") {
    if (head_tied()) lm_head_ = w;  // tied: the LM head is the embedding
    head_repacked_ = false;
    target = &embed_;
  } else if (module == "lm_head") {
    target = &lm_head_;
    head_repacked_ = false;
  } else if (module.starts_with("model.layers.")) {
    const size_t dot = module.find('.', 13);
    int li = -1;
    if (dot != std::string::npos) try {
        li = std::stoi(module.substr(13, dot - 13));
      } catch (const std::exception&) {
      }
    if (li >= 0 && li < cfg_.n_layers) {
      LayerWeights& L = layers_[size_t(li)];
      const std::string leaf = module.substr(dot + 1);
      // Phi-3's fused matrices: their parts become views of the replacement
      const int qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), I = cfg_.intermediate_size;
      if (cfg_.fused_qkv && leaf == "self_attn.qkv_proj") {
        if (w.rows != qd + 2 * kvd || w.cols != cfg_.hidden_size)
          throw Error("replace_matrix: '" + module + "' is [" + std::to_string(qd + 2 * kvd) + "][" +
                      std::to_string(cfg_.hidden_size) + "]");
        L.wq = weight_rows(w, 0, qd);
        L.wk = weight_rows(w, qd, kvd);
        L.wv = weight_rows(w, qd + kvd, kvd);
        return;
      }
      if (cfg_.fused_gate_up && leaf == "mlp.gate_up_proj") {
        if (w.rows != 2 * I || w.cols != cfg_.hidden_size)
          throw Error("replace_matrix: '" + module + "' is [" + std::to_string(2 * I) + "][" +
                      std::to_string(cfg_.hidden_size) + "]");
        L.w_gate = weight_rows(w, 0, I);
        L.w_up = weight_rows(w, I, I);
        return;
      }
      for (auto& [name, m] : {std::pair{"self_attn.q_proj", &L.wq}, {"self_attn.k_proj", &L.wk},
                              {"self_attn.v_proj", &L.wv}, {"self_attn.o_proj", &L.wo}, {"mlp.gate_proj", &L.w_gate},
                              {"mlp.up_proj", &L.w_up}, {"mlp.down_proj", &L.w_down}}) {
        // a part of a fused matrix is replaced through the fused one only
        const bool fused_part = (cfg_.fused_qkv && (m == &L.wq || m == &L.wk || m == &L.wv)) ||
                                (cfg_.fused_gate_up && (m == &L.w_gate || m == &L.w_up));
        if (leaf == name && m->data && !fused_part) target = m;
      }
    }
  }
  if (!target) throw Error("replace_matrix: '" + module + "' is not a weight matrix of this model");
  if (target->rows != w.rows || target->cols != w.cols)
    throw Error("replace_matrix: '" + module + "' is [" + std::to_string(target->rows) + "][" +
                std::to_string(target->cols) + "], the replacement [" + std::to_string(w.rows) + "][" +
                std::to_string(w.cols) + "]");
  *target = w;
}

// A cache that rotates at read (PositionMode::Cache) rotates each layer by its own frequencies: Gemma 3's
// local or global ones, none for a NoPE layer. Phi-3's LongRoPE there takes the short factors (slot
// distances under StreamingLLM stay within its window).
KVShape Model::kv_shape() const {
  KVShape sh{cfg_.n_layers, cfg_.n_kv_heads, cfg_.head_dim, inv_freq_, cfg_.layer_windows(), cfg_.kv_source};
  if (!cfg_.layer_rope.empty()) {
    const std::vector<float> none(inv_freq_.size(), 0.0f);
    for (int l = 0; l < cfg_.n_layers; ++l) {
      const LayerRope r = cfg_.rope_of(l);
      sh.layer_rope_inv_freq.push_back(r == LayerRope::Main ? inv_freq_ : r == LayerRope::Local ? inv_freq_local_ : none);
    }
  }
  return sh;
}

size_t Model::weight_bytes() const {
  if (gguf_) return size_t(gguf_->size());
  size_t n = 0;
  for (const auto& f : files_.files()) n += f->size();
  return n;
}

Model::ExpertBytes Model::expert_bytes() const {
  ExpertBytes b;
  for (const LayerWeights& l : layers_) {
    if (!l.moe.present()) continue;
    size_t layer = 0;
    for (const auto* v : {&l.moe.gate, &l.moe.up, &l.moe.down})
      for (const WeightMatrix& w : *v) layer += w.nbytes();
    b.all += layer;
    b.per_token += layer / size_t(cfg_.moe.num_experts) * size_t(cfg_.moe.top_k);  // experts are alike in size
  }
  return b;
}

std::string Model::weight_format() const {
  // Each distinct matrix once (a tied LM head is the embedding), with the bytes of each format.
  std::vector<const WeightMatrix*> all{&embed_};
  if (!head_tied()) all.push_back(&lm_head_);
  for (const LayerWeights& l : layers_) {
    for (const WeightMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      if (w->data) all.push_back(w);
    if (l.moe.present()) all.push_back(&l.moe.router);
    for (const auto* v : {&l.moe.gate, &l.moe.up, &l.moe.down})
      for (const WeightMatrix& w : *v) all.push_back(&w);
  }
  struct Share {
    std::string name;
    size_t bytes = 0;
    int count = 0;
  };
  std::vector<Share> shares;
  for (const WeightMatrix* w : all) {
    const std::string name = w->format_name();
    auto it = std::find_if(shares.begin(), shares.end(), [&](const Share& s) { return s.name == name; });
    if (it == shares.end()) it = shares.insert(shares.end(), Share{name});
    it->bytes += w->nbytes();
    ++it->count;
  }
  std::stable_sort(shares.begin(), shares.end(), [](const Share& a, const Share& b) {
    return a.count != b.count ? a.count > b.count : a.bytes > b.bytes;
  });
  std::string s = shares.empty() ? std::string("none") : shares[0].name;
  for (size_t i = 1; i < shares.size(); ++i)
    s += " + " + shares[i].name + " (" + std::to_string(shares[i].count) + " of " + std::to_string(all.size()) +
         " matrices)";
  return s;
}

namespace {
const float* bias_or_null(const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); }

template <class V>
void ensure(V& v, size_t n) {
  if (v.size() < n) v.resize(n);
}
}  // namespace

void Model::forward(std::span<const int32_t> tokens, int64_t pos0, KVCache& cache, ForwardState& st, float* logits,
                    bool all_logits, ThreadPool& pool) const {
  const SequenceBatch one{&cache, tokens, pos0, logits, all_logits};
  forward({&one, 1}, st, pool);
}

namespace {
size_t rows_of(std::span<const SequenceBatch> batch) {
  size_t T = 0;
  for (const SequenceBatch& s : batch) T += s.tokens.size();
  return T;
}
}  // namespace

// The batch's T rows are its sequences' tokens one after another: row r of every buffer below is one
// token. Everything but attention treats the rows alike, so each weight matrix is read once a step.
// A KV-shared layer (YOCO) projects no K/V and attends over its donor's. From the cross-decoder's
// donor on (cross_layer_), rows whose logits nobody wants are dropped: later tokens read only the K/V
// stored up to the donor, so their outputs would be discarded (the paper's prefill early exit).
void Model::forward(std::span<const SequenceBatch> batch, ForwardState& st, ThreadPool& pool) const {
  const ModelConfig& c = cfg_;
  int T = int(rows_of(batch));
  const int H = c.hidden_size, I = c.intermediate_size;
  PTLLM_CHECK(T > 0 && batch.size() <= kMaxBatchSequences);
  if (st.capacity < T) {
    const size_t t = size_t(T);
    ensure(st.x, t * size_t(H));
    ensure(st.xn, t * size_t(H));
    ensure(st.q, t * size_t(c.q_dim()));
    ensure(st.k, t * size_t(c.kv_dim()));
    ensure(st.v, t * size_t(c.kv_dim()));
    ensure(st.att, t * size_t(c.q_dim()));
    ensure(st.gate, t * size_t(I));
    ensure(st.up, t * size_t(I));
    ensure(st.cos, t * size_t(c.head_dim / 2));
    ensure(st.sin, t * size_t(c.head_dim / 2));
    if (!inv_freq_local_.empty()) {
      ensure(st.cos_local, t * size_t(c.head_dim / 2));
      ensure(st.sin_local, t * size_t(c.head_dim / 2));
    }
    st.capacity = T;
  }
  Rows rows{};  // each sequence's rows now: all its tokens until cross_layer_
  for (size_t i = 0; i < batch.size(); ++i) rows[i] = int(batch[i].tokens.size());

  // x[r] = E[token r]; the RoPE tables of every row's position, shared by every layer
  embed_and_rope(batch, st);

  // The observer's view of a matrix input (a calibration run); false: the caller wants no more.
  ForwardObserver* const obs = st.observer;
  auto seen = [&](int li, MatmulInput site, const auto& x, int width) {
    return !obs || obs->observe(li, site, x.data(), T, width);
  };

  for (int li = 0; li < c.n_layers; ++li) {
    const LayerWeights& L = layers_[size_t(li)];
    // Attention block: xn = norm(x); k, v projections (a storing layer), RoPE on k, appended to each
    // sequence's cache; q projection; per sequence: RoPE on q, attention over the layer's K/V or its
    // donor's; x += o_proj(att)
    for (int r = 0; r < T; ++r)
      rmsnorm(st.x.data() + size_t(r) * size_t(H), L.attn_norm.data(), st.xn.data() + size_t(r) * size_t(H), H,
              c.rms_norm_eps);
    if (!seen(li, MatmulInput::Attention, st.xn, H)) return;
    // q is computed with k and v (one call: x shared) except at cross_layer_, which drops rows first
    const MatmulOutput kvq[] = {{&L.wk, bias_or_null(L.bk), st.k.data()},   // k [T][kv_dim]
                                {&L.wv, bias_or_null(L.bv), st.v.data()},   // v [T][kv_dim]
                                {&L.wq, bias_or_null(L.bq), st.q.data()}};  // q [T][q_dim]
    const bool q_with_kv = c.stores_kv(li) && li != cross_layer_;
    if (c.stores_kv(li)) {
      matmul_shared_x(st.xn.data(), T, std::span(kvq, q_with_kv ? 3 : 2), pool);
      prepare_heads(st.k.data(), T, c.n_kv_heads, L.k_norm, k_scale_);
      append_kv(li, batch, rows, st);
    }
    if (li == cross_layer_) {
      T = keep_wanted_rows(batch, rows, T, st);  // x, xn, cos, sin: [T'] rows
      st.cross_rows = T;
      if (T == 0) return;                        // no logits wanted: every K/V needed later is stored
    }
    if (!q_with_kv) matmul(st.xn.data(), T, L.wq, bias_or_null(L.bq), st.q.data(), pool);
    prepare_heads(st.q.data(), T, c.n_heads, L.q_norm, q_scale_);
    attention(li, batch, rows, st, pool);                                   // att [T][q_dim]
    if (!seen(li, MatmulInput::AttentionOutput, st.att, c.q_dim())) return;
    matmul(st.att.data(), T, L.wo, bias_or_null(L.bo), st.xn.data(), pool);
    if (!L.post_attn_norm.empty()) norm_rows(st.xn.data(), T, L.post_attn_norm);
    for (size_t i = 0; i < size_t(T) * size_t(H); ++i) st.x[i] += st.xn[i];

    // MLP block: x += down(act(gate(norm(x))) * up(norm(x))), act SiLU or GELU-tanh
    for (int r = 0; r < T; ++r)
      rmsnorm(st.x.data() + size_t(r) * size_t(H), L.mlp_norm.data(), st.xn.data() + size_t(r) * size_t(H), H,
              c.rms_norm_eps);
    if (!seen(li, MatmulInput::Mlp, st.xn, H)) return;
    if (L.moe.present()) {  // routed experts: x += sum of the chosen experts' outputs, weighted
      if (st.moe.out.size() < size_t(T) * size_t(H)) st.moe.out.resize(size_t(T) * size_t(H));
      moe_forward(L.moe, c.moe, st.xn.data(), T, H, st.moe.out.data(), st.moe, pool, st.moe_counters, li);
      for (size_t i = 0; i < size_t(T) * size_t(H); ++i) st.x[i] += st.moe.out[i];
      continue;
    }
    const MatmulOutput gate_up[] = {{&L.w_gate, bias_or_null(L.b_gate), st.gate.data()},  // [T][inter]
                                    {&L.w_up, bias_or_null(L.b_up), st.up.data()}};       // [T][inter]
    matmul_shared_x(st.xn.data(), T, gate_up, pool);
    if (c.activation == Activation::GeluTanh)
      gelu_tanh_mul(st.gate.data(), st.up.data(), T * I);
    else
      silu_mul(st.gate.data(), st.up.data(), T * I);
    if (!seen(li, MatmulInput::MlpDown, st.gate, I)) return;
    matmul(st.gate.data(), T, L.w_down, bias_or_null(L.b_down), st.xn.data(), pool);
    if (!L.post_mlp_norm.empty()) norm_rows(st.xn.data(), T, L.post_mlp_norm);
    for (size_t i = 0; i < size_t(T) * size_t(H); ++i) st.x[i] += st.xn[i];
  }

  // Final norm and LM head, for the rows whose logits are wanted
  lm_head(batch, rows, st, pool);
}

// LongRoPE's switch, as transformers' _longrope_frequency_update makes it: a forward call whose
// positions reach past original_max_position uses the long factors for all its tokens, one within it
// the short ones. Keys stored earlier keep the rotation they were stored with (transformers' cache
// does the same), so a sequence's result depends on where its calls end, as transformers' does.
void Model::embed_and_rope(std::span<const SequenceBatch> batch, ForwardState& st) const {
  const ModelConfig& c = cfg_;
  const int H = c.hidden_size, half = c.head_dim / 2;
  size_t r = 0;
  for (const SequenceBatch& s : batch) {
    const bool use_long =
        !inv_freq_long_.empty() && s.pos0 + int64_t(s.tokens.size()) > int64_t(c.rope.original_max_position);
    const float* main = use_long ? inv_freq_long_.data() : inv_freq_.data();
    for (size_t t = 0; t < s.tokens.size(); ++t, ++r) {
      const int32_t id = s.tokens[t];
      if (id < 0 || id >= c.vocab_size)
        throw Error("token id " + std::to_string(id) + " is outside the vocabulary (" + std::to_string(c.vocab_size) +
                    ")");
      float* x = st.x.data() + r * size_t(H);
      weight_row(embed_, id, x);
      if (c.embed_scale != 1.0f)
        for (int i = 0; i < H; ++i) x[i] *= c.embed_scale;
      rope_cos_sin(main, half, s.pos0 + int64_t(t), st.cos.data() + r * size_t(half), st.sin.data() + r * size_t(half));
      if (!inv_freq_local_.empty())
        rope_cos_sin(inv_freq_local_.data(), half, s.pos0 + int64_t(t), st.cos_local.data() + r * size_t(half),
                     st.sin_local.data() + r * size_t(half));
    }
  }
}

const float* Model::rope_cos(int layer, const ForwardState& st) const {
  switch (cfg_.rope_of(layer)) {
    case LayerRope::Main: return st.cos.data();
    case LayerRope::Local: return st.cos_local.data();
    case LayerRope::None: return nullptr;
  }
  return nullptr;
}

const float* Model::rope_sin(int layer, const ForwardState& st) const {
  switch (cfg_.rope_of(layer)) {
    case LayerRope::Main: return st.sin.data();
    case LayerRope::Local: return st.sin_local.data();
    case LayerRope::None: return nullptr;
  }
  return nullptr;
}

void Model::norm_rows(float* x, int T, const std::vector<float>& w) const {
  const int H = cfg_.hidden_size;
  for (int r = 0; r < T; ++r) {
    float* row = x + size_t(r) * size_t(H);
    rmsnorm(row, w.data(), row, H, cfg_.rms_norm_eps);
  }
}

void Model::prepare_heads(float* x, int T, int heads, const std::vector<float>& norm,
                          const std::vector<float>& scale) const {
  const ModelConfig& c = cfg_;
  const int D = c.head_dim;
  if (qk_permuted_) gguf_unpermute_heads(x, T, heads, D);
  if (norm.empty() && head_perm_.empty() && scale.empty()) return;
  std::array<float, 1024> tmp;
  PTLLM_CHECK(D <= int(tmp.size()));
  for (size_t h = 0; h < size_t(T) * size_t(heads); ++h) {
    float* row = x + h * size_t(D);
    if (!norm.empty()) rmsnorm(row, norm.data(), row, D, c.rms_norm_eps);  // in place: it reads x before writing
    if (!head_perm_.empty()) {
      for (int d = 0; d < D; ++d) tmp[size_t(d)] = row[head_perm_[size_t(d)]];
      std::copy_n(tmp.data(), D, row);
    }
    if (!scale.empty())
      for (int d = 0; d < D; ++d) row[d] *= scale[size_t(d)];
  }
}

// GELU with the tanh approximation (transformers' gelu_pytorch_tanh), times up.
void Model::gelu_tanh_mul(float* gate, const float* up, int n) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
  for (int i = 0; i < n; ++i) {
    const float x = gate[i];
    gate[i] = 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x))) * up[i];
  }
}

void Model::init_rope() {
  const ModelConfig& c = cfg_;
  const int D = c.head_dim, half = D / 2, R = c.rotated_dims();
  auto padded = [&](std::vector<float> f) {
    f.resize(size_t(half), 0.0f);  // the dims that pass through rotate by nothing
    return f;
  };
  inv_freq_ = padded(rope_inv_freq(c.rope, R));
  inv_freq_local_.clear();
  inv_freq_long_.clear();
  if (c.rope.type == RopeType::LongRope) inv_freq_long_ = padded(rope_inv_freq(c.rope, R, true));
  for (int l = 0; l < c.n_layers; ++l)
    if (c.rope_of(l) == LayerRope::Local && inv_freq_local_.empty()) inv_freq_local_ = padded(rope_inv_freq(c.rope_local, R));
  head_perm_.clear();
  if (R < D) {
    // transformers rotates dims [0, R) in pairs (i, i + R/2) and passes [R, D) through. Reordered as
    // [0, R/2) [R, R + P/2) | [R/2, R) [R + P/2, D) (P = D - R), the pairs are (j, j + D/2): the
    // rotated ones first, then pass-through pairs whose frequency is 0.
    const int P = D - R;
    head_perm_.resize(size_t(D));
    for (int j = 0; j < half; ++j) {
      head_perm_[size_t(j)] = j < R / 2 ? j : R + (j - R / 2);
      head_perm_[size_t(half + j)] = j < R / 2 ? R / 2 + j : R + P / 2 + (j - R / 2);
    }
  }
  q_scale_.clear();
  k_scale_.clear();
  const double q_ratio = c.query_pre_attn_scalar > 0 ? std::sqrt(double(D) / c.query_pre_attn_scalar) : 1.0;
  const double m = c.rope.type == RopeType::LongRope ? c.rope.attention_factor : 1.0;
  if (q_ratio != 1.0 || m != 1.0) {
    q_scale_.assign(size_t(D), 1.0f);
    k_scale_.assign(size_t(D), 1.0f);
    for (int d = 0; d < D; ++d) {
      const bool rotated = d % half < R / 2;
      q_scale_[size_t(d)] = float(q_ratio * (rotated ? m : 1.0));
      k_scale_[size_t(d)] = float(rotated ? m : 1.0);
    }
    if (m == 1.0) k_scale_.clear();
  }
}

// Each sequence's k rows rotated at their positions (unless its cache rotates at read) and appended,
// with v, to its cache (the pools: one thread).
void Model::append_kv(int layer, std::span<const SequenceBatch> batch, const Rows& rows, ForwardState& st) const {
  const ModelConfig& c = cfg_;
  const int half = c.head_dim / 2;
  const size_t kvd = size_t(c.kv_dim());
  size_t r0 = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceBatch& s = batch[i];
    const int n = rows[i];
    PTLLM_CHECK(n == int(s.tokens.size()));  // every token's K/V is stored, before any row is dropped
    const float *cs = rope_cos(layer, st), *sn = rope_sin(layer, st);
    for (int t = 0; t < n && cs && !s.cache->rotates_at_read(); ++t) {
      const size_t r = r0 + size_t(t);
      rope_rotate(st.k.data() + r * kvd, c.n_kv_heads, c.head_dim, cs + r * size_t(half), sn + r * size_t(half));
    }
    s.cache->append(layer, st.k.data() + r0 * kvd, st.v.data() + r0 * kvd, n);
    r0 += size_t(n);
  }
}

// Past the cross-decoder's donor, a sequence keeps the rows whose logits it wants: all of them
// (teacher forcing), its last token's, or none (a prompt chunk before the last). Its kept rows are its
// last ones, which is what attend() takes as queries. Rows move towards the front only, in order.
int Model::keep_wanted_rows(std::span<const SequenceBatch> batch, Rows& rows, int T, ForwardState& st) const {
  const size_t H = size_t(cfg_.hidden_size), half = size_t(cfg_.head_dim / 2);
  auto move_row = [](auto& buf, size_t width, size_t from, size_t to) {
    if (from != to) std::copy_n(buf.data() + from * width, width, buf.data() + to * width);
  };
  size_t src0 = 0, dst = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceBatch& s = batch[i];
    const int n = rows[i];
    const int keep = !s.logits ? 0 : s.all_logits ? n : std::min(n, 1);
    for (int t = n - keep; t < n; ++t, ++dst) {
      const size_t from = src0 + size_t(t);
      move_row(st.x, H, from, dst);
      move_row(st.xn, H, from, dst);
      move_row(st.cos, half, from, dst);
      move_row(st.sin, half, from, dst);
      if (!inv_freq_local_.empty()) {
        move_row(st.cos_local, half, from, dst);
        move_row(st.sin_local, half, from, dst);
      }
    }
    rows[i] = keep;
    src0 += size_t(n);
  }
  PTLLM_CHECK(src0 == size_t(T));
  return int(dst);
}

// Each sequence's query rows: rotated at their positions (unless its cache rotates at read), then
// attending over its cache's K/V of this layer, or of the donor a KV-shared layer reads (the queries
// are the last rows[i] tokens appended there). Several decoding sequences attend side by side, one
// per thread (a nested parallel_for runs inline): one decode token's attention over a short context
// is too little work to split, and one call per sequence would be as many hand-offs to the pool. A
// token's output is the same either way (attention never depends on the thread count).
void Model::attention(int layer, std::span<const SequenceBatch> batch, const Rows& rows, ForwardState& st,
                      ThreadPool& pool) const {
  const ModelConfig& c = cfg_;
  const int D = c.head_dim, half = D / 2;
  const size_t qd = size_t(c.q_dim());
  std::array<size_t, kMaxBatchSequences> row0;  // each sequence's first row
  size_t r0 = 0, longest = 0;
  const float *cs = rope_cos(layer, st), *sn = rope_sin(layer, st);
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceBatch& s = batch[i];
    const int n = rows[i];
    for (int t = 0; t < n && cs && !s.cache->rotates_at_read(); ++t) {
      const size_t r = r0 + size_t(t);
      rope_rotate(st.q.data() + r * qd, c.n_heads, D, cs + r * size_t(half), sn + r * size_t(half));
    }
    row0[i] = r0;
    r0 += size_t(n);
    longest = std::max(longest, size_t(n));
  }
  auto attend = [&](size_t i) {
    const SequenceBatch& s = batch[i];
    if (rows[i] == 0) return;
    s.cache->attend(s.cache->kv_layer(layer), st.q.data() + row0[i] * qd, rows[i], c.n_heads,
                    st.att.data() + row0[i] * qd, pool);
  };
  if (batch.size() > 1 && longest <= 16) {
    pool.parallel_for(batch.size(), [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) attend(i);
    });
  } else {
    for (size_t i = 0; i < batch.size(); ++i) attend(i);
  }
}

// A sequence wants the logits of all its rows or of its last; one matmul computes them all. A lone
// sequence gets them in place, several through st.logits.
void Model::lm_head(std::span<const SequenceBatch> batch, const Rows& rows, ForwardState& st,
                    ThreadPool& pool) const {
  const ModelConfig& c = cfg_;
  const int H = c.hidden_size;
  const size_t vocab = size_t(c.vocab_size);
  size_t r0 = 0, n_out = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceBatch& s = batch[i];
    const size_t n = size_t(rows[i]);
    if (s.logits)
      for (size_t t = s.all_logits ? 0 : n - 1; t < n; ++t, ++n_out)
        rmsnorm(st.x.data() + (r0 + t) * size_t(H), final_norm_.data(), st.xn.data() + n_out * size_t(H), H,
                c.rms_norm_eps);
    r0 += n;
  }
  if (n_out == 0) return;
  if (st.observer && !st.observer->observe(c.n_layers, MatmulInput::LmHead, st.xn.data(), int(n_out), H)) return;
  // Gemma 3's final_logit_softcapping: cap * tanh(logits / cap)
  auto softcap = [&](float* l) {
    const float cap = c.final_logit_softcapping;
    if (cap > 0)
      for (size_t i = 0; i < n_out * vocab; ++i) l[i] = cap * std::tanh(l[i] / cap);
  };
  if (batch.size() == 1) {
    matmul(st.xn.data(), int(n_out), lm_head_, nullptr, batch[0].logits, pool);
    softcap(batch[0].logits);
    return;
  }
  if (st.logit_capacity < int(n_out)) {
    ensure(st.logits, n_out * vocab);
    st.logit_capacity = int(n_out);
  }
  matmul(st.xn.data(), int(n_out), lm_head_, nullptr, st.logits.data(), pool);
  softcap(st.logits.data());
  const float* row = st.logits.data();
  for (const SequenceBatch& s : batch) {
    if (!s.logits) continue;
    const size_t n = s.all_logits ? s.tokens.size() : 1;
    std::copy_n(row, n * vocab, s.logits);
    row += n * vocab;
  }
}

}  // namespace ptllm
