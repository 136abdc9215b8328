#include "cli/options.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "build_info.h"
#include "core/error.h"
#include "core/platform.h"
#include "core/thread_pool.h"
#include "kernels/panels.h"
#include "kernels/simd.h"

namespace ptllm::cli {

namespace {

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

struct IntParse {
  std::string error;  // "'abc' is not a number"; empty when it parsed
  long long value = 0;
  int overflow = 0;  // -1 below, +1 above the range of long long
};

IntParse parse_integer(const std::string& s) {
  IntParse p;
  std::string_view t = s;
  if (!t.empty() && t.front() == '+') t.remove_prefix(1);
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), p.value);
  if (ec == std::errc::result_out_of_range) {
    p.overflow = t.starts_with('-') ? -1 : 1;
  } else if (ec != std::errc() || end != t.data() + t.size()) {
    char* stop = nullptr;
    const double d = std::strtod(s.c_str(), &stop);
    const bool number = !s.empty() && stop == s.c_str() + s.size() && std::isfinite(d);
    p.error = in_quotes(s) + (number ? " is not a whole number" : " is not a number");
  }
  return p;
}

std::string check_real(const std::string& s, double lo, double hi, bool lo_exclusive, const std::string& range) {
  char* stop = nullptr;
  const double d = std::strtod(s.c_str(), &stop);
  if (s.empty() || stop != s.c_str() + s.size() || !std::isfinite(d)) return in_quotes(s) + " is not a number";
  if (d < lo || (lo_exclusive && d == lo) || d > hi) return range + " (got " + s + ")";
  return "";
}

}  // namespace

CLI::Validator integer_at_least(long long lo, long long hi) {
  return CLI::Validator(
      [=](std::string& s) {
        const IntParse p = parse_integer(s);
        if (!p.error.empty()) return p.error;
        if (p.overflow < 0 || (p.overflow == 0 && p.value < lo))
          return "must be at least " + std::to_string(lo) + " (got " + s + ")";
        if (p.overflow > 0 || p.value > hi) return "must be at most " + std::to_string(hi) + " (got " + s + ")";
        return std::string();
      },
      "");
}

CLI::Validator integer_between(long long lo, long long hi) {
  const std::string range = "must be between " + std::to_string(lo) + " and " + std::to_string(hi);
  return CLI::Validator(
      [=](std::string& s) {
        const IntParse p = parse_integer(s);
        if (!p.error.empty()) return p.error;
        if (p.overflow != 0 || p.value < lo || p.value > hi) return range + " (got " + s + ")";
        return std::string();
      },
      "");
}

CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& s) {
        uint64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec == std::errc() && end == s.data() + s.size()) return std::string();
        if (ec == std::errc::result_out_of_range) return "must be at most 18446744073709551615 (got " + s + ")";
        const IntParse p = parse_integer(s);
        return p.error.empty() ? "must be at least 0 (got " + s + ")" : p.error;
      },
      "");
}

CLI::Validator number_at_least(double lo, bool exclusive) {
  const std::string range = (exclusive ? "must be greater than " : "must be at least ") + format_number(lo);
  return CLI::Validator([=](std::string& s) { return check_real(s, lo, HUGE_VAL, exclusive, range); },
                        "");
}

CLI::Validator number_between(double lo, double hi) {
  const std::string range = "must be between " + format_number(lo) + " and " + format_number(hi);
  return CLI::Validator([=](std::string& s) { return check_real(s, lo, hi, false, range); },
                        "");
}

CLI::Validator thread_count() { return integer_between(0, kMaxThreads); }

