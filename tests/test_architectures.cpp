// The architectures beyond Llama / Mistral / Qwen2: config.json as transformers reads it, and the
// forward pass's pieces checked by properties that hold exactly (the goldens against transformers are
// test_golden.cpp's). Fixtures are kjv-tiny's weights rewritten under another architecture.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <numbers>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/session.h"
#include "model/gguf_writer.h"
#include "test_util.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::RawTensor;

json kjv_config() { return test::read_json(test::repo_model("kjv-tiny") / "config.json"); }

ModelConfig parse(const json& j) { return ModelConfig::from_json(j, "config.json"); }

std::string parse_error(const json& j) {
  try {
    parse(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

RawTensor* find(std::vector<RawTensor>& ts, const std::string& name) {
  for (RawTensor& t : ts)
    if (t.name == name) return &t;
  return nullptr;
}

// Multiplies rows [r0, r0 + n) of an F32 matrix by s.
void scale_rows(RawTensor& t, int64_t r0, int64_t n, float s) {
  ASSERT_EQ(t.dtype, "F32");
  const int64_t cols = t.shape[1];
  float* p = reinterpret_cast<float*>(t.bytes.data());
  for (int64_t i = r0 * cols; i < (r0 + n) * cols; ++i) p[i] *= s;
}

void write_model(const fs::path& dir, const json& cfg, const std::vector<RawTensor>& tensors) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << cfg.dump(1);
  test::write_safetensors(dir / "model.safetensors", tensors);
}

std::vector<float> logits_of(const Model& m, const std::vector<int32_t>& ids, bool token_by_token = false) {
  ThreadPool pool(2);
  SessionOptions o;
  o.kv.ctx_size = 256;
  Session s(m, o, pool);
  if (!token_by_token) {
    auto l = s.feed_all(ids);
    return {l.begin(), l.end()};
  }
  std::vector<float> all;
  for (int32_t id : ids) {
    auto l = s.feed({&id, 1});
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double scale = 0, d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    scale = std::max(scale, double(std::fabs(b[i])));
    d = std::max(d, double(std::fabs(a[i] - b[i])));
  }
  return d / std::max(scale, 1e-30);
}

const std::vector<int32_t> kIds = {0, 312, 45, 1001, 7, 88, 2900, 15, 640, 77, 5, 4000};

// ---- Qwen3 ----

json qwen3_config() {
  json j = kjv_config();
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = "qwen3";
  j.erase("mlp_bias");
  j.erase("pretraining_tp");
  return j;
}

TEST(Qwen3Test, ConfigAsTransformersReadsIt) {
  json j = qwen3_config();
  ModelConfig c = parse(j);
  EXPECT_EQ(c.arch, Architecture::Qwen3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.sliding_window, 0);

  j.erase("head_dim");  // Qwen3Config's default is 128, not hidden / heads (32)
  EXPECT_EQ(parse(j).head_dim, 128);

  j = qwen3_config();
  j["attention_bias"] = true;  // q, k, v and o alike
  c = parse(j);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);

  // sliding_window counts only with use_sliding_window; layers from max_window_layers on slide
  j = qwen3_config();
  j["sliding_window"] = 64;
  EXPECT_EQ(parse(j).sliding_window, 0);
  j["use_sliding_window"] = true;
  j["max_window_layers"] = 2;
  c = parse(j);
  EXPECT_EQ(c.layer_windows(), (std::vector<int>{0, 0, 64, 64}));
  j["layer_types"] = {"sliding_attention", "full_attention", "full_attention", "full_attention"};
  EXPECT_EQ(parse(j).layer_windows(), (std::vector<int>{64, 0, 0, 0}));

  j = qwen3_config();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  EXPECT_NE(parse_error(j).find("'yarn' is not supported"), std::string::npos) << parse_error(j);
}

// kjv-tiny's weights with q_norm / k_norm gains added (not all ones, so that a missing or misplaced
// gain shows).
std::vector<RawTensor> qwen3_tensors() {
  std::vector<RawTensor> ts = test::read_raw(test::repo_model("kjv-tiny") / "model.safetensors");
  for (int l = 0; l < 4; ++l)
    for (const char* n : {"q_norm", "k_norm"}) {
      std::vector<float> g(32);
      for (int d = 0; d < 32; ++d) g[size_t(d)] = 0.6f + 0.05f * float((d * 7 + l) % 13);
      ts.push_back({"model.layers." + std::to_string(l) + ".self_attn." + n + ".weight", "F32", {32}, f32_bytes(g)});
    }
  return ts;
}

// RMSNorm over each head makes the output independent of each head's scale: q and k heads scaled by
// different factors give the same logits (a norm over the whole projection, or none, would not).
TEST(Qwen3Test, QkNormIsPerHeadAndBeforeTheCache) {
  test::TempDir tmp;
  std::vector<RawTensor> ts = qwen3_tensors();
  write_model(tmp.path / "a", qwen3_config(), ts);
  for (int l = 0; l < 4; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    for (int h = 0; h < 4; ++h) scale_rows(*find(ts, p + "q_proj.weight"), h * 32, 32, 0.25f + float(h));
    for (int g = 0; g < 2; ++g) scale_rows(*find(ts, p + "k_proj.weight"), g * 32, 32, 3.0f - 1.5f * float(g));
  }
  write_model(tmp.path / "b", qwen3_config(), ts);
  auto a = Model::load(tmp.path / "a");
  auto b = Model::load(tmp.path / "b");
  auto llama = Model::load(test::repo_model("kjv-tiny"));
  const std::vector<float> la = logits_of(*a, kIds);
  EXPECT_LT(max_rel_diff(logits_of(*b, kIds), la), 1e-4);
  EXPECT_GT(max_rel_diff(logits_of(*llama, kIds), la), 1e-2);  // the norms do change the model
  // through the cache one token at a time: the same (k normalized before it is stored)
  std::vector<float> stepped = logits_of(*b, kIds, true);
  const size_t V = size_t(a->config().vocab_size);
  EXPECT_LT(max_rel_diff(std::vector<float>(stepped.end() - long(V), stepped.end()),
                         std::vector<float>(la.end() - long(V), la.end())),
            1e-4);
}

TEST(Qwen3Test, MissingNormNamesTheTensor) {
  test::TempDir tmp;
  std::vector<RawTensor> ts = qwen3_tensors();
  ts.erase(std::remove_if(ts.begin(), ts.end(), [](const RawTensor& t) { return t.name == "model.layers.2.self_attn.k_norm.weight"; }),
           ts.end());
  write_model(tmp.path, qwen3_config(), ts);
  try {
    Model::load(tmp.path);
    FAIL() << "loaded without k_norm";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2.self_attn.k_norm.weight"), std::string::npos) << e.what();
  }
}

// ---- A reference forward pass ----
// transformers' math written out plainly in double precision (no KV cache, no reordered dims, no
// folded scales), from config.json as ModelConfig reads it and the checkpoint's tensors by their
// transformers names: what the engine's tricks (partial rotary as a permutation with zero
// frequencies, LongRoPE's factor folded into q and k, per-layer RoPE tables in the cache, the
// attention scale on q) must reproduce.
struct Reference {
  ModelConfig c;
  std::map<std::string, std::vector<float>> w;

  explicit Reference(const fs::path& dir) : c(ModelConfig::load(dir / "config.json")) {
    SafetensorsFile f(dir / "model.safetensors");
    for (const auto& [name, t] : f.tensors()) w[name] = test::tensor_values<float>(f, name);
  }
  const std::vector<float>& t(const std::string& n) const {
    auto it = w.find(n);
    if (it == w.end()) throw std::runtime_error("reference: no tensor " + n);
    return it->second;
  }
  std::vector<double> rms(const std::vector<double>& x, const std::vector<float>& g, size_t off, size_t n) const {
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
    const double inv = 1.0 / std::sqrt(ss / double(n) + double(c.rms_norm_eps));
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = x[off + i] * inv * (c.norm_plus_one ? 1.0 + g[i] : double(g[i]));
    return out;
  }
  // y = W[r0 .. r0 + rows) x
  static std::vector<double> mv(const std::vector<float>& W, size_t r0, size_t rows, const std::vector<double>& x) {
    std::vector<double> y(rows);
    for (size_t r = 0; r < rows; ++r) {
      double a = 0;
      for (size_t k = 0; k < x.size(); ++k) a += double(W[(r0 + r) * x.size() + k]) * x[k];
      y[r] = a;
    }
    return y;
  }
  std::vector<double> inv_freq(const RopeConfig& rp, bool long_f) const {
    const int R = c.rotated_dims();
    std::vector<double> f(size_t(R / 2));
    for (int i = 0; i < R / 2; ++i) {
      double v = 1.0 / std::pow(rp.theta, double(2 * i) / double(R));
      if (rp.type == RopeType::Linear) v /= rp.factor;
      if (rp.type == RopeType::LongRope) v /= (long_f ? rp.long_factor : rp.short_factor)[size_t(i)];
      f[size_t(i)] = v;
    }
    return f;
  }
  // rotate_half on the first R dims of one head, cos/sin scaled by m
  void rope(double* x, int64_t pos, const std::vector<double>& f, double m) const {
    const int R = c.rotated_dims();
    for (int i = 0; i < R / 2; ++i) {
      const double a = x[i], b = x[i + R / 2], ang = double(pos) * f[size_t(i)];
      x[i] = (a * std::cos(ang) - b * std::sin(ang)) * m;
      x[i + R / 2] = (b * std::cos(ang) + a * std::sin(ang)) * m;
    }
  }
  // Logits [T][V] of ids; long_from: tokens at positions >= long_from use LongRoPE's long factors
  // (transformers: per forward call, the whole call when it reaches past the original length).
  std::vector<double> logits(const std::vector<int32_t>& ids, int64_t long_from) const {
    const size_t T = ids.size(), H = size_t(c.hidden_size), D = size_t(c.head_dim), NH = size_t(c.n_heads),
                 NK = size_t(c.n_kv_heads), I = size_t(c.intermediate_size), V = size_t(c.vocab_size);
    const bool mm = w.count("language_model.model.embed_tokens.weight") > 0;
    const std::string b = mm ? "language_model.model." : "model.";
    std::vector<double> x(T * H);
    for (size_t r = 0; r < T; ++r)
      for (size_t i = 0; i < H; ++i) x[r * H + i] = double(t(b + "embed_tokens.weight")[size_t(ids[r]) * H + i]) * c.embed_scale;
    const double m = c.rope.type == RopeType::LongRope ? c.rope.attention_factor : 1.0;
    const double scale = 1.0 / std::sqrt(c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(D));
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = b + "layers." + std::to_string(l) + ".";
      std::vector<double> q(T * NH * D), k(T * NK * D), v(T * NK * D);
      for (size_t r = 0; r < T; ++r) {
        const auto h = rms(x, t(p + "input_layernorm.weight"), r * H, H);
        std::vector<double> qr, kr, vr;
        if (c.fused_qkv) {
          qr = mv(t(p + "self_attn.qkv_proj.weight"), 0, NH * D, h);
          kr = mv(t(p + "self_attn.qkv_proj.weight"), NH * D, NK * D, h);
          vr = mv(t(p + "self_attn.qkv_proj.weight"), NH * D + NK * D, NK * D, h);
        } else {
          qr = mv(t(p + "self_attn.q_proj.weight"), 0, NH * D, h);
          kr = mv(t(p + "self_attn.k_proj.weight"), 0, NK * D, h);
          vr = mv(t(p + "self_attn.v_proj.weight"), 0, NK * D, h);
        }
        if (c.qk_norm) {
          for (size_t hd = 0; hd < NH; ++hd) {
            auto n = rms(qr, t(p + "self_attn.q_norm.weight"), hd * D, D);
            std::copy(n.begin(), n.end(), qr.begin() + long(hd * D));
          }
          for (size_t hd = 0; hd < NK; ++hd) {
            auto n = rms(kr, t(p + "self_attn.k_norm.weight"), hd * D, D);
            std::copy(n.begin(), n.end(), kr.begin() + long(hd * D));
          }
        }
        const LayerRope lr = c.rope_of(l);
        if (lr != LayerRope::None) {
          const bool lg = int64_t(r) >= long_from;
          const auto f = inv_freq(lr == LayerRope::Local ? c.rope_local : c.rope, lg);
          for (size_t hd = 0; hd < NH; ++hd) rope(qr.data() + hd * D, int64_t(r), f, m);
          for (size_t hd = 0; hd < NK; ++hd) rope(kr.data() + hd * D, int64_t(r), f, m);
        }
        std::copy(qr.begin(), qr.end(), q.begin() + long(r * NH * D));
        std::copy(kr.begin(), kr.end(), k.begin() + long(r * NK * D));
        std::copy(vr.begin(), vr.end(), v.begin() + long(r * NK * D));
      }
      const int W = c.layer_windows()[size_t(l)];
      std::vector<double> att(T * NH * D, 0.0);
      for (size_t r = 0; r < T; ++r)
        for (size_t hd = 0; hd < NH; ++hd) {
          const size_t g = hd / (NH / NK);
          std::vector<double> sc(r + 1, -1e300);
          double mx = -1e300;
          for (size_t j = 0; j <= r; ++j) {
            if (W > 0 && int64_t(r) - int64_t(j) >= W) continue;
            double a = 0;
            for (size_t d = 0; d < D; ++d) a += q[(r * NH + hd) * D + d] * k[(j * NK + g) * D + d];
            sc[j] = a * scale;
            mx = std::max(mx, sc[j]);
          }
          double z = 0;
          for (size_t j = 0; j <= r; ++j) z += sc[j] > -1e299 ? std::exp(sc[j] - mx) : 0.0;
          for (size_t j = 0; j <= r; ++j) {
            if (sc[j] < -1e299) continue;
            const double pj = std::exp(sc[j] - mx) / z;
            for (size_t d = 0; d < D; ++d) att[(r * NH + hd) * D + d] += pj * v[(j * NK + g) * D + d];
          }
        }
      for (size_t r = 0; r < T; ++r) {
        std::vector<double> a(att.begin() + long(r * NH * D), att.begin() + long((r + 1) * NH * D));
        auto o = mv(t(p + "self_attn.o_proj.weight"), 0, H, a);
        if (c.sandwich_norms) o = rms(o, t(p + "post_attention_layernorm.weight"), 0, H);
        for (size_t i = 0; i < H; ++i) x[r * H + i] += o[i];
        const auto h = rms(x, t(p + (c.sandwich_norms ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight")), r * H, H);
        std::vector<double> gt, up;
        if (c.fused_gate_up) {
          gt = mv(t(p + "mlp.gate_up_proj.weight"), 0, I, h);
          up = mv(t(p + "mlp.gate_up_proj.weight"), I, I, h);
        } else {
          gt = mv(t(p + "mlp.gate_proj.weight"), 0, I, h);
          up = mv(t(p + "mlp.up_proj.weight"), 0, I, h);
        }
        for (size_t i = 0; i < I; ++i) {
          const double z = gt[i];
          const double act = c.activation == Activation::GeluTanh
                                 ? 0.5 * z * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (z + 0.044715 * z * z * z)))
                                 : z / (1 + std::exp(-z));
          gt[i] = act * up[i];
        }
        auto d = mv(t(p + "mlp.down_proj.weight"), 0, H, gt);
        if (c.sandwich_norms) d = rms(d, t(p + "post_feedforward_layernorm.weight"), 0, H);
        for (size_t i = 0; i < H; ++i) x[r * H + i] += d[i];
      }
    }
    std::vector<double> out(T * V);
    const std::string head = w.count("lm_head.weight") ? "lm_head.weight" : b + "embed_tokens.weight";
    for (size_t r = 0; r < T; ++r) {
      const auto h = rms(x, t(b + "norm.weight"), r * H, H);
      const auto lg = mv(t(head), 0, V, h);
      for (size_t i = 0; i < V; ++i)
        out[r * V + i] = c.final_logit_softcapping > 0 ? c.final_logit_softcapping * std::tanh(lg[i] / c.final_logit_softcapping) : lg[i];
    }
    return out;
  }
};

// A random model (weights N(0, 0.2)-ish from a fixed seed, norms near 1 or near 0 for (1 + w)) of a
// config, in float32.
void random_model(const fs::path& dir, const json& cfg, const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
                  bool norm_plus_one) {
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return double((state >> 11) & ((1ull << 53) - 1)) / double(1ull << 53);
  };
  std::vector<RawTensor> ts;
  for (const auto& [name, shape] : shapes) {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    std::vector<float> v(n);
    const bool is_norm = name.find("norm") != std::string::npos;
    for (float& x : v)
      x = is_norm ? float((norm_plus_one ? 0.0 : 1.0) + 0.3 * (next() - 0.5)) : float(0.7 * (next() - 0.5));
    ts.push_back({name, "F32", shape, f32_bytes(v)});
  }
  write_model(dir, cfg, ts);
}

