#include "model/gguf_model.h"
#include "model/weight_rows.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <memory>

#include "core/error.h"
#include "kernels/ggml.h"
#include "model/model.h"

namespace ptllm {

namespace {
constexpr int64_t kMaxHeadDim = 1024;
}  // namespace

void gguf_unpermute_heads(float* x, int T, int heads, int head_dim) {
  const int half = head_dim / 2;
  std::array<float, kMaxHeadDim> tmp;
  PTLLM_CHECK(head_dim <= int(kMaxHeadDim));
  for (int r = 0; r < T * heads; ++r) {
    float* h = x + size_t(r) * size_t(head_dim);
    for (int j = 0; j < half; ++j) {
      tmp[size_t(j)] = h[2 * j];
      tmp[size_t(half + j)] = h[2 * j + 1];
    }
    std::memcpy(h, tmp.data(), size_t(head_dim) * sizeof(float));
  }
}

std::vector<int> gguf_permuted_rows(int rows, int head_dim) {
  const int half = head_dim / 2;
  std::vector<int> src(static_cast<size_t>(rows));
  for (int h = 0; h < rows / head_dim; ++h)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < half; ++j) src[size_t(h * head_dim + 2 * j + i)] = h * head_dim + i * half + j;
  return src;
}

namespace {

std::string dims_of(std::initializer_list<int64_t> d) {
  std::string s = "[";
  for (int64_t v : d) s += (s.size() > 1 ? ", " : "") + std::to_string(v);
  return s + "]";
}

struct GgufLoader {
  const GgufFile& f;
  std::vector<std::unique_ptr<float[]>>& aligned_copies;

  const GgufTensor& tensor(const std::string& name, std::initializer_list<int64_t> dims) const {
    const GgufTensor* t = f.find_tensor(name);
    if (!t) throw Error(f.name() + ": tensor '" + name + "' is missing");
    bool same = t->dims.size() == dims.size();
    for (size_t i = 0; same && i < dims.size(); ++i) same = int64_t(t->dims[i]) == dims.begin()[i];
    if (!same)
      throw Error(f.name() + ": tensor '" + name + "' has dims " + t->dims_str() + ", expected " + dims_of(dims) +
                  " from the file's metadata" + (dims.size() == 2 ? " ([columns, rows], as GGUF orders them)" : ""));
    return *t;
  }
  static bool dense_type(GgmlType t, DType& d) {
    switch (t) {
      case GgmlType::F32: d = DType::F32; return true;
      case GgmlType::F16: d = DType::F16; return true;
      case GgmlType::BF16: d = DType::BF16; return true;
      default: return false;
    }
  }
  // A [rows][cols] matrix (GGUF dims [cols, rows]) read in place.
  WeightMatrix matrix(const std::string& name, int rows, int cols) const {
    return in_place(tensor(name, {cols, rows}), name, rows, cols);
  }
  // A stack of `experts` [rows][cols] matrices (dims [cols, rows, experts]) as one [experts * rows][cols]
  // matrix, each expert a view of its rows (model/moe.h, stacked_expert).
  WeightMatrix stacked(const std::string& name, int rows, int cols, int experts) const {
    return in_place(tensor(name, {cols, rows, experts}), name, experts * rows, cols);
  }
  // A sparse layer's router (ffn_gate_inp) and experts (ffn_{gate,up,down}_exps), as llama.cpp's
  // converter stacks them.
  MoeWeights moe(const std::string& p, const ModelConfig& c) const {
    const int H = c.hidden_size, E = c.moe.num_experts, I = c.moe.intermediate_size;
    MoeWeights m;
    m.router = matrix(p + "ffn_gate_inp.weight", E, H);
    const WeightMatrix g = stacked(p + "ffn_gate_exps.weight", I, H, E);
    const WeightMatrix u = stacked(p + "ffn_up_exps.weight", I, H, E);
    const WeightMatrix d = stacked(p + "ffn_down_exps.weight", H, I, E);
    for (int e = 0; e < E; ++e) {
      m.gate.push_back(stacked_expert(g, e, I));
      m.up.push_back(stacked_expert(u, e, I));
      m.down.push_back(stacked_expert(d, e, H));
    }
    return m;
  }
  WeightMatrix in_place(const GgufTensor& t, const std::string& name, int rows, int cols) const {
    DType d;
    if (dense_type(t.type, d)) {
      if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(d) == 0) return dense_matrix(d, t.data, rows, cols);
      const size_t words = (t.nbytes + sizeof(float) - 1) / sizeof(float);  // misaligned (a file parsed in memory)
      aligned_copies.emplace_back(new float[words]);
      std::memcpy(aligned_copies.back().get(), t.data, t.nbytes);
      return dense_matrix(d, aligned_copies.back().get(), rows, cols);
    }
    if (!ggml_supported(t.type))
      throw Error(f.name() + ": tensor '" + name + "' has type " + std::string(ggml_type_info(t.type).name) +
                  ", which this build's kernels do not read");
    return ggml_matrix(t.type, t.data, rows, cols);
  }
  std::vector<float> vec(const std::string& name, int n) const {
    const GgufTensor& t = tensor(name, {n});
    DType d;
    if (!dense_type(t.type, d))
      throw Error(f.name() + ": tensor '" + name + "' has type " + std::string(ggml_type_info(t.type).name) +
                  " (a vector must be F32, F16 or BF16)");
    std::vector<float> out(static_cast<size_t>(n));
    convert_to_f32(d, t.data, out.data(), size_t(n));  // reads bytewise: alignment does not matter
    return out;
  }
};

}  // namespace

