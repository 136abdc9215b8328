// The persistent prompt cache: the whole-state file format against damage, the key, and hot == cold
// for every cache configuration, in the library (logits and KV bytes, bit for
// bit) and through the real binary (text, exit codes, status lines): `--cache-prompt FILE` (one
// whole state) and `--prompt-cache-dir DIR` (the block store `serve` shares).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/prompt_cache.h"
#include "engine/session.h"
#include "kernels/affine.h"
#include "kernels/ggml.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;

// Genesis 8:1-5 in three growing prompts; each one's ids are a prefix of the next one's (43, 96, 158 tokens).
const std::string kA =
    "And God remembered Noah, and every living thing, and all the cattle that was with him in the ark: and God "
    "made a wind to pass over the earth, and the waters asswaged;";
const std::string kB = kA +
                       " The fountains also of the deep and the windows of heaven were stopped, and the rain from "
                       "heaven was restrained; And the waters returned from off the earth continually: and after "
                       "the end of the hundred and fifty days the waters were abated.";
const std::string kC = kB +
                       " And the ark rested in the seventh month, on the seventeenth day of the month, upon the "
                       "mountains of Ararat. And the waters decreased continually until the tenth month: in the "
                       "tenth month, on the first day of the month, were the tops of the mountains seen.";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void write_file(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

void set_mtime(const fs::path& p, int64_t unix_s) {
  const timespec ts[2] = {{unix_s, 0}, {unix_s, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), ts, 0), 0) << p;
}

// ---------------------------------------------------------------------------------------------
// The file.

PromptCacheIdentity small_identity() {
  PromptCacheIdentity id;
  id.model_name = "tiny";
  id.arch_name = "LlamaForCausalLM";
  id.vocab_size = 16;
  id.n_layers = 2;
  id.n_kv_heads = 1;
  id.head_dim = 4;
  id.kv.precision = KVPrecision::Int4;
  id.kv.group_size = 8;
  id.kv.residual = 16;
  id.kv.sink = 4;
  id.kv.window = 24;
  id.kv.positions = PositionMode::Cache;
  for (size_t i = 0; i < id.config_key.size(); ++i) id.config_key[i] = uint8_t(i * 7);
  return id;
}

std::vector<float> small_logits() {
  std::vector<float> l(16);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(i) * 0.5f - 3.0f;
  return l;
}

std::string small_file(const std::vector<int32_t>& ids = {0, 5, 15}) {
  return encode_cache_file(small_identity(), 1234567, ids, small_logits(), "kv-state-bytes");
}

TEST(PromptCacheFileTest, RoundTrips) {
  const std::string bytes = small_file();
  const CacheFile f = decode_cache_file(bytes);
  EXPECT_EQ(f.version, kPromptCacheVersion);
  EXPECT_EQ(f.identity.config_key, small_identity().config_key);
  EXPECT_EQ(f.identity.kv.describe(), "int4 g8 r16 sink4 w24 pos=cache");
  EXPECT_EQ(f.identity.kv.group_size, 8);
  EXPECT_EQ(f.identity.model_name, "tiny");
  EXPECT_EQ(f.identity.arch_name, "LlamaForCausalLM");
  EXPECT_EQ(f.identity.n_layers, 2);
  EXPECT_EQ(f.identity.head_dim, 4);
  EXPECT_EQ(f.created_ms, 1234567);
  EXPECT_EQ(f.ids, (std::vector<int32_t>{0, 5, 15}));
  EXPECT_EQ(f.logits, small_logits());
  EXPECT_EQ(f.kv_state, "kv-state-bytes");
  EXPECT_EQ(f.file_size, bytes.size());
}

TEST(PromptCacheFileTest, EveryFlippedBitAndEveryTruncationIsRejected) {
  const std::string good = small_file();
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t bit : {0x01, 0x80}) {
      std::string bad = good;
      bad[i] = char(uint8_t(bad[i]) ^ bit);
      EXPECT_THROW(decode_cache_file(bad), Error) << "byte " << i;
    }
  }
  for (size_t n = 0; n < good.size(); ++n) EXPECT_THROW(decode_cache_file(good.substr(0, n)), Error) << n;
  EXPECT_THROW(decode_cache_file(good + "x"), Error);
}

// Rewrites the checksum after an edit, as a buggy or hostile writer would: what comes after the
// checksum must still be checked.
std::string with_checksum_fixed(std::string bytes) {
  const uint64_t sum = XXH3_64bits(bytes.data(), bytes.size() - 8);
  std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
  return bytes;
}

