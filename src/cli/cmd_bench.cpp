// posttrainllm bench: prefill and decode speed of a model (random token ids: no tokenizer needed),
// the KV cache it fills, peak RSS, and the machine's memory bandwidth with the decode floor it
// implies (bytes read per decode step / bandwidth, measured beside each decode) and the fraction achieved.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/speculation.h"
#include "engine/runtime.h"
#include "core/error.h"
#include "core/file_io.h"
#include "engine/cache_reuse.h"
#include "core/thread_pool.h"
#include "engine/bench.h"
#include "engine/generator.h"
#include "engine/speculative.h"
#include "sample/sampler.h"
#include "kernels/simd.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace ptllm::cli {

namespace {

constexpr int kBandwidthTrials = 10;

struct BenchArgs {
  std::string model_dir;
  BenchConfig bench;
  int bandwidth_mib = 512;
  bool json = false;
  RuntimeOptions runtime;
  std::string parallel;   // "N[,N...]": sequences decoding together (empty: one, the classic bench)
  int shared_prefix = 0;  // --parallel: prompt tokens common to every sequence
  int kv_budget_mb = 0;   // --parallel: the shared KV pool's size (0: every sequence's worst case)
  SpecArgs spec;          // --spec-type ...: decode with and without speculation, alternating
  bool verify_cost = false;  // --spec-verify-cost: a k-draft verification's pass against one step
  bool gen_given = false;    // --gen-tokens given (not used by --spec-verify-cost)
  int cache_reuse = 0;    // --cache-reuse: measure reuse after an edit instead (engine/cache_reuse.h)
  int drop = 400, drop_at = 300;
  std::string text;       // --text: the history's tokens (else random ids)
  std::vector<std::string> edit;  // --edit HISTORY PROMPT CONTINUATION: text files of one edit
  std::string trace;              // --trace FILE: a conversation's turns, the reuse compounding
};

// bench --cache-reuse N --edit HISTORY PROMPT CONTINUATION: one edit as an agent harness makes it
// (the texts of the earlier request's whole sequence and of the new prompt, encoded as a completion
// prompt is), the first --gen-tokens of CONTINUATION scored. Runs are shifted as serve shifts them,
// with up to its default prefill chunk (256 tokens) computed between two runs.
int run_cache_reuse_edit(BenchArgs& a) {
  Runtime rt({a.model_dir, resolve_threads(a.runtime), true});
  const Model& model = rt.model();
  const Tokenizer& tok = rt.tokenizer();
  const std::vector<std::string> names = {"--edit HISTORY", "--edit PROMPT", "--edit CONTINUATION"};
  std::vector<std::vector<int32_t>> ids;
  for (size_t i = 0; i < 3; ++i) {
    const std::string t = read_whole_file(a.edit[i], uint64_t(1) << 28, names[i]);
    ids.push_back(i < 2 ? tok.encode(t) : tok.encode(t, {.add_special = false}));
    if (ids.back().size() < (i == 1 ? 2u : 1u))
      throw UsageError(names[i] + " (" + a.edit[i] + "): too short (" + std::to_string(ids.back().size()) + " tokens)");
  }
  if (ids[2].size() > size_t(a.bench.gen_tokens)) ids[2].resize(size_t(a.bench.gen_tokens));
  const int64_t needed = std::max<int64_t>(int64_t(ids[0].size()), int64_t(ids[1].size() + ids[2].size()));
  if (a.runtime.ctx_size == 0) a.runtime.ctx_size = int(std::max<int64_t>(default_ctx_size(model.config()), needed));
  SessionOptions sopts = make_session_options(a.runtime, model.config());
  if (const std::string e = cache_reuse_error(a.cache_reuse, sopts.kv, "--cache-reuse"); !e.empty()) throw UsageError(e);
  if (needed > sopts.kv.ctx_size)
    throw UsageError("--edit needs a context of " + std::to_string(needed) + " tokens, more than --ctx-size " +
                     std::to_string(sopts.kv.ctx_size));
  ThreadPool pool(resolve_threads(a.runtime));
  const ReuseMeasurement m = measure_cache_reuse(model, sopts, pool, ids[0], ids[1], ids[2], a.cache_reuse, 256);
  const nlohmann::json j = {{"kv", sopts.kv.describe()}, {"cache_reuse", a.cache_reuse},
                            {"history_tokens", ids[0].size()}, {"prompt_tokens", m.prompt_tokens},
                            {"adopted_tokens", m.adopted}, {"shifted_tokens", m.shifted},
                            {"computed_exact", m.computed_exact}, {"computed_reuse", m.computed_reuse},
                            {"scored_tokens", ids[2].size()}, {"kl_mean", m.kl_mean}, {"kl_max", m.kl_max},
                            {"kl_exact_max", m.kl_exact_max}, {"nll_reference", m.nll_reference},
                            {"nll_reuse", m.nll_reuse}, {"top1_agreement", m.top1_agreement}};
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("kv %s, history %zu tokens, prompt %lld: computed exact %lld, with --cache-reuse %d %lld (%lld shifted)\n",
              sopts.kv.describe().c_str(), ids[0].size(), static_cast<long long>(m.prompt_tokens),
              static_cast<long long>(m.computed_exact), a.cache_reuse, static_cast<long long>(m.computed_reuse),
              static_cast<long long>(m.shifted));
  std::printf("next %zu tokens against a full recompute: KL mean %.4g max %.4g nats (exact reuse: max %.3g); NLL %.4f "
              "(recompute %.4f); top-1 agreement %.1f%%\n",
              ids[2].size(), m.kl_mean, m.kl_max, m.kl_exact_max, m.nll_reuse, m.nll_reference, 100 * m.top1_agreement);
  return 0;
}

// bench --cache-reuse N --trace FILE: a JSON list of turns, {"prompt": TEXT, "reply": TEXT} each (a
// turn's whole prompt as a completion prompt, and the reply scored after it, its first --gen-tokens).
// Each turn's prompt is shifted from the previous turn's reuse session with its reply, as a server that
// held it would shift it, so the approximation compounds; each is scored against a recompute. One JSON
// line a turn with --json, then a summary.
int run_cache_reuse_trace(BenchArgs& a) {
  Runtime rt({a.model_dir, resolve_threads(a.runtime), true});
  const Model& model = rt.model();
  const Tokenizer& tok = rt.tokenizer();
  const nlohmann::json j = nlohmann::json::parse(read_whole_file(a.trace, uint64_t(1) << 28, "--trace"), nullptr, false);
  if (!j.is_array() || j.empty())
    throw UsageError("--trace " + a.trace + ": not a JSON list of turns ({\"prompt\": TEXT, \"reply\": TEXT} each)");
  std::vector<TraceTurn> turns;
  int64_t needed = 0;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& t = j[i];
    const std::string where = "--trace " + a.trace + ": turn " + std::to_string(i + 1);
    if (!t.is_object() || !t.contains("prompt") || !t["prompt"].is_string() || !t.contains("reply") ||
        !t["reply"].is_string())
      throw UsageError(where + ": needs \"prompt\" and \"reply\" strings");
    TraceTurn turn{tok.encode(t["prompt"].get<std::string>()), tok.encode(t["reply"].get<std::string>(), {.add_special = false})};
    if (turn.prompt.size() < 2 || turn.scored.empty()) throw UsageError(where + ": a prompt of 2 tokens and a reply of 1 at least");
    if (turn.scored.size() > size_t(a.bench.gen_tokens)) turn.scored.resize(size_t(a.bench.gen_tokens));
    needed = std::max<int64_t>(needed, int64_t(turn.prompt.size() + turn.scored.size()));
    turns.push_back(std::move(turn));
  }
  if (a.runtime.ctx_size == 0) a.runtime.ctx_size = int(std::max<int64_t>(default_ctx_size(model.config()), needed));
  SessionOptions sopts = make_session_options(a.runtime, model.config());
  if (const std::string e = cache_reuse_error(a.cache_reuse, sopts.kv, "--cache-reuse"); !e.empty()) throw UsageError(e);
  if (needed > sopts.kv.ctx_size)
    throw UsageError("--trace needs a context of " + std::to_string(needed) + " tokens, more than --ctx-size " +
                     std::to_string(sopts.kv.ctx_size));
  ThreadPool pool(resolve_threads(a.runtime));
  // Up to serve's default prefill chunk computed between two shifted runs, as the server does.
  const std::vector<ReuseMeasurement> ms = measure_cache_reuse_trace(model, sopts, pool, turns, a.cache_reuse, 256);
  double kl_sum = 0, kl_max = 0, nll_reuse = 0, nll_ref = 0, kl_exact_max = 0;
  int64_t scored = 0;
  for (size_t t = 0; t < ms.size(); ++t) {
    const ReuseMeasurement& m = ms[t];
    const int64_t n = int64_t(turns[t].scored.size());
    const nlohmann::json row = {{"turn", t + 1}, {"prompt_tokens", m.prompt_tokens}, {"adopted_tokens", m.adopted},
                                {"shifted_tokens", m.shifted}, {"computed_exact", m.computed_exact},
                                {"computed_reuse", m.computed_reuse}, {"scored_tokens", n}, {"kl_mean", m.kl_mean},
                                {"kl_max", m.kl_max}, {"kl_exact_max", m.kl_exact_max},
                                {"nll_reference", m.nll_reference}, {"nll_reuse", m.nll_reuse},
                                {"top1_agreement", m.top1_agreement}};
    if (a.json)
      std::printf("%s\n", row.dump().c_str());
    else
      std::printf("turn %2zu: prompt %lld, computed exact %lld / with reuse %lld (%lld shifted); KL mean %.4g max %.4g "
                  "nats; NLL %.4f (recompute %.4f, difference %+.4f); top-1 %.1f%%\n",
                  t + 1, (long long)m.prompt_tokens, (long long)m.computed_exact, (long long)m.computed_reuse,
                  (long long)m.shifted, m.kl_mean, m.kl_max, m.nll_reuse, m.nll_reference, m.nll_reuse - m.nll_reference,
                  100 * m.top1_agreement);
    kl_sum += m.kl_mean * double(n);
    kl_max = std::max(kl_max, m.kl_max);
    kl_exact_max = std::max(kl_exact_max, m.kl_exact_max);
    nll_reuse += m.nll_reuse * double(n);
    nll_ref += m.nll_reference * double(n);
    scored += n;
  }
  const nlohmann::json summary = {{"kv", sopts.kv.describe()}, {"cache_reuse", a.cache_reuse}, {"turns", ms.size()},
                                  {"scored_tokens", scored}, {"kl_mean", kl_sum / double(scored)}, {"kl_max", kl_max},
                                  {"kl_exact_max", kl_exact_max}, {"nll_reference", nll_ref / double(scored)},
                                  {"nll_reuse", nll_reuse / double(scored)}};
  if (a.json)
    std::printf("%s\n", summary.dump().c_str());
  else
    std::printf("trace (%zu turns, %lld tokens scored): KL mean %.4g max %.4g nats (exact reuse: max %.3g); NLL %.4f "
                "(recompute %.4f)\n",
                ms.size(), (long long)scored, kl_sum / double(scored), kl_max, kl_exact_max, nll_reuse / double(scored),
                nll_ref / double(scored));
  return 0;
}

