// Defects an adversarial probe found, each a test: shape arithmetic from config.json, files that
// are not regular files (FIFOs never hang a reader), size limits, files a save must never replace or
// a prune never delete, temporaries of killed writers, signals during a save, and values that used
// to be accepted silently.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "core/mapped_file.h"
#include "engine/prompt_cache.h"
#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void spit(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }
bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The error text of f(), "" when it did not throw ptllm::Error.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

json kjv_config() { return test::read_json(test::repo_model("kjv-tiny") / "config.json"); }

// A copy of kjv-tiny (symlinks to its files) with config.json replaced.
fs::path model_with_config(const fs::path& dir, const json& cfg) {
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(test::repo_model("kjv-tiny")))
    if (e.path().filename() != "config.json") fs::create_symlink(e.path(), dir / e.path().filename());
  spit(dir / "config.json", cfg.dump());
  return dir;
}

// A command with a time limit: a hang is exit code 124, not a stuck test.
test::RunResult run_limited(const std::string& cmd, int seconds = 20) {
  return test::run_command("cd " + test::repo_dir().string() + " && timeout " + std::to_string(seconds) + " " + cmd);
}

const std::string kSample = " sample models/kjv-tiny -p 'In the beginning God created' -n 8 --temperature 0 --threads 1";

// ---------------------------------------------------------------------------------------------
// (a) shape arithmetic

TEST(ConfigBoundsTest, AHeadCountWhoseWidthWrapsIn32BitsIsRefusedWithTheTrueProduct) {
  json c = kjv_config();
  c["num_attention_heads"] = 134217732;  // * 32 = 4294967424 = 2^32 + 128: 128 in 32-bit arithmetic
  c["num_key_value_heads"] = 134217732;
  const std::string e = error_of([&] { ModelConfig::from_json(c, "config.json"); });
  EXPECT_TRUE(has(e, "num_attention_heads")) << e;
  EXPECT_TRUE(has(e, "4294967424")) << e;
  // The same through the loader: an error, never the forward pass.
  test::TempDir tmp;
  const std::string e2 = error_of([&] { Model::load(model_with_config(tmp.path / "m", c)); });
  EXPECT_TRUE(has(e2, "4294967424")) << e2;
}

TEST(ConfigBoundsTest, HugeCountsAreRefusedBeforeAnythingIsAllocated) {
  for (const char* key : {"num_hidden_layers", "vocab_size", "hidden_size", "intermediate_size"}) {
    SCOPED_TRACE(key);
    json c = kjv_config();
    c[key] = 2147483647;
    const std::string e = error_of([&] { ModelConfig::from_json(c, "config.json"); });
    EXPECT_TRUE(has(e, std::string("'") + key + "' is 2147483647, more than")) << e;
  }
  json c = kjv_config();
  c["num_hidden_layers"] = 10000000;
  test::TempDir tmp;
  const auto r = run_limited((test::binary() + " sample " + model_with_config(tmp.path / "m", c).string() +
                                     " -p hi -n 1"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, "num_hidden_layers' is 10000000")) << r.err;
  EXPECT_FALSE(has(r.err, "bad_alloc")) << r.err;
}

// Past the trained positions is a warning naming both numbers (as llama.cpp's), not a refusal: the
// capacity is bounded by memory only (the next test).
TEST(ConfigBoundsTest, CtxSizeAboveMaxPositionEmbeddingsIsAWarning) {
  const auto r = run_limited((test::binary() + kSample + " --ctx-size 4096"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "warning: a context of 4096 tokens a sequence (--ctx-size) is more than the model's "
                         "max_position_embeddings (2048, config.json)"))
      << r.err;
  const auto ok = run_limited((test::binary() + kSample + " --ctx-size 2048"));
  EXPECT_EQ(ok.code, 0);
  EXPECT_FALSE(has(ok.err, "max_position_embeddings")) << ok.err;
}