TEST(PromptCacheFileTest, ErrorsNameTheProblem) {
  auto message = [](const std::string& bytes) {
    try {
      decode_cache_file(bytes);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::string bytes = small_file();
  std::string v1 = bytes;  // version 1 stored K codes in plain rows (before the tiles of k_code_offset)
  v1[8] = 1;
  EXPECT_EQ(message(v1), "format version 1, this build reads version " + std::to_string(kPromptCacheVersion));
  EXPECT_EQ(message(bytes.substr(0, 100)).rfind("truncated: 100 bytes, the header says", 0), 0u);
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x10;
  EXPECT_EQ(message(flipped), "checksum mismatch (the file is damaged)");
  EXPECT_EQ(message("PTLLMKVX" + bytes.substr(8)), "not a prompt-cache file (bad magic)");
  EXPECT_EQ(message(""), "truncated: 0 bytes, not even a header");
  // An id outside the vocabulary, under a valid checksum.
  EXPECT_EQ(message(small_file({0, 16})), "holds token id 16, outside the vocabulary");
  // n_ids claims more than the file holds, under a valid checksum.
  const size_t n_ids_at = 24 + 32 + 4 + 8 * 4 + 8;
  std::string lying = bytes;
  const uint64_t huge = uint64_t(1) << 62;
  std::memcpy(lying.data() + n_ids_at, &huge, 8);
  EXPECT_NE(message(with_checksum_fixed(lying)).find("do not match the file size"), std::string::npos);
}

TEST(PromptCacheFileTest, WriterIsAtomicAndHeaderReaderAgrees) {
  test::TempDir tmp;
  const fs::path path = tmp.path / "x.kvcache";
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5};
  const uint64_t n = write_cache_file(path, small_identity(), 42, ids, small_logits(), std::string(1000, 'k'));
  EXPECT_EQ(n, fs::file_size(path));
  EXPECT_EQ(files_in(tmp.path), std::vector<std::string>{"x.kvcache"});  // no temporary left
  const CacheFile h = read_cache_header(path);
  EXPECT_EQ(h.ids, ids);
  EXPECT_TRUE(h.logits.empty());
  EXPECT_EQ(h.identity.config_key, small_identity().config_key);
  std::string buffer;
  EXPECT_EQ(read_cache_file(path, buffer).kv_state, std::string(1000, 'k'));
  // Damage past the ids leaves the header readable: only the full read's checksum shows it.
  std::string bytes = read_file(path);
  bytes[bytes.size() / 2] ^= 1;
  write_file(path, bytes);
  EXPECT_EQ(read_cache_header(path).ids, ids);
  try {
    read_cache_file(path, buffer);
    ADD_FAILURE() << "a damaged file was read";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "checksum mismatch (the file is damaged)");
  }
  // A truncated file is caught by the header reader too (the check before a load).
  fs::resize_file(path, n - 10);
  EXPECT_THROW(read_cache_header(path), Error);
  // A directory the writer cannot create a file in.
  EXPECT_THROW(write_cache_file(tmp.path / "missing" / "y.kvcache", small_identity(), 0, ids, small_logits(), ""), Error);
}

// ---------------------------------------------------------------------------------------------
// The key.

struct Loaded {
  std::unique_ptr<Model> model;
  Tokenizer tok;
  explicit Loaded(const fs::path& dir) : model(Model::load(dir)), tok(Tokenizer::load(dir)) {}
};
const Loaded& tiny() {
  static const Loaded l(test::repo_model("kjv-tiny"));
  return l;
}

TEST(PromptCacheKeyTest, EveryKvSettingChangesTheKeyButCapacityDoesNot) {
  const Loaded& m = tiny();
  const KVCacheConfig base;
  auto key = [&](const KVCacheConfig& kv) { return prompt_cache_identity(*m.model, m.tok, kv).config_key; };
  std::vector<KVCacheConfig> variants(7, base);
  variants[0].precision = KVPrecision::BF16;
  variants[1].group_size = 16;
  variants[2].residual = 64;
  variants[3].sink = 4, variants[3].window = 64;
  variants[4].window = 64;
  variants[5].positions = PositionMode::Cache;
  variants[6].precision = KVPrecision::Int4;
  std::vector<Digest> keys = {key(base)};
  for (const auto& v : variants) keys.push_back(key(v));
  for (size_t i = 0; i < keys.size(); ++i)
    for (size_t j = i + 1; j < keys.size(); ++j) EXPECT_NE(keys[i], keys[j]) << i << " vs " << j;
  KVCacheConfig capacity = base;
  capacity.ctx_size = 100;
  capacity.preallocate = false;
  EXPECT_EQ(key(capacity), key(base));
}

TEST(PromptCacheKeyTest, TheModelNameIsTheDirectorysNameSanitized) {
  const Loaded& m = tiny();
  const PromptCacheIdentity id = prompt_cache_identity(*m.model, m.tok, KVCacheConfig{});
  EXPECT_EQ(id.model_name, "kjv-tiny");
  EXPECT_EQ(sanitize_model_name("my model/v2.1"), "my_model_v2.1");
  EXPECT_EQ(sanitize_model_name(".."), "model");
}

// Repacking at load changes the order of the sums, so the key says whether it is on.
TEST(PromptCacheKeyTest, RepackedLayoutsChangeTheKey) {
  Loaded m(test::repo_model("kjv-tiny"));
  const auto key = [&] { return prompt_cache_identity(*m.model, m.tok, KVCacheConfig{}).config_key; };
  const Digest k0 = key();
  const bool affine = affine_pack_wanted(), ggml = ggml_pack_wanted();
  set_affine_pack_enabled(!affine);
  const Digest k1 = key();
  set_affine_pack_enabled(affine);
  set_ggml_pack_enabled(!ggml);
  const Digest k2 = key();
  set_ggml_pack_enabled(ggml);
  EXPECT_EQ(key(), k0);
  // A CPU without the packed kernels packs nothing either way.
  if (affine) {
    EXPECT_NE(k1, k0);
  }
  if (ggml) {
    EXPECT_NE(k2, k0);
  }
}