// bench --cache-reuse N: a history of --prompt-tokens, then the same with --drop tokens removed
// after the first --drop-at, and --gen-tokens of the text after it scored against a full recompute.
int run_cache_reuse(BenchArgs& a) {
  Runtime rt({a.model_dir, resolve_threads(a.runtime), !a.text.empty()});
  const Model& model = rt.model();
  ReuseMeasureConfig rc;
  rc.keep = a.drop_at;
  rc.drop = a.drop;
  rc.rest = int64_t(a.bench.prompt_tokens) - a.drop_at - a.drop;
  rc.score = a.bench.gen_tokens;
  rc.min_len = a.cache_reuse;
  if (rc.rest < 2)
    throw UsageError("--prompt-tokens " + std::to_string(a.bench.prompt_tokens) + " must exceed --drop-at + --drop (" +
                     std::to_string(a.drop_at + a.drop) + ") by at least 2");
  const int64_t needed = a.bench.prompt_tokens + a.bench.gen_tokens;
  if (a.runtime.ctx_size == 0) a.runtime.ctx_size = int(std::max<int64_t>(default_ctx_size(model.config()), needed));
  SessionOptions sopts = make_session_options(a.runtime, model.config());
  if (const std::string e = cache_reuse_error(a.cache_reuse, sopts.kv, "--cache-reuse"); !e.empty()) throw UsageError(e);
  if (needed > sopts.kv.ctx_size)
    throw UsageError("--prompt-tokens + --gen-tokens (" + std::to_string(needed) + ") exceed --ctx-size " +
                     std::to_string(sopts.kv.ctx_size));
  std::vector<int32_t> text;
  if (!a.text.empty()) {
    std::string t = read_whole_file(a.text, uint64_t(1) << 30, "--text");
    t.resize(std::min(t.size(), size_t(needed) * 16));  // enough bytes for the tokens needed
    text = rt.tokenizer().encode(t);
    text.resize(std::min(text.size(), size_t(needed)));
  } else {
    std::mt19937_64 rng(a.bench.seed);
    std::uniform_int_distribution<int32_t> id(3, model.config().vocab_size - 1);
    for (int64_t i = 0; i < needed; ++i) text.push_back(id(rng));
  }
  ThreadPool pool(resolve_threads(a.runtime));
  const ReuseMeasurement m = measure_cache_reuse(model, sopts, pool, text, rc);
  if (a.json) {
    const nlohmann::json j = {{"kv", sopts.kv.describe()}, {"cache_reuse", a.cache_reuse},
                              {"history_tokens", a.bench.prompt_tokens}, {"dropped_tokens", a.drop},
                              {"drop_at", a.drop_at}, {"prompt_tokens", m.prompt_tokens},
                              {"adopted_tokens", m.adopted}, {"shifted_tokens", m.shifted},
                              {"computed_exact", m.computed_exact}, {"computed_reuse", m.computed_reuse},
                              {"scored_tokens", a.bench.gen_tokens}, {"kl_mean", m.kl_mean}, {"kl_max", m.kl_max},
                              {"kl_exact_max", m.kl_exact_max}, {"nll_reference", m.nll_reference},
                              {"nll_reuse", m.nll_reuse}, {"top1_agreement", m.top1_agreement}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("kv %s, history %d tokens, %d dropped after %d: prompt %lld tokens\n", sopts.kv.describe().c_str(),
              a.bench.prompt_tokens, a.drop, a.drop_at, static_cast<long long>(m.prompt_tokens));
  std::printf("prompt tokens computed: exact reuse %lld (%lld adopted); --cache-reuse %d: %lld (%lld adopted, %lld shifted)\n",
              static_cast<long long>(m.computed_exact), static_cast<long long>(m.adopted), a.cache_reuse,
              static_cast<long long>(m.computed_reuse), static_cast<long long>(m.adopted),
              static_cast<long long>(m.shifted));
  std::printf("next %d tokens against a full recompute: KL mean %.4g max %.4g nats (exact reuse: max %.3g); NLL %.4f "
              "(recompute %.4f); top-1 agreement %.1f%%\n",
              a.bench.gen_tokens, m.kl_mean, m.kl_max, m.kl_exact_max, m.nll_reuse, m.nll_reference,
              100 * m.top1_agreement);
  return 0;
}

std::vector<int> parse_parallel(const std::string& list) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, comma - at);
    size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || n < 1 || n > 256)
      throw UsageError("--parallel: '" + item + "' is not a number of sequences from 1 to 256 (give N or N,N,...)");
    out.push_back(n);
    at = comma + 1;
  }
  return out;
}