// A capacity the model allows but the machine cannot hold: the sizes, before anything is allocated
// (kjv-tiny stores kilobytes a token: 2^30 of them are terabytes).
TEST(ConfigBoundsTest, ACtxSizeBeyondTheMachinesMemoryIsRefusedWithTheSizes) {
  json c = kjv_config();
  c["max_position_embeddings"] = 1 << 30;
  test::TempDir tmp;
  const std::string model = model_with_config(tmp.path / "m", c).string();
  const auto r = run_limited(test::binary() + " sample " + model + " -p hi -n 1 --ctx-size 1073741824");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, "the KV cache needs")) << r.err;
  EXPECT_TRUE(has(r.err, "of memory available (MemAvailable")) << r.err;
  EXPECT_FALSE(has(r.err, "bad_alloc")) << r.err;
  // Without preallocation the blocks come as the context grows: only their bookkeeping is counted.
  EXPECT_EQ(run_limited(test::binary() + " sample " + model + " -p hi -n 1 --ctx-size 1048576 --no-kv-preallocate").code,
            0);
}

TEST(SafetensorsTest, ATensorNamedTwiceInTheHeaderIsRefused) {
  test::TempDir tmp;
  const fs::path p = tmp.path / "model.safetensors";
  const std::string four(16, '\0');
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  test::write_safetensors(p, {{"a", "F32", {4}, four}}, header);
  const std::string e = error_of([&] { SafetensorsFile f(p); });
  EXPECT_TRUE(has(e, "tensor 'a' appears twice")) << e;
  // Nested objects may repeat a key of the top level ("__metadata__" values, "dtype" in every entry).
  test::write_safetensors(p, {{"a", "F32", {4}, four}, {"b", "F32", {4}, four}});
  EXPECT_EQ(error_of([&] { SafetensorsFile f(p); }), "");
}

// ---------------------------------------------------------------------------------------------
// (f) FIFOs and other non-regular files; (g) size limits

struct Fifo {
  fs::path path;
  explicit Fifo(fs::path p) : path(std::move(p)) { EXPECT_EQ(::mkfifo(path.c_str(), 0644), 0); }
};

TEST(FileReadTest, AFifoOrASymlinkToOneIsAnErrorNotAHang) {
  test::TempDir tmp;
  Fifo fifo(tmp.path / "fifo");
  fs::create_symlink(fifo.path, tmp.path / "link");
  for (const fs::path& p : {fifo.path, tmp.path / "link"}) {
    const std::string e = error_of([&] { read_whole_file(p, 100, "a test"); });
    EXPECT_TRUE(has(e, "is a FIFO, not a regular file")) << e;
    EXPECT_TRUE(has(error_of([&] { MappedFile m(p); }), "is a FIFO")) << p;
    EXPECT_TRUE(has(error_of([&] { ModelConfig::load(p); }), "is a FIFO")) << p;
    EXPECT_TRUE(has(error_of([&] { read_cache_header(p); }), "is a FIFO")) << p;
  }
  EXPECT_TRUE(has(error_of([&] { read_whole_file("/dev/zero", 100, "a test"); }), "is a character device"));
  EXPECT_TRUE(has(error_of([&] { read_whole_file(tmp.path, 100, "a test"); }), "is a directory"));
}

TEST(FileReadTest, AFileOverItsLimitIsRefusedBeforeItIsRead) {
  test::TempDir tmp;
  spit(tmp.path / "big", std::string(101, 'x'));
  spit(tmp.path / "ok", std::string(100, 'x'));
  const std::string e = error_of([&] { read_whole_file(tmp.path / "big", 100, "a test"); });
  EXPECT_TRUE(has(e, "is 101 bytes, more than the limit of 100 bytes for a test")) << e;
  EXPECT_EQ(read_whole_file(tmp.path / "ok", 100, "a test"), std::string(100, 'x'));
  // config.json is limited to 64 MiB: a sparse file of 3 GB is refused at once.
  const fs::path dir = tmp.path / "m";
  model_with_config(dir, kjv_config());
  fs::remove(dir / "config.json");
  { std::ofstream(dir / "config.json") << "{"; }
  fs::resize_file(dir / "config.json", uint64_t(3) << 30);
  const std::string e2 = error_of([&] { ModelConfig::load(dir / "config.json"); });
  EXPECT_TRUE(has(e2, "more than the limit")) << e2;
}