TEST(PromptCacheKeyTest, TouchedWeightsConfigOrTokenizerChangeTheKey) {
  test::TempDir tmp;
  const fs::path dir = tmp.path / "kjv-tiny";
  fs::copy(test::repo_model("kjv-tiny"), dir, fs::copy_options::recursive);
  auto key = [&] {
    Loaded m(dir);
    return prompt_cache_identity(*m.model, m.tok, KVCacheConfig{}).config_key;
  };
  const Digest k0 = key();
  EXPECT_EQ(key(), k0);
  set_mtime(dir / "model.safetensors", 1000000000);
  const Digest k1 = key();
  EXPECT_NE(k1, k0);
  std::ofstream(dir / "config.json", std::ios::app) << "\n";
  const Digest k2 = key();
  EXPECT_NE(k2, k1);
  std::ofstream(dir / "tokenizer.json", std::ios::app) << "\n";
  EXPECT_NE(key(), k2);
}

// ---------------------------------------------------------------------------------------------
// Through a Session: logits and KV bytes, bit for bit.

struct CacheCase {
  const char* name;
  KVCacheConfig kv;
};
void PrintTo(const CacheCase& c, std::ostream* os) { *os << c.name; }

KVCacheConfig kv_of(KVPrecision p, int sink = 0, int window = 0, PositionMode pos = PositionMode::Absolute) {
  KVCacheConfig c;
  c.precision = p;
  c.group_size = 8;
  c.residual = 16;  // KIVI quantizes within these prompts
  c.sink = sink;
  c.window = window;
  c.positions = pos;
  c.ctx_size = 512;
  return c;
}

std::vector<CacheCase> cache_cases() {
  return {{"fp32", kv_of(KVPrecision::F32)},
          {"bf16", kv_of(KVPrecision::BF16)},
          {"int8", kv_of(KVPrecision::Int8)},
          {"int4", kv_of(KVPrecision::Int4)},
          {"int2", kv_of(KVPrecision::Int2)},
          {"streaming", kv_of(KVPrecision::F32, 4, 24)},
          {"streaming_int4_cachepos", kv_of(KVPrecision::Int4, 4, 24, PositionMode::Cache)}};
}

