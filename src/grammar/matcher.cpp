// The pushdown matcher over bytes and the token trie (grammar.h says how they work).
#include <algorithm>

#include "grammar/grammar.h"

namespace ptllm::grammar {

namespace {
// Smallest code point of each UTF-8 length (RFC 3629: shorter forms are overlong, invalid).
constexpr uint32_t kMinOfLength[5] = {0, 0, 0x80, 0x800, 0x10000};

// Some valid code point of [lo, hi] (no surrogates, none above U+10FFFF) is in cls.
bool intersects_valid(const CharClass& cls, uint32_t lo, uint32_t hi) {
  hi = std::min<uint32_t>(hi, 0x10FFFF);
  if (lo > hi) return false;
  if (hi < 0xD800 || lo > 0xDFFF) return cls.intersects(lo, hi);
  return (lo < 0xD800 && cls.intersects(lo, 0xD7FF)) || (hi > 0xDFFF && cls.intersects(0xE000, hi));
}
}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, Limits limits)
    : grammar_(std::move(grammar)), limits_(limits) {
  for (uint32_t start : grammar_->rules()[grammar_->root()]) {
    Stack s{start};
    expand(s, stacks_);
  }
  dedup(stacks_);
}

GrammarMatcher GrammarMatcher::from_stack(std::shared_ptr<const Grammar> grammar, Stack s, Limits limits) {
  GrammarMatcher m;
  m.grammar_ = std::move(grammar);
  m.limits_ = limits;
  m.stacks_.push_back(std::move(s));
  return m;
}

// Pushes onto `out` every stack reachable from s without reading input whose top is a class
// (or which is empty: the grammar is complete).
void GrammarMatcher::expand(Stack& s, std::vector<Stack>& out) const {
  const auto& el = grammar_->elements();
  while (!s.empty() && el[s.back()].kind == Element::Kind::End) s.pop_back();
  if (s.size() > limits_.max_depth)
    throw GrammarLimitError("grammar: stack depth above " + std::to_string(limits_.max_depth));
  if (s.empty() || el[s.back()].kind == Element::Kind::Char) {
    out.push_back(s);
    if (out.size() > limits_.max_stacks * 4)
      throw GrammarLimitError("grammar: more than " + std::to_string(limits_.max_stacks) + " stacks");
    return;
  }
  const uint32_t pos = s.back();
  const uint32_t rule = el[pos].index;
  s.pop_back();
  // A reference last in its alternative is not kept: nothing remains to do after it.
  if (el[pos + 1].kind != Element::Kind::End) s.push_back(pos + 1);
  for (uint32_t start : grammar_->rules()[rule]) {
    Stack t = s;
    t.push_back(start);
    expand(t, out);
  }
}

void GrammarMatcher::dedup(std::vector<Stack>& set) const {
  std::sort(set.begin(), set.end());
  set.erase(std::unique(set.begin(), set.end()), set.end());
  if (set.size() > limits_.max_stacks)
    throw GrammarLimitError("grammar: more than " + std::to_string(limits_.max_stacks) + " stacks");
}

