// posttrainllm eval: what a cache configuration costs in quality (perplexity, KL divergence, top-1
// agreement, greedy prefix match) against the fp32 full cache, measured through the cached path.
// Results go to stdout (a table, or one JSON object with --json); progress and timing to stderr.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "cli/options.h"
#include "engine/runtime.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/thread_pool.h"
#include "engine/eval.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace ptllm::cli {

namespace {

struct EvalArgs {
  std::string model_dir;
  std::string baseline_model_dir;
  std::string text_file;
  std::string configs;
  bool documents = false;
  int max_tokens = 0;
  FeedPlan plan;
  int ppl_chunks = 0;
  int max_chunks = 0;
  std::string greedy_prompts;
  int greedy_tokens = 60;
  bool json = false;
  std::string plot;
  double progress_seconds = 3;
  RuntimeOptions runtime;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string read_text(const std::filesystem::path& p, const char* flag) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) throw Error(p.string() + ": cannot read the file given to " + flag);
  return read_whole_file(p, kMaxTextBytes, std::string("the file given to ") + flag);
}

template <typename... A>
std::string fmt(const char* f, A... a) {
  char buf[128];
  std::snprintf(buf, sizeof buf, f, a...);
  return buf;
}

// Display width of UTF-8 text: one column per character.
size_t columns(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Columns padded to their widest cell: the first left-aligned, the others right-aligned.
std::string format_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      width[c] = std::max(width[c], columns(r[c]));
    }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      const std::string pad(width[c] - columns(r[c]), ' ');
      line += c == 0 ? r[c] + pad : "  " + pad + r[c];
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string bucket_label(const NllBucket& b) { return std::to_string(b.start) + "-" + std::to_string(b.end); }

nlohmann::json buckets_json(const std::vector<NllBucket>& buckets) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& b : buckets)
    out.push_back({{"start", b.start}, {"end", b.end}, {"count", b.count}, {"mean_nll", b.mean_nll}});
  return out;
}

// Greedy prefix match of every prompt: pct[config][prompt].
struct GreedyResult {
  std::vector<std::string> prompts;
  std::vector<std::vector<double>> pct;
};

// The prompts of --greedy-prompts, one per line (read before the work starts: a bad path fails at once).
std::vector<std::string> read_greedy_prompts(const std::string& path) {
  std::vector<std::string> prompts;
  std::istringstream in(read_text(path, "--greedy-prompts"));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) prompts.push_back(line);
  }
  if (prompts.empty()) throw UsageError(path + ": no prompt (one per line) for --greedy-prompts");
  return prompts;
}