::testing::AssertionResult same_bytes(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "differ at " << i << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

std::string kv_bytes(const Session& s) {
  std::string out;
  s.cache().serialize(out);
  return out;
}

std::vector<int64_t> tokens_saved(const PromptCacheSave& s) {
  std::vector<int64_t> out;
  for (const auto& x : s.saved) out.push_back(x.tokens);
  return out;
}

class PromptCacheSessionTest : public ::testing::TestWithParam<CacheCase> {
 protected:
  const Loaded& m = tiny();
  ThreadPool pool{2};
  test::TempDir tmp;
  SessionOptions opts() const {
    SessionOptions o;
    o.kv = GetParam().kv;
    return o;
  }
  std::vector<int32_t> ids(const std::string& text) const { return m.tok.encode(text); }
  fs::path file() const { return tmp.path / "p.kvcache"; }
  PromptCache cache() const {
    PromptCacheOptions o;
    o.file = file();
    return PromptCache(o, prompt_cache_identity(*m.model, m.tok, GetParam().kv));
  }
  // The state after a cold prefill of `prompt`.
  std::unique_ptr<Session> cold(const std::vector<int32_t>& prompt) {
    auto s = std::make_unique<Session>(*m.model, opts(), pool);
    s->feed(prompt);
    return s;
  }
  // Feeds the same continuation to both, checking every step's logits, then the KV bytes.
  void expect_same_continuation(Session& hot, Session& ref) {
    ASSERT_TRUE(same_bytes(hot.last_logits(), ref.last_logits()));
    ASSERT_EQ(hot.history(), ref.history());
    for (int32_t id : m.tok.encode(" And God said, Let there be light: and there was light.", {false, true})) {
      const std::span<float> a = hot.feed({&id, 1}), b = ref.feed({&id, 1});
      ASSERT_TRUE(same_bytes(a, b)) << "after token " << id;
    }
    EXPECT_EQ(kv_bytes(hot), kv_bytes(ref));
  }
  bool on_grid() const { return is_kivi(GetParam().kv.precision) || GetParam().kv.streaming(); }
  // Prefills `prompt` cold through a fresh PromptCache, as `sample --cache-prompt` does: the file then
  // holds this prompt's state (whatever it held before).
  void save(const std::vector<int32_t>& prompt) {
    std::error_code ec;
    fs::remove(file(), ec);
    Session s(*m.model, opts(), pool);
    PromptCache pc = cache();
    ASSERT_EQ(pc.prefill(s, prompt).outcome, PromptCacheOutcome::Miss);
    ASSERT_EQ(tokens_saved(pc.finish()), std::vector<int64_t>{int64_t(prompt.size())});
  }
};


TEST_P(PromptCacheSessionTest, SaveLoadContinueEqualsAnUninterruptedRun) {
  const auto prompt = ids(kC);
  Session first(*m.model, opts(), pool);
  PromptCache pc1 = cache();
  const PromptCacheLoad miss = pc1.prefill(first, prompt);
  EXPECT_EQ(miss.outcome, PromptCacheOutcome::Miss);
  EXPECT_TRUE(miss.warnings.empty());
  const PromptCacheSave saved = pc1.finish();
  EXPECT_TRUE(saved.warnings.empty());
  EXPECT_EQ(tokens_saved(saved), std::vector<int64_t>{158});
  ASSERT_EQ(saved.saved.back().path, file());
  EXPECT_EQ(saved.saved.back().bytes, fs::file_size(file()));
  expect_same_continuation(first, *cold(prompt));

  Session hot(*m.model, opts(), pool);
  PromptCache pc2 = cache();
  const PromptCacheLoad hit = pc2.prefill(hot, prompt);
  EXPECT_EQ(hit.outcome, PromptCacheOutcome::Hit);
  EXPECT_EQ(hit.reused, 158);
  EXPECT_EQ(hit.file, file());
  EXPECT_TRUE(hit.warnings.empty());
  EXPECT_EQ(hit.bytes_read, fs::file_size(file()));
  EXPECT_TRUE(pc2.finish().saved.empty());  // nothing new to write
  expect_same_continuation(hot, *cold(prompt));
}

TEST_P(PromptCacheSessionTest, AnExtendedPromptReusesAnExactPrefix) {
  const auto b = ids(kB), c = ids(kC);
  ASSERT_EQ(b.size(), 96u);
  ASSERT_TRUE(std::equal(b.begin(), b.end(), c.begin()));
  // 64 tokens: on the prefill grid of KIVI and StreamingLLM, and long enough for a dense cache.
  save(std::vector<int32_t>(c.begin(), c.begin() + 64));
  {
    Session hot(*m.model, opts(), pool);
    PromptCache pc = cache();
    const PromptCacheLoad load = pc.prefill(hot, c);
    EXPECT_EQ(load.outcome, PromptCacheOutcome::PartialHit);
    EXPECT_EQ(load.reused, 64);
    EXPECT_TRUE(load.warnings.empty());
    expect_same_continuation(hot, *cold(c));
    EXPECT_EQ(tokens_saved(pc.finish()), std::vector<int64_t>{158});  // the file now holds the longer prompt
  }
  // 96 tokens: dense caches extend any prefix; KIVI and StreamingLLM only one on the prefill grid,
  // where a cold prefill also applied its policy: the file is passed over, and no warning said.
  save(b);
  Session hot(*m.model, opts(), pool);
  PromptCache pc = cache();
  const PromptCacheLoad load = pc.prefill(hot, c);
  EXPECT_EQ(load.outcome, on_grid() ? PromptCacheOutcome::Miss : PromptCacheOutcome::PartialHit);
  EXPECT_EQ(load.reused, on_grid() ? 0 : 96);
  EXPECT_TRUE(load.warnings.empty());
  expect_same_continuation(hot, *cold(c));
}

TEST_P(PromptCacheSessionTest, ALongerCachedPromptIsNeverUsed) {
  save(ids(kB));
  const auto a = ids(kA);
  Session s(*m.model, opts(), pool);
  PromptCache pc = cache();
  const PromptCacheLoad load = pc.prefill(s, a);
  EXPECT_EQ(load.outcome, PromptCacheOutcome::Miss);
  EXPECT_EQ(load.reused, 0);
  EXPECT_TRUE(load.warnings.empty());
  expect_same_continuation(s, *cold(a));
}

TEST_P(PromptCacheSessionTest, AShortExtensionReusesOnlyAnExactPrefix) {
  // Dense: a rest of 2 tokens would run through the gemv path, which rounds differently than the
  // batched path of a cold prefill: not reused. KIVI and StreamingLLM: a prefix on the grid is.
  const auto c = ids(kC);
  save(std::vector<int32_t>(c.begin(), c.begin() + 64));
  const std::vector<int32_t> ext64(c.begin(), c.begin() + 66);
  {
    Session s(*m.model, opts(), pool);
    PromptCache pc = cache();
    EXPECT_EQ(pc.prefill(s, ext64).reused, on_grid() ? 64 : 0);
    expect_same_continuation(s, *cold(ext64));
  }
  // Dense: a rest of 17 tokens is still a small batch (kMatmulSmallRows), 18 is not.
  if (!on_grid())
    for (size_t rest : {size_t(17), size_t(18)}) {
      save(std::vector<int32_t>(c.begin(), c.begin() + 64));  // the last prefill saved its own prompt
      const std::vector<int32_t> ext(c.begin(), c.begin() + 64 + ptrdiff_t(rest));
      Session s(*m.model, opts(), pool);
      PromptCache pc = cache();
      EXPECT_EQ(pc.prefill(s, ext).reused, rest > size_t(kMatmulSmallRows) ? 64 : 0) << rest;
      expect_same_continuation(s, *cold(ext));
    }
  // 96 tokens, off the grid: reused by none.
  save(ids(kB));
  const auto ext = ids(kB + " And God");  // 2 more tokens
  ASSERT_EQ(ext.size(), 98u);
  Session s(*m.model, opts(), pool);
  PromptCache pc = cache();
  const PromptCacheLoad load = pc.prefill(s, ext);
  EXPECT_EQ(load.reused, 0);
  EXPECT_TRUE(load.warnings.empty());
  expect_same_continuation(s, *cold(ext));
}

// The property the reuse rule rests on, checked directly: splitting the prompt where the cache may
// split it gives the cold state bit for bit (a kernel change that breaks it fails here first).
TEST_P(PromptCacheSessionTest, SplitsTheCacheMayMakeAreExact) {
  const auto c = ids(kC);
  const std::vector<size_t> splits = on_grid() ? std::vector<size_t>{64, 128} : std::vector<size_t>{18, 43, 64, 101, c.size() - 18};
  for (size_t P : splits) {
    SCOPED_TRACE(P);
    Session split(*m.model, opts(), pool);
    split.feed(std::span(c).first(P));
    split.feed(std::span(c).subspan(P));
    expect_same_continuation(split, *cold(c));
  }
}

INSTANTIATE_TEST_SUITE_P(AllCaches, PromptCacheSessionTest, ::testing::ValuesIn(cache_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------------------------
// Through the binary.

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

const std::string kGreedy = " --temperature 0";
const std::string kSeeded = " --temperature 0.8 --seed 7";

test::RunResult sample(const std::string& prompt, const std::string& flags) {
  return test::run_command(test::binary() + " sample --prompt " + quote(prompt) + " --tokens 24 --ignore-eos --threads 2" +
                           flags);
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

size_t count_lines_with(const std::string& text, const std::string& part) {
  size_t n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += has(line, part);
  return n;
}

struct CliCase {
  const char* name;
  std::string flags;
};
const std::vector<CliCase> kCliCases = {
    {"fp32", ""},
    {"bf16", " --kv-quantize bf16"},
    {"int8", " --kv-quantize int8 --kv-group-size 8 --kv-residual 16"},
    {"int4", " --kv-quantize int4 --kv-group-size 8 --kv-residual 16"},
    {"int2", " --kv-quantize int2 --kv-group-size 8 --kv-residual 16"},
    {"streaming", " --streaming-llm-sink 4 --streaming-llm-window 24 --kv-group-size 8"},
};

// "prompt cache: hit, R of N tokens reused from": R, or -1 without such a line.
int64_t reused_of(const std::string& err) {
  const std::string key = "prompt cache: hit, ";
  const size_t at = err.find(key);
  return at == std::string::npos ? -1 : std::stoll(err.substr(at + key.size()));
}

// The block files under dir/blocks.
std::vector<fs::path> block_files(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::exists(dir / "blocks")) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir / "blocks"))
    if (e.is_regular_file() && e.path().extension() == ".kvblock") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(PromptCacheCliTest, HotEqualsColdForEveryConfigurationGreedyAndSeeded) {
  test::TempDir tmp;
  for (const CliCase& c : kCliCases) {
    SCOPED_TRACE(c.name);
    const fs::path d = tmp.path / c.name;
    const std::string dir = " --prompt-cache-dir " + d.string();
    const auto cold_g = sample(kB, c.flags + kGreedy), cold_s = sample(kB, c.flags + kSeeded);
    const auto miss = sample(kB, c.flags + kGreedy + dir);
    const auto hot_g = sample(kB, c.flags + kGreedy + dir), hot_s = sample(kB, c.flags + kSeeded + dir);
    for (const auto* r : {&cold_g, &cold_s, &miss, &hot_g, &hot_s}) ASSERT_EQ(r->code, 0) << r->err;
    EXPECT_TRUE(has(miss.err, "prompt cache: miss, 96 tokens prefilled\n")) << miss.err;
    EXPECT_TRUE(has(miss.err, "prompt cache: saved ")) << miss.err;
    EXPECT_TRUE(has(miss.err, " blocks to " + (d / "blocks").string())) << miss.err;
    // Whole blocks, the rest fed as a cold prefill feeds it: 64 of the 96 tokens (32-token blocks of a
    // dense cache, the rest over 17 rows; KIVI's 64-token grid); StreamingLLM (blocks of 8) up to a rest
    // of over 17 rows.
    const int64_t reused = std::string(c.name) == "streaming" ? 76 : 64;
    EXPECT_TRUE(has(hot_g.err, "prompt cache: hit, " + std::to_string(reused) + " of 96 tokens reused from " +
                                   (d / "blocks").string())) << hot_g.err;
    EXPECT_TRUE(has(hot_g.err, ", " + std::to_string(96 - reused) + " prefilled")) << hot_g.err;
    EXPECT_EQ(reused_of(hot_s.err), reused) << hot_s.err;
    EXPECT_FALSE(has(hot_g.err + miss.err, "warning")) << hot_g.err << miss.err;
    EXPECT_EQ(miss.out, cold_g.out);
    EXPECT_EQ(hot_g.out, cold_g.out);
    EXPECT_EQ(hot_s.out, cold_s.out);
    EXPECT_NE(cold_s.out, cold_g.out);  // the seeded runs really sample
  }
}

TEST(PromptCacheCliTest, PartialHitsGiveTheColdOutput) {
  test::TempDir tmp;
  // fp32, directory: the 43-token prompt's one whole block is taken.
  const std::string dir = " --prompt-cache-dir " + (tmp.path / "d").string();
  ASSERT_EQ(sample(kA, kGreedy + dir).code, 0);
  auto r = sample(kB, kGreedy + dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "prompt cache: hit, 32 of 96 tokens reused from")) << r.err;
  EXPECT_TRUE(has(r.err, "64 prefilled")) << r.err;
  EXPECT_EQ(r.out, sample(kB, kGreedy).out);

  // int4, directory: the prefix ends on the 64-token prefill grid.
  const std::string kivi = " --kv-quantize int4 --kv-group-size 8 --kv-residual 16 --prompt-cache-dir " +
                           (tmp.path / "k").string();
  ASSERT_EQ(sample(kB, kGreedy + kivi).code, 0);
  r = sample(kC, kGreedy + kivi);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "prompt cache: hit, 64 of 158 tokens reused from")) << r.err;
  EXPECT_EQ(r.out, sample(kC, kGreedy + " --kv-quantize int4 --kv-group-size 8 --kv-residual 16").out);

  // fp32, one file: extended, then rewritten with the longer prompt.
  const std::string file = " --cache-prompt " + (tmp.path / "one.kvcache").string();
  ASSERT_EQ(sample(kA, kSeeded + file).code, 0);
  r = sample(kB, kSeeded + file);
  EXPECT_TRUE(has(r.err, "prompt cache: partial hit, 43 of 96 tokens reused from")) << r.err;
  EXPECT_TRUE(has(r.err, "prompt cache: saved 96 tokens to")) << r.err;
  EXPECT_EQ(r.out, sample(kB, kSeeded).out);
  EXPECT_TRUE(has(sample(kB, kSeeded + file).err, "prompt cache: hit, 96 tokens")) << r.err;
}

