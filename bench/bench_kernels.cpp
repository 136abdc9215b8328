// Kernel benchmarks (docs/performance.md):
//   kernel/<name>/{simd,scalar}/<n>   each SIMD kernel (best target) against its scalar twin, one core
//       (ggml_<type>_rows64: 64 rows of a block format against one quantized row of x)
//   prefill/<shape>/{ours_bf16,ours_f32,openblas_f32}   matmul at the prefill shapes of Llama-3.2-1B
//       (512 tokens) next to OpenBLAS sgemm on the same shapes and threads
//   product/{gemv,gemm,amx}/<T>       the product kernels at small T (where matmul switches)
//   product/{bf16,ggml_<type>}/{gemv,gemm}/<T>/<N>x<K>   matmul over llama.cpp's block formats
//       (Q4_K, Q6_K, Q8_0, Q4_0) beside bf16 at the same shapes: decode (T = 1, 8), prefill (64, 256);
//       2048x2048, 5632x2048, and kjv-small's 1376x512 and 8192x512
//   decode/gemv_bf16, decode/read     a decode-size weight stream against a plain read of as many bytes
//   product/{bf16,affine4,affine6,affine8}/{gemv,gemm}/<T>/<N>x<K>   matmul over bf16 weights next to the
//       MLX-layout 4-, 6- and 8-bit products (group 64, bf16 scales; kernels/affine.h) on the same shapes
//   product/affine{4,6,8}p/...        the same, the packed copies a load makes (kernels/affine.h)
//   decode/gemv_panels_{f32x,bf16x}   decode/gemv_bf16's stream of BF16 matrices in panels, x float32 or bf16
//   decode/gemv_affine{4,6,8}[p]      decode/gemv_bf16's matrices, 4-, 6- and 8-bit (p: packed)
//   product/panels/{f32x,bf16x}/<T>/<N>x<K>   BF16 weights in panels (kernels/panels.h) with x in
//       float32 and rounded to bf16 (PTLLM_PANELS_BF16_X); the CPU time column is the one to read
//       on a shared machine (with PTLLM_BENCH_THREADS=1 it is the kernel's own time)
// Threads: PTLLM_BENCH_THREADS (default: all cores), for our pool and OpenBLAS alike. OpenBLAS is
// loaded at run time (libopenblas.so.0, from libopenblas0 / libopenblas-dev); without it the
// openblas_* benchmarks are skipped.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/ggml.h"
#include "kernels/affine.h"
#include "kernels/amx.h"
#include "kernels/ops.h"
#include "kernels/panels.h"
#include "kernels/quant.h"
#include "kernels/simd.h"