// base: the model of the baseline (--baseline-model, or `model`).
GreedyResult run_greedy(const EvalArgs& a, std::vector<std::string> prompts, const Model& model, const Model& base,
                        const Tokenizer& tok, const std::vector<CacheSpec>& specs, ThreadPool& pool) {
  GreedyResult g;
  g.prompts = std::move(prompts);
  g.pct.assign(specs.size(), {});
  for (const auto& prompt : g.prompts) {
    const std::vector<int32_t> ids = tok.encode(prompt, {.add_special = true, .parse_special = false});
    KVCacheConfig full;
    full.ctx_size = 0;  // the prompt and its continuation
    const std::vector<int32_t> want = greedy_tokens(base, full, ids, a.greedy_tokens, pool);
    for (size_t k = 0; k < specs.size(); ++k) {
      try {
        g.pct[k].push_back(prefix_match_pct(want, greedy_tokens(model, specs[k].kv, ids, a.greedy_tokens, pool)));
      } catch (const Error& e) {
        throw Error("configuration '" + specs[k].name + "': " + e.what());
      }
    }
    std::fprintf(stderr, "greedy: %zu/%zu prompts\n", g.pct[0].size(), g.prompts.size());
  }
  return g;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A round tick step (1, 2 or 5 times a power of ten) giving about `ticks` ticks over `span`.
double tick_step(double span, int ticks) {
  const double raw = std::max(span, 1e-9) / ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

// NLL against position for the baseline and every configuration, averaged over bins of a power-of-two
// width (at most 64 bins): per-position NLL is too noisy to read.
void write_plot(const std::string& path, const Evaluator& ev, const std::string& title) {
  const auto& pos = ev.positions();
  const auto [lo, hi] = std::minmax_element(pos.begin(), pos.end());
  int width = 1;
  while ((*hi - *lo + 1) / width > 64) width *= 2;
  struct Series {
    std::string name;
    std::vector<NllBucket> points;
  };
  std::vector<Series> series{{"fp32 full cache (baseline)", nll_bins(pos, ev.baseline_nll(), width)}};
  for (const auto& c : ev.configs()) series.push_back({c.spec.name, nll_bins(pos, c.nll, width)});

  double ymin = INFINITY, ymax = -INFINITY;
  for (const auto& s : series)
    for (const auto& p : s.points) ymin = std::min(ymin, p.mean_nll), ymax = std::max(ymax, p.mean_nll);
  const double ystep = tick_step(ymax - ymin, 6);
  ymin = std::floor(ymin / ystep) * ystep;
  ymax = std::max(std::ceil(ymax / ystep) * ystep, ymin + ystep);
  const double xmin = *lo, xmax = std::max(*hi, *lo + 1);
  const double W = 960, H = 520, L = 70, R = 230, T = 50, B = 60;  // canvas and margins
  auto X = [&](double x) { return L + (x - xmin) / (xmax - xmin) * (W - L - R); };
  auto Y = [&](double y) { return H - B - (y - ymin) / (ymax - ymin) * (H - T - B); };
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                  "#8c564b", "#e377c2", "#17becf", "#bcbd22"};

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W
    << " " << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << L << "\" y=\"24\" font-size=\"14\">" << xml_escape(title) << "</text>\n";
  const double xstep = tick_step(xmax - xmin, 8);
  for (double x = std::ceil(xmin / xstep) * xstep; x <= xmax; x += xstep)
    o << "<line x1=\"" << X(x) << "\" y1=\"" << T << "\" x2=\"" << X(x) << "\" y2=\"" << H - B
      << "\" stroke=\"#e5e5e5\"/><text x=\"" << X(x) << "\" y=\"" << H - B + 16 << "\" text-anchor=\"middle\">" << x
      << "</text>\n";
  for (double y = ymin; y <= ymax + ystep / 2; y += ystep)
    o << "<line x1=\"" << L << "\" y1=\"" << Y(y) << "\" x2=\"" << W - R << "\" y2=\"" << Y(y)
      << "\" stroke=\"#e5e5e5\"/><text x=\"" << L - 6 << "\" y=\"" << Y(y) + 4 << "\" text-anchor=\"end\">"
      << fmt("%g", y) << "</text>\n";
  o << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\"" << H - T - B
    << "\" fill=\"none\" stroke=\"#444\"/>\n"
    << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 18 << "\" text-anchor=\"middle\">position of the "
    << "predicted token (bins of " << width << ")</text>\n"
    << "<text transform=\"translate(18," << (T + H - B) / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << "mean NLL (nats)</text>\n";
  for (size_t s = series.size(); s-- > 0;) {  // the dashed baseline last, on top: visible where a line matches it
    const bool base = s == 0;
    const std::string color = base ? "#777777" : kColors[(s - 1) % std::size(kColors)];
    o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\""
      << (base ? " stroke-dasharray=\"5,3\"" : "") << " points=\"";
    for (const auto& p : series[s].points)
      o << X(std::min(double(p.end), xmax) / 2 + std::max(double(p.start), xmin) / 2) << "," << Y(p.mean_nll) << " ";
    o << "\"/>\n";
    const double ly = T + 10 + 18 * double(s);
    o << "<line x1=\"" << W - R + 12 << "\" y1=\"" << ly << "\" x2=\"" << W - R + 36 << "\" y2=\"" << ly
      << "\" stroke=\"" << color << "\" stroke-width=\"2\"" << (base ? " stroke-dasharray=\"5,3\"" : "")
      << "/><text x=\"" << W - R + 42 << "\" y=\"" << ly + 4 << "\">" << xml_escape(series[s].name) << "</text>\n";
  }
  o << "</svg>\n";
  try {
    write_file_atomically(path, {o.str()});
  } catch (const Error& e) {
    throw Error(path + ": cannot write the plot (--plot): " + e.what());
  }
}

// --plot's path must be writable before the work starts: an existing directory, no directory in its place.
void check_plot_path(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (fs::is_directory(p, ec)) throw Error(path + ": a directory, not a file (--plot)");
  if (!fs::is_directory(dir, ec)) throw Error(path + ": no directory " + dir.string() + " to write the plot in (--plot)");
  if (fs::exists(p, ec) ? ::access(path.c_str(), W_OK) != 0 : ::access(dir.c_str(), W_OK) != 0)
    throw Error(path + ": cannot write the plot there (--plot): permission denied");
}

// One token stream to score: its ids, how it is fed, and the first position scored.
struct Stream {
  std::vector<int32_t> ids;
  FeedPlan plan;
  int first_scored = 0;
};

// The streams of the text: the text itself, its documents, or llama.cpp-style chunks of the whole text.
std::vector<Stream> make_streams(const EvalArgs& a, const std::string& text, const Tokenizer& tok) {
  const EncodeOptions enc{.add_special = true, .parse_special = false};  // the text is data, not markup
  std::vector<std::string> docs;
  if (a.documents) {
    docs = split_documents(text);
    if (docs.empty()) throw UsageError(a.text_file + ": no document (--documents splits on lines holding \\x1e)");
  }
  std::vector<Stream> streams;
  if (a.ppl_chunks > 0) {
    std::string joined;
    for (const auto& d : docs) joined += d;
    const std::vector<int32_t> ids = tok.encode(a.documents ? joined : text, enc);
    size_t n_chunks = ids.size() / size_t(a.ppl_chunks);
    if (n_chunks == 0)
      throw UsageError(a.text_file + ": " + std::to_string(ids.size()) + " tokens, fewer than one chunk of " +
                       std::to_string(a.ppl_chunks) + " (--ppl-chunks)");
    if (a.max_chunks > 0) n_chunks = std::min(n_chunks, size_t(a.max_chunks));
    // As llama.cpp's perplexity: every chunk starts with BOS (replacing its first token), is prefilled
    // whole, and only its second half is scored, so each prediction has at least N/2 tokens of context.
    const FeedPlan whole{.prefill = a.ppl_chunks, .chunk = 1};
    for (size_t c = 0; c < n_chunks; ++c) {
      std::vector<int32_t> chunk(ids.begin() + std::ptrdiff_t(c * size_t(a.ppl_chunks)),
                                 ids.begin() + std::ptrdiff_t((c + 1) * size_t(a.ppl_chunks)));
      if (tok.bos_id()) chunk[0] = *tok.bos_id();
      streams.push_back({std::move(chunk), whole, a.ppl_chunks / 2});
    }
    return streams;
  }
  const size_t count = a.documents ? docs.size() : 1;
  size_t scored = 0;  // n tokens make n - 1 predictions
  for (size_t d = 0; d < count; ++d) {
    if (a.max_tokens > 0 && scored >= size_t(a.max_tokens)) break;
    std::vector<int32_t> ids = tok.encode(a.documents ? docs[d] : text, enc);
    if (a.max_tokens > 0) ids.resize(std::min(ids.size(), size_t(a.max_tokens) - scored + 1));
    if (ids.size() < 2) continue;
    scored += ids.size() - 1;
    streams.push_back({std::move(ids), a.plan, 0});
  }
  return streams;
}

// PPL's standard error as llama-perplexity reports it: PPL * sd(nll) / sqrt(n - 1), the error of the
// mean NLL carried through exp (0 with fewer than two predictions).
double ppl_error(std::span<const double> nll) {
  const size_t n = nll.size();
  if (n < 2) return 0;
  double sum = 0, sq = 0;
  for (double v : nll) sum += v, sq += v * v;
  const double m = sum / double(n), var = sq / double(n) - m * m;
  return var > 0 ? std::exp(m) * std::sqrt(var / double(n - 1)) : 0;
}

// A line on stderr every few seconds while the streams are scored (as llama-perplexity prints per
// chunk): tokens fed, the baseline's running PPL, and the time left at the rate so far.
class Progress {
 public:
  Progress(const Evaluator& ev, size_t total, double every_s) : ev_(ev), total_(total), every_s_(every_s) {}
  void step(int tokens) {
    done_ += size_t(tokens);
    if (seconds_since(last_) < every_s_ || done_ == total_) return;
    last_ = Clock::now();
    const double elapsed = seconds_since(start_), eta = elapsed * double(total_ - done_) / double(done_);
    std::fprintf(stderr, "eval: %zu/%zu tokens (%.0f%%), PPL %.4f so far, %.1f s, ETA %.0f s\n", done_, total_,
                 100.0 * double(done_) / double(total_), std::exp(mean(ev_.baseline_nll())), elapsed, eta);
  }
  size_t done() const { return done_; }

 private:
  const Evaluator& ev_;
  size_t total_;
  double every_s_;
  size_t done_ = 0;
  Clock::time_point start_ = Clock::now(), last_ = Clock::now();
};

// What the report prints, from a finished evaluation.
struct EvalReport {
  const EvalArgs& a;
  const Evaluator& ev;
  const GreedyResult& greedy;
  std::vector<ConfigSummary> sums;
  std::string model, mode;
  size_t fed = 0;
  int threads = 0;
  std::string baseline;  // its name in the JSON: "fp32 full cache[, DIR]"
};

std::string report_json(const EvalReport& r) {
  const EvalArgs& a = r.a;
  const Evaluator& ev = r.ev;
  const GreedyResult& greedy = r.greedy;
  const std::vector<ConfigSummary>& sums = r.sums;
  const double base_nll = mean(ev.baseline_nll());
  const std::vector<NllBucket> base_buckets = nll_buckets(ev.positions(), ev.baseline_nll());
  auto greedy_mean = [&](size_t k) { return mean(greedy.pct[k]); };
  const std::string& mode = r.mode;
  const size_t fed = r.fed;
  nlohmann::json j;
  j["model"] = r.model;
  j["text"] = a.text_file;
  j["mode"] = mode;
  j["streams"] = ev.streams();
  j["tokens"] = ev.positions().size();
  j["tokens_fed"] = fed;
  if (a.ppl_chunks > 0)
    j["ppl_chunk_tokens"] = a.ppl_chunks;
  else
    j["feed"] = {{"prefill", a.plan.prefill}, {"chunk", a.plan.chunk}};
  j["threads"] = r.threads;
  j["baseline"] = {{"name", r.baseline}, {"mean_nll", base_nll}, {"ppl", std::exp(base_nll)},
                   {"ppl_stderr", ppl_error(ev.baseline_nll())},
                   {"buckets", buckets_json(base_buckets)}, {"seconds", ev.baseline_seconds()}};
  j["configs"] = nlohmann::json::array();
  for (size_t k = 0; k < sums.size(); ++k) {
    const ConfigRecord& c = ev.configs()[k];
    const ConfigSummary& s = sums[k];
    nlohmann::json o = {{"name", c.spec.name},
                        {"mean_nll", s.mean_nll},
                        {"ppl", s.ppl},
                        {"ppl_stderr", ppl_error(c.nll)},
                        {"delta_nll", s.delta_nll},
                        {"delta_ppl_pct", s.delta_ppl_pct},
                        {"kl_mean", s.kl_mean},
                        {"kl_median", s.kl_median},
                        {"kl_p99", s.kl_p99},
                        {"kl_max", s.kl_max},
                        {"top1_agreement", s.top1_agreement},
                        {"buckets", buckets_json(s.buckets)},
                        {"kv_logical_bytes", c.kv_logical_bytes},
                        {"kv_physical_bytes", c.kv_physical_bytes},
                        {"stored_tokens", c.stored_tokens},
                        {"kv_layers", kv_layers_json(c.kv_layers)},
                        {"seconds", c.seconds}};
    if (!greedy.prompts.empty()) {
      o["greedy_match_pct"] = greedy_mean(k);
      o["greedy_match_pct_per_prompt"] = greedy.pct[k];
    }
    j["configs"].push_back(std::move(o));
  }
  if (!greedy.prompts.empty()) {
    j["greedy_prompts"] = greedy.prompts;
    j["greedy_tokens"] = a.greedy_tokens;
  }
  return j.dump(2) + "\n";
}

std::string report_table(const EvalReport& r) {
  const EvalArgs& a = r.a;
  const Evaluator& ev = r.ev;
  const GreedyResult& greedy = r.greedy;
  const std::vector<ConfigSummary>& sums = r.sums;
  const double base_nll = mean(ev.baseline_nll());
  const std::vector<NllBucket> base_buckets = nll_buckets(ev.positions(), ev.baseline_nll());
  auto greedy_mean = [&](size_t k) { return mean(greedy.pct[k]); };
  const std::string& mode = r.mode;
  const size_t fed = r.fed;
  std::string out = "baseline (fp32, full cache" + (a.baseline_model_dir.empty() ? "" : ", " + a.baseline_model_dir) + "): " +
                    fmt("PPL %.4f ± %.5f, mean NLL %.4f over %zu predictions in %zu %s\n\n", std::exp(base_nll), ppl_error(ev.baseline_nll()), base_nll, ev.positions().size(), ev.streams(),
                        mode == "ppl-chunks" ? "chunks" : mode == "documents" ? "documents" : "stream");
  std::vector<std::vector<std::string>> rows = {{"config", "PPL", "mean NLL", "ΔPPL", "KL mean", "KL median",
                                                 "KL p99", "KL max", "top-1", "stored", "KV logical",
                                                 "KV physical", "tok/s"}};
  for (size_t k = 0; k < sums.size(); ++k) {
    const ConfigRecord& c = ev.configs()[k];
    const ConfigSummary& s = sums[k];
    rows.push_back({c.spec.name, fmt("%.4f ± %.5f", s.ppl, ppl_error(c.nll)), fmt("%.4f", s.mean_nll), fmt("%+.3f%%", s.delta_ppl_pct),
                    fmt("%.6f", s.kl_mean), fmt("%.6f", s.kl_median), fmt("%.6f", s.kl_p99), fmt("%.6f", s.kl_max),
                    fmt("%.2f%%", 100 * s.top1_agreement), std::to_string(c.stored_tokens),
                    format_bytes(c.kv_logical_bytes), format_bytes(c.kv_physical_bytes),
                    fmt("%.1f", double(fed) / c.seconds)});
  }
  out += format_table(rows);
  for (size_t k = 0; k < sums.size(); ++k)
    if (ev.configs()[k].kv_layers.any_shared())
      out += ev.configs()[k].spec.name + ": " + kv_layers_line(ev.configs()[k].kv_layers) + "\n";
  out += "\nmean NLL by position\n";
  rows = {{"config"}};
  for (const auto& b : base_buckets) rows[0].push_back(bucket_label(b));
  rows.push_back({"baseline"});
  for (const auto& b : base_buckets) rows.back().push_back(fmt("%.4f", b.mean_nll));
  for (size_t k = 0; k < sums.size(); ++k) {
    rows.push_back({ev.configs()[k].spec.name});
    for (const auto& b : sums[k].buckets) rows.back().push_back(fmt("%.4f", b.mean_nll));
  }
  out += format_table(rows);
  if (!greedy.prompts.empty()) {
    out += fmt("\ngreedy prefix match vs the baseline, %d tokens per prompt\n", a.greedy_tokens);
    rows = {{"prompt"}};
    for (const auto& c : ev.configs()) rows[0].push_back(c.spec.name);
    for (size_t p = 0; p < greedy.prompts.size(); ++p) {
      rows.push_back({greedy.prompts[p]});
      for (const auto& pct : greedy.pct) rows.back().push_back(fmt("%.1f%%", pct[p]));
    }
    rows.push_back({"mean"});
    for (size_t k = 0; k < greedy.pct.size(); ++k) rows.back().push_back(fmt("%.1f%%", greedy_mean(k)));
    out += format_table(rows);
  }
  return out;
}

int run_eval(EvalArgs& a) {
  const auto t_start = Clock::now();
  if (a.runtime.no_cache)
    throw UsageError("--no-cache has no cache to evaluate: eval scores cache configurations against the fp32 cache");
  const std::filesystem::path dir = a.model_dir.empty() ? default_model_dir() : std::filesystem::path(a.model_dir);
  const std::string text = read_text(a.text_file, "--text");
  std::vector<std::string> greedy_prompts;
  if (!a.greedy_prompts.empty()) greedy_prompts = read_greedy_prompts(a.greedy_prompts);
  if (!a.plot.empty()) check_plot_path(a.plot);
  Runtime rt({dir, resolve_threads(a.runtime), true});
  const Model& model = rt.model();
  const Tokenizer& tok = rt.tokenizer();
  const ModelConfig& cfg = model.config();

  KVCacheConfig base = make_session_options(a.runtime, cfg).kv;
  if (a.runtime.ctx_size == 0) base.ctx_size = 0;  // no --ctx-size: every stream fits (quality, not capacity)
  const std::vector<CacheSpec> specs =
      a.configs.empty() ? std::vector<CacheSpec>{{base.describe(), base}} : parse_cache_specs(a.configs, base);
  // A window sizes the cache's rings and RoPE tables: bounded by the model's positions, as --ctx-size.
  for (const CacheSpec& spec : specs)
    if (spec.kv.window > 0 && int64_t(spec.kv.sink) + spec.kv.window > cfg.max_position_embeddings)
      throw UsageError("cache spec '" + spec.name + "': sink " + std::to_string(spec.kv.sink) + " + window " +
                       std::to_string(spec.kv.window) + " is more than the model's max_position_embeddings (" +
                       std::to_string(cfg.max_position_embeddings) + ")");
  ThreadPool& pool = rt.pool();
  // --baseline-model: the baseline runs another checkpoint of the same vocabulary (a quantized model
  // against its bf16 original).
  std::unique_ptr<Model> baseline_model;
  if (!a.baseline_model_dir.empty()) {
    baseline_model = Model::load(a.baseline_model_dir);
    if (baseline_model->config().vocab_size != cfg.vocab_size ||
        Tokenizer::load(a.baseline_model_dir).fingerprint() != tok.fingerprint())
      throw Error(a.baseline_model_dir + ": --baseline-model needs the tokenizer and vocabulary of " + dir.string() +
                  " (KL divergence compares distributions over the same tokens)");
  }
  Evaluator ev(model, specs, pool, baseline_model.get());

  const std::string mode = a.ppl_chunks > 0 ? "ppl-chunks" : a.documents ? "documents" : "text";
  const std::vector<Stream> streams = make_streams(a, text, tok);
  size_t total = 0, longest = 0;
  for (const Stream& s : streams) total += s.ids.size(), longest = std::max(longest, s.ids.size());
  Progress progress(ev, total, a.progress_seconds);
  ev.set_progress([&progress](int tokens) { progress.step(tokens); });
  for (const Stream& s : streams) ev.score_stream(s.ids, s.plan, s.first_scored);
  const size_t fed = progress.done();
  if (ev.positions().empty()) throw UsageError(a.text_file + ": no token to score (the text needs two tokens or more)");
  std::fprintf(stderr, "eval: %zu predictions scored in %zu %s, %.1f s\n", ev.positions().size(), ev.streams(),
               mode == "ppl-chunks" ? "chunks" : mode == "documents" ? "documents" : "stream", seconds_since(t_start));
  if (longest > size_t(cfg.max_position_embeddings))
    std::fprintf(stderr, "warning: a stream of %zu tokens is longer than the model's max_position_embeddings (%d)\n",
                 longest, cfg.max_position_embeddings);

  GreedyResult greedy;
  if (!greedy_prompts.empty()) greedy = run_greedy(a, std::move(greedy_prompts), model, baseline_model ? *baseline_model : model,
                                                    tok, specs, pool);

  const std::string base_name = baseline_model ? "fp32 full cache, " + a.baseline_model_dir : "fp32 full cache";
  EvalReport report{a, ev, greedy, {}, dir.string(), mode, fed, pool.size(), base_name};
  for (const auto& c : ev.configs()) report.sums.push_back(summarize(c, ev));
  const std::string out = a.json ? report_json(report) : report_table(report);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);

  if (!a.plot.empty())
    write_plot(a.plot, ev,
               "mean NLL by position: " + dir.filename().string() + ", " +
                   std::filesystem::path(a.text_file).filename().string());
  std::fprintf(stderr, "model: %s (%s), %d threads; %zu tokens fed per configuration; baseline %.1f s",
               dir.string().c_str(), weights_text(model).c_str(), pool.size(), fed,
               ev.baseline_seconds());
  for (const auto& c : ev.configs()) std::fprintf(stderr, ", %s %.1f s", c.spec.name.c_str(), c.seconds);
  std::fprintf(stderr, "; total %.1f s\n", seconds_since(t_start));
  return 0;
}

}  // namespace