// Each damage: one warning line, the cold output, exit 0, and the file replaced by a good one.
TEST(PromptCacheCliTest, DamagedFilesWarnOnceAndRunCold) {
  test::TempDir tmp;
  const fs::path file = tmp.path / "p.kvcache";
  const std::string flag = " --cache-prompt " + file.string();
  const auto cold = sample(kB, kGreedy);
  ASSERT_EQ(cold.code, 0);
  struct Damage {
    const char* expect;
    std::function<void()> apply;
    bool ours = true;  // still a file of ours (replaced by the save); another program's is left as it is
  };
  auto edit = [&](auto fn) {
    return [&, fn] {
      std::string bytes = read_file(file);
      fn(bytes);
      write_file(file, bytes);
    };
  };
  const std::vector<Damage> damages = {
      {"truncated: ", edit([](std::string& b) { b.resize(b.size() / 2); })},
      {"checksum mismatch", edit([](std::string& b) { b[b.size() / 3] ^= 0x40; })},
      {"checksum mismatch", edit([](std::string& b) { b[b.size() - 1] ^= 0x01; })},
      {"format version 7, this build reads version 3", edit([](std::string& b) { b[8] = 7; })},
      {"truncated: 0 bytes", edit([](std::string& b) { b.clear(); })},
      {"not a prompt-cache file", edit([](std::string& b) { b = std::string(4096, 'x'); }), false},
      {"written for model qwen2-tiny",
       [&] { sample("And God said", kGreedy + flag + " " + test::repo_model("qwen2-tiny").string()); }},
      {"written with KV setting 'int8 g32 r128', this run uses 'fp32'",
       [&] { sample(kB, kGreedy + flag + " --kv-quantize int8"); }},
      {"written with --kv-group-size 16", [&] { sample(kB, kGreedy + flag + " --kv-group-size 16"); }},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.expect);
    fs::remove(file);
    ASSERT_EQ(sample(kB, kGreedy + flag).code, 0);
    d.apply();
    const auto r = sample(kB, kGreedy + flag);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, cold.out);
    EXPECT_EQ(count_lines_with(r.err, "warning: prompt cache: ignoring " + file.string() + ": "), 1u) << r.err;
    EXPECT_EQ(count_lines_with(r.err, "warning"), d.ours ? 1u : 2u) << r.err;
    EXPECT_TRUE(has(r.err, d.expect)) << r.err;
    EXPECT_TRUE(has(r.err, "prompt cache: miss, 96 tokens prefilled")) << r.err;
    if (!d.ours) {
      EXPECT_TRUE(has(r.err, "warning: prompt cache: not saving " + file.string() +
                                 ": it is not a prompt-cache file (left as it is)")) << r.err;
      EXPECT_EQ(read_file(file), std::string(4096, 'x'));
      continue;
    }
    EXPECT_TRUE(has(r.err, "prompt cache: saved 96 tokens to " + file.string())) << r.err;
    EXPECT_TRUE(has(sample(kB, kGreedy + flag).err, "prompt cache: hit, 96 tokens")) << "not replaced";
  }
}