TEST(FileReadTest, EveryCliReaderRefusesAFifoAtOnce) {
  test::TempDir tmp;
  Fifo fifo(tmp.path / "fifo");
  const std::string f = fifo.path.string(), b = test::binary();
  struct Case {
    std::string cmd, expect;
  };
  // A model directory whose config.json, tokenizer.json or model.safetensors is a FIFO.
  auto model_with_fifo = [&](const std::string& name) {
    const fs::path dir = tmp.path / ("m-" + name);
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(test::repo_model("kjv-tiny")))
      if (e.path().filename() != name) fs::create_symlink(e.path(), dir / e.path().filename());
    fs::create_symlink(fifo.path, dir / name);
    return dir.string();
  };
  const std::vector<Case> cases = {
      {b + " cache inspect " + f, "is a FIFO"},
      {b + " eval models/kjv-tiny --text " + f, "is a FIFO"},
      {b + " sample models/kjv-tiny -f " + f + " -n 1", "is a FIFO"},
      {b + " tokenize models/kjv-tiny --file " + f, "is a FIFO"},
      {b + " tokenize models/kjv-tiny --jsonl " + f, "is a FIFO"},
      {b + " sample " + model_with_fifo("config.json") + " -p hi -n 1", "is a FIFO"},
      {b + " sample " + model_with_fifo("tokenizer.json") + " -p hi -n 1", "is a FIFO"},
      {b + " sample " + model_with_fifo("tokenizer_config.json") + " -p hi -n 1", "is a FIFO"},
      {b + " sample " + model_with_fifo("model.safetensors") + " -p hi -n 1", "is a FIFO"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.cmd);
    const auto r = run_limited((c.cmd), 30);
    EXPECT_NE(r.code, 124) << "hung";
    EXPECT_NE(r.code, 0);
    EXPECT_TRUE(has(r.err + r.out, c.expect)) << r.err << r.out;
  }
  // --cache-prompt FIFO: a warning, the cold run, and the FIFO left as it is.
  const auto cold = run_limited((b + kSample));
  const auto r = run_limited((b + kSample + " --cache-prompt " + f), 30);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, cold.out);
  EXPECT_TRUE(has(r.err, "is a FIFO")) << r.err;
  struct stat st {};
  ASSERT_EQ(::lstat(f.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

// ---------------------------------------------------------------------------------------------
// (b) --cache-prompt never replaces a file that is not ours

TEST(CacheOwnershipTest, CachePromptNeverReplacesAFileThatIsNotACacheFile) {
  test::TempDir tmp;
  const std::string b = test::binary();
  const auto cold = run_limited((b + kSample));
  ASSERT_EQ(cold.code, 0) << cold.err;
  const fs::path text = tmp.path / "notes.txt", cfg = tmp.path / "config.json", hard = tmp.path / "hard";
  spit(text, "my notes\n");
  spit(cfg, slurp(test::repo_model("kjv-tiny") / "config.json"));
  fs::create_hard_link(text, hard);
  fs::create_symlink(cfg, tmp.path / "link");
  for (const fs::path& p : {text, cfg, hard, tmp.path / "link"}) {
    SCOPED_TRACE(p);
    const std::string before = slurp(p);
    const auto r = run_limited((b + kSample + " --cache-prompt " + p.string()));
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, cold.out);
    EXPECT_TRUE(has(r.err, "not saving " + p.string())) << r.err;
    EXPECT_EQ(slurp(p), before);
  }
  EXPECT_TRUE(fs::is_symlink(tmp.path / "link"));
  EXPECT_EQ(fs::hard_link_count(text), 2u);
  // A missing file is created, and one of ours is replaced (then used).
  const fs::path cache = tmp.path / "p.kvcache";
  ASSERT_EQ(run_limited((b + kSample + " --cache-prompt " + cache.string())).code, 0);
  EXPECT_TRUE(is_prompt_cache_file(cache));
  const auto hot = run_limited((b + kSample + " --cache-prompt " + cache.string()));
  EXPECT_TRUE(has(hot.err, "prompt cache: hit")) << hot.err;
  EXPECT_EQ(hot.out, cold.out);
  for (const auto& f : files_in(tmp.path)) EXPECT_FALSE(has(f, ".tmp-")) << f;
}

// ---------------------------------------------------------------------------------------------
// (c) cache prune deletes only what it wrote; (e) stale temporaries

// A dead pid: a child that has exited and been reaped.
int dead_pid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return int(pid);
}

