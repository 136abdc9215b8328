#include "engine/constraint.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <list>
#include <map>
#include <mutex>

namespace ptllm {

namespace {

std::vector<bool> special_flags(const Tokenizer& tok, size_t n) {
  std::vector<bool> out(n);
  for (size_t id = 0; id < n; ++id) out[id] = tok.is_special(int32_t(id));
  return out;
}

}  // namespace

GrammarVocab::GrammarVocab(const Tokenizer& tok)
    : bytes_(tok.token_bytes()), special_(special_flags(tok, bytes_.size())), trie_(bytes_, special_) {
  static std::atomic<uint64_t> next{1};
  serial_ = next++;
  for (size_t id = 0; id < special_.size(); ++id)
    if (special_[id]) special_ids_.push_back(int32_t(id));
}

std::shared_ptr<const GrammarVocab> GrammarVocab::of(const Tokenizer& tok) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const GrammarVocab>> cache;
  std::lock_guard<std::mutex> lock(mu);
  std::weak_ptr<const GrammarVocab>& slot = cache[tok.fingerprint()];
  if (auto v = slot.lock()) return v;
  auto v = std::make_shared<const GrammarVocab>(tok);
  slot = v;
  return v;
}

bool empty_language(const grammar::Grammar& g) {
  // Productive rules, to a fixed point: a rule is productive when one of its alternatives holds
  // only characters and productive rules.
  const auto& rules = g.rules();
  const auto& el = g.elements();
  std::vector<bool> productive(rules.size());
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules.size(); ++r) {
      if (productive[r]) continue;
      for (uint32_t start : rules[r]) {
        bool ok = true;
        for (uint32_t i = start; el[i].kind != grammar::Element::Kind::End && ok; ++i)
          ok = el[i].kind == grammar::Element::Kind::Char || productive[el[i].index];
        if (ok) {
          productive[r] = changed = true;
          break;
        }
      }
    }
  }
  return !productive[g.root()];
}

namespace {

struct KeptGrammar {
  std::string text;
  std::shared_ptr<const grammar::Grammar> grammar;
  std::shared_ptr<MaskCache> masks = std::make_shared<MaskCache>();
};
std::mutex kept_mu;
std::list<KeptGrammar> kept;  // most recent first

std::shared_ptr<MaskCache> mask_cache_of(const grammar::Grammar* g) {
  std::lock_guard<std::mutex> lock(kept_mu);
  for (const KeptGrammar& k : kept)
    if (k.grammar.get() == g) return k.masks;
  return std::make_shared<MaskCache>();  // evicted (or never compiled here): this request's own
}

}  // namespace

std::shared_ptr<const grammar::Grammar> compile_grammar(std::string_view gbnf) {
  constexpr size_t kKept = 64;
  {
    std::lock_guard<std::mutex> lock(kept_mu);
    for (auto it = kept.begin(); it != kept.end(); ++it)
      if (it->text == gbnf) {
        kept.splice(kept.begin(), kept, it);
        return it->grammar;
      }
  }
  auto g = grammar::Grammar::parse(gbnf);
  if (empty_language(*g)) throw grammar::GrammarError(1, 1, "the grammar matches no text at all (rule root never ends)");
  std::lock_guard<std::mutex> lock(kept_mu);
  kept.push_front({std::string(gbnf), g});
  if (kept.size() > kKept) kept.pop_back();
  return g;
}

std::shared_ptr<const TokenMask> MaskCache::get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = masks_.find(key);
  return it == masks_.end() ? nullptr : it->second;
}

void MaskCache::put(const std::string& key, std::shared_ptr<const TokenMask> mask) {
  const size_t bytes = key.size() + mask->bits.size() * 8 + 64;
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes_ + bytes > kMaxBytes) {
    masks_.clear();
    bytes_ = 0;
  }
  if (masks_.emplace(key, std::move(mask)).second) bytes_ += bytes;
}

grammar::StackTopMasks& MaskCache::tops(const std::shared_ptr<const GrammarVocab>& vocab) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = tops_[vocab->serial()];
  if (!slot.second) {
    slot.first = vocab;
    slot.second = std::make_unique<grammar::StackTopMasks>(vocab->trie(), vocab->all_bytes());
  }
  return *slot.second;
}

Constraint::Constraint(std::shared_ptr<const ConstraintSpec> spec, std::shared_ptr<const GrammarVocab> vocab)
    : spec_(std::move(spec)), vocab_(std::move(vocab)) {
  for (const std::string& t : spec_->triggers) longest_trigger_ = std::max(longest_trigger_, t.size());
  masks_ = mask_cache_of(spec_->grammar.get());
  if (spec_->triggers.empty()) matcher_.emplace(spec_->grammar, spec_->limits);
}