struct ArchCase {
  std::string name;
  json cfg;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  int64_t long_from_one_call;  // LongRoPE: the whole call long when it passes the original length
  int64_t long_from_stepped;
};

void PrintTo(const ArchCase& c, std::ostream* os) { *os << c.name; }

constexpr int kV = 8192, kH = 32, kI = 48, kLayers = 4;

std::vector<std::pair<std::string, std::vector<int64_t>>> shapes_for(const std::string& body, int heads, int kv, int hd,
                                                                     bool fused, bool qk_norm, bool sandwich, bool tied) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> s;
  s.push_back({body + "embed_tokens.weight", {kV, kH}});
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = body + "layers." + std::to_string(l) + ".";
    s.push_back({p + "input_layernorm.weight", {kH}});
    if (fused) {
      s.push_back({p + "self_attn.qkv_proj.weight", {heads * hd + 2 * kv * hd, kH}});
      s.push_back({p + "mlp.gate_up_proj.weight", {2 * kI, kH}});
    } else {
      s.push_back({p + "self_attn.q_proj.weight", {heads * hd, kH}});
      s.push_back({p + "self_attn.k_proj.weight", {kv * hd, kH}});
      s.push_back({p + "self_attn.v_proj.weight", {kv * hd, kH}});
      s.push_back({p + "mlp.gate_proj.weight", {kI, kH}});
      s.push_back({p + "mlp.up_proj.weight", {kI, kH}});
    }
    s.push_back({p + "self_attn.o_proj.weight", {kH, heads * hd}});
    s.push_back({p + "mlp.down_proj.weight", {kH, kI}});
    s.push_back({p + "post_attention_layernorm.weight", {kH}});
    if (sandwich) {
      s.push_back({p + "pre_feedforward_layernorm.weight", {kH}});
      s.push_back({p + "post_feedforward_layernorm.weight", {kH}});
    }
    if (qk_norm) {
      s.push_back({p + "self_attn.q_norm.weight", {hd}});
      s.push_back({p + "self_attn.k_norm.weight", {hd}});
    }
  }
  s.push_back({body + "norm.weight", {kH}});
  if (!tied) s.push_back({"lm_head.weight", {kV, kH}});
  return s;
}

