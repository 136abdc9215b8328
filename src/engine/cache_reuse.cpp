#include "engine/cache_reuse.h"

#include <algorithm>
#include <optional>
#include <cmath>

#include "core/error.h"

#include "engine/session.h"

namespace ptllm {

CachedHistory cached_history(const Session& s) {
  CachedHistory h;
  h.tokens = s.history();
  const KVCache& c = s.cache();
  if (c.shifted_from() >= 0) h.shifted = {c.pool().complete_blocks(c.shifted_from()), c.shift_salt()};
  return h;
}

std::vector<ReuseChunk> plan_cache_reuse(std::span<const int32_t> cached, int64_t cached_avail,
                                         std::span<const int32_t> prompt, int64_t from, int64_t min_len,
                                         int64_t max_gap) {
  std::vector<ReuseChunk> out;
  const int64_t n_c = std::min<int64_t>(cached_avail, int64_t(cached.size()));
  const int64_t n_p = int64_t(prompt.size()) - 1;  // the last token is computed
  int64_t common = 0;
  while (common < std::min(n_c, int64_t(prompt.size())) && cached[size_t(common)] == prompt[size_t(common)]) ++common;
  int64_t head_c = std::min(from, common), head_p = from;
  // The rest of the common prefix (exact adoption takes whole blocks, or a KIVI grid): a run at
  // the same positions, whatever its length.
  if (common > from && from < n_p) {
    const int64_t n = std::min(common, n_p) - from;
    out.push_back({from, from, n});
    head_c += n;
    head_p += n;
  }
  auto match = [&](int64_t c, int64_t p) {
    int64_t n = 0;
    while (c + n < n_c && p + n < n_p && cached[size_t(c + n)] == prompt[size_t(p + n)]) ++n;
    return n;
  };
  if (max_gap == 0) {
    while (head_c < n_c && head_p < n_p) {
      const int64_t n = match(head_c, head_p);
      if (n >= min_len) {
        out.push_back({head_c, head_p, n});
        head_c += n;
        head_p += n;
      } else {
        ++head_c;  // a cached token the prompt dropped
      }
    }
    return out;
  }
  // With gaps: the run nearest in the prompt of at least min_len: the first after the last run in the
  // history, else the first before it (a turn the harness moved: runs out of order).
  while (head_p < n_p) {
    bool found = false;
    for (int64_t g = 0; g <= max_gap && head_p + g < n_p && !found; ++g)
      for (int64_t i = 0; i < n_c && !found; ++i) {
        const int64_t c = head_c + i < n_c ? head_c + i : head_c + i - n_c;
        if (cached[size_t(c)] != prompt[size_t(head_p + g)]) continue;
        const int64_t n = match(c, head_p + g);
        if (n < min_len) continue;
        out.push_back({c, head_p + g, n});
        head_c = c + n;
        head_p += g + n;
        found = true;
      }
    if (!found) break;
  }
  return out;
}

int64_t apply_cache_reuse(Session& session, KVPool& pool, const CachedHistory& history,
                          std::span<const int32_t> prompt, std::span<const ReuseChunk> chunks, uint64_t salt,
                          size_t reserve_dense) {
  const KVShape& shape = pool.shape();
  const int64_t B = pool.config().group_size;
  const size_t kvd = size_t(shape.kv_dim());
  std::vector<BlockHash> hashes;
  const size_t n_blocks = pool.complete_blocks(int64_t(history.tokens.size()));
  pool.extend_block_hashes(history.tokens, n_blocks, hashes, history.shifted);
  // The history's blocks the chunks read are held for the whole reuse (the copies take blocks the
  // pool might otherwise reclaim them for): held[at[j] + s] is block j of the s-th storing layer.
  std::vector<int32_t> held;
  struct Release {
    KVPool& pool;
    std::vector<int32_t>& held;
    ~Release() { pool.release_held(held); }
  } release{pool, held};
  std::vector<int64_t> at(n_blocks, -1);
  std::vector<ReuseChunk> plan;
  for (ReuseChunk c : chunks) {
    int64_t len = 0;
    for (int64_t j = c.src / B; j * B < c.src + c.len; ++j) {
      if (size_t(j) >= n_blocks) break;
      if (at[size_t(j)] < 0) {
        const KVPool::TokenRange tb = pool.token_block(size_t(j));
        const auto ids = std::span<const int32_t>(history.tokens).subspan(size_t(tb.start), size_t(tb.len));
        const int64_t base = int64_t(held.size());
        if (!pool.hold_block_any(hashes[size_t(j)], ids, held)) break;
        at[size_t(j)] = base;
      }
      len = std::min(c.src + c.len, (j + 1) * B) - c.src;
    }
    if (len > 0) plan.push_back({c.src, c.dst, len});
    if (len < c.len) break;  // a block the pool no longer holds: the rest is computed
  }
  std::vector<float> bk(size_t(B) * kvd), bv(size_t(B) * kvd);
  int64_t done = 0;
  for (const ReuseChunk& c : plan) {
    PTLLM_CHECK(c.dst == session.position());
    for (int64_t off = 0; off < c.len;) {
      const int64_t T = std::min<int64_t>(c.len - off, session.max_chunk()), src = c.src + off;
      if (!session.fits(T)) return done;
      const BlocksNeeded need = session.cache().blocks_needed(int(T));
      if (need.dense + reserve_dense > pool.dense().available() || need.quant > pool.quant().available()) return done;
      session.append_shifted(prompt.subspan(size_t(c.dst + off), size_t(T)), c.dst - c.src, salt,
                             [&](int layer, float* k, float* v) {
                               size_t s = 0;  // layer's index among the storing layers
                               for (int l = 0; l < layer; ++l) s += shape.stores(l) ? 1 : 0;
                               for (int64_t t = 0; t < T;) {
                                 const int64_t j = (src + t) / B, slot = (src + t) % B;
                                 const int64_t n = std::min<int64_t>(B - slot, T - t);
                                 pool.read_rows(held[size_t(at[size_t(j)]) + s], int(slot + n), bk.data(), bv.data());
                                 std::copy_n(bk.data() + size_t(slot) * kvd, size_t(n) * kvd, k + size_t(t) * kvd);
                                 std::copy_n(bv.data() + size_t(slot) * kvd, size_t(n) * kvd, v + size_t(t) * kvd);
                                 t += n;
                               }
                             });
      off += T;
      done += T;
    }
  }
  return done;
}

std::string cache_reuse_error(int64_t min_len, const KVCacheConfig& kv, std::string_view name) {
  const std::string n(name);
  if (min_len < 0) return n + " must not be negative (0: exact prefix reuse only)";
  if (min_len == 0) return "";
  if (min_len < kv.group_size)
    return n + " " + std::to_string(min_len) + " is below the KV block size of " + std::to_string(kv.group_size) +
           " tokens (--kv-group-size): a chunk shorter than a block is never shifted";
  if (kv.streaming())
    return n + ": StreamingLLM (--streaming-llm-window) already moves positions; shifting a reused chunk is not "
               "built for it";
  return "";
}

}  // namespace ptllm