namespace {

// llama.cpp's --cache-type-k/-v names, and ours, to our KV precision names ("" = not one of them).
std::string kv_type_name(const std::string& t) {
  if (t == "f32" || t == "fp32") return "fp32";
  if (t == "f16" || t == "fp16") return "fp16";
  if (t == "bf16" || t == "int8" || t == "int4" || t == "int2") return t;
  return "";
}

CLI::Validator kv_type_validator() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (!kv_type_name(s).empty()) return "";
        if (s.starts_with("q") || s.starts_with("iq"))
          return in_quotes(s) + ": llama.cpp's block quantization of the KV cache is not implemented here; the KIVI "
                             "types int8, int4 and int2 are (docs/kv-cache.md)";
        return in_quotes(s) + " is not a KV type (f32, f16, bf16, int8, int4, int2)";
      },
      "");
}

// The precision the flags ask for: --kv-quantize, or llama.cpp's -ctk/-ctv. This cache stores K and V
// at one precision, so -ctk and -ctv must agree when both are given (and with --kv-quantize).
std::string resolve_kv_type(const RuntimeOptions& o) {
  const std::string k = kv_type_name(o.cache_type_k), v = kv_type_name(o.cache_type_v);
  if (!k.empty() && !v.empty() && k != v)
    throw UsageError("-ctk " + o.cache_type_k + " and -ctv " + o.cache_type_v +
                     " differ: this KV cache stores K and V at one precision; give both the same type (or "
                     "one of them, or --kv-quantize)");
  const std::string kv = k.empty() ? v : k;
  if (kv.empty()) return o.kv_quantize;
  const std::string& typed = k.empty() ? o.cache_type_v : o.cache_type_k;
  if (o.kv_quantize_given && o.kv_quantize != kv)
    throw UsageError(std::string(k.empty() ? "-ctv " : "-ctk ") + typed + " and --kv-quantize " + o.kv_quantize +
                     " disagree: give one of them");
  return kv;
}

}  // namespace

void add_runtime_options(CLI::App& app, RuntimeOptions& o) {
  app.add_option("--threads,-t", o.threads, "Threads for the heavy kernels (0 = all cores)")->check(thread_count());
  app.add_option("--ctx-size,-c", o.ctx_size,
                 "KV-cache capacity in tokens")
      ->check(integer_at_least(1))
      ->default_str("min(max_position_embeddings, 4096)");
  auto* pre = app.add_flag("--kv-preallocate", o.preallocate, "Reserve the whole KV capacity at start (default)");
  app.add_flag("--no-kv-preallocate{false}", o.preallocate, "Take KV blocks as the context grows")->excludes(pre);
  app.add_flag("--no-cache", o.no_cache, "Recompute the whole sequence every step (the reference path)");
  app.add_option("--kv-quantize", o.kv_quantize, "KV storage: fp32, fp16, bf16, or KIVI int8, int4, int2")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16", "int8", "int4", "int2"}))
      ->each([&o](const std::string&) { o.kv_quantize_given = true; });
  app.add_option("--cache-type-k", o.cache_type_k,
                 "llama.cpp's -ctk: K precision (f32, f16, bf16, int8, int4, int2); K and V share one precision "
                 "here, so -ctk and -ctv must agree")
      ->check(kv_type_validator());
  app.add_option("--cache-type-v", o.cache_type_v, "llama.cpp's -ctv: V precision (as -ctk)")
      ->check(kv_type_validator());
  app.add_option("--kv-group-size", o.group_size, "Tokens per KV block and KIVI group")
      ->check(integer_between(1, 4096));
  app.add_option("--kv-residual", o.residual,
                 "KIVI: recent tokens kept full precision, a multiple of the group size")
      ->check(integer_at_least(0));
  app.add_option("--streaming-llm-sink", o.sink, "StreamingLLM: first tokens kept forever")
      ->check(integer_at_least(0));
  app.add_option("--streaming-llm-window", o.window, "StreamingLLM: recent tokens kept beyond the sinks (-1 = off)")
      ->check(CLI::Validator(
          [](std::string& s) { return s == "-1" ? std::string() : integer_at_least(1)(s); }, ""));
  app.add_option("--streaming-positions", o.positions,
                 "RoPE under StreamingLLM: cache (K rotated by its cache slot; the default with a window) or "
                 "absolute (K rotated at its absolute position; the default without)")
      ->check(CLI::IsMember({"absolute", "cache"}));
  app.add_flag("--bf16-activations", o.bf16_activations,
               "Round activations to bf16 in products with BF16 weights, as llama.cpp does (the default for GGUF "
               "files): about 2x faster prefill and batched decode on CPUs with AVX512_BF16; logits no longer match "
               "a float32 run within 1e-3. Only BF16 weights in panels (AVX-512 and AVX2 CPUs) are affected: not "
               "quantized weights, nor other CPUs, nor PTLLM_NO_PANELS=1");
  app.add_flag("--no-bf16-activations", o.no_bf16_activations,
               "Keep activations float32 in products with BF16 weights, also for a GGUF file");
}