namespace ptllm {
namespace {

int bench_threads() {
  const char* env = std::getenv("PTLLM_BENCH_THREADS");
  return env && std::atoi(env) > 0 ? std::atoi(env) : ThreadPool::default_threads();
}

ThreadPool& pool() {
  static ThreadPool p(bench_threads());
  return p;
}

std::vector<float> random_floats(size_t n, float lo = -1.f, float hi = 1.f, unsigned seed = 7) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

std::vector<uint16_t> as_16bit(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> out(v.size());
  store_as_ref(v.data(), out.data(), t, int(v.size()));
  return out;
}

// ---- OpenBLAS, loaded at run time ------------------------------------------------------------

struct OpenBlas {
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
  Sgemm sgemm = nullptr;
  void (*set_threads)(int) = nullptr;
  char* (*corename)() = nullptr;
  OpenBlas() {
    void* h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    sgemm = reinterpret_cast<Sgemm>(dlsym(h, "cblas_sgemm"));
    set_threads = reinterpret_cast<void (*)(int)>(dlsym(h, "openblas_set_num_threads"));
    corename = reinterpret_cast<char* (*)()>(dlsym(h, "openblas_get_corename"));
    if (set_threads) set_threads(bench_threads());
  }
};
const OpenBlas& openblas() {
  static OpenBlas b;
  return b;
}
constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;

// ---- kernel vs scalar twin ------------------------------------------------------------------------

using Body = std::function<void()>;
// Builds the SIMD and the scalar body of one kernel for size n (buffers owned by the closures).
using CaseMaker = std::function<std::pair<Body, Body>(int n)>;

void register_kernel(const std::string& name, CaseMaker make) {
  for (int n : {1024, 4096})
    for (bool simd : {true, false})
      benchmark::RegisterBenchmark(("kernel/" + name + (simd ? "/simd/" : "/scalar/") + std::to_string(n)).c_str(),
                                   [=](benchmark::State& st) {
                                     auto bodies = make(n);
                                     const Body& body = simd ? bodies.first : bodies.second;
                                     for (auto _ : st) {
                                       body();
                                       benchmark::ClobberMemory();
                                     }
                                     st.SetItemsProcessed(int64_t(st.iterations()) * n);
                                   });
}

// The KIVI block benchmarks' shape: 4 query heads per KV head, head_dim 64, groups of 32 tokens.
constexpr int kBlockD = 64, kBlockHeads = 4, kBlockG = 32;

// nk random rows of kBlockD channels stored as t (dense KV storage: F32, F16 or BF16), as bytes.
std::shared_ptr<std::vector<uint8_t>> stored_rows(int nk, DType t) {
  const auto rows = random_floats(size_t(nk) * kBlockD);
  auto out = std::make_shared<std::vector<uint8_t>>(rows.size() * dtype_size(t));
  if (t == DType::F32)
    std::memcpy(out->data(), rows.data(), out->size());
  else
    std::memcpy(out->data(), as_16bit(rows, t).data(), out->size());
  return out;
}
// fn(block rows, keys in it) for the blocks of kBlockG rows of `rows` (nk rows stored as t), as
// attention calls the dense block kernels.
template <class F>
void for_each_block(const std::vector<uint8_t>& rows, int nk, DType t, F&& fn) {
  const size_t row_bytes = size_t(kBlockD) * dtype_size(t);
  for (int j = 0; j < nk; j += kBlockG) fn(rows.data() + size_t(j) * row_bytes, std::min(kBlockG, nk - j));
}

void register_kernels() {
  register_kernel("dot", [](int n) {
    auto a = std::make_shared<std::vector<float>>(random_floats(size_t(n)));
    auto b = std::make_shared<std::vector<float>>(random_floats(size_t(n), -1, 1, 8));
    return std::pair<Body, Body>{[=] { benchmark::DoNotOptimize(dot(a->data(), b->data(), n)); },
                                 [=] { benchmark::DoNotOptimize(dot_ref(a->data(), b->data(), n)); }};
  });
  register_kernel("axpy", [](int n) {
    auto x = std::make_shared<std::vector<float>>(random_floats(size_t(n)));
    auto y = std::make_shared<std::vector<float>>(random_floats(size_t(n)));
    return std::pair<Body, Body>{[=] { axpy(1e-7f, x->data(), y->data(), n); },
                                 [=] { axpy_ref(1e-7f, x->data(), y->data(), n); }};
  });
  for (DType t : {DType::BF16, DType::F16}) {
    const std::string tn = t == DType::BF16 ? "bf16" : "f16";
    register_kernel("dot_" + tn, [t](int n) {
      auto a = std::make_shared<std::vector<float>>(random_floats(size_t(n)));
      auto b = std::make_shared<std::vector<uint16_t>>(as_16bit(random_floats(size_t(n)), t));
      return std::pair<Body, Body>{[=] { benchmark::DoNotOptimize(dot_stored(a->data(), b->data(), t, n)); },
                                   [=] { benchmark::DoNotOptimize(dot_stored_ref(a->data(), b->data(), t, n)); }};
    });
    register_kernel("axpy_" + tn, [t](int n) {
      auto x = std::make_shared<std::vector<uint16_t>>(as_16bit(random_floats(size_t(n)), t));
      auto y = std::make_shared<std::vector<float>>(random_floats(size_t(n)));
      return std::pair<Body, Body>{[=] { axpy_stored(1e-7f, x->data(), t, y->data(), n); },
                                   [=] { axpy_stored_ref(1e-7f, x->data(), t, y->data(), n); }};
    });
    register_kernel("store_" + tn, [t](int n) {
      auto x = std::make_shared<std::vector<float>>(random_floats(size_t(n)));
      auto y = std::make_shared<std::vector<uint16_t>>(size_t(n));
      return std::pair<Body, Body>{[=] { store_as(x->data(), y->data(), t, n); },
                                   [=] { store_as_ref(x->data(), y->data(), t, n); }};
    });
    register_kernel("load_" + tn, [t](int n) {
      auto x = std::make_shared<std::vector<uint16_t>>(as_16bit(random_floats(size_t(n)), t));
      auto y = std::make_shared<std::vector<float>>(size_t(n));
      return std::pair<Body, Body>{[=] { load_from(x->data(), t, y->data(), n); },
                                   [=] { load_from_ref(x->data(), t, y->data(), n); }};
    });
  }
  // KIVI attention blocks as attention uses them: 4 query heads sharing a KV head, head_dim 64,
  // groups of 32 tokens; n = codes per call (n / 64 tokens).
  for (int bits : {8, 4, 2}) {
    register_kernel("kivi_k_block_int" + std::to_string(bits), [bits](int n) {
      const int nk = n / kBlockD;
      auto q = std::make_shared<std::vector<float>>(random_floats(size_t(kBlockHeads) * kBlockD));
      auto c = std::make_shared<std::vector<uint8_t>>(size_t(nk) * packed_bytes(kBlockD, bits), uint8_t(0x5b));
      auto sz = std::make_shared<std::vector<uint16_t>>(as_16bit(random_floats(2 * kBlockD, 0.01f, 0.1f), DType::F16));
      auto out = std::make_shared<std::vector<float>>(size_t(kBlockHeads) * kBlockG);
      auto run = [=](bool simd) {
        for (int j = 0; j < nk; j += kBlockG) {
          const uint8_t* cj = c->data() + size_t(j) * packed_bytes(kBlockD, bits);
          const int m = std::min(kBlockG, nk - j);
          if (simd)
            kivi_k_block(q->data(), kBlockHeads, KRows{cj, m, 0}, sz->data(), sz->data() + kBlockD, 0.125f, m, kBlockD, bits, out->data(), kBlockG);
          else
            kivi_k_block_ref(q->data(), kBlockHeads, KRows{cj, m, 0}, sz->data(), sz->data() + kBlockD, 0.125f, m, kBlockD, bits, out->data(), kBlockG);
        }
        benchmark::DoNotOptimize(out->data());
      };
      return std::pair<Body, Body>{[=] { run(true); }, [=] { run(false); }};
    });
    register_kernel("kivi_v_block_int" + std::to_string(bits), [bits](int n) {
      const int nk = n / kBlockD;
      auto p = std::make_shared<std::vector<float>>(random_floats(size_t(kBlockHeads) * kBlockG, 0.f, 1e-3f));
      auto c = std::make_shared<std::vector<uint8_t>>(size_t(nk) * packed_bytes(kBlockD, bits), uint8_t(0x5b));
      auto sz = std::make_shared<std::vector<uint16_t>>(as_16bit(random_floats(2 * kBlockG, 0.01f, 0.1f), DType::F16));
      auto acc = std::make_shared<std::vector<float>>(size_t(kBlockHeads) * kBlockD), zacc = std::make_shared<std::vector<float>>(size_t(kBlockHeads));
      auto run = [=](bool simd) {
        for (int j = 0; j < nk; j += kBlockG) {
          const uint8_t* cj = c->data() + size_t(j) * packed_bytes(kBlockD, bits);
          const int m = std::min(kBlockG, nk - j);
          if (simd)
            kivi_v_block(p->data(), kBlockG, kBlockHeads, cj, sz->data(), sz->data() + kBlockG, m, kBlockD, bits, acc->data(), zacc->data());
          else
            kivi_v_block_ref(p->data(), kBlockG, kBlockHeads, cj, sz->data(), sz->data() + kBlockG, m, kBlockD, bits, acc->data(), zacc->data());
        }
      };
      return std::pair<Body, Body>{[=] { run(true); }, [=] { run(false); }};
    });
  }
  for (int bits : {8, 4, 2})
    register_kernel("kivi_k_dequant_int" + std::to_string(bits), [bits](int n) {
      const int nk = n / kBlockD;
      auto c = std::make_shared<std::vector<uint8_t>>(size_t(nk) * packed_bytes(kBlockD, bits), uint8_t(0x5b));
      auto sz = std::make_shared<std::vector<uint16_t>>(as_16bit(random_floats(2 * kBlockD, 0.01f, 0.1f), DType::F16));
      auto out = std::make_shared<std::vector<float>>(size_t(kBlockG) * kBlockD);
      auto run = [=](bool simd) {
        for (int j = 0; j < nk; j += kBlockG) {
          const uint8_t* cj = c->data() + size_t(j) * packed_bytes(kBlockD, bits);
          const int m = std::min(kBlockG, nk - j);
          if (simd)
            kivi_k_dequant(KRows{cj, m, 0}, sz->data(), sz->data() + kBlockD, m, kBlockD, bits, out->data());
          else
            dequantize_k_group(cj, sz->data(), sz->data() + kBlockD, m, kBlockD, bits, out->data());
        }
        benchmark::DoNotOptimize(out->data());
      };
      return std::pair<Body, Body>{[=] { run(true); }, [=] { run(false); }};
    });
  // Dense attention blocks (fp32/fp16/bf16 storage), same shape.
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    const std::string tn = t == DType::F32 ? "f32" : t == DType::F16 ? "f16" : "bf16";
    register_kernel("dense_k_block_" + tn, [t](int n) {
      const int nk = n / kBlockD;
      auto q = std::make_shared<std::vector<float>>(random_floats(size_t(kBlockHeads) * kBlockD));
      auto k = stored_rows(nk, t);
      auto out = std::make_shared<std::vector<float>>(size_t(kBlockHeads) * kBlockG);
      auto run = [=](bool simd) {
        for_each_block(*k, nk, t, [&](const void* kj, int m) {
          if (simd)
            dense_k_block(q->data(), kBlockHeads, kj, t, 0.125f, m, kBlockD, out->data(), kBlockG);
          else
            dense_k_block_ref(q->data(), kBlockHeads, kj, t, 0.125f, m, kBlockD, out->data(), kBlockG);
        });
        benchmark::DoNotOptimize(out->data());
      };
      return std::pair<Body, Body>{[=] { run(true); }, [=] { run(false); }};
    });
    register_kernel("dense_v_block_" + tn, [t](int n) {
      const int nk = n / kBlockD;
      auto p = std::make_shared<std::vector<float>>(random_floats(size_t(kBlockHeads) * kBlockG, 0.f, 1e-3f));
      auto v = stored_rows(nk, t);
      auto acc = std::make_shared<std::vector<float>>(size_t(kBlockHeads) * kBlockD);
      auto run = [=](bool simd) {
        for_each_block(*v, nk, t, [&](const void* vj, int m) {
          if (simd)
            dense_v_block(p->data(), kBlockG, kBlockHeads, vj, t, m, kBlockD, acc->data());
          else
            dense_v_block_ref(p->data(), kBlockG, kBlockHeads, vj, t, m, kBlockD, acc->data());
        });
        benchmark::DoNotOptimize(acc->data());
      };
      return std::pair<Body, Body>{[=] { run(true); }, [=] { run(false); }};
    });
  }
  register_kernel("max_of", [](int n) {
    auto x = std::make_shared<std::vector<float>>(random_floats(size_t(n), -5, 5));
    return std::pair<Body, Body>{[=] { benchmark::DoNotOptimize(max_of(x->data(), n)); },
                                 [=] { benchmark::DoNotOptimize(max_of_ref(x->data(), n)); }};
  });
  register_kernel("exp_sum", [](int n) {
    // x = m + log(1) = m after each call would drift; exp_sum writes e^(x - m) in place, so keep a
    // source copy and restore it (the copy is the same for both bodies).
    auto src = std::make_shared<std::vector<float>>(random_floats(size_t(n), -5, 0));
    auto x = std::make_shared<std::vector<float>>(size_t(n));
    return std::pair<Body, Body>{[=] {
                                   std::copy(src->begin(), src->end(), x->begin());
                                   benchmark::DoNotOptimize(exp_sum(x->data(), n, 0.f));
                                 },
                                 [=] {
                                   std::copy(src->begin(), src->end(), x->begin());
                                   benchmark::DoNotOptimize(exp_sum_ref(x->data(), n, 0.f));
                                 }};
  });
  register_kernel("rmsnorm", [](int n) {
    auto x = std::make_shared<std::vector<float>>(random_floats(size_t(n)));
    auto w = std::make_shared<std::vector<float>>(random_floats(size_t(n)));
    auto o = std::make_shared<std::vector<float>>(size_t(n));
    return std::pair<Body, Body>{[=] { rmsnorm(x->data(), w->data(), o->data(), n, 1e-5f); },
                                 [=] { rmsnorm_ref(x->data(), w->data(), o->data(), n, 1e-5f); }};
  });
  register_kernel("silu_mul", [](int n) {
    // up = g / silu(g): the update is the identity, so repeated calls keep their inputs.
    auto g = std::make_shared<std::vector<float>>(random_floats(size_t(n), 0.5f, 4.f));
    auto u = std::make_shared<std::vector<float>>(size_t(n));
    for (int i = 0; i < n; ++i) (*u)[size_t(i)] = 1.0f + std::exp(-(*g)[size_t(i)]);
    return std::pair<Body, Body>{[=] { silu_mul(g->data(), u->data(), n); },
                                 [=] { silu_mul_ref(g->data(), u->data(), n); }};
  });
  register_kernel("softmax", [](int n) {
    auto x = std::make_shared<std::vector<float>>(random_floats(size_t(n), -5, 5));
    return std::pair<Body, Body>{[=] { softmax(x->data(), n); }, [=] { softmax_ref(x->data(), n); }};
  });
  register_kernel("rope_64", [](int n) {  // n / 64 heads of 64
    auto x = std::make_shared<std::vector<float>>(random_floats(size_t(n)));
    auto c = std::make_shared<std::vector<float>>(32), s = std::make_shared<std::vector<float>>(32);
    for (int i = 0; i < 32; ++i) (*c)[size_t(i)] = std::cos(0.1f * float(i)), (*s)[size_t(i)] = std::sin(0.1f * float(i));
    return std::pair<Body, Body>{[=] { rope_rotate(x->data(), n / 64, 64, c->data(), s->data()); },
                                 [=] { rope_rotate_ref(x->data(), n / 64, 64, c->data(), s->data()); }};
  });
  // llama.cpp's block formats on one core: 64 weight rows of n values against one row of x already
  // quantized (ggml.h), the active variant against the scalar twin.
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q4_0}) {
    register_kernel("ggml_" + std::string(ggml_type_info(t).name) + "_rows64", [t](int n) {
      const WeightMatrix shape = ggml_matrix(t, nullptr, 64, n);
      auto w = std::make_shared<std::vector<uint8_t>>(shape.nbytes());
      const auto wf = random_floats(size_t(64) * size_t(n), -0.05f, 0.05f);
      for (int r = 0; r < 64; ++r)
        ggml_quantize_row(t, wf.data() + size_t(r) * size_t(n), n, w->data() + size_t(r) * shape.row_bytes());
      const int block = ggml_act_block(t);
      const auto x = random_floats(size_t(n));
      auto q = std::make_shared<std::vector<int8_t>>(size_t(n));
      auto d = std::make_shared<std::vector<float>>(size_t(n / block));
      auto sums = std::make_shared<std::vector<int16_t>>(size_t(n / 16));
      ggml_quantize_acts(x.data(), n, block, 0, 1, q->data(), d->data(), sums->data());
      auto y = std::make_shared<std::vector<float>>(64);
      const WeightMatrix m = ggml_matrix(t, w->data(), 64, n);
      const GgmlActs a{1, n, block, q->data(), d->data(), sums->data()};
      int nk = 0;
      const GgmlKernel* scalar = ggml_kernels(&nk)[0];
      const GgmlKernel* simd = &ggml_active_kernel();
      return std::pair<Body, Body>{[=] { simd->rows(m, a, nullptr, y->data(), 0, 64); },
                                   [=] { scalar->rows(m, a, nullptr, y->data(), 0, 64); }};
    });
  }
  // Products on one core: n = the inner dimension; 64 weight rows (bf16), T = 1 and T = 16.
  for (int T : {1, 16}) {
    register_kernel("matmul_bf16_T" + std::to_string(T), [T](int n) {
      auto w = std::make_shared<std::vector<uint16_t>>(as_16bit(random_floats(size_t(64) * size_t(n)), DType::BF16));
      auto x = std::make_shared<std::vector<float>>(random_floats(size_t(T) * size_t(n)));
      auto y = std::make_shared<std::vector<float>>(size_t(T) * 64);
      auto one = std::make_shared<ThreadPool>(1);
      const WeightMatrix m{DType::BF16, w->data(), 64, n};
      // Each body holds w too: m only points into it.
      return std::pair<Body, Body>{[w, x, y, one, m, T] { matmul(x->data(), T, m, nullptr, y->data(), *one); },
                                   [w, x, y, m, T] { matmul_ref(x->data(), T, m, nullptr, y->data()); }};
    });
  }
}

