// kv/manager.h: what a scheduler asks of the pool, in vLLM's KVCacheManager's shape. A finished
// sequence's blocks go back through free and stay findable; get_computed_blocks finds the run a new
// prompt shares and holds it; allocate_computed adopts it into a new sequence and gives back the
// references it no longer needs; the pool ends with nothing referenced.
#include <gtest/gtest.h>

#include "core/thread_pool.h"
#include "engine/session.h"
#include "kv/manager.h"
#include "model/model.h"
#include "test_scheduler_util.h"

namespace ptllm {
namespace {

TEST(KVManagerTest, ComputedBlocksAreFoundAdoptedAndFreed) {
  const auto model = Model::load(test::repo_model("kjv-tiny"));
  ThreadPool threads(2);
  SessionOptions o;
  o.kv.ctx_size = 512;
  KVPool pool(model->kv_shape(), o.kv, 2);
  KVManager kv(pool);
  const auto first = test::random_prompt(1, 100, 1000);  // 3 whole blocks of 32 and 4 tokens
  {
    Session a(*model, o, threads, &pool);
    a.feed(first);
    EXPECT_GT(pool.blocks_in_use(), 0u);
    a.release(kv);
    EXPECT_TRUE(a.history().empty());
    EXPECT_EQ(pool.blocks_in_use(), 0u);  // freed, and findable: the full blocks are cached
    EXPECT_GE(pool.dense().cached(), 3u * size_t(model->kv_shape().n_layers));
  }
  // A prompt sharing the first 70 tokens: two whole blocks computed, the third differs.
  std::vector<int32_t> prompt(first.begin(), first.begin() + 70);
  const auto more = test::random_prompt(2, 60, 1000);
  prompt.insert(prompt.end(), more.begin(), more.end());
  const size_t n = kv.adoptable_blocks(int64_t(prompt.size()), [](int64_t) { return true; });
  EXPECT_EQ(n, 4u);  // the whole blocks but the last token's
  std::vector<BlockHash> hashes;
  std::vector<int32_t> held;
  EXPECT_EQ(kv.get_computed_blocks(prompt, 0, n, hashes, held), 2u);
  EXPECT_EQ(hashes.size(), n);
  EXPECT_EQ(pool.blocks_in_use(), held.size());  // held: a reference on each layer's block
  EXPECT_EQ(kv.final_form_blocks(prompt, hashes, 2), 2u);  // dense: every adopted block is final
  Session b(*model, o, threads, &pool);
  // Adoption past the second block is refused: the held run is what is taken.
  const int64_t adopted = b.adopt_prefix(kv, prompt, [](int64_t a) { return a <= 64; }, held);
  EXPECT_EQ(adopted, 64);
  EXPECT_TRUE(held.empty());
  EXPECT_EQ(b.history().size(), 64u);
  // The adopted prefix continued gives a cold computation's logits.
  const auto hot = b.feed(std::span<const int32_t>(prompt).subspan(64));
  Session cold(*model, o, threads);
  const auto ref = cold.feed(prompt);
  ASSERT_EQ(hot.size(), ref.size());
  EXPECT_EQ(std::memcmp(hot.data(), ref.data(), ref.size() * sizeof(float)), 0);
  b.release(kv);
  EXPECT_EQ(pool.blocks_in_use(), 0u);  // nothing leaked
}

}  // namespace
}  // namespace ptllm
