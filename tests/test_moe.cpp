// Mixture-of-experts blocks (model/moe.h): routing as transformers' Qwen3MoeSparseMoeBlock computes
// it, the config fields, the grouped expert products against a plain reference in every weight
// format, that a decode step reads the selected experts' bytes only (the others' pages are made
// unreadable), and that a prefill reads each chosen expert once (its pages' faults counted).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/ggml.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/moe.h"
#include "model/quantize.h"
#include "test_util.h"

namespace ptllm {
namespace {

TEST(MoeRoute, SoftmaxTopKByHand) {
  // softmax(1, 3, 2, 0): e^x / (1 + e + e^2 + e^3) = 0.0320586, 0.0871443, 0.2368828, 0.6439142
  const float logits[] = {1.f, 3.f, 2.f, 0.f};
  int ex[2];
  float w[2];
  moe_route(logits, 4, 2, false, ex, w);
  EXPECT_EQ(ex[0], 1);
  EXPECT_EQ(ex[1], 2);
  EXPECT_NEAR(w[0], 0.6439142f, 1e-6);
  EXPECT_NEAR(w[1], 0.2368828f, 1e-6);
  // norm_topk_prob: e^3 / (e^3 + e^2) = sigmoid(1) = 0.7310586
  moe_route(logits, 4, 2, true, ex, w);
  EXPECT_NEAR(w[0], 0.7310586f, 1e-6);
  EXPECT_NEAR(w[1], 0.2689414f, 1e-6);
  EXPECT_NEAR(w[0] + w[1], 1.f, 1e-6);
  // top-1 of three, normalized: weight 1
  moe_route(logits, 4, 1, true, ex, w);
  EXPECT_EQ(ex[0], 1);
  EXPECT_FLOAT_EQ(w[0], 1.f);
}

TEST(MoeRoute, TiesTakeTheLowerIndexAndLargeLogitsStayFinite) {
  const float logits[] = {0.5f, 2.f, 2.f, -1.f, 2.f};
  int ex[3];
  float w[3];
  moe_route(logits, 5, 3, false, ex, w);
  EXPECT_EQ(ex[0], 1);
  EXPECT_EQ(ex[1], 2);
  EXPECT_EQ(ex[2], 4);
  const float big[] = {1000.f, 999.f, -1000.f};  // exp would overflow without the max subtracted
  moe_route(big, 3, 2, false, ex, w);
  EXPECT_EQ(ex[0], 0);
  EXPECT_NEAR(w[0], 1.f / (1.f + std::exp(-1.f)), 1e-6);
  EXPECT_NEAR(w[1], std::exp(-1.f) / (1.f + std::exp(-1.f)), 1e-6);
}

nlohmann::json moe_json() {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"vocab_size", 100},
          {"hidden_size", 64},
          {"intermediate_size", 128},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 32},
          {"num_experts", 8},
          {"num_experts_per_tok", 2},
          {"moe_intermediate_size", 32},
          {"norm_topk_prob", true},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", {1}}};
}

TEST(MoeConfig, ReadsTheFieldsAndWhichLayersAreSparse) {
  const ModelConfig c = ModelConfig::from_json(moe_json(), "config.json");
  EXPECT_EQ(c.arch, Architecture::Qwen3Moe);
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.intermediate_size, 32);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_TRUE(c.moe.sparse(0));
  EXPECT_FALSE(c.moe.sparse(1));  // mlp_only_layers
  EXPECT_TRUE(c.moe.sparse(2));
  auto j = moe_json();
  j["decoder_sparse_step"] = 2;  // (l + 1) % 2 == 0: layers 1 and 3, and 1 is mlp-only
  j.erase("norm_topk_prob");     // Qwen3MoeConfig's default: false
  const ModelConfig d = ModelConfig::from_json(j, "config.json");
  EXPECT_FALSE(d.moe.norm_topk_prob);
  EXPECT_FALSE(d.moe.sparse(0));
  EXPECT_FALSE(d.moe.sparse(1));
  EXPECT_FALSE(d.moe.sparse(2));
  EXPECT_TRUE(d.moe.sparse(3));
}

