// The command line as llama.cpp users type it: sample's prompt, stop, escape, JSON and
// Ctrl-C habits; the messages of every command for bad values, unknown commands and llama.cpp's
// multi-letter flags; eval's early path checks, progress and PPL error. Each test runs the binary.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "cli/generation.h"
#include "core/thread_pool.h"
#include "engine/eval.h"
#include "model/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

std::string cli(const std::string& args) { return test::binary() + " " + args; }
std::string sample_cmd(const std::string& args) { return cli("sample " + args); }

std::string tiny() { return test::repo_model("kjv-tiny").string(); }

bool has(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

// kjv-tiny's greedy continuation of "In the beginning" (transformers' golden text).
std::string golden_text() {
  return test::read_json(test::repo_model("kjv-tiny") / "golden.json")["prompts"][0]["greedy_text"];
}

std::filesystem::path write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

// ---- the kernels' mode ---------------------------------------------------------------------------

// --bf16-activations is PTLLM_PANELS_BF16_X=1 as a flag, and the default for a GGUF file (computed as
// llama.cpp computes it); --no-bf16-activations keeps float32, which gives a GGUF file the text of the
// safetensors checkpoint it was written from. The kernels line says which mode ran where the BF16
// products are the panel kernels.
TEST(CliHabitsRuntime, Bf16ActivationsFlagIsTheEnvironmentSwitch) {
  test::TempDir tmp;
  const auto gguf = tmp.path / "tiny-BF16.gguf";
  ASSERT_EQ(test::run_command(cli("quantize " + tiny() + " " + gguf.string() + " --format gguf --type BF16")).code, 0);
  const std::string gen = " -p 'In the beginning' -n 24 --temperature 0 -t 2";
  const auto flag = test::run_command(sample_cmd(gguf.string() + gen + " --bf16-activations"));
  const auto env = test::run_command("PTLLM_PANELS_BF16_X=1 " + sample_cmd(gguf.string() + gen));
  const auto plain = test::run_command(sample_cmd(gguf.string() + gen));
  const auto f32 = test::run_command(sample_cmd(gguf.string() + gen + " --no-bf16-activations"));
  const auto st = test::run_command(sample_cmd(tiny() + gen));
  for (const auto* r : {&flag, &env, &plain, &f32, &st}) ASSERT_EQ(r->code, 0) << r->err;
  EXPECT_EQ(flag.out, env.out);
  EXPECT_EQ(flag.out, plain.out);
  EXPECT_EQ(f32.out, st.out);
  EXPECT_FALSE(flag.out.empty());
  const auto both = test::run_command(sample_cmd(gguf.string() + gen + " --bf16-activations --no-bf16-activations"));
  EXPECT_NE(both.code, 0);
  EXPECT_TRUE(has(both.err, "--no-bf16-activations")) << both.err;
  // Where the panel products are not used the flag changes nothing, and says so; the GGUF default
  // says nothing.
  const auto off = test::run_command("PTLLM_NO_PANELS=1 " + sample_cmd(gguf.string() + gen + " --bf16-activations"));
  ASSERT_EQ(off.code, 0) << off.err;
  EXPECT_TRUE(has(off.err, "--bf16-activations has no effect")) << off.err;
  const auto off_default = test::run_command("PTLLM_NO_PANELS=1 " + sample_cmd(gguf.string() + gen));
  ASSERT_EQ(off_default.code, 0) << off_default.err;
  EXPECT_FALSE(has(off_default.err, "no effect")) << off_default.err;
  const auto bench = [&](const std::string& model, const std::string& flags) {
    const auto r = test::run_command(cli("bench " + model + " -p 8 -n 2 -r 1 -t 2" + flags));
    EXPECT_EQ(r.code, 0) << r.err;
    return r.out + r.err;
  };
  const std::string g_plain = bench(gguf.string(), ""), g_f32 = bench(gguf.string(), " --no-bf16-activations");
  const std::string s_plain = bench(tiny(), ""), s_flag = bench(tiny(), " --bf16-activations");
  if (has(s_plain, "+panels")) {
    EXPECT_TRUE(has(g_plain, "panels-bf16x")) << g_plain;
    EXPECT_FALSE(has(g_f32, "panels-bf16x")) << g_f32;
    EXPECT_FALSE(has(s_plain, "panels-bf16x")) << s_plain;
    EXPECT_TRUE(has(s_flag, "panels-bf16x")) << s_flag;
  }
}

// ---- sample: the prompt ------------------------------------------------------------------------

TEST(CliHabitsSample, FileAndStdinGiveThePromptsText) {
  test::TempDir tmp;
  const auto file = write_file(tmp.path / "prompt.txt", "In the beginning\n");  // the final newline is dropped
  const std::string gen = " --tokens 48 --temperature 0 --ignore-eos --threads 2";
  auto r = test::run_command(sample_cmd("-f " + file.string() + gen));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, golden_text() + "\n");
  EXPECT_TRUE(has(r.err, "prompt: 4 tokens")) << r.err;
  r = test::run_command("(" + sample_cmd("-f -" + gen) + " <" + file.string() + ")");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, golden_text() + "\n");
  r = test::run_command(sample_cmd("-f " + (tmp.path / "missing.txt").string()));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.err, "missing.txt: cannot open the prompt file (--file)")) << r.err;
  r = test::run_command(sample_cmd("--tokens 3"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "give the prompt: -p TEXT, or -f FILE")) << r.err;
  EXPECT_EQ(test::run_command(sample_cmd("-p x -f " + file.string())).code, 2);
}

