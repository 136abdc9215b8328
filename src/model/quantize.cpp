#include "model/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "core/file_io.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/safetensors_writer.h"

namespace ptllm {

namespace fs = std::filesystem;

std::string_view quant_method_name(QuantMethod m) {
  switch (m) {
    case QuantMethod::Rtn: return "rtn";
    case QuantMethod::Search: return "search";
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
double encode(const float* x, int g, float scale, float bias, int nmax, uint8_t* q) {
  const bool usable = scale != 0 && std::isfinite(scale);
  double err = 0;
  for (int i = 0; i < g; ++i) {
    float c = usable ? std::nearbyint((x[i] - bias) / scale) : 0.f;
    c = std::clamp(c, 0.f, float(nmax));
    q[i] = uint8_t(c);
    const double d = double(scale * c + bias) - double(x[i]);
    err += d * d;
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

// The least-squares (scale, bias) of x over codes q: minimizes sum (scale * q + bias - x)^2.
bool refit(const float* x, const uint8_t* q, int g, float& scale, float& bias) {
  double sl = 0, sll = 0, sx = 0, slx = 0;
  for (int i = 0; i < g; ++i) {
    const double l = q[i];
    sl += l;
    sll += l * l;
    sx += x[i];
    slx += l * double(x[i]);
  }
  const double det = double(g) * sll - sl * sl;
  if (!(det > 0)) return false;
  const double s = (double(g) * slx - sl * sx) / det;
  if (!(s > 0)) return false;
  scale = float(s);
  bias = float((sx - s * sl) / double(g));
  return true;
}

GroupFit fit_search(const float* x, int g, int nmax, DType dt, uint8_t* q, uint8_t* tmp) {
  GroupFit best = fit_rtn(x, g, nmax, dt);
  best.err = encode(x, g, best.scale, best.bias, nmax, q);
  float lo = x[0], hi = x[0];
  for (int i = 1; i < g; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (!(hi > lo)) return best;
  // Inverse scales from (nmax - 1) to (nmax + 1) steps over the range (llama.cpp's rmin -1, rdelta
  // 0.1, 20 steps): each gives codes, the codes a least-squares scale and bias.
  constexpr int kSteps = 20;
  for (int is = 0; is <= kSteps; ++is) {
    const float iscale = (float(nmax) - 1.f + 0.1f * float(is)) / (hi - lo);
    for (int i = 0; i < g; ++i) tmp[i] = uint8_t(std::clamp(std::nearbyint(iscale * (x[i] - lo)), 0.f, float(nmax)));
    float scale = 0, bias = 0;
    if (!refit(x, tmp, g, scale, bias)) continue;
    scale = as_stored(scale, dt);
    bias = as_stored(bias, dt);
    const double err = encode(x, g, scale, bias, nmax, tmp);
    if (err < best.err) {
      best = {scale, bias, err};
      std::copy_n(tmp, g, q);
    }
  }
  return best;
}

// Code j at bits [j * bits, (j + 1) * bits) of the row's little-endian bit stream.
void pack_row(const uint8_t* q, int cols, int bits, uint32_t* words) {
  const size_t n_words = size_t(cols) * size_t(bits) / 32;
  std::fill_n(words, n_words, 0u);
  for (int j = 0; j < cols; ++j) {
    const size_t bit = size_t(j) * size_t(bits);
    const size_t w = bit / 32, sh = bit % 32;
    words[w] |= uint32_t(q[j]) << sh;
    if (sh + size_t(bits) > 32) words[w + 1] |= uint32_t(q[j]) >> (32 - sh);
  }
}

}  // namespace

void affine_quantize_rows(const float* w, int rows, int cols, const AffineSpec& s, QuantMethod m, DType scale_dtype,
                          uint32_t* codes, void* scales, void* biases) {
  PTLLM_CHECK(affine_supported(s) && cols % s.group_size == 0);
  PTLLM_CHECK(scale_dtype == DType::F32 || scale_dtype == DType::F16 || scale_dtype == DType::BF16);
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
        f = fit_search(x, g, nmax, scale_dtype, qk, tmp.data());
      } else {
        f = fit_rtn(x, g, nmax, scale_dtype);
        encode(x, g, f.scale, f.bias, nmax, qk);
      }
      const size_t gi = size_t(r) * size_t(groups) + size_t(k);
      put(scales, scale_dtype, gi, f.scale);
      put(biases, scale_dtype, gi, f.bias);
    }
    pack_row(q.data(), cols, s.bits, codes + size_t(r) * words);
  }
}

namespace {

// The module paths whose `weight` is a matrix the forward pass multiplies by (model.cpp's Loader).
bool is_linear_module(const std::string& module) {
  if (module == "model.embed_tokens" || module == "lm_head") return true;
  for (const char* leaf : {".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.o_proj",
                           ".mlp.gate_proj", ".mlp.up_proj", ".mlp.down_proj"})
    if (module.starts_with("model.layers.") && module.ends_with(leaf)) return true;
  return false;
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

}  // namespace

QuantizeReport quantize_checkpoint(const fs::path& in, const fs::path& out, const QuantizeOptions& opts,
                                   ThreadPool& pool, const std::function<void(size_t, size_t)>& progress) {
  if (!affine_supported(opts.spec))
    throw Error("quantize: " + std::to_string(opts.spec.bits) + " bits in groups of " +
                std::to_string(opts.spec.group_size) + " is not a supported layout");
  const std::unique_ptr<Model> src = Model::load(in);  // every tensor checked against config.json
  const fs::path in_config = in / "config.json";
  if (src->config().quantization.quantized())
    throw Error(in_config.string() + ": the checkpoint is already quantized (field 'quantization'); quantize a F32, "
                                     "F16 or BF16 one");
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out)) throw Error(out.string() + ": cannot create the directory (" + ec.message() + ")");
  if (fs::equivalent(in, out, ec)) throw Error(out.string() + ": is the source directory; write to another one");

  // The plan: which matrices are quantized with which group, and the tensors of the output in order.
  QuantizationConfig qc;
  qc.base = opts.spec;
  QuantizeReport rep;
  std::vector<Item> items;
  std::vector<TensorDecl> decls;
  size_t total = 0;
  for (const auto& f : src->files().files()) {
    rep.source_bytes += f->size();
    for (const auto& [name, t] : f->tensors()) {
      total += t.nbytes;
      Item it{&t, "", opts.spec};
      const std::string module = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : "";
      if (!module.empty() && t.shape.size() == 2 && is_linear_module(module)) {
        const int cols = int(t.shape[1]);
        const bool embedding = module == "model.embed_tokens" || module == "lm_head";
        // The widest supported group no wider than asked that divides the width (mlx-lm would leave
        // such a matrix dense; a narrower group keeps it quantized and is still its layout).
        int group = 0;
        for (int gs : kAffineGroupSizes)
          if (gs <= opts.spec.group_size && cols % gs == 0) group = gs;
        if ((embedding && opts.keep_embeddings) || group == 0) {
          qc.overrides[module] = std::nullopt;
          ++rep.matrices_dense;
        } else {
          it.module = module;
          it.spec.group_size = group;
          if (group != opts.spec.group_size) qc.overrides[module] = it.spec;
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

  const fs::path weights = out / "model.safetensors";
  SafetensorsWriter writer(weights, std::move(decls), {{"format", "mlx"}});
  size_t done = 0;
  for (const Item& it : items) {
    const TensorView& t = *it.t;
    if (it.module.empty()) {
      writer.write({reinterpret_cast<const char*>(t.data), t.nbytes});
    } else {
      const int rows = int(t.shape[0]), cols = int(t.shape[1]);
      const size_t words = size_t(cols) * size_t(it.spec.bits) / 32;
      const size_t groups = size_t(cols / it.spec.group_size), ssize = dtype_size(t.dtype);
      std::vector<uint32_t> codes(size_t(rows) * words);
      std::vector<uint8_t> scales(size_t(rows) * groups * ssize), biases(scales.size());
      constexpr size_t kRowsPerPart = 16;
      pool.parallel_for((size_t(rows) + kRowsPerPart - 1) / kRowsPerPart, [&](size_t b, size_t e) {
        std::vector<float> x(kRowsPerPart * size_t(cols));  // [rows of the part][cols] the source as float32
        for (size_t p = b; p < e; ++p) {
          const size_t r0 = p * kRowsPerPart, n = std::min(kRowsPerPart, size_t(rows) - r0);
          convert_to_f32(t.dtype, t.data + r0 * size_t(cols) * ssize, x.data(), n * size_t(cols));
          affine_quantize_rows(x.data(), int(n), cols, it.spec, opts.method, t.dtype, codes.data() + r0 * words,
                               scales.data() + r0 * groups * ssize, biases.data() + r0 * groups * ssize);
        }
      });
      writer.write({reinterpret_cast<const char*>(codes.data()), codes.size() * sizeof(uint32_t)});
      writer.write({reinterpret_cast<const char*>(scales.data()), scales.size()});
      writer.write({reinterpret_cast<const char*>(biases.data()), biases.size()});
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