Command add_eval_command(CLI::App& root) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* app = root.add_subcommand(
      "eval", "Perplexity, KL divergence and greedy match of cache configurations against the fp32 full cache");
  add_model_option(*app, a->model_dir, "Hugging Face model directory or .gguf file (default: the shipped models/kjv-tiny)");
  app->add_option("--baseline-model", a->baseline_model_dir,
                  "Run the fp32 full-cache baseline on this model directory instead (same tokenizer), e.g. the "
                  "bf16 original of a quantized MODEL: KL and top-1 then measure the weights' quantization too")
      ->check(CLI::ExistingDirectory);
  app->add_option("--text", a->text_file, "Text to score, teacher-forced through the cached path")->required();
  app->add_option("--configs", a->configs,
                  "Cache configurations separated by ';', e.g. \"fp32; int4 g32 r128; sink4 w508\" "
                  "(default: the one the cache flags give)");
  app->add_flag("--documents", a->documents, "Score every document of the text (split on lines holding \\x1e)");
  auto* max_tokens = app->add_option("--max-tokens", a->max_tokens, "Stop after N predictions (0 = the whole text)")
                         ->check(integer_at_least(0));
  auto* prefill = app->add_option("--prefill", a->plan.prefill,
                                  "Feed the first N tokens of each stream in one batched pass")
                      ->check(integer_at_least(0));
  auto* chunk = app->add_option("--chunk", a->plan.chunk, "Then feed N tokens per step (1 = as decode)")
                    ->check(integer_at_least(1));
  auto* ppl = app->add_option("--ppl-chunks", a->ppl_chunks,
                              "llama.cpp's perplexity protocol: chunks of N tokens, each starting with BOS, "
                              "prefilled whole, second half scored")
                  ->check(integer_at_least(4))
                  ->excludes(max_tokens)
                  ->excludes(prefill)
                  ->excludes(chunk);
  app->add_option("--max-chunks", a->max_chunks, "Score at most K chunks (0 = all)")
      ->check(integer_at_least(0))
      ->needs(ppl);
  auto* greedy = app->add_option("--greedy-prompts", a->greedy_prompts,
                                 "File of prompts, one per line: greedy prefix match against the baseline");
  app->add_option("--greedy-tokens", a->greedy_tokens, "Tokens generated per greedy prompt")
      ->check(integer_at_least(1))
      ->needs(greedy);
  app->add_flag("--json", a->json, "Print one JSON object instead of the tables");
  app->add_option("--plot", a->plot, "Write an SVG of mean NLL against position for every configuration");
  app->add_option("--progress-seconds", a->progress_seconds,
                  "Seconds between progress lines on stderr (tokens, running PPL, ETA)")
      ->check(number_at_least(0));
  add_runtime_options(*app, a->runtime);
  return {app, [a] { return run_eval(*a); }};
}

}  // namespace ptllm::cli
