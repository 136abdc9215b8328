// The block store of `serve --prompt-cache-dir` (store/dir_store.h): the store alone (a put written
// and read back, by this store and by the next one on the same directory; a damaged, truncated or
// unreadable file; the size bound removing the least recently used files; a directory that cannot
// be created), schedulers across a "restart" (the second loads what the first computed and answers
// the same; a damaged file is a miss and the same answer), and the real `posttrainllm serve`: a
// chat reply, SIGTERM, a second process on the same directory answers the same from the files, and
// a third after one block file was damaged still answers the same; `sample`, `cache ls` and
// `cache prune` on the server's directory keep to their own files.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include "chat/chat_template.h"
#include "core/error.h"
#include "persist/kv_store.h"
#include "engine/prompt_cache.h"
#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "kv/kv_cache.h"
#include "server/api.h"
#include "store/dir_store.h"
#include "serve_process.h"
#include "test_scheduler_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using server::json;

Digest digest_of(uint8_t seed) {
  Digest d{};
  for (size_t i = 0; i < d.size(); ++i) d[i] = uint8_t(seed + 7 * i);
  return d;
}

// A well-formed value of a block of 32 ids and `payload_bytes` of payload.
struct Block {
  Digest id = digest_of(3);
  BlockHash h;
  std::vector<int32_t> ids = std::vector<int32_t>(32);
  std::string payload;
  explicit Block(uint64_t seed, size_t payload_bytes = 1000) {
    std::mt19937_64 rng(seed);
    h = {rng(), rng()};
    for (auto& x : ids) x = int32_t(rng() % 8192);
    for (size_t i = 0; i < payload_bytes; ++i) payload += char(rng());
  }
  std::string key() const { return kv_store_key("ptllm", id, h); }
  std::string value() const { return encode_block_value(id, h, ids, payload); }
  bool verifies(const std::optional<std::string_view>& v) const {
    return v && decode_block_value(*v, id, h, ids, payload.size()) == std::optional<std::string_view>(payload);
  }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::unique_ptr<KVStore> open_store(const fs::path& dir, uint64_t max_bytes = uint64_t(1) << 30,
                                    RateLimitedLog* log = nullptr) {
  store::DirStoreOptions o;
  o.dir = dir;
  o.max_bytes = max_bytes;
  return store::open_dir_store(o, log);
}

TEST(DirStore, APutIsWrittenAndReadBackAfterARestart) {
  test::TempDir tmp;
  const Block a(1), b(2);
  {
    auto s = open_store(tmp.path);
    EXPECT_EQ(s->describe(), (tmp.path / "blocks").string());
    s->put(a.key(), a.value());
    s->put(b.key(), b.value());
    ASSERT_TRUE(s->flush(std::chrono::seconds(60)));
    const std::vector<std::string> keys = {a.key(), b.key()};
    const auto got = s->get(keys);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_TRUE(a.verifies(got[0]));
    EXPECT_TRUE(b.verifies(got[1]));
    const KVStoreStats st = s->stats();
    EXPECT_EQ(st.writes, 2u);
    EXPECT_EQ(st.bytes_out, a.value().size() + b.value().size());
    EXPECT_EQ(st.lookups, 1u);
    EXPECT_EQ(st.bytes_in, st.bytes_out);
  }
  // One file per block, under a subdirectory of the hash's first two hex digits.
  const fs::path fa = store::dir_store_path(tmp.path, a.key());
  ASSERT_FALSE(fa.empty());
  EXPECT_EQ(fa.parent_path().parent_path(), tmp.path / "blocks");
  EXPECT_EQ(fa.parent_path().filename().string(), a.key().substr(a.key().size() - 32, 2));
  EXPECT_EQ(slurp(fa), a.value());
  // A store opened later on the same directory (a restarted server) reads them.
  auto s2 = open_store(tmp.path);
  const std::vector<std::string> keys = {b.key(), a.key()};
  const auto got = s2->get(keys);
  EXPECT_TRUE(b.verifies(got[0]));
  EXPECT_TRUE(a.verifies(got[1]));
}

TEST(DirStore, WritesQueuedAtDestructionAreWritten) {
  test::TempDir tmp;
  std::vector<Block> blocks;
  for (int i = 0; i < 20; ++i) blocks.emplace_back(100 + i, 5000);
  {
    auto s = open_store(tmp.path);
    for (const Block& b : blocks) s->put(b.key(), b.value());
  }  // no flush: the destructor waits for the writer to finish the queue
  for (const Block& b : blocks) EXPECT_EQ(slurp(store::dir_store_path(tmp.path, b.key())), b.value());
}

// The writer thread is named (the benchmarks read its CPU time by name) and runs at nice 10; it is
// gone once the store is.
TEST(DirStore, TheWriterThreadIsNamedAndNiced) {
  test::TempDir tmp;
  const auto writer_nice = []() -> std::optional<long> {
    for (const auto& e : fs::directory_iterator("/proc/self/task")) {
      if (slurp(e.path() / "comm") != "ptllm-dirstore\n") continue;
      std::string stat = slurp(e.path() / "stat");
      std::istringstream in(stat.substr(stat.rfind(')') + 2));  // fields from the state (field 3) on
      std::string f;
      for (int i = 3; i <= 19; ++i) in >> f;  // field 19: nice
      return std::stol(f);
    }
    return std::nullopt;
  };
  {
    auto s = open_store(tmp.path);
    const Block a(7);
    s->put(a.key(), a.value());
    ASSERT_TRUE(s->flush(std::chrono::seconds(60)));
    const auto nice = writer_nice();
    ASSERT_TRUE(nice.has_value()) << "no thread named ptllm-dirstore";
    EXPECT_EQ(*nice, 10);
  }
  EXPECT_FALSE(writer_nice().has_value());
}

TEST(DirStore, AbsentDamagedTruncatedOrUnreadableFilesAreMisses) {
  test::TempDir tmp;
  std::vector<std::string> warnings;
  RateLimitedLog log(std::chrono::milliseconds(0));
  log.sink = [&](const std::string& w) { warnings.push_back(w); };
  auto s = open_store(tmp.path, uint64_t(1) << 30, &log);
  const Block a(1), b(2), c(3);
  s->put(a.key(), a.value());
  s->put(b.key(), b.value());
  ASSERT_TRUE(s->flush(std::chrono::seconds(60)));
  // An absent key is handed as absent and the lookup goes on while the caller asks for more (under
  // KIVI a block has two keys, its quantized form and its full-precision one); a caller that stops
  // at the absent key is handed nothing after it.
  {
    const std::vector<std::string> keys = {b.key(), c.key(), a.key()};
    const auto got = s->get(keys);
    EXPECT_TRUE(b.verifies(got[0]));
    EXPECT_FALSE(got[1]);
    EXPECT_TRUE(a.verifies(got[2]));
    EXPECT_TRUE(warnings.empty());  // absent is a plain miss
    std::vector<size_t> handed;
    s->lookup(keys, [&](size_t i, std::optional<std::string_view> v) {
      handed.push_back(i);
      return bool(v);
    });
    EXPECT_EQ(handed, (std::vector<size_t>{0, 1}));
  }
  // A flipped byte and a truncation: the bytes come back, and they do not verify (BlockExchange's miss).
  const fs::path fa = store::dir_store_path(tmp.path, a.key()), fb = store::dir_store_path(tmp.path, b.key());
  std::string damaged = a.value();
  damaged[damaged.size() / 2] ^= 0x10;
  std::ofstream(fa, std::ios::binary | std::ios::trunc) << damaged;
  std::ofstream(fb, std::ios::binary | std::ios::trunc) << b.value().substr(0, 100);
  {
    const std::vector<std::string> keys = {a.key(), b.key()};
    const auto got = s->get(keys);
    ASSERT_TRUE(got[0] && got[1]);
    EXPECT_FALSE(a.verifies(got[0]));
    EXPECT_FALSE(b.verifies(got[1]));
  }
  // A directory where a block file should be: a miss with a warning, never an exception.
  const fs::path fc = store::dir_store_path(tmp.path, c.key());
  fs::create_directories(fc);
  {
    const std::vector<std::string> keys = {c.key()};
    const auto got = s->get(keys);
    EXPECT_FALSE(got[0]);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find(fc.string()), std::string::npos) << warnings[0];
    EXPECT_EQ(s->stats().errors, 1u);
  }
  // A put over the damaged file replaces it.
  s->put(a.key(), a.value());
  ASSERT_TRUE(s->flush(std::chrono::seconds(60)));
  const std::vector<std::string> keys = {a.key()};
  EXPECT_TRUE(a.verifies(s->get(keys)[0]));
  // Keys this runtime never makes (a path in the name, no hash): nothing read, nothing written.
  EXPECT_TRUE(store::dir_store_path(tmp.path, "../x:" + std::string(32, 'a') + ":" + std::string(32, 'b')).empty());
  EXPECT_TRUE(store::dir_store_path(tmp.path, "ptllm:abc:def").empty());
  const uint64_t dropped = s->stats().dropped_writes;
  s->put("ptllm/../../x:1:2", "value");
  ASSERT_TRUE(s->flush(std::chrono::seconds(60)));
  EXPECT_EQ(s->stats().dropped_writes, dropped + 1);
}