// 140 KB is more than one argument may hold (MAX_ARG_STRLEN, 128 KiB): it goes through -f. A
// StreamingLLM window keeps the prefill short; every token of the file reaches the model.
TEST(CliHabitsSample, A140KbPromptFromAFile) {
  test::TempDir tmp;
  std::string text;
  while (text.size() < 140 * 1024) text += "In the beginning God created the heaven and the earth. ";
  const auto file = write_file(tmp.path / "big.txt", text);
  auto ids = test::run_command(cli("tokenize " + tiny() + " --json --file " + file.string()));
  ASSERT_EQ(ids.code, 0) << ids.err;
  const size_t n = nlohmann::json::parse(ids.out).size();
  ASSERT_GT(n, 20000u);
  auto r = test::run_command(sample_cmd("-f " + file.string() +
                                        " -n 2 --temperature 0 --streaming-llm-sink 4 --streaming-llm-window 252"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "prompt: " + std::to_string(n) + " tokens")) << r.err;
}

TEST(CliHabitsSample, EscapesAreProcessedOnlyWithDashE) {
  const std::string gen = " -n 8 --temperature 0 --json";
  auto escaped = test::run_command(sample_cmd("-e -p 'And God said\\nLet there\\tbe' " + gen));
  auto real = test::run_command(sample_cmd("-p \"$(printf 'And God said\\nLet there\\tbe')\"" + gen));
  auto raw = test::run_command(sample_cmd("-p 'And God said\\nLet there\\tbe' " + gen));
  ASSERT_EQ(escaped.code, 0) << escaped.err;
  ASSERT_EQ(real.code, 0) << real.err;
  ASSERT_EQ(raw.code, 0) << raw.err;
  const auto je = nlohmann::json::parse(escaped.out), jr = nlohmann::json::parse(real.out),
             jw = nlohmann::json::parse(raw.out);
  EXPECT_EQ(je["prompt_tokens"], jr["prompt_tokens"]);
  EXPECT_EQ(je["tokens"], jr["tokens"]);
  EXPECT_NE(je["prompt_tokens"], jw["prompt_tokens"]);  // "\n" as two characters is other tokens
}

TEST(CliHabitsSample, WarnsWhenThePromptAlreadyBeginsWithBos) {
  auto r = test::run_command(sample_cmd("-p '<s>In the beginning' -n 2 --temperature 0"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "warning: the prompt begins with the BOS token <s> and the tokenizer adds BOS again"))
      << r.err;
  EXPECT_TRUE(has(r.err, "prompt: 5 tokens")) << r.err;  // BOS BOS In the beginning
  r = test::run_command(sample_cmd("-p 'In the beginning' -n 2 --temperature 0"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "warning:")) << r.err;
}

// ---- sample: stopping --------------------------------------------------------------------------

// The stop string spans tokens ("d is n": "world" | " is" | " not"); the text ends where it begins.
TEST(CliHabitsSample, StopStringEndsTheTextWhereItBegins) {
  const std::string golden = golden_text();
  const std::string stop = "d is n";
  ASSERT_TRUE(has(golden, stop));
  auto r = test::run_command(sample_cmd("-p 'In the beginning' -n 48 --temperature 0 --stop zzz --stop '" + stop + "'"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, golden.substr(0, golden.find(stop)) + "\n");
  EXPECT_TRUE(has(r.err, "stopped: the stop string \"d is n\"")) << r.err;
  // The earliest of several wins; -e applies to stop strings too.
  r = test::run_command(sample_cmd("-p 'In the beginning' -n 48 --temperature 0 -e --stop 'not' --stop 'world,\\nThe'"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, " of the \n");
  EXPECT_TRUE(has(r.err, "stopped: the stop string \"world,\\nThe\"")) << r.err;
  EXPECT_EQ(test::run_command(sample_cmd("-p x --stop ''")).code, 2);
}

TEST(CliHabitsSample, FooterGivesTheStopReason) {
  auto r = test::run_command(sample_cmd("-p 'In the beginning' -n 5 --temperature 0"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "stopped: the token limit (--tokens 5)")) << r.err;
  r = test::run_command(sample_cmd("-p 'The end' -n 200 --temperature 0"));  // greedy reaches EOS after 19 tokens
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "stopped: end of sequence (EOS)")) << r.err;
  EXPECT_TRUE(has(r.err, "decode: 20 tokens")) << r.err;
  r = test::run_command(sample_cmd("-p 'In the beginning' --ctx-size 10 -n 50 --temperature 0"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "stopped: the context is full (10 tokens, --ctx-size)")) << r.err;
}