void expect_refused(nlohmann::json j, const std::string& field) {
  try {
    ModelConfig::from_json(j, "cfg.json");
    ADD_FAILURE() << "accepted " << j.dump();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + field + "'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
  }
}

TEST(MoeConfig, RefusesWhatItDoesNotImplementByName) {
  auto j = moe_json();
  j["shared_expert_intermediate_size"] = 256;
  expect_refused(j, "shared_expert_intermediate_size");
  j = moe_json();
  j["num_experts_per_tok"] = 9;
  expect_refused(j, "num_experts_per_tok");
  j = moe_json();
  j["mlp_only_layers"] = {4};
  expect_refused(j, "mlp_only_layers[0]");
  j = moe_json();
  j["scoring_func"] = "sigmoid";
  expect_refused(j, "scoring_func");
  j = moe_json();
  j["norm_topk_prob"] = "yes";
  expect_refused(j, "norm_topk_prob");
  j = moe_json();
  j["num_experts"] = 0;
  expect_refused(j, "num_experts");
  // Without num_experts_per_tok the default top-8 cannot choose among 6 experts (found by fuzz_config).
  j = moe_json();
  j["num_experts"] = 6;
  j.erase("num_experts_per_tok");
  expect_refused(j, "num_experts_per_tok");
  // A shared expert of width 0 is none: accepted
  j = moe_json();
  j["shared_expert_intermediate_size"] = 0;
  EXPECT_NO_THROW(ModelConfig::from_json(j, "cfg.json"));
}

// A stack of E experts' three matrices in one format, with the float values they hold.
struct Experts {
  int E, H, I;
  std::vector<float> router;               // [E][H]
  std::vector<std::vector<float>> g, u, d;  // per expert, as dequantized
  MoeWeights w;
  std::vector<std::vector<uint8_t>> bytes;  // storage
};

// Each expert's matrices stored in `fmt` ("f32", "bf16", "q4", "Q4_K", "Q6_K", "Q8_0").
Experts make_experts(int E, int H, int I, const std::string& fmt, uint32_t seed) {
  Experts x{E, H, I, {}, {}, {}, {}, {}, {}};
  x.router = test::normal(size_t(E) * size_t(H), 1.f, seed);
  x.w.router = dense_matrix(DType::F32, x.router.data(), E, H);
  x.bytes.reserve(size_t(E) * 3);
  auto store = [&](const std::vector<float>& v, int rows, int cols, std::vector<float>& held) -> WeightMatrix {
    held = v;
    std::vector<uint8_t> b;
    WeightMatrix m;
    if (fmt == "f32") {
      b.resize(v.size() * 4);
      std::memcpy(b.data(), v.data(), b.size());
      x.bytes.push_back(std::move(b));
      return dense_matrix(DType::F32, x.bytes.back().data(), rows, cols);
    }
    if (fmt == "bf16") {
      b.resize(v.size() * 2);
      store_as_ref(v.data(), b.data(), DType::BF16, int(v.size()));
      x.bytes.push_back(std::move(b));
      m = dense_matrix(DType::BF16, x.bytes.back().data(), rows, cols);
    } else if (fmt == "q4") {
      const AffineSpec s{4, 32};
      const size_t codes = size_t(rows) * size_t(cols) / 8 * 4, groups = size_t(rows) * size_t(cols / 32) * 4;
      b.resize(codes + 2 * groups);
      affine_quantize_rows(v.data(), rows, cols, s, QuantMethod::Rtn, DType::F32, reinterpret_cast<uint32_t*>(b.data()),
                           b.data() + codes, b.data() + codes + groups);
      x.bytes.push_back(std::move(b));
      uint8_t* p = x.bytes.back().data();
      m = affine_matrix(p, p + codes, p + codes + groups, DType::F32, 4, 32, rows, cols);
    } else {
      const GgmlType t = ggml_type_by_name(fmt);
      const GgmlTypeInfo info = ggml_type_info(t);
      const size_t rb = size_t(cols) / size_t(info.block_elems) * size_t(info.block_bytes);
      b.resize(rb * size_t(rows));
      for (int r = 0; r < rows; ++r) ggml_quantize_row(t, v.data() + size_t(r) * size_t(cols), cols, b.data() + rb * size_t(r));
      x.bytes.push_back(std::move(b));
      m = ggml_matrix(t, x.bytes.back().data(), rows, cols);
    }
    for (int r = 0; r < rows; ++r) weight_row(m, r, held.data() + size_t(r) * size_t(cols));  // as stored
    return m;
  };
  x.g.resize(size_t(E));
  x.u.resize(size_t(E));
  x.d.resize(size_t(E));
  for (int e = 0; e < E; ++e) {
    x.w.gate.push_back(store(test::normal(size_t(I) * size_t(H), 0.2f, seed + 10 + uint32_t(e)), I, H, x.g[size_t(e)]));
    x.w.up.push_back(store(test::normal(size_t(I) * size_t(H), 0.2f, seed + 100 + uint32_t(e)), I, H, x.u[size_t(e)]));
    x.w.down.push_back(store(test::normal(size_t(H) * size_t(I), 0.2f, seed + 1000 + uint32_t(e)), H, I, x.d[size_t(e)]));
  }
  return x;
}

