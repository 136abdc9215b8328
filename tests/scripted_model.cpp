#include "scripted_model.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <span>
#include <sstream>
#include <tuple>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file_io.h"
#include "model/safetensors_writer.h"
#include "tokenizer/tokenizer.h"

namespace ptllm::test {

namespace {

namespace fs = std::filesystem;

constexpr double kRopeTheta = 1e6;   // slow enough that the flag heads' pair barely turns
constexpr double kRmsEps = 1e-5;
constexpr double kScoreMargin = 30;  // logits between the wanted key and any other: e^-30 leaks
constexpr double kGateHalf = 20;     // |gate| of a unit at its threshold +- 0.5: silu(-20) ~ 4e-8
constexpr double kLogitFloor = 30;   // the emitted token's logit; every other token's is ~0

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error(p.string() + ": cannot read");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A condition of a rule: the residual dimension `dim` is 1 (present) or 0 (absent).
struct Condition {
  int dim;
  bool present;
};

// A script with its tail, as token ids, and the flags that select it.
struct Sequence {
  size_t script;               // index into spec.scripts
  std::vector<int32_t> ids;    // tail then script
  size_t first_position;       // the tail's last token: the first position that predicts
  int group;                   // -1 = no trigger, else the trigger's flag index
};

class Builder {
 public:
  Builder(const ScriptedModelSpec& spec)
      : spec_(spec),
        tok_dir_(spec.tokenizer_dir.empty() ? fs::path(PTLLM_SOURCE_DIR) / "models" / "kjv-tiny" : spec.tokenizer_dir),
        tok_(Tokenizer::load(tok_dir_ / "tokenizer.json")) {}

  ScriptedModelInfo write(const fs::path& out_dir);