TEST(CliHabitsSample, JsonCarriesTextTokensTimingsStopReasonAndKv) {
  auto r = test::run_command(sample_cmd("-p 'In the beginning' -n 48 --temperature 0 --ignore-eos --json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);  // stdout holds the JSON object alone
  EXPECT_EQ(j["text"], golden_text());
  const auto golden = test::read_json(test::repo_model("kjv-tiny") / "golden.json")["prompts"][0]["greedy_ids"];
  EXPECT_EQ(j["tokens"], golden);
  EXPECT_EQ(j["prompt_tokens"], 4);
  EXPECT_EQ(j["stop_reason"], "token_limit");
  for (const char* f : {"load_ms", "prefill_ms", "ttft_ms", "decode_ms", "prefill_tok_s", "decode_tok_s"})
    EXPECT_GT(j["timings"][f].get<double>(), 0.0) << f;
  EXPECT_EQ(j["timings"]["decode_tokens"], 48);
  EXPECT_EQ(j["kv_cache"]["config"], "fp32");
  EXPECT_EQ(j["kv_cache"]["stored_tokens"], 51);
  EXPECT_GT(j["kv_cache"]["physical_bytes"].get<size_t>(), 0u);
  r = test::run_command(sample_cmd("-p 'In the beginning' -n 48 --temperature 0 --json --stop world"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto s = nlohmann::json::parse(r.out);
  EXPECT_EQ(s["stop_reason"], "stop_string");
  EXPECT_EQ(s["stop_string"], "world");
  EXPECT_EQ(s["text"], " of the ");
  EXPECT_EQ(s["tokens"].size(), 3u);  // " of", " the", " world": the last completes the stop string
}

TEST(CliHabitsSample, SeedMinusOneIsRandom) {
  const std::string base = sample_cmd("-p 'In the beginning' -n 2 --seed -1");
  std::set<std::string> seeds;
  const std::regex seed_re("seed (\\d+)");
  for (int i = 0; i < 3; ++i) {
    auto r = test::run_command(base);
    ASSERT_EQ(r.code, 0) << r.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.err, m, seed_re)) << r.err;
    seeds.insert(m[1]);
  }
  EXPECT_GT(seeds.size(), 1u);
  auto r = test::run_command(sample_cmd("-p x --seed -2"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "--seed: must be at least 0 (got -2)")) << r.err;
}

// stdout and stderr in one stream: model: and load: come before the text, the footer after it.
TEST(CliHabitsSample, ModelAndLoadLinesComeBeforeTheText) {
  auto r = test::run_command("(" + sample_cmd("-p 'In the beginning' -n 48 --temperature 0 --ignore-eos") + " 2>&1)");
  ASSERT_EQ(r.code, 0) << r.out;
  const size_t model = r.out.find("model: "), load = r.out.find("load: "), text = r.out.find(golden_text()),
               footer = r.out.find("prompt: 4 tokens");
  ASSERT_NE(text, std::string::npos) << r.out;
  EXPECT_LT(model, load);
  EXPECT_LT(load, text);
  EXPECT_LT(text, footer);
  EXPECT_NE(footer, std::string::npos);
}

// `posttrainllm sample ARGS...` in a child process, stdout and stderr to files.
pid_t spawn_sample(const std::vector<std::string>& args, const std::filesystem::path& out,
                   const std::filesystem::path& err) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  dup2(open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
  dup2(open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
  std::vector<std::string> all = {"posttrainllm", "sample"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(test::binary().c_str(), argv.data());
  _exit(127);
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Waits (at most 60 s) until `ready` holds.
template <typename F>
void wait_for(F ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!ready() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

// Ctrl-C during the generation: the text so far, the footer, exit code 130.
TEST(CliHabitsSample, CtrlCEndsTheGenerationAndPrintsTheFooter) {
  test::TempDir tmp;
  const auto out = tmp.path / "out", err = tmp.path / "err";
  const pid_t pid = spawn_sample({"-p", "In the beginning", "-n", "100000000", "--ignore-eos", "--temperature", "0",
                                  "--streaming-llm-sink", "4", "--streaming-llm-window", "60", "--threads", "1"},
                                 out, err);
  ASSERT_GT(pid, 0);
  wait_for([&] {  // the generation has begun (file_size is -1 until the child creates the file)
    std::error_code ec;
    const auto n = std::filesystem::file_size(out, ec);
    return !ec && n >= 200;
  });
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const std::string e = slurp(err);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << "\n" << e;
  EXPECT_EQ(WEXITSTATUS(status), 130) << e;
  EXPECT_GE(slurp(out).size(), 200u);
  EXPECT_TRUE(has(e, "stopped: interrupted (Ctrl-C)")) << e;
  EXPECT_TRUE(has(e, "decode: ")) << e;
  EXPECT_TRUE(has(e, "kv cache: fp32 sink4 w60")) << e;
}

// A second Ctrl-C ends the process at once: here both come during the prefill of a 140 KB prompt
// (seconds long), which the first cannot stop.
TEST(CliHabitsSample, ASecondCtrlCEndsTheProcess) {
  test::TempDir tmp;
  std::string text;
  while (text.size() < 140 * 1024) text += "In the beginning God created the heaven and the earth. ";
  const auto prompt = write_file(tmp.path / "big.txt", text);
  const auto out = tmp.path / "out", err = tmp.path / "err";
  const pid_t pid = spawn_sample({"-f", prompt.string(), "-n", "5", "--streaming-llm-sink", "4",
                                  "--streaming-llm-window", "252", "--threads", "1"},
                                 out, err);
  ASSERT_GT(pid, 0);
  wait_for([&] { return has(slurp(err), "load: "); });  // the handler is set up right after this line
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, WNOHANG), 0) << "the first Ctrl-C ended the process\n" << slurp(err);
  kill(pid, SIGINT);
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit code " << WEXITSTATUS(status) << "\n" << slurp(err);
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  EXPECT_FALSE(has(slurp(err), "stopped:"));
}

// ---- every command: values, help, version, unknown commands ------------------------------------

bool has_long_number(const std::string& s) { return std::regex_search(s, std::regex("[0-9]{20,}")); }

struct Refusal {
  std::string args;
  std::string message;
};

void expect_usage_error(const Refusal& c) {
  auto r = test::run_command(cli(c.args));
  EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
  EXPECT_TRUE(has(r.err, "error: " + c.message)) << c.args << "\n" << r.err;
  EXPECT_FALSE(has_long_number(r.err)) << c.args << "\n" << r.err;
}

TEST(CliHabitsCommands, RangeErrorsSayTheBoundWithoutAHugeMaximum) {
  test::TempDir tmp;
  const auto text = write_file(tmp.path / "t.txt", "In the beginning God created the heaven and the earth.\n");
  for (const Refusal& c : std::vector<Refusal>{
           {"sample -p x --tokens -1", "--tokens: must be at least 0 (got -1)"},
           {"sample -p x --temperature -0.5", "--temperature: must be at least 0 (got -0.5)"},
           {"sample -p x --top-p 1.5", "--top-p: must be between 0 and 1 (got 1.5)"},
           {"sample -p x --repeat-penalty 0", "--repeat-penalty: must be greater than 0 (got 0)"},
           {"sample -p x --ctx-size 0", "--ctx-size: must be at least 1 (got 0)"},
           {"sample -p x --threads 3000000000", "--threads: must be between 0 and 1024 (got 3000000000)"},
           {"sample -p x --prompt-cache-dir /tmp --prompt-cache-max-mb -1",
            "--prompt-cache-max-mb: must be greater than 0 (got -1)"},
           {"eval --text " + text.string() + " --max-tokens -1", "--max-tokens: must be at least 0 (got -1)"},
           {"eval --text " + text.string() + " --ppl-chunks 2", "--ppl-chunks: must be at least 4 (got 2)"},
           {"bench " + tiny() + " --gen-tokens 0", "--gen-tokens: must be at least 1 (got 0)"},
           {"bench " + tiny() + " --kv-group-size 5000", "--kv-group-size: must be between 1 and 4096 (got 5000)"},
           {"make-model --shape tiny /tmp/x --threads -1", "--threads: must be between 0 and 1024 (got -1)"},
           {"make-model --shape tiny /tmp/x --seed -5", "--seed: must be at least 0 (got -5)"},
           {"cache prune /tmp --max-mb -1", "--max-mb: must be at least 0 (got -1)"},
       })
    expect_usage_error(c);
}

TEST(CliHabitsCommands, NotANumberSaysSo) {
  for (const Refusal& c : std::vector<Refusal>{
           {"sample -p x -n abc", "--tokens: 'abc' is not a number"},
           {"sample -p x -n 1.5", "--tokens: '1.5' is not a whole number"},
           {"sample -p x --temp warm", "--temperature: 'warm' is not a number"},
           {"sample -p x --seed 0x", "--seed: '0x' is not a number"},
           {"bench " + tiny() + " -n abc", "--gen-tokens: 'abc' is not a number"},
           {"eval --text x --chunk two", "--chunk: 'two' is not a number"},
       })
    expect_usage_error(c);
}

TEST(CliHabitsCommands, HelpShowsDefaults) {
  struct Case {
    std::string command;
    std::vector<std::string> shown;
  };
  for (const Case& c : std::vector<Case>{
           {"sample", {"--tokens INT=128", "--temperature,--temp FLOAT=0.8", "--top-k INT=40", "--seed INT=-1",
                       "--kv-quantize TEXT:{fp32,fp16,bf16,int8,int4,int2}=fp32", "--kv-group-size INT=32"}},
           {"eval", {"--greedy-tokens INT=60", "--chunk INT=1", "--progress-seconds FLOAT=3"}},
           {"bench", {"--prompt-tokens INT=512", "--gen-tokens INT=128", "--bandwidth-mib INT=512"}},
           {"make-model", {"--dtype TEXT:{bf16,f16,f32}=bf16"}},
       }) {
    auto r = test::run_command(cli(c.command + " --help"));
    EXPECT_EQ(r.code, 0) << r.err;
    for (const std::string& s : c.shown) EXPECT_TRUE(has(r.out, s)) << c.command << ": " << s << "\n" << r.out;
  }
}

TEST(CliHabitsCommands, VersionNamesTheProjectAndTheBuild) {
  auto r = test::run_command(cli("--version"));
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(std::regex_search(r.out, std::regex("^posttrainllm [0-9]+\\.[0-9]+\\.[0-9]+ \\(git [0-9a-f]+")))
      << r.out;
  EXPECT_TRUE(has(r.out, "build, ")) << r.out;
  EXPECT_TRUE(has(r.out, "kernels ")) << r.out;
  auto sub = test::run_command(cli("sample --version"));
  EXPECT_EQ(sub.code, 0);
  EXPECT_EQ(sub.out, r.out);
}

TEST(CliHabitsCommands, UnknownCommandsAreNamed) {
  expect_usage_error({"foo", "unknown command 'foo' (the commands: sample, tokenize, eval, cache, bench, make-model, template, chat, serve, quantize)"});
  expect_usage_error({"cache foo /tmp", "unknown command 'cache foo' (the commands: cache ls, cache inspect, cache prune)"});
  expect_usage_error({"", "give a command: sample, tokenize, eval, cache, bench, make-model, template, chat, serve, quantize"});
  expect_usage_error({"cache", "give a command: cache ls, cache inspect, cache prune"});
  expect_usage_error({"sample -p x --no-such-flag", "The following argument was not expected: --no-such-flag"});
}

// CLI11 would read -cnv as -c nv and -ngl as -n gl; none of them is ever split.
TEST(CliHabitsCommands, LlamaCppMultiLetterFlagsAreRefusedByName) {
  for (const Refusal& c : std::vector<Refusal>{
           {"sample -p x -cnv", "-cnv: conversation mode is a command of its own: use `posttrainllm chat`"},
           {"sample -p x -ngl 99", "-ngl: GPU offload is not supported (this runtime runs on the CPU)"},
           {"sample -p x --n-gpu-layers 99", "--n-gpu-layers: GPU offload is not supported"},
           {"bench " + tiny() + " -ngl=99", "-ngl: GPU offload is not supported"},
           {"sample -p x -fa", "-fa: flash attention is not a switch here"},
           {"sample -p x -np 4", "-np: this command runs one sequence: parallel sequences are `posttrainllm serve --parallel N`"},
           {"sample -p x -sys 'be brief'", "-sys: a system prompt goes through a chat template"},
           {"sample -p x -tb 2", "-tb: one thread count serves prefill and decode: use --threads (-t)"},
           {"sample -p x -xyz", "-xyz: unknown option (an option of more than one letter takes two dashes: --xyz)"},
           {"eval --text x -cnv", "-cnv: conversation mode"},
           {"tokenize " + tiny() + " --text x -ctk f16", "-ctk: this command has no KV cache"},
           {"-cnv", "-cnv: conversation mode"},
       })
    expect_usage_error(c);
}

// llama.cpp's flags for what this runtime does not do: a sentence each, not CLI11's "not expected".
TEST(CliHabitsCommands, LlamaCppFeatureFlagsAreRefusedWithTheReason) {
  for (const Refusal& c : std::vector<Refusal>{
           {"sample -p x --model-draft d.gguf", "--model-draft d.gguf: d.gguf: cannot open"},
           {"sample -p x -md d.gguf", "--model-draft d.gguf: d.gguf: cannot open"},
           {"sample -p x --spec-type draft", "--spec-type draft: give the draft model with --model-draft"},
           {"eval --text x --draft-max 4", "--draft-max: speculative decoding runs in sample, chat, serve and bench"},
           {"eval " + tiny() + " --grammar 'root ::= \"a\"'", "--grammar: grammars and JSON schemas constrain `sample` and `chat`"},
           {"eval " + tiny() + " -j '{}'", "-j: grammars and JSON schemas constrain"},
           {"chat --lora a.gguf", "--lora: LoRA adapters are not supported: merge the adapter into the weights"},
           {"sample -p x --mlock", "--mlock: locking the model in memory is not supported"},
           {"sample -p x --jinja", "--jinja: this command renders no chat template (chat, serve and template do, "
                                   "always as Jinja)"},
           {"tokenize " + tiny() + " -p x --log-disable", "--log-disable: this command has no --quiet"},
           {"bench " + tiny() + " --log-disable", "--log-disable: this command has no --quiet"},
       })
    expect_usage_error(c);
}

// Templates are always Jinja here: llama.cpp's --jinja changes nothing where a template is rendered.
TEST(CliHabitsCommands, JinjaIsAcceptedWhereATemplateIsRendered) {
  test::TempDir tmp;
  const auto tmpl = write_file(tmp.path / "t.jinja", "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}");
  const auto conv = write_file(tmp.path / "conv.txt", "In the beginning\n");
  const std::string chat = "chat " + tiny() + " --chat-template " + tmpl.string() + " -f " + conv.string() +
                           " --temperature 0 -n 4 --json --threads 2";
  auto plain = test::run_command(cli(chat));
  auto jinja = test::run_command(cli(chat + " --jinja"));
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(jinja.code, 0) << jinja.err;
  EXPECT_EQ(nlohmann::json::parse(jinja.out)["tokens"], nlohmann::json::parse(plain.out)["tokens"]);
  const auto msgs = write_file(tmp.path / "m.json", R"([{"role": "user", "content": "hi"}])");
  auto t = test::run_command(cli("template --jinja " + tmpl.string() + " --messages " + msgs.string()));
  EXPECT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(t.out, "user: hi\n") << t.err;
}

// --quiet (llama.cpp's --log-disable): the text alone on stdout, nothing on stderr but warnings.
TEST(CliHabitsSample, QuietLeavesOnlyTheText) {
  const std::string gen = "-p 'In the beginning' -n 48 --temperature 0 --ignore-eos";
  auto loud = test::run_command(sample_cmd(gen));
  auto quiet = test::run_command(sample_cmd(gen + " --quiet"));
  auto q = test::run_command(sample_cmd(gen + " -q"));
  auto log_disable = test::run_command(sample_cmd(gen + " --log-disable"));
  ASSERT_EQ(loud.code, 0) << loud.err;
  for (const auto* r : {&quiet, &q, &log_disable}) {
    ASSERT_EQ(r->code, 0) << r->err;
    EXPECT_EQ(r->out, golden_text() + "\n");
    EXPECT_EQ(r->err, "");
  }
  EXPECT_TRUE(has(loud.err, "model: ")) << loud.err;
  // chat's too: the replies alone.
  test::TempDir tmp;
  const auto tmpl = write_file(tmp.path / "t.jinja", "{% for m in messages %}{{ m.content }}\n{% endfor %}");
  const auto conv = write_file(tmp.path / "conv.txt", "In the beginning\nAnd God said\n");
  const std::string chat = "chat " + tiny() + " --chat-template " + tmpl.string() + " -f " + conv.string() +
                           " --temperature 0 -n 4 --threads 2";
  auto chat_loud = test::run_command(cli(chat));
  auto chat_quiet = test::run_command(cli(chat + " -q"));
  ASSERT_EQ(chat_quiet.code, 0) << chat_quiet.err;
  EXPECT_EQ(chat_quiet.out, chat_loud.out);
  EXPECT_FALSE(chat_quiet.out.empty());
  EXPECT_EQ(chat_quiet.err, "");
  EXPECT_TRUE(has(chat_loud.err, "[turn 2: ")) << chat_loud.err;
  // Warnings stay.
  auto warn = test::run_command(sample_cmd("-p '<s>In the beginning' -n 2 --temperature 0 -q"));
  EXPECT_TRUE(has(warn.err, "warning: the prompt begins with the BOS token")) << warn.err;
  EXPECT_FALSE(has(warn.err, "model: ")) << warn.err;
}

// cmake --install puts the binary in PREFIX/bin and kjv-tiny where the binary finds it without
// the source tree.
TEST(CliHabitsCommands, InstallGivesABinaryThatFindsItsModel) {
  test::TempDir tmp;
  const std::filesystem::path build = std::filesystem::path(test::binary()).parent_path();
  auto r = test::run_command("cmake --install " + build.string() + " --prefix " + tmp.path.string());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto bin = tmp.path / "bin" / "posttrainllm";
  ASSERT_TRUE(std::filesystem::exists(bin));
  r = test::run_command("cd / && " + bin.string() + " sample -p 'In the beginning' -n 48 --temperature 0 --ignore-eos");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, golden_text() + "\n");
  EXPECT_TRUE(has(r.err, "model: " + (tmp.path / "share/posttrainllm/models/kjv-tiny").string())) << r.err;
}

TEST(CliHabitsCommands, CacheTypeKAndVSetTheKvPrecision) {
  const std::string base = "sample -p 'In the beginning' -n 3 --temperature 0 ";
  for (const auto& [flags, kv] : std::vector<std::pair<std::string, std::string>>{
           {"-ctk f16", "kv cache: fp16,"},
           {"-ctv bf16", "kv cache: bf16,"},
           {"-ctk f16 -ctv fp16", "kv cache: fp16,"},
           {"-ctk=int8 -ctv=int8", "kv cache: int8 g32 r128,"},
           {"--cache-type-k f32 --kv-quantize fp32", "kv cache: fp32,"},
       }) {
    auto r = test::run_command(cli(base + flags));
    ASSERT_EQ(r.code, 0) << flags << "\n" << r.err;
    EXPECT_TRUE(has(r.err, kv)) << flags << "\n" << r.err;
  }
  for (const Refusal& c : std::vector<Refusal>{
           {base + "-ctk f16 -ctv bf16",
            "-ctk f16 and -ctv bf16 differ: this KV cache stores K and V at one precision"},
           {base + "-ctk f16 --kv-quantize int8", "-ctk f16 and --kv-quantize int8 disagree"},
           {base + "-ctk q8_0", "--cache-type-k: 'q8_0': llama.cpp's block quantization of the KV cache is not "
                                "implemented here"},
           {base + "-ctv f64", "--cache-type-v: 'f64' is not a KV type (f32, f16, bf16, int8, int4, int2)"},
       })
    expect_usage_error(c);
  // eval's configuration comes from the same flags.
  test::TempDir tmp;
  const auto text = write_file(tmp.path / "t.txt", "In the beginning God created the heaven and the earth.\n");
  auto r = test::run_command(cli("eval --text " + text.string() + " -ctk f16 --json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["configs"][0]["name"], "fp16");
}

TEST(CliHabitsCommands, ModelFlagOrPositional) {
  auto a = test::run_command(sample_cmd("-m " + tiny() + " -p 'In the beginning' -n 48 --temp 0 --ignore-eos"));
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, golden_text() + "\n");
  EXPECT_TRUE(has(a.err, "model: " + tiny() + " (")) << a.err;
  auto t1 = test::run_command(cli("tokenize -m " + tiny() + " -p 'In the beginning' --ids"));
  auto t2 = test::run_command(cli("tokenize " + tiny() + " -p 'In the beginning' --ids"));
  ASSERT_EQ(t1.code, 0) << t1.err;
  EXPECT_EQ(t1.out, "[0, 613, 265, 3896]\n");
  EXPECT_EQ(t1.out, t2.out);
  expect_usage_error({"sample " + tiny() + " -m " + tiny() + " -p x", "model_dir excludes --model"});
  expect_usage_error({"bench --gen-tokens 2", "give the model directory: bench MODEL, or -m MODEL"});
  expect_usage_error({"tokenize -p x", "give the model directory or tokenizer.json"});
}

TEST(CliHabitsCommands, ARepeatedOptionTakesTheLastValue) {
  auto r = test::run_command(sample_cmd("-p 'In the beginning' -n 3 -n 5 --temp 1 --temp 0 --ignore-eos"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "decode: 5 tokens")) << r.err;
  auto greedy = test::run_command(sample_cmd("-p 'In the beginning' -n 5 --temp 0 --ignore-eos"));
  EXPECT_EQ(r.out, greedy.out);  // --temp 0 won: greedy
  r = test::run_command(cli("tokenize " + tiny() + " -p 'And God' --text 'In the beginning' --ids"));
  EXPECT_EQ(r.out, "[0, 613, 265, 3896]\n");
}

// ---- eval --------------------------------------------------------------------------------------

struct EvalHabitsTest : ::testing::Test {
  void SetUp() override {
    text_ = write_file(tmp_.path / "text.txt",
                       "In the beginning God created the heaven and the earth.\nAnd the earth was without form, "
                       "and void; and darkness was upon the face of the deep.\n");
  }
  std::string cmd(const std::string& args) { return cli("eval --text " + text_.string() + " " + args); }
  test::TempDir tmp_;
  std::filesystem::path text_;
};

// A bad path fails before any scoring (no progress line), naming the file.
TEST_F(EvalHabitsTest, GreedyPromptsAndPlotPathsAreCheckedFirst) {
  auto r = test::run_command(cmd("--greedy-prompts " + (tmp_.path / "none.txt").string()));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.err, "none.txt: cannot read the file given to --greedy-prompts")) << r.err;
  EXPECT_FALSE(has(r.err, "eval:")) << r.err;
  r = test::run_command(cmd("--greedy-prompts " + write_file(tmp_.path / "empty.txt", "\n").string()));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "empty.txt: no prompt (one per line) for --greedy-prompts")) << r.err;
  EXPECT_FALSE(has(r.err, "eval:")) << r.err;
  r = test::run_command(cmd("--plot " + (tmp_.path / "no" / "dir" / "nll.svg").string()));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.err, "nll.svg: no directory " + (tmp_.path / "no" / "dir").string())) << r.err;
  EXPECT_FALSE(has(r.err, "eval:")) << r.err;
  r = test::run_command(cmd("--plot " + tmp_.path.string()));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.err, tmp_.path.string() + ": a directory, not a file (--plot)")) << r.err;
}