std::unique_ptr<Model> Model::load_gguf(const std::filesystem::path& file) {
  std::unique_ptr<Model> m(new Model());
  m->gguf_ = std::make_shared<const GgufFile>(GgufFile::open(file));
  const GgufFile& f = *m->gguf_;
  m->dir_ = file;
  m->cfg_ = gguf_model_config(f);
  m->qk_permuted_ = gguf_qk_permuted(f);
  const ModelConfig& c = m->cfg_;
  GgufLoader L{f, m->aligned_copies_};
  const int H = c.hidden_size, I = c.intermediate_size;
  m->embed_ = L.matrix("token_embd.weight", c.vocab_size, H);
  m->lm_head_ = c.tie_word_embeddings ? m->embed_ : L.matrix("output.weight", c.vocab_size, H);
  m->final_norm_ = L.vec("output_norm.weight", H);
  m->layers_.resize(size_t(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& lw = m->layers_[size_t(i)];
    lw.attn_norm = L.vec(p + "attn_norm.weight", H);
    lw.mlp_norm = L.vec(p + "ffn_norm.weight", H);
    if (c.sandwich_norms) {
      lw.post_attn_norm = L.vec(p + "post_attention_norm.weight", H);
      lw.post_mlp_norm = L.vec(p + "post_ffw_norm.weight", H);
    }
    if (c.fused_qkv) {
      const WeightMatrix qkv = L.matrix(p + "attn_qkv.weight", c.q_dim() + 2 * c.kv_dim(), H);
      lw.wq = weight_rows(qkv, 0, c.q_dim());
      lw.wk = weight_rows(qkv, c.q_dim(), c.kv_dim());
      lw.wv = weight_rows(qkv, c.q_dim() + c.kv_dim(), c.kv_dim());
    } else {
      lw.wq = L.matrix(p + "attn_q.weight", c.q_dim(), H);
      lw.wk = L.matrix(p + "attn_k.weight", c.kv_dim(), H);
      lw.wv = L.matrix(p + "attn_v.weight", c.kv_dim(), H);
    }
    lw.wo = L.matrix(p + "attn_output.weight", H, c.q_dim());
    if (c.qkv_bias) {
      lw.bq = L.vec(p + "attn_q.bias", c.q_dim());
      lw.bk = L.vec(p + "attn_k.bias", c.kv_dim());
      lw.bv = L.vec(p + "attn_v.bias", c.kv_dim());
    }
    if (c.o_bias) lw.bo = L.vec(p + "attn_output.bias", H);
    if (c.qk_norm) {
      lw.q_norm = L.vec(p + "attn_q_norm.weight", c.head_dim);
      lw.k_norm = L.vec(p + "attn_k_norm.weight", c.head_dim);
    }
    if (c.moe.sparse(i)) {
      lw.moe = L.moe(p, c);
      continue;
    }
    if (c.fused_gate_up) {
      const WeightMatrix gu = L.matrix(p + "ffn_up.weight", 2 * I, H);  // gate rows, then up rows
      lw.w_gate = weight_rows(gu, 0, I);
      lw.w_up = weight_rows(gu, I, I);
    } else {
      lw.w_gate = L.matrix(p + "ffn_gate.weight", I, H);
      lw.w_up = L.matrix(p + "ffn_up.weight", I, H);
    }
    lw.w_down = L.matrix(p + "ffn_down.weight", H, I);
    if (c.mlp_bias) {
      lw.b_gate = L.vec(p + "ffn_gate.bias", I);
      lw.b_up = L.vec(p + "ffn_up.bias", I);
      lw.b_down = L.vec(p + "ffn_down.bias", H);
    }
  }
  if (c.rope.type == RopeType::LongRope) {
    // Phi-3's LongRoPE factors, as tensors [rope.dimension_count / 2]
    const int n = c.rotated_dims() / 2;
    for (auto [name, dst] : {std::pair{"rope_factors_short.weight", &m->cfg_.rope.short_factor},
                             std::pair{"rope_factors_long.weight", &m->cfg_.rope.long_factor}}) {
      const std::vector<float> v = L.vec(name, n);
      for (size_t i = 0; i < v.size(); ++i)
        if (!(v[i] > 0.f))
          throw Error(f.name() + ": tensor '" + name + "': element " + std::to_string(i) + " is not positive");
      dst->assign(v.begin(), v.end());
    }
  }
  m->init_rope();
  // Llama 3.1 scaling as llama.cpp's converter writes it: one divisor per frequency (rope_freqs).
  if (f.find_tensor("rope_freqs.weight")) {
    const std::vector<float> factors = L.vec("rope_freqs.weight", c.head_dim / 2);
    for (size_t i = 0; i < factors.size(); ++i) {
      if (!(factors[i] > 0.f))
        throw Error(f.name() + ": tensor 'rope_freqs.weight': element " + std::to_string(i) + " is " +
                    std::to_string(factors[i]) + " (frequency divisors must be positive)");
      m->inv_freq_[i] /= factors[i];
    }
  }
  m->pack_panels();
  return m;
}

}  // namespace ptllm