// The block as transformers writes it: every expert looped over, its rows' outputs added (double).
std::vector<float> reference(const Experts& x, const MoeConfig& c, const std::vector<float>& in, int T) {
  const int E = x.E, H = x.H, I = x.I;
  std::vector<float> out(size_t(T) * size_t(H), 0.f);
  for (int t = 0; t < T; ++t) {
    const float* r = in.data() + size_t(t) * size_t(H);
    std::vector<float> logits(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
      double s = 0;
      for (int j = 0; j < H; ++j) s += double(x.router[size_t(e) * size_t(H) + size_t(j)]) * r[j];
      logits[size_t(e)] = float(s);
    }
    std::vector<int> ex(static_cast<size_t>(c.top_k));
    std::vector<float> w(static_cast<size_t>(c.top_k));
    moe_route(logits.data(), E, c.top_k, c.norm_topk_prob, ex.data(), w.data());
    for (int j = 0; j < c.top_k; ++j) {
      const size_t e = size_t(ex[size_t(j)]);
      std::vector<double> act(static_cast<size_t>(I));
      for (int i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int q = 0; q < H; ++q) {
          g += double(x.g[e][size_t(i) * size_t(H) + size_t(q)]) * r[q];
          u += double(x.u[e][size_t(i) * size_t(H) + size_t(q)]) * r[q];
        }
        act[size_t(i)] = g / (1 + std::exp(-g)) * u;
      }
      for (int h = 0; h < H; ++h) {
        double s = 0;
        for (int i = 0; i < I; ++i) s += double(x.d[e][size_t(h) * size_t(I) + size_t(i)]) * act[size_t(i)];
        out[size_t(t) * size_t(H) + size_t(h)] += float(double(w[size_t(j)]) * s);
      }
    }
  }
  return out;
}

MoeConfig small_config(int E, int k, int I, bool norm) {
  MoeConfig c;
  c.num_experts = E;
  c.top_k = k;
  c.intermediate_size = I;
  c.norm_topk_prob = norm;
  return c;
}

// The quantized formats' products round x to 8 bits as well (Q4_K, Q6_K against Q8_K activations, Q8_0
// against Q8_0, the affine kernels' int8 path): a looser bound, still far below what a wrong expert or
// weight would give (errors of order 1).
float tolerance(const std::string& fmt) { return fmt == "f32" || fmt == "bf16" ? 2e-4f : 4e-2f; }