TEST(DirStore, TheSizeBoundRemovesTheLeastRecentlyUsedFiles) {
  test::TempDir tmp;
  std::vector<Block> blocks;
  for (int i = 0; i < 6; ++i) blocks.emplace_back(10 + i, 10000);
  const uint64_t one = blocks[0].value().size();
  auto s = open_store(tmp.path, 4 * one + one / 2);  // room for four files
  for (int i = 0; i < 4; ++i) {
    s->put(blocks[i].key(), blocks[i].value());
    ASSERT_TRUE(s->flush(std::chrono::seconds(60)));
    // mtimes a second apart, block 0 the oldest (a filesystem's clock may be coarser than the writes)
    const fs::path p = store::dir_store_path(tmp.path, blocks[i].key());
    const timespec t[2] = {{1700000000 + i, 0}, {1700000000 + i, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), t, 0), 0);
  }
  // Block 0 is read: used now, so it is the newest.
  const std::vector<std::string> k0 = {blocks[0].key()};
  EXPECT_TRUE(blocks[0].verifies(s->get(k0)[0]));
  // A fifth file is over the bound: the least recently used go until at most 90% of it is left
  // (4 files of 4.5): block 1, not block 0.
  s->put(blocks[4].key(), blocks[4].value());
  ASSERT_TRUE(s->flush(std::chrono::seconds(60)));
  auto exists = [&](int i) { return fs::exists(store::dir_store_path(tmp.path, blocks[i].key())); };
  EXPECT_TRUE(exists(0));
  EXPECT_FALSE(exists(1));
  EXPECT_TRUE(exists(2));
  EXPECT_TRUE(exists(3));
  EXPECT_TRUE(exists(4));
  // A sixth: block 2 goes. Files that are not block files are neither counted nor removed.
  std::ofstream(tmp.path / "blocks" / "notes.txt") << std::string(100000, 'x');
  s->put(blocks[5].key(), blocks[5].value());
  ASSERT_TRUE(s->flush(std::chrono::seconds(60)));
  EXPECT_TRUE(fs::exists(tmp.path / "blocks" / "notes.txt"));
  EXPECT_FALSE(exists(2));
  EXPECT_TRUE(exists(0) && exists(3) && exists(4) && exists(5));
  // A block larger than the whole bound is not written.
  auto small = open_store(tmp.path / "small", one / 2);
  small->put(blocks[0].key(), blocks[0].value());
  ASSERT_TRUE(small->flush(std::chrono::seconds(60)));
  EXPECT_EQ(small->stats().dropped_writes, 1u);
  EXPECT_EQ(small->stats().writes, 0u);
}