json base_cfg(const char* arch) {
  return json{{"architectures", {arch}}, {"vocab_size", kV}, {"hidden_size", kH}, {"intermediate_size", kI},
              {"num_hidden_layers", kLayers}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
              {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 256}, {"bos_token_id", 0}, {"eos_token_id", 1}};
}

std::vector<ArchCase> arch_cases() {
  std::vector<ArchCase> cases;
  {  // Qwen3: explicit head_dim 16 (hidden / heads = 8), q/k norms
    json j = base_cfg("Qwen3ForCausalLM");
    j["head_dim"] = 16;
    j["rope_theta"] = 1000000.0;
    j["tie_word_embeddings"] = true;
    cases.push_back({"qwen3", j, shapes_for("model.", 4, 2, 16, false, true, false, true), 1 << 30, 1 << 30});
  }
  {  // Gemma 3 (5.x spelling): local / global layers, window 8, two RoPE bases, linear scaling on
     // global, query_pre_attn_scalar != head_dim, soft-capping
    json j = base_cfg("Gemma3ForCausalLM");
    j["head_dim"] = 16;
    j["query_pre_attn_scalar"] = 12;
    j["sliding_window"] = 8;
    j["layer_types"] = {"sliding_attention", "sliding_attention", "full_attention", "sliding_attention"};
    j["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1000000.0}}},
                            {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
    j["final_logit_softcapping"] = 3.0;
    j["hidden_activation"] = "gelu_pytorch_tanh";
    cases.push_back({"gemma3", j, shapes_for("model.", 4, 2, 16, false, true, true, true), 1 << 30, 1 << 30});
  }
  {  // Gemma 3 multimodal checkpoint (4.x spelling: rope_theta, rope_local_base_freq, rope_scaling,
     // sliding_window_pattern): the text part under language_model.
    json t = base_cfg("Gemma3ForCausalLM");
    t.erase("architectures");
    t["head_dim"] = 16;
    t["query_pre_attn_scalar"] = 16;
    t["sliding_window"] = 6;
    t["sliding_window_pattern"] = 2;
    t["rope_theta"] = 500000.0;
    t["rope_local_base_freq"] = 20000.0;
    t["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
    json j = {{"architectures", {"Gemma3ForConditionalGeneration"}}, {"text_config", t},
              {"vision_config", {{"hidden_size", 8}}}, {"eos_token_id", 1}};
    cases.push_back({"gemma3mm", j, shapes_for("language_model.model.", 4, 2, 16, false, true, true, true), 1 << 30, 1 << 30});
  }
  {  // Phi-3: fused projections, partial rotary 0.75 of head_dim 8, LongRoPE with original 16
    json j = base_cfg("Phi3ForCausalLM");
    j["partial_rotary_factor"] = 0.75;
    j["original_max_position_embeddings"] = 16;
    j["rope_theta"] = 10000.0;
    j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0, 1.3, 2.0}}, {"long_factor", {1.5, 4.0, 9.0}}};
    j["tie_word_embeddings"] = false;
    j["sliding_window"] = nullptr;
    cases.push_back({"phi3", j, shapes_for("model.", 4, 2, 8, true, false, false, false), 0, 16});
  }
  {  // SmolLM3: layers 1 and 3 without RoPE
    json j = base_cfg("SmolLM3ForCausalLM");
    j["no_rope_layers"] = {1, 0, 1, 0};
    j["rope_theta"] = 2000000.0;
    j["tie_word_embeddings"] = true;
    cases.push_back({"smollm3", j, shapes_for("model.", 4, 2, 8, false, false, false, true), 1 << 30, 1 << 30});
  }
  return cases;
}

