#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace ptllm::tok {

WordCache::WordCache() : slots_(kSets * kWays) {}

bool WordCache::lookup(std::string_view word, std::vector<int32_t>& out) {
  if (word.size() > kMaxWord) return false;
  const uint64_t h = hash_of(word);
  std::lock_guard lock(mu_);
  const Slot* set = set_of(h);
  for (size_t w = 0; w < kWays; ++w) {
    const Slot& s = set[w];
    if (s.hash == h && s.len == word.size() && std::memcmp(s.word, word.data(), s.len) == 0) {
      out.insert(out.end(), s.ids, s.ids + s.nids);
      return true;
    }
  }
  return false;
}

void WordCache::insert(std::string_view word, const int32_t* ids, size_t n) {
  if (word.size() > kMaxWord || n > kMaxIds) return;
  Slot slot;
  slot.hash = hash_of(word);
  slot.len = static_cast<uint8_t>(word.size());
  slot.nids = static_cast<uint8_t>(n);
  std::memcpy(slot.word, word.data(), word.size());
  std::copy(ids, ids + n, slot.ids);
  std::lock_guard lock(mu_);
  Slot* set = set_of(slot.hash);
  std::move_backward(set, set + kWays - 1, set + kWays);
  set[0] = slot;
}

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

void BpeModel::MergeTable::reserve(size_t n) {
  size_t cap = 16;
  int bits = 4;
  while (cap < 2 * n) {
    cap *= 2;
    ++bits;
  }
  entries_.assign(cap, Entry{});
  shift_ = 64 - bits;
}

void BpeModel::MergeTable::set(int32_t a, int32_t b, Merge m) {
  const uint64_t key = pair_key(a, b);
  const size_t mask = entries_.size() - 1;
  for (size_t i = index(key);; i = (i + 1) & mask) {
    if (entries_[i].key == key || entries_[i].key == kEmpty) {
      entries_[i] = {key, m};
      return;
    }
  }
}

const BpeModel::Merge* BpeModel::MergeTable::find(int32_t a, int32_t b) const {
  if (entries_.empty()) return nullptr;
  const uint64_t key = pair_key(a, b);
  const size_t mask = entries_.size() - 1;
  for (size_t i = index(key);; i = (i + 1) & mask) {
    if (entries_[i].key == key) return &entries_[i].merge;
    if (entries_[i].key == kEmpty) return nullptr;
  }
}

namespace {

std::optional<std::string> optional_string(const json& j, std::string_view key,
                                           const JsonPath& at) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) (at / key).fail("expected a string or null");
  return it->get<std::string>();
}

// One merge rule in either stored form: "a b" or ["a", "b"].
std::pair<std::string, std::string> parse_merge(const json& m, const JsonPath& at) {
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
      at.fail("expected \"left right\"");
    return {s.substr(0, sp), s.substr(sp + 1)};
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
    return {m[0].get<std::string>(), m[1].get<std::string>()};
  at.fail("expected \"left right\" or [\"left\", \"right\"]");
}

}  // namespace