// A server killed mid-write leaves a temporary file: the next start removes it (its writer is gone).
TEST(DirStore, TemporariesOfAWriterThatIsGoneAreRemovedAtTheStart) {
  test::TempDir tmp;
  const Block a(1);
  const fs::path final_name = store::dir_store_path(tmp.path, a.key());
  fs::create_directories(final_name.parent_path());
  // pid 0x7ffffffe: above any pid_max Linux allows (4194304), so never a running process.
  const fs::path stale = final_name.string() + ".tmp-2147483646-0123abcd";
  const fs::path mine = final_name.string() + ".tmp-" + std::to_string(::getpid()) + "-0123abcd";
  std::ofstream(stale) << "half a block";
  std::ofstream(mine) << "a write in progress";
  auto s = open_store(tmp.path);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(mine));  // its writer runs (this process), and it is recent
  const std::vector<std::string> keys = {a.key()};
  EXPECT_FALSE(s->get(keys)[0]);
}

TEST(DirStore, ADirectoryThatCannotBeCreatedIsAStartError) {
  test::TempDir tmp;
  std::ofstream(tmp.path / "file") << "x";
  try {
    open_store(tmp.path / "file" / "cache");
    ADD_FAILURE() << "a directory under a regular file was accepted";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--prompt-cache-dir " + (tmp.path / "file" / "cache").string()), std::string::npos) << what;
    EXPECT_NE(what.find("cannot create"), std::string::npos) << what;
  }
  // No probe file or temporary is left behind in a directory that works.
  open_store(tmp.path / "ok");
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path / "ok" / "blocks")) ++entries;
  EXPECT_EQ(entries, 0u);
}

