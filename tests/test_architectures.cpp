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
#include "model/quantize.h"
#include "test_greedy.h"
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
    for (const auto& [name, t] : f.tensors()) {
      std::vector<float>& v = w[name];
      v.resize(t.nbytes / dtype_size(t.dtype));
      convert_to_f32(t.dtype, t.data, v.data(), v.size());  // bf16 checkpoints widened, as transformers does
    }
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
          const size_t last = r;
          std::vector<double> sc(last + 1, -1e300);
          double mx = -1e300;
          for (size_t j = 0; j <= last; ++j) {
            if (W > 0 && int64_t(r) - int64_t(j) >= W) continue;
            double a = 0;
            for (size_t d = 0; d < D; ++d) a += q[(r * NH + hd) * D + d] * k[(j * NK + g) * D + d];
            sc[j] = a * scale;
            mx = std::max(mx, sc[j]);
          }
          double z = 0;
          for (size_t j = 0; j <= last; ++j) z += sc[j] > -1e299 ? std::exp(sc[j] - mx) : 0.0;
          for (size_t j = 0; j <= last; ++j) {
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


namespace ptllm {
namespace {

fs::path arch_model(const std::string& name) { return test::repo_dir() / "tests" / "data" / "models" / name; }

// Greedy ids of every golden prompt, and the teacher-forced mean NLL.
void expect_arch_goldens(const Model& m, const fs::path& golden_dir, const std::string& what) {
  auto golden = test::read_json(golden_dir / "golden.json");
  ThreadPool pool(2);
  SessionOptions o;
  o.kv.ctx_size = 512;
  for (const auto& p : golden["prompts"]) {
    auto ids = p["ids"].get<std::vector<int32_t>>();
    auto want = p["greedy_ids"].get<std::vector<int32_t>>();
    Session s(m, o, pool);
    std::span<float> l = s.feed(ids);
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      got.push_back(int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
      if (i + 1 < want.size()) l = s.feed({&got.back(), 1});
    }
    EXPECT_EQ(got, want) << what << ": " << p["text"];
  }
  auto tf = golden["teacher_forced"]["ids"].get<std::vector<int32_t>>();
  Session s(m, o, pool);
  std::span<float> l = s.feed_all(tf);
  const size_t V = size_t(m.config().vocab_size);
  double sum = 0;
  for (size_t t = 0; t + 1 < tf.size(); ++t) {
    const float* row = l.data() + t * V;
    const float mx = *std::max_element(row, row + V);
    double z = 0;
    for (size_t i = 0; i < V; ++i) z += std::exp(double(row[i]) - mx);
    sum += std::log(z) + mx - row[tf[t + 1]];
  }
  EXPECT_NEAR(sum / double(tf.size() - 1), golden["teacher_forced"]["mean_nll"].get<double>(), 1e-4) << what;
}

// llama.cpp's converter's files (bf16, the checkpoints' own weights) and this runtime's writer (F32):
// transformers' greedy ids and NLL, for the architectures whose tiny model GGUF can describe.
TEST(ArchGgufGoldens, GgufFilesGiveTheGoldens) {
  for (const std::string name : {"qwen3-tiny", "phi3-tiny"}) {
    const fs::path dir = arch_model(name), f = arch_model("gguf") / (name + "-BF16.gguf");
    if (!fs::exists(f)) GTEST_SKIP() << f << " not found";
    expect_arch_goldens(*Model::load(f), dir, f.filename().string());
    test::TempDir tmp;
    write_gguf_from_hf(dir, tmp.path / "m.gguf", GgufMix::F32);
    expect_arch_goldens(*Model::load(tmp.path / "m.gguf"), dir, name + " written F32");
  }
}

// gemma3-tiny and smollm3-tiny use layouts llama.cpp's GGUF does not record (layer_types
// S,S,F,S; query_pre_attn_scalar 24 with head_dim 32; no RoPE in layers 1 and 3): their converted
// files are read as llama.cpp reads them (every layer of four sliding by its default period of 6,
// the attention scale 1/sqrt(head_dim); every 4th layer without RoPE), and the writer refuses them.
TEST(ArchGgufGoldens, LayoutsGgufCannotSayReadAsLlamaCppDoes) {
  const fs::path g = arch_model("gguf") / "gemma3-tiny-BF16.gguf", s = arch_model("gguf") / "smollm3-tiny-BF16.gguf";
  if (!fs::exists(g) || !fs::exists(s)) GTEST_SKIP() << "the converted files are not in tests/data/models/gguf";
  const ModelConfig gc = Model::load(g)->config();
  EXPECT_EQ(gc.arch, Architecture::Gemma3);
  EXPECT_EQ(gc.layer_windows(), (std::vector<int>{32, 32, 32, 32}));
  EXPECT_EQ(gc.query_pre_attn_scalar, 0);  // 1/sqrt(head_dim)
  EXPECT_FLOAT_EQ(gc.final_logit_softcapping, 30.0f);
  EXPECT_EQ(gc.rope.type, RopeType::Linear);
  EXPECT_DOUBLE_EQ(gc.rope_local.theta, 10000.0);
  const ModelConfig sc = Model::load(s)->config();
  EXPECT_EQ(sc.layer_rope, (std::vector<LayerRope>{LayerRope::Main, LayerRope::Main, LayerRope::Main, LayerRope::None}));
  test::TempDir tmp;
  for (const char* name : {"gemma3-tiny", "smollm3-tiny"}) {
    try {
      write_gguf_from_hf(arch_model(name), tmp.path / "m.gguf", GgufMix::F32);
      ADD_FAILURE() << name << " written";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("query_pre_attn_scalar") != std::string::npos || what.find("no_rope_layers") != std::string::npos)
          << what;
    }
  }
}

}  // namespace
}  // namespace ptllm

