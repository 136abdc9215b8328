#include "cli/speculation.h"

#include <cstdio>

#include "cli/options.h"
#include "core/error.h"
#include "engine/drafter_model.h"
#include "engine/runtime.h"

namespace ptllm::cli {

void add_spec_options(CLI::App& app, SpecArgs& a) {
  app.add_option("--spec-type", a.type,
                 "Speculative decoding: none; ngram (what followed the last tokens' most recent earlier "
                 "occurrence); suffix (the most frequent continuations, drafts of adaptive length); draft (a "
                 "draft model, --model-draft). Drafts are "
                 "verified in one pass, the output is the same, and it turns itself off where it does not pay")
      ->default_str("none");
  app.add_option("--spec-draft-max", a.opts.draft_max, "Most tokens drafted for one verification")
      ->check(integer_at_least(1))
      ->default_str("16");
  app.add_option("--spec-draft-min", a.opts.draft_min, "Fewer drafted tokens than this: a plain step instead")
      ->check(integer_at_least(1))
      ->default_str("1");
  app.add_option("--spec-ngram-max", a.opts.ngram_max, "ngram drafter: the longest n-gram looked up")
      ->check(integer_at_least(1))
      ->default_str("4");
  app.add_option("--spec-ngram-min", a.opts.ngram_min, "ngram drafter: the shortest n-gram looked up")
      ->check(integer_at_least(1))
      ->default_str("1");
  app.add_flag("--spec-fixed", a.fixed,
               "Verify every draft offered (no adaptivity: speculation stays on where it measures a loss)");
  app.add_option("--model-draft", a.model_draft,
                 "Draft model (a directory or a GGUF file) with the model's vocabulary; implies --spec-type draft");
}

SpecOptions spec_options(const SpecArgs& a) {
  SpecOptions o = a.opts;
  o.type = parse_spec_type(a.type);
  if (!a.model_draft.empty()) {
    if (o.type != SpecType::None && o.type != SpecType::Draft)
      throw UsageError("--model-draft with --spec-type " + a.type + ": a draft model is --spec-type draft");
    o.type = SpecType::Draft;
  } else if (o.type == SpecType::Draft) {
    throw UsageError("--spec-type draft: give the draft model with --model-draft DIR|FILE");
  }
  o.adaptive = !a.fixed;
  if (o.draft_min > o.draft_max)
    throw UsageError("--spec-draft-min " + std::to_string(o.draft_min) + " is more than --spec-draft-max " +
                     std::to_string(o.draft_max));
  if (o.ngram_min > o.ngram_max)
    throw UsageError("--spec-ngram-min " + std::to_string(o.ngram_min) + " is more than --spec-ngram-max " +
                     std::to_string(o.ngram_max));
  return o;
}

std::unique_ptr<DraftModel> load_draft_model(const SpecArgs& a, SpecOptions& o, const Tokenizer& target,
                                             const std::string& target_name, ThreadPool& pool, int ctx_size) {
  if (a.model_draft.empty()) return nullptr;
  auto d = std::make_unique<DraftModel>();
  try {
    d->model = Model::load(a.model_draft);
    const Tokenizer tok = load_tokenizer(a.model_draft);
    check_same_vocabulary(target, tok, target_name, a.model_draft);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError("--model-draft " + a.model_draft + ": " + e.what());
  }
  o.draft_model = d->model.get();
  o.draft_pool = &pool;
  o.draft_ctx = ctx_size;
  return d;
}

std::string spec_line(const SpecOptions& o, const SpecStats& s) {
  if (o.type == SpecType::None) return "";
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "speculation: %s%s, drafted %lld, accepted %lld (%.1f%%), %lld verification steps (%.2f tokens "
                "each), %lld plain steps",
                spec_type_name(o.type), o.adaptive ? "" : " (fixed)", (long long)s.drafted, (long long)s.accepted,
                100 * s.acceptance(), (long long)s.verify_steps, s.tokens_per_verify(), (long long)s.plain_steps);
  return buf;
}

nlohmann::json spec_json(const SpecOptions& o, const SpecStats& s) {
  if (o.type == SpecType::None) return nullptr;
  return {{"type", spec_type_name(o.type)},
          {"adaptive", o.adaptive},
          {"draft_max", o.draft_max},
          {"drafted", s.drafted},
          {"accepted", s.accepted},
          {"acceptance", s.acceptance()},
          {"verify_steps", s.verify_steps},
          {"tokens_per_verify", s.tokens_per_verify()},
          {"plain_steps", s.plain_steps}};
}

}  // namespace ptllm::cli