TEST(CacheOwnershipTest, PruneRemovesOnlyFilesOfOurs) {
  test::TempDir tmp;
  const fs::path d = tmp.path / "cache";
  const std::string sample = test::binary() +
                             " sample models/kjv-tiny -n 1 --temperature 0 --threads 1 -p 'And God said, Let there be "
                             "light: and there was light. And God saw the light, that it was good: and God divided the "
                             "light from the darkness. And God called the light Day, and the darkness he called "
                             "Night. And the evening and the morning were the first day.' --prompt-cache-dir " +
                             d.string();
  ASSERT_EQ(run_limited(sample).code, 0);
  std::vector<fs::path> blocks;
  for (const auto& e : fs::recursive_directory_iterator(d / "blocks"))
    if (e.path().extension() == ".kvblock") blocks.push_back(e.path());
  ASSERT_FALSE(blocks.empty());
  const fs::path sub = blocks.front().parent_path();
  // Another program's files, beside the blocks and above them, some with our extensions.
  const std::vector<fs::path> foreign = {d / "video.kvcache", d / "notes.kvblock", d / "blocks" / "notes.txt",
                                         sub / "notes.txt", sub / (blocks.front().filename().string() + ".tmp-backup")};
  for (const fs::path& f : foreign) spit(f, std::string(4096, 'v'));
  // Temporaries: of a writer that is gone (removed), of this live process (kept).
  const fs::path gone = blocks.front().string() + ".tmp-" + std::to_string(dead_pid()) + "-0123abcd";
  const fs::path live = blocks.front().string() + ".tmp-" + std::to_string(getpid()) + "-0123abcd";
  spit(gone, "partial");
  spit(live, "partial");

  const auto r = run_limited(test::binary() + " cache prune " + d.string() + " --max-mb 0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "removed " + gone.string())) << r.out;
  EXPECT_FALSE(fs::exists(gone));
  for (const fs::path& b : blocks) EXPECT_FALSE(fs::exists(b)) << b;
  for (const fs::path& f : foreign) EXPECT_TRUE(fs::exists(f)) << f;
  EXPECT_TRUE(fs::exists(live));
}

TEST(CacheOwnershipTest, TemporaryNamesAreRecognisedExactly) {
  EXPECT_EQ(temporary_writer("a.kvcache.tmp-123-0123abcd"), std::optional<int>(123));
  EXPECT_EQ(temporary_writer("a-0f.kvblock.tmp-7-ffffffff"), std::optional<int>(7));
  for (const char* n : {"a.kvcache", "a.kvcache.tmp-", "a.kvcache.tmp-backup", "a.kvcache.tmp-12-0123abc", "a.kvcache.tmp-12-0123abcg",
                        "a.kvcache.tmp--1-0123abcd", "a.kvcache.tmp-x-0123abcd", ".tmp-1-0123abcd"})
    EXPECT_EQ(temporary_writer(n), std::nullopt) << n;
}

TEST(AtomicWriteTest, AFileAppearsWholeOrNotAtAllAndLeavesNoTemporary) {
  test::TempDir tmp;
  const fs::path p = tmp.path / "out.bin";
  spit(p, "old");
  {
    AtomicFile f(p);
    f.write("new ");
    EXPECT_EQ(slurp(p), "old");  // nothing under the final name until commit()
    EXPECT_EQ(files_in(tmp.path).size(), 2u);
  }  // abandoned: the temporary goes, the old file stays
  EXPECT_EQ(files_in(tmp.path), std::vector<std::string>{"out.bin"});
  EXPECT_EQ(slurp(p), "old");
  {
    AtomicFile f(p);
    f.write("new ");
    f.write("bytes");
    EXPECT_EQ(f.commit(), 9u);
  }
  EXPECT_EQ(slurp(p), "new bytes");
  EXPECT_EQ(write_file_atomically(p, {"a", "", "bc"}), 3u);
  EXPECT_EQ(slurp(p), "abc");
  EXPECT_EQ(files_in(tmp.path), std::vector<std::string>{"out.bin"});
  // A directory that does not exist: an error naming the temporary.
  EXPECT_TRUE(has(error_of([&] { write_file_atomically(tmp.path / "no" / "x", {"a"}); }), "cannot create"));
}

// ---------------------------------------------------------------------------------------------
// (e) signals and full disks during a save

TEST(CacheSaveSignalsTest, AFileSizeLimitIsAWarningAndTheSameOutput) {
  test::TempDir tmp;
  const std::string b = test::binary();
  // A prompt of more than one 32-token block, so that the directory has a block to write.
  const std::string sample = " sample models/kjv-tiny -p 'In the beginning God created the heaven and the earth. And "
                             "the earth was without form, and void; and darkness was upon the face of the deep.' -n 8 "
                             "--temperature 0 --threads 1";
  const auto cold = run_limited((b + sample));
  // ulimit -f is in blocks of 1 KiB: the cache file or block (tens of KiB) cannot be written.
  for (const std::string& where : {" --prompt-cache-dir " + (tmp.path / "d").string(),
                                   " --cache-prompt " + (tmp.path / "f.kvcache").string()}) {
    SCOPED_TRACE(where);
    const auto r = run_limited("sh -c \"ulimit -f 8; exec " + b + sample + where + "\"");
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, cold.out);
    EXPECT_TRUE(has(r.err, "File too large")) << r.err;
  }
  for (const auto& e : fs::recursive_directory_iterator(tmp.path))
    EXPECT_FALSE(has(e.path().filename().string(), ".tmp-")) << e.path();
  EXPECT_FALSE(fs::exists(tmp.path / "f.kvcache"));
}