// ---- prefill products against OpenBLAS ------------------------------------------------------------

struct PrefillShape {
  const char* name;
  int N, K;  // weight rows (outputs) and columns (inputs)
};
// Llama-3.2-1B: q/o 2048x2048, k/v 512x2048, gate/up 8192x2048, down 2048x8192.
const PrefillShape kPrefill[] = {{"qo_2048x2048", 2048, 2048},
                                 {"kv_512x2048", 512, 2048},
                                 {"gate_up_8192x2048", 8192, 2048},
                                 {"down_2048x8192", 2048, 8192}};
constexpr int kPrefillT = 512;

void register_prefill() {
  for (const auto& s : kPrefill) {
    for (const char* who : {"ours_bf16", "ours_f32", "openblas_f32"}) {
      benchmark::RegisterBenchmark((std::string("prefill/") + s.name + "/" + who).c_str(), [s, who](benchmark::State& st) {
        const std::string w(who);
        auto wf = random_floats(size_t(s.N) * size_t(s.K), -0.05f, 0.05f);
        auto x = random_floats(size_t(kPrefillT) * size_t(s.K));
        std::vector<float> y(size_t(kPrefillT) * size_t(s.N));
        std::vector<uint16_t> wb;
        WeightMatrix m{DType::F32, wf.data(), s.N, s.K};
        if (w == "ours_bf16") {
          wb = as_16bit(wf, DType::BF16);
          m = WeightMatrix{DType::BF16, wb.data(), s.N, s.K};
        }
        if (w == "openblas_f32" && !openblas().sgemm) {
          st.SkipWithError("libopenblas.so.0 not found");
          return;
        }
        for (auto _ : st) {
          if (w == "openblas_f32")
            // y[T][N] = x[T][K] * W[N][K]^T
            openblas().sgemm(kCblasRowMajor, kCblasNoTrans, kCblasTrans, kPrefillT, s.N, s.K, 1.f, x.data(), s.K,
                             wf.data(), s.K, 0.f, y.data(), s.N);
          else
            matmul(x.data(), kPrefillT, m, nullptr, y.data(), pool());
          benchmark::ClobberMemory();
        }
        st.counters["GFLOPS"] = benchmark::Counter(2.0 * kPrefillT * s.N * s.K * double(st.iterations()) / 1e9,
                                                   benchmark::Counter::kIsRate);
      })->UseRealTime()->Unit(benchmark::kMillisecond);
    }
  }
}