TEST(MoeForward, MatchesTheReferenceInEveryFormatForDecodeAndBatches) {
  ThreadPool pool(4);
  const int E = 8, H = 256, I = 256;  // 256: a whole K-quant super-block
  for (const std::string fmt : {"f32", "bf16", "q4", "Q4_K", "Q6_K", "Q8_0", "Q4_0"}) {
    const Experts x = make_experts(E, H, I, fmt, 7);
    for (bool norm : {true, false}) {
      const MoeConfig c = small_config(E, 2, I, norm);
      for (int T : {1, 2, 5, 33}) {  // one row; few (single-row experts); many (gathered experts)
        const std::vector<float> in = test::normal(size_t(T) * size_t(H), 1.f, 99 + uint32_t(T));
        std::vector<float> out(size_t(T) * size_t(H));
        MoeScratch s;
        moe_forward(x.w, c, in.data(), T, H, out.data(), s, pool);
        const std::vector<float> ref = reference(x, c, in, T);
        double num = 0, den = 0;
        for (size_t i = 0; i < out.size(); ++i) {
          num += (out[i] - ref[i]) * (out[i] - ref[i]);
          den += ref[i] * ref[i];
        }
        EXPECT_LT(std::sqrt(num / den), tolerance(fmt)) << fmt << " T=" << T << " norm=" << norm;
      }
    }
  }
}

TEST(MoeForward, RowsRoutedToOneExpertShareOnePass) {
  ThreadPool pool(2);
  const int E = 8, H = 64, I = 32, T = 16;
  const Experts x = make_experts(E, H, I, "f32", 3);
  const MoeConfig c = small_config(E, 2, I, true);
  const std::vector<float> in = test::normal(size_t(T) * size_t(H), 1.f, 5);
  // The experts the rows pick, from the router's logits computed here.
  std::set<int> chosen;
  for (int t = 0; t < T; ++t) {
    std::vector<float> logits(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) logits[size_t(e)] = dot_ref(x.router.data() + size_t(e) * H, in.data() + size_t(t) * H, H);
    int ex[2];
    float w[2];
    moe_route(logits.data(), E, 2, true, ex, w);
    chosen.insert(ex[0]);
    chosen.insert(ex[1]);
  }
  MoeCounters n;
  n.passes_by_expert.assign(size_t(E), 0);
  MoeScratch s;
  std::vector<float> out(size_t(T) * size_t(H));
  moe_forward(x.w, c, in.data(), T, H, out.data(), s, pool, &n, 0);
  EXPECT_EQ(n.expert_passes, int64_t(chosen.size()));  // 16 rows x 2 = 32 products, one pass per expert
  EXPECT_EQ(n.expert_rows, int64_t(T) * 2);
  for (int e = 0; e < E; ++e) EXPECT_EQ(n.passes_by_expert[size_t(e)], chosen.count(e) ? 1 : 0) << e;
  EXPECT_EQ(n.expert_bytes, int64_t(chosen.size()) * 3 * I * H * 4);
}

