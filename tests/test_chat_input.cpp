// chat's input side: turns joined from lines (a trailing backslash, /paste blocks), commands, the
// --max-turn-bytes bound (ChatInput, no model); the commands through the binary from a script
// (ChatCommands); line editing and history on a terminal through tmux (ChatTerminal).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli/chat_input.h"
#include "core/error.h"
#include "test_util.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using cli::ChatCommand;
using cli::ChatInput;

bool has(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

// Every input of `text`, read as a script (interactive = false) or as a terminal.
std::vector<ChatInput> inputs(const std::string& text, size_t max_bytes = 1 << 20, bool interactive = false) {
  std::istringstream in(text);
  cli::StreamLineReader lines(in, max_bytes, /*prompt=*/false);
  cli::TurnReader turns(lines, max_bytes, "standard input", interactive);
  std::vector<ChatInput> out;
  for (ChatInput i = turns.next(); i.kind != ChatInput::Kind::End; i = turns.next()) out.push_back(i);
  return out;
}

void expect_message(const ChatInput& in, const std::string& text) {
  EXPECT_EQ(in.kind, ChatInput::Kind::Message);
  EXPECT_EQ(in.text, text);
}

TEST(ChatInput, BackslashContinuesALine) {
  const auto in = inputs("In the\\\nbeginning\\\r\nGod\nnext\n\nlast\\\n");
  ASSERT_EQ(in.size(), 3u);
  expect_message(in[0], "In the\nbeginning\nGod");
  expect_message(in[1], "next");
  expect_message(in[2], "last\n");  // the end of the input ends a continued line
}

TEST(ChatInput, PasteBlocksAreOneMessageTakenAsTheyAre) {
  const auto in = inputs("/paste\nline one\n/help\n\nends with \\\n/end\n\"\"\"\nx\n\"\"\"\n\"\"\"\n\"\"\"\n/paste\nopen\n");
  ASSERT_EQ(in.size(), 3u);  // the empty block sends nothing; the end of the input closes the last
  expect_message(in[0], "line one\n/help\n\nends with \\");
  expect_message(in[1], "x");
  expect_message(in[2], "open");
}

TEST(ChatInput, CommandsAndDoubleSlash) {
  const auto in = inputs("/help\n/read  my file.txt \n//etc/passwd is a path\n/frobnicate now\n/ not a command\n/end\n/exit\n");
  ASSERT_EQ(in.size(), 7u);
  EXPECT_EQ(in[0].kind, ChatInput::Kind::Command);
  EXPECT_EQ(in[0].command, ChatCommand::Help);
  EXPECT_EQ(in[1].command, ChatCommand::Read);
  EXPECT_EQ(in[1].text, "my file.txt");
  expect_message(in[2], "/etc/passwd is a path");
  EXPECT_EQ(in[3].kind, ChatInput::Kind::Command);
  EXPECT_EQ(in[3].command, ChatCommand::Unknown);
  EXPECT_EQ(in[3].word, "/frobnicate");
  expect_message(in[4], "/ not a command");
  EXPECT_EQ(in[5].command, ChatCommand::Unknown);  // /end outside a block
  EXPECT_EQ(in[6].command, ChatCommand::Exit);
}

// The bound holds over the joined turn: a script stops with the line where it was passed; a person's
// turn is dropped whole (the rest of its block is not sent as turns of its own).
TEST(ChatInput, MaxTurnBytesBoundsJoinedTurns) {
  EXPECT_NO_THROW(inputs("12345\\\n123\n", 10));  // "12345\n123": 9 bytes
  try {
    inputs("ok\n12345\\\n12345\n", 10);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "standard input:3: a turn longer than --max-turn-bytes 10")) << e.what();
  }
  EXPECT_THROW(inputs("/paste\n123456\n123456\n/end\n", 10), Error);
  EXPECT_THROW(inputs("12345678901\n", 10), Error);
  const auto in = inputs("/paste\n123456\n123456\n/end\nafter\n12345\\\n123456\nlast\n", 10, /*interactive=*/true);
  ASSERT_EQ(in.size(), 2u);
  expect_message(in[0], "after");
  expect_message(in[1], "last");
}

// --- through the binary ---

fs::path write_file(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

std::vector<Json> turns_of(const std::string& out) {
  std::vector<Json> turns;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) turns.push_back(Json::parse(line));
  return turns;
}

struct ChatCommands : ::testing::Test {
  test::TempDir tmp;
  const std::string chat = test::binary() + " chat " + test::repo_model("kjv-tiny").string() +
                           " --threads 2 --temp 0 -n 8 --json ";
  // chat over `script`, given on standard input or with -f.
  test::RunResult run(const std::string& script, bool stdin_script = false, const std::string& args = "") {
    const fs::path f = write_file(tmp.path / "script.txt", script);
    if (stdin_script) return test::run_command("(" + chat + args + " <" + f.string() + ")");
    return test::run_command(chat + args + " -f " + f.string());
  }
  Json saved(const std::string& name) { return test::read_json(tmp.path / name); }
  std::string path(const std::string& name) { return (tmp.path / name).string(); }
};