// bench --parallel: per N, n sequences prefilled one by one, then decoding together.
int run_parallel(BenchArgs& a, const Model& model, const SessionOptions& sopts, ThreadPool& pool) {
  const std::vector<int> ns = parse_parallel(a.parallel);
  ParallelBenchConfig pc;
  pc.prompt_tokens = a.bench.prompt_tokens;
  pc.gen_tokens = a.bench.gen_tokens;
  pc.repeat = a.bench.repeat;
  pc.seed = a.bench.seed;
  pc.shared_prefix = a.shared_prefix;
  pc.kv_budget_bytes = size_t(a.kv_budget_mb) << 20;
  if (pc.shared_prefix > pc.prompt_tokens)
    throw UsageError("--shared-prefix (" + std::to_string(pc.shared_prefix) + ") must be at most --prompt-tokens (" +
                     std::to_string(pc.prompt_tokens) + ")");
  if (!a.json)
    std::printf("model: %s, %d threads; %d prompt tokens (%d shared), %d generated per sequence; kv %s\n",
                a.model_dir.c_str(), pool.size(), pc.prompt_tokens, pc.shared_prefix, pc.gen_tokens,
                sopts.kv.describe().c_str());
  double base = 0;
  for (int n : ns) {
    const ParallelBenchResult r = run_parallel_bench(model, sopts, pool, pc, n);
    if (base == 0) base = r.aggregate_decode_tok_s;
    if (a.json) {
      const nlohmann::json j = {{"parallel", n},
                                {"aggregate_decode_tok_s", r.aggregate_decode_tok_s},
                                {"decode_tok_s", r.decode_tok_s},
                                {"prefill_tok_s", r.prefill_tok_s},
                                {"ttft_ms", r.ttft_ms},
                                {"ttft_first_ms", r.ttft_first_ms},
                                {"ttft_last_ms", r.ttft_last_ms},
                                {"kv_logical_bytes", r.kv_logical_bytes},
                                {"kv_physical_bytes", r.kv_physical_bytes},
                                {"kv_used_bytes", r.kv_used_bytes},
                                {"kv_shared_bytes", r.kv_shared_bytes},
                                {"kv_layers", kv_layers_json(r.kv_layers)},
                                {"peak_rss_mb", r.peak_rss_mb},
                                {"prompt_tokens", pc.prompt_tokens},
                                {"shared_prefix", pc.shared_prefix},
                                {"gen_tokens", pc.gen_tokens},
                                {"threads", pool.size()},
                                {"kv_cache", sopts.kv.describe()}};
      std::printf("%s\n", j.dump().c_str());
      continue;
    }
    std::printf("parallel %d: decode %.1f tok/s aggregate (%.2fx parallel %d), %.1f tok/s per sequence; prefill %.1f "
                "tok/s; ttft %.1f ms mean (first %.1f, last %.1f); kv logical %s, in use %s (shared %s), pool %s; "
                "peak RSS %.1f MiB\n",
                n, r.aggregate_decode_tok_s, r.aggregate_decode_tok_s / base, ns.front(), r.decode_tok_s, r.prefill_tok_s,
                r.ttft_ms, r.ttft_first_ms, r.ttft_last_ms, format_bytes(r.kv_logical_bytes).c_str(),
                format_bytes(r.kv_used_bytes).c_str(), format_bytes(r.kv_shared_bytes).c_str(),
                format_bytes(r.kv_physical_bytes).c_str(), r.peak_rss_mb);
  }
  return 0;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// bench --spec-type: greedy decode of the same random prompt without and with speculation, in turns
// (plain, speculative, plain, ...: drift on the machine hits both alike), each pair's ratio.
int run_spec_bench(BenchArgs& a, const Runtime& rt, const SessionOptions& sopts, ThreadPool& pool) {
  SpecOptions o = spec_options(a.spec);
  const auto draft = load_draft_model(a.spec, o, rt.tokenizer(), a.model_dir, pool, sopts.kv.ctx_size);
  const BenchConfig& b = a.bench;
  std::mt19937 rng(uint32_t(b.seed));
  std::uniform_int_distribution<int32_t> id(0, rt.config().vocab_size - 1);
  std::vector<int32_t> prompt(size_t(b.prompt_tokens));
  for (int32_t& t : prompt) t = id(rng);
  GeneratorOptions go;
  go.sampling.temperature = 0;
  go.ignore_eos = true;
  go.max_tokens = b.gen_tokens + 1;  // the first token comes from the prompt's pass (not timed)
  std::vector<double> plain_tok_s, spec_tok_s, ratio;
  SpecStats total;
  bool same = true;
  for (int r = 0; r < b.repeat; ++r) {
    std::vector<int32_t> ids[2];
    double tok_s[2] = {0, 0};
    for (int with = 0; with < 2; ++with) {
      Session s(rt.model(), sopts, pool);
      Generator gen(rt.tokenizer(), go);
      Speculator spec(with ? o : SpecOptions{});
      Generator::Step step = gen.next(s.feed(prompt), s.history(), s.fits(1));
      std::vector<Generator::Step> steps;
      const auto t0 = std::chrono::steady_clock::now();
      while (!gen.done()) {
        steps.clear();
        spec.round(s, gen, step.id, steps);
        step = steps.back();
      }
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      tok_s[with] = double(gen.tokens().size() - 1) / sec;
      ids[with] = gen.tokens();
      if (with) total.add(spec.stats());
    }
    same = same && ids[0] == ids[1];
    plain_tok_s.push_back(tok_s[0]);
    spec_tok_s.push_back(tok_s[1]);
    ratio.push_back(tok_s[1] / tok_s[0]);
  }
  const auto [rmin, rmax] = std::minmax_element(ratio.begin(), ratio.end());
  if (a.json) {
    nlohmann::json j = {{"model", a.model_dir},
                        {"threads", pool.size()},
                        {"prompt_tokens", b.prompt_tokens},
                        {"gen_tokens", b.gen_tokens},
                        {"repeat", b.repeat},
                        {"kv_cache", sopts.kv.describe()},
                        {"decode_tok_s", median_of(plain_tok_s)},
                        {"spec_decode_tok_s", median_of(spec_tok_s)},
                        {"spec_ratio", median_of(ratio)},
                        {"spec_ratio_min", *rmin},
                        {"spec_ratio_max", *rmax},
                        {"same_tokens", same},
                        {"speculative", spec_json(o, total)}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model: %s, %d threads; %d random prompt tokens, %d decoded greedily; %d pairs, kv %s\n",
              a.model_dir.c_str(), pool.size(), b.prompt_tokens, b.gen_tokens, b.repeat, sopts.kv.describe().c_str());
  std::printf("decode: %.1f tok/s without speculation, %.1f tok/s with (medians); ratio %.3f (%.3f-%.3f, pair by "
              "pair); the same tokens: %s\n",
              median_of(plain_tok_s), median_of(spec_tok_s), median_of(ratio), *rmin, *rmax, same ? "yes" : "NO");
  std::printf("%s\n", spec_line(o, total).c_str());
  return 0;
}

// bench --spec-verify-cost: after a random prompt, passes of 1, 2, ..., K + 1 rows (a one-token step,
// then the verification of k = 1..K drafted tokens with the pending one), the widths in turn within
// each round so that the machine's drift hits all alike; each round's ratio to its one-token step.
// The pass is what a verification computes (every row's logits, the drafts' KV rows written and all
// but the first dropped); the generator's per-row sampling is left out.
int run_verify_cost(const BenchArgs& a, const Model& model, const SessionOptions& sopts, ThreadPool& pool) {
  const BenchConfig& b = a.bench;
  const int K = a.spec.opts.draft_max;
  std::mt19937 rng(uint32_t(b.seed));
  std::uniform_int_distribution<int32_t> id(0, model.config().vocab_size - 1);
  std::vector<int32_t> prompt(size_t(b.prompt_tokens)), fed(size_t(K) + 1);
  for (int32_t& t : prompt) t = id(rng);
  Session s(model, sopts, pool);
  s.feed(prompt);
  if (s.max_draft_append() < K + 1)
    throw UsageError("--spec-draft-max " + std::to_string(K) + ": this KV configuration verifies at most " +
                     std::to_string(s.max_draft_append() - 1) + " drafts in one pass");
  std::vector<std::vector<double>> ms(size_t(K) + 1), ratio(size_t(K) + 1);
  for (int r = -1; r < b.repeat; ++r) {  // round -1: every width's buffers grown, not timed
    double step = 0;
    for (int k = 0; k <= K; ++k) {
      for (int32_t& t : fed) t = id(rng);
      const auto t0 = std::chrono::steady_clock::now();
      s.feed_draft(std::span<const int32_t>(fed).first(size_t(k) + 1));
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      s.commit_draft(1);
      if (r < 0) continue;
      if (k == 0) step = dt;
      ms[size_t(k)].push_back(dt * 1e3);
      ratio[size_t(k)].push_back(dt / step);
    }
  }
  const auto lo = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  const auto hi = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  if (a.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (int k = 0; k <= K; ++k) {
      const double q = median_of(ratio[size_t(k)]);
      rows.push_back({{"k", k},
                      {"rows", k + 1},
                      {"ms", median_of(ms[size_t(k)])},
                      {"ratio", q},
                      {"ratio_min", lo(ratio[size_t(k)])},
                      {"ratio_max", hi(ratio[size_t(k)])},
                      {"ceiling", double(k + 1) / q}});
    }
    nlohmann::json j = {{"model", a.model_dir},     {"threads", pool.size()}, {"prompt_tokens", b.prompt_tokens},
                        {"repeat", b.repeat},       {"kv_cache", sopts.kv.describe()},
                        {"weights", weights_text(model)}, {"verify", rows}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model: %s (%s), %d threads; after %d random prompt tokens, kv %s; medians of %d rounds, widths in turn\n",
              a.model_dir.c_str(), weights_text(model).c_str(), pool.size(), b.prompt_tokens,
              sopts.kv.describe().c_str(), b.repeat);
  std::printf("drafts k  rows  pass ms  verify(k)/step(1), median (min-max)  ceiling of the gain (k+1)/ratio\n");
  for (int k = 0; k <= K; ++k) {
    const double q = median_of(ratio[size_t(k)]);
    std::printf("%8d  %4d  %7.2f  %6.3f (%.3f-%.3f)  %25.2fx\n", k, k + 1, median_of(ms[size_t(k)]), q,
                lo(ratio[size_t(k)]), hi(ratio[size_t(k)]), double(k + 1) / q);
  }
  return 0;
}

int run_bench_command(BenchArgs& a) {
  if (a.model_dir.empty()) throw UsageError("give the model directory: bench MODEL, or -m MODEL");
  const bool spec = spec_options(a.spec).type != SpecType::None;  // flags checked before the model loads
  if (spec && !a.parallel.empty())
    throw UsageError("--spec-type with --parallel: bench measures speculation on one sequence");
  if (a.verify_cost && (spec || !a.parallel.empty() || a.cache_reuse > 0))
    throw UsageError("--spec-verify-cost times verification passes alone: not with --spec-type, --model-draft, "
                     "--parallel or --cache-reuse");
  if (a.verify_cost && (a.bench.context > 0 || a.gen_given))
    throw UsageError("--spec-verify-cost: the context is --prompt-tokens and nothing is generated (no --context, "
                     "--gen-tokens)");
  if (a.bench.context > 0 && (spec || !a.parallel.empty() || a.cache_reuse > 0))
    throw UsageError("--context applies to the single-sequence speed run: not with --spec-type, --model-draft, "
                     "--parallel or --cache-reuse (their sequences start from --prompt-tokens)");
  if (a.bench.decode_at_context && (spec || !a.parallel.empty() || a.verify_cost || a.cache_reuse > 0))
    throw UsageError("--decode-at-context applies to the single-sequence speed run: not with --spec-type, "
                     "--model-draft, --parallel, --spec-verify-cost or --cache-reuse");
  if (!a.edit.empty() && a.cache_reuse == 0) throw UsageError("--edit measures reuse after an edit: give --cache-reuse N");
  if (!a.trace.empty() && a.cache_reuse == 0)
    throw UsageError("--trace measures reuse over a conversation's turns: give --cache-reuse N");
  if (a.cache_reuse > 0) {
    if (spec) throw UsageError("--cache-reuse with --spec-type: bench measures one of them at a time");
    if (!a.trace.empty()) return run_cache_reuse_trace(a);
    return a.edit.empty() ? run_cache_reuse(a) : run_cache_reuse_edit(a);
  }
  Runtime rt({a.model_dir, resolve_threads(a.runtime), spec});
  const Model& model = rt.model();
  const ModelConfig& cfg = model.config();
  const BenchConfig& b = a.bench;
  const int64_t needed = a.verify_cost ? int64_t(b.prompt_tokens) + int64_t(b.repeat + 2) * (a.spec.opts.draft_max + 2)
                     : int64_t(b.context) + (b.decode_at_context ? std::max(b.prompt_tokens, b.gen_tokens)
                                                                 : b.prompt_tokens + b.gen_tokens);
  const bool streaming = a.runtime.window > 0;
  // Without --ctx-size the cache is sized for the run; a given one must hold it.
  if (a.runtime.ctx_size == 0 && !streaming)
    a.runtime.ctx_size = int(std::max<int64_t>(default_ctx_size(cfg), needed));
  SessionOptions sopts = make_session_options(a.runtime, cfg);
  if (!streaming && needed > sopts.kv.ctx_size)
    throw UsageError(std::string(b.decode_at_context ? "--context + the larger of --prompt-tokens and --gen-tokens ("
                                                     : "--context + --prompt-tokens + --gen-tokens (") +
                     std::to_string(needed) + ") exceed --ctx-size " + std::to_string(sopts.kv.ctx_size));
  ThreadPool pool(resolve_threads(a.runtime));
  if (!a.parallel.empty()) return run_parallel(a, model, sopts, pool);
  if (a.verify_cost) {
    if (!sopts.use_cache) throw UsageError("--spec-verify-cost needs the KV cache (--no-cache)");
    return run_verify_cost(a, model, sopts, pool);
  }
  if (spec) {
    if (!sopts.use_cache) throw UsageError("--spec-type needs the KV cache (--no-cache)");
    return run_spec_bench(a, rt, sopts, pool);
  }

  // The floor's bandwidth is measured beside each timed decode, right before and right after it
  // (best of 10 passes each, the better of the two): a VM's memory can change state within seconds
  // (the Zen 4 VM's: about 36 or 68 GB/s, decode moving with it), so a floor measured apart from the
  // run compares it with another state. Each run gets its own fraction of the floor; the report
  // gives their median. Peak RSS must count the runs, not the bandwidth buffer: it is read before
  // each measurement and restarted after it. Where the peak cannot be restarted, one measurement
  // after the runs serves them all.
  const size_t bw_bytes = size_t(a.bandwidth_mib) << 20;
  const bool beside = reset_peak_rss();
  std::vector<Bandwidth> near(size_t(b.repeat) * 2);  // [run][before decode, after decode]
  double rss_mib = 0;
  std::function<void(int, bool)> probe;
  if (beside)
    probe = [&](int run, bool after) {
      rss_mib = std::max(rss_mib, peak_rss_mib());
      near[size_t(run) * 2 + (after ? 1 : 0)] = measure_bandwidth(pool, bw_bytes, kBandwidthTrials);
      reset_peak_rss();
    };
  const BenchResult r = run_bench(model, sopts, pool, b, probe);
  rss_mib = std::max(rss_mib, peak_rss_mib());  // before the bandwidth buffer of a measurement after the runs
  if (!beside) std::fill(near.begin(), near.end(), measure_bandwidth(pool, bw_bytes, kBandwidthTrials));
  const double bytes_per_token = double(r.weight_bytes_per_token + r.kv_bytes_per_token);
  std::vector<double> run_read, run_copy, run_fraction;
  for (size_t i = 0; i < r.runs.size(); ++i) {
    run_read.push_back(std::max(near[2 * i].read_gb_s, near[2 * i + 1].read_gb_s));
    run_copy.push_back(std::max(near[2 * i].copy_gb_s, near[2 * i + 1].copy_gb_s));
    const double tok_s = double(b.gen_tokens) / (r.runs[i].decode_ms / 1000);
    run_fraction.push_back(tok_s / (run_read.back() * 1e9 / bytes_per_token));
  }
  const Bandwidth bw{median_of(run_read), median_of(run_copy)};
  const double floor_tok_s = bw.read_gb_s * 1e9 / bytes_per_token;
  const double fraction = median_of(run_fraction);
  const auto [fmin, fmax] = std::minmax_element(run_fraction.begin(), run_fraction.end());
  const auto [bmin, bmax] = std::minmax_element(run_read.begin(), run_read.end());
  const std::string simd = active_kernels_name();

  if (a.json) {
    nlohmann::json j = {
        {"model", a.model_dir},
        {"architecture", cfg.arch_name},
        {"simd", simd},
        {"kernels", kernels_description()},
        {"threads", pool.size()},
        {"context_tokens", b.context},
        {"prompt_tokens", b.prompt_tokens},
        {"gen_tokens", b.gen_tokens},
        {"repeat", b.repeat},
        {"decode_mode", b.decode_at_context ? "at_context" : "after_prompt"},
        {"decode_depth", r.runs.back().decode_depth},
        {"decode_cache_rebuilt", r.runs.back().rebuilt},
        {"kv_cache", sopts.use_cache ? sopts.kv.describe() : "none"},
        {"prefill_tok_s", r.prefill_tok_s},
        {"decode_tok_s", r.decode_tok_s},
        {"ttft_ms", r.ttft_ms},
        {"kv_logical_bytes", r.kv_logical_bytes},
        {"kv_physical_bytes", r.kv_physical_bytes},
        {"kv_stored_tokens", r.kv_stored},
        {"kv_layers", kv_layers_json(r.kv_layers)},
        {"peak_rss_mb", rss_mib},
        {"weight_bytes", model.weight_bytes()},
        {"weight_format", model.weight_format()},
        {"bytes_per_token", r.weight_bytes_per_token + r.kv_bytes_per_token},
        {"bandwidth_gb_s", bw.read_gb_s},
        {"copy_bandwidth_gb_s", bw.copy_gb_s},
        {"bandwidth_beside_decode", beside},
        {"decode_floor_tok_s", floor_tok_s},
        {"decode_floor_fraction", fraction},
    };
    nlohmann::json runs = nlohmann::json::array();
    for (size_t i = 0; i < r.runs.size(); ++i) {
      const BenchRun& run = r.runs[i];
      runs.push_back({{"prefill_ms", run.prefill_ms}, {"ttft_ms", run.ttft_ms}, {"decode_ms", run.decode_ms},
                      {"bandwidth_gb_s", run_read[i]}, {"bandwidth_before_decode_gb_s", near[2 * i].read_gb_s},
                      {"bandwidth_after_decode_gb_s", near[2 * i + 1].read_gb_s},
                      {"decode_floor_fraction", run_fraction[i]}});
    }
    j["runs"] = runs;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model: %s (%s, %s), %d threads, simd %s\n", a.model_dir.c_str(), cfg.arch_name.c_str(),
              weights_text(model).c_str(), pool.size(), simd.c_str());
  std::printf("kernels: %s\n", kernels_description().c_str());
  std::printf("run: %d prompt tokens after %d of context, %d generated from depth %lld (%s); median of %d\n",
              b.prompt_tokens, b.context, b.gen_tokens, static_cast<long long>(r.runs.back().decode_depth),
              !b.decode_at_context    ? "after the prompt"
              : r.runs.back().rebuilt ? "the context's, rebuilt: this cache cannot rewind"
                                      : "the context's, the prompt rewound",
              b.repeat);
  std::printf("prefill: %.1f tok/s, time to first token %.1f ms\n", r.prefill_tok_s, r.ttft_ms);
  std::printf("decode: %.2f tok/s\n", r.decode_tok_s);
  if (sopts.use_cache)
    std::printf("kv cache: %s, %d tokens stored, logical %s, physical %s\n", sopts.kv.describe().c_str(), r.kv_stored,
                format_bytes(r.kv_logical_bytes).c_str(), format_bytes(r.kv_physical_bytes).c_str());
  if (sopts.use_cache && r.kv_layers.any_shared()) std::printf("%s\n", kv_layers_line(r.kv_layers).c_str());
  std::printf("peak RSS: %.1f MiB\n", rss_mib);
  if (beside)
    std::printf("memory bandwidth: read %.1f GB/s (runs %.1f-%.1f), copy %.1f GB/s (%d MiB, best of %d passes right "
                "before and after each run's decode; medians of the runs)\n",
                bw.read_gb_s, *bmin, *bmax, bw.copy_gb_s, a.bandwidth_mib, kBandwidthTrials);
  else
    std::printf("memory bandwidth: read %.1f GB/s, copy %.1f GB/s (%d MiB, best of %d passes after the runs)\n",
                bw.read_gb_s, bw.copy_gb_s, a.bandwidth_mib, kBandwidthTrials);
  std::printf("decode floor: %s read per token -> %.2f tok/s; achieved %.0f%% of it (median of the runs' "
              "fractions, %.0f-%.0f%%)\n",
              format_bytes(size_t(bytes_per_token)).c_str(), floor_tok_s, 100 * fraction, 100 * *fmin, 100 * *fmax);
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& root) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* app = root.add_subcommand("bench", "Measure prefill/decode speed, KV bytes, peak RSS and the decode floor");
  add_model_option(*app, a->model_dir, "Hugging Face model directory or .gguf file (no tokenizer needed)");
  app->add_option("--prompt-tokens,-p", a->bench.prompt_tokens, "Prompt tokens prefilled and timed")
      ->check(integer_at_least(1));
  app->add_option("--gen-tokens,-n", a->bench.gen_tokens, "Tokens decoded and timed")
      ->check(integer_at_least(1))
      ->each([a](const std::string&) { a->gen_given = true; });
  app->add_option("--repeat,-r", a->bench.repeat, "Runs; speeds are their median")
      ->check(integer_at_least(1));
  app->add_option("--context", a->bench.context, "Tokens already in the cache before the prompt")
      ->check(integer_at_least(0));
  app->add_flag("--decode-at-context", a->bench.decode_at_context,
                "Time decode from the --context depth, as llama-bench's tg test (-d): after the timed prompt the "
                "cache goes back to the context's tokens (rebuilt, untimed, where quantized or evicted tokens "
                "cannot rewind). Without it decode continues after the prompt, at depth context + prompt");
  app->add_option("--seed", a->bench.seed, "Seed of the random token ids")->check(unsigned_integer());
  app->add_option("--bandwidth-mib", a->bandwidth_mib, "Buffer of the memory-bandwidth test run beside each decode, MiB")
      ->check(integer_between(1, 1 << 16));
  app->add_flag("--json", a->json, "Print one JSON object instead of text (with --parallel: one per N)");
  app->add_option("--parallel", a->parallel,
                  "N[,N...]: N sequences prefilled one by one, then decoding together in batched steps");
  app->add_option("--shared-prefix", a->shared_prefix, "With --parallel: prompt tokens common to every sequence")
      ->check(integer_at_least(0));
  app->add_option("--kv-budget-mb", a->kv_budget_mb,
                  "With --parallel: MiB of KV blocks shared by the sequences (0: room for each at its worst)")
      ->check(integer_between(0, 1 << 20));
  add_spec_options(*app, a->spec);
  app->add_flag("--spec-verify-cost", a->verify_cost,
                "Time a pass verifying k drafted tokens (k + 1 rows) against a one-token step, for k = 1 to "
                "--spec-draft-max, after --prompt-tokens of random context (the ceiling of speculation's gain)");
  app->add_option("--cache-reuse", a->cache_reuse,
                  "Measure reuse after an edit instead: a history of --prompt-tokens, the same with --drop tokens "
                  "removed, runs of at least N tokens shifted; --gen-tokens of what follows scored (KL, NLL) "
                  "against a full recompute")
      ->check(integer_at_least(1));
  CLI::Option* drop = app->add_option("--drop", a->drop, "With --cache-reuse: tokens dropped from the history")
                          ->check(integer_at_least(1));
  CLI::Option* drop_at =
      app->add_option("--drop-at", a->drop_at, "With --cache-reuse: the first token dropped")->check(integer_at_least(0));
  CLI::Option* text =
      app->add_option("--text", a->text, "With --cache-reuse: a text file whose tokens are the history (else random ids)")
          ->check(CLI::ExistingFile);
  CLI::Option* trace = app->add_option("--trace", a->trace,
                                       "With --cache-reuse: a JSON list of turns ({\"prompt\": TEXT, \"reply\": TEXT} "
                                       "each), the reuse compounding turn after turn, each reply scored against a recompute")
                           ->check(CLI::ExistingFile)
                           ->excludes(drop)
                           ->excludes(drop_at)
                           ->excludes(text);
  app->add_option("--edit", a->edit,
                  "With --cache-reuse: HISTORY PROMPT CONTINUATION, text files of one edit: the earlier sequence, "
                  "the edited prompt, and the text scored after it")
      ->expected(3)
      ->check(CLI::ExistingFile)
      ->excludes(drop)
      ->excludes(drop_at)
      ->excludes(text)
      ->excludes(trace);
  add_runtime_options(*app, a->runtime);
  return {app, [a] { return run_bench_command(*a); }};
}

}  // namespace ptllm::cli