bool Constraint::mask(std::span<float> logits, std::span<const int32_t> eos_ids) {
  if (!matcher_) return true;
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  const grammar::GrammarMatcher& m = *matcher_;
  const bool can_end = m.can_end();
  // Logits the masking below may overwrite: EOS ids (allowed where the grammar can end) and the
  // special tokens the grammar names (allowed where their text fits).
  std::vector<std::pair<int32_t, float>> eos, named;
  for (int32_t id : eos_ids)
    if (id >= 0 && size_t(id) < logits.size()) eos.emplace_back(id, logits[size_t(id)]);
  for (int32_t id : spec_->special_ids)
    if (id >= 0 && size_t(id) < std::min(logits.size(), vocab_->size())) {
      grammar::GrammarMatcher trial = m;
      if (trial.accept_string(vocab_->bytes(id))) named.emplace_back(id, logits[size_t(id)]);
    }

  std::string key = m.state_key();
  const uint64_t serial = vocab_->serial();
  key.append(reinterpret_cast<const char*>(&serial), sizeof serial);
  std::shared_ptr<const TokenMask> cached = masks_->get(key);
  if (!cached) {
    const std::vector<bool> allowed = masks_->tops(vocab_).allowed(m);
    auto fresh = std::make_shared<TokenMask>();
    fresh->bits.assign((allowed.size() + 63) / 64, 0);
    for (size_t i = 0; i < allowed.size(); ++i)
      if (allowed[i]) {
        fresh->bits[i / 64] |= uint64_t(1) << (i % 64);
        fresh->any_plain = fresh->any_plain || !vocab_->special(int32_t(i));
      }
    masks_->put(key, fresh);
    cached = std::move(fresh);
  }
  const TokenMask& allowed = *cached;
  const size_t n = std::min(logits.size(), vocab_->size());
  const bool any = allowed.any_plain || !named.empty() || (can_end && !eos.empty());
  for (size_t w = 0; w * 64 < n; ++w) {
    const uint64_t bits = allowed.bits[w];
    if (bits == ~uint64_t(0)) continue;
    const size_t end = std::min(n, w * 64 + 64);
    if (bits == 0) {
      std::fill(logits.begin() + std::ptrdiff_t(w * 64), logits.begin() + std::ptrdiff_t(end), kBanned);
      continue;
    }
    for (size_t i = w * 64; i < end; ++i)
      if (!(bits >> (i % 64) & 1)) logits[i] = kBanned;
  }
  for (size_t i = n; i < logits.size(); ++i) logits[i] = kBanned;  // padded rows of the embedding
  // The trie allows every special token where the grammar can end: only the ones above may come.
  for (int32_t id : vocab_->special_ids())
    if (size_t(id) < logits.size()) logits[size_t(id)] = kBanned;
  for (const auto& [id, v] : named) logits[size_t(id)] = v;
  for (const auto& [id, v] : eos) logits[size_t(id)] = can_end ? v : kBanned;
  return any;
}

void Constraint::accept(int32_t id) {
  if (id < 0 || size_t(id) >= vocab_->size()) return;
  const std::string& b = vocab_->bytes(id);
  if (matcher_) {
    if (!matcher_->accept_string(b)) {  // not from mask(): the constraint lets go
      matcher_.reset();
      tail_.clear();
      return;
    }
    if (matcher_->has_nothing_left()) {
      if (spec_->triggers.empty())
        complete_ = true;
      else
        matcher_.reset();
    }
    return;
  }
  if (spec_->triggers.empty()) return;
  tail_ += b;
  size_t at = std::string::npos;
  for (const std::string& t : spec_->triggers) at = std::min(at, tail_.find(t));
  if (at != std::string::npos) {
    const std::string from = tail_.substr(at);
    tail_.clear();
    arm(from);
  } else if (tail_.size() >= longest_trigger_) {
    tail_.erase(0, tail_.size() - (longest_trigger_ - 1));
  }
}

void Constraint::arm(std::string_view text) {
  matcher_.emplace(spec_->grammar, spec_->limits);
  // The token that completed the trigger may carry bytes past it that the grammar refuses: this
  // call is then left free (the reply parser reads a malformed call as text).
  if (!matcher_->accept_string(text)) {
    matcher_.reset();
    return;
  }
  if (matcher_->has_nothing_left()) matcher_.reset();
}

}  // namespace ptllm