SessionOptions make_session_options(const RuntimeOptions& o, const ModelConfig& cfg) {
  SessionOptions s;
  // The kernels' mode is the process's: set before the first product (PTLLM_PANELS_BF16_X=1 does the same).
  // A GGUF file is computed as llama.cpp computes it, x rounded to bf16 for BF16 weights; a safetensors
  // checkpoint in float32 (transformers' goldens), unless a flag says otherwise.
  if (o.bf16_activations && o.no_bf16_activations)
    throw UsageError("--bf16-activations and --no-bf16-activations contradict each other: give one");
  if (o.no_bf16_activations) {
    set_panels_bf16_x(false);
  } else if (o.bf16_activations || cfg.gguf) {
    if (panels_wanted())
      set_panels_bf16_x(true);
    else if (o.bf16_activations)
      std::fprintf(stderr,
                   "warning: --bf16-activations has no effect here: activations are rounded to bf16 only in the "
                   "panel products of BF16 weights (this CPU has neither AVX-512 nor AVX2, or PTLLM_NO_PANELS=1)\n");
  }
  // Positions past max_position_embeddings are outside what the model was trained for: said, not
  // refused (as llama.cpp; measuring attention past the trained length is a use). The capacity is
  // bounded by memory only (the pools refuse what the machine cannot hold, with the sizes).
  if (o.ctx_size > cfg.max_position_embeddings)
    std::fprintf(stderr,
                 "warning: a context of %d tokens a sequence (--ctx-size) is more than the model's "
                 "max_position_embeddings (%d, config.json): positions past %d are outside what the model was "
                 "trained for\n",
                 o.ctx_size, cfg.max_position_embeddings, cfg.max_position_embeddings);
  s.kv.ctx_size = o.ctx_size > 0 ? o.ctx_size : default_ctx_size(cfg);
  s.kv.preallocate = o.preallocate;
  s.kv.precision = *parse_kv_precision(resolve_kv_type(o));
  s.kv.group_size = o.group_size;
  s.kv.residual = o.residual;
  s.kv.sink = o.sink;
  s.kv.window = std::max(0, o.window);
  s.kv.positions = o.positions.empty()     ? default_positions(s.kv)
                   : o.positions == "cache" ? PositionMode::Cache
                                            : PositionMode::Absolute;
  s.use_cache = !o.no_cache;
  s.kv.validate();
  // As --ctx-size, the StreamingLLM span (sinks and window), which sizes the cache's rings and the
  // RoPE tables of cache positions: checked before the cache is made.
  if (o.window > 0 && int64_t(o.sink) + o.window > cfg.max_position_embeddings)
    throw UsageError("--streaming-llm-sink " + std::to_string(o.sink) + " + --streaming-llm-window " +
                     std::to_string(o.window) + " is more than the model's max_position_embeddings (" +
                     std::to_string(cfg.max_position_embeddings) + ", config.json)");
  return s;
}