class ArchReferenceTest : public ::testing::TestWithParam<ArchCase> {};

// Every row's logits against the reference: one call (prefill), token by token through the KV cache,
// and with a cache that rotates at read (pos=cache) where RoPE does not switch tables.
TEST_P(ArchReferenceTest, LogitsMatchTheReference) {
  const ArchCase& ac = GetParam();
  test::TempDir tmp;
  random_model(tmp.path, ac.cfg, ac.shapes, ac.cfg.dump().find("Gemma3") != std::string::npos);
  const Reference ref(tmp.path);
  auto m = Model::load(tmp.path);
  std::vector<int32_t> ids;
  for (int i = 0; i < 28; ++i) ids.push_back(int32_t((i * 37 + 5) % kV));
  const size_t V = kV;
  auto check = [&](const std::vector<float>& got, const std::vector<double>& want, const char* how) {
    ASSERT_EQ(got.size(), want.size()) << how;
    double scale = 0, d = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      scale = std::max(scale, std::fabs(want[i]));
      d = std::max(d, std::fabs(double(got[i]) - want[i]));
    }
    EXPECT_LT(d / scale, 1e-4) << ac.name << " " << how << ": max difference " << d << " of " << scale;
  };
  ThreadPool pool(2);
  for (PositionMode pm : {PositionMode::Absolute, PositionMode::Cache}) {
    if (pm == PositionMode::Cache && ac.long_from_stepped < (1 << 30)) continue;  // see the LongRoPE test
    SessionOptions o;
    o.kv.ctx_size = 64;
    o.kv.positions = pm;
    Session one(*m, o, pool);
    auto l = one.feed_all(ids);
    check({l.begin(), l.end()}, ref.logits(ids, ac.long_from_one_call), pm == PositionMode::Cache ? "one call, pos=cache" : "one call");
    Session stepped(*m, o, pool);
    std::vector<float> all;
    for (int32_t id : ids) {
      auto s = stepped.feed({&id, 1});
      all.insert(all.end(), s.begin(), s.end());
    }
    check(all, ref.logits(ids, ac.long_from_stepped), pm == PositionMode::Cache ? "stepped, pos=cache" : "stepped");
  }
  (void)V;
}