// ---- gemv against gemm at small T ----------------------------------------------------------------

void register_products() {
  for (const char* kind : {"gemv", "gemm", "amx"})
    for (int T : {1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128}) {
      benchmark::RegisterBenchmark((std::string("product/") + kind + "/" + std::to_string(T)).c_str(),
                                   [kind, T](benchmark::State& st) {
                                     const int N = 2048, K = 2048;
                                     auto w = as_16bit(random_floats(size_t(N) * K, -0.05f, 0.05f), DType::BF16);
                                     auto x = random_floats(size_t(T) * K);
                                     std::vector<float> y(size_t(T) * N);
                                     const WeightMatrix m{DType::BF16, w.data(), N, K};
                                     const KernelTable& k = active_kernels();
                                     const bool gemv = std::string(kind) == "gemv";
                                     if (std::string(kind) == "amx" && !amx_takes(m)) {
                                       st.SkipWithError("no AMX on this CPU or OS");
                                       return;
                                     }
                                     const bool amx = std::string(kind) == "amx";
                                     const int panels = (T + k.gemm_mr - 1) / k.gemm_mr;
                                     std::vector<float> ap(size_t(panels) * size_t(k.gemm_mr) * K);
                                     std::vector<float> xd(x.size());
                                     for (auto _ : st) {
                                       if (amx) {
                                         amx_matmul(x.data(), T, m, nullptr, y.data(), pool());
                                       } else if (gemv) {  // as matmul: x deinterleaved once
                                         k.deinterleave_bf16(x.data(), T, K, xd.data());
                                         pool().parallel_for(
                                             size_t(N),
                                             [&](size_t b, size_t e) {
                                               k.gemv(x.data(), xd.data(), T, m, nullptr, y.data(), int(b), int(e));
                                             },
                                             4);
                                       } else {  // as matmul does it: x packed once, then the column tiles
                                         pool().parallel_for(size_t(panels), [&](size_t b, size_t e) {
                                           k.pack_a(x.data(), T, K, int(b), int(e), ap.data());
                                         });
                                         pool().parallel_for(
                                             size_t(N),
                                             [&](size_t b, size_t e) { k.gemm(ap.data(), T, m, nullptr, y.data(), int(b), int(e)); },
                                             size_t(k.gemm_nr));
                                       }
                                       benchmark::ClobberMemory();
                                     }
                                     st.counters["tok/s"] =
                                         benchmark::Counter(double(T) * double(st.iterations()), benchmark::Counter::kIsRate);
                                   })
          ->UseRealTime();
    }
}