// A damaged block file: one warning, a miss from there on, the cold output; the run writes the block
// again, so that the next one hits.
TEST(PromptCacheCliTest, ADamagedBlockInTheDirectoryIsReportedAndReplaced) {
  test::TempDir tmp;
  const std::string dir = " --prompt-cache-dir " + tmp.path.string();
  ASSERT_EQ(sample(kB, kGreedy + dir).code, 0);
  const auto files = block_files(tmp.path);
  ASSERT_FALSE(files.empty());
  for (const fs::path& f : files) {  // every block: the prompt's first one among them
    std::string bytes = read_file(f);
    bytes[bytes.size() / 2] ^= 0x02;
    write_file(f, bytes);
  }
  const auto r = sample(kB, kGreedy + dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(count_lines_with(r.err, "warning: kv store: ignoring the value of"), 1u) << r.err;
  EXPECT_TRUE(has(r.err, "checksum mismatch")) << r.err;
  EXPECT_TRUE(has(r.err, "prompt cache: miss, 96 tokens prefilled")) << r.err;
  EXPECT_EQ(r.out, sample(kB, kGreedy).out);
  EXPECT_EQ(reused_of(sample(kB, kGreedy + dir).err), 64) << "not replaced";
}

TEST(PromptCacheCliTest, AnUnusableDirectoryOrAFullDiskWarnsAndRunsCold) {
  test::TempDir tmp;
  const auto cold = sample(kB, kGreedy);
  // The directory is a regular file.
  write_file(tmp.path / "file", "x");
  auto r = sample(kB, kGreedy + " --prompt-cache-dir " + (tmp.path / "file").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, cold.out);
  EXPECT_EQ(count_lines_with(r.err, "warning: prompt cache: cannot use " + (tmp.path / "file").string()), 1u) << r.err;
  // The disk is full: the writes fail (a file size limit stands in for a full disk), nothing is left behind.
  const fs::path full = tmp.path / "full";
  fs::create_directory(full);
  r = test::run_command("ulimit -f 64 && trap '' XFSZ && " + test::binary() + " sample --prompt " + quote(kB) +
                        " --tokens 24 --ignore-eos --threads 2" + kGreedy + " --prompt-cache-dir " + full.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, cold.out);
  EXPECT_EQ(count_lines_with(r.err, "warning: prompt cache: "), 1u) << r.err;
  EXPECT_TRUE(has(r.err, "blocks not written to " + (full / "blocks").string())) << r.err;
  EXPECT_TRUE(block_files(full).empty());
  for (const auto& e : fs::recursive_directory_iterator(full)) EXPECT_TRUE(e.is_directory()) << e.path();
  // A directory it may not read (only meaningful when not root: root reads everything).
  if (::geteuid() != 0) {
    const fs::path locked = tmp.path / "locked";
    fs::create_directory(locked);
    fs::permissions(locked, fs::perms::none);
    r = sample(kB, kGreedy + " --prompt-cache-dir " + locked.string());
    fs::permissions(locked, fs::perms::owner_all);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, cold.out);
    EXPECT_TRUE(has(r.err, "warning: prompt cache:")) << r.err;
  }
}