BpeModel::BpeModel(const json& m, const JsonPath& at) {
  if (auto it = m.find("dropout"); it != m.end() && !it->is_null() && it->get<double>() != 0.0)
    (at / "dropout").fail("BPE dropout is not supported (encoding would be random)");
  unk_token_ = optional_string(m, "unk_token", at);
  prefix_ = optional_string(m, "continuing_subword_prefix", at).value_or("");
  suffix_ = optional_string(m, "end_of_word_suffix", at).value_or("");
  fuse_unk_ = get_bool(m, "fuse_unk", at, false);
  byte_fallback_ = get_bool(m, "byte_fallback", at, false);
  ignore_merges_ = get_bool(m, "ignore_merges", at, false);

  const json& vocab = need(m, "vocab", at);
  if (!vocab.is_object()) (at / "vocab").fail("expected an object of token: id");
  if (vocab.empty()) (at / "vocab").fail("is empty");
  vocab_.reserve(vocab.size());
  // Ids are dense in every real vocabulary; a few gaps (filled by added tokens) are fine, an id far
  // past the size is a table of that many entries and refused.
  const size_t max_id = vocab.size() + (size_t(1) << 20);
  for (const auto& [token, id_json] : vocab.items()) {
    const int32_t id = to_id(id_json, at / "vocab" / token);
    if (size_t(id) > max_id)
      (at / "vocab" / token).fail("id " + std::to_string(id) + " is far past the vocabulary's " +
                                  std::to_string(vocab.size()) + " entries");
    if (size_t(id) < has_id_.size() && has_id_[size_t(id)])
      (at / "vocab" / token).fail("id " + std::to_string(id) + " is also the id of '" + id_to_token_[size_t(id)] + "'");
    vocab_[token] = id;
    if (static_cast<size_t>(id) >= id_to_token_.size()) {
      id_to_token_.resize(id + 1);
      has_id_.resize(id + 1);
    }
    id_to_token_[id] = token;
    has_id_[id] = true;
  }

  const json& merges = need(m, "merges", at);
  if (!merges.is_array()) (at / "merges").fail("expected an array");
  merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const JsonPath mat = (at / "merges")[i];
    const auto [left, right] = parse_merge(merges[i], mat);
    auto id_of = [&](const std::string& t) {
      auto it = vocab_.find(t);
      if (it == vocab_.end()) mat.fail("token '" + t + "' is not in the vocab");
      return it->second;
    };
    if (right.size() < prefix_.size()) mat.fail("right token is shorter than the subword prefix");
    const int32_t a = id_of(left), b = id_of(right);
    const int32_t merged = id_of(left + right.substr(prefix_.size()));
    // Later rules overwrite earlier ones for the same pair, as in tokenizers.
    merges_.set(a, b, {static_cast<uint32_t>(i), merged});
  }

  const auto& stand_in = byte_to_unicode();
  for (int b = 0; b < 256; ++b) {
    byte_ids_[b] = token_to_id(stand_in[b]).value_or(-1);
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    fallback_ids_[b] = token_to_id(name).value_or(-1);
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::encode_word(std::string_view word, bool raw_bytes, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (cache_.lookup(word, out)) return;
  const size_t before = out.size();
  encode_uncached(word, raw_bytes, out);
  cache_.insert(word, out.data() + before, out.size() - before);
}

void BpeModel::encode_uncached(std::string_view word, bool raw_bytes,
                               std::vector<int32_t>& out) const {
  if (ignore_merges_) {  // a word that is itself in the vocab is one token, whatever the merges
    const std::string mapped = raw_bytes ? bytes_to_unicode(word) : std::string();
    if (auto id = token_to_id(raw_bytes ? std::string_view(mapped) : word)) {
      out.push_back(*id);
      return;
    }
  }

  // Scratch kept per thread: a miss in the word cache then allocates nothing.
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  auto add = [&](int32_t id, uint32_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, len});
  };
  // An unknown character waits here so that runs of them can be fused into one unk token.
  std::optional<Symbol> unk;
  // One character of the word: `s` its vocabulary string, `id` its id or -1.
  auto unit = [&](std::string_view s, int32_t id, uint32_t len) {
    if (id >= 0) {
      if (unk) add(unk->id, unk->len);
      unk.reset();
      add(id, len);
      return;
    }
    if (byte_fallback_ && std::all_of(s.begin(), s.end(), [&](char c) {
          return fallback_ids_[static_cast<unsigned char>(c)] >= 0;
        })) {
      for (char c : s) add(fallback_ids_[static_cast<unsigned char>(c)], 1);
      return;
    }
    if (!unk_token_) return;  // tokenizers drops the character
    const auto unk_id = token_to_id(*unk_token_);
    if (!unk_id) throw Error("BPE unk_token '" + *unk_token_ + "' is not in the vocab");
    if (unk && fuse_unk_) {
      unk->len += len;
    } else {
      if (unk) add(unk->id, unk->len);
      unk = Symbol{*unk_id, -1, -1, len};
    }
  };

  if (raw_bytes) {
    const auto& stand_in = byte_to_unicode();
    for (char c : word) {
      const auto b = static_cast<unsigned char>(c);
      unit(stand_in[b], byte_ids_[b], 1);
    }
  } else {
    std::string affixed;
    for (size_t i = 0; i < word.size();) {
      const size_t n = utf8_len(static_cast<unsigned char>(word[i]));
      const std::string_view ch = word.substr(i, n);
      const bool first = i == 0;
      i += n;
      const bool last = i >= word.size();
      std::string_view s = ch;
      if ((!first && !prefix_.empty()) || (last && !suffix_.empty())) {
        affixed.assign(first ? "" : prefix_);
        affixed += ch;
        if (last) affixed += suffix_;
        s = affixed;
      }
      unit(s, token_to_id(s).value_or(-1), static_cast<uint32_t>(n));
    }
  }
  if (unk) add(unk->id, unk->len);

  merge_all(symbols);
  for (const Symbol& s : symbols)
    if (s.len != 0) out.push_back(s.id);
}

// Applies merges lowest rank first (leftmost on ties) with a priority queue of candidate pairs;
// entries made stale by an earlier merge are recognised and dropped when popped
// (tokenizers' Word::merge_all).
void BpeModel::merge_all(std::vector<Symbol>& sym) const {
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
  };
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  thread_local std::vector<Candidate> heap;
  heap.clear();
  auto push = [&](int32_t pos, int32_t left, int32_t right) {
    if (const Merge* m = find_merge(left, right)) {
      heap.push_back({m->rank, pos, m->new_id});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i)
    push(static_cast<int32_t>(i), sym[i].id, sym[i + 1].id);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& cur = sym[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const Symbol right = sym[cur.next];
    const Merge* m = find_merge(cur.id, right.id);
    if (!m || m->new_id != top.new_id) continue;  // stale

    sym[cur.next].len = 0;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (cur.prev >= 0) push(cur.prev, sym[cur.prev].id, cur.id);
    if (cur.next >= 0) push(top.pos, cur.id, sym[cur.next].id);
  }
}

}  // namespace ptllm::tok