TEST_F(EvalHabitsTest, ProgressLinesGiveTokensRunningPplAndEta) {
  auto r = test::run_command(cmd("--progress-seconds 0"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::regex line("eval: ([0-9]+)/([0-9]+) tokens \\([0-9]+%\\), PPL [0-9.]+ so far, [0-9.]+ s, ETA [0-9]+ s");
  size_t lines = 0, last_done = 0, total = 0;
  for (auto it = std::sregex_iterator(r.err.begin(), r.err.end(), line); it != std::sregex_iterator(); ++it) {
    const size_t done = std::stoul((*it)[1]);
    total = std::stoul((*it)[2]);
    EXPECT_GT(done, last_done);
    last_done = done;
    ++lines;
  }
  EXPECT_GT(lines, 10u) << r.err;
  EXPECT_LT(last_done, total);
  r = test::run_command(cmd(""));  // the default: a line every 3 s, none for a run this short
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(std::regex_search(r.err, line)) << r.err;
}

// llama-perplexity's error: PPL * sqrt((mean(nll^2) - mean(nll)^2) / (n - 1)), from the same NLLs
// scored in this process.
TEST_F(EvalHabitsTest, PplHasItsStandardError) {
  auto r = test::run_command(cmd("--json --threads 2"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);

  const auto dir = test::repo_model("kjv-tiny");
  auto model = Model::load(dir);
  const Tokenizer tok = Tokenizer::load(dir);
  std::ifstream in(text_);
  const std::string text(std::istreambuf_iterator<char>(in), {});
  ThreadPool pool(2);
  Evaluator ev(*model, {}, pool);
  ev.score_stream(tok.encode(text, {.add_special = true, .parse_special = false}), FeedPlan{});
  const auto& nll = ev.baseline_nll();
  double sum = 0, sq = 0;
  for (double v : nll) sum += v, sq += v * v;
  const double n = double(nll.size()), m = sum / n;
  const double want = std::exp(m) * std::sqrt((sq / n - m * m) / (n - 1));
  ASSERT_EQ(j["tokens"].get<size_t>(), nll.size());
  EXPECT_NEAR(j["baseline"]["ppl_stderr"].get<double>(), want, 1e-6 * want);
  EXPECT_NEAR(j["configs"][0]["ppl_stderr"].get<double>(), want, 1e-6 * want);
  EXPECT_GT(want, 0.0);

  r = test::run_command(cmd(""));
  ASSERT_EQ(r.code, 0) << r.err;
  char expected[96];
  std::snprintf(expected, sizeof expected, "PPL %.4f ± %.5f", std::exp(m), want);
  EXPECT_TRUE(has(r.out, std::string("baseline (fp32, full cache): ") + expected)) << r.out;
}

}  // namespace
}  // namespace ptllm

// ---- the pieces of src/cli/generation.cpp --------------------------------------------------------

namespace ptllm::cli {
namespace {

// Feeds `pieces` one by one; returns what was released for printing, "|" between pushes.
std::string push_all(StopText& st, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& p : pieces) {
    out += st.push(p) + "|";
    if (st.stopped()) break;
  }
  return out;
}

TEST(StopTextTest, HoldsBackOnlyWhatCouldBeginAStopString) {
  StopText st({"END", "xyz"});
  // "E" and "EN" could begin "END": held back; "ENx" cannot (but "x" could begin "xyz").
  EXPECT_EQ(push_all(st, {"abc", "E", "N", "x", "q"}), "abc|||EN|xq|");
  EXPECT_FALSE(st.stopped());
  EXPECT_EQ(st.finish(), "");
  StopText held({"END"});
  EXPECT_EQ(push_all(held, {"the E"}), "the |");
  EXPECT_EQ(held.finish(), "E");  // released at the end of a generation without a stop
}

TEST(StopTextTest, StopsAtTheEarliestStopStringAcrossPieces) {
  StopText st({"world", "or"});
  EXPECT_EQ(push_all(st, {"hello w", "o", "rld and more"}), "hello |||");
  // "or" and "world" both complete in "hello world": "world" begins first.
  EXPECT_TRUE(st.stopped());
  EXPECT_EQ(st.found(), "world");
  StopText overlap({"aab"});
  EXPECT_EQ(push_all(overlap, {"a", "a", "a", "b", "c"}), "||a||");  // "aaa": the last two may begin "aab"
  EXPECT_EQ(overlap.found(), "aab");
}

TEST(EscapesTest, LlamaCppEscapes) {
  EXPECT_EQ(process_escapes(R"(a\nb\tc\rd\\e\"f\'g)"), "a\nb\tc\rd\\e\"f'g");
  EXPECT_EQ(process_escapes(R"(\x41\x4a!)"), "AJ!");
  EXPECT_EQ(process_escapes(R"(\x4)"), R"(\x4)");  // not two hex digits: as written
  EXPECT_EQ(process_escapes(R"(\q and \)"), R"(\q and \)");  // unknown and trailing: as written
}

}  // namespace
}  // namespace ptllm::cli
