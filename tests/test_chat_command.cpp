// posttrainllm chat: a scripted conversation keeps its KV between turns (each turn
// prefills only its new tokens, as the footer says) and every reply at temperature 0 equals what
// `sample` gives on that turn's fully rendered prompt; /reset, --system, the prompt cache, and the
// errors for a missing template and bad --chat-template-kwargs. Each test runs the binary.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <fstream>
#include <thread>

#include "chat/chat_template.h"
#include "test_util.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// ChatML, with the BOS the kjv models were trained with. The kjv tokenizer has no <|im_start|>
// token: the markers are plain text to it, which is all these tests need.
const char* kChatML =
    "{{ bos_token }}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

bool has(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

fs::path write_file(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

// A copy of `src` (the weights linked) whose tokenizer_config.json carries `chat_template`.
fs::path model_with_template(const fs::path& src, const fs::path& dst, const std::string& chat_template) {
  fs::create_directories(dst);
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json"}) fs::copy_file(src / f, dst / f);
  fs::create_symlink(src / "model.safetensors", dst / "model.safetensors");
  Json cfg = test::read_json(src / "tokenizer_config.json");
  cfg["chat_template"] = chat_template;
  write_file(dst / "tokenizer_config.json", cfg.dump(2));
  return dst;
}

// kjv-small when ../shared is there (the reference model), else the shipped kjv-tiny.
fs::path source_model() {
  const fs::path small = test::shared_model("kjv-small");
  return fs::exists(small / "config.json") ? small : test::repo_model("kjv-tiny");
}

std::string chat_cmd(const fs::path& model, const std::string& args) {
  return test::binary() + " chat " + model.string() + " --threads 2 " + args;
}

// The JSON lines of --json, one per turn.
std::vector<Json> turns_of(const std::string& out) {
  std::vector<Json> turns;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) turns.push_back(Json::parse(line));
  return turns;
}

std::vector<int32_t> tokenize(const fs::path& model, const fs::path& text_file) {
  auto r = test::run_command(test::binary() + " tokenize " + model.string() + " --json --file " + text_file.string());
  EXPECT_EQ(r.code, 0) << r.err;
  return Json::parse(r.out).get<std::vector<int32_t>>();
}

struct ChatModel : ::testing::Test {
  test::TempDir tmp;
  fs::path model = model_with_template(source_model(), tmp.path / "model", kChatML);
};

// Five turns at temperature 0: turn k's prefill covers only what turns 1..k-1 did not leave in the
// KV (the footer and the JSON say so), and each reply is `sample`'s on the rendered prompt.
TEST_F(ChatModel, FiveTurnsReuseTheKvAndEachReplyEqualsSample) {
  const std::vector<std::string> users = {"In the beginning", "And God said", "Who is the king of Israel?",
                                          "Tell me of Moses", "And the LORD spake"};
  std::string script;
  for (const auto& u : users) script += u + "\n";
  const fs::path conv = write_file(tmp.path / "conv.txt", script);
  const std::string gen = " --temperature 0 -n 10";
  auto r = test::run_command(chat_cmd(model, "--system 'You are a scribe.' -f " + conv.string() + gen + " --json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<Json> turns = turns_of(r.out);
  ASSERT_EQ(turns.size(), users.size()) << r.out;

  const chat::ChatTemplate tmpl = chat::ChatTemplate::load(model.string());
  chat::ChatRequest req;
  req.messages = chat::Json::array({{{"role", "system"}, {"content", "You are a scribe."}}});
  req.add_generation_prompt = true;
  std::vector<int32_t> held;  // what the session holds after each turn: its prompt and its reply
  for (size_t k = 0; k < users.size(); ++k) {
    SCOPED_TRACE("turn " + std::to_string(k + 1));
    const Json& t = turns[k];
    req.messages.push_back({{"role", "user"}, {"content", users[k]}});
    const std::string prompt = tmpl.render(req);
    ASSERT_TRUE(prompt.starts_with("<s>"));
    // sample adds BOS itself, and -f drops one final newline.
    const fs::path file = write_file(tmp.path / ("prompt" + std::to_string(k) + ".txt"), prompt.substr(3) + "\n");
    auto s = test::run_command(test::binary() + " sample " + model.string() + " --threads 2 -f " + file.string() +
                               gen + " --json");
    ASSERT_EQ(s.code, 0) << s.err;
    const Json sj = Json::parse(s.out);
    EXPECT_EQ(t["prompt_tokens"], sj["prompt_tokens"]);  // one BOS, as sample's
    EXPECT_EQ(t["text"], sj["text"]);
    EXPECT_EQ(t["tokens"], sj["tokens"]);
    // Reused: the longest common prefix of what the session held and this prompt's ids.
    // tokenize --file keeps the final newline (sample's -f drops one): the text as rendered, BOS added.
    const std::vector<int32_t> ids =
        tokenize(model, write_file(tmp.path / ("exact" + std::to_string(k) + ".txt"), prompt.substr(3)));
    ASSERT_EQ(int64_t(ids.size()), t["prompt_tokens"].get<int64_t>());
    const auto lcp = std::mismatch(held.begin(), held.end(), ids.begin(), ids.end()).first - held.begin();
    EXPECT_EQ(t["reused_tokens"].get<int64_t>(), std::min<int64_t>(lcp, int64_t(ids.size()) - 1));
    EXPECT_EQ(t["prefilled_tokens"].get<int64_t>(), t["prompt_tokens"].get<int64_t>() - t["reused_tokens"].get<int64_t>());
    if (k > 0) {
      EXPECT_GE(t["reused_tokens"].get<int64_t>(), turns[k - 1]["prompt_tokens"].get<int64_t>());
    }
    held = ids;
    for (const auto& id : t["tokens"]) held.push_back(id.get<int32_t>());
    req.messages.push_back({{"role", "assistant"}, {"content", t["text"]}});
  }
  // The footer on stderr says the same, turn by turn.
  for (size_t k = 0; k < turns.size(); ++k) {
    const std::string line = "[turn " + std::to_string(k + 1) + ": prompt " + turns[k]["prompt_tokens"].dump() +
                             " tokens, " + turns[k]["reused_tokens"].dump() + " reused from the KV, " +
                             turns[k]["prefilled_tokens"].dump() + " prefilled; time to first token ";
    EXPECT_TRUE(has(r.err, line)) << line << "\n" << r.err;
  }
  EXPECT_TRUE(has(r.err, "stopped: the token limit (--tokens 10)]")) << r.err;
}

// The streamed text is the JSON's text; standard input serves as the script when it is not a terminal.
TEST_F(ChatModel, StdinScriptStreamsTheReplies) {
  const fs::path conv = write_file(tmp.path / "conv.txt", "In the beginning\nAnd God said\n");
  auto j = test::run_command(chat_cmd(model, "-f " + conv.string() + " --temperature 0 -n 6 --json"));
  ASSERT_EQ(j.code, 0) << j.err;
  const auto turns = turns_of(j.out);
  ASSERT_EQ(turns.size(), 2u);
  auto r = test::run_command("(" + chat_cmd(model, "--temperature 0 -n 6") + " <" + conv.string() + ")");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, turns[0]["text"].get<std::string>() + "\n" + turns[1]["text"].get<std::string>() + "\n");
}

// /reset forgets the conversation: the next turn is what a new conversation's first turn is.
TEST_F(ChatModel, ResetStartsOver) {
  const fs::path both = write_file(tmp.path / "both.txt", "In the beginning\n/reset\nAnd God said\n/exit\nignored\n");
  const fs::path one = write_file(tmp.path / "one.txt", "And God said\n");
  const std::string gen = " --temperature 0 -n 6 --json --system 'Be brief.'";
  auto a = test::run_command(chat_cmd(model, "-f " + both.string() + gen));
  auto b = test::run_command(chat_cmd(model, "-f " + one.string() + gen));
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_TRUE(has(a.err, "conversation reset")) << a.err;
  const auto ta = turns_of(a.out), tb = turns_of(b.out);
  ASSERT_EQ(ta.size(), 2u);  // /exit ended it
  ASSERT_EQ(tb.size(), 1u);
  EXPECT_EQ(ta[1]["reused_tokens"], 0);
  EXPECT_EQ(ta[1]["prompt_tokens"], tb[0]["prompt_tokens"]);
  EXPECT_EQ(ta[1]["tokens"], tb[0]["tokens"]);
}

// --system, llama.cpp's -sys and --system-file put the same system message in the template.
TEST_F(ChatModel, SystemPromptFlags) {
  const fs::path conv = write_file(tmp.path / "conv.txt", "In the beginning\n");
  const fs::path sys = write_file(tmp.path / "sys.txt", "You are a scribe.");
  const std::string gen = " -f " + conv.string() + " --temperature 0 -n 4 --json";
  auto none = test::run_command(chat_cmd(model, gen));
  auto flag = test::run_command(chat_cmd(model, "--system 'You are a scribe.'" + gen));
  auto sys_short = test::run_command(chat_cmd(model, "-sys 'You are a scribe.'" + gen));
  auto file = test::run_command(chat_cmd(model, "--system-file " + sys.string() + gen));
  for (const auto* r : {&none, &flag, &sys_short, &file}) ASSERT_EQ(r->code, 0) << r->err;
  const auto n = turns_of(none.out)[0], f = turns_of(flag.out)[0];
  // "<|im_start|>system\nYou are a scribe.<|im_end|>\n" is in the prompt.
  EXPECT_GT(f["prompt_tokens"].get<int>(), n["prompt_tokens"].get<int>() + 5);
  EXPECT_EQ(turns_of(sys_short.out)[0]["tokens"], f["tokens"]);
  EXPECT_EQ(turns_of(sys_short.out)[0]["prompt_tokens"], f["prompt_tokens"]);
  EXPECT_EQ(turns_of(file.out)[0]["tokens"], f["tokens"]);
  EXPECT_EQ(turns_of(file.out)[0]["prompt_tokens"], f["prompt_tokens"]);
  auto both = test::run_command(chat_cmd(model, "--system x --system-file " + sys.string() + gen));
  EXPECT_EQ(both.code, 2) << both.err;
  auto missing = test::run_command(chat_cmd(model, "--system-file " + (tmp.path / "nope.txt").string() + gen));
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(has(missing.err, "nope.txt: cannot open (--system-file)")) << missing.err;
}

// A model without a chat template chats through the built-in chatml, with a warning; --chat-template
// FILE or NAME supplies another, and --chat-template-kwargs reaches it (bad JSON names the flag).
TEST(ChatCommand, TemplateErrorsAndOverrides) {
  test::TempDir tmp;
  const fs::path tiny = test::repo_model("kjv-tiny");
  const fs::path conv = write_file(tmp.path / "conv.txt", "In the beginning\n");
  const std::string gen = " -f " + conv.string() + " --temperature 0 -n 3 --json";
  auto r = test::run_command(chat_cmd(tiny, gen));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "has no chat template; using the built-in chatml")) << r.err;
  EXPECT_TRUE(has(r.err, "chat template built-in chatml")) << r.err;
  // The same prompt and reply as ChatML written out in a file.
  const fs::path chatml = write_file(tmp.path / "chatml.jinja",
                                     "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + "
                                     "'<|im_end|>\\n' }}{% endfor %}{{ '<|im_start|>assistant\\n' }}");
  auto file = test::run_command(chat_cmd(tiny, "--chat-template " + chatml.string() + gen));
  ASSERT_EQ(file.code, 0) << file.err;
  EXPECT_FALSE(has(file.err, "has no chat template")) << file.err;
  EXPECT_EQ(turns_of(r.out)[0]["prompt_tokens"], turns_of(file.out)[0]["prompt_tokens"]);
  EXPECT_EQ(turns_of(r.out)[0]["tokens"], turns_of(file.out)[0]["tokens"]);
  auto named = test::run_command(chat_cmd(tiny, "--chat-template chatml" + gen));
  ASSERT_EQ(named.code, 0) << named.err;
  EXPECT_FALSE(has(named.err, "has no chat template")) << named.err;
  EXPECT_EQ(turns_of(named.out)[0]["tokens"], turns_of(file.out)[0]["tokens"]);
  auto llama3 = test::run_command(chat_cmd(tiny, "--chat-template llama3" + gen));
  ASSERT_EQ(llama3.code, 0) << llama3.err;
  EXPECT_GT(turns_of(llama3.out)[0]["prompt_tokens"].get<int>(), turns_of(named.out)[0]["prompt_tokens"].get<int>() + 10);

  const fs::path tmpl = write_file(tmp.path / "t.jinja",
                                   "{{ bos_token }}{% if loud %}LOUD {% endif %}{% for m in messages %}{{ m.role }}: "
                                   "{{ m.content }}\n{% endfor %}assistant:");
  auto plain = test::run_command(chat_cmd(tiny, "--chat-template " + tmpl.string() + gen));
  auto loud = test::run_command(
      chat_cmd(tiny, "--chat-template " + tmpl.string() + " --chat-template-kwargs '{\"loud\": true}'" + gen));
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(loud.code, 0) << loud.err;
  EXPECT_GT(turns_of(loud.out)[0]["prompt_tokens"].get<int>(), turns_of(plain.out)[0]["prompt_tokens"].get<int>());

  auto bad = test::run_command(chat_cmd(tiny, "--chat-template " + tmpl.string() + " --chat-template-kwargs '{loud'" + gen));
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(has(bad.err, "--chat-template-kwargs: not valid JSON")) << bad.err;
  auto list = test::run_command(chat_cmd(tiny, "--chat-template " + tmpl.string() + " --chat-template-kwargs '[1]'" + gen));
  EXPECT_EQ(list.code, 2);
  EXPECT_TRUE(has(list.err, "--chat-template-kwargs: expected a JSON object")) << list.err;
  auto nofile = test::run_command(chat_cmd(tiny, "--chat-template " + (tmp.path / "no.jinja").string() + gen));
  EXPECT_EQ(nofile.code, 1);
  EXPECT_TRUE(has(nofile.err, "no.jinja: no such file, and not a built-in template name (chatml, llama3, mistral-v7, "
                              "qwen2.5, gemma, phi3)")) << nofile.err;
}