// ---- llama.cpp's block formats beside bf16 ------------------------------------------------------

// One matrix per (format, shape), built once (the K-quant reference quantizers take a second or two
// on the larger shape) and kept for the process.
const std::vector<uint8_t>& bench_weights(const std::string& fmt, int N, int K) {
  static std::map<std::string, std::vector<uint8_t>> cache;
  const std::string key = fmt + "/" + std::to_string(N) + "x" + std::to_string(K);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const auto wf = random_floats(size_t(N) * size_t(K), -0.05f, 0.05f);
  std::vector<uint8_t> bytes;
  if (fmt == "bf16") {
    const auto w = as_16bit(wf, DType::BF16);
    bytes.resize(w.size() * 2);
    std::memcpy(bytes.data(), w.data(), bytes.size());
  } else {
    const WeightMatrix shape = ggml_matrix(ggml_type_by_name(fmt.substr(5)), nullptr, N, K);
    bytes.resize(shape.nbytes());
    for (int r = 0; r < N; ++r)
      ggml_quantize_row(shape.ggml, wf.data() + size_t(r) * size_t(K), K, bytes.data() + size_t(r) * shape.row_bytes());
  }
  return cache.emplace(key, std::move(bytes)).first->second;
}

void register_ggml_products() {
  // Llama-like 2048 / 5632 shapes, and kjv-small's (the GGUF speed target): its MLP up/gate
  // 1376x512 and its tied Q6_K output 8192x512.
  const std::pair<int, int> shapes[] = {{2048, 2048}, {5632, 2048}, {1376, 512}, {8192, 512}};
  // "_packed": the 16-row groups a model load makes where ggml_pack_wanted (kernels/ggml.h).
  for (const char* fmt : {"bf16", "ggml_Q4_K", "ggml_Q6_K", "ggml_Q8_0", "ggml_Q4_0", "ggml_Q4_K_packed",
                          "ggml_Q6_K_packed", "ggml_Q8_0_packed", "ggml_Q4_0_packed"})
    for (const auto& [N, K] : shapes)
      for (int T : {1, 8, 64, 256}) {
        const std::string kind = T <= 8 ? "gemv" : "gemm";
        const std::string name = std::string("product/") + fmt + "/" + kind + "/" + std::to_string(T) + "/" +
                                 std::to_string(N) + "x" + std::to_string(K);
        benchmark::RegisterBenchmark(name.c_str(), [fmt = std::string(fmt), N, K, T](benchmark::State& st) {
          const bool packed = fmt.ends_with("_packed");
          const std::string file_fmt = packed ? fmt.substr(0, fmt.size() - 7) : fmt;
          const std::vector<uint8_t>& w = bench_weights(file_fmt, N, K);
          WeightMatrix m = fmt == "bf16" ? WeightMatrix{DType::BF16, w.data(), N, K}
                                         : ggml_matrix(ggml_type_by_name(file_fmt.substr(5)), w.data(), N, K);
          std::vector<uint8_t> pb;
          if (packed) {
            if (!ggml_pack_wanted(m.ggml)) return st.SkipWithError("this CPU's kernels read it in the file's layout");
            pb.resize(ggml_packed_bytes(m));
            ggml_pack(m, pb.data(), 0, m.rows / kGgmlPackRows);
            m = ggml_packed_matrix(m.ggml, pb.data(), N, K);
          }
          auto x = random_floats(size_t(T) * size_t(K));
          std::vector<float> y(size_t(T) * size_t(N));
          for (auto _ : st) {
            matmul(x.data(), T, m, nullptr, y.data(), pool());
            benchmark::ClobberMemory();
          }
          st.counters["tok/s"] = benchmark::Counter(double(T) * double(st.iterations()), benchmark::Counter::kIsRate);
          st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(m.nbytes()));
        })->UseRealTime();
      }
}