bool GrammarMatcher::step_code_point(uint32_t cp) {
  if (cp < kMinOfLength[length_] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  const auto& el = grammar_->elements();
  const auto& cls = grammar_->classes();
  scratch_.clear();
  for (const Stack& s : stacks_) {
    if (s.empty() || !cls[el[s.back()].index].contains(cp)) continue;
    Stack t = s;
    ++t.back();
    expand(t, scratch_);
  }
  if (scratch_.empty()) return false;
  dedup(scratch_);
  std::swap(stacks_, scratch_);
  need_ = 0;
  partial_ = 0;
  return true;
}

// Keeps the stacks whose class holds a valid code point beginning with the bytes read so far.
bool GrammarMatcher::step_partial(uint32_t value, int remaining) {
  const uint32_t lo = std::max(value << (6 * remaining), kMinOfLength[length_]);
  const uint32_t hi = (value << (6 * remaining)) | ((1u << (6 * remaining)) - 1);
  const auto& el = grammar_->elements();
  const auto& cls = grammar_->classes();
  auto keep = [&](const Stack& s) { return !s.empty() && intersects_valid(cls[el[s.back()].index], lo, hi); };
  if (std::none_of(stacks_.begin(), stacks_.end(), keep)) return false;
  std::erase_if(stacks_, [&](const Stack& s) { return !keep(s); });
  partial_ = value;
  need_ = remaining;
  return true;
}

bool GrammarMatcher::accept_byte(uint8_t b) {
  if (need_ == 0) {
    if (b < 0x80) {
      length_ = 1;
      return step_code_point(b);
    }
    int n;
    uint32_t v;
    if ((b & 0xE0) == 0xC0) { n = 1; v = b & 0x1Fu; }
    else if ((b & 0xF0) == 0xE0) { n = 2; v = b & 0x0Fu; }
    else if ((b & 0xF8) == 0xF0) { n = 3; v = b & 0x07u; }
    else return false;
    const int saved = length_;
    length_ = n + 1;
    if (!step_partial(v, n)) { length_ = saved; return false; }
    return true;
  }
  if ((b & 0xC0) != 0x80) return false;
  const uint32_t v = (partial_ << 6) | (b & 0x3Fu);
  if (need_ == 1) return step_code_point(v);
  return step_partial(v, need_ - 1);
}

bool GrammarMatcher::accept_string(std::string_view s) {
  GrammarMatcher saved = *this;
  for (char c : s)
    if (!accept_byte(static_cast<uint8_t>(c))) {
      *this = std::move(saved);
      return false;
    }
  return true;
}

std::string GrammarMatcher::state_key() const {
  std::vector<const Stack*> order;
  order.reserve(stacks_.size());
  for (const Stack& st : stacks_) order.push_back(&st);
  std::sort(order.begin(), order.end(), [](const Stack* a, const Stack* b) { return *a < *b; });
  std::string key;
  const auto put = [&](uint32_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(partial_);
  put(uint32_t(need_));
  put(uint32_t(length_));
  for (const Stack* st : order) {
    put(uint32_t(st->size()));
    for (uint32_t e : *st) put(e);
  }
  return key;
}

bool GrammarMatcher::can_end() const {
  return need_ == 0 && std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

bool GrammarMatcher::has_nothing_left() const {
  return need_ == 0 && std::all_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

TokenTrie::TokenTrie(const std::vector<std::string>& vocab, const std::vector<bool>& special)
    : nodes_(1), n_vocab_(vocab.size()) {
  for (size_t id = 0; id < vocab.size(); ++id) {
    if (id < special.size() && special[id]) {
      special_ids_.push_back(static_cast<int32_t>(id));
      continue;
    }
    if (vocab[id].empty()) continue;
    uint32_t node = 0;
    for (char c : vocab[id]) {
      const auto byte = static_cast<uint8_t>(c);
      auto& ch = nodes_[node].children;
      auto it = std::lower_bound(ch.begin(), ch.end(), byte, [](const auto& p, uint8_t v) { return p.first < v; });
      if (it != ch.end() && it->first == byte) {
        node = it->second;
      } else {
        const auto next = static_cast<uint32_t>(nodes_.size());
        ch.insert(it, {byte, next});
        nodes_.emplace_back();  // invalidates ch: not used after this
        node = next;
      }
    }
    nodes_[node].ids.push_back(static_cast<int32_t>(id));
  }
}

std::vector<bool> TokenTrie::allowed(const GrammarMatcher& m) const {
  std::vector<bool> out(n_vocab_, false);
  GrammarMatcher work = m;
  std::vector<GrammarMatcher> saved;
  walk(0, 0, false, work, saved, out, nullptr);
  const bool end = m.can_end();
  for (int32_t id : special_ids_) out[static_cast<size_t>(id)] = end;
  return out;
}

void TokenTrie::collect(uint32_t node, std::vector<int32_t>& out) const {
  out.insert(out.end(), nodes_[node].ids.begin(), nodes_[node].ids.end());
  for (const auto& [byte, child] : nodes_[node].children) collect(child, out);
}

// m is unchanged by a rejected byte, so one copy per node restores it after each accepted child.
// With `uncertain`, a subtree refused after a prefix where m could end (`ended`) is collected there.
void TokenTrie::walk(uint32_t node, size_t depth, bool ended, GrammarMatcher& m, std::vector<GrammarMatcher>& saved,
                     std::vector<bool>& accepted, std::vector<int32_t>* uncertain) const {
  if (saved.size() <= depth) saved.push_back(m);
  else saved[depth] = m;
  for (const auto& [byte, child] : nodes_[node].children) {
    if (!m.accept_byte(byte)) {  // unchanged on rejection: the whole subtree is pruned
      if (ended) collect(child, *uncertain);
      continue;
    }
    for (int32_t id : nodes_[child].ids) accepted[static_cast<size_t>(id)] = true;
    walk(child, depth + 1, uncertain && (ended || m.can_end()), m, saved, accepted, uncertain);
    m = saved[depth];
  }
}

void TokenTrie::classify(const GrammarMatcher& m, std::vector<bool>& accepted, std::vector<int32_t>& uncertain) const {
  accepted.assign(n_vocab_, false);
  uncertain.clear();
  GrammarMatcher work = m;
  std::vector<GrammarMatcher> saved;
  walk(0, 0, m.can_end(), work, saved, accepted, &uncertain);
}

std::vector<bool> StackTopMasks::allowed(const GrammarMatcher& m) {
  if (m.mid_code_point()) return trie_.allowed(m);  // the partial code point is shared by all stacks
  std::vector<bool> out(trie_.vocab_size(), false);
  std::vector<int32_t> check;
  for (const GrammarMatcher::Stack& s : m.stacks()) {
    if (s.empty()) continue;
    const size_t n = std::min(s.size(), top_entries_);
    std::vector<uint32_t> key(s.end() - static_cast<std::ptrdiff_t>(n), s.end());
    const bool whole = n == s.size();  // nothing below: refused after an end is refused
    key.push_back(whole ? 1 : 0);
    std::shared_ptr<const Sorted> sorted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sorted_.find(key);
      if (it != sorted_.end()) sorted = it->second;
    }
    if (!sorted) {
      auto fresh = std::make_shared<Sorted>();
      const GrammarMatcher top =
          GrammarMatcher::from_stack(m.grammar_ptr(), GrammarMatcher::Stack(key.begin(), key.end() - 1), m.limits());
      trie_.classify(top, fresh->accepted, fresh->uncertain);
      if (whole) fresh->uncertain.clear();
      const size_t bytes = fresh->accepted.size() / 8 + fresh->uncertain.size() * sizeof(int32_t) + key.size() * 4 + 128;
      std::lock_guard<std::mutex> lock(mu_);
      if (bytes_ + bytes > kMaxBytes) {
        sorted_.clear();
        bytes_ = 0;
      }
      if (sorted_.emplace(key, fresh).second) bytes_ += bytes;
      sorted = std::move(fresh);
    }
    for (size_t i = 0; i < out.size(); ++i)
      if (sorted->accepted[i]) out[i] = true;
    check.insert(check.end(), sorted->uncertain.begin(), sorted->uncertain.end());
  }
  for (int32_t id : check) {
    if (out[static_cast<size_t>(id)]) continue;
    GrammarMatcher t = m;
    out[static_cast<size_t>(id)] = t.accept_string(vocab_[static_cast<size_t>(id)]);
  }
  const bool end = m.can_end();
  for (int32_t id : trie_.special_ids()) out[static_cast<size_t>(id)] = end;
  return out;
}

size_t StackTopMasks::tops() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sorted_.size();
}

size_t StackTopMasks::uncertain_tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [key, sorted] : sorted_) n += sorted->uncertain.size();
  return n;
}

}  // namespace ptllm::grammar