// Gemma 2's template raises on a system message: chat folds --system into the first user turn,
// with a warning. Gemma 3's template folds it the same way itself: same prompt, same reply.
TEST(ChatCommand, SystemPromptFoldedForTemplatesThatRefuseIt) {
  test::TempDir tmp;
  const fs::path tiny = test::repo_model("kjv-tiny");
  const fs::path dir = test::repo_dir() / "tests" / "data" / "chat_templates";
  const fs::path conv = write_file(tmp.path / "conv.txt", "In the beginning\nAnd God said\n");
  const std::string gen = " --system 'Thou art a scribe.' --temperature 0 -n 3 --json -f " + conv.string();
  auto g2 = test::run_command(chat_cmd(tiny, "--chat-template " + (dir / "google-gemma-2-2b-it.jinja").string() + gen));
  ASSERT_EQ(g2.code, 0) << g2.err;
  const std::string warning = "refuses system messages; the system message is put at the start of the first user message";
  EXPECT_TRUE(has(g2.err, warning)) << g2.err;
  EXPECT_EQ(g2.err.find(warning), g2.err.rfind(warning)) << "warned more than once: " << g2.err;
  auto g3 = test::run_command(chat_cmd(tiny, "--chat-template " + (dir / "google-gemma-3-4b-it.jinja").string() + gen));
  ASSERT_EQ(g3.code, 0) << g3.err;
  EXPECT_FALSE(has(g3.err, warning)) << g3.err;
  const auto a = turns_of(g2.out), b = turns_of(g3.out);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(a[k]["prompt_tokens"], b[k]["prompt_tokens"]);
    EXPECT_EQ(a[k]["tokens"], b[k]["tokens"]);
  }
}