void add_sampling_options(CLI::App& app, SamplingConfig& s) {
  app.add_option("--temperature,--temp", s.temperature, "Sampling temperature (0 = greedy)")->check(number_at_least(0));
  app.add_option("--top-k", s.top_k, "Keep the K most likely tokens (0 = off)")->check(integer_at_least(0));
  app.add_option("--top-p", s.top_p, "Nucleus sampling threshold (1 = off)")->check(number_between(0, 1));
  app.add_option("--min-p", s.min_p, "Drop tokens below P times the top probability (0 = off)")
      ->check(number_between(0, 1));
  app.add_option("--repeat-penalty", s.repeat_penalty, "Penalty for recent tokens (1 = off)")
      ->check(number_at_least(0, /*exclusive=*/true));
  app.add_option("--repeat-last-n", s.repeat_last_n, "Tokens the penalties look back over (-1 = all)")
      ->check(integer_between(-1, 1 << 30));
  app.add_option("--presence-penalty", s.presence_penalty,
                 "Subtracted once from the logit of every token among the recent ones (0 = off)")
      ->check(number_between(-2, 2));
  app.add_option("--frequency-penalty", s.frequency_penalty,
                 "Subtracted from a recent token's logit per time it occurs (0 = off)")
      ->check(number_between(-2, 2));
}

int resolve_threads(const RuntimeOptions& o) { return o.threads > 0 ? o.threads : ThreadPool::default_threads(); }

void add_model_option(CLI::App& app, std::string& dir, const std::string& description) {
  CLI::Option* pos = app.add_option("model_dir", dir, description);
  CLI::Option* flag = app.add_option("--model,-m", dir, "The model directory or .gguf file (instead of the positional MODEL)");
  pos->excludes(flag);
}