namespace ptllm {
namespace {

double mean_nll(std::span<const float> logits, const std::vector<int32_t>& ids, size_t V, size_t from = 0) {
  double sum = 0;
  for (size_t t = from; t + 1 < ids.size(); ++t) {
    const float* row = logits.data() + t * V;
    const float mx = *std::max_element(row, row + V);
    double z = 0;
    for (size_t i = 0; i < V; ++i) z += std::exp(double(row[i]) - mx);
    sum += std::log(z) + mx - row[ids[t + 1]];
  }
  return sum / double(ids.size() - 1 - from);
}

class ArchKvTest : public ::testing::TestWithParam<std::string> {};

// Every KV feature on each newer architecture's trained tiny model: KIVI keeps the teacher-forced
// NLL near the dense one; StreamingLLM (both position modes) runs the 1,024-token sequence in its
// chunks and stays near the dense NLL; sequences sharing a prefix on one pool give exactly what a
// private cache gives (dense) while taking the shared blocks; the prompt's K/V are the same
// whether fed at once or token by token (what speculative verification relies on).
TEST_P(ArchKvTest, KvFeaturesCompose) {
  const fs::path dir = arch_model(GetParam());
  if (!fs::exists(dir / "golden.safetensors")) GTEST_SKIP() << dir << " not found";
  auto m = Model::load(dir);
  const size_t V = size_t(m->config().vocab_size);
  SafetensorsFile g(dir / "golden.safetensors");
  const auto tf = test::tensor_values<int32_t>(g, "tf_ids");
  ThreadPool pool(2);
  SessionOptions base;
  base.kv.ctx_size = 1024;
  double dense_nll;
  {
    Session s(*m, base, pool);
    dense_nll = mean_nll(s.feed_all(tf), tf, V);
  }
  for (auto [prec, tol] : {std::pair{KVPrecision::Int8, 0.01}, std::pair{KVPrecision::Int4, 0.1}}) {
    SessionOptions o = base;
    o.kv.precision = prec;
    o.kv.residual = 32;
    Session s(*m, o, pool);
    std::vector<float> all;
    for (size_t i = 0; i < tf.size(); i += 32) {  // in the chunks KIVI takes
      auto l = s.feed_all(std::span<const int32_t>(tf).subspan(i, std::min<size_t>(32, tf.size() - i)));
      all.insert(all.end(), l.begin(), l.end());
    }
    const double nll = mean_nll(all, tf, V);
    EXPECT_NEAR(nll, dense_nll, tol) << kv_precision_name(prec);
  }
  SafetensorsFile gl(dir / "golden_long.safetensors");
  const auto longs = test::tensor_values<int32_t>(gl, "ids");
  double long_dense;
  {
    Session s(*m, base, pool);
    long_dense = mean_nll(s.feed_all(longs), longs, V);
  }
  for (PositionMode pm : {PositionMode::Absolute, PositionMode::Cache}) {
    SessionOptions o = base;
    o.kv.sink = 4;
    o.kv.window = 252;
    o.kv.positions = pm;
    Session s(*m, o, pool);
    std::vector<float> all;
    for (size_t i = 0; i < longs.size();) {
      const size_t n = std::min<size_t>(size_t(s.max_chunk()), longs.size() - i);
      auto l = s.feed_all(std::span<const int32_t>(longs).subspan(i, n));
      all.insert(all.end(), l.begin(), l.end());
      i += n;
    }
    const double nll = mean_nll(all, longs, V);
    EXPECT_TRUE(std::isfinite(nll));
    // phi3-tiny was trained on 512-token sequences, past its original 256: with its long factors
    // only. StreamingLLM's chunks within the first 256 positions take the short ones (as
    // transformers' would), which it never saw; its bound is wider for that.
    const double bound = GetParam() == "phi3-tiny" ? 1.0 : 0.5;
    EXPECT_LT(nll, long_dense + bound) << position_mode_name(pm);
  }
  {
    KVPool kv(m->kv_shape(), base.kv, 3);
    std::vector<int32_t> first(tf.begin(), tf.begin() + 200), second(tf.begin(), tf.begin() + 150);
    second.insert(second.end(), tf.begin() + 210, tf.begin() + 240);
    Session a(*m, base, pool, &kv);
    test::greedy(a, first, 10);
    Session b(*m, base, pool, &kv);
    const auto shared = b.feed(second);
    EXPECT_GT(b.reused_tokens(), 0);
    Session p(*m, base, pool);
    const auto priv = p.feed(second);
    ASSERT_EQ(shared.size(), priv.size());
    EXPECT_EQ(std::memcmp(shared.data(), priv.data(), priv.size_bytes()), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, ArchKvTest,
                         ::testing::Values("qwen3-tiny", "gemma3-tiny", "phi3-tiny", "smollm3-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace ptllm

namespace ptllm {
namespace {

// MLX-style quantization of each newer architecture (Phi-3's fused qkv_proj / gate_up_proj quantized
// whole, Gemma's (1 + weight) gains as the search's importance), by the search fit and by GPTQ on a
// calibration sequence: every matrix quantized, and the goldens' NLL kept within the bits' error.
TEST_P(ArchKvTest, MlxQuantizedKeepsTheNll) {
  const fs::path dir = arch_model(GetParam());
  if (!fs::exists(dir / "golden.safetensors")) GTEST_SKIP() << dir << " not found";
  SafetensorsFile g(dir / "golden.safetensors");
  const auto tf = test::tensor_values<int32_t>(g, "tf_ids");
  const double golden = test::read_json(dir / "golden.json")["teacher_forced"]["mean_nll"].get<double>();
  ThreadPool pool(2);
  test::TempDir tmp;
  for (auto [bits, method, tol] : {std::tuple{8, QuantMethod::Search, 0.01}, std::tuple{4, QuantMethod::Search, 0.15},
                                   std::tuple{4, QuantMethod::Gptq, 0.15}}) {
    QuantizeOptions o;
    o.spec = AffineSpec{bits, 32};
    o.method = method;
    if (method == QuantMethod::Gptq) o.calibration = {std::vector<int32_t>(tf.begin(), tf.begin() + 128)};
    const fs::path out = tmp.path / (std::to_string(bits) + std::string(quant_method_name(method)));
    const QuantizeReport r = quantize_checkpoint(dir, out, o, pool);
    EXPECT_EQ(r.matrices_dense, 0);
    EXPECT_GT(r.matrices_quantized, 0);
    auto m = Model::load(out);
    EXPECT_EQ(m->weight_format().find(" + "), std::string::npos) << m->weight_format();  // no matrix left dense
    SessionOptions so;
    so.kv.ctx_size = 512;
    Session s(*m, so, pool);
    const double nll = mean_nll(s.feed_all(tf), tf, size_t(m->config().vocab_size));
    EXPECT_NEAR(nll, golden, tol) << GetParam() << " " << bits << " bits " << quant_method_name(method) << " "
                                  << m->weight_format();
  }
}

}  // namespace
}  // namespace ptllm

namespace ptllm {
namespace {

// A Gemma3ForConditionalGeneration checkpoint runs its text model, and what cannot take its
// language_model. tensor names says so: quantize and the GGUF writer refuse it by name.
TEST(Gemma3Multimodal, QuantizeAndGgufRefuseByName) {
  const fs::path dir = arch_model("gemma3mm-tiny");
  if (!fs::exists(dir / "model.safetensors")) GTEST_SKIP() << dir << " not found";
  ThreadPool pool(2);
  test::TempDir tmp;
  try {
    quantize_checkpoint(dir, tmp.path / "q", QuantizeOptions{}, pool);
    ADD_FAILURE() << "quantized";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Gemma3ForConditionalGeneration"), std::string::npos) << e.what();
  }
  try {
    write_gguf_from_hf(dir, tmp.path / "m.gguf", GgufMix::F32);
    ADD_FAILURE() << "written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Gemma3ForConditionalGeneration"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ptllm

namespace ptllm {
namespace {

TEST(ArchConfigTest, Gemma3FieldsAndRefusals) {
  json j = {{"architectures", {"Gemma3ForCausalLM"}}, {"num_hidden_layers", 12}, {"hidden_size", 640},
            {"intermediate_size", 2048}, {"num_attention_heads", 4}, {"num_key_value_heads", 1}};
  ModelConfig c = parse(j);  // Gemma3TextConfig's defaults fill the rest
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_TRUE(c.tie_word_embeddings && c.norm_plus_one && c.sandwich_norms && c.qk_norm);
  EXPECT_EQ(c.activation, Activation::GeluTanh);
  EXPECT_FLOAT_EQ(c.embed_scale, float(std::sqrt(640.0)));
  EXPECT_DOUBLE_EQ(c.query_pre_attn_scalar, 256);
  // sliding_window_pattern 6 (default): every 6th layer global
  std::vector<int> w(12, 4096);
  w[5] = w[11] = 0;
  EXPECT_EQ(c.layer_windows(), w);
  EXPECT_EQ(c.rope_of(5), LayerRope::Main);
  EXPECT_EQ(c.rope_of(0), LayerRope::Local);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rope_local.theta, 1e4);
  for (auto [key, value, named] : {std::tuple{"attn_logit_softcapping", json(50.0), "attn_logit_softcapping"},
                                   std::tuple{"hidden_activation", json("relu"), "hidden_activation"},
                                   std::tuple{"use_bidirectional_attention", json(true), "use_bidirectional_attention"},
                                   std::tuple{"rope_scaling", json{{"rope_type", "yarn"}, {"factor", 2.0}}, "rope_scaling.rope_type"}}) {
    json bad = j;
    bad[key] = value;
    EXPECT_NE(parse_error(bad).find(named), std::string::npos) << parse_error(bad);
  }
  json mm = {{"architectures", {"Gemma3ForConditionalGeneration"}}, {"text_config", j}};
  mm["text_config"]["attn_logit_softcapping"] = 50.0;
  EXPECT_NE(parse_error(mm).find("'text_config.attn_logit_softcapping'"), std::string::npos) << parse_error(mm);
}

TEST(ArchConfigTest, Phi3AndSmolLM3FieldsAndRefusals) {
  json j = base_cfg("Phi3ForCausalLM");
  j["partial_rotary_factor"] = 0.5;  // head_dim 8: 4 rotated dims, 2 factors
  j["original_max_position_embeddings"] = 64;
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0, 2.0}}, {"long_factor", {3.0, 4.0}}};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.rotary_dim, 4);
  EXPECT_TRUE(c.fused_qkv && c.fused_gate_up);
  EXPECT_EQ(c.rope.type, RopeType::LongRope);
  EXPECT_EQ(c.rope.original_max_position, 64);
  EXPECT_NEAR(c.rope.attention_factor, std::sqrt(1 + std::log(4.0) / std::log(64.0)), 1e-12);  // 256 / 64
  json bad = j;
  bad["rope_scaling"]["long_factor"] = {3.0};
  EXPECT_NE(parse_error(bad).find("rope_scaling.long_factor"), std::string::npos) << parse_error(bad);
  bad = j;
  bad["rope_scaling"]["type"] = "su";
  EXPECT_NE(parse_error(bad).find("'su' is not supported"), std::string::npos) << parse_error(bad);
  bad = j;
  bad["partial_rotary_factor"] = 0.3;  // 2.4 -> 2 dims: 1 factor expected
  EXPECT_NE(parse_error(bad).find("short_factor"), std::string::npos) << parse_error(bad);
  json q = base_cfg("Qwen2ForCausalLM");
  q["partial_rotary_factor"] = 0.5;
  EXPECT_NE(parse_error(q).find("partial_rotary_factor"), std::string::npos) << parse_error(q);

  json s = base_cfg("SmolLM3ForCausalLM");
  s["num_hidden_layers"] = 8;
  ModelConfig sc = parse(s);  // no_rope_layer_interval 4 by default
  EXPECT_EQ(sc.layer_rope, (std::vector<LayerRope>{LayerRope::Main, LayerRope::Main, LayerRope::Main, LayerRope::None,
                                                   LayerRope::Main, LayerRope::Main, LayerRope::Main, LayerRope::None}));
  s["no_rope_layers"] = {1, 0, 1};
  EXPECT_NE(parse_error(s).find("no_rope_layers"), std::string::npos) << parse_error(s);
  s["no_rope_layers"] = {1, 1, 1, 1, 1, 1, 1, 2};
  EXPECT_NE(parse_error(s).find("no_rope_layers[7]"), std::string::npos) << parse_error(s);
}

}  // namespace
}  // namespace ptllm