// A system prompt of more than two 32-token blocks once rendered.
const std::string kLongSystem =
    "--system 'You are a scribe of the house of David, and thou shalt write the words of the LORD in a book, every "
    "word that he speaketh unto thee, from the beginning of the days unto the end of them.'";

// --prompt-cache-dir: each turn's blocks are saved; the same conversation launched again takes its
// first turn's whole blocks instead of prefilling them, and replies the same.
TEST_F(ChatModel, PromptCacheResumesALaterLaunch) {
  const fs::path conv = write_file(tmp.path / "conv.txt", "In the beginning\nAnd God said\n");
  const std::string args = "-f " + conv.string() + " --temperature 0 -n 5 --json " + kLongSystem +
                           " --prompt-cache-dir " + (tmp.path / "cache").string();
  auto cold = test::run_command(chat_cmd(model, args));
  ASSERT_EQ(cold.code, 0) << cold.err;
  EXPECT_TRUE(has(cold.err, "prompt cache: saved")) << cold.err;
  auto hot = test::run_command(chat_cmd(model, args));
  ASSERT_EQ(hot.code, 0) << hot.err;
  const auto c = turns_of(cold.out), h = turns_of(hot.out);
  ASSERT_EQ(c.size(), 2u);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(c[0]["prompt_cache_tokens"], 0);
  const int cached = h[0]["prompt_cache_tokens"].get<int>();
  EXPECT_GE(cached, 32);
  EXPECT_EQ(cached % 32, 0);  // whole blocks
  EXPECT_EQ(h[0]["prefilled_tokens"].get<int>(), h[0]["prompt_tokens"].get<int>() - cached);
  EXPECT_TRUE(has(hot.err, "restored from the prompt cache")) << hot.err;
  for (size_t k = 0; k < 2; ++k) EXPECT_EQ(h[k]["tokens"], c[k]["tokens"]);
}