// ---------------------------------------------------------------------------------------------
// Schedulers over the directory: a restart keeps the prefixes.

class DirStoreSchedulerTest : public test::StoreSchedulerFixture {
 protected:
  static SchedulerConfig config(KVStore* store) { return StoreSchedulerFixture::config(store, "--prompt-cache-dir"); }
};

TEST_F(DirStoreSchedulerTest, ARestartLoadsThePrefixFromTheFilesAndAnswersTheSame) {
  const auto prompt = test::random_prompt(41, 200, rt_->config().vocab_size);
  RequestResult ref;
  {
    Scheduler single(*rt_, config(nullptr));
    ref = test::run_greedy(single, prompt, 12);
  }
  test::TempDir tmp;
  {
    auto store = open_store(tmp.path);
    Scheduler a(*rt_, config(store.get()));
    const RequestResult r = test::run_greedy(a, prompt, 12);
    EXPECT_EQ(r.tokens, ref.tokens);
    EXPECT_EQ(r.cached_tokens, 0);
    a.stop();
    ASSERT_TRUE(store->flush(std::chrono::seconds(60)));
    EXPECT_EQ(store->stats().writes, 6u);  // every full block of the history
  }
  // The "restarted" server: a new store, a new pool.
  std::vector<fs::path> files;
  {
    auto store = open_store(tmp.path);
    Scheduler b(*rt_, config(store.get()));
    const RequestResult r = test::run_greedy(b, prompt, 12);
    EXPECT_EQ(r.tokens, ref.tokens);
    EXPECT_EQ(r.cached_tokens, 192);  // six full blocks; the seventh holds the last prompt token
    EXPECT_EQ(r.store_tokens, 192);
    EXPECT_EQ(b.stats().store_hits, 6u);
    EXPECT_EQ(b.stats().prefill_tokens, 200u - 192u);
  }
  // Every file damaged: the first block is a miss, the run stops there, and still the same answer.
  for (const auto& e : fs::recursive_directory_iterator(tmp.path / "blocks"))
    if (e.is_regular_file()) files.push_back(e.path());
  ASSERT_EQ(files.size(), 6u);
  for (const fs::path& f : files) {
    std::string v = slurp(f);
    v[v.size() - 20] ^= 1;
    std::ofstream(f, std::ios::binary | std::ios::trunc) << v;
  }
  auto store = open_store(tmp.path);
  Scheduler c(*rt_, config(store.get()));
  const RequestResult r = test::run_greedy(c, prompt, 12);
  EXPECT_EQ(r.tokens, ref.tokens);
  EXPECT_EQ(r.cached_tokens, 0);
  EXPECT_EQ(c.stats().store_rejected, 1u);
}