TEST(CacheSaveSignalsTest, AClosedStdoutStillSavesAWholeFile) {
  test::TempDir tmp;
  const fs::path f = tmp.path / "p.kvcache";
  // (The parentheses: run_command's "</dev/null" then feeds the pipeline, not head.)
  const auto r = test::run_command("(cd " + test::repo_dir().string() + " && timeout 20 " + test::binary() +
                                   " sample models/kjv-tiny -p 'In the beginning' -n 200 --ignore-eos --temperature 0 "
                                   "--threads 1 --cache-prompt " + f.string() + " | head -c 1)");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.size(), 1u);
  // Told as what it is, not as a Ctrl-C.
  EXPECT_NE(r.err.find("stopped: stdout was closed (nobody reads the output)"), std::string::npos) << r.err;
  std::string buffer;
  EXPECT_EQ(error_of([&] { read_cache_file(f, buffer); }), "");
  EXPECT_EQ(files_in(tmp.path), std::vector<std::string>{"p.kvcache"});
}

// ---------------------------------------------------------------------------------------------
// (h) tokenizer files accepted silently before

fs::path tokenizer_dir(const fs::path& dir, const std::function<void(json&, json&)>& edit) {
  fs::create_directories(dir);
  json tok = test::read_json(test::repo_model("kjv-tiny") / "tokenizer.json");
  json cfg = test::read_json(test::repo_model("kjv-tiny") / "tokenizer_config.json");
  edit(tok, cfg);
  spit(dir / "tokenizer.json", tok.dump());
  spit(dir / "tokenizer_config.json", cfg.dump());
  return dir;
}

