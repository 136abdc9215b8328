#include "model/model.h"

#include <cmath>
#include <cstring>
#include <numbers>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/kv_cache.h"

namespace ptllm {

std::vector<float> rope_inv_freq(const RopeConfig& rope, int head_dim) {
  const int half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    // transformers: 1 / base ** (arange(0, dim, 2) / dim), in float32
    const float expo = float(2 * i) / float(head_dim);
    inv[size_t(i)] = float(1.0 / std::pow(rope.theta, double(expo)));
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

  const TensorView& tensor(const std::string& name, std::vector<int64_t> shape) const {
    const TensorView& t = files.get(name);
    TensorView want;
    want.shape = std::move(shape);
    if (t.shape != want.shape)
      throw Error(t.file->string() + ": tensor '" + name + "' has shape " + t.shape_str() + ", config.json implies " +
                  want.shape_str());
    if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
      throw Error(t.file->string() + ": tensor '" + name + "' has dtype " + std::string(dtype_name(t.dtype)) +
                  " (supported: F32, F16, BF16)");
    return t;
  }
  WeightMatrix matrix(const std::string& name, int rows, int cols) const {
    const TensorView& t = tensor(name, {rows, cols});
    if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) == 0) return WeightMatrix{t.dtype, t.data, rows, cols};
    // The format does not promise aligned data (writers pad the header to 8 bytes, but a file may
    // not): such a tensor is copied once into aligned memory instead of being read misaligned.
    const size_t words = (t.nbytes + sizeof(float) - 1) / sizeof(float);
    aligned_copies.emplace_back(new float[words]);
    std::memcpy(aligned_copies.back().get(), t.data, t.nbytes);
    return WeightMatrix{t.dtype, aligned_copies.back().get(), rows, cols};
  }
  std::vector<float> vec(const std::string& name, int n) const {
    const TensorView& t = tensor(name, {n});
    std::vector<float> out(static_cast<size_t>(n));
    convert_to_f32(t.dtype, t.data, out.data(), size_t(n));
    return out;
  }
};

}  // namespace

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir) {
  if (!std::filesystem::is_directory(dir)) throw Error(dir.string() + ": not a model directory (does not exist)");
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->cfg_ = ModelConfig::load(dir / "config.json");
  m->files_ = WeightFiles::open(dir);
  const ModelConfig& c = m->cfg_;
  Loader L{m->files_, c, m->aligned_copies_};
  const int H = c.hidden_size, I = c.intermediate_size;
  m->embed_ = L.matrix("model.embed_tokens.weight", c.vocab_size, H);
  if (c.tie_word_embeddings && !m->files_.find("lm_head.weight"))
    m->lm_head_ = m->embed_;
  else
    m->lm_head_ = L.matrix("lm_head.weight", c.vocab_size, H);
  m->final_norm_ = L.vec("model.norm.weight", H);
  m->layers_.resize(size_t(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights& lw = m->layers_[size_t(i)];
    lw.attn_norm = L.vec(p + "input_layernorm.weight", H);
    lw.mlp_norm = L.vec(p + "post_attention_layernorm.weight", H);
    lw.wq = L.matrix(p + "self_attn.q_proj.weight", c.q_dim(), H);
    lw.wk = L.matrix(p + "self_attn.k_proj.weight", c.kv_dim(), H);
    lw.wv = L.matrix(p + "self_attn.v_proj.weight", c.kv_dim(), H);
    lw.wo = L.matrix(p + "self_attn.o_proj.weight", H, c.q_dim());
    if (c.qkv_bias) {
      lw.bq = L.vec(p + "self_attn.q_proj.bias", c.q_dim());
      lw.bk = L.vec(p + "self_attn.k_proj.bias", c.kv_dim());
      lw.bv = L.vec(p + "self_attn.v_proj.bias", c.kv_dim());
    }
    if (c.o_bias) lw.bo = L.vec(p + "self_attn.o_proj.bias", H);
    lw.w_gate = L.matrix(p + "mlp.gate_proj.weight", I, H);
    lw.w_up = L.matrix(p + "mlp.up_proj.weight", I, H);
    lw.w_down = L.matrix(p + "mlp.down_proj.weight", H, I);
    if (c.mlp_bias) {
      lw.b_gate = L.vec(p + "mlp.gate_proj.bias", I);
      lw.b_up = L.vec(p + "mlp.up_proj.bias", I);
      lw.b_down = L.vec(p + "mlp.down_proj.bias", H);
    }
  }
  m->inv_freq_ = rope_inv_freq(c.rope, c.head_dim);
  return m;
}

KVShape Model::kv_shape() const {
  return KVShape{cfg_.n_layers, cfg_.n_kv_heads, cfg_.head_dim, inv_freq_, cfg_.layer_windows()};
}

size_t Model::weight_bytes() const {
  size_t n = 0;
  for (const auto& f : files_.files()) n += f->size();
  return n;
}

namespace {
const float* bias_or_null(const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); }

void ensure(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}
}  // namespace