INSTANTIATE_TEST_SUITE_P(Archs, ArchReferenceTest, ::testing::ValuesIn(arch_cases()),
                         [](const auto& info) { return info.param.name; });

// `quantize --format gguf` of each architecture (F32: the same numbers) loads back as the same model:
// the GGUF names, keys and conventions (Gemma's norms with their 1, Phi-3's fused tensors and rope
// factors) round-trip. What llama.cpp's GGUF cannot say is refused by name.
TEST(ArchGgufTest, WrittenGgufGivesTheSameLogits) {
  for (ArchCase ac : arch_cases()) {
    if (ac.name == "gemma3mm") continue;  // the same text model as gemma3, under other names
    SCOPED_TRACE(ac.name);
    test::TempDir tmp;
    if (ac.name == "gemma3") ac.cfg["query_pre_attn_scalar"] = 12;
    random_model(tmp.path, ac.cfg, ac.shapes, ac.name == "gemma3");
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(test::repo_model("kjv-tiny") / f, tmp.path / f);
    const fs::path out = tmp.path / "m.gguf";
    if (ac.name == "gemma3") {
      try {
        write_gguf_from_hf(tmp.path, out, GgufMix::F32);
        FAIL() << "query_pre_attn_scalar 12 written";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("query_pre_attn_scalar"), std::string::npos) << e.what();
      }
      ac.cfg["query_pre_attn_scalar"] = 16;  // head_dim: what GGUF gemma3 means
      std::ofstream(tmp.path / "config.json") << ac.cfg.dump(1);
    }
    if (ac.name == "smollm3") {
      try {
        write_gguf_from_hf(tmp.path, out, GgufMix::F32);
        FAIL() << "no_rope_layers [1, 0, 1, 0] written";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("no_rope_layers"), std::string::npos) << e.what();
      }
      ac.cfg["no_rope_layers"] = {1, 1, 1, 0};  // llama.cpp's every 4th layer
      std::ofstream(tmp.path / "config.json") << ac.cfg.dump(1);
    }
    write_gguf_from_hf(tmp.path, out, GgufMix::F32);
    auto st = Model::load(tmp.path);
    auto gg = Model::load(out);
    EXPECT_EQ(gg->config().arch, st->config().arch);
    EXPECT_EQ(gg->config().layer_windows(), st->config().layer_windows());
    std::vector<int32_t> ids;
    for (int i = 0; i < 28; ++i) ids.push_back(int32_t((i * 37 + 5) % kV));
    EXPECT_LT(max_rel_diff(logits_of(*gg, ids), logits_of(*st, ids)), 1e-5);
    EXPECT_LT(max_rel_diff(logits_of(*gg, ids, true), logits_of(*st, ids, true)), 1e-5);
  }
}

}  // namespace
}  // namespace ptllm