// Blocks are keyed by the prefix they hold: a later launch with the same system prompt and another
// first message takes the system prompt's blocks and prefills only the rest.
TEST_F(ChatModel, PromptCacheKeepsTheSystemPromptForAnotherConversation) {
  const std::string common = " --temperature 0 -n 4 --json " + kLongSystem + " --prompt-cache-dir " +
                             (tmp.path / "cache").string();
  const fs::path a = write_file(tmp.path / "a.txt", "In the beginning\n");
  const fs::path b = write_file(tmp.path / "b.txt", "And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say\n");
  auto first = test::run_command(chat_cmd(model, "-f " + a.string() + common));
  ASSERT_EQ(first.code, 0) << first.err;
  auto second = test::run_command(chat_cmd(model, "-f " + b.string() + common));
  ASSERT_EQ(second.code, 0) << second.err;
  const Json t = turns_of(second.out).at(0);
  EXPECT_GE(t["prompt_cache_tokens"].get<int>(), 32) << second.err;
  EXPECT_EQ(t["prompt_cache_tokens"], t["reused_tokens"]);
  EXPECT_EQ(t["prefilled_tokens"].get<int>(), t["prompt_tokens"].get<int>() - t["reused_tokens"].get<int>());
  // The reply is the one a run without the cache gives.
  auto cold = test::run_command(chat_cmd(model, "-f " + b.string() + " --temperature 0 -n 4 --json " + kLongSystem));
  ASSERT_EQ(cold.code, 0) << cold.err;
  EXPECT_EQ(turns_of(cold.out).at(0)["tokens"], t["tokens"]);
}