namespace ptllm {

namespace {

// log-softmax of each row of logits [rows][vocab].
std::vector<double> log_softmax_rows(std::span<const float> logits, size_t vocab) {
  std::vector<double> out(logits.size());
  for (size_t r = 0; r < logits.size() / vocab; ++r) {
    const float* x = logits.data() + r * vocab;
    const double m = *std::max_element(x, x + vocab);
    double z = 0;
    for (size_t i = 0; i < vocab; ++i) z += std::exp(double(x[i]) - m);
    const double lz = m + std::log(z);
    for (size_t i = 0; i < vocab; ++i) out[r * vocab + i] = double(x[i]) - lz;
  }
  return out;
}

// Feeds prompt[from..] and the scored tokens; returns the log-probabilities of the rows that
// predict each scored token [score][vocab].
std::vector<double> score_after(Session& s, std::span<const int32_t> prompt, std::span<const int32_t> scored) {
  const int64_t n = int64_t(prompt.size()), pos = s.position();
  if (pos < n - 1) s.feed(prompt.subspan(size_t(pos), size_t(n - 1 - pos)));
  std::vector<int32_t> tail{prompt.back()};
  tail.insert(tail.end(), scored.begin(), scored.end() - 1);
  const auto logits = s.feed_all(tail);
  return log_softmax_rows(logits, size_t(s.model().config().vocab_size));
}

// KL(reference || other) per scored row (nats), its mean and max; the other's mean NLL of the scored
// tokens; the rows whose argmax agrees. Null outputs are skipped.
void compare_rows(const std::vector<double>& lp_ref, const std::vector<double>& lp, std::span<const int32_t> scored,
                  size_t vocab, double* kl_max, double* kl_mean, double* nll, double* agree) {
  const int64_t n_scored = int64_t(scored.size());
  double sum = 0;
  for (int64_t r = 0; r < n_scored; ++r) {
    const double* p = lp_ref.data() + size_t(r) * vocab;
    const double* q = lp.data() + size_t(r) * vocab;
    double kl = 0;
    for (size_t i = 0; i < vocab; ++i) kl += std::exp(p[i]) * (p[i] - q[i]);
    sum += kl;
    *kl_max = std::max(*kl_max, kl);
    if (nll) *nll -= q[size_t(scored[size_t(r)])] / double(n_scored);
    if (agree && std::max_element(p, p + vocab) - p == std::max_element(q, q + vocab) - q)
      *agree += 1.0 / double(n_scored);
  }
  if (kl_mean) *kl_mean = sum / double(n_scored);
}

}  // namespace

ReuseMeasurement measure_cache_reuse(const Model& model, const SessionOptions& opts, ThreadPool& threads,
                                     std::span<const int32_t> text, const ReuseMeasureConfig& cfg) {
  const int64_t hist_n = cfg.keep + cfg.drop + cfg.rest;
  PTLLM_CHECK(cfg.keep >= 0 && cfg.drop > 0 && cfg.rest > 0 && cfg.score > 0);
  if (int64_t(text.size()) < hist_n + cfg.score)
    throw UsageError("the text has " + std::to_string(text.size()) + " tokens; the measurement needs " +
                     std::to_string(hist_n + cfg.score));
  const auto history = text.first(size_t(hist_n));
  std::vector<int32_t> prompt(text.begin(), text.begin() + cfg.keep);
  prompt.insert(prompt.end(), text.begin() + cfg.keep + cfg.drop, text.begin() + hist_n);
  return measure_cache_reuse(model, opts, threads, history, prompt, text.subspan(size_t(hist_n), size_t(cfg.score)),
                             cfg.min_len);
}

ReuseMeasurement measure_cache_reuse(const Model& model, const SessionOptions& opts, ThreadPool& threads,
                                     std::span<const int32_t> history, std::span<const int32_t> prompt,
                                     std::span<const int32_t> scored, int min_len, int64_t max_gap) {
  PTLLM_CHECK(!history.empty() && prompt.size() >= 2 && !scored.empty());
  const int64_t n_scored = int64_t(scored.size());
  const size_t vocab = size_t(model.config().vocab_size);
  ReuseMeasurement m;
  m.prompt_tokens = int64_t(prompt.size());

  Session ref(model, opts, threads);  // a private pool: everything computed
  const std::vector<double> lp_ref = score_after(ref, prompt, scored);

  KVPool pool(model.kv_shape(), opts.kv, 3);
  CachedHistory cached;
  {
    Session a(model, opts, threads, &pool);
    a.feed(history);
    cached = cached_history(a);
  }
  // Adoption ends on the prefill grid where the cut matters (KIVI), as the server's does.
  auto adopt = [&](Session& s) {
    const int64_t grid = s.cache().cut_dependent() ? s.max_chunk() : 1;
    return s.adopt_prefix(prompt, [&](int64_t a) { return a % grid == 0; });
  };
  auto compare = [&](const std::vector<double>& lp, double* kl_max, double* kl_mean, double* nll, double* agree) {
    compare_rows(lp_ref, lp, scored, vocab, kl_max, kl_mean, nll, agree);
  };
  // Shifted first: its blocks go under a salted chain, so exact reuse after it still finds only the
  // history's (an exact run first would publish the whole prompt for the next to adopt).
  {
    Session s(model, opts, threads, &pool);
    const int64_t adopted = adopt(s);
    const int64_t B = opts.kv.group_size;
    const int64_t gap = std::min<int64_t>(max_gap, s.max_chunk());
    const auto plan = plan_cache_reuse(cached.tokens, int64_t(pool.complete_blocks(int64_t(history.size()))) * B,
                                       prompt, adopted, min_len, gap);
    // As the server: the tokens before each run computed, then the run shifted.
    for (const ReuseChunk& c : plan) {
      if (c.dst > s.position()) s.feed(prompt.subspan(size_t(s.position()), size_t(c.dst - s.position())));
      const int64_t got = apply_cache_reuse(s, pool, cached, prompt, std::span(&c, 1), 1, 0);
      m.shifted += got;
      if (got < c.len) break;
    }
    m.computed_reuse = m.prompt_tokens - adopted - m.shifted;
    compare(score_after(s, prompt, scored), &m.kl_max, &m.kl_mean, &m.nll_reuse, &m.top1_agreement);
  }
  {
    Session e(model, opts, threads, &pool);
    m.adopted = adopt(e);
    m.computed_exact = m.prompt_tokens - m.adopted;
    compare(score_after(e, prompt, scored), &m.kl_exact_max, nullptr, nullptr, nullptr);
  }
  for (int64_t r = 0; r < n_scored; ++r) m.nll_reference -= lp_ref[size_t(r) * vocab + size_t(scored[size_t(r)])];
  m.nll_reference /= double(n_scored);
  return m;
}

std::vector<ReuseMeasurement> measure_cache_reuse_trace(const Model& model, const SessionOptions& opts,
                                                        ThreadPool& threads, std::span<const TraceTurn> turns,
                                                        int min_len, int64_t max_gap) {
  const size_t vocab = size_t(model.config().vocab_size);
  // Two servers side by side: one that shifts (its histories compound), one that adopts exact
  // prefixes only. Each pool keeps room for a turn and the blocks of the one before.
  KVPool reuse_pool(model.kv_shape(), opts.kv, 3), exact_pool(model.kv_shape(), opts.kv, 3);
  std::optional<CachedHistory> held;
  std::vector<ReuseMeasurement> out;
  auto adopt = [](Session& s, std::span<const int32_t> prompt) {
    s.adopt_only_explicitly();
    const int64_t grid = s.cache().cut_dependent() ? s.max_chunk() : 1;
    return s.adopt_prefix(prompt, [&](int64_t a) { return a % grid == 0; });
  };
  for (size_t t = 0; t < turns.size(); ++t) {
    const std::span<const int32_t> prompt = turns[t].prompt, scored = turns[t].scored;
    PTLLM_CHECK(prompt.size() >= 2 && !scored.empty());
    ReuseMeasurement m;
    m.prompt_tokens = int64_t(prompt.size());
    std::vector<double> lp_ref;
    {
      Session ref(model, opts, threads);  // a private pool: everything computed
      lp_ref = score_after(ref, prompt, scored);
    }
    {
      Session s(model, opts, threads, &reuse_pool);
      const int64_t adopted = adopt(s, prompt);
      if (held) {
        const int64_t gap = std::min<int64_t>(max_gap, s.max_chunk());
        const auto plan = plan_cache_reuse(held->tokens,
                                           int64_t(reuse_pool.complete_blocks(int64_t(held->tokens.size()))) *
                                               opts.kv.group_size,
                                           prompt, adopted, min_len, gap);
        for (const ReuseChunk& c : plan) {
          if (c.dst > s.position()) s.feed(prompt.subspan(size_t(s.position()), size_t(c.dst - s.position())));
          const int64_t got = apply_cache_reuse(s, reuse_pool, *held, prompt, std::span(&c, 1), uint64_t(t + 1), 0);
          m.shifted += got;
          if (got < c.len) break;
        }
      }
      m.computed_reuse = m.prompt_tokens - adopted - m.shifted;
      compare_rows(lp_ref, score_after(s, prompt, scored), scored, vocab, &m.kl_max, &m.kl_mean, &m.nll_reuse,
                   &m.top1_agreement);
      held = cached_history(s);  // the session's blocks stay in the pool, findable, once it ends
    }
    {
      Session e(model, opts, threads, &exact_pool);
      m.adopted = adopt(e, prompt);
      m.computed_exact = m.prompt_tokens - m.adopted;
      compare_rows(lp_ref, score_after(e, prompt, scored), scored, vocab, &m.kl_exact_max, nullptr, nullptr, nullptr);
    }
    for (size_t r = 0; r < scored.size(); ++r) m.nll_reference -= lp_ref[r * vocab + size_t(scored[r])];
    m.nll_reference /= double(scored.size());
    out.push_back(m);
  }
  return out;
}

}  // namespace ptllm