TEST_F(ChatCommands, HelpListsTheCommandsAndIsNotSent) {
  for (bool stdin_script : {false, true}) {
    auto r = run("/help\n", stdin_script);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, "");  // no turn
    for (const char* c : {"/help", "/reset", "/clear", "/regen", "/read FILE", "/save FILE", "/paste", "/exit"})
      EXPECT_TRUE(has(r.err, std::string("\n  ") + c + " ")) << c << "\n" << r.err;
    EXPECT_FALSE(has(r.err, "[turn 1")) << r.err;
  }
  auto h = test::run_command(test::binary() + " chat --help");
  ASSERT_EQ(h.code, 0);
  EXPECT_TRUE(has(h.out, "--history-file")) << h.out;
  EXPECT_TRUE(has(h.out, "/regen")) << h.out;
  EXPECT_TRUE(has(h.out, "On a terminal: ")) << h.out;
}

TEST_F(ChatCommands, UnknownCommandIsAnsweredAndDoubleSlashIsSent) {
  auto r = run("/frobnicate now\n//etc is a path\n/save " + path("s.json") + "\n");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "unknown command /frobnicate; /help lists them")) << r.err;
  EXPECT_EQ(turns_of(r.out).size(), 1u);
  const Json m = saved("s.json");
  ASSERT_EQ(m.size(), 2u) << m.dump();
  EXPECT_EQ(m[0]["content"], "/etc is a path");
}

