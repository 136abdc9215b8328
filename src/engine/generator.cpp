#include "engine/generator.h"

#include <algorithm>

namespace ptllm {

const char* stop_reason_key(StopReason r) {
  switch (r) {
    case StopReason::Eos: return "eos";
    case StopReason::StopString: return "stop_string";
    case StopReason::TokenLimit: return "token_limit";
    case StopReason::ContextFull: return "context_full";
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
    : o_(std::move(o)), sampler_(sampler), detok_(tok, !o_.keep_special), stop_(o_.stops) {
  if (!sampler_) sampler_ = &own_sampler_.emplace(o_.sampling);
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
  s.id = sampler_->sample(logits, history);
  ++sampled_;
  const bool eos = std::find(o_.eos_ids.begin(), o_.eos_ids.end(), s.id) != o_.eos_ids.end();
  if (eos && !o_.ignore_eos) {
    stop(StopReason::Eos);
    return s;
  }
  s.accepted = true;
  tokens_.push_back(s.id);
  s.text = stop_.push(detok_.push(s.id));
  if (stop_.stopped()) {
    stop_string_ = stop_.found();
    stop(StopReason::StopString);
  } else if (o_.max_tokens >= 0 && sampled_ >= o_.max_tokens) {
    stop(StopReason::TokenLimit);
  } else if (!fits) {
    stop(StopReason::ContextFull);
  }
  return s;
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