namespace {

// llama.cpp's multi-letter single-dash flags. CLI11 reads a single dash as short options, so -cnv
// would be -c nv; each is mapped to this runtime's long option when the command has it, and refused
// with the reason otherwise.
struct HabitFlag {
  std::string_view flag;       // as llama.cpp spells it (single dash, or its long form)
  std::string_view long_name;  // this runtime's option ("" = none)
  std::string_view refusal;    // when the command has no such option: why, and what to use instead
};

constexpr std::string_view kGpu = "GPU offload is not supported (this runtime runs on the CPU)";
constexpr std::string_view kChat = "conversation mode is a command of its own: use `posttrainllm chat`";
constexpr std::string_view kOneSeq = "this command runs one sequence: parallel sequences are `posttrainllm serve --parallel N`";
constexpr std::string_view kDownload =
    "downloading models is not supported: pass a local Hugging Face model directory (-m DIR)";
constexpr std::string_view kDraft = "speculative decoding runs in sample, chat, serve and bench (--spec-type ngram)";
constexpr std::string_view kGrammar =
    "grammars and JSON schemas constrain `sample` and `chat` (serve takes them per request: the grammar, json_schema "
    "and response_format fields)";
constexpr std::string_view kLora =
    "LoRA adapters are not supported: merge the adapter into the weights first (peft's merge_and_unload) and "
    "pass the merged model";

constexpr HabitFlag kHabitFlags[] = {
    {"-ctk", "--cache-type-k", "this command has no KV cache"},
    {"-ctv", "--cache-type-v", "this command has no KV cache"},
    {"-sys", "--system", "a system prompt goes through a chat template: use `posttrainllm chat --system TEXT`"},
    {"--system-prompt", "--system", "a system prompt goes through a chat template: use `posttrainllm chat --system TEXT`"},
    {"-cnv", "", kChat},
    {"--conversation", "", kChat},
    {"-st", "", kChat},
    {"--single-turn", "", kChat},
    {"-if", "", kChat},
    {"--interactive-first", "", kChat},
    {"--interactive", "", kChat},
    {"-mli", "", kChat},
    {"--multiline-input", "", kChat},
    {"--log-disable", "--quiet", "this command has no --quiet: its status lines go to stderr (2>/dev/null)"},
    {"-ngl", "", kGpu},
    {"--n-gpu-layers", "", kGpu},
    {"--gpu-layers", "", kGpu},
    {"-ngld", "", kGpu},
    {"-mg", "", kGpu},
    {"-ts", "", kGpu},
    {"-sm", "", kGpu},
    {"-dev", "", kGpu},
    {"-nkvo", "", "the KV cache always lives in CPU memory"},
    {"-fa", "", "flash attention is not a switch here: attention always reads the block KV cache in place (docs/kv-cache.md)"},
    {"--flash-attn", "", "flash attention is not a switch here: attention always reads the block KV cache in place (docs/kv-cache.md)"},
    {"-np", "--parallel", kOneSeq},
    {"--parallel", "", kOneSeq},
    {"-cb", "", "continuous batching is how `posttrainllm serve` always runs; other commands run one sequence"},
    {"-tb", "", "one thread count serves prefill and decode: use --threads (-t)"},
    {"-ub", "", "the prompt is prefilled in one batch; there is no batch size to set"},
    {"-md", "--model-draft", kDraft},
    {"--model-draft", "", kDraft},
    {"--draft", "--spec-draft-max", kDraft},
    {"--draft-max", "--spec-draft-max", kDraft},
    {"--draft-n", "--spec-draft-max", kDraft},
    {"--draft-min", "--spec-draft-min", kDraft},
    {"--grammar", "", kGrammar},
    {"--grammar-file", "", kGrammar},
    {"--json-schema", "", kGrammar},
    {"-j", "--json-schema", kGrammar},
    {"--json-schema-file", "", kGrammar},
    {"--lora", "", kLora},
    {"--lora-scaled", "", kLora},
    {"--mlock", "", "locking the model in memory is not supported"},
    {"-hf", "", kDownload},
    {"-hfr", "", kDownload},
    {"-mu", "", kDownload},
    {"-dt", "", "the block KV cache needs no defragmentation"},
};

const CLI::App* find_subcommand(const CLI::App& app, const std::string& name) {
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (sub->get_name() == name) return sub;
  return nullptr;
}

std::string command_list(const CLI::App& app, const std::string& prefix) {
  std::string out;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    out += (out.empty() ? "" : ", ") + prefix + sub->get_name();
  return out;
}

// -ngl, -ctk=f16: a single dash and two letters or more before any '='.
bool multi_letter_short(std::string_view name) {
  if (name.size() < 3 || name[0] != '-' || name[1] == '-') return false;
  return std::all_of(name.begin() + 1, name.end(), [](char c) { return std::isalpha((unsigned char)c) || c == '_'; });
}

// One argument of a command (not a command word): rewritten, or refused by a UsageError.
std::string rewrite_arg(const CLI::App& cmd, const std::string& arg) {
  const size_t eq = arg.find('=');
  const std::string name = arg.substr(0, eq), value = eq == std::string::npos ? "" : arg.substr(eq);
  for (const HabitFlag& h : kHabitFlags) {
    if (name != h.flag) continue;
    if (!h.long_name.empty() && cmd.get_option_no_throw(std::string(h.long_name)) != nullptr)
      return std::string(h.long_name) + value;
    if (name.starts_with("--") && cmd.get_option_no_throw(name) != nullptr) return arg;
    throw UsageError(name + ": " + std::string(h.refusal));
  }
  if (multi_letter_short(name))
    throw UsageError(name + ": unknown option (an option of more than one letter takes two dashes: -" + name + ")");
  return arg;
}

}  // namespace

