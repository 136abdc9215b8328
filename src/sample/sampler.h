#pragma once
// Token samplers: the penalties (repetition, presence, frequency) first, then greedy at temperature
// 0; otherwise top-k -> top-p -> min-p ->
// temperature -> a draw from a seeded RNG (llama.cpp's order).
#include <cstdint>
#include <span>
#include <vector>

namespace ptllm {

struct SamplingConfig {
  float temperature = 0.8f;   // 0 = greedy
  int top_k = 40;             // 0 = off
  float top_p = 0.95f;        // 1 = off
  float min_p = 0.05f;        // 0 = off
  float repeat_penalty = 1.0f;  // 1 = off
  int repeat_last_n = 64;     // tokens of history the penalties look at
  // OpenAI's (and llama.cpp's) additive penalties over the same tokens: a token's logit loses
  // frequency_penalty per time it occurs and presence_penalty once if it occurs at all. 0 = off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
};

// splitmix64-seeded xoshiro256**: the same stream on every platform for a given seed.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform();  // [0, 1)
 private:
  uint64_t s_[4];
};

class Sampler {
 public:
  explicit Sampler(const SamplingConfig& cfg);
  // logits [vocab] may be modified (penalties). history: tokens so far (prompt + generated).
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);
  const SamplingConfig& config() const { return cfg_; }

 private:
  SamplingConfig cfg_;
  Rng rng_;
  // Scratch reused across steps: no allocation per step after the first.
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<float> prob_;
  std::vector<int32_t> count_;
};

// Index of the largest logit (the first one on ties, as torch.argmax).
int32_t argmax(std::span<const float> logits);

}  // namespace ptllm