// Experts in pages of their own (mmap), the unselected ones made unreadable: a decode step that
// touched any byte of them would fault.
struct PagedExperts {
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  size_t per_matrix = 0;  // bytes of one expert's matrix, rounded up to pages
  uint8_t* base = nullptr;
  size_t total = 0;
  MoeWeights w;
  PagedExperts(const Experts& x) {
    const size_t m = size_t(x.H) * size_t(x.I) * 4;
    per_matrix = (m + page - 1) / page * page;
    total = per_matrix * 3 * size_t(x.E);
    base = static_cast<uint8_t*>(mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    PTLLM_CHECK(base != MAP_FAILED);
    w.router = x.w.router;
    for (int e = 0; e < x.E; ++e) {
      uint8_t* p = expert(e);
      std::memcpy(p, x.g[size_t(e)].data(), m);
      std::memcpy(p + per_matrix, x.u[size_t(e)].data(), m);
      std::memcpy(p + 2 * per_matrix, x.d[size_t(e)].data(), m);
      w.gate.push_back(dense_matrix(DType::F32, p, x.I, x.H));
      w.up.push_back(dense_matrix(DType::F32, p + per_matrix, x.I, x.H));
      w.down.push_back(dense_matrix(DType::F32, p + 2 * per_matrix, x.H, x.I));
    }
  }
  ~PagedExperts() { munmap(base, total); }
  uint8_t* expert(int e) const { return base + size_t(e) * 3 * per_matrix; }
  void protect(int e, bool readable) const {
    PTLLM_CHECK(mprotect(expert(e), 3 * per_matrix, readable ? PROT_READ : PROT_NONE) == 0);
  }
};

std::vector<int> routed(const Experts& x, const float* row, int k) {
  std::vector<float> logits(static_cast<size_t>(x.E));
  for (int e = 0; e < x.E; ++e) logits[size_t(e)] = dot_ref(x.router.data() + size_t(e) * size_t(x.H), row, x.H);
  std::vector<int> ex(static_cast<size_t>(k));
  std::vector<float> w(static_cast<size_t>(k));
  moe_route(logits.data(), x.E, k, true, ex.data(), w.data());
  return ex;
}

TEST(MoeForward, ADecodeStepReadsOnlyTheSelectedExperts) {
  ThreadPool pool(4);
  const int E = 16, H = 64, I = 64, k = 2;  // each matrix 16 KiB: four pages
  const Experts x = make_experts(E, H, I, "f32", 11);
  const MoeConfig c = small_config(E, k, I, true);
  PagedExperts paged(x);
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    const std::vector<float> in = test::normal(size_t(H), 1.f, seed);
    const std::vector<int> sel = routed(x, in.data(), k);
    for (int e = 0; e < E; ++e)
      if (std::find(sel.begin(), sel.end(), e) == sel.end()) paged.protect(e, false);
    std::vector<float> out(static_cast<size_t>(H));
    MoeScratch s;
    MoeCounters n;
    moe_forward(paged.w, c, in.data(), 1, H, out.data(), s, pool, &n);
    EXPECT_EQ(n.expert_bytes, int64_t(k) * 3 * H * I * 4);  // k of E experts' bytes
    const std::vector<float> ref = reference(x, c, in, 1);
    for (int h = 0; h < H; ++h) EXPECT_NEAR(out[size_t(h)], ref[size_t(h)], 1e-4f * (1 + std::fabs(ref[size_t(h)])));
    for (int e = 0; e < E; ++e) paged.protect(e, true);
  }
}

// The pages of a region read, counted by their faults: every page is unreadable but the last kWindow
// ones read, so a pass over a matrix much larger than the window faults once per page, and every
// further pass over it faults again. One thread at a time (the handler keeps no lock).
struct PageReads {
  static constexpr int kWindow = 16;
  static inline uint8_t* base = nullptr;
  static inline size_t size = 0, page = 0;
  static inline uint8_t* window[kWindow] = {};
  static inline int held = 0;
  static inline int64_t faults = 0;
  struct sigaction old {};

  PageReads(uint8_t* b, size_t n) {
    base = b;
    size = n;
    page = size_t(sysconf(_SC_PAGESIZE));
    held = 0;
    faults = 0;
    PTLLM_CHECK(mprotect(base, size, PROT_NONE) == 0);
    struct sigaction sa {};
    sa.sa_sigaction = &on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    PTLLM_CHECK(sigaction(SIGSEGV, &sa, &old) == 0);
  }
  ~PageReads() {
    sigaction(SIGSEGV, &old, nullptr);
    mprotect(base, size, PROT_READ | PROT_WRITE);
  }
  void reset() {
    PTLLM_CHECK(mprotect(base, size, PROT_NONE) == 0);
    held = 0;
    faults = 0;
  }
  static void on_fault(int, siginfo_t* si, void*) {
    auto* a = static_cast<uint8_t*>(si->si_addr);
    if (a < base || a >= base + size) {  // not ours: the default action on return
      signal(SIGSEGV, SIG_DFL);
      return;
    }
    uint8_t* p = base + size_t(a - base) / page * page;
    if (held == kWindow) {
      mprotect(window[0], page, PROT_NONE);
      for (int i = 1; i < kWindow; ++i) window[i - 1] = window[i];
      --held;
    }
    window[held++] = p;
    mprotect(p, page, PROT_READ);
    ++faults;
  }
};