std::vector<std::string> preprocess_args(const CLI::App& root, int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  const CLI::App* cmd = &root;
  std::string words;  // the command words so far: "cache "
  size_t i = 1;
  // The command words: while the command has subcommands, each word must name one.
  for (; i < args.size() && !args[i].starts_with('-'); ++i) {
    if (cmd->get_subcommands([](const CLI::App*) { return true; }).empty()) break;  // a positional argument
    const CLI::App* sub = find_subcommand(*cmd, args[i]);
    if (sub == nullptr)
      throw UsageError("unknown command '" + words + args[i] + "' (the commands: " + command_list(*cmd, words) + ")");
    cmd = sub;
    words += args[i] + " ";
  }
  if (i == args.size() && cmd->get_require_subcommand_min() > 0)
    throw UsageError("give a command: " + command_list(*cmd, words) + " (--help says what each does)");
  for (; i < args.size() && args[i] != "--"; ++i) {
    if (args[i] == "--jinja" && cmd->get_option_no_throw("--jinja") == nullptr) {
      // llama.cpp's switch to Jinja templates: here every template is Jinja, so it changes nothing.
      if (cmd->get_option_no_throw("--chat-template-kwargs") == nullptr)
        throw UsageError("--jinja: this command renders no chat template (chat, serve and template do, always as Jinja)");
      args.erase(args.begin() + std::ptrdiff_t(i--));
      continue;
    }
    if (args[i].starts_with('-')) args[i] = rewrite_arg(*cmd, args[i]);
  }
  return args;
}

std::string version_text() {
#if defined(__clang__)
  const char* compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  const char* compiler = "GCC " __VERSION__;
#else
  const char* compiler = "an unknown compiler";
#endif
  return std::string("posttrainllm ") + PTLLM_VERSION + " (git " + PTLLM_GIT_DESCRIBE + ", " + PTLLM_BUILD_TYPE +
         " build, " + compiler + ", kernels " + kernels_description() +
         " on this CPU)";
}

std::filesystem::path default_model_dir() {
  namespace fs = std::filesystem;
  const fs::path exe = executable_path();
  if (!exe.empty()) {
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
      fs::path cand = dir / "models" / "kjv-tiny";
      if (fs::exists(cand / "config.json")) return cand;
    }
    // Installed (cmake --install): PREFIX/bin/posttrainllm and PREFIX/share/posttrainllm/models.
    const fs::path installed = exe.parent_path().parent_path() / "share" / "posttrainllm" / "models" / "kjv-tiny";
    if (fs::exists(installed / "config.json")) return installed;
  }
  return fs::path(PTLLM_SOURCE_DIR) / "models" / "kjv-tiny";
}

std::string weights_text(const Model& model) {
  return "weights " + model.weight_format() + ", " + format_bytes(model.weight_bytes());
}

std::string format_bytes(size_t bytes) {
  char buf[64];
  if (bytes < 1024)
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else if (bytes < 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(bytes) / 1024);
  else if (bytes < size_t(1024) * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / (1024 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / (1024.0 * 1024 * 1024));
  return buf;
}

std::string kv_layers_line(const KVLayerReport& r) {
  const std::vector<int> stored = r.stored();
  std::string s = "kv layers: " + std::to_string(stored.size()) + " of " + std::to_string(r.source.size()) +
                  " store K/V; logical by layer:";
  for (size_t i = 0; i < stored.size(); ++i)
    s += (i ? ", " : " ") + std::to_string(stored[i]) + " " + format_bytes(r.logical_bytes[size_t(stored[i])]);
  // "layers 5, 6, 7 read layer 4's": one clause per donor.
  std::vector<std::pair<int, std::string>> readers;
  for (int l = 0; l < int(r.source.size()); ++l) {
    const int src = r.source[size_t(l)];
    if (src == l) continue;
    auto it = std::find_if(readers.begin(), readers.end(), [&](const auto& x) { return x.first == src; });
    if (it == readers.end()) readers.emplace_back(src, std::to_string(l));
    else it->second += ", " + std::to_string(l);
  }
  for (const auto& [src, who] : readers) s += "; layers " + who + " read layer " + std::to_string(src) + "'s";
  return s;
}

}  // namespace ptllm::cli
