#include "cli/speculation.h"

#include <cstdio>

#include "cli/options.h"
#include "core/error.h"

namespace ptllm::cli {

void add_spec_options(CLI::App& app, SpecArgs& a) {
  app.add_option("--spec-type", a.type,
                 "Speculative decoding: none; ngram (what followed the last tokens' most recent earlier "
                 "occurrence); suffix (the most frequent continuations, drafts of adaptive length). Drafts are "
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
  app.add_option("--model-draft", a.model_draft, "Draft model (not supported yet: use --spec-type ngram)");
}

SpecOptions spec_options(const SpecArgs& a) {
  if (!a.model_draft.empty())
    throw UsageError("--model-draft: a draft model is not supported yet; --spec-type ngram drafts from the "
                     "prompt and the reply instead");
  SpecOptions o = a.opts;
  o.type = parse_spec_type(a.type);
  o.adaptive = !a.fixed;
  if (o.draft_min > o.draft_max)
    throw UsageError("--spec-draft-min " + std::to_string(o.draft_min) + " is more than --spec-draft-max " +
                     std::to_string(o.draft_max));
  if (o.ngram_min > o.ngram_max)
    throw UsageError("--spec-ngram-min " + std::to_string(o.ngram_min) + " is more than --spec-ngram-max " +
                     std::to_string(o.ngram_max));
  return o;
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