// A reply cut at a stop string left its last ids in the KV, which the next rendering lacks: the
// session is rewound to the first differing token, and stderr says so. Which reply a model gives
// depends on the CPU's kernels, so the stop string is a character of the reply the same run gives
// without one, first seen past its first character (the cut reply is not empty), shell-quoted.
TEST_F(ChatModel, AStopStringMakesTheNextTurnRewind) {
  const fs::path conv = write_file(tmp.path / "conv.txt", "In the beginning\nAnd God said\n");
  const std::string common = "-f " + conv.string() + " --temperature 0 -n 30 --json";
  auto plain = test::run_command(chat_cmd(model, common));
  ASSERT_EQ(plain.code, 0) << plain.err;
  const std::string reply = turns_of(plain.out).at(0)["text"];
  std::string stop;
  for (size_t i = 1; i < reply.size() && stop.empty(); ++i)
    if (std::isgraph(static_cast<unsigned char>(reply[i])) && reply[i] != '\'' && reply.find(reply[i]) == i)
      stop = reply.substr(i, 1);
  ASSERT_FALSE(stop.empty()) << "nothing to stop at in the reply: " << reply;
  auto r = test::run_command(chat_cmd(model, common + " --stop '" + stop + "'"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto turns = turns_of(r.out);
  ASSERT_EQ(turns.size(), 2u);
  ASSERT_EQ(turns[0]["stop_reason"], "stop_string") << r.out;
  EXPECT_TRUE(has(r.err, "rewound from " + std::to_string(turns[0]["prompt_tokens"].get<int>() +
                                                          int(turns[0]["tokens"].size())))) << r.err;
  EXPECT_LT(turns[1]["reused_tokens"].get<int>(), turns[0]["prompt_tokens"].get<int>() + int(turns[0]["tokens"].size()));
  EXPECT_GE(turns[1]["reused_tokens"].get<int>(), turns[0]["prompt_tokens"].get<int>());
}

// Ctrl-C while a script is being answered: the reply stops, its footer is printed, exit code 130.
TEST_F(ChatModel, CtrlCStopsAScriptWithItsFooter) {
  std::string script;
  for (int i = 0; i < 200; ++i) script += "In the beginning God created the heaven and the earth\n";
  const fs::path conv = write_file(tmp.path / "conv.txt", script);
  const fs::path out = tmp.path / "out", err = tmp.path / "err";
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
    dup2(open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
    std::vector<std::string> all = {"posttrainllm", "chat", model.string(), "-f", conv.string(), "--temperature", "0",
                                    "--streaming-llm-sink", "4", "--streaming-llm-window", "60", "--threads", "1"};
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(test::binary().c_str(), argv.data());
    _exit(127);
  }
  ASSERT_GT(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (std::error_code ec; std::chrono::steady_clock::now() < deadline;) {  // a reply is being written
    const auto n = fs::file_size(out, ec);
    if (!ec && n >= 100) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  std::ifstream in(err);
  const std::string e((std::istreambuf_iterator<char>(in)), {});
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << "\n" << e;
  EXPECT_EQ(WEXITSTATUS(status), 130) << e;
  EXPECT_TRUE(has(e, "stopped: interrupted (Ctrl-C)]")) << e;
}

}  // namespace
}  // namespace ptllm
