#include "engine/conversation.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "engine/prompt_blocks.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {

Conversation::Conversation(const Model& model, const SessionOptions& opts, ThreadPool& pool, KVPool* kv_pool)
    : model_(model), opts_(opts), pool_(pool), kv_pool_(kv_pool),
      session_(std::make_unique<Session>(model, opts, pool, kv_pool)) {
  session_->adopt_only_explicitly();
}

void Conversation::reset() {
  session_.reset();  // its blocks go back to the pool first
  session_ = std::make_unique<Session>(model_, opts_, pool_, kv_pool_);
  session_->adopt_only_explicitly();
}

TurnPrefill Conversation::prefill(std::span<const int32_t> prompt, PromptBlockCache* cache) {
  PTLLM_CHECK(!prompt.empty());
  TurnPrefill t;
  t.prompt_tokens = int64_t(prompt.size());
  if (!opts_.kv.streaming() && t.prompt_tokens > opts_.kv.ctx_size)
    throw Error("the conversation has " + std::to_string(prompt.size()) + " tokens, more than --ctx-size " +
                std::to_string(opts_.kv.ctx_size) + " (start over with /reset, or a larger --ctx-size)");
  const std::vector<int32_t>& held = session_->history();
  const auto diff = std::mismatch(held.begin(), held.end(), prompt.begin(), prompt.end());
  const int64_t common = int64_t(diff.first - held.begin());
  if (common == t.prompt_tokens && common == int64_t(held.size()) && !session_->last_logits().empty()) {
    t.reused = common;  // the whole prompt is held, with its last logits
    return t;
  }
  // Keep at least the last prompt token to feed: its logits start the reply.
  int64_t keep = std::min(common, t.prompt_tokens - 1);
  if (keep < int64_t(held.size())) {
    const int64_t had = int64_t(held.size());
    try {
      session_->truncate(keep);
      t.rewound = common < had;
      if (common < had)
        t.note = "the template rendered the conversation differently from what the session holds: rewound from " +
                 std::to_string(had) + " to " + std::to_string(keep) + " tokens";
    } catch (const Error& e) {
      reset();
      t.fresh = true;
      t.note = std::string("cannot rewind (") + e.what() + "): a new session prefills the whole conversation";
      keep = 0;
    }
  }
  if (session_->history().empty() && cache != nullptr && session_->has_cache()) {
    const PromptBlockLoad load = cache->prefill(*session_, prompt);
    t.from_cache = t.reused = load.reused;
    t.prefilled = t.prompt_tokens - load.reused;
    return t;
  }
  t.reused = keep;
  t.prefilled = t.prompt_tokens - keep;
  session_->feed(prompt.subspan(size_t(keep)));
  if (cache != nullptr && session_->has_cache()) cache->save(*session_, false);  // this turn's blocks
  return t;
}

std::vector<int32_t> stop_token_ids(const std::filesystem::path& model_dir, const ModelConfig& cfg,
                                    const Tokenizer& tok) {
  std::vector<int32_t> ids(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());
  if (tok.eos_id()) ids.push_back(*tok.eos_id());
  const std::filesystem::path gen = model_dir / "generation_config.json";
  std::error_code ec;
  if (std::filesystem::exists(gen, ec)) {
    const nlohmann::json j =
        nlohmann::json::parse(read_whole_file(gen, kMaxJsonConfigBytes, "generation_config.json"), nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw Error(gen.string() + ": not a valid JSON object");
    if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
      const nlohmann::json list = it->is_array() ? *it : nlohmann::json::array({*it});
      for (const auto& e : list) {
        if (!e.is_number_integer()) throw Error(gen.string() + ": eos_token_id: expected a token id or a list of them");
        ids.push_back(e.get<int32_t>());
      }
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace ptllm
