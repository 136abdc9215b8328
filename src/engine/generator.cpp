#include "engine/generator.h"

#include <algorithm>
#include <cmath>

namespace ptllm {

const char* stop_reason_key(StopReason r) {
  switch (r) {
    case StopReason::Eos: return "eos";
    case StopReason::StopString: return "stop_string";
    case StopReason::TokenLimit: return "token_limit";
    case StopReason::ContextFull: return "context_full";
    case StopReason::Grammar: return "grammar";
    case StopReason::Interrupted: return "interrupted";
    case StopReason::OutputClosed: return "output_closed";
    case StopReason::Cancelled: return "cancelled";
    case StopReason::Error: return "error";
  }
  return "error";
}

Generator::Generator(const Tokenizer& tok, GeneratorOptions o) : Generator(tok, std::move(o), nullptr) {}

Generator::Generator(const Tokenizer& tok, GeneratorOptions o, Sampler& sampler)
    : Generator(tok, std::move(o), &sampler) {}

Generator::Generator(const Tokenizer& tok, GeneratorOptions o, Sampler* sampler)
    : tok_(tok), o_(std::move(o)), sampler_(sampler), detok_(tok, !o_.keep_special), stop_(o_.stops) {
  if (!sampler_) sampler_ = &own_sampler_.emplace(o_.sampling);
  if (o_.constraint) constraint_.emplace(o_.constraint, GrammarVocab::of(tok_));
  if (!o_.logit_bias.empty())
    add_processor([bias = o_.logit_bias](std::span<float> logits, std::span<const int32_t>) {
      for (const auto& [id, b] : bias)
        if (id >= 0 && size_t(id) < logits.size()) logits[size_t(id)] += b;
    });
}

Generator::Step Generator::next(std::span<float> logits, std::span<const int32_t> history, bool fits) {
  Step s;
  if (done_) return s;
  for (const LogitsProcessor& p : processors_) p(logits, history);
  if (constraint_ && !constraint_->mask(logits, o_.eos_ids)) {
    error_ = "no token of the vocabulary can continue the grammar";
    stop(StopReason::Error);
    return s;
  }
  float lse = 0;
  if (o_.top_logprobs >= 0) {  // the sampler modifies the logits: keep them
    scratch_.assign(logits.begin(), logits.end());
    const float mx = *std::max_element(scratch_.begin(), scratch_.end());
    double sum = 0;
    for (float v : scratch_) sum += std::exp(double(v - mx));
    lse = mx + float(std::log(sum));
  }
  s.id = sampler_->sample(logits, history);
  if (o_.top_logprobs >= 0) {
    TokenLogprob lp;
    lp.chosen = entry(s.id, scratch_[size_t(s.id)] - lse);
    const size_t k = std::min(size_t(o_.top_logprobs), scratch_.size());
    std::vector<int32_t>& ids = order_;
    ids.resize(scratch_.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(),
                      [&](int32_t a, int32_t b) { return scratch_[size_t(a)] > scratch_[size_t(b)] || (scratch_[size_t(a)] == scratch_[size_t(b)] && a < b); });
    for (size_t i = 0; i < k && std::isfinite(scratch_[size_t(ids[i])]); ++i)  // a grammar's bans
      lp.top.push_back(entry(ids[i], scratch_[size_t(ids[i])] - lse));
    s.logprob = std::move(lp);
  }
  ++sampled_;
  const bool eos = std::find(o_.eos_ids.begin(), o_.eos_ids.end(), s.id) != o_.eos_ids.end();
  if (eos && !o_.ignore_eos) {
    stop(StopReason::Eos);
    return s;
  }
  s.accepted = true;
  tokens_.push_back(s.id);
  if (constraint_) constraint_->accept(s.id);
  s.text = stop_.push(detok_.push(s.id));
  if (stop_.stopped()) {
    stop_string_ = stop_.found();
    stop(StopReason::StopString);
  } else if (constraint_ && constraint_->complete()) {
    stop(StopReason::Grammar);
  } else if (o_.max_tokens >= 0 && sampled_ >= o_.max_tokens) {
    stop(StopReason::TokenLimit);
  } else if (!fits) {
    stop(StopReason::ContextFull);
  }
  return s;
}

TokenLogprob::Entry Generator::entry(int32_t id, float logprob) const {
  const int32_t one[] = {id};
  return {id, tok_.decode(one, /*skip_special=*/false), logprob};
}

void Generator::stop(StopReason why) {
  if (done_) return;
  done_ = true;
  reason_ = why;
}

std::string Generator::finish() {
  if (finished_) return {};
  finished_ = true;
  if (stop_.stopped()) return {};
  std::string rest = stop_.close(detok_.finish());
  if (stop_.stopped()) {  // the detokenizer's last bytes completed a stop string
    stop_string_ = stop_.found();
    reason_ = StopReason::StopString;
    done_ = true;
  }
  return rest;
}

}  // namespace ptllm