void Model::forward(std::span<const int32_t> tokens, int64_t pos0, KVCache& cache, ForwardState& st, float* logits,
                    bool all_logits, ThreadPool& pool) const {
  const ModelConfig& c = cfg_;
  const int T = int(tokens.size());
  const int H = c.hidden_size, I = c.intermediate_size, D = c.head_dim, half = D / 2;
  PTLLM_CHECK(T > 0);
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
    ensure(st.cos, t * size_t(half));
    ensure(st.sin, t * size_t(half));
    st.capacity = T;
  }

  // Embeddings: x[t] = E[token[t]]
  for (int t = 0; t < T; ++t) {
    const int32_t id = tokens[size_t(t)];
    if (id < 0 || id >= c.vocab_size)
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary (" + std::to_string(c.vocab_size) + ")");
    weight_row(embed_, id, st.x.data() + size_t(t) * size_t(H));
  }
  // RoPE tables for the T positions, shared by every layer (unless the cache rotates at read).
  for (int t = 0; t < T; ++t)
    rope_cos_sin(inv_freq_.data(), half, pos0 + t, st.cos.data() + size_t(t) * size_t(half),
                 st.sin.data() + size_t(t) * size_t(half));

  for (int li = 0; li < c.n_layers; ++li) {
    const LayerWeights& L = layers_[size_t(li)];
    // Attention block: xn = norm(x); q, k, v projections; RoPE; cache; attention; x += o_proj(att)
    for (int t = 0; t < T; ++t)
      rmsnorm(st.x.data() + size_t(t) * size_t(H), L.attn_norm.data(), st.xn.data() + size_t(t) * size_t(H), H,
              c.rms_norm_eps);
    matmul(st.xn.data(), T, L.wq, bias_or_null(L.bq), st.q.data(), pool);
    matmul(st.xn.data(), T, L.wk, bias_or_null(L.bk), st.k.data(), pool);
    matmul(st.xn.data(), T, L.wv, bias_or_null(L.bv), st.v.data(), pool);
    for (int t = 0; t < T && !cache.rotates_at_read(); ++t) {
      const float* cs = st.cos.data() + size_t(t) * size_t(half);
      const float* sn = st.sin.data() + size_t(t) * size_t(half);
      rope_rotate(st.q.data() + size_t(t) * size_t(c.q_dim()), c.n_heads, D, cs, sn);
      rope_rotate(st.k.data() + size_t(t) * size_t(c.kv_dim()), c.n_kv_heads, D, cs, sn);
    }
    cache.append(li, st.k.data(), st.v.data(), T);
    cache.attend(li, st.q.data(), T, c.n_heads, st.att.data(), pool);
    matmul(st.att.data(), T, L.wo, bias_or_null(L.bo), st.xn.data(), pool);
    for (size_t i = 0; i < size_t(T) * size_t(H); ++i) st.x[i] += st.xn[i];

    // MLP block: x += down(silu(gate(norm(x))) * up(norm(x)))
    for (int t = 0; t < T; ++t)
      rmsnorm(st.x.data() + size_t(t) * size_t(H), L.mlp_norm.data(), st.xn.data() + size_t(t) * size_t(H), H,
              c.rms_norm_eps);
    matmul(st.xn.data(), T, L.w_gate, bias_or_null(L.b_gate), st.gate.data(), pool);
    matmul(st.xn.data(), T, L.w_up, bias_or_null(L.b_up), st.up.data(), pool);
    silu_mul(st.gate.data(), st.up.data(), T * I);
    matmul(st.gate.data(), T, L.w_down, bias_or_null(L.b_down), st.xn.data(), pool);
    for (size_t i = 0; i < size_t(T) * size_t(H); ++i) st.x[i] += st.xn[i];
  }

  // Final norm and LM head, for every position or the last one only (none when logits is null).
  if (!logits) return;
  const int first = all_logits ? 0 : T - 1;
  const int n_out = T - first;
  for (int t = first; t < T; ++t)
    rmsnorm(st.x.data() + size_t(t) * size_t(H), final_norm_.data(), st.xn.data() + size_t(t - first) * size_t(H), H,
            c.rms_norm_eps);
  matmul(st.xn.data(), n_out, lm_head_, nullptr, logits, pool);
}

}  // namespace ptllm