// ---- MLX-layout affine products next to bf16 ------------------------------------------------------

// Random codes and scales (group 64, bf16 scales and biases), the matrix of N x K.
struct AffineBench {
  std::vector<uint32_t> codes;
  std::vector<uint16_t> scales, biases;
  WeightMatrix w;
  AffineBench(int bits, int N, int K) {
    codes.resize(size_t(N) * size_t(K) * size_t(bits) / 32);
    std::mt19937 rng(11);
    for (auto& c : codes) c = uint32_t(rng());
    const auto s = random_floats(size_t(N) * size_t(K / 64), 0.001f, 0.01f);
    scales = as_16bit(s, DType::BF16);
    biases = as_16bit(random_floats(s.size(), -0.5f, 0.5f), DType::BF16);
    w = affine_matrix(codes.data(), scales.data(), biases.data(), DType::BF16, bits, 64, N, K);
  }
  // The copy a model load makes where affine_pack_wanted (kernels/affine.h): 16-row groups.
  std::vector<uint8_t> packed;
  void pack() {
    packed.resize(w.nbytes());
    affine_pack(w, packed.data(), 0, w.rows / kAffinePackRows);
    w = affine_packed_matrix(w, packed.data());
  }
};

// Sets the panel products' x mode (kernels/panels.h) for one benchmark and puts it back after.
struct PanelsBf16X {
  bool before = panels_bf16_x();
  explicit PanelsBf16X(bool on) { set_panels_bf16_x(on); }
  ~PanelsBf16X() { set_panels_bf16_x(before); }
};

void register_panel_products() {
  // Llama-3.2-1B's square and MLP shapes (prefill, batched decode, decode), kjv-small's (batched decode).
  const std::tuple<int, int, int> runs[] = {{2048, 2048, 1},   {2048, 2048, 16}, {2048, 2048, 512},
                                            {8192, 2048, 128}, {2048, 8192, 128}, {1376, 512, 16},
                                            {8192, 512, 16},   {512, 512, 16}};
  for (const char* mode : {"f32x", "bf16x"})
    for (const auto& [N, K, T] : runs) {
      const std::string name = std::string("product/panels/") + mode + "/" + std::to_string(T) + "/" +
                               std::to_string(N) + "x" + std::to_string(K);
      benchmark::RegisterBenchmark(name.c_str(), [bf16x = std::string(mode) == "bf16x", N, K, T](benchmark::State& st) {
        const std::vector<uint8_t>& w = bench_weights("bf16", N, K);
        const WeightMatrix dense{DType::BF16, w.data(), N, K};
        if (!panels_fit(dense)) return st.SkipWithError("not whole panels");
        std::vector<uint16_t> buf(size_t(N) * size_t(K) + 32);
        void* p = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) / 64 * 64);
        pack_panels(dense, p, pool());
        const WeightMatrix m = panels_matrix(p, N, K);
        auto x = random_floats(size_t(T) * size_t(K));
        std::vector<float> y(size_t(T) * size_t(N));
        const PanelsBf16X mode(bf16x);
        for (auto _ : st) {
          panels_matmul(x.data(), T, m, nullptr, y.data(), pool());
          benchmark::ClobberMemory();
        }
        st.counters["tok/s"] = benchmark::Counter(double(T) * double(st.iterations()), benchmark::Counter::kIsRate);
        st.counters["GMAC/s"] = benchmark::Counter(double(T) * double(N) * double(K) * double(st.iterations()) / 1e9,
                                                   benchmark::Counter::kIsRate);
      });
    }
}

