// engine/conversation.h: a conversation's turns reuse the session's KV (only the new tokens are
// fed), a rewritten history rewinds to the first differing token, a rewind the cache cannot make
// starts a fresh session; and the ids that end a reply.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <numeric>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/conversation.h"
#include "engine/prompt_blocks.h"
#include "persist/cache_file.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "test_memory_store.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

struct Tiny {
  std::unique_ptr<Model> model = Model::load(test::repo_model("kjv-tiny"));
  Tokenizer tok = Tokenizer::load(test::repo_model("kjv-tiny"));
  ThreadPool pool{2};
  std::vector<int32_t> ids(const std::string& text) const { return tok.encode(text); }
};

SessionOptions dense() {
  SessionOptions o;
  o.kv.ctx_size = 512;
  return o;
}

// The logits a fresh session computes for `prompt`, fed in one pass.
std::vector<float> cold_logits(Tiny& t, const SessionOptions& o, const std::vector<int32_t>& prompt) {
  Session s(*t.model, o, t.pool);
  auto l = s.feed(prompt);
  return {l.begin(), l.end()};
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(Conversation, ATurnFeedsOnlyWhatTheSessionLacks) {
  Tiny t;
  Conversation conv(*t.model, dense(), t.pool);
  const auto p1 = t.ids("In the beginning God created");
  TurnPrefill a = conv.prefill(p1);
  EXPECT_EQ(a.prompt_tokens, int64_t(p1.size()));
  EXPECT_EQ(a.reused, 0);
  EXPECT_EQ(a.prefilled, int64_t(p1.size()));
  // A reply of three greedy tokens, fed one by one as the chat command does.
  for (int i = 0; i < 3; ++i) {
    const int32_t next = argmax(conv.session().last_logits());
    conv.session().feed({&next, 1});
  }
  const std::vector<int32_t> held = conv.session().history();
  const auto p2 = concat(held, t.ids(" and the earth was without form"));
  TurnPrefill b = conv.prefill(p2);
  EXPECT_EQ(b.reused, int64_t(held.size()));
  EXPECT_EQ(b.prefilled, int64_t(p2.size() - held.size()));
  EXPECT_FALSE(b.rewound);
  EXPECT_TRUE(b.note.empty());
  EXPECT_EQ(conv.session().history(), p2);
  const auto cold = cold_logits(t, dense(), p2);
  const auto warm = conv.session().last_logits();
  ASSERT_EQ(warm.size(), cold.size());
  for (size_t i = 0; i < cold.size(); ++i) ASSERT_NEAR(warm[i], cold[i], 1e-3f) << i;
  EXPECT_EQ(argmax(warm), argmax(cold));
  // The same prompt again: nothing to feed, the logits are still there.
  TurnPrefill c = conv.prefill(p2);
  EXPECT_EQ(c.reused, int64_t(p2.size()));
  EXPECT_EQ(c.prefilled, 0);
}

TEST(Conversation, ARewrittenHistoryRewindsToTheFirstDifference) {
  Tiny t;
  Conversation conv(*t.model, dense(), t.pool);
  const auto p1 = t.ids("In the beginning God created the heaven and the earth");
  conv.prefill(p1);
  auto p2 = p1;
  p2[5] = p2[5] == 7 ? 8 : 7;  // the template rendered an earlier turn differently
  p2.push_back(p1[2]);
  TurnPrefill b = conv.prefill(p2);
  EXPECT_TRUE(b.rewound);
  EXPECT_FALSE(b.fresh);
  EXPECT_EQ(b.reused, 5);
  EXPECT_EQ(b.prefilled, int64_t(p2.size()) - 5);
  EXPECT_NE(b.note.find("rewound from " + std::to_string(p1.size()) + " to 5 tokens"), std::string::npos) << b.note;
  EXPECT_EQ(conv.session().history(), p2);
  EXPECT_EQ(argmax(conv.session().last_logits()), argmax(cold_logits(t, dense(), p2)));
  // A prompt that is a prefix of what is held: rewound to all but its last token, which is fed again.
  const std::vector<int32_t> p3(p2.begin(), p2.begin() + 4);
  TurnPrefill c = conv.prefill(p3);
  EXPECT_TRUE(c.rewound);
  EXPECT_EQ(c.reused, 3);
  EXPECT_EQ(c.prefilled, 1);
}

// KIVI int4 with no full-precision residual: tokens are quantized group by group and cannot be
// rewound; the turn is then prefilled in a fresh session, as a cold prefill would be.
TEST(Conversation, AnImpossibleRewindStartsAFreshSession) {
  Tiny t;
  SessionOptions o = dense();
  o.kv.precision = KVPrecision::Int4;
  o.kv.group_size = 16;
  o.kv.residual = 0;
  o.kv.validate();
  Conversation conv(*t.model, o, t.pool);
  std::vector<int32_t> p1 = t.ids("In the beginning God created the heaven and the earth. And the earth was "
                                  "without form, and void; and darkness was upon the face of the deep. And the "
                                  "Spirit of God moved upon the face of the waters. And God said, Let there be light");
  ASSERT_GT(p1.size(), 40u);
  conv.prefill(p1);
  auto p2 = p1;
  p2[3] = p2[3] == 7 ? 8 : 7;
  TurnPrefill b = conv.prefill(p2);
  EXPECT_TRUE(b.fresh);
  EXPECT_EQ(b.reused, 0);
  EXPECT_EQ(b.prefilled, int64_t(p2.size()));
  EXPECT_NE(b.note.find("cannot rewind"), std::string::npos) << b.note;
  const auto cold = cold_logits(t, o, p2);
  const auto warm = conv.session().last_logits();
  ASSERT_TRUE(std::equal(warm.begin(), warm.end(), cold.begin(), cold.end()));
}

TEST(Conversation, ResetForgetsTheSessionAndTooLongIsAnError) {
  Tiny t;
  SessionOptions o = dense();
  o.kv.ctx_size = 16;
  Conversation conv(*t.model, o, t.pool);
  conv.prefill(t.ids("In the beginning"));
  conv.reset();
  EXPECT_TRUE(conv.session().history().empty());
  std::vector<int32_t> long_prompt(17, 5);
  try {
    conv.prefill(long_prompt);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than --ctx-size 16"), std::string::npos) << e.what();
  }
}

// With a prompt cache, every turn's blocks go to the store (the session is not fresh at the second
// turn); a later launch whose prompt is that conversation takes them instead of prefilling, and
// computes the cold logits bit for bit.
TEST(Conversation, ALaterTurnIsSavedAndRestoredThroughThePromptCache) {
  Tiny t;
  test::MemoryStore store;
  const Digest id = prompt_cache_identity(*t.model, t.tok, dense().kv).config_key;
  const auto p1 = t.ids("In the beginning God created the heaven and the earth. And the earth was without form, and "
                        "void; and darkness was upon the face of the deep.");
  const auto p2 = concat(p1, t.ids(" And the Spirit of God moved upon the face of the waters. And God said, Let "
                                   "there be light: and there was light. And God saw the light, that it was good"));
  ASSERT_GE(p1.size(), 32u);
  ASSERT_GT(p2.size(), 64u);
  {
    PromptBlockCache cache(*t.model, dense().kv, store, id);
    Conversation conv(*t.model, dense(), t.pool, cache.pool());
    TurnPrefill a = conv.prefill(p1, &cache);
    EXPECT_EQ(a.from_cache, 0);
    EXPECT_EQ(a.prefilled, int64_t(p1.size()));
    TurnPrefill b = conv.prefill(p2, &cache);
    EXPECT_EQ(b.reused, int64_t(p1.size()));
    EXPECT_EQ(b.from_cache, 0);
    const PromptBlockSave saved = cache.finish(conv.session());
    EXPECT_EQ(saved.blocks, p2.size() / 32);  // every full block of the conversation, once
  }
  PromptBlockCache cache(*t.model, dense().kv, store, id);
  Conversation conv(*t.model, dense(), t.pool, cache.pool());
  TurnPrefill c = conv.prefill(p2, &cache);
  // The longest prefix of whole blocks after which the rest takes the batched path (over 17 rows).
  const int64_t n = int64_t(p2.size());
  int64_t expect = (n - 1) / 32 * 32;
  while (n - expect <= 17) expect -= 32;
  EXPECT_EQ(c.from_cache, expect);
  EXPECT_EQ(c.prefilled, n - expect);
  const auto cold = cold_logits(t, dense(), p2);
  const auto hot = conv.session().last_logits();
  ASSERT_EQ(hot.size(), cold.size());
  EXPECT_EQ(std::memcmp(hot.data(), cold.data(), cold.size() * sizeof(float)), 0);
}

TEST(Conversation, StopTokenIdsJoinTheTokenizerConfigAndGenerationConfig) {
  Tiny t;
  EXPECT_EQ(stop_token_ids(test::repo_model("kjv-tiny"), t.model->config(), t.tok), std::vector<int32_t>{1});
  test::TempDir tmp;
  std::ofstream(tmp.path / "generation_config.json") << R"({"eos_token_id": [7, 1, 9]})";
  EXPECT_EQ(stop_token_ids(tmp.path, t.model->config(), t.tok), (std::vector<int32_t>{1, 7, 9}));
  std::ofstream(tmp.path / "generation_config.json") << R"({"eos_token_id": 12})";
  EXPECT_EQ(stop_token_ids(tmp.path, t.model->config(), t.tok), (std::vector<int32_t>{1, 12}));
  std::ofstream(tmp.path / "generation_config.json") << R"({"eos_token_id": ["x"]})";
  EXPECT_THROW(stop_token_ids(tmp.path, t.model->config(), t.tok), Error);
  std::ofstream(tmp.path / "generation_config.json") << "{";
  EXPECT_THROW(stop_token_ids(tmp.path, t.model->config(), t.tok), Error);
}

}  // namespace
}  // namespace ptllm