TEST(TokenizerFileTest, UnknownBosTokenEmptyVocabAndDuplicateIdsAreErrors) {
  test::TempDir tmp;
  auto load_error = [&](const std::string& name, const std::function<void(json&, json&)>& edit) {
    return error_of([&] { Tokenizer::load(tokenizer_dir(tmp.path / name, edit)); });
  };
  EXPECT_EQ(load_error("ok", [](json&, json&) {}), "");
  std::string e = load_error("bos", [](json&, json& c) { c["bos_token"] = "<start>"; });
  EXPECT_TRUE(has(e, "bos_token '<start>' is not a token")) << e;
  e = load_error("empty", [](json& t, json&) {
    t["model"]["vocab"] = json::object();
    t["model"]["merges"] = json::array();
    t["added_tokens"] = json::array();
  });
  EXPECT_TRUE(has(e, "model.vocab: is empty")) << e;
  e = load_error("dup", [](json& t, json&) { t["model"]["vocab"]["zzzz-new"] = 5; });
  EXPECT_TRUE(has(e, "id 5 is also the id of")) << e;
  e = load_error("far", [](json& t, json&) { t["model"]["vocab"]["zzzz-new"] = 16000000; });
  EXPECT_TRUE(has(e, "far past")) << e;
}

// Found by fuzz_tokenizer (fuzz/regressions/fuzz_tokenizer/): a number too large for a double threw
// json::out_of_range, which escaped Tokenizer::load as an exception naming no file.
TEST(TokenizerFileTest, ANumberOutOfRangeIsAnErrorNamingTheFile) {
  test::TempDir tmp;
  spit(tmp.path / "tokenizer.json", R"({"model": {"type": "BPE", "dropout": 1e999, "vocab": {}, "merges": []}})");
  const std::string e = error_of([&] { Tokenizer::load(tmp.path / "tokenizer.json"); });
  EXPECT_TRUE(has(e, (tmp.path / "tokenizer.json").string() + ": bad JSON")) << e;
  EXPECT_TRUE(has(e, "out_of_range")) << e;
}

TEST(TokenizerFileTest, DeeplyNestedSequencesAreRefused) {
  test::TempDir tmp;
  for (const char* kind : {"pre_tokenizer", "normalizer", "decoder"}) {
    SCOPED_TRACE(kind);
    const std::string list = std::string(kind) == "pre_tokenizer" ? "pretokenizers"
                             : std::string(kind) == "normalizer"  ? "normalizers"
                                                                  : "decoders";
    const std::string e = error_of([&] {
      Tokenizer::load(tokenizer_dir(tmp.path / kind, [&](json& t, json&) {
        json inner = std::string(kind) == "normalizer" ? json{{"type", "NFC"}} : t[kind];
        // 200 levels: far past the 32 allowed, and shallow enough for nlohmann's recursive dump of
        // the test file under ASan (2000 overflowed its stack there).
        for (int i = 0; i < 200; ++i) inner = json{{"type", "Sequence"}, {list, json::array({inner})}};
        t[kind] = inner;
      }));
    });
    EXPECT_TRUE(has(e, "Sequence nested more than 32 levels deep")) << e.substr(0, 300);
  }
}

// ---------------------------------------------------------------------------------------------
// (i) messages that did not say where, and values dropped silently

TEST(FileMessagesTest, ConfigJsonSyntaxErrorsNameLineAndColumn) {
  test::TempDir tmp;
  const fs::path dir = model_with_config(tmp.path / "m", json::object());
  spit(dir / "config.json", "{\n  \"hidden_size\": 128,\n  x: 4\n}\n");
  std::string e = error_of([&] { ModelConfig::load(dir / "config.json"); });
  EXPECT_TRUE(has(e, (dir / "config.json").string() + ": not valid JSON at line 3, column 3 (")) << e;
  spit(dir / "config.json", "");
  e = error_of([&] { ModelConfig::load(dir / "config.json"); });
  EXPECT_TRUE(has(e, ": not valid JSON at line 1, column 1 (")) << e;
  spit(dir / "config.json", "{\"a\": 1,");  // ends where a key should begin
  e = error_of([&] { ModelConfig::load(dir / "config.json"); });
  EXPECT_TRUE(has(e, ": not valid JSON at line 1, column 9 (")) << e;
}