 private:
  std::vector<int32_t> encode(const std::string& text) const {
    return tok_.encode(text, EncodeOptions{.add_special = false, .parse_special = true});
  }
  // A token list for messages: each token's text, JSON-quoted.
  std::string show(std::span<const int32_t> ids) const {
    std::string out;
    for (int32_t id : ids) {
      if (!out.empty()) out += ' ';
      out += quote(tok_.decode(std::span<const int32_t>(&id, 1), false));
    }
    return out;
  }
  static std::string quote(const std::string& text) {
    return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string next_text(int32_t id) const { return id == eos_ ? "EOS" : show(std::span<const int32_t>(&id, 1)); }
  std::string name(size_t script) const { return "script " + std::to_string(script + 1); }

  void encode_scripts();
  void make_rules();

  const ScriptedModelSpec& spec_;
  fs::path tok_dir_;
  Tokenizer tok_;
  int32_t eos_ = 1;
  std::vector<int32_t> trigger_tokens_;  // flag index -> token, in declaration order
  std::vector<Sequence> seqs_;
  std::vector<std::vector<int32_t>> script_ids_;
  // The rules, one MLP unit each: (group, last n tokens oldest first) -> next.
  struct Key {
    int group;
    std::vector<int32_t> ngram;
    bool operator<(const Key& o) const { return std::tie(group, ngram) < std::tie(o.group, o.ngram); }
  };
  std::map<Key, int32_t> rules_;
  int context_ = 1;  // the longest rule's n
};

void Builder::encode_scripts() {
  if (spec_.scripts.empty()) throw Error("scripted model: no script");
  if (spec_.context_tokens < 1) throw Error("scripted model: context_tokens must be at least 1");
  if (spec_.max_position < 2) throw Error("scripted model: max_position must be at least 2");
  if (!tok_.eos_id()) throw Error(tok_dir_.string() + ": the tokenizer has no eos_token");
  eos_ = *tok_.eos_id();
  for (const auto& s : spec_.scripts) {
    if (s.trigger.empty()) continue;
    const std::vector<int32_t> t = encode(s.trigger);
    if (t.size() != 1)
      throw Error("scripted model: trigger " + nlohmann::json(s.trigger).dump() + " encodes to " +
                  std::to_string(t.size()) + " tokens (" + show(t) +
                  "); a trigger must be one token: pick one of them that no earlier turn's prompt has");
    if (std::find(trigger_tokens_.begin(), trigger_tokens_.end(), t[0]) == trigger_tokens_.end())
      trigger_tokens_.push_back(t[0]);
  }
  for (size_t i = 0; i < spec_.scripts.size(); ++i) {
    const auto& s = spec_.scripts[i];
    const std::string& tail = s.tail.empty() ? spec_.prompt_tail : s.tail;
    const std::vector<int32_t> tail_ids = encode(tail);
    // The tail's first token may merge with the text before it, so the last token must be another.
    if (tail_ids.size() < 2)
      throw Error("scripted model: " + name(i) + "'s prompt tail " + nlohmann::json(tail).dump() + " encodes to " +
                  std::to_string(tail_ids.size()) + " token(s); it needs at least 2");
    std::vector<int32_t> ids = encode(s.text);
    if (tok_.decode(ids) != s.text)
      throw Error("scripted model: " + name(i) + " does not decode back to its text (tokens " + show(ids) + ")");
    if (std::find(ids.begin(), ids.end(), eos_) != ids.end())
      throw Error("scripted model: " + name(i) + " contains the EOS token");
    Sequence q;
    q.script = i;
    q.ids = tail_ids;
    q.ids.insert(q.ids.end(), ids.begin(), ids.end());
    q.first_position = tail_ids.size() - 1;
    q.group = -1;
    if (!s.trigger.empty())
      q.group = int(std::find(trigger_tokens_.begin(), trigger_tokens_.end(), encode(s.trigger)[0]) -
                    trigger_tokens_.begin());
    // The flags that must stay off while this script runs must not be switched on by its own text.
    for (size_t f = size_t(q.group + 1); f < trigger_tokens_.size(); ++f)
      for (size_t p = 0; p < q.ids.size(); ++p)
        if (q.ids[p] == trigger_tokens_[f])
          throw Error("scripted model: " + name(i) + (p <= q.first_position ? "'s prompt tail" : "") +
                      " contains the trigger token " + show(std::span<const int32_t>(&trigger_tokens_[f], 1)) +
                      " of a later script, which must be absent while " + name(i) + " runs");
    seqs_.push_back(std::move(q));
    script_ids_.push_back(std::move(ids));
  }
}

void Builder::make_rules() {
  const int K = spec_.context_tokens;
  // Every context a script position shows, with the next tokens it is followed by in its group.
  // A rule never reaches the tail's first token (its text may merge with what precedes the tail),
  // but contexts that do are listed: when the tokens are as encoded, other rules see them.
  std::map<Key, std::vector<std::pair<int32_t, size_t>>> seen;  // -> (next, sequence)
  auto next_of = [&](const Sequence& q, size_t p) { return p + 1 < q.ids.size() ? q.ids[p + 1] : eos_; };
  auto ngram = [](const Sequence& q, size_t p, int n) {
    return std::vector<int32_t>(q.ids.begin() + ptrdiff_t(p) - n + 1, q.ids.begin() + ptrdiff_t(p) + 1);
  };
  for (size_t s = 0; s < seqs_.size(); ++s) {
    const Sequence& q = seqs_[s];
    for (size_t p = q.first_position; p < q.ids.size(); ++p)
      for (int n = 1; n <= K && size_t(n) <= p + 1; ++n) {
        auto& v = seen[{q.group, ngram(q, p, n)}];
        const int32_t next = next_of(q, p);
        if (std::find_if(v.begin(), v.end(), [&](auto& e) { return e.first == next; }) == v.end())
          v.push_back({next, s});
      }
  }
  for (const Sequence& q : seqs_)
    for (size_t p = q.first_position; p < q.ids.size(); ++p) {
      const int longest = int(std::min<size_t>(size_t(K), p));
      int n = 1;
      while (n <= longest && seen.at({q.group, ngram(q, p, n)}).size() > 1) ++n;
      if (n > longest) {
        const std::vector<int32_t> g = ngram(q, p, longest);
        const auto& v = seen.at({q.group, g});
        const int32_t mine = next_of(q, p);
        const auto other = std::find_if(v.begin(), v.end(), [&](auto& e) { return e.first != mine; });
        const size_t other_script = seqs_[other->second].script;
        const std::string who = other_script == q.script ? name(q.script) + " itself"
                                                         : name(other_script);
        // The last 16 tokens are enough to find the place in a script.
        const std::span<const int32_t> tail_of_g(g.data() + g.size() - std::min<size_t>(g.size(), 16),
                                                 std::min<size_t>(g.size(), 16));
        throw Error("scripted model: ambiguous: after " + std::string(g.size() > 16 ? "..." : "") +
                    quote(tok_.decode(tail_of_g)) + " (the last " + std::to_string(longest) + " token(s)" +
                    (longest < K ? ", all that the prompt tail leaves" : "") + "), " + name(q.script) + " writes " +
                    next_text(mine) + " but " + who + " writes " + next_text(other->first) +
                    ": reword a script (make it differ sooner), or allow more context tokens (context_tokens, "
                    "--context)");
      }
      rules_[{q.group, ngram(q, p, n)}] = next_of(q, p);
      context_ = std::max(context_, n);
    }
}

void put(std::string& bytes, std::span<const float> v) {
  bytes.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

void put_bf16(std::string& bytes, std::span<const float> v) {
  for (float x : v) {
    const uint16_t h = f32_to_bf16(x);
    bytes.append(reinterpret_cast<const char*>(&h), 2);
  }
}

ScriptedModelInfo Builder::write(const fs::path& out_dir) {
  encode_scripts();
  make_rules();

  // Token codes: 0 = any other token, then S in id order.
  std::map<int32_t, int> code;
  for (const Sequence& q : seqs_)
    for (size_t p = 1; p < q.ids.size(); ++p) code[q.ids[p]] = 0;
  for (int32_t t : trigger_tokens_) code[t] = 0;
  int next_code = 1;
  for (auto& [id, c] : code) c = next_code++;
  std::map<int32_t, int> out_index;  // emitted token -> output slot index
  for (const auto& [key, next] : rules_) out_index[next] = 0;
  int next_out = 0;
  for (auto& [id, o] : out_index) o = next_out++;

  // Slot d >= 1 holds codes only for the tokens some rule looks for d back: most rules are short,
  // so the far slots stay narrow. A token outside a slot's set leaves the slot zero.
  const int K = std::max(2, context_);  // at least one copy head, so the model has a head
  std::vector<std::map<int32_t, int>> slot_code(static_cast<size_t>(K));  // [distance] token -> index
  for (const auto& [key, next] : rules_) {
    const int n = int(key.ngram.size());
    for (int d = 1; d < n; ++d) slot_code[size_t(d)][key.ngram[size_t(n - 1 - d)]] = 0;
  }
  std::vector<int> slot_offset(size_t(K) + 1);  // [distance] first dimension; [K] = the constant
  slot_offset[0] = 0;
  slot_offset[1] = int(code.size()) + 1;
  int widest = 1;
  for (int d = 1; d < K; ++d) {
    int j = 0;
    for (auto& [id, c] : slot_code[size_t(d)]) c = j++;
    slot_offset[size_t(d) + 1] = slot_offset[size_t(d)] + j;
    widest = std::max(widest, j);
  }
  // Residual layout: the slots, the constant, F flags, M outputs.
  const int N = int(code.size()) + 1, F = int(trigger_tokens_.size()), M = int(out_index.size());
  const int C = slot_offset[size_t(K)], H = C + 1 + F + M;
  const int n_heads = (K - 1) + F;
  const int D = std::max(64, (widest + 15) / 16 * 16), half = D / 2;
  const int I = int(rules_.size());
  const int V = tok_.vocab_size();
  // The padded shape (ScriptedShape): the script's head h is query head h * group over KV head h.
  const ScriptedShape& sh = spec_.shape;
  if (sh.layers < 1) throw Error("scripted model: the shape needs at least 1 layer");
  const int Hp = sh.hidden > 0 ? sh.hidden : H, Ip = sh.intermediate > 0 ? sh.intermediate : I;
  if (Hp < H)
    throw Error("scripted model: hidden size " + std::to_string(Hp) + " is narrower than the script's " +
                std::to_string(H) + " residual dimensions");
  if (Ip < I)
    throw Error("scripted model: intermediate size " + std::to_string(Ip) + " is below the script's " +
                std::to_string(I) + " rules (one MLP unit each)");
  if ((sh.heads > 0) != (sh.kv_heads > 0) || (sh.heads > 0 && sh.heads % sh.kv_heads != 0))
    throw Error("scripted model: the shape's heads (" + std::to_string(sh.heads) + ") must be a multiple of its " +
                "KV heads (" + std::to_string(sh.kv_heads) + "), both given or neither");
  // More script heads than the shape's KV heads: more KV heads, and whole groups of the size that
  // comes nearest the shape's query heads.
  const int n_kv = std::max(n_heads, sh.kv_heads);
  const int group = sh.heads > 0 ? std::max(1, (2 * sh.heads + n_kv) / (2 * n_kv)) : 1, n_q = n_kv * group;
  auto flag_dim = [&](int f) { return C + 1 + f; };
  auto out_dim = [&](int32_t id) { return C + 1 + F + out_index.at(id); };
  auto slot_dim = [&](int d, int32_t id) {
    return d == 0 ? code.at(id) : slot_offset[size_t(d)] + slot_code[size_t(d)].at(id);
  };

  // The runtime's RoPE frequencies (model.cpp rope_inv_freq: computed in double, stored as float).
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv_freq[size_t(i)] = float(1.0 / std::pow(kRopeTheta, double(2 * i) / double(D)));
  // A copy head's score at distance e from its target is s * sum_i cos(e theta_i); the smallest drop
  // from the peak over the context sets s.
  double min_gap = 1e300;
  for (int e = 1; e < spec_.max_position; ++e) {
    double sum = 0;
    for (int i = 0; i < half; ++i) sum += std::cos(double(float(e) * inv_freq[size_t(i)]));
    min_gap = std::min(min_gap, double(half) - sum);
  }
  if (!(min_gap > 1e-3))
    throw Error("scripted model: the copy heads cannot tell distances apart over " +
                std::to_string(spec_.max_position) + " positions (gap " + std::to_string(min_gap) + ")");
  const double sqrt_d = std::sqrt(double(D));
  const double a = std::sqrt(kScoreMargin * sqrt_d / min_gap);  // q and k per pair
  // The flag heads' pair turns by theta_min per position: its cosine over the context stays near 1.
  const double slow_cos = std::cos(double(spec_.max_position) * double(inv_freq[size_t(half - 1)]));
  if (F > 0 && slow_cos < 0.5)
    throw Error("scripted model: max_position " + std::to_string(spec_.max_position) +
                " is too large for the trigger heads (their RoPE pair turns past 60 degrees)");
  const double b = std::sqrt((kScoreMargin + std::log(double(spec_.max_position))) * sqrt_d / slow_cos);

  // Norms: every embedding is one code plus the constant (norm^2 2); after attention, up to K codes
  // plus the constant plus the flags that are on. The MLP sees x * r (r = rms_mlp / rms(x) in
  // [r_min, 1]), and its gates are in units of the constant, so r scales them but moves no threshold.
  // (The added dimensions of a padded residual are zero: they add to the mean square's count only.)
  const double rms_in = std::sqrt(2.0 / Hp + kRmsEps);
  const double rms_mlp = std::sqrt(2.0 / Hp + kRmsEps);
  const double r_min = std::sqrt(2.0 / double(K + 1 + F));
  const double G = 2 * kGateHalf / r_min, U = 2 / G;
  // The emitted token's output value is about r^2 per rule that fires (at most K fire).
  const double rms_final_max = std::sqrt(double(K + 1 + F + K * K) / Hp + kRmsEps);
  const double L = kLogitFloor * rms_final_max / (r_min * r_min);

  std::vector<float> embed(size_t(V) * H, 0.f);          // [vocab][hidden]
  std::vector<float> lm_head(size_t(V) * H, 0.f);        // [vocab][hidden]
  std::vector<float> norm_in(static_cast<size_t>(H), float(rms_in));  // [hidden]
  std::vector<float> norm_mlp(static_cast<size_t>(H), float(rms_mlp));
  std::vector<float> norm_final(static_cast<size_t>(H), 0.f);
  std::vector<float> wq(size_t(n_heads) * D * H, 0.f);  // [heads * head_dim][hidden]
  std::vector<float> wk(size_t(n_heads) * D * H, 0.f);
  std::vector<float> wv(size_t(n_heads) * D * H, 0.f);
  std::vector<float> wo(size_t(H) * n_heads * D, 0.f);  // [hidden][heads * head_dim]
  std::vector<float> gate(size_t(I) * H, 0.f);          // [intermediate][hidden]
  std::vector<float> up(size_t(I) * H, 0.f);
  std::vector<float> down(size_t(H) * I, 0.f);          // [hidden][intermediate]
  const size_t QD = size_t(n_heads) * D;

  for (int32_t t = 0; t < V; ++t) {
    const auto it = code.find(t);
    embed[size_t(t) * H + size_t(it == code.end() ? 0 : it->second)] = 1.f;
    embed[size_t(t) * H + C] = 1.f;
  }
  // Copy head h reads the token d = h + 1 back into slot d.
  for (int h = 0; h < K - 1; ++h) {
    const int d = h + 1;
    for (int i = 0; i < half; ++i) {
      const double angle = double(float(d) * inv_freq[size_t(i)]);
      wq[(size_t(h) * D + i) * H + C] = float(a);
      wk[(size_t(h) * D + i) * H + C] = float(a * std::cos(angle));
      wk[(size_t(h) * D + half + i) * H + C] = float(a * std::sin(angle));
    }
    for (const auto& [id, j] : slot_code[size_t(d)]) {
      wv[(size_t(h) * D + j) * H + code.at(id)] = 1.f;
      wo[size_t(slot_offset[size_t(d)] + j) * QD + size_t(h) * D + j] = 1.f;
    }
  }
  // Flag head f: the key is nonzero at its trigger token only, on the slowest pair.
  for (int f = 0; f < F; ++f) {
    const size_t h = size_t(K - 1 + f);
    const int c = code.at(trigger_tokens_[size_t(f)]);
    wq[(h * D + half - 1) * H + C] = float(b);
    wk[(h * D + half - 1) * H + c] = float(b);
    wv[(h * D) * H + c] = 1.f;
    wo[size_t(flag_dim(f)) * QD + h * D] = 1.f;
  }
  // MLP: one unit per rule. gate = G (sum of present - sum of absent - (present count - 1/2)),
  // in units of the constant dimension so that the post-attention norm's scale cancels.
  int r = 0;
  for (const auto& [key, next] : rules_) {
    std::vector<Condition> conds;
    const int n = int(key.ngram.size());
    for (int k = 0; k < n; ++k) conds.push_back({slot_dim(n - 1 - k, key.ngram[size_t(k)]), true});
    for (int f = key.group < 0 ? 0 : key.group; f < F; ++f) conds.push_back({flag_dim(f), f == key.group});
    double present = 0;
    for (const Condition& c : conds) {
      gate[size_t(r) * H + c.dim] = float(c.present ? G : -G);
      present += c.present;
    }
    gate[size_t(r) * H + C] = float(-G * (present - 0.5));
    up[size_t(r) * H + C] = float(U);
    down[size_t(out_dim(next)) * I + r] = 1.f;
    ++r;
  }
  for (const auto& [id, o] : out_index) {
    norm_final[size_t(out_dim(id))] = float(L);
    lm_head[size_t(id) * H + out_dim(id)] = 1.f;
  }

  // Widened to the padded shape: the script's values at their places, zero elsewhere but where a
  // random matrix cannot reach the residual (the other heads' q, k and v, whose o_proj columns are
  // zero; the other units' gate and up, whose down_proj columns are zero).
  const size_t QDp = size_t(n_q) * D, KDp = size_t(n_kv) * D;
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  auto rnd = [&rng]() {  // splitmix64, mapped to [-0.05, 0.05): a small model's initialization scale
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return float(double(z >> 40) / double(1ull << 24) * 0.1 - 0.05);
  };
  auto widen = [&](const std::vector<float>& v, size_t rows, size_t cols, size_t rows_p, size_t cols_p,
                   auto&& row_of) {
    std::vector<float> w(rows_p * cols_p, 0.f);
    for (size_t r = 0; r < rows; ++r)
      std::copy(v.begin() + ptrdiff_t(r * cols), v.begin() + ptrdiff_t(r * cols + cols),
                w.begin() + ptrdiff_t(row_of(r) * cols_p));
    return w;
  };
  const bool padded = Hp != H || Ip != I || n_q != n_heads || n_kv != n_heads || sh.layers > 1;
  if (padded) {
    auto same = [](size_t r) { return r; };
    auto q_row = [&](size_t r) { return (r / size_t(D)) * size_t(group) * size_t(D) + r % size_t(D); };
    embed = widen(embed, size_t(V), size_t(H), size_t(V), size_t(Hp), same);
    lm_head = widen(lm_head, size_t(V), size_t(H), size_t(V), size_t(Hp), same);
    norm_in.assign(size_t(Hp), float(rms_in));
    norm_mlp.assign(size_t(Hp), float(rms_mlp));
    norm_final.resize(size_t(Hp), 0.f);
    wq = widen(wq, QD, size_t(H), QDp, size_t(Hp), q_row);
    wk = widen(wk, QD, size_t(H), KDp, size_t(Hp), same);
    wv = widen(wv, QD, size_t(H), KDp, size_t(Hp), same);
    // o_proj [hidden][heads * head_dim]: the script's columns moved to its query heads.
    std::vector<float> wo_p(size_t(Hp) * QDp, 0.f);
    for (size_t r = 0; r < size_t(H); ++r)
      for (size_t c = 0; c < QD; ++c) wo_p[r * QDp + q_row(c)] = wo[r * QD + c];
    wo = std::move(wo_p);
    gate = widen(gate, size_t(I), size_t(H), size_t(Ip), size_t(Hp), same);
    up = widen(up, size_t(I), size_t(H), size_t(Ip), size_t(Hp), same);
    std::vector<float> down_p(size_t(Hp) * Ip, 0.f);
    for (size_t r = 0; r < size_t(H); ++r)
      std::copy(down.begin() + ptrdiff_t(r * I), down.begin() + ptrdiff_t(r * I + I),
                down_p.begin() + ptrdiff_t(r * Ip));
    down = std::move(down_p);
    // The other heads and units: random, read by nothing that reaches the residual.
    for (int qh = 0; qh < n_q; ++qh)
      if (qh % group != 0 || qh / group >= n_heads)
        for (size_t i = 0; i < size_t(D) * size_t(Hp); ++i) wq[size_t(qh) * D * Hp + i] = rnd();
    for (int kh = n_heads; kh < n_kv; ++kh)
      for (size_t i = 0; i < size_t(D) * size_t(Hp); ++i) {
        wk[size_t(kh) * D * Hp + i] = rnd();
        wv[size_t(kh) * D * Hp + i] = rnd();
      }
    for (size_t i = size_t(I) * Hp; i < size_t(Ip) * Hp; ++i) {
      gate[i] = rnd();
      up[i] = rnd();
    }
    // Exactness: nothing outside the script's units writes the residual, whose added dimensions
    // therefore stay zero, so every norm sees the script's mean square (over Hp).
    for (size_t r = 0; r < size_t(Hp); ++r)
      for (size_t c = 0; c < QDp; ++c)
        if (wo[r * QDp + c] != 0.f && (r >= size_t(H) || (c / D) % size_t(group) != 0 || c / D / group >= size_t(n_heads)))
          throw Error("scripted model: padding: o_proj writes the residual from a padding head");
    for (size_t r = 0; r < size_t(Hp); ++r)
      for (size_t u = 0; u < size_t(Ip); ++u)
        if (down[r * Ip + u] != 0.f && (r >= size_t(H) || u >= size_t(I)))
          throw Error("scripted model: padding: down_proj writes the residual from a padding unit");
  }

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir.string() + ": cannot create the directory (" + ec.message() + ")");
  // 0/1 matrices are exact in bf16, which halves the two vocab-sized ones.
  struct T {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const std::vector<float>* v;
  };
  const std::string l = "model.layers.0.";
  const int64_t q_rows = int64_t(QDp), kv_rows = int64_t(KDp);
  std::vector<T> tensors = {
      {"model.embed_tokens.weight", DType::BF16, {V, Hp}, &embed},
      {l + "input_layernorm.weight", DType::F32, {Hp}, &norm_in},
      {l + "self_attn.q_proj.weight", DType::F32, {q_rows, Hp}, &wq},
      {l + "self_attn.k_proj.weight", DType::F32, {kv_rows, Hp}, &wk},
      {l + "self_attn.v_proj.weight", DType::F32, {kv_rows, Hp}, &wv},
      {l + "self_attn.o_proj.weight", DType::F32, {Hp, q_rows}, &wo},
      {l + "post_attention_layernorm.weight", DType::F32, {Hp}, &norm_mlp},
      {l + "mlp.gate_proj.weight", DType::F32, {Ip, Hp}, &gate},
      {l + "mlp.up_proj.weight", DType::F32, {Ip, Hp}, &up},
      {l + "mlp.down_proj.weight", DType::F32, {Hp, Ip}, &down},
  };
  // The added layers (after the script's): random q, k, v, gate and up; zero o_proj and down_proj,
  // so a layer adds exactly zero to the residual. Each tensor is made as it is written.
  const std::vector<float> ones(size_t(Hp), 1.f);
  const std::vector<float> none;  // a zero matrix, made at its write
  const std::vector<float> random;  // a random matrix, made at its write
  for (int li = 1; li < sh.layers; ++li) {
    const std::string p = "model.layers." + std::to_string(li) + ".";
    tensors.push_back({p + "input_layernorm.weight", DType::F32, {Hp}, &ones});
    tensors.push_back({p + "self_attn.q_proj.weight", DType::BF16, {q_rows, Hp}, &random});
    tensors.push_back({p + "self_attn.k_proj.weight", DType::BF16, {kv_rows, Hp}, &random});
    tensors.push_back({p + "self_attn.v_proj.weight", DType::BF16, {kv_rows, Hp}, &random});
    tensors.push_back({p + "self_attn.o_proj.weight", DType::BF16, {Hp, q_rows}, &none});
    tensors.push_back({p + "post_attention_layernorm.weight", DType::F32, {Hp}, &ones});
    tensors.push_back({p + "mlp.gate_proj.weight", DType::BF16, {Ip, Hp}, &random});
    tensors.push_back({p + "mlp.up_proj.weight", DType::BF16, {Ip, Hp}, &random});
    tensors.push_back({p + "mlp.down_proj.weight", DType::BF16, {Hp, Ip}, &none});
  }
  tensors.push_back({"model.norm.weight", DType::F32, {Hp}, &norm_final});
  tensors.push_back({"lm_head.weight", DType::BF16, {V, Hp}, &lm_head});
  std::vector<TensorDecl> decls;
  for (const T& t : tensors) decls.push_back({t.name, t.dtype, t.shape});
  SafetensorsWriter out(out_dir / "model.safetensors", std::move(decls), {{"format", "pt"}});
  std::vector<float> made;
  for (const T& t : tensors) {
    const std::vector<float>* v = t.v;
    if (v == &none || v == &random) {
      size_t n = 1;
      for (int64_t d : t.shape) n *= size_t(d);
      made.assign(n, 0.f);
      if (v == &random)
        for (float& x : made) x = rnd();
      v = &made;
    }
    std::string bytes;
    if (t.dtype == DType::BF16) put_bf16(bytes, *v);
    else put(bytes, *v);
    out.write(bytes);
  }
  out.commit();

  const nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                                 {"model_type", "llama"},
                                 {"vocab_size", V},
                                 {"hidden_size", Hp},
                                 {"intermediate_size", Ip},
                                 {"num_hidden_layers", sh.layers},
                                 {"num_attention_heads", n_q},
                                 {"num_key_value_heads", n_kv},
                                 {"head_dim", D},
                                 {"max_position_embeddings", spec_.max_position},
                                 {"rms_norm_eps", kRmsEps},
                                 {"rope_theta", kRopeTheta},
                                 {"rope_scaling", nullptr},
                                 {"tie_word_embeddings", false},
                                 {"hidden_act", "silu"},
                                 {"attention_bias", false},
                                 {"mlp_bias", false},
                                 {"bos_token_id", tok_.bos_id().value_or(0)},
                                 {"eos_token_id", eos_},
                                 {"torch_dtype", "float32"}};
  write_file_atomically(out_dir / "config.json", {config.dump(2), "\n"});
  write_file_atomically(out_dir / "generation_config.json",
                        {nlohmann::json{{"bos_token_id", tok_.bos_id().value_or(0)}, {"eos_token_id", eos_}}.dump(2),
                         "\n"});
  write_file_atomically(out_dir / "tokenizer.json", {slurp(tok_dir_ / "tokenizer.json")});
  nlohmann::json tok_config = nlohmann::json::object();
  if (fs::exists(tok_dir_ / "tokenizer_config.json"))
    tok_config = nlohmann::json::parse(slurp(tok_dir_ / "tokenizer_config.json"));
  if (!spec_.chat_template.empty()) tok_config["chat_template"] = spec_.chat_template;
  write_file_atomically(out_dir / "tokenizer_config.json", {tok_config.dump(2), "\n"});

  ScriptedModelInfo info;
  info.script_ids = script_ids_;
  info.distinct_tokens = N - 1;
  info.hidden_size = Hp;
  info.rules = I;
  info.context = context_;
  info.script_hidden = H;
  info.layers = sh.layers;
  info.heads = n_q;
  info.kv_heads = n_kv;
  info.head_dim = D;
  info.intermediate = Ip;
  return info;
}

}  // namespace

ScriptedShape scripted_shape(const std::string& name) {
  if (name == "kjv-small") return {8, 512, 1376, 8, 2};
  if (name == "llama-3.2-1b") return {16, 2048, 8192, 32, 8};
  throw Error("scripted model: unknown shape " + nlohmann::json(name).dump() + " (kjv-small, llama-3.2-1b)");
}

ScriptedModelInfo write_scripted_model(const ScriptedModelSpec& spec, const fs::path& out_dir) {
  return Builder(spec).write(out_dir);
}

}  // namespace ptllm::test