TEST(MoeForward, APrefillReadsEachChosenExpertOnce) {
  ThreadPool pool(1);  // one thread faults at a time
  const int E = 8, H = 512, I = 256, k = 2, T = 16;  // each matrix 512 KiB: 128 pages, 8 windows
  const Experts x = make_experts(E, H, I, "f32", 21);
  const MoeConfig c = small_config(E, k, I, true);
  PagedExperts paged(x);
  const std::vector<float> in = test::normal(size_t(T) * size_t(H), 1.f, 8);
  std::map<int, int> rows_of;  // chosen expert -> rows routed to it
  for (int t = 0; t < T; ++t)
    for (int e : routed(x, in.data() + size_t(t) * size_t(H), k)) ++rows_of[e];
  int64_t one_pass = 0, per_row = 0;
  for (const auto& [e, n] : rows_of) {
    one_pass += int64_t(3 * paged.per_matrix / size_t(sysconf(_SC_PAGESIZE)));
    per_row += int64_t(n) * int64_t(3 * paged.per_matrix / size_t(sysconf(_SC_PAGESIZE)));
  }
  ASSERT_GT(per_row, 2 * one_pass);  // the rows share experts: a pass per row would read far more

  std::vector<float> out(size_t(T) * size_t(H));
  MoeScratch s;
  int64_t batched = 0, row_by_row = 0;
  {
    PageReads reads(paged.base, paged.total);
    moe_forward(paged.w, c, in.data(), T, H, out.data(), s, pool);
    batched = PageReads::faults;
    // the control: the same rows one call each read every chosen expert once per row
    reads.reset();
    std::vector<float> one(static_cast<size_t>(H));
    for (int t = 0; t < T; ++t) moe_forward(paged.w, c, in.data() + size_t(t) * size_t(H), 1, H, one.data(), s, pool);
    row_by_row = PageReads::faults;
  }
  RecordProperty("one_pass_pages", std::to_string(one_pass));
  RecordProperty("batched_faults", std::to_string(batched));
  RecordProperty("row_by_row_faults", std::to_string(row_by_row));
  EXPECT_GE(batched, one_pass);
  EXPECT_LE(batched, one_pass + one_pass / 8) << "one pass: " << one_pass << " pages";
  EXPECT_GE(row_by_row, per_row);
  const std::vector<float> ref = reference(x, c, in, T);  // and the result is the block's
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  EXPECT_LT(std::sqrt(num / den), 2e-4);
}

TEST(MoeForwardDeathTest, TouchingAProtectedSelectedExpertFaults) {
  // The control of the test above: the protection does catch a read of a selected expert.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int E = 16, H = 64, I = 64, k = 2;
  const Experts x = make_experts(E, H, I, "f32", 11);
  const MoeConfig c = small_config(E, k, I, true);
  const std::vector<float> in = test::normal(size_t(H), 1.f, 1);
  const std::vector<int> sel = routed(x, in.data(), k);
  EXPECT_DEATH(
      {
        ThreadPool pool(1);
        PagedExperts paged(x);
        paged.protect(sel[1], false);
        std::vector<float> out(static_cast<size_t>(H));
        MoeScratch s;
        moe_forward(paged.w, c, in.data(), 1, H, out.data(), s, pool);
      },
      "");
}

}  // namespace
}  // namespace ptllm
