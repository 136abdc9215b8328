// posttrainllm serve: the OpenAI-compatible HTTP server (server/) over the Scheduler (engine/):
// continuous batching of up to --parallel sequences on one shared KV pool. SIGTERM or Ctrl-C stops
// it gracefully: new requests get 503, those in flight finish, the process exits 0.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chat/chat_template.h"
#include "cli/chat_prompt.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "cli/speculation.h"
#include "core/error.h"
#include "engine/chat_output.h"
#include "engine/conversation.h"
#include "engine/prompt_cache.h"
#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "server/http_server.h"
#include "server/webui.h"
#include "store/dir_store.h"
#include "store/redis_store.h"

namespace ptllm::cli {

namespace {

struct ServeArgs {
  std::string model_dir;
  std::string alias;
  std::string tool_call_format = "auto";
  std::string reasoning_format = "deepseek";
  bool api_key_given = false;
  server::ServerConfig http;
  int parallel = 4;
  int kv_budget_mb = 0;
  int kv_pin_mb = 0;
  int cache_reuse = 0;  // --cache-reuse
  int prefill_chunk = 256;
  int max_body_mb = 8;
  RuntimeOptions runtime;
  ChatPromptOptions chat;
  store::RedisStoreOptions store;  // --kv-store (url empty: none)
  std::string store_prefix = "ptllm";
  int store_max_mb = 0;
  int store_queue_mb = 128;
  std::string context_overflow = "error";  // --context-overflow
  int keep = -1;                            // --keep (-1: not given)
  std::string prompt_cache_dir;      // --prompt-cache-dir: the blocks persist there (store/dir_store.h)
  double prompt_cache_max_mb = 1024;
  SpecArgs spec;
  int spec_suffix_cache = -1;  // --spec-suffix-cache (-1: not given)
  bool no_spec_draft_batch = false;  // --no-spec-draft-batch
};

// `text` with every "DIR/" of `dirs` taken out.
std::string without_directories(std::string text, const std::vector<std::filesystem::path>& dirs) {
  for (const auto& d : dirs) {
    if (d.empty()) continue;
    const std::string prefix = (d / "").string();
    for (size_t at; (at = text.find(prefix)) != std::string::npos;) text.erase(at, prefix.size());
  }
  return text;
}

// The chat template as the server's renderer (--chat-template, the model's, or chatml for a model
// without one: ChatPrompt warns), and the output format it implies (or --tool-call-format's). None
// (a warning) when the model's tokenizer configuration cannot be read and no --chat-template was
// given; a broken template stops the start.
void set_chat_renderer(const std::filesystem::path& dir, const ServeArgs& a, server::ServerConfig& http) {
  std::shared_ptr<ChatPrompt> prompt;
  try {
    prompt = std::make_shared<ChatPrompt>(ChatPrompt::load(dir, a.chat));
  } catch (const chat::TemplateError&) {
    throw;
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    if (!a.chat.template_file.empty()) throw;
    std::fprintf(stderr, "warning: %s: /v1/chat/completions answers 400 until the server is started with one\n", e.what());
    return;
  }
  http.output_format = detect_output_format(prompt->source(), a.tool_call_format);
  http.reasoning = a.reasoning_format != "none";
  std::fprintf(stderr, "chat template: %s (tool calls: %s%s)\n", prompt->origin().c_str(),
               tool_call_format_name(http.output_format.tools),
               http.output_format.reasoning && http.reasoning ? ", reasoning in <think>" : "");
  http.render_chat = [prompt, dir](const server::json& messages, const server::json& tools, const server::json& kwargs) {
    try {
      return prompt->render(messages, /*add_generation_prompt=*/true, tools, kwargs);
    } catch (const Error& e) {
      // A client sees the template's file name and line, not where the server keeps it.
      throw Error(without_directories(e.what(), {std::filesystem::path(prompt->origin()).parent_path(), dir}));
    }
  };
}

// Loopback addresses, where a server without --api-key is reachable from this machine only.
bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// SIGTERM and SIGINT are blocked in every thread (the mask is inherited) and taken by one waiting
// thread, which stops the server; run() then returns on the main thread.
class SignalStop {
 public:
  SignalStop() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not the end of the process
  }
  void watch(server::HttpServer& srv) {
    thread_ = std::thread([this, &srv] {
      int sig = 0;
      sigwait(&set_, &sig);
      if (!done_) std::fprintf(stderr, "%s: finishing the requests in flight, then exiting\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      srv.shutdown();
    });
  }
  // After run() returned: wakes the waiting thread if no signal came, and joins it.
  void finish() {
    done_ = true;
    if (thread_.joinable()) {
      pthread_kill(thread_.native_handle(), SIGTERM);
      thread_.join();
    }
  }

 private:
  sigset_t set_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

int run_serve(ServeArgs& a) {
  if (a.runtime.no_cache) throw UsageError("--no-cache: the server batches sequences over a shared KV cache; it needs one");
  if (!a.prompt_cache_dir.empty() && !a.store.url.empty())
    throw UsageError("--prompt-cache-dir and --kv-store: give one of them (the server looks up one block store: a "
                     "directory for restarts of one server, or Redis for replicas)");
  if (!is_loopback(a.http.host) && a.http.api_key.empty())
    std::fprintf(stderr, "warning: --host %s without --api-key: anyone who can reach this address can use the server\n",
                 a.http.host.c_str());
  if (a.api_key_given && a.http.api_key.empty())
    throw UsageError("--api-key: the key is empty, which would serve without authentication; give a key, or leave "
                     "out --api-key");
  const SpecOptions spec = spec_options(a.spec);
  if (a.spec_suffix_cache >= 0 && spec.type != SpecType::Suffix)
    throw UsageError("--spec-suffix-cache: the shared reply counts are the suffix drafter's; give --spec-type suffix");
  if (a.no_spec_draft_batch && spec.type != SpecType::Draft)
    throw UsageError("--no-spec-draft-batch: only a draft model's drafting is batched; give --model-draft");
  SignalStop signals;  // before any thread exists
  const std::filesystem::path dir = a.model_dir.empty() ? default_model_dir() : std::filesystem::path(a.model_dir);
  Runtime rt({dir, resolve_threads(a.runtime), true});
  // -c is the context of all the sequences together, as llama-server's: each gets an equal share.
  const int ctx_total = a.runtime.ctx_size;
  if (ctx_total > 0) {
    a.runtime.ctx_size = ctx_total / a.parallel;
    if (a.runtime.ctx_size < 2)
      throw UsageError("--ctx-size " + std::to_string(ctx_total) + " is too small for --parallel " +
                       std::to_string(a.parallel) + ": each sequence needs at least 2 tokens");
  }
  SchedulerConfig sc;
  sc.session = make_session_options(a.runtime, rt.config());
  sc.parallel = a.parallel;
  sc.kv_budget_bytes = size_t(a.kv_budget_mb) << 20;
  sc.pin_bytes = size_t(a.kv_pin_mb) << 20;
  sc.prefill_chunk = a.prefill_chunk;
  sc.eos_ids = stop_token_ids(dir, rt.config(), rt.tokenizer());
  sc.spec = spec;
  if (a.spec_suffix_cache >= 0) sc.spec_suffix_cache = size_t(a.spec_suffix_cache);
  sc.spec_draft_batch = !a.no_spec_draft_batch;
  const auto draft = load_draft_model(a.spec, sc.spec, rt.tokenizer(), dir.string(), rt.pool(), sc.session.kv.ctx_size);
  std::unique_ptr<KVStore> store;
  if (!a.prompt_cache_dir.empty()) {
    store::DirStoreOptions o;
    o.dir = a.prompt_cache_dir;
    o.max_bytes = uint64_t(a.prompt_cache_max_mb * 1024 * 1024);
    o.queue_bytes = size_t(a.store_queue_mb) << 20;
    store = store::open_dir_store(o);
    sc.store = store.get();
    sc.store_identity = prompt_cache_identity(rt.model(), rt.tokenizer(), sc.session.kv).config_key;
    sc.store_prefix = a.store_prefix;
    sc.store_flag = "--prompt-cache-dir";
  } else if (!a.store.url.empty()) {
    a.store.max_bytes = uint64_t(a.store_max_mb) << 20;
    a.store.queue_bytes = size_t(a.store_queue_mb) << 20;
    store = store::open_redis_store(a.store);
    sc.store = store.get();
    sc.store_identity = prompt_cache_identity(rt.model(), rt.tokenizer(), sc.session.kv).config_key;
    sc.store_prefix = a.store_prefix;
  }
  a.http.context_overflow = a.context_overflow == "shift"    ? server::ContextOverflow::Shift
                            : a.context_overflow == "stream" ? server::ContextOverflow::Stream
                                                             : server::ContextOverflow::Error;
  if (a.keep >= 0 && a.http.context_overflow != server::ContextOverflow::Stream)
    throw UsageError("--keep: the tokens kept when a prompt overflows the context, with --context-overflow stream "
                     "(here --context-overflow " + a.context_overflow + ")");
  if (a.keep >= 0) a.http.keep = a.keep;
  if (const std::string e = cache_reuse_error(a.cache_reuse, sc.session.kv, "--cache-reuse"); !e.empty())
    throw UsageError(e);
  a.http.defaults.cache_reuse = a.cache_reuse;
  set_chat_renderer(dir, a, a.http);
  // The directory's name, or a .gguf file's without the extension.
  a.http.model_name = !a.alias.empty() ? a.alias : rt.model().gguf() ? dir.stem().string() : dir.filename().string();
  a.http.max_body_bytes = size_t(a.max_body_mb) << 20;
  Scheduler scheduler(rt, sc);
  server::HttpServer srv(rt, scheduler, a.http);
  const int port = srv.bind();
  std::fprintf(stderr, "model: %s (%s, %s), %d threads, %d parallel sequences of %d tokens, KV pool %s (%s)\n",
               dir.string().c_str(), rt.config().arch_name.c_str(), weights_text(rt.model()).c_str(), rt.pool().size(),
               a.parallel, sc.session.kv.ctx_size,
               format_bytes(scheduler.pool().dense().capacity() * scheduler.pool().dense().block_bytes() +
                            scheduler.pool().quant().capacity() * scheduler.pool().quant().block_bytes())
                   .c_str(),
               sc.session.kv.describe().c_str());
  if (sc.spec.type != SpecType::None)
    std::fprintf(stderr, "speculation: %s, up to %d drafts a sequence%s\n", spec_type_name(sc.spec.type),
                 sc.spec.draft_max, sc.spec.adaptive ? " where the measured step times say they pay" : " (fixed)");
  if (store && !a.prompt_cache_dir.empty())
    std::fprintf(stderr, "prompt cache: %s, at most %s\n", store->describe().c_str(),
                 format_bytes(uint64_t(a.prompt_cache_max_mb * 1024 * 1024)).c_str());
  else if (store)
    std::fprintf(stderr, "kv store: %s, keys %s:%s:*%s\n", store->describe().c_str(), a.store_prefix.c_str(),
                 to_hex(std::span<const uint8_t>(sc.store_identity.data(), 16)).c_str(),
                 a.store.ttl_s > 0 ? (", expiring after " + std::to_string(a.store.ttl_s) + " s").c_str() : "");
  if (server::webui::assets().empty())  // / is a 404 as with --no-webui
    std::fprintf(stderr, "chat page: not in this build (configured with -DPTLLM_WEBUI=OFF)\n");
  else if (a.http.webui)
    std::fprintf(stderr, "chat page: http://%s:%d/ (--no-webui turns it off)\n", a.http.host.c_str(), port);
  std::fprintf(stderr, "listening on http://%s:%d\n", a.http.host.c_str(), port);
  std::fflush(stderr);
  signals.watch(srv);
  srv.run();
  signals.finish();
  scheduler.stop();
  // The blocks still queued are written before the exit (a directory's files are quick to write).
  if (store && !store->flush(a.prompt_cache_dir.empty() ? std::chrono::seconds(5) : std::chrono::seconds(60)))
    std::fprintf(stderr, "warning: kv store: writes still queued at exit were dropped\n");
  std::fprintf(stderr, "stopped\n");
  return 0;
}

}  // namespace

Command add_serve_command(CLI::App& root) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* app = root.add_subcommand("serve", "An OpenAI-compatible HTTP server with continuous batching");
  add_model_option(*app, a->model_dir, "Hugging Face model directory or .gguf file (default: the shipped models/kjv-tiny)");
  app->add_option("--host", a->http.host, "Address to listen on (loopback by default; 0.0.0.0 exposes it)");
  app->add_option("--port", a->http.port, "Port to listen on (0 = any free port, printed at start)")
      ->check(integer_between(0, 65535));
  app->add_option("--parallel", a->parallel, "Sequences decoding together (llama-server's -np); more requests wait")
      ->check(integer_between(1, 255));
  app->add_option("--api-key", a->http.api_key, "Require Authorization: Bearer KEY on every endpoint but /health")
      ->each([a](const std::string&) { a->api_key_given = true; });
  app->add_option("--kv-budget-mb", a->kv_budget_mb,
                  "MiB of KV blocks shared by all sequences (0 = room for every sequence's full context)")
      ->check(integer_between(0, 1 << 20));
  app->add_option("--kv-pin-mb", a->kv_pin_mb,
                  "MiB of KV blocks kept pinned for chat system prompts and tool definitions, so that other "
                  "traffic never evicts them (0 = none; pins give way before a request waits)")
      ->check(integer_between(0, 1 << 20));
  add_spec_options(*app, a->spec);
  app->add_option("--spec-suffix-cache", a->spec_suffix_cache,
                  "suffix drafter: the most tokens of recent replies whose counts every request drafts from "
                  "(0 = each request drafts from its own history alone)")
      ->check(integer_between(0, 1 << 24))
      ->default_str("16384");
  app->add_flag("--no-spec-draft-batch", a->no_spec_draft_batch,
                "Run the draft model for one sequence after another instead of one batched pass per draft "
                "position for all of them (for comparison)");
  app->add_option("--cache-reuse", a->cache_reuse,
                  "Past the prefix reused exactly, take runs of at least N tokens of an earlier history that "
                  "reappear later in the prompt by shifting their positions instead of recomputing them (an "
                  "approximation; 0 = exact reuse only; N at least the KV block size; a request's n_cache_reuse "
                  "overrides it)")
      ->check(integer_between(0, 1 << 30));
  app->add_option("--prefill-chunk", a->prefill_chunk,
                  "Most prompt tokens one step prefills beside the others' decode tokens")
      ->check(integer_between(1, 1 << 16));
  app->add_option("--alias,-a", a->alias,
                  "The model id /v1/models lists and responses carry (default: the model directory's name)");
  app->add_flag("--strict-model-name", a->http.strict_model_name,
                "Answer 404 to a request whose \"model\" is not the served id (by default any name is served)");
  app->add_option("--cors-origin", a->http.cors_origin,
                  "Let pages of ORIGIN (https://host:port, or * for any) call the server from a browser "
                  "(default: none)");
  app->add_flag("--no-webui{false}", a->http.webui, "Do not serve the chat page at / (then / is a 404)");
  app->add_option("--timeout", a->http.timeout_s, "Read and write timeout of a connection, seconds")
      ->check(integer_between(1, 86400));
  app->add_option("--max-body-mb", a->max_body_mb, "Largest request body, MiB (larger: 413)")
      ->check(integer_between(1, 1024));
  app->add_option("--threads-http", a->http.http_threads, "Connections served at once (0 = 2 x --parallel + 4)")
      ->check(integer_between(0, 4096));
  app->add_option("--max-connections", a->http.max_connections,
                  "Connections open at once, waiting ones included; more get 503 (0 = 4 x --threads-http)")
      ->check(integer_between(0, 1 << 20));
  app->add_option("--kv-store", a->store.url,
                  "Share full prefix blocks with other replicas through Redis: redis://[:PASSWORD@]HOST[:PORT][/DB]");
  app->add_option("--kv-store-prefix", a->store_prefix, "First part of every key in the store")
      ->check([](const std::string& v) -> std::string {
        if (v.empty() || v.size() > 64) return "must be 1 to 64 characters";
        for (char c : v)
          if (c <= ' ' || c == ':' || c > '~') return "must be printable ASCII without spaces or ':'";
        return "";
      });
  app->add_option("--kv-store-ttl", a->store.ttl_s, "Seconds a block stays in the store after it was written (0 = no expiry)")
      ->check(integer_between(0, 1 << 30));
  app->add_option("--kv-store-max-mb", a->store_max_mb,
                  "Skip writes while Redis uses at least this many MiB (0 = no check; or give Redis maxmemory + allkeys-lru)")
      ->check(integer_between(0, 1 << 30));
  app->add_option("--kv-store-timeout-ms", a->store.timeout_ms, "Connect and read/write timeout of the store")
      ->check(integer_between(1, 60000));
  app->add_option("--kv-store-queue-mb", a->store_queue_mb, "Most MiB of blocks waiting to be written (more are dropped)")
      ->check(integer_between(1, 1 << 16));
  CLI::Option* dir = app->add_option("--prompt-cache-dir", a->prompt_cache_dir,
                                     "Keep every full prefix block in DIR/blocks, so that prefixes survive a restart");
  app->add_option("--prompt-cache-max-mb", a->prompt_cache_max_mb,
                  "Keep DIR/blocks under N MiB, removing least recently used blocks (default 1024)")
      ->check(number_at_least(0, /*exclusive=*/true))
      ->check(number_between(0, 1 << 30))  // MiB: a byte count that fits 64 bits
      ->needs(dir);
  app->add_option("--context-overflow", a->context_overflow,
                  "A prompt longer than the context: error (400 context_length_exceeded), shift (drop the oldest "
                  "chat turns whole, keeping the system prompt and tools), stream (keep the system prompt, or the "
                  "first --keep tokens, and the most recent tokens)")
      ->check(CLI::IsMember({"error", "shift", "stream"}))
      ->capture_default_str();
  app->add_option("--keep", a->keep,
                  "--context-overflow stream: tokens of a completion prompt always kept (a chat keeps its system "
                  "prompt and tools)")
      ->check(integer_between(0, 1 << 30));
  add_chat_prompt_options(*app, a->chat);
  app->add_option("--tool-call-format", a->tool_call_format,
                  "How tool calls are read from replies: auto (from the chat template), hermes, llama3, mistral, "
                  "qwen3-coder, none")
      ->check(CLI::IsMember({"auto", "hermes", "llama3", "mistral", "qwen3-coder", "none"}))
      ->capture_default_str();
  app->add_option("--reasoning-format", a->reasoning_format,
                  "deepseek: <think>...</think> goes to reasoning_content (auto is the same); none: left in content")
      ->check(CLI::IsMember({"none", "deepseek", "auto"}))
      ->capture_default_str();
  add_runtime_options(*app, a->runtime);
  app->get_option("--ctx-size")
      ->description("Context of all the sequences together, as llama-server's -c: each of the --parallel sequences "
                    "gets an equal share (default: min(max_position_embeddings, 4096) for each)");
  // Defaults of the requests that leave these fields out.
  add_sampling_options(*app, a->http.defaults.sampling);
  app->add_option("--tokens,-n", a->http.defaults.max_tokens,
                  "Default max_tokens (-1 = chat until the context is full, completions 16)")
      ->check(CLI::Validator([](std::string& v) { return v == "-1" ? std::string() : integer_between(1, 1 << 30)(v); }, ""));
  return {app, [a] { return run_serve(*a); }};
}

}  // namespace ptllm::cli