// ---------------------------------------------------------------------------------------------
// The real server across restarts.

using test::kChatML;

const char* kSystem =
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
    "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God "
    "said, Let there be light: and there was light. And God saw the light, that it was good: and God divided the "
    "light from the darkness. And God called the light Day, and the darkness he called Night.";

TEST(DirStoreServe, PrefixesSurviveARestartAndADamagedFileIsAColdBlock) {
  test::TempDir tmp;
  const fs::path tmpl = tmp.path / "chatml.jinja", cache = tmp.path / "cache";
  std::ofstream(tmpl) << kChatML;
  const std::vector<std::string> flags = {"--chat-template", tmpl.string(), "--prompt-cache-dir", cache.string()};
  const json body = {{"messages", json::array({{{"role", "system"}, {"content", kSystem}},
                                               {{"role", "user"}, {"content", "And God said"}}})},
                     {"max_tokens", 12},
                     {"temperature", 0}};
  json first;
  {
    test::ServeProcess a(test::repo_model("kjv-tiny"), flags, tmp.path / "a.err");
    ASSERT_GT(a.port, 0) << a.log();
    EXPECT_NE(a.log().find("prompt cache: " + (cache / "blocks").string()), std::string::npos) << a.log();
    first = a.post_ok("/v1/chat/completions", body);
    EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(a.stop(), 0);  // SIGTERM: the queued blocks are written before the exit
  }
  const int prompt_tokens = first["usage"]["prompt_tokens"];
  ASSERT_GE(prompt_tokens, 3 * 32) << "the test needs a prompt of several blocks";
  const std::string text = first["choices"][0]["message"]["content"];
  // The prompt's full blocks, by their hashes (the file names end with them; the identity part holds
  // the binary's, which this test process cannot compute).
  std::vector<BlockHash> hashes;
  {
    Runtime rt({test::repo_model("kjv-tiny"), 1, true});
    chat::ChatTemplate t = chat::ChatTemplate::from_string(kChatML);
    chat::ChatRequest r;
    r.messages = body["messages"];
    r.add_generation_prompt = true;
    const std::vector<int32_t> ids = rt.tokenizer().encode(t.render(r), {.add_special = false});
    ASSERT_EQ(int(ids.size()), prompt_tokens);
    KVCacheConfig kv;
    kv.ctx_size = 512;
    KVPool pool(rt.model().kv_shape(), kv, 1);
    pool.extend_block_hashes(ids, (ids.size() - 1) / 32, hashes);
  }
  auto file_of = [&](const BlockHash& h) {
    char hex[33];
    std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(h.hi),
                  static_cast<unsigned long long>(h.lo));
    for (const auto& e : fs::recursive_directory_iterator(cache / "blocks"))
      if (e.path().filename().string().ends_with(std::string(hex) + ".kvblock")) return e.path();
    return fs::path();
  };
  for (const BlockHash& h : hashes) ASSERT_FALSE(file_of(h).empty()) << "a prompt block was not written";
  const int all_blocks = int(hashes.size()) * 32;
  {
    test::ServeProcess b(test::repo_model("kjv-tiny"), flags, tmp.path / "b.err");
    ASSERT_GT(b.port, 0) << b.log();
    const json again = b.post_ok("/v1/chat/completions", body);
    EXPECT_EQ(again["choices"][0]["message"]["content"], text);
    EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], all_blocks);
    EXPECT_EQ(b.metric("ptllm_kv_store_hits_total"), double(hashes.size()));
    EXPECT_EQ(b.stop(), 0);
  }
  // The third block's file damaged: the first two are loaded, the rest computed, the same answer.
  const fs::path damaged = file_of(hashes[2]);
  std::string v = slurp(damaged);
  v[v.size() / 2] ^= 0x40;
  std::ofstream(damaged, std::ios::binary | std::ios::trunc) << v;
  test::ServeProcess c(test::repo_model("kjv-tiny"), flags, tmp.path / "c.err");
  ASSERT_GT(c.port, 0) << c.log();
  const json third = c.post_ok("/v1/chat/completions", body);
  EXPECT_EQ(third["choices"][0]["message"]["content"], text);
  EXPECT_EQ(third["usage"]["prompt_tokens_details"]["cached_tokens"], 2 * 32);
  EXPECT_EQ(c.metric("ptllm_kv_store_rejected_total"), 1);
  EXPECT_NE(c.log().find("warning: kv store: ignoring the value of"), std::string::npos) << c.log();
  EXPECT_EQ(c.stop(), 0);
}