TEST(FileMessagesTest, AnEmptyWeightMapNamesTheIndex) {
  test::TempDir tmp;
  const fs::path dir = model_with_config(tmp.path / "m", kjv_config());
  fs::remove(dir / "model.safetensors");
  spit(dir / "model.safetensors.index.json", R"({"metadata": {}, "weight_map": {}})");
  const auto r = run_limited(test::binary() + " sample " + dir.string() + " -p hi -n 1");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, "error: " + (dir / "model.safetensors.index.json").string() +
                             ": weight_map is empty (it names no tensor and no shard file)"))
      << r.err;
  // A tensor the shards lack names the index and its shards.
  fs::copy_file(test::repo_model("kjv-tiny") / "model.safetensors", dir / "model-00001-of-00001.safetensors");
  spit(dir / "model.safetensors.index.json", R"({"weight_map": {"model.norm.weight": "model-00001-of-00001.safetensors"}})");
  const std::string e = error_of([&] { WeightFiles::open(dir).get("lm_head.missing"); });
  EXPECT_EQ(e, (dir / "model.safetensors.index.json").string() +
                   " (shards model-00001-of-00001.safetensors): tensor 'lm_head.missing' is missing");
}

// An id, or {"content": 7}, where the token's text belongs: refused, never BOS dropped silently.
TEST(FileMessagesTest, ABosTokenThatIsNotTextIsAnError) {
  test::TempDir tmp;
  for (const json& bos : {json(0), json{{"content", 7}}, json::array({"<s>"})}) {
    SCOPED_TRACE(bos.dump());
    const fs::path dir = tokenizer_dir(tmp.path / std::to_string(std::hash<std::string>{}(bos.dump())),
                                       [&](json&, json& c) { c["bos_token"] = bos; });
    const std::string e = error_of([&] { Tokenizer::load(dir); });
    EXPECT_EQ(e, (dir / "tokenizer_config.json").string() +
                     ": bos_token: expected the token's text, as a string or {\"content\": \"...\"}, got " + bos.dump());
  }
  // The forms that name the token still give BOS.
  for (const json& bos : {json("<s>"), json{{"content", "<s>"}, {"lstrip", false}}}) {
    const fs::path dir = tokenizer_dir(tmp.path / ("ok" + std::to_string(bos.is_string())),
                                       [&](json&, json& c) { c["bos_token"] = bos; });
    EXPECT_EQ(Tokenizer::load(dir).encode("In the beginning").size(), 4u) << bos.dump();
  }
}

// ---------------------------------------------------------------------------------------------
// (j) --cache-prompt FILE: its killed writers' temporaries, and a text file that looks like one

TEST(CachePromptFileTest, TheNextWriteRemovesTemporariesOfDeadWriters) {
  test::TempDir tmp;
  const fs::path f = tmp.path / "p.kvcache";
  const std::string dead = "p.kvcache.tmp-" + std::to_string(dead_pid()) + "-0123abcd";
  const std::string live = "p.kvcache.tmp-" + std::to_string(getpid()) + "-0123abcd";
  const std::string other = "q.kvcache.tmp-" + std::to_string(dead_pid()) + "-0123abcd";  // another file's
  for (const std::string& n : {dead, live, other}) spit(tmp.path / n, "PTLLMKVC partial");
  const auto r = run_limited(test::binary() + kSample + " --cache-prompt " + f.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "prompt cache: saved")) << r.err;
  std::vector<std::string> expect = {live, "p.kvcache", other};
  std::sort(expect.begin(), expect.end());
  EXPECT_EQ(files_in(tmp.path), expect);
}

TEST(CachePromptFileTest, ATextFileBeginningWithTheMagicIsNotReplaced) {
  test::TempDir tmp;
  const fs::path f = tmp.path / "notes.txt";
  const std::string text = "PTLLMKVC is the magic of posttrainllm's prompt-cache files; these are my notes.\n";
  spit(f, text);
  EXPECT_FALSE(is_prompt_cache_file(f));
  const auto r = run_limited(test::binary() + kSample + " --cache-prompt " + f.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "warning: prompt cache: ignoring " + f.string() +
                             ": not a prompt-cache file (the magic, then no version)"))
      << r.err;
  EXPECT_TRUE(has(r.err, "warning: prompt cache: not saving " + f.string() +
                             ": it is not a prompt-cache file (left as it is)"))
      << r.err;
  EXPECT_TRUE(slurp(f) == text);  // (not EXPECT_EQ: a replaced file would print its bytes)
}

}  // namespace
}  // namespace ptllm