TEST(PromptCacheCliTest, ChangingAnyKeyFieldIsAMiss) {
  test::TempDir tmp;
  const fs::path model = tmp.path / "kjv-tiny";
  fs::copy(test::repo_model("kjv-tiny"), model, fs::copy_options::recursive);
  const std::string base = kGreedy + " --prompt-cache-dir " + (tmp.path / "cache").string() + " " + model.string();
  auto status = [&](const std::string& prompt, const std::string& extra) {
    const auto r = sample(prompt, base + extra);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_FALSE(has(r.err, "warning")) << r.err;
    return has(r.err, "prompt cache: hit") ? "hit" : has(r.err, "prompt cache: miss") ? "miss" : "other";
  };
  EXPECT_STREQ(status(kB, ""), "miss");
  EXPECT_STREQ(status(kB, ""), "hit");
  set_mtime(model / "model.safetensors", 1000000000);  // the weights touched
  EXPECT_STREQ(status(kB, ""), "miss");
  EXPECT_STREQ(status(kB, ""), "hit");
  std::ofstream(model / "tokenizer.json", std::ios::app) << "\n";  // another tokenizer file
  EXPECT_STREQ(status(kB, ""), "miss");
  EXPECT_STREQ(status(kB, " --kv-group-size 16"), "miss");
  EXPECT_STREQ(status(kB, " --kv-quantize bf16"), "miss");
  EXPECT_STREQ(status(kB, " --streaming-positions cache --streaming-llm-window 64"), "miss");
  std::string edited = kB;
  edited[edited.find("Noah")] = 'n';  // one character of the prompt
  EXPECT_STREQ(status(edited, ""), "miss");
  EXPECT_STREQ(status(kB, ""), "hit");
}

TEST(PromptCacheCliTest, FourConcurrentWritersLeaveValidBlocks) {
  test::TempDir tmp;
  const std::string cmd = test::binary() + " sample --prompt " + quote(kB) +
                          " --tokens 4 --temperature 0 --threads 1 --prompt-cache-dir " + tmp.path.string() +
                          " >/dev/null 2>&1";
  const auto r = test::run_command("(" + cmd + " & " + cmd + " & " + cmd + " & " + cmd + " & wait)");
  ASSERT_EQ(r.code, 0) << r.err;
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(tmp.path / "blocks"))
    if (e.is_regular_file()) {
      ++files;
      EXPECT_EQ(e.path().extension(), ".kvblock") << e.path();  // no temporaries
    }
  EXPECT_EQ(files, 3u);  // 100 tokens: 3 whole blocks, each written by every writer, one file each
  const auto inspect = test::run_command(test::binary() + " cache inspect " + tmp.path.string());
  EXPECT_EQ(inspect.code, 0) << inspect.out;
  EXPECT_TRUE(has(inspect.out, "status: ok")) << inspect.out;
  const auto hot = sample(kB, kGreedy + " --prompt-cache-dir " + tmp.path.string());
  EXPECT_EQ(reused_of(hot.err), 64) << hot.err;
  EXPECT_EQ(hot.out, sample(kB, kGreedy).out);
}