void register_affine_products() {
  const std::pair<int, int> shapes[] = {{2048, 2048}, {5632, 2048}};
  // gemm/8 and gemm/16 next to gemv/8 and gemv/16 say where kAffineGemvMaxT belongs (affine only:
  // bf16's matmul takes its gemv up to T = kMatmulSmallRows, 17).
  const std::pair<const char*, int> runs[] = {{"gemv", 1},  {"gemv", 8},  {"gemv", 16}, {"gemm", 8},
                                              {"gemm", 16}, {"gemm", 64}, {"gemm", 256}};
  // affine{4,6,8}p: the load's packed copies (one product for both paths: named gemv up to 8 rows).
  for (const char* fmt : {"bf16", "affine4", "affine6", "affine8", "affine4p", "affine6p", "affine8p"})
    for (auto [N, K] : shapes)
      for (auto [path, T] : runs) {
        if (std::string(fmt) == "bf16" && std::string(path) == "gemm" && T <= 16) continue;
        if (std::string(fmt).back() == 'p' && (std::string(path) == "gemv") != (T <= kAffineGemvMaxT)) continue;
        const std::string name = std::string("product/") + fmt + "/" + path + "/" + std::to_string(T) + "/" +
                                 std::to_string(N) + "x" + std::to_string(K);
        benchmark::RegisterBenchmark(name.c_str(), [fmt = std::string(fmt), path = std::string(path), T = T, N = N,
                                                    K = K](benchmark::State& st) {
          auto x = random_floats(size_t(T) * size_t(K));
          std::vector<float> y(size_t(T) * size_t(N));
          std::vector<uint16_t> wb;
          std::unique_ptr<AffineBench> q;
          WeightMatrix m;
          if (fmt == "bf16") {
            wb = as_16bit(random_floats(size_t(N) * size_t(K), -0.05f, 0.05f), DType::BF16);
            m = WeightMatrix{DType::BF16, wb.data(), N, K};
          } else {
            q = std::make_unique<AffineBench>(fmt[6] - '0', N, K);  // affine4, affine6, affine8
            if (fmt.back() == 'p') {
              if (!affine_pack_fit(q->w)) return st.SkipWithError("not packable");
              q->pack();
            }
            m = q->w;
          }
          const AffinePath p = path == "gemv" ? AffinePath::Gemv : AffinePath::Gemm;
          const AffineKernel k = available_affine_kernels().back();
          for (auto _ : st) {
            if (fmt == "bf16")
              matmul(x.data(), T, m, nullptr, y.data(), pool());  // its own gemv up to T = 17, then gemm
            else
              affine_matmul(x.data(), T, m, nullptr, y.data(), pool(), k, p);
            benchmark::ClobberMemory();
          }
          st.counters["tok/s"] = benchmark::Counter(double(T) * double(st.iterations()), benchmark::Counter::kIsRate);
          st.counters["GB/s"] = benchmark::Counter(double(m.nbytes()) * double(st.iterations()) / 1e9,
                                                   benchmark::Counter::kIsRate);
        })->UseRealTime();
      }
}

// ---- decode: a weight stream larger than any cache, against a plain read ------------------------

constexpr size_t kStreamBytes = size_t(512) << 20;

// A cache-line aligned buffer (a std::vector's large buffer is 16 bytes past a page start).
template <class T>
std::unique_ptr<T[], void (*)(void*)> aligned_buffer(size_t n, T fill) {
  std::unique_ptr<T[], void (*)(void*)> p(static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64)), std::free);
  std::fill_n(p.get(), n, fill);
  return p;
}