// One directory for `serve`, `sample` and `cache`: sample takes the server's blocks, cache lists and
// verifies them, and a prune to nothing removes them.
TEST(DirStoreServe, SampleAndCacheCommandsUseTheServersBlocks) {
  test::TempDir tmp;
  const fs::path cache = tmp.path / "cache";
  {
    test::ServeProcess a(test::repo_model("kjv-tiny"), {"--prompt-cache-dir", cache.string()}, tmp.path / "a.err");
    ASSERT_GT(a.port, 0) << a.log();
    a.post_ok("/v1/completions", {{"prompt", kSystem}, {"max_tokens", 4}, {"temperature", 0}});
    EXPECT_EQ(a.stop(), 0);
  }
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(cache / "blocks")) files += e.is_regular_file();
  ASSERT_GE(files, 3u);
  const std::string sample = test::binary() + " sample " + test::repo_model("kjv-tiny").string() + " -t 1 -n 4 --temp 0 -p '" +
                             std::string(kSystem) + "'";
  const auto hot = test::run_command(sample + " --prompt-cache-dir " + cache.string());
  ASSERT_EQ(hot.code, 0) << hot.err;
  EXPECT_NE(hot.err.find("prompt cache: hit"), std::string::npos) << hot.err;
  EXPECT_EQ(hot.out, test::run_command(sample).out);
  const auto ls = test::run_command(test::binary() + " cache ls " + cache.string());
  EXPECT_EQ(ls.code, 0) << ls.err;
  EXPECT_NE(ls.out.find(std::to_string(files) + " blocks, "), std::string::npos) << ls.out;
  EXPECT_EQ(test::run_command(test::binary() + " cache inspect " + cache.string()).code, 0);
  const auto prune = test::run_command(test::binary() + " cache prune " + cache.string() + " --max-mb 0");
  EXPECT_EQ(prune.code, 0) << prune.err;
  EXPECT_NE(prune.out.find("removed " + std::to_string(files) + " files"), std::string::npos) << prune.out;
}

TEST(DirStoreServe, BadFlagsAndConfigurationsAreRefusedWithTheirNames) {
  test::TempDir tmp;
  std::ofstream(tmp.path / "file") << "x";
  const std::string serve = test::binary() + " serve " + test::repo_model("kjv-tiny").string() + " --port 0 ";
  const std::string bad = (tmp.path / "file" / "cache").string();
  const auto dir = test::run_command(serve + "--prompt-cache-dir " + bad);
  EXPECT_EQ(dir.code, 2);
  EXPECT_NE(dir.err.find("--prompt-cache-dir " + bad + ": cannot create the directory"), std::string::npos) << dir.err;
  const auto both = test::run_command(serve + "--prompt-cache-dir " + tmp.path.string() + " --kv-store redis://127.0.0.1:1");
  EXPECT_EQ(both.code, 2);
  EXPECT_NE(both.err.find("--prompt-cache-dir and --kv-store: give one of them"), std::string::npos) << both.err;
  const auto max = test::run_command(serve + "--prompt-cache-max-mb 0 --prompt-cache-dir " + tmp.path.string());
  EXPECT_EQ(max.code, 2);
  EXPECT_NE(max.err.find("--prompt-cache-max-mb"), std::string::npos) << max.err;
}

}  // namespace
}  // namespace ptllm
