#pragma once
// One generating sequence's decode logic, written once for `sample`, `chat` and the server's
// scheduler: a chain of logits processors (logit_bias now; a grammar mask and speculative
// verification plug in here), the sampler (penalties, then the sampling cuts), the EOS set
// (generation_config.json's list), the incremental detokenizer, stop strings, the token limit and
// the context check, in that order, with one stop reason. The caller owns the model: it passes each
// step's logits and feeds the tokens the generator accepts.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/constraint.h"
#include "engine/stop_text.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {

// Why a generation ended. Eos, StopString, TokenLimit and ContextFull come from the generator;
// the others from its caller (Ctrl-C, a closed stdout, a client gone, a failure).
// Grammar: the constraint's grammar is complete and nothing can follow.
enum class StopReason { Eos, StopString, TokenLimit, ContextFull, Grammar, Interrupted, OutputClosed, Cancelled, Error };
// "eos", "stop_string", "token_limit", "context_full", "grammar", "interrupted", "output_closed",
// "cancelled", "error".
const char* stop_reason_key(StopReason r);

// Changes a step's logits [vocab] before sampling; `history` is the prompt and the tokens so far.
using LogitsProcessor = std::function<void(std::span<float> logits, std::span<const int32_t> history)>;

// A generated token's log-probability under the model (log-softmax of the logits after the
// processors, before the sampler's penalties and cuts), with the most likely alternatives.
struct TokenLogprob {
  struct Entry {
    int32_t id = 0;
    std::string text;  // the token's own text (decoded alone, special tokens included)
    float logprob = 0;
  };
  Entry chosen;
  std::vector<Entry> top;  // top_logprobs of them, most likely first
};

struct GeneratorOptions {
  SamplingConfig sampling;
  std::vector<std::string> stops;  // non-empty strings; the text ends where the first one begins
  std::vector<int32_t> eos_ids;    // ids that end the generation (stop_token_ids)
  bool ignore_eos = false;         // EOS is kept and the generation goes on
  int max_tokens = -1;             // ids sampled at most (an ending EOS included); -1: no limit
  bool keep_special = false;       // special tokens' text is kept in the output
  // OpenAI's logit_bias: added to a token's logit before sampling (-100 bans it, +100 all but forces it).
  std::vector<std::pair<int32_t, float>> logit_bias;
  int top_logprobs = -1;  // -1: no log-probabilities; n >= 0: each step's, with n alternatives
  // A grammar the output must follow (engine/constraint.h), applied after the processors.
  std::shared_ptr<const ConstraintSpec> constraint;
};

class Generator {
 public:
  Generator(const Tokenizer& tok, GeneratorOptions o);
  // With a sampler the caller keeps (chat: one random stream across the turns); o.sampling unused.
  Generator(const Tokenizer& tok, GeneratorOptions o, Sampler& sampler);

  struct Step {
    int32_t id = -1;        // the sampled id
    bool accepted = false;  // the id is part of the output (not an ending EOS)
    std::string text;       // text now safe to show (stop strings held back)
    std::optional<TokenLogprob> logprob;  // with top_logprobs >= 0
  };
  // One step from the logits of the last fed token (modified in place). `fits`: whether the context
  // has room to feed one more token. After it, done() says whether the generation ended; if not, the
  // caller feeds step.id and calls next() again with the new logits.
  Step next(std::span<float> logits, std::span<const int32_t> history, bool fits);
  // The caller ends the generation (Ctrl-C, a client gone, ...); no-op once done.
  void stop(StopReason why);
  // The text held back, once: the detokenizer's last bytes through the stop strings (unless one was
  // met). A stop string those bytes complete sets StopString.
  std::string finish();

  void add_processor(LogitsProcessor p) { processors_.push_back(std::move(p)); }
  bool done() const { return done_; }
  StopReason reason() const { return reason_; }
  const std::string& error() const { return error_; }  // reason Error set by the generator: why
  const std::string& stop_string() const { return stop_string_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }  // accepted ids
  int sampled() const { return sampled_; }                        // ids sampled, an ending EOS included
  const GeneratorOptions& options() const { return o_; }

 private:
  Generator(const Tokenizer& tok, GeneratorOptions o, Sampler* sampler);
  TokenLogprob::Entry entry(int32_t id, float logprob) const;
  const Tokenizer& tok_;
  GeneratorOptions o_;
  std::vector<LogitsProcessor> processors_;
  std::vector<float> scratch_;  // [vocab] the logits before sampling (log-probabilities)
  std::vector<int32_t> order_;  // [vocab] ids, partly sorted for the top alternatives
  std::optional<Sampler> own_sampler_;
  std::optional<Constraint> constraint_;
  Sampler* sampler_;
  StreamingDetokenizer detok_;
  StopText stop_;
  std::vector<int32_t> tokens_;
  int sampled_ = 0;
  bool done_ = false, finished_ = false;
  StopReason reason_ = StopReason::TokenLimit;
  std::string stop_string_;
  std::string error_;
};

}  // namespace ptllm