// /regen at temperature 0: the same reply again, from a KV rewound to the end of the prompt, and the
// history holds it once.
TEST_F(ChatCommands, RegenGivesTheSameReplyOnce) {
  auto r = run("In the beginning\n/regen\n/save " + path("s.json") + "\n", true, "--system 'Be brief.'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto t = turns_of(r.out);
  ASSERT_EQ(t.size(), 2u) << r.out;
  EXPECT_EQ(t[1]["tokens"], t[0]["tokens"]);
  EXPECT_FALSE(t[0]["tokens"].empty());
  EXPECT_EQ(t[1]["prompt_tokens"], t[0]["prompt_tokens"]);
  // The reply's ids are not reused; all of the prompt is, but the one token fed for its logits.
  EXPECT_EQ(t[1]["reused_tokens"].get<int>(), t[0]["prompt_tokens"].get<int>() - 1);
  const Json m = saved("s.json");
  ASSERT_EQ(m.size(), 3u) << m.dump();
  EXPECT_EQ(m[0]["role"], "system");
  EXPECT_EQ(m[1], Json({{"role", "user"}, {"content", "In the beginning"}}));
  EXPECT_EQ(m[2]["role"], "assistant");
  EXPECT_EQ(m[2]["content"], t[1]["text"]);
  auto none = run("/regen\n");
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_TRUE(has(none.err, "/regen: no reply to generate again")) << none.err;
  EXPECT_EQ(none.out, "");
}

TEST_F(ChatCommands, ReadSendsAFileAsTheNextTurn) {
  write_file(tmp.path / "turn.txt", "And God said\nLet there be light\n");
  auto r = run("/read " + path("turn.txt") + "\n/save " + path("s.json") + "\n");
  auto typed = run("And God said\\\nLet there be light\n");
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_EQ(typed.code, 0) << typed.err;
  ASSERT_EQ(turns_of(r.out).size(), 1u);
  EXPECT_EQ(turns_of(r.out)[0]["tokens"], turns_of(typed.out).at(0)["tokens"]);
  EXPECT_EQ(saved("s.json")[0]["content"], "And God said\nLet there be light");
  // Bounded as a typed turn; a file that cannot be read ends a script, naming it.
  write_file(tmp.path / "big.txt", std::string(200, 'x'));
  auto big = run("/read " + path("big.txt") + "\n", false, "--max-turn-bytes 100");
  EXPECT_EQ(big.code, 1);
  EXPECT_TRUE(has(big.err, "big.txt: is 200 bytes, more than the limit of 100 bytes")) << big.err;
  auto missing = run("/read " + path("nope.txt") + "\n");
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(has(missing.err, "nope.txt")) << missing.err;
}

TEST_F(ChatCommands, SaveWritesTheMessagesAsJson) {
  auto r = run("In the beginning\nAnd God said\n/save " + path("s.json") + "\n/reset\n/save " + path("empty.json") +
                   "\nAnd God said\n/clear\n/save " + path("cleared.json") + "\n",
               false, "--system 'Be brief.'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto t = turns_of(r.out);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[2]["reused_tokens"], 0);  // after /reset, from an empty KV
  const Json m = saved("s.json");
  ASSERT_TRUE(m.is_array());
  ASSERT_EQ(m.size(), 5u) << m.dump();
  const char* roles[] = {"system", "user", "assistant", "user", "assistant"};
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(m[i]["role"], roles[i]);
  EXPECT_EQ(m[0]["content"], "Be brief.");
  EXPECT_EQ(m[3]["content"], "And God said");
  EXPECT_EQ(m[2]["content"], t[0]["text"]);
  EXPECT_EQ(m[4]["content"], t[1]["text"]);
  EXPECT_EQ(saved("empty.json"), Json::array({{{"role", "system"}, {"content", "Be brief."}}}));
  EXPECT_EQ(saved("cleared.json"), saved("empty.json"));
  EXPECT_TRUE(has(r.err, "saved 5 messages to " + path("s.json"))) << r.err;
}

TEST_F(ChatCommands, ContinuationAndPasteAreOneTurn) {
  auto r = run("In the\\\nbeginning\n\"\"\"\nAnd God said\n/exit\n\\\n\"\"\"\n/paste\nx\n/end\n/save " + path("s.json") +
                   "\n",
               true);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(turns_of(r.out).size(), 3u);
  const Json m = saved("s.json");
  ASSERT_EQ(m.size(), 6u) << m.dump();
  EXPECT_EQ(m[0]["content"], "In the\nbeginning");
  EXPECT_EQ(m[2]["content"], "And God said\n/exit\n\\");
  EXPECT_EQ(m[4]["content"], "x");
  auto over = run("In the\\\nbeginning\n", true, "--max-turn-bytes 12");
  EXPECT_EQ(over.code, 1);
  EXPECT_TRUE(has(over.err, "standard input:2: a turn longer than --max-turn-bytes 12")) << over.err;
}

// --- on a terminal, through tmux ---

struct Tmux {
  std::string socket;
  explicit Tmux(const std::string& name) : socket(name) {}
  ~Tmux() { test::run_command(cmd("kill-server")); }
  std::string cmd(const std::string& args) const { return "tmux -f /dev/null -L " + socket + " " + args; }
  void keys(const std::string& args) const { ASSERT_EQ(test::run_command(cmd("send-keys -t chat " + args)).code, 0); }
  std::string screen() const { return test::run_command(cmd("capture-pane -p -S -200 -t chat")).out; }
  // Waits until the screen shows `what` `count` times.
  bool wait_for(const std::string& what, int count = 1) const {
    for (auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60); std::chrono::steady_clock::now() < end;) {
      const std::string s = screen();
      int n = 0;
      for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
      if (n >= count) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
};

// A line typed, recalled with Up, edited and sent; /save shows what the model was sent, and the
// history file keeps the lines for the next launch, where Up recalls them again.
TEST(ChatTerminal, UpRecallsAnEditableLineAndTheHistoryIsKept) {
  if (test::run_command("command -v tmux").code != 0) GTEST_SKIP() << "tmux is not installed (scripts/setup-dev.sh)";
  if (!has(test::run_command(test::binary() + " chat --help").out, "line editing and history (libedit)"))
    GTEST_SKIP() << "this build has no libedit (Debian libedit-dev)";
  test::TempDir tmp;
  const fs::path hist = tmp.path / "history", save = tmp.path / "s.json", save2 = tmp.path / "s2.json";
  const std::string chat = test::binary() + " chat " + test::repo_model("kjv-tiny").string() +
                           " --threads 2 --temp 0 -n 8 --history-file " + hist.string();
  // A long history from earlier runs: the file keeps its last kMaxHistory (1000) lines.
  std::string old = "_HiStOrY_V2_\n";
  for (int i = 0; i < 1200; ++i) old += "old\\040line\\040" + std::to_string(i) + "\n";
  write_file(hist, old);
  Tmux t("ptllm-chat-test-" + std::to_string(getpid()));
  ASSERT_EQ(test::run_command(t.cmd("new-session -d -s chat -x 160 -y 50 '" + chat + "; echo chat-ended; sleep 30'")).code, 0);
  ASSERT_TRUE(t.wait_for("/help lists the commands")) << t.screen();
  t.keys("-l 'In the beginning'");
  t.keys("Enter");
  ASSERT_TRUE(t.wait_for("[turn 1:")) << t.screen();
  t.keys("Up");
  t.keys("-l ' God'");
  t.keys("Enter");
  ASSERT_TRUE(t.wait_for("[turn 2:")) << t.screen();
  t.keys("-l '/save " + save.string() + "'");
  t.keys("Enter");
  ASSERT_TRUE(t.wait_for("saved 4 messages")) << t.screen();
  EXPECT_FALSE(has(t.screen(), "^[[A")) << t.screen();
  const Json m = test::read_json(save);
  ASSERT_EQ(m.size(), 4u) << m.dump();
  EXPECT_EQ(m[0]["content"], "In the beginning");
  EXPECT_EQ(m[2]["content"], "In the beginning God");
  t.keys("-l /clear");
  t.keys("Enter");
  ASSERT_TRUE(t.wait_for("conversation reset")) << t.screen();
  const std::string visible = test::run_command(t.cmd("capture-pane -p -t chat")).out;
  EXPECT_FALSE(has(visible, "[turn 1:")) << visible;
  EXPECT_TRUE(has(visible, "conversation reset")) << visible;
  t.keys("-l /exit");
  t.keys("Enter");
  ASSERT_TRUE(t.wait_for("chat-ended")) << t.screen();
  // The history file (libedit's format), the owner's alone; the next launch recalls its lines.
  std::ifstream in(hist);
  const std::string h((std::istreambuf_iterator<char>(in)), {});
  EXPECT_TRUE(has(h, "In\\040the\\040beginning\\040God\n")) << h;
  EXPECT_EQ(std::count(h.begin(), h.end(), '\n'), 1001);  // the header line and 1000 lines
  EXPECT_FALSE(has(h, "old\\040line\\040204\n"));
  EXPECT_TRUE(has(h, "old\\040line\\040205\n"));  // 995 old lines, then the 5 typed
  EXPECT_EQ(fs::status(hist).permissions() & fs::perms::others_read, fs::perms::none);
  Tmux t2("ptllm-chat-test2-" + std::to_string(getpid()));
  ASSERT_EQ(test::run_command(t2.cmd("new-session -d -s chat -x 160 -y 50 '" + chat + "; echo chat-ended; sleep 30'")).code, 0);
  ASSERT_TRUE(t2.wait_for("/help lists the commands")) << t2.screen();
  t2.keys("Up");  // /exit
  t2.keys("Up");  // /clear
  t2.keys("Up");  // /save ...
  t2.keys("Up");  // In the beginning God
  t2.keys("Enter");
  ASSERT_TRUE(t2.wait_for("[turn 1:")) << t2.screen();
  t2.keys("-l '/save " + save2.string() + "'");
  t2.keys("Enter");
  ASSERT_TRUE(t2.wait_for("saved 2 messages")) << t2.screen();
  EXPECT_EQ(test::read_json(save2)[0]["content"], "In the beginning God");
}

// Where the history goes: $XDG_STATE_HOME/posttrainllm/history, else ~/.posttrainllm_history;
// --no-history writes none.
TEST(ChatTerminal, HistoryFilePlaces) {
  if (test::run_command("command -v tmux").code != 0) GTEST_SKIP() << "tmux is not installed (scripts/setup-dev.sh)";
  if (!has(test::run_command(test::binary() + " chat --help").out, "line editing and history (libedit)"))
    GTEST_SKIP() << "this build has no libedit (Debian libedit-dev)";
  test::TempDir tmp;
  const std::string chat = test::binary() + " chat " + test::repo_model("kjv-tiny").string() + " --threads 2 -n 2";
  struct Case {
    std::string env, flags;
    fs::path written;
  };
  const fs::path state = tmp.path / "state", home = tmp.path / "home", home2 = tmp.path / "home2";
  fs::create_directories(state);
  fs::create_directories(home);
  fs::create_directories(home2);
  const Case cases[] = {{"HOME=" + home.string() + " XDG_STATE_HOME=" + state.string(), "", state / "posttrainllm" / "history"},
                        {"HOME=" + home.string() + " XDG_STATE_HOME=", "", home / ".posttrainllm_history"},
                        {"HOME=" + home2.string() + " XDG_STATE_HOME=", "--no-history", ""}};
  int k = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.env + " " + c.flags);
    Tmux t("ptllm-chat-hist-" + std::to_string(getpid()) + "-" + std::to_string(k++));
    ASSERT_EQ(test::run_command(t.cmd("new-session -d -s chat -x 160 -y 50 'env " + c.env + " " + chat + " " + c.flags +
                                      "; echo chat-ended; sleep 30'")).code, 0);
    ASSERT_TRUE(t.wait_for("/help lists the commands")) << t.screen();
    t.keys("-l /help");
    t.keys("Enter");
    t.keys("-l /exit");
    t.keys("Enter");
    ASSERT_TRUE(t.wait_for("chat-ended")) << t.screen();
    if (c.written.empty()) {
      EXPECT_TRUE(fs::is_empty(home2)) << "a history file was written";
      continue;
    }
    std::ifstream in(c.written);
    const std::string h((std::istreambuf_iterator<char>(in)), {});
    EXPECT_TRUE(has(h, "/help\n/exit\n")) << c.written << ": " << h;
    fs::remove(c.written);
  }
}

}  // namespace
}  // namespace ptllm
