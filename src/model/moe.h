#pragma once
// Mixture-of-experts feed-forward blocks (Qwen3-MoE, transformers' Qwen3MoeSparseMoeBlock): a router
// picks top-k of E experts per token, each expert a SwiGLU MLP; the block's output is the experts'
// outputs weighted by the router's probabilities. Only the selected experts' weights are read: a
// decode step's cost is k experts' bytes, not E.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kernels/weights.h"

namespace ptllm {

class ThreadPool;

// The most experts a token is routed to (Qwen3-MoE: 8).
inline constexpr int kMaxTopK = 64;

// config.json's MoE fields (Qwen3MoeConfig). num_experts == 0: no MoE layer.
struct MoeConfig {
  int num_experts = 0;
  int top_k = 0;                  // num_experts_per_tok
  int intermediate_size = 0;      // moe_intermediate_size: each expert's width
  bool norm_topk_prob = false;    // the k selected probabilities renormalized to sum to 1
  int decoder_sparse_step = 1;    // layer l is sparse when (l + 1) % step == 0 ...
  std::vector<int> mlp_only_layers;  // ... and l is not listed here (those take the dense MLP)

  bool enabled() const { return num_experts > 0; }
  // Whether layer l has experts (Qwen3MoeDecoderLayer's test), else the dense MLP of intermediate_size.
  bool sparse(int layer) const;
};

// Reads the MoE fields of a Qwen3-MoE config.json into `moe`; throws ptllm::Error naming the file and
// the field for a value out of range or a feature that changes the math and is not implemented
// (shared experts, another gating function). n_layers: num_hidden_layers (mlp_only_layers' bound).
void parse_moe_config(const nlohmann::json& j, const std::string& file, int n_layers, MoeConfig& moe);

// One token's routing, as Qwen3MoeSparseMoeBlock computes it: probabilities = softmax(logits) in
// float32, the k largest (ties: the lower expert index first), divided by their sum when
// norm_topk_prob. logits: [E]; experts, weights: [k], largest probability first.
void moe_route(const float* logits, int num_experts, int top_k, bool norm_topk_prob, int* experts, float* weights);

// An MoE layer's weights, read in place in any weight format. Stacked layouts (transformers 5's fused
// gate_up_proj, mlx-lm's switch_mlp, GGUF's *_exps) are views into the one tensor, expert by expert.
struct MoeWeights {
  WeightMatrix router;                       // [E][hidden]
  std::vector<WeightMatrix> gate, up, down;  // [E] of [inter][hidden], [inter][hidden], [hidden][inter]
  bool present() const { return !gate.empty(); }
};

// Expert e of a stack of E matrices of [rows][cols] stored one after another (data, and an affine
// stack's scales and biases): `stack` describes the whole [E * rows][cols].
WeightMatrix stacked_expert(const WeightMatrix& stack, int e, int rows);

// What the expert products of forward calls read (a test's or a benchmark's view); add to it, never reset.
struct MoeCounters {
  int64_t expert_passes = 0;  // expert MLPs applied (one pass over an expert's three matrices)
  int64_t expert_rows = 0;    // rows they multiplied (a row routed to k experts counts k times)
  int64_t expert_bytes = 0;   // bytes of the experts' matrices read
  std::vector<int64_t> passes_by_expert;  // [layers * E] when sized by the caller, else untouched
};

// Reused buffers of moe_forward (no allocation once warmed up).
struct MoeScratch {
  std::vector<float> logits;      // [T][E]
  std::vector<int> experts;       // [T][k]
  std::vector<float> weights;     // [T][k]
  std::vector<int> order, start;  // rows grouped by expert
  std::vector<float> xg, h, u, y; // gathered rows and their products
  std::vector<float> out;         // [T][hidden] the block's output (Model::forward's)
};

// out[t] = sum over the k experts e routed for row t of weight(t, e) * down_e(silu(gate_e x_t) * up_e x_t)
// x, out: [T][hidden]. The rows routed to one expert are gathered and multiplied in one pass over its
// weights; the experts taking a single row (every expert of a decode step) run as one parallel pass
// over their row blocks. layer: for counters->passes_by_expert.
void moe_forward(const MoeWeights& w, const MoeConfig& cfg, const float* x, int T, int hidden, float* out,
                 MoeScratch& s, ThreadPool& pool, MoeCounters* counters = nullptr, int layer = 0);

}  // namespace ptllm