// The directory's bound removes the least recently used blocks first: a block taken by a hit is used.
TEST(PromptCacheCliTest, MaxMbRemovesTheLeastRecentlyUsedBlocks) {
  test::TempDir tmp;
  // Each prompt fills one 32-token block (a 64 KiB file for kjv-tiny in fp32), and leaves over 17 tokens
  // after it: a repeat takes the block. Room for three of them.
  const std::string flags = " --tokens 1" + kGreedy + " --threads 2 --prompt-cache-dir " + tmp.path.string() +
                            " --prompt-cache-max-mb 0.25";
  auto run = [&](const std::string& prompt) {
    const auto r = test::run_command(test::binary() + " sample --prompt " + quote(prompt) + flags);
    EXPECT_EQ(r.code, 0) << r.err;
    return r.err;
  };
  const std::vector<std::string> p = {
      kA + " And the ark rested in the seventh month",
      "In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness "
      "was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God said, Let there "
      "be light",
      "And God said, Let there be light: and there was light. And God saw the light, that it was good: and God divided "
      "the light from the darkness. And God called the light Day, and the darkness he called Night.",
      "And the evening and the morning were the first day. And God said, Let there be a firmament in the midst of the "
      "waters, and let it divide the waters from the waters; and it was so. And God called the firmament Heaven."};
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(has(run(p[i]), "prompt cache: miss")) << i;
  ASSERT_EQ(block_files(tmp.path).size(), 3u);
  EXPECT_TRUE(has(run(p[0]), "prompt cache: hit, 32 of")) << "the first block used again: now the second is the oldest";
  const std::string err = run(p[3]);
  EXPECT_TRUE(has(err, "prompt cache: removed 1 least recently used block files")) << err;
  EXPECT_EQ(block_files(tmp.path).size(), 3u);
  EXPECT_TRUE(has(run(p[1]), "prompt cache: miss"));
  EXPECT_TRUE(has(run(p[3]), "prompt cache: hit"));
}

TEST(PromptCacheCliTest, CacheCommandListsInspectsAndPrunes) {
  test::TempDir tmp;
  const std::string dir = kGreedy + " --prompt-cache-dir " + tmp.path.string();
  ASSERT_EQ(sample(kB, dir).code, 0);
  ASSERT_EQ(sample(kB, dir + " --kv-quantize int4 --kv-group-size 8 --kv-residual 16").code, 0);
  const std::string cache = test::binary() + " cache ";
  auto ls = test::run_command(cache + "ls " + tmp.path.string());
  ASSERT_EQ(ls.code, 0) << ls.err;
  const size_t n = block_files(tmp.path).size();
  EXPECT_TRUE(has(ls.out, std::to_string(n) + " blocks, ")) << ls.out;
  EXPECT_EQ(count_lines_with(ls.out, "identity "), 2u) << ls.out;
  EXPECT_TRUE(has(ls.out, "int4 groups")) << ls.out;
  EXPECT_TRUE(has(ls.out, "fp32")) << ls.out;

  const fs::path block = block_files(tmp.path).front();
  auto inspect = test::run_command(cache + "inspect " + block.string());
  ASSERT_EQ(inspect.code, 0) << inspect.out << inspect.err;
  EXPECT_TRUE(has(inspect.out, "status: ok (checksum verified)")) << inspect.out;
  EXPECT_TRUE(has(inspect.out, "format version: 3 (block value)")) << inspect.out;
  EXPECT_TRUE(has(inspect.out, "tokens: ")) << inspect.out;
  EXPECT_EQ(test::run_command(cache + "inspect " + tmp.path.string()).code, 0);

  std::string bytes = read_file(block);
  bytes[bytes.size() / 2] ^= 0x04;
  write_file(block, bytes);
  inspect = test::run_command(cache + "inspect " + block.string());
  EXPECT_EQ(inspect.code, 1);
  EXPECT_TRUE(has(inspect.out, "status: damaged: checksum mismatch")) << inspect.out;
  EXPECT_TRUE(has(test::run_command(cache + "ls " + tmp.path.string()).out, "1 damaged"));

  auto prune = test::run_command(cache + "prune " + tmp.path.string());
  ASSERT_EQ(prune.code, 0) << prune.err;
  EXPECT_TRUE(has(prune.out, "removed " + block.string())) << prune.out;
  EXPECT_EQ(block_files(tmp.path).size(), n - 1);
  prune = test::run_command(cache + "prune " + tmp.path.string() + " --max-mb 0");
  ASSERT_EQ(prune.code, 0) << prune.err;
  EXPECT_TRUE(block_files(tmp.path).empty());
  EXPECT_EQ(test::run_command(cache + "ls " + (tmp.path / "nope").string()).code, 1);

  // A --cache-prompt file is inspected as one prompt's state.
  const fs::path file = tmp.path / "one.kvcache";
  ASSERT_EQ(sample(kA, kGreedy + " --cache-prompt " + file.string()).code, 0);
  inspect = test::run_command(cache + "inspect " + file.string());
  ASSERT_EQ(inspect.code, 0) << inspect.out;
  EXPECT_TRUE(has(inspect.out, "model: kjv-tiny (LlamaForCausalLM), vocab 8192, 4 layers")) << inspect.out;
  EXPECT_TRUE(has(inspect.out, "tokens: 43,")) << inspect.out;
}

TEST(PromptCacheCliTest, ConflictingFlagsAreUsageErrors) {
  EXPECT_EQ(sample("x", " --no-cache --prompt-cache-dir /tmp/x").code, 2);
  EXPECT_EQ(sample("x", " --no-cache --cache-prompt /tmp/x.kvcache").code, 2);
  EXPECT_EQ(sample("x", " --prompt-cache-max-mb 1").code, 2);  // needs --prompt-cache-dir
  EXPECT_EQ(sample("x", " --prompt-cache-dir /tmp/x --prompt-cache-max-mb 0").code, 2);
}

}  // namespace
}  // namespace ptllm
