// posttrainllm chat: a multi-turn conversation through the model's chat template. The
// conversation's KV stays between turns (engine/conversation.h): each turn renders the whole
// conversation and prefills only what the session lacks. Replies to stdout, status to stderr.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli/chat_input.h"
#include "cli/chat_prompt.h"
#include "engine/chat_output.h"
#include "cli/block_cache.h"
#include "cli/commands.h"
#include "cli/generation.h"
#include "cli/line_editor.h"
#include "cli/options.h"
#include "cli/output.h"
#include "cli/speculation.h"
#include "core/error.h"
#include "core/file_io.h"
#include "engine/conversation.h"
#include "engine/prompt_blocks.h"
#include "persist/cache_file.h"
#include "engine/runtime.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

namespace ptllm::cli {

namespace {

struct ChatArgs {
  std::string model_dir;
  std::string system, system_file, input_file;
  CLI::Option *system_opt = nullptr, *system_file_opt = nullptr, *input_opt = nullptr;
  ChatPromptOptions prompt;
  std::vector<std::string> stops;
  int tokens = -1;  // per reply; -1 = until EOS, a stop string or a full context
  std::string seed = "-1";
  bool json = false;
  SamplingConfig sampling;
  GrammarArgs grammar;
  std::shared_ptr<const ConstraintSpec> constraint;  // every reply follows it
  RuntimeOptions runtime;
  std::string prompt_cache_dir;
  double prompt_cache_max_mb = 0;
  std::string tools_file;              // --tools: a JSON list of OpenAI function tools
  std::string tool_call_format = "auto";
  size_t max_turn_bytes = size_t(4) << 20;  // far more than a context holds: a bound on memory
  bool quiet = false;  // no model:, footer, prompt cache or rewind lines (warnings and errors stay)
  std::string history_file;  // --history-file; empty: the default place
  bool no_history = false;
  SpecArgs spec;
  SpecOptions spec_opts;  // validated from spec before the model loads
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

std::string read_text_file(const std::string& path, const std::string& flag) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw Error(path + ": cannot open (" + flag + ")");
  return read_whole_file(path, kMaxTextBytes, "the file given to " + flag);
}

using Reply = GeneratedText;  // ttft_ms: from the start of the turn's prefill

// The decode loop of one reply, from the prompt's logits; streams to stdout unless --json. Every
// token of the reply that fits is fed, so that the next turn need not prefill it.
Reply generate_reply(const ChatArgs& a, Session& session, const Tokenizer& tok, const std::vector<int32_t>& eos,
                     Sampler& sampler, Speculator& spec, bool keep_special, Clock::time_point t_turn) {
  std::vector<float> logits(session.last_logits().begin(), session.last_logits().end());
  GeneratorOptions o;
  o.stops = a.stops;
  o.eos_ids = eos;
  o.max_tokens = a.tokens;
  o.keep_special = keep_special;
  o.constraint = a.constraint;
  Generator gen(tok, std::move(o), sampler);
  Reply r;
  TextStream out(r, a.json);
  const auto t_decode = Clock::now();
  std::vector<Generator::Step> steps;
  // Each round feeds the last accepted id (and drafts after it, verified in the same pass) and
  // yields one step or more (engine/speculative.h).
  for (int i = 0; (a.tokens < 0 || i < a.tokens) && !gen.done();) {
    if (interrupted() || out.closed()) {
      gen.stop(interrupted() ? StopReason::Interrupted : StopReason::OutputClosed);
      break;
    }
    if (i == 0) {
      steps.assign(1, gen.next(logits, session.history(), session.fits(1)));
      r.ttft_ms = ms_since(t_turn);
    } else {
      const int32_t pending = steps.back().id;
      steps.clear();
      spec.round(session, gen, pending, steps);
    }
    for (const Generator::Step& st : steps) {
      out.emit(st.text);
      ++i;
    }
  }
  // Every token of the reply that fits is fed, so that the next turn need not prefill it.
  if (!steps.empty() && steps.back().accepted && session.fits(1)) session.feed({&steps.back().id, 1});
  out.end(gen);
  r.decode_ms = ms_since(t_decode);
  return r;
}

std::string stop_line(const ChatArgs& a, const Session& session, const Reply& r) {
  return stop_reason_text(r.reason, r.stop_string, a.tokens, session.options().kv.ctx_size);
}

struct TurnStats {
  int turn = 0;
  SpecStats spec;  // this turn's speculation
  TurnPrefill prefill;
  double prefill_ms = 0;
};

double decode_tok_s(const Reply& r, const TurnStats& s) {
  const int steps = std::max(0, r.sampled - 1);
  const double ms = r.decode_ms - (r.ttft_ms - s.prefill_ms);
  return steps > 0 && ms > 0 ? steps / (ms / 1000) : 0.0;
}

// The footer of one turn, on stderr: what was reused, what was computed, how fast, why it stopped.
void print_footer(const ChatArgs& a, const Session& session, const TurnStats& s, const Reply& r) {
  const TurnPrefill& p = s.prefill;
  std::string reused = std::to_string(p.reused) + " reused from the KV";
  if (p.from_cache > 0) reused = std::to_string(p.reused) + " restored from the prompt cache";
  std::fprintf(stderr, "[turn %d: prompt %lld tokens, %s, %lld prefilled; time to first token %.1f ms; %d tokens at %.1f tok/s; stopped: %s]\n",
               s.turn, (long long)p.prompt_tokens, reused.c_str(), (long long)p.prefilled, r.ttft_ms, r.sampled,
               decode_tok_s(r, s), stop_line(a, session, r).c_str());
  if (const std::string sl = spec_line(a.spec_opts, s.spec); !sl.empty()) std::fprintf(stderr, "[%s]\n", sl.c_str());
}

// False when nobody reads stdout any more.
bool print_json(const TurnStats& s, const Reply& r, const ChatOutputParser& out, const SpecOptions& spec_opts) {
  nlohmann::json calls = nlohmann::json::array();
  for (const ToolCall& c : out.calls())
    calls.push_back({{"id", c.id}, {"name", c.name}, {"arguments", nlohmann::json::parse(c.arguments)}});
  nlohmann::json j = {{"turn", s.turn},
                      {"text", r.text},
                      {"content", out.content()},
                      {"reasoning_content", out.reasoning()},
                      {"tool_calls", calls},
                      {"tokens", r.tokens},
                      {"prompt_tokens", s.prefill.prompt_tokens},
                      {"reused_tokens", s.prefill.reused},
                      {"prefilled_tokens", s.prefill.prefilled},
                      {"prompt_cache_tokens", s.prefill.from_cache},
                      {"stop_reason", stop_reason_key(r.reason)}};
  if (r.reason == StopReason::StopString) j["stop_string"] = r.stop_string;
  j["timings"] = {{"prefill_ms", s.prefill_ms}, {"ttft_ms", r.ttft_ms}, {"decode_ms", r.decode_ms},
                  {"decode_tokens", r.sampled}, {"decode_tok_s", decode_tok_s(r, s)}};
  j["speculative"] = spec_json(spec_opts, s.spec);
  return write_stdout(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

// Where the user turns come from: -f FILE, standard input when it is not a terminal (scripts), else
// the terminal with a prompt, through the line editor where the build has one. A line is read in
// pieces and never held past --max-turn-bytes (`chat < /dev/zero` has no line end).
class TurnSource {
 public:
  explicit TurnSource(const ChatArgs& a) {
    std::istream* in = &std::cin;
    std::string name = "standard input";
    if (a.input_opt->count() && a.input_file != "-") {
      file_.open(a.input_file, std::ios::binary);
      if (!file_) throw Error(a.input_file + ": cannot open the conversation file (--file)");
      in = &file_;
      name = a.input_file;
    }
    interactive_ = in == &std::cin && isatty(STDIN_FILENO) && !a.input_opt->count();
    // The editor echoes what is typed: it needs a terminal to show it on.
    if (interactive_ && (isatty(STDOUT_FILENO) || isatty(STDERR_FILENO)))
      lines_ = make_line_editor(history_path(a), a.max_turn_bytes);
    if (!lines_) lines_ = std::make_unique<StreamLineReader>(*in, a.max_turn_bytes, interactive_);
    turns_.emplace(*lines_, a.max_turn_bytes, name, interactive_);
  }
  bool interactive() const { return interactive_; }
  // The next message or command; Kind::End at the end of the input.
  ChatInput next() { return turns_->next(); }

 private:
  // --history-file, else $XDG_STATE_HOME/posttrainllm/history, else ~/.posttrainllm_history; empty
  // with --no-history or nowhere to keep it.
  static std::string history_path(const ChatArgs& a) {
    if (a.no_history) return "";
    if (!a.history_file.empty()) return a.history_file;
    if (const char* state = std::getenv("XDG_STATE_HOME"); state != nullptr && *state == '/') {
      const std::filesystem::path dir = std::filesystem::path(state) / "posttrainllm";
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      return (dir / "history").string();
    }
    if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
      return (std::filesystem::path(home) / ".posttrainllm_history").string();
    return "";
  }

  std::ifstream file_;
  std::unique_ptr<LineReader> lines_;
  std::optional<TurnReader> turns_;
  bool interactive_ = false;
};

struct ChatState {
  const ChatArgs& args;
  Runtime& rt;
  ChatPrompt& prompt;
  Conversation& conv;
  PromptBlockCache* cache;            // with --prompt-cache-dir
  std::vector<int32_t> eos;
  Sampler sampler;
  chat_json messages;
  int turn = 0;
  chat_json tools = nullptr;         // --tools
  OutputFormat format;               // how replies are split (the template's, or --tool-call-format)
  std::unique_ptr<Speculator> spec;  // one for the conversation: its measurements carry across turns
};

chat_json initial_messages(const ChatArgs& a) {
  chat_json m = chat_json::array();
  if (a.system_file_opt->count()) {
    m.push_back({{"role", "system"}, {"content", read_text_file(a.system_file, "--system-file")}});
  } else if (a.system_opt->count()) {
    m.push_back({{"role", "system"}, {"content", a.system}});
  }
  return m;
}

// A turn's prefill. With a prompt cache, a fresh session takes the longest cached prefix of blocks
// (a system prompt's, shared by other conversations, included) and the blocks it computes are saved.
TurnPrefill prefill_turn(ChatState& st, const std::vector<int32_t>& ids) { return st.conv.prefill(ids, st.cache); }

// One user turn: render, prefill what is new, generate, remember the reply. Returns the reply.
Reply run_turn(ChatState& st, const std::string& user_text) {
  st.messages.push_back({{"role", "user"}, {"content", user_text}});
  const std::string text = st.prompt.render(st.messages, /*add_generation_prompt=*/true, st.tools);
  // As transformers' apply_chat_template: the template writes the special tokens itself.
  const std::vector<int32_t> ids = st.rt.tokenizer().encode(text, {.add_special = false});
  if (ids.empty()) throw Error("the chat template rendered a prompt of no tokens");
  // The reply as the server would split it; a reply with calls goes back into the history as one.
  const ChatOutputOptions oo = chat_output_options(st.format, /*reasoning=*/true, st.tools, /*parallel_calls=*/true, text);
  TurnStats s;
  s.turn = st.turn + 1;
  const auto t_turn = Clock::now();
  s.prefill = prefill_turn(st, ids);
  st.turn = s.turn;
  s.prefill_ms = ms_since(t_turn);
  if (!s.prefill.note.empty() && !st.args.quiet) std::fprintf(stderr, "%s\n", s.prefill.note.c_str());
  Reply r;
  {
    SigintGuard sigint;
    const SpecStats before = st.spec->stats();
    r = generate_reply(st.args, st.conv.session(), st.rt.tokenizer(), st.eos, st.sampler, *st.spec,
                       needs_special_text(oo), t_turn);
    s.spec = st.spec->stats();
    s.spec.drafted -= before.drafted;
    s.spec.accepted -= before.accepted;
    s.spec.verify_steps -= before.verify_steps;
    s.spec.verify_tokens -= before.verify_tokens;
    s.spec.plain_steps -= before.plain_steps;
  }
  ChatOutputParser out(oo);
  out.push(r.text);
  out.finish();
  chat_json reply = {{"role", "assistant"}, {"content", out.calls().empty() ? r.text : out.content()}};
  if (!out.calls().empty()) {
    reply["tool_calls"] = chat_json::array();
    for (const ToolCall& c : out.calls())
      reply["tool_calls"].push_back({{"id", c.id}, {"type", "function"},
                                     {"function", {{"name", c.name}, {"arguments", chat_json::parse(c.arguments)}}}});
  }
  st.messages.push_back(std::move(reply));
  if (st.cache) st.cache->save(st.conv.session(), true);
  if (!st.args.quiet) print_footer(st.args, st.conv.session(), s, r);
  if (!st.args.json)
    for (const ToolCall& c : out.calls())
      std::fprintf(stderr, "[tool call %s: %s %s]\n", c.id.c_str(), c.name.c_str(), c.arguments.c_str());
  if (st.args.json && !print_json(s, r, out, st.args.spec_opts)) r.reason = StopReason::OutputClosed;
  return r;
}

// What the loop does after a command.
enum class AfterCommand { Next, Send, Regen, Exit };

// /read FILE: the file's text, bounded as a typed turn; one final line end dropped.
std::string read_turn_file(const std::string& path, size_t max_bytes) {
  if (path.empty()) throw Error("/read: which file? (/read FILE)");
  std::string text = read_whole_file(path, max_bytes, "a turn (/read; --max-turn-bytes)");
  if (text.ends_with("\n")) text.pop_back();
  if (text.ends_with("\r")) text.pop_back();
  if (text.empty()) throw Error(path + ": empty (/read)");
  return text;
}

void reset_conversation(ChatState& st) {
  st.messages = initial_messages(st.args);
  st.conv.reset();
}

// Carries out a command, but for sending (Send: `text`; Regen), which is the loop's. Throws
// ptllm::Error for a command that cannot be done (a file that cannot be read or written).
AfterCommand run_command(ChatState& st, const ChatInput& in, bool interactive, std::string& text) {
  const bool quiet = st.args.quiet;
  switch (in.command) {
    case ChatCommand::Help:
      std::fputs(chat_commands_help(), stderr);
      return AfterCommand::Next;
    case ChatCommand::Reset:
    case ChatCommand::Clear:
      reset_conversation(st);
      if (in.command == ChatCommand::Clear && interactive && isatty(STDOUT_FILENO)) {
        std::fputs("\033[H\033[2J", stdout);  // cursor home, erase the screen
        std::fflush(stdout);
      }
      if (!quiet) std::fprintf(stderr, "conversation reset\n");
      return AfterCommand::Next;
    case ChatCommand::Regen: {
      const chat_json& m = st.messages;
      if (m.size() < 2 || m.back()["role"] != "assistant" || m[m.size() - 2]["role"] != "user" ||
          !m[m.size() - 2]["content"].is_string()) {
        std::fprintf(stderr, "/regen: no reply to generate again\n");
        return AfterCommand::Next;
      }
      return AfterCommand::Regen;
    }
    case ChatCommand::Read:
      text = read_turn_file(in.text, st.args.max_turn_bytes);
      return AfterCommand::Send;
    case ChatCommand::Save: {
      if (in.text.empty()) throw Error("/save: which file? (/save FILE)");
      write_file_atomically(in.text, {st.messages.dump(2, ' ', false, chat_json::error_handler_t::replace), "\n"});
      if (!quiet) std::fprintf(stderr, "saved %zu messages to %s\n", st.messages.size(), in.text.c_str());
      return AfterCommand::Next;
    }
    case ChatCommand::Exit:
      return AfterCommand::Exit;
    case ChatCommand::Unknown:
      std::fprintf(stderr, "unknown command %s; /help lists them\n", in.word.c_str());
      return AfterCommand::Next;
  }
  return AfterCommand::Next;
}

int run_chat(ChatArgs& a) {
  a.spec_opts = spec_options(a.spec);
  if (a.spec_opts.type != SpecType::None && a.runtime.no_cache)
    throw UsageError("--spec-type " + a.spec.type + " verifies drafts against the KV cache: it cannot be combined with --no-cache");
  if (a.system_opt->count() && a.system_file_opt->count()) throw UsageError("give one of --system, --system-file");
  const std::filesystem::path dir = a.model_dir.empty() ? default_model_dir() : std::filesystem::path(a.model_dir);
  ChatPrompt prompt = ChatPrompt::load(dir, a.prompt);  // template errors before the model loads
  a.constraint = grammar_constraint(a.grammar);
  for (const std::string& s : a.stops)
    if (s.empty()) throw UsageError("--stop: an empty stop string");
  TurnSource source(a);
  Runtime rt(RuntimeConfig{dir, resolve_threads(a.runtime), true});
  const SessionOptions sopts = make_session_options(a.runtime, rt.config());
  const auto draft = load_draft_model(a.spec, a.spec_opts, rt.tokenizer(), dir.string(), rt.pool(), sopts.kv.ctx_size);
  BlockPromptCache blocks =
      open_block_prompt_cache(a.prompt_cache_dir, a.prompt_cache_max_mb, rt.model(), rt.tokenizer(), sopts.kv);
  Conversation conv(rt.model(), sopts, rt.pool(), blocks.pool());
  // The blocks still queued are written when the chat ends, however it ends.
  struct SaveAtExit {
    BlockPromptCache& b;
    Conversation& c;
    bool quiet;
    ~SaveAtExit() {
      if (!b.cache) return;
      try {
        report_block_save(b.cache->finish(c.session()), b.root, quiet);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "warning: prompt cache: %s\n", e.what());
      }
    }
  } save_at_exit{blocks, conv, a.quiet};
  a.sampling.seed = a.seed == "-1" ? uint64_t(std::random_device{}()) : std::stoull(a.seed);
  ChatState st{a, rt, prompt, conv, blocks.cache.get(), stop_token_ids(dir, rt.config(), rt.tokenizer()),
               Sampler(a.sampling), initial_messages(a), 0, nullptr, OutputFormat{}, {}};
  if (!a.tools_file.empty()) {
    st.tools = chat_json::parse(read_text_file(a.tools_file, "--tools"), nullptr, false);
    if (st.tools.is_discarded() || !st.tools.is_array())
      throw Error(a.tools_file + ": not a JSON array of tools (--tools), e.g. [{\"type\": \"function\", \"function\": {\"name\": ...}}]");
    for (const chat_json& t : st.tools)
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
          !t["function"]["name"].is_string())
        throw Error(a.tools_file + ": every tool needs function.name (--tools), got " + t.dump());
  }
  st.format = detect_output_format(prompt.source(), a.tool_call_format);
  st.spec = std::make_unique<Speculator>(a.spec_opts);
  if (!a.quiet)
    std::fprintf(stderr, "model: %s (%s, %s), %d threads, seed %llu, chat template %s\n", dir.string().c_str(),
                 rt.config().arch_name.c_str(), weights_text(rt.model()).c_str(), rt.pool().size(),
                 static_cast<unsigned long long>(a.sampling.seed), prompt.origin().c_str());
  if (source.interactive() && !a.quiet)
    std::fprintf(stderr, "chat: type a message; /help lists the commands, /exit or Ctrl-D ends, Ctrl-C stops a reply\n");
  // A script stopped by Ctrl-C ends, also between turns; on a terminal Ctrl-C stops only a reply.
  std::optional<SigintGuard> script_sigint;
  if (!source.interactive()) script_sigint.emplace();
  // One message to the model; an exit code when the chat ends with it.
  auto send = [&](const std::string& text) -> std::optional<int> {
    Reply r;
    try {
      r = run_turn(st, text);
    } catch (const OutputError&) {
      throw;
    } catch (const Error& e) {
      if (!source.interactive()) throw;
      // A person can go on: a template refusing the message, a conversation past --ctx-size.
      st.messages.erase(st.messages.end() - 1);
      std::fprintf(stderr, "error: %s (the message was dropped)\n", e.what());
      return std::nullopt;
    }
    if (r.reason == StopReason::OutputClosed) return 0;  // nobody reads the replies any more
    if (r.reason == StopReason::Interrupted) {
      if (!source.interactive()) return 130;  // a script interrupted ends; a person goes on typing
      clear_interrupted();
    }
    return std::nullopt;
  };
  while (!interrupted()) {
    const ChatInput in = source.next();
    if (in.kind == ChatInput::Kind::End) break;
    if (in.kind == ChatInput::Kind::Message) {
      if (const auto code = send(in.text)) return *code;
      continue;
    }
    AfterCommand then = AfterCommand::Next;
    std::string text;
    try {
      then = run_command(st, in, source.interactive(), text);
    } catch (const OutputError&) {
      throw;
    } catch (const Error& e) {
      if (!source.interactive()) throw;  // as any error of a script: /read of a missing file ends it
      std::fprintf(stderr, "error: %s\n", e.what());
      continue;
    }
    if (then == AfterCommand::Exit) break;
    if (then == AfterCommand::Send) {
      if (const auto code = send(text)) return *code;
    } else if (then == AfterCommand::Regen) {
      // The last user message again, its reply gone: the prefill rewinds the KV to before the reply.
      const chat_json saved = st.messages;
      const std::string user = st.messages[st.messages.size() - 2]["content"];
      st.messages.erase(st.messages.end() - 2, st.messages.end());
      const size_t before = st.messages.size();
      if (const auto code = send(user)) return *code;
      if (st.messages.size() == before) st.messages = saved;  // dropped: the old reply stays
    }
  }
  return interrupted() ? 130 : 0;
}

}  // namespace

Command add_chat_command(CLI::App& root) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* app = root.add_subcommand("chat", "A multi-turn conversation through the model's chat template");
  app->footer(std::string("\nOn a terminal: ") +
              (line_editor_available() ? "line editing and history (libedit)"
                                       : "plain lines (this build has no libedit: no line editing or history)") +
              ".\n" + chat_commands_help());
  add_model_option(*app, a->model_dir, "Hugging Face model directory or .gguf file (default: the shipped models/kjv-tiny)");
  a->system_opt = app->add_option("--system", a->system, "The system prompt (llama.cpp's -sys)");
  a->system_file_opt =
      app->add_option("--system-file", a->system_file, "Read the system prompt from FILE")->excludes(a->system_opt);
  a->input_opt = app->add_option("--file,-f", a->input_file,
                                 "Read the user turns from FILE, one per line (- = standard input); without it "
                                 "they come from standard input, with a prompt when it is a terminal");
  app->add_option("--history-file", a->history_file,
                  "Keep the lines typed on a terminal in FILE (default: $XDG_STATE_HOME/posttrainllm/history, "
                  "else ~/.posttrainllm_history; the last 1000 lines)");
  app->add_flag("--no-history", a->no_history, "Keep no history file (Up still recalls the lines typed since chat started)");
  add_chat_prompt_options(*app, a->prompt);
  app->add_option("--max-turn-bytes", a->max_turn_bytes,
                  "Longest user turn read (a line, lines joined by \\ or /paste, a /read file), in bytes")
      ->check(integer_at_least(1, int64_t(1) << 40));
  app->add_option("--stop", a->stops, "End a reply when its text contains STR (repeatable)")->default_str("");
  app->add_option("--tokens,-n", a->tokens, "Most tokens per reply (-1 = until EOS, a stop string or a full context)")
      ->check(integer_at_least(-1));
  add_sampling_options(*app, a->sampling);
  add_grammar_options(*app, a->grammar);
  app->add_option("--seed,-s", a->seed, "RNG seed (-1 = random, printed at start)")
      ->check(CLI::Validator([](std::string& s) { return s == "-1" ? std::string() : unsigned_integer()(s); }, ""))
      ->type_name("INT");
  app->add_flag("--quiet,-q", a->quiet,
                "Only the replies (or the JSON) and warnings: no model:, turn footer or prompt cache lines on stderr");
  app->add_flag("--json", a->json, "Print one JSON object per turn on stdout (text, ids, token counts, timings, "
                                   "stop reason) instead of the streamed reply");
  app->add_option("--tools", a->tools_file,
                  "Offer the tools of FILE (a JSON list of OpenAI function tools) to the template; calls in replies "
                  "are parsed (--json shows them) and kept in the history as calls");
  app->add_option("--tool-call-format", a->tool_call_format,
                  "How tool calls are read from replies: auto (from the chat template), hermes, llama3, mistral, "
                  "qwen3-coder, none")
      ->check(CLI::IsMember({"auto", "hermes", "llama3", "mistral", "qwen3-coder", "none"}))
      ->capture_default_str();
  add_runtime_options(*app, a->runtime);
  add_spec_options(*app, a->spec);
  CLI::Option* dir = app->add_option("--prompt-cache-dir", a->prompt_cache_dir,
                                     "Prompt cache directory (the block store of serve --prompt-cache-dir): save "
                                     "each turn's blocks; a later launch takes the longest cached prefix")
                         ->excludes(app->get_option("--no-cache"));
  app->add_option("--prompt-cache-max-mb", a->prompt_cache_max_mb,
                  "Keep --prompt-cache-dir under N MiB, removing least recently used blocks (default 1024)")
      ->check(number_at_least(0, /*exclusive=*/true))
      ->needs(dir);
  return {app, [a] { return run_chat(*a); }};
}

}  // namespace ptllm::cli