void register_decode() {
  benchmark::RegisterBenchmark("decode/gemv_bf16", [](benchmark::State& st) {
    // 16 matrices of 8192 x 2048 bf16 (32 MiB each), visited in turn, as a decode step visits layers.
    const int N = 8192, K = 2048, count = int(kStreamBytes / (size_t(N) * K * 2));
    // 8 bytes past a line, as safetensors data usually is.
    auto w = aligned_buffer<uint16_t>(size_t(count) * N * K + 4, f32_to_bf16(0.01f));
    auto x = random_floats(K);
    std::vector<float> y(N);
    for (auto _ : st) {
      for (int i = 0; i < count; ++i)
        matmul(x.data(), 1, WeightMatrix{DType::BF16, w.get() + 4 + size_t(i) * N * K, N, K}, nullptr, y.data(), pool());
      benchmark::ClobberMemory();
    }
    st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(kStreamBytes));
  })->UseRealTime()->Unit(benchmark::kMillisecond);
  // decode/gemv_panels_{f32x,bf16x}: decode/gemv_bf16's stream (as many 8192 x 2048 matrices) in
  // panels, as a load packs BF16 weights on AVX-512 and AVX2 (kernels/panels.h), x in float32 and
  // rounded to bf16.
  for (const char* mode : {"f32x", "bf16x"})
    benchmark::RegisterBenchmark((std::string("decode/gemv_panels_") + mode).c_str(),
                                 [bf16x = std::string(mode) == "bf16x"](benchmark::State& st) {
      if (!panels_wanted()) return st.SkipWithError("this CPU's kernels keep BF16 rows");
      const int N = 8192, K = 2048, count = int(kStreamBytes / (size_t(N) * K * 2));
      const std::vector<uint8_t>& src = bench_weights("bf16", N, K);
      auto w = aligned_buffer<uint16_t>(size_t(count) * N * K, 0);
      for (int i = 0; i < count; ++i)
        pack_panels(WeightMatrix{DType::BF16, src.data(), N, K}, w.get() + size_t(i) * N * K, pool());
      auto x = random_floats(K);
      std::vector<float> y(N);
      const PanelsBf16X mode(bf16x);
      for (auto _ : st) {
        for (int i = 0; i < count; ++i)
          panels_matmul(x.data(), 1, panels_matrix(w.get() + size_t(i) * N * K, N, K), nullptr, y.data(), pool());
        benchmark::ClobberMemory();
      }
      st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(count) * int64_t(N) * K * 2);
    })->UseRealTime()->Unit(benchmark::kMillisecond);
  // decode/gemv_affine{4,6,8}p: the load's packed copies (kernels/affine.h, affine_pack).
  for (int bits : {4, 6, 8})
    for (bool packed : {false, true}) {
      const std::string name = "decode/gemv_affine" + std::to_string(bits) + (packed ? "p" : "");
      benchmark::RegisterBenchmark(name.c_str(), [bits, packed](benchmark::State& st) {
        // Matrices of 8192 x 2048 codes (group 64, bf16 scales) filling kStreamBytes.
        const int N = 8192, K = 2048;
        std::vector<std::unique_ptr<AffineBench>> ms;
        for (size_t n = 0; n < kStreamBytes; n += ms.back()->w.nbytes()) {
          ms.push_back(std::make_unique<AffineBench>(bits, N, K));
          if (packed) ms.back()->pack();
        }
        auto x = random_floats(K);
        std::vector<float> y(N);
        for (auto _ : st) {
          for (const auto& m : ms) matmul(x.data(), 1, m->w, nullptr, y.data(), pool());
          benchmark::ClobberMemory();
        }
        st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(ms.size()) * int64_t(ms[0]->w.nbytes()));
      })->UseRealTime()->Unit(benchmark::kMillisecond);
    }
  // decode/gemv_ggml_<type>[p]: 8192 x 2048 matrices of llama.cpp's blocks, copies of one (the
  // K-quant reference quantizers are slow) filling kStreamBytes; "p": packed as a load packs them.
  for (const char* type : {"Q4_0", "Q8_0", "Q4_K", "Q6_K", "Q5_0", "Q5_K", "Q4_1", "Q5_1"})
    for (bool packed : {false, true}) {
      const std::string name = std::string("decode/gemv_ggml_") + type + (packed ? "p" : "");
      benchmark::RegisterBenchmark(name.c_str(), [type = std::string(type), packed](benchmark::State& st) {
        const int N = 8192, K = 2048;
        WeightMatrix m = ggml_matrix(ggml_type_by_name(type), bench_weights("ggml_" + type, N, K).data(), N, K);
        if (packed && !ggml_pack_wanted(m.ggml)) return st.SkipWithError("this CPU's kernels read it in the file's layout");
        const size_t bytes = packed ? ggml_packed_bytes(m) : m.nbytes();
        const int count = int(kStreamBytes / bytes);
        auto w = aligned_buffer<uint8_t>(size_t(count) * bytes, 0);
        if (packed) ggml_pack(m, w.get(), 0, N / kGgmlPackRows);
        else std::memcpy(w.get(), m.data, bytes);
        for (int i = 1; i < count; ++i) std::memcpy(w.get() + size_t(i) * bytes, w.get(), bytes);
        auto x = random_floats(K);
        std::vector<float> y(N);
        for (auto _ : st) {
          for (int i = 0; i < count; ++i) {
            const uint8_t* p = w.get() + size_t(i) * bytes;
            matmul(x.data(), 1, packed ? ggml_packed_matrix(m.ggml, p, N, K) : ggml_matrix(m.ggml, p, N, K), nullptr,
                   y.data(), pool());
          }
          benchmark::ClobberMemory();
        }
        st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(count) * int64_t(bytes));
      })->UseRealTime()->Unit(benchmark::kMillisecond);
    }
  benchmark::RegisterBenchmark("decode/read", [](benchmark::State& st) {
    const size_t n = kStreamBytes / sizeof(float);
    auto buf = aligned_buffer<float>(n, 0.5f);
    for (auto _ : st) {
      pool().parallel_for(
          n, [&](size_t b, size_t e) { benchmark::DoNotOptimize(dot(buf.get() + b, buf.get() + b, int(e - b))); }, 4096);
      benchmark::ClobberMemory();
    }
    st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(kStreamBytes));
  })->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("threadpool/empty_parallel_for", [](benchmark::State& st) {
    for (auto _ : st) pool().parallel_for(64, [](size_t, size_t) {});
  });
}

}  // namespace
}  // namespace ptllm

int main(int argc, char** argv) {
  using namespace ptllm;
  benchmark::AddCustomContext("simd_target", std::string(simd_target_name(active_simd_target())));
  benchmark::AddCustomContext("threads", std::to_string(bench_threads()));
  if (openblas().corename) benchmark::AddCustomContext("openblas_core", openblas().corename());
  register_kernels();
  register_prefill();
  register_products();
  register_ggml_products();
  register_panel_products();
  register_affine_products();
  register_decode();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
