// Samplers: greedy, seeded reproducibility, the cuts (top-k, top-p, min-p), temperature and the
// repetition penalty, checked on outcomes and on empirical frequencies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "sample/sampler.h"

namespace ptllm {
namespace {

// argmax is std::max_element's index (the first of the largest) for vocabularies of any length, ties
// (+0 and -0 among them), infinities and NaNs (a leading NaN wins there, a later one is passed over).
TEST(Argmax, SameIndexAsMaxElement) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  for (size_t n : {1u, 2u, 15u, 16u, 17u, 63u, 64u, 65u, 1000u, 8192u, 32003u}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> x(n);
      for (float& v : x) v = u(rng);
      const int kind = trial % 8;
      if (kind == 1) x[rng() % n] = 10.f, x[rng() % n] = 10.f;  // two equal maxima
      if (kind == 2) std::fill(x.begin(), x.end(), 0.f), x[rng() % n] = -0.f;
      if (kind == 3) x[rng() % n] = NAN;
      if (kind == 4) x[0] = NAN;
      if (kind == 5) std::fill(x.begin(), x.end(), -INFINITY);
      if (kind == 6) x[rng() % n] = INFINITY, x[n - 1] = INFINITY;
      if (kind == 7) x[n - 1] = 100.f;
      const int32_t want = int32_t(std::max_element(x.begin(), x.end()) - x.begin());
      EXPECT_EQ(argmax(x), want) << "n " << n << " kind " << kind;
    }
  }
}

std::vector<float> logits_of(std::vector<double> probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

std::map<int32_t, int> histogram(const SamplingConfig& cfg, const std::vector<float>& logits, int n,
                                 const std::vector<int32_t>& history = {}) {
  Sampler s(cfg);
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    ++h[s.sample(l, history)];
  }
  return h;
}

SamplingConfig plain(float temperature, uint64_t seed = 1) {
  SamplingConfig c;
  c.temperature = temperature;
  c.top_k = 0;
  c.top_p = 1.f;
  c.min_p = 0.f;
  c.seed = seed;
  return c;
}

const std::vector<float> kLogits = logits_of({0.5, 0.25, 0.15, 0.07, 0.03});

TEST(SamplerTest, TemperatureZeroIsArgmax) {
  std::vector<float> l = {0.1f, 2.f, 2.f, -1.f};
  Sampler s(plain(0.f));
  EXPECT_EQ(s.sample(l, {}), 1);  // first of equal maxima, as torch.argmax
}

TEST(SamplerTest, FrequenciesFollowTheDistribution) {
  auto h = histogram(plain(1.f), kLogits, 40000);
  const double want[] = {0.5, 0.25, 0.15, 0.07, 0.03};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(h[i] / 40000.0, want[i], 0.01) << i;
}

TEST(SamplerTest, TemperatureSharpensAndFlattens) {
  auto cold = histogram(plain(0.5f), kLogits, 20000);
  auto hot = histogram(plain(2.f), kLogits, 20000);
  // p^(1/T) normalized: T=0.5 gives 0.25/(0.25+0.0625+0.0225+0.0049+0.0009) = 0.734 for the top token
  EXPECT_NEAR(cold[0] / 20000.0, 0.734, 0.015);
  EXPECT_LT(hot[0] / 20000.0, 0.40);
  EXPECT_GT(hot[4], cold[4]);
}

TEST(SamplerTest, SameSeedSameStreamOtherSeedOtherStream) {
  auto draw = [](uint64_t seed) {
    Sampler s(plain(1.f, seed));
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      std::vector<float> l = kLogits;
      out.push_back(s.sample(l, {}));
    }
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(SamplerTest, TopKKeepsOnlyTheKMostLikely) {
  SamplingConfig c = plain(1.f);
  c.top_k = 2;
  auto h = histogram(c, kLogits, 6000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_NEAR(h[0] / 6000.0, 0.5 / 0.75, 0.03);
}

TEST(SamplerTest, TopPKeepsTheSmallestNucleus) {
  SamplingConfig c = plain(1.f);
  c.top_p = 0.8f;  // 0.5 + 0.25 = 0.75 < 0.8, so the third token is needed
  auto h = histogram(c, kLogits, 6000);
  EXPECT_EQ(h.size(), 3u);
  EXPECT_EQ(h.count(3), 0u);
}

TEST(SamplerTest, MinPDropsTokensBelowAFractionOfTheTop) {
  SamplingConfig c = plain(1.f);
  c.min_p = 0.2f;  // threshold 0.1: tokens 0, 1, 2 stay
  auto h = histogram(c, kLogits, 6000);
  EXPECT_EQ(h.size(), 3u);
  EXPECT_EQ(h.count(4), 0u);
}

TEST(SamplerTest, RepetitionPenaltySteersAwayFromRecentTokens) {
  SamplingConfig c = plain(0.f);
  c.repeat_penalty = 1.5f;
  std::vector<float> l = {2.0f, 1.8f, -1.f};
  Sampler s(c);
  std::vector<float> a = l;
  EXPECT_EQ(s.sample(a, std::vector<int32_t>{7}), 0);  // token 0 not recent: unchanged
  std::vector<float> b = l;
  EXPECT_EQ(s.sample(b, std::vector<int32_t>{0}), 1);  // 2.0 / 1.5 < 1.8
  EXPECT_FLOAT_EQ(b[0], 2.0f / 1.5f);
  std::vector<float> d = l;
  s.sample(d, std::vector<int32_t>{2});
  EXPECT_FLOAT_EQ(d[2], -1.5f);  // negative logits are multiplied
}

// OpenAI's additive penalties: presence once per distinct recent token, frequency per occurrence,
// both over the last repeat_last_n tokens only.
TEST(SamplerTest, PresenceAndFrequencyPenaltiesSubtractPerTokenAndPerOccurrence) {
  SamplingConfig c = plain(0.f);
  c.presence_penalty = 0.5f;
  c.frequency_penalty = 0.25f;
  c.repeat_last_n = 4;
  Sampler s(c);
  std::vector<float> l = {2.0f, 1.9f, 1.0f, 0.0f};
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{0, 9, 0, 1, 0, 2, 0}), 1);  // the last 4: 1, 0, 2, 0
  EXPECT_FLOAT_EQ(l[0], 2.0f - 0.5f - 2 * 0.25f);
  EXPECT_FLOAT_EQ(l[1], 1.9f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(l[2], 1.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(l[3], 0.0f);
  // Negative values reward repetition, as OpenAI allows; with the repetition penalty, it goes first.
  c.presence_penalty = -1.0f;
  c.frequency_penalty = 0.0f;
  c.repeat_penalty = 2.0f;
  Sampler r(c);
  std::vector<float> m = {3.0f, 2.0f};
  EXPECT_EQ(r.sample(m, std::vector<int32_t>{1}), 0);
  EXPECT_FLOAT_EQ(m[1], 2.0f / 2.0f + 1.0f);
}

}  // namespace
}  // namespace ptllm
