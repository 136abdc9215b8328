#include "kv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include <xxhash.h>

#include "core/bytes.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/quant.h"

namespace ptllm {

std::string_view kv_precision_name(KVPrecision p) {
  switch (p) {
    case KVPrecision::F32: return "fp32";
    case KVPrecision::F16: return "fp16";
    case KVPrecision::BF16: return "bf16";
    case KVPrecision::Int8: return "int8";
    case KVPrecision::Int4: return "int4";
    case KVPrecision::Int2: return "int2";
  }
  return "?";
}

std::optional<KVPrecision> parse_kv_precision(std::string_view s) {
  for (KVPrecision p : {KVPrecision::F32, KVPrecision::F16, KVPrecision::BF16, KVPrecision::Int8, KVPrecision::Int4,
                        KVPrecision::Int2})
    if (s == kv_precision_name(p)) return p;
  return std::nullopt;
}

int kivi_bits(KVPrecision p) {
  switch (p) {
    case KVPrecision::Int8: return 8;
    case KVPrecision::Int4: return 4;
    case KVPrecision::Int2: return 2;
    default: return 0;
  }
}

DType dense_dtype(KVPrecision p) {
  switch (p) {
    case KVPrecision::F16: return DType::F16;
    case KVPrecision::BF16: return DType::BF16;
    default: return DType::F32;
  }
}

std::string_view position_mode_name(PositionMode m) { return m == PositionMode::Cache ? "cache" : "absolute"; }

PositionMode default_positions(const KVCacheConfig& c) {
  return c.streaming() ? PositionMode::Cache : PositionMode::Absolute;
}

void KVCacheConfig::validate() const {
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw UsageError(msg);
  };
  need(group_size >= 1 && group_size <= 4096, "--kv-group-size must be between 1 and 4096");
  need(!is_kivi(precision) || (residual >= 0 && residual % group_size == 0),
       "--kv-residual (" + std::to_string(residual) + ") must be a non-negative multiple of --kv-group-size (" +
           std::to_string(group_size) + ")");
  need(sink >= 0, "--streaming-llm-sink must not be negative");
  need(window >= 0, "--streaming-llm-window must not be negative");
  need(sink == 0 || window > 0, "--streaming-llm-sink needs --streaming-llm-window M > 0");
  need(ctx_size > 0, "--ctx-size must be positive");
  need(!streaming() || sink < ctx_size,
       "--streaming-llm-sink (" + std::to_string(sink) + ") must be smaller than --ctx-size (" +
           std::to_string(ctx_size) + ")");
}

std::string KVCacheConfig::describe() const {
  std::string s(kv_precision_name(precision));
  if (is_kivi(precision)) s += " g" + std::to_string(group_size) + " r" + std::to_string(residual);
  if (streaming()) s += " sink" + std::to_string(sink) + " w" + std::to_string(window);
  if (positions == PositionMode::Cache) s += " pos=cache";
  return s;
}

bool KVShape::any_window() const {
  return std::any_of(layer_window.begin(), layer_window.end(), [](int w) { return w > 0; });
}

size_t kivi_block_bytes_per_head(int G, int D, int bits) {
  return 2 * size_t(G) * packed_bytes(D, bits) + 2 * sizeof(uint16_t) * size_t(D) + 2 * sizeof(uint16_t) * size_t(G);
}

namespace {
// Byte offsets of KV head g's parts in a quantized block of H heads and G tokens: K codes [H][G][pk],
// V codes [H][G][pk], then f16 K scales [H][D], K zeros [H][D], V scales [H][G], V zeros [H][G].
// The one statement of that layout: quantize_block writes it, attention reads it.
struct KiviOffsets {
  size_t kc, vc, ks, kz, vs, vz;
};
KiviOffsets kivi_offsets(int g, int H, int G, int D, size_t pk) {
  const size_t codes = size_t(G) * pk, f16 = sizeof(uint16_t), scales = 2 * size_t(H) * codes;
  const size_t hd = size_t(H) * size_t(D), hg = size_t(H) * size_t(G);
  return {size_t(g) * codes,
          (size_t(H) + size_t(g)) * codes,
          scales + f16 * size_t(g) * size_t(D),
          scales + f16 * (hd + size_t(g) * size_t(D)),
          scales + f16 * (2 * hd + size_t(g) * size_t(G)),
          scales + f16 * (2 * hd + hg + size_t(g) * size_t(G))};
}
}  // namespace

// ---------------------------------------------------------------------------------------------

namespace {

// A fixed-capacity ring of block entries, oldest first (no allocation after construction).
struct Entry {
  int32_t id = -1;
  bool quantized = false;
};

class Ring {
 public:
  explicit Ring(size_t cap = 0) : buf_(cap) {}
  size_t size() const { return size_; }
  size_t capacity() const { return buf_.size(); }
  bool empty() const { return size_ == 0; }
  // Indexed by a compare, not a division (attention indexes the ring once per block read).
  Entry& operator[](size_t i) { return buf_[wrap(head_ + i)]; }
  const Entry& operator[](size_t i) const { return buf_[wrap(head_ + i)]; }
  void push_back(Entry e) {
    PTLLM_CHECK(size_ < buf_.size());
    buf_[wrap(head_ + size_)] = e;
    ++size_;
  }
  void pop_front() {
    PTLLM_CHECK(size_ > 0);
    head_ = wrap(head_ + 1);
    --size_;
  }
  void pop_back() {
    PTLLM_CHECK(size_ > 0);
    --size_;
  }

 private:
  size_t wrap(size_t i) const { return i < buf_.size() ? i : i - buf_.size(); }  // i < 2 capacity
  std::vector<Entry> buf_;
  size_t head_ = 0, size_ = 0;
};

size_t ceil_div(int64_t a, int64_t b) { return size_t((a + b - 1) / b); }

// Prefill chunk under StreamingLLM or KIVI: bounds the full-precision blocks a batched pass needs.
constexpr int kChunk = 64;

}  // namespace

struct KVCache::Layer {
  std::vector<int32_t> sinks;  // dense blocks holding the first n_sink tokens
  int n_sink = 0;
  int native = 0;              // the model's sliding window (0: full attention)
  int window = 0;              // stream tokens a query sees, itself included (0: all): native and/or StreamingLLM's
  Ring stream;                 // blocks of the tokens after the sinks, oldest first
  size_t n_quant = 0;          // the first n_quant entries of `stream` are quantized
  int64_t begin = 0;           // stream index of the first slot of stream[0] (a multiple of B)
  int64_t end = 0;             // stream tokens appended
};

// Where one stored token lives.
struct KVCache::Located {
  const uint8_t* block;
  bool quantized;
  int slot;
};

namespace {

struct Bounds {
  size_t sink_blocks, dense_stream_blocks, quant_blocks;
};

// One layer's blocks; window: its stream window (0: none); bounded: at most ctx_size tokens are
// ever appended.
Bounds block_bounds(const KVCacheConfig& c, int chunk, int window, bool bounded) {
  const int B = c.group_size;
  Bounds b{};
  b.sink_blocks = c.streaming() ? ceil_div(c.sink, B) : 0;
  // Stream tokens held while a chunk attends: its window (M - 1 before the first query), the chunk,
  // up to B - 1 masked tokens of a partly evicted block, and one block of alignment slack.
  size_t window_blocks = window > 0 ? ceil_div(int64_t(window) + chunk + B - 2, B) + 1 : ceil_div(c.ctx_size, B);
  if (bounded) window_blocks = std::min(window_blocks, ceil_div(c.ctx_size, B));
  if (is_kivi(c.precision)) {
    b.dense_stream_blocks = std::min(window_blocks, ceil_div(int64_t(c.residual) + B - 1 + chunk, B) + 1);
    b.quant_blocks = window_blocks;
  } else {
    b.dense_stream_blocks = window_blocks;
    b.quant_blocks = 0;
  }
  return b;
}

}  // namespace

KVPool::KVPool(const KVShape& shape, const KVCacheConfig& cfg, size_t dense_blocks, size_t quant_blocks, bool keyed)
    : shape_(shape),
      cfg_(cfg),
      keyed_(keyed),
      dense_(size_t(cfg.group_size) * 2 * size_t(shape.kv_dim()) * dtype_size(dense_dtype(cfg.precision)), dense_blocks,
             cfg.preallocate, keyed ? cfg.group_size : 0),
      quant_(kivi_bits(cfg.precision) ? size_t(shape.n_kv_heads) * kivi_block_bytes_per_head(cfg.group_size, shape.head_dim,
                                                                                                kivi_bits(cfg.precision))
                                      : 0,
             quant_blocks, cfg.preallocate, keyed ? cfg.group_size : 0) {}

namespace {
// Prefill chunk: bounded when a policy (StreamingLLM, KIVI, a sliding layer) limits the
// full-precision blocks a batched pass may hold.
int chunk_for(const KVShape& shape, const KVCacheConfig& c) {
  return (c.streaming() || is_kivi(c.precision) || shape.any_window()) ? kChunk : c.ctx_size;
}
// Without StreamingLLM the context is limited by ctx_size unless every layer forgets what leaves its
// window; a window wider than ctx_size never slides within it, so that limit stays.
bool unbounded_for(const KVShape& shape, const KVCacheConfig& c) {
  bool all_slide = true;
  for (int l = 0; l < shape.n_layers; ++l) all_slide = all_slide && shape.window_of(l) > 0 && shape.window_of(l) <= c.ctx_size;
  return c.streaming() || all_slide;
}
// Stream tokens a query of layer l sees, itself included (0: all): the layer's own window, StreamingLLM's,
// or the narrower of the two.
int stream_window(const KVShape& shape, const KVCacheConfig& c, int l) {
  const int native = shape.window_of(l);
  return native > 0 && c.streaming() ? std::min(native, c.window) : std::max(native, c.window);
}
// Per sequence, worst case: full-precision blocks and KIVI groups, over every layer.
std::pair<size_t, size_t> blocks_per_sequence(const KVShape& shape, const KVCacheConfig& c) {
  const int chunk = chunk_for(shape, c);
  const bool bounded = !unbounded_for(shape, c);
  size_t dense = 0, quant = 0;
  for (int l = 0; l < shape.n_layers; ++l) {
    const Bounds b = block_bounds(c, chunk, stream_window(shape, c, l), bounded);
    dense += b.sink_blocks + b.dense_stream_blocks;
    quant += b.quant_blocks;
  }
  return {dense, quant};
}
}  // namespace

KVPool::KVPool(const KVShape& shape, const KVCacheConfig& cfg, int sequences, size_t budget_bytes)
    : KVPool(shape, cfg, 0, 0, true) {
  cfg.validate();
  PTLLM_CHECK(sequences > 0);
  auto [dense, quant] = blocks_per_sequence(shape, cfg);
  dense *= size_t(sequences);
  quant *= size_t(sequences);
  const size_t dense_bytes = size_t(cfg.group_size) * 2 * size_t(shape.kv_dim()) * dtype_size(dense_dtype(cfg.precision));
  const size_t quant_bytes = quant ? size_t(shape.n_kv_heads) * kivi_block_bytes_per_head(cfg.group_size, shape.head_dim,
                                                                                           kivi_bits(cfg.precision))
                                   : 0;
  if (budget_bytes > 0) {
    const double worst = double(dense * dense_bytes + quant * quant_bytes);
    const double f = double(budget_bytes) / worst;
    dense = size_t(double(dense) * f);
    quant = size_t(double(quant) * f);
    if (dense < size_t(shape.n_layers))
      throw UsageError("--kv-budget-mb: " + std::to_string(budget_bytes >> 20) +
                       " MiB holds less than one block per layer for this model and KV configuration");
  }
  dense_ = BlockPool(dense_bytes, dense, cfg.preallocate, cfg.group_size);
  quant_ = BlockPool(quant_bytes, quant, cfg.preallocate, cfg.group_size);
}

size_t KVPool::shared_bytes() const {
  size_t total = 0;
  for (const BlockPool* p : {&dense_, &quant_}) {
    size_t n = 0;
    for (size_t id = 0; id < p->capacity(); ++id)
      if (p->refs(int32_t(id)) > 1) ++n;
    total += n * p->block_bytes();
  }
  return total;
}

KVCache::KVCache(const KVShape& shape, const KVCacheConfig& cfg, KVPool* pool)
    : shape_(shape),
      cfg_(cfg),
      dense_(dense_dtype(cfg.precision)),
      bits_(kivi_bits(cfg.precision)),
      dense_token_bytes_(2 * size_t(shape.kv_dim()) * dtype_size(dense_dtype(cfg.precision))),
      own_pool_(pool ? nullptr : new KVPool(shape, cfg, 0, 0, false)),
      pool_(pool ? pool : own_pool_.get()),
      dense_pool_(pool_->dense_),
      quant_pool_(pool_->quant_) {
  cfg_.validate();
  PTLLM_CHECK(shape.n_layers > 0 && shape.n_kv_heads > 0 && shape.head_dim > 0 && shape.head_dim % 2 == 0);
  PTLLM_CHECK(shape.layer_window.empty() || int(shape.layer_window.size()) == shape.n_layers);
  if (pool)
    PTLLM_CHECK(pool->cfg_.describe() == cfg_.describe() && pool->cfg_.ctx_size == cfg_.ctx_size &&
                pool->shape_.n_layers == shape.n_layers && pool->shape_.kv_dim() == shape.kv_dim() &&
                pool->shape_.layer_window == shape.layer_window);
  windows_ = shape.any_window();
  chunk_ = chunk_for(shape, cfg_);
  const int B = cfg_.group_size;
  unbounded_ = unbounded_for(shape, cfg_);
  layers_.resize(size_t(shape.n_layers));
  size_t dense_blocks = 0, quant_blocks = 0;
  for (int l = 0; l < shape.n_layers; ++l) {
    Layer& layer = layers_[size_t(l)];
    layer.native = shape.window_of(l);
    layer.window = stream_window(shape, cfg_, l);
    const Bounds b = block_bounds(cfg_, chunk_, layer.window, !unbounded_);
    layer.sinks.reserve(b.sink_blocks);
    layer.stream = Ring(b.dense_stream_blocks + b.quant_blocks);
    dense_blocks += b.sink_blocks + b.dense_stream_blocks;
    quant_blocks += b.quant_blocks;
  }
  if (own_pool_) {
    dense_pool_ = BlockPool(size_t(B) * dense_token_bytes_, dense_blocks, cfg_.preallocate);
    if (bits_ > 0)
      quant_pool_ = BlockPool(size_t(shape.n_kv_heads) * kivi_block_bytes_per_head(B, shape.head_dim, bits_),
                              quant_blocks, cfg_.preallocate);
  }
  if (rotates_at_read()) {
    // Distances a query can have to a key: within the window (or the context), or to a sink; a
    // sliding layer sees every key, sinks too, at its true distance, less than its window.
    // Plus a block: attention rotates a block's keys by their slot in the block and the query by
    // its distance to the block's first slot, which may be before the first key it sees.
    const int64_t full = (cfg_.streaming() ? cfg_.sink + cfg_.window + chunk_ : cfg_.ctx_size) + B;
    int64_t most = 0;
    for (const Layer& layer : layers_) {
      int64_t d = layer.native > 0 ? int64_t(layer.native) + chunk_ + B : full;
      if (!unbounded_) d = std::min<int64_t>(d, int64_t(cfg_.ctx_size) + B);
      most = std::max(most, d);
    }
    max_delta_ = int(most);
    const int half = shape.head_dim / 2;
    PTLLM_CHECK(int(shape.rope_inv_freq.size()) == half);
    rope_cos_.resize(size_t(max_delta_) * size_t(half));
    rope_sin_.resize(rope_cos_.size());
    for (int d = 0; d < max_delta_; ++d)
      rope_cos_sin(shape.rope_inv_freq.data(), half, d, rope_cos_.data() + size_t(d) * size_t(half),
                   rope_sin_.data() + size_t(d) * size_t(half));
  }
}

KVCache::~KVCache() { clear(); }  // a shared pool gets every reference back

int KVCache::max_append() const {
  if (has_policy()) return chunk_;
  return int(std::max<int64_t>(0, int64_t(cfg_.ctx_size) - n_tokens()));
}

bool KVCache::fits(int64_t more) const { return unbounded_ || n_tokens() + more <= cfg_.ctx_size; }

int64_t KVCache::n_tokens() const {
  const Layer& L = layers_.back();
  return L.n_sink + L.end;
}

int KVCache::n_stored() const {
  int64_t most = 0;
  for (const Layer& L : layers_) most = std::max(most, L.n_sink + (L.window > 0 ? std::min<int64_t>(L.end, L.window) : L.end));
  return int(most);
}

int64_t KVCache::held_tokens(int layer) const {
  const Layer& L = layers_[size_t(layer)];
  return L.n_sink + L.end - L.begin;
}

void KVCache::append(int layer, const float* k, const float* v, int T) {
  Layer& L = layers_[size_t(layer)];
  PTLLM_CHECK(T <= max_append());  // max_append() reads the last layer, which appends last
  const int B = cfg_.group_size, D = shape_.head_dim, H = shape_.n_kv_heads;
  const size_t elem = dtype_size(dense_);
  for (int t = 0; t < T; ++t) {
    uint8_t* block;
    int slot;
    if (cfg_.streaming() && L.n_sink < cfg_.sink) {
      if (L.n_sink % B == 0) {
        const int32_t id = dense_pool_.acquire();
        PTLLM_CHECK(id >= 0);
        L.sinks.push_back(id);
      }
      block = dense_pool_.data(L.sinks[size_t(L.n_sink / B)]);
      slot = L.n_sink % B;
      ++L.n_sink;
    } else {
      const size_t entry = size_t((L.end - L.begin) / B);
      if (L.end % B == 0) {
        PTLLM_CHECK(entry == L.stream.size());
        const int32_t id = dense_pool_.acquire();
        PTLLM_CHECK(id >= 0);  // the pool is sized for the worst case (block_bounds)
        L.stream.push_back({id, false});
      }
      PTLLM_CHECK(!L.stream[entry].quantized);
      block = dense_pool_.data(L.stream[entry].id);
      slot = int(L.end % B);
      ++L.end;
    }
    const size_t half_bytes = size_t(B) * size_t(shape_.kv_dim()) * elem;
    for (int g = 0; g < H; ++g) {
      const size_t dst = (size_t(g) * size_t(B) + size_t(slot)) * size_t(D) * elem;
      const size_t src = size_t(t) * size_t(shape_.kv_dim()) + size_t(g) * size_t(D);
      store_as(k + src, block + dst, dense_, D);
      store_as(v + src, block + half_bytes + dst, dense_, D);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Attention.
//
// Work is cut into (query tokens, KV head, part) pieces. The `group` query heads sharing a KV head
// are processed together, and in prefill those of a tile of consecutive tokens: a block's rows are
// converted (dense_*_block) or its codes unpacked (kivi_*_block) once for all of them. Cache
// positions rotate each block's keys once (dequantized into a per-thread buffer when quantized)
// and the query once per block. A query's keys are cut into parts: one for the sinks, then the
// stream tokens by absolute index in runs of kPartTokens; each part has its own online softmax, and the parts are
// merged in order at the end (flash-decoding, Dao et al. 2023), so a single decode token keeps
// every thread busy even with 2 KV heads. Parts depend only on token indices, never on T or the
// thread count, and are computed and merged the same way whether one thread walks them all or
// they are spread over the pool: a token's output is bit for bit the same however a prompt was
// batched (the prompt cache relies on it: tests/test_prompt_cache.cpp).

namespace {

// One per thread: see local_buffers in KVCache::attend.
std::vector<float>& attention_scratch() {
  thread_local std::vector<float> v;
  return v;
}

// Stream tokens per part: a 4K-token decode step is 4 parts per KV head, enough to spread over a
// few threads, while what a part costs besides its keys (walking its blocks, one max and exp call
// per head, merging: O(D) per head) stays small next to reading 1024 keys, and its scores (4 heads
// x 4 KB) stay in the first-level cache. bench_attention int4 at 16K: 171 -> 164 us against 512
// (fp32 unchanged); 2048 no faster.
constexpr int kPartTokens = 1024;

// Prefill walks the keys for a tile of up to kTile consecutive query tokens at once (KVCache::attend).
constexpr int kTile = 8;

// A block of a part, for queries [i0, i1) of the tile: query i sees slots [a[i], b[i]) of it
// (empty: a >= b), key slot j at distance delta0[i] - j; its slot 0 is column col of the scores.
struct WalkBlock {
  const uint8_t* data;
  bool quantized;
  int i0, i1, col;
  int a[kTile], b[kTile];
  int64_t delta0[kTile];
  // What the kernels ask for while they read this block (null: nothing): rows of the block read
  // two blocks later. Scoring, its K rows; summing values, its V rows. Near the part's end
  // (near_end) the other way round: scoring asks for the first blocks' V rows (the values pass
  // starts there), summing values for the next part's K rows.
  const Entry *k_ahead, *v_ahead;
  bool near_end;
  // Every query of [i0, i1) sees the same slots [a[i0], b[i0]).
  bool same;
};

// A part's blocks (the first of `blocks`), walked once for both passes, and the spans handed to the
// kernels; one per thread (kept, so a decode step allocates nothing).
struct Walk {
  std::vector<WalkBlock> blocks;
  std::vector<KiviSpan> spans;
  static Walk& local() {
    thread_local Walk w;
    return w;
  }
};

// The online softmax state of the nq query heads of one KV head over some keys, in a float buffer:
// running max m [nq], sum l [nq], accumulated V zero-point term z [nq] (added to every channel at
// the end) and V accumulator acc [nq][D]. l == 0: no key seen yet.
struct State {
  float *m, *l, *z, *acc;
  State(float* p, int nq) : m(p), l(p + nq), z(p + 2 * nq), acc(p + 3 * nq) {}
  static size_t floats(int nq, int D) { return size_t(nq) * (size_t(D) + 3); }

  void reset(int nq, int D) {
    std::fill_n(m, nq, -std::numeric_limits<float>::infinity());
    std::fill_n(l, nq, 0.f);
    std::fill_n(z, nq, 0.f);
    std::fill_n(acc, size_t(nq) * size_t(D), 0.f);
  }

  // Folds in src, the state over later keys. An empty state takes src bit for bit.
  void merge(const State& src, int nq, int D) {
    for (int h = 0; h < nq; ++h) {
      if (src.l[h] == 0.f) continue;
      float* a = acc + size_t(h) * size_t(D);
      const float* b = src.acc + size_t(h) * size_t(D);
      if (l[h] == 0.f) {
        m[h] = src.m[h];
        l[h] = src.l[h];
        z[h] = src.z[h];
        std::copy_n(b, D, a);
        continue;
      }
      const float new_m = std::max(m[h], src.m[h]);
      const float c1 = std::exp(m[h] - new_m), c2 = std::exp(src.m[h] - new_m);
      m[h] = new_m;
      l[h] = l[h] * c1 + src.l[h] * c2;
      z[h] = z[h] * c1 + src.z[h] * c2;
      for (int d = 0; d < D; ++d) a[d] = a[d] * c1 + b[d] * c2;
    }
  }
};

}  // namespace

void KVCache::attend(int layer, const float* q, int T, int n_heads, float* out, ThreadPool& pool) {
  const Layer& L = layers_[size_t(layer)];
  const int B = cfg_.group_size, D = shape_.head_dim, H = shape_.n_kv_heads, half = D / 2;
  const int N = cfg_.sink, M = cfg_.window;
  const bool stream_mode = cfg_.streaming();
  const int64_t win = L.window, native = L.native;
  const bool rotate = rotates_at_read();
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t n_total = L.n_sink + L.end;
  const int64_t n_before = n_total - T;
  const size_t elem = dtype_size(dense_);
  const size_t dense_half = size_t(B) * size_t(shape_.kv_dim()) * elem;
  const size_t pk = bits_ ? packed_bytes(D, bits_) : 0;
  PTLLM_CHECK(n_before >= 0 && n_heads % H == 0);
  const int group = n_heads / H;
  const size_t state_floats = State::floats(group, D);

  // What query t sees: sinks [sink_lo, n_sink_vis) (none when empty), stream indices [lo, si] (none
  // when si < lo). A sliding layer sees a sink only while it is within its window (the intersection
  // with what StreamingLLM keeps).
  struct Visible {
    int64_t sink_lo, n_sink_vis, lo, si;
  };
  auto visible = [&](int t) {
    const int64_t i = n_before + t;  // global index of the query
    Visible v{native > 0 ? std::max<int64_t>(0, i - native + 1) : 0, std::min<int64_t>(L.n_sink, i + 1), 0, -1};
    if (i >= L.n_sink) {
      v.si = i - L.n_sink;
      v.lo = win > 0 ? std::max<int64_t>(0, v.si - win + 1) : 0;
      PTLLM_CHECK(v.lo >= L.begin);
    }
    return v;
  };
  // Part 0 holds the sinks; part 1 + k the stream indices [(p0 + k) * part_len, (p0 + k + 1) * part_len).
  const int64_t part_len = int64_t(std::max(1, kPartTokens / B)) * B;
  const Visible first = visible(0), last = visible(T - 1);
  // Queries are consecutive: when the first is a sink, the first stream query sees stream index 0.
  const int64_t p0 = first.si >= 0 ? first.lo / part_len : 0;
  const int n_parts = 1 + (last.si >= 0 ? int(last.si / part_len - p0 + 1) : 0);
  // Stream indices [a, b] of part `part` that query t sees (empty when b < a).
  auto part_range = [&](const Visible& v, int part, int64_t& a, int64_t& b) {
    const int64_t start = (p0 + part - 1) * part_len;
    a = std::max(v.lo, start);
    b = std::min(v.si, start + part_len - 1);
  };
  auto sees_part = [&](int t, int part) {
    const Visible v = visible(t);
    if (part == 0) return v.n_sink_vis > v.sink_lo;
    int64_t a, b;
    part_range(v, part, a, b);
    return a <= b;
  };

  // Prefill walks the keys for a tile of up to kTile consecutive query tokens at once (per KV head):
  // a block of which all the tile's queries see the same slots is read from memory once for their
  // tile * group heads (and converted or unpacked once per kernel pass of 4 heads); where their
  // slots differ (the causal edge, the window's lower edge) each query takes the block alone. Per
  // head, the kernels' arithmetic does not depend on which other heads share the call, so a token's
  // output is bit for bit the same in any tile, batch or thread.
  // Per-thread scratch: [kTile][group][part_cols] scores (a part's stream tokens, or the sinks),
  // [kTile][group][D] queries (gathered or rotated), [B][D] keys as float32 (rotated, cache positions).
  const int part_cols = int(std::max<int64_t>(part_len, int64_t(ceil_div(N, B)) * B));
  const size_t tile_heads = size_t(kTile) * size_t(group);
  const size_t scratch_floats = tile_heads * size_t(part_cols) + tile_heads * size_t(D) + size_t(B) * size_t(D);
  const size_t tile_state_floats = State::floats(int(tile_heads), D);
  auto cos_at = [&](int64_t delta) {
    PTLLM_CHECK(delta >= 0 && delta < max_delta_);
    return rope_cos_.data() + size_t(delta) * size_t(half);
  };
  auto sin_at = [&](int64_t delta) { return rope_sin_.data() + size_t(delta) * size_t(half); };
  auto query = [&](int t, int g) {  // [group][D]
    return q + (size_t(t) * size_t(n_heads) + size_t(g) * size_t(group)) * size_t(D);
  };

  // KV head g's K and V rows in a block (row: bytes of one): codes with their f16 scales and zeros
  // when quantized (kivi_offsets), else rows of dense_ (K [H][B][D], then V the same).
  struct Rows {
    const uint8_t *k = nullptr, *v = nullptr;
    size_t row = 0;
    const uint16_t *ks = nullptr, *kz = nullptr, *vs = nullptr, *vz = nullptr;
  };
  auto rows_of = [&](const uint8_t* blk, bool quantized, int g) {
    if (!quantized) {
      const uint8_t* k = blk + size_t(g) * size_t(B) * size_t(D) * elem;
      return Rows{k, k + dense_half, size_t(D) * elem};
    }
    const KiviOffsets o = kivi_offsets(g, H, B, D, pk);
    auto u16 = [&](size_t off) { return reinterpret_cast<const uint16_t*>(blk + off); };
    return Rows{blk + o.kc, blk + o.vc, pk, u16(o.ks), u16(o.kz), u16(o.vs), u16(o.vz)};
  };

  // The states of the heads of KV head g of queries [t0, t0 + nt) over part `part`, into st
  // (nt * group heads, query i's heads at [i * group, (i + 1) * group)), in three passes over the
  // part's blocks: the scores of all its keys (the part is at most kPartTokens wide, so they stay in
  // the first-level cache), one softmax over them per head, then the values. Against an online
  // softmax block by block this leaves one max and one exp pass per head and part instead of one per
  // block (at int4 those took half as long as the scores), and no rescaling of the accumulators.
  auto run_part = [&](int t0, int nt, int g, int part, State st, float* scratch) {
    const int nh = nt * group;
    float* scores = scratch;                               // [nt * group][part_cols], by slot in the part
    float* qb = scores + tile_heads * size_t(part_cols);   // [nt * group][D]
    float* kr = qb + tile_heads * size_t(D);               // [B][D]
    const size_t ld = size_t(part_cols);
    st.reset(nh, D);
    if (!rotate)
      for (int i = 0; i < nt; ++i)
        std::copy_n(query(t0 + i, g), size_t(group) * size_t(D), qb + size_t(i) * size_t(group) * size_t(D));

    auto data_of = [&](const Entry& e) { return e.quantized ? quant_pool_.data(e.id) : dense_pool_.data(e.id); };
    // Queries [j0, j1) of a block all seeing slots [a0, b0), or each query alone where they differ
    // (the causal edge, the window's lower edge).
    auto for_runs = [&](const WalkBlock& k, auto&& fn) {
      if (k.same) {
        fn(k.i0, k.i1, k.a[k.i0], k.b[k.i0]);
      } else {
        for (int i = k.i0; i < k.i1; ++i)
          if (k.a[i] < k.b[i]) fn(i, i + 1, k.a[i], k.b[i]);
      }
    };
    // Prefetch: a head's K (or V) in a block is a few KB, one page or less, and blocks are not
    // adjacent, so the hardware prefetchers (which follow a stream within a page) would start each
    // block cold and attention over a cache larger than the last-level cache would wait on memory.
    // While the keys of a block are scored (or their values summed), the kernels ask for the rows read
    // two blocks later (Block), a few lines per row read: a steady trickle ahead (asking for a whole
    // block at once fills the core's miss buffers and stalls it). Their scales (a line or two each)
    // are asked for here (blocks one at a time) or by the span kernels.
    // Entry e's K (values: V) rows from slot a0, with their scales asked for (unless not `scales`:
    // the span kernels ask for those themselves); null when e is.
    auto ahead = [&](const Entry* e, bool values, int a0, bool scales = true) -> const uint8_t* {
      if (!e) return nullptr;
      const Rows r = rows_of(data_of(*e), e->quantized, g);
      if (e->quantized && scales) {
        if (values)
          prefetch_f16(r.vs, B), prefetch_f16(r.vz, B);
        else
          prefetch_f16(r.ks, D), prefetch_f16(r.kz, D);
      }
      return (values ? r.v : r.k) + size_t(a0) * r.row;
    };

    // Pass 1: scores. Quantized: q.k_j = (q * s) . c_j + q . z with per-channel (s, z), the softmax
    // scale folded in. Cache positions: the score of key slot j is R(delta0 - j) q . k_j =
    // R(delta0) q . R(j) k_j (RoPE depends only on the difference), so the block's keys (as float32,
    // in kr) are rotated by j once for every head and each query once per block, instead of each
    // query once per key.
    auto score = [&](const WalkBlock& k) {
      const int lo = *std::min_element(k.a + k.i0, k.a + k.i1), hi = *std::max_element(k.b + k.i0, k.b + k.i1);
      const Rows cur = rows_of(k.data, k.quantized, g);
      if (rotate) {
        float* k0 = kr + size_t(lo) * size_t(D);
        if (k.quantized)
          kivi_k_dequant(KRows{cur.k, B, lo}, cur.ks, cur.kz, hi - lo, D, bits_, k0);
        else
          load_from(cur.k + size_t(lo) * cur.row, dense_, k0, (hi - lo) * D);
        for (int j = lo; j < hi; ++j) {
          float* kj = kr + size_t(j) * size_t(D);
          rope_rotate_one(kj, D, cos_at(j), sin_at(j), kj);  // in place
        }
        for (int i = k.i0; i < k.i1; ++i) {
          if (k.a[i] >= k.b[i]) continue;
          const float *c = cos_at(k.delta0[i]), *sn = sin_at(k.delta0[i]);
          for (int r = 0; r < group; ++r)
            rope_rotate_one(query(t0 + i, g) + size_t(r) * size_t(D), D, c, sn,
                            qb + (size_t(i) * size_t(group) + size_t(r)) * size_t(D));
        }
      }
      for_runs(k, [&](int j0, int j1, int a0, int b0) {
        const int n = b0 - a0, h0 = j0 * group, nq = (j1 - j0) * group;
        float* sc = scores + size_t(h0) * ld + size_t(k.col + a0);
        const float* qq = qb + size_t(h0) * size_t(D);
        // (Quantized K rows ahead: the group's, from its first key.)
        const uint8_t* nk = ahead(k.k_ahead, k.near_end, k.quantized && !k.near_end ? 0 : a0);
        if (rotate)
          dense_k_block(qq, nq, kr + size_t(a0) * size_t(D), DType::F32, scale, n, D, sc, int(ld));
        else if (k.quantized)
          kivi_k_block(qq, nq, KRows{cur.k, B, a0}, cur.ks, cur.kz, scale, n, D, bits_, sc, int(ld), nk);
        else
          dense_k_block(qq, nq, cur.k + size_t(a0) * cur.row, dense_, scale, n, D, sc, int(ld), nk);
      });
    };
    // Pass 3: values (quantized: sum p_j v_j = sum (p_j s_j) c_j + (sum p_j z_j) 1 with per-token
    // (s_j, z_j)).
    auto sum_values = [&](const WalkBlock& k) {
      const Rows cur = rows_of(k.data, k.quantized, g);
      for_runs(k, [&](int j0, int j1, int a0, int b0) {
        const int n = b0 - a0, h0 = j0 * group, nq = (j1 - j0) * group;
        const float* p = scores + size_t(h0) * ld + size_t(k.col + a0);
        const uint8_t* nv = ahead(k.v_ahead, !k.near_end, a0);
        float* acc = st.acc + size_t(h0) * size_t(D);
        if (k.quantized)
          kivi_v_block(p, int(ld), nq, cur.v + size_t(a0) * cur.row, cur.vs + a0, cur.vz + a0, n, D, bits_, acc,
                       st.z + h0, nv);
        else
          dense_v_block(p, int(ld), nq, cur.v + size_t(a0) * cur.row, dense_, n, D, acc, nv);
      });
    };

    Visible v[kTile];
    // The query's slot in the cache: its index, capped once StreamingLLM's window is full. Not on a
    // sliding layer: its keys are all within its window, where cache slots and indices are the same
    // distance apart, and a sink it sees keeps its true distance too (the one the model was trained on).
    int64_t q_slot[kTile];
    const bool cap_slot = stream_mode && native == 0;
    for (int i = 0; i < nt; ++i) {
      v[i] = visible(t0 + i);
      q_slot[i] = cap_slot ? std::min<int64_t>(n_before + t0 + i, int64_t(N) + M - 1) : n_before + t0 + i;
    }
    // Queries [i0, i1) of the tile that see some of a block: an interval, since both ends of the
    // visible range grow with the query index.
    auto active = [&](WalkBlock& k) {
      k.i0 = 0;
      while (k.i0 < nt && k.a[k.i0] >= k.b[k.i0]) ++k.i0;
      k.i1 = k.i0;
      while (k.i1 < nt && k.a[k.i1] < k.b[k.i1]) ++k.i1;
      for (int i = k.i1; i < nt; ++i) PTLLM_CHECK(k.a[i] >= k.b[i]);
      k.same = true;
      for (int i = k.i0; i < k.i1; ++i) k.same = k.same && k.a[i] == k.a[k.i0] && k.b[i] == k.b[k.i0];
      return k.i0 < k.i1;
    };
    // The part's blocks in order, written in place into walk.blocks [0, nb) (no copies: a block is
    // ~180 bytes); query i sees columns [c0[i], c1[i]) of the scores.
    int c0[kTile], c1[kTile];
    Walk& walk = Walk::local();
    const size_t most = ceil_div(part_cols, B) + 1;  // blocks a part can touch (sized once: decode allocates nothing)
    if (walk.blocks.size() < most) walk.blocks.resize(most);
    walk.spans.reserve(most);
    size_t nb = 0;
    auto collect = [&] {
      if (part == 0) {
        // Sinks: global indices [sink_lo, n_sink_vis), cache slot = index.
        int64_t n_sink = 0;
        for (int i = 0; i < nt; ++i) {
          const bool any = v[i].sink_lo < v[i].n_sink_vis;
          n_sink = std::max(n_sink, v[i].n_sink_vis);
          c0[i] = any ? int(v[i].sink_lo) : 0;
          c1[i] = any ? int(v[i].n_sink_vis) : 0;
        }
        for (int64_t s0 = 0; s0 < n_sink; s0 += B) {
          WalkBlock& k = walk.blocks[nb];
          for (int i = 0; i < nt; ++i) {
            k.a[i] = int(std::clamp<int64_t>(v[i].sink_lo - s0, 0, B));
            k.b[i] = int(std::clamp<int64_t>(v[i].n_sink_vis - s0, 0, B));
            k.delta0[i] = q_slot[i] - s0;
          }
          if (!active(k)) continue;
          k.data = dense_pool_.data(L.sinks[size_t(s0 / B)]);
          k.quantized = false;
          k.col = int(s0);
          k.k_ahead = k.v_ahead = nullptr;
          k.near_end = false;
          ++nb;
        }
        return;
      }
      const int64_t start = (p0 + part - 1) * part_len;  // stream index of column 0
      int64_t lo[kTile], hi[kTile], lo_all = std::numeric_limits<int64_t>::max(), hi_all = -1;
      for (int i = 0; i < nt; ++i) {
        part_range(v[i], part, lo[i], hi[i]);
        c0[i] = c1[i] = 0;
        if (lo[i] > hi[i]) continue;
        c0[i] = int(lo[i] - start);
        c1[i] = int(hi[i] + 1 - start);
        lo_all = std::min(lo_all, lo[i]);
        hi_all = std::max(hi_all, hi[i]);
      }
      if (hi_all < 0) return;
      const size_t e0 = size_t((lo_all - L.begin) / B), e_last = size_t((hi_all - L.begin) / B);
      for (size_t e = e0; e < L.stream.size(); ++e) {
        const int64_t first_slot = L.begin + int64_t(e) * B;
        if (first_slot > hi_all) break;
        WalkBlock& k = walk.blocks[nb];
        for (int i = 0; i < nt; ++i) {
          k.a[i] = int(std::clamp<int64_t>(lo[i] - first_slot, 0, B));
          k.b[i] = int(std::clamp<int64_t>(hi[i] + 1 - first_slot, 0, B));
          if (lo[i] > hi[i]) k.a[i] = k.b[i] = 0;
          // Distances of window keys equal their index distances in both position schemes.
          k.delta0[i] = v[i].si - first_slot;
        }
        if (!active(k)) continue;
        const Entry& en = L.stream[e];
        k.data = data_of(en);
        k.quantized = en.quantized;
        k.col = int(first_slot - start);
        // Two blocks ahead: a block's K (or V) is read in less time than memory takes to answer.
        k.near_end = e + 2 > e_last;
        const size_t ka = k.near_end ? e + 2 - (e_last - e0 + 1) : e + 2;
        k.k_ahead = ka < L.stream.size() ? &L.stream[ka] : nullptr;
        k.v_ahead = e + 2 < L.stream.size() ? &L.stream[e + 2] : nullptr;
        ++nb;
      }
    };
    // Runs of consecutive quantized blocks read as stored (no rotation), each seen alike by every
    // query of the call and by the same queries, go to the span kernels in one call (a decode step:
    // all the part's quantized blocks): one call a pass instead of one a block, accumulators kept in
    // registers between blocks. Other blocks, one at a time. Either way the same sums in the same order.
    collect();
    auto spanned = [&](const WalkBlock& k) { return k.quantized && !rotate && k.same; };
    // The spans of the spanned blocks, in order, built once for both passes.
    walk.spans.clear();
    for (size_t i = 0; i < nb; ++i) {
      const WalkBlock& b = walk.blocks[i];
      if (!spanned(b)) continue;
      const int a0 = b.a[b.i0];
      const Rows r = rows_of(b.data, true, g);
      KiviSpan& sp = walk.spans.emplace_back();  // filled in place (a copy would stall on store forwarding)
      sp.k = r.k;
      sp.k0 = a0;
      sp.v = r.v + size_t(a0) * pk;
      sp.ks = r.ks;
      sp.kz = r.kz;
      sp.vs = r.vs + a0;
      sp.vz = r.vz + a0;
      sp.n = b.b[b.i0] - a0;
      sp.col = b.col + a0;
      // The rows two blocks ahead, from the list where they are in it (the same as `ahead` finds).
      const WalkBlock* b2 = i + 2 < nb ? &walk.blocks[i + 2] : nullptr;
      if (!b.near_end && b2 && b2->quantized) {
        const Rows r2 = rows_of(b2->data, true, g);
        sp.k_next = r2.k;
        sp.v_next = r2.v + size_t(a0) * pk;
      } else {
        sp.k_next = ahead(b.k_ahead, b.near_end, b.near_end ? a0 : 0, false);
        sp.v_next = ahead(b.v_ahead, !b.near_end, a0, false);
      }
    }
    auto for_each = [&](auto&& one, auto&& many) {
      size_t sp = 0;  // the next span
      for (size_t i = 0; i < nb;) {
        const WalkBlock& k = walk.blocks[i];
        if (!spanned(k)) {
          one(k);
          ++i;
          continue;
        }
        const size_t s0 = sp;
        for (; i < nb && spanned(walk.blocks[i]) && walk.blocks[i].i0 == k.i0 && walk.blocks[i].i1 == k.i1; ++i) ++sp;
        many(k.i0 * group, (k.i1 - k.i0) * group, walk.spans.data() + s0, int(sp - s0));
      }
    };
    for_each(score, [&](int h0, int nq, const KiviSpan* sp, int ns) {
      kivi_k_spans(qb + size_t(h0) * size_t(D), nq, sp, ns, B, scale, D, bits_, scores + size_t(h0) * ld, int(ld));
    });
    // Pass 2: each head's softmax numerators e^(x - m) over its columns, in place, and their sum.
    for (int i = 0; i < nt; ++i) {
      const int n = c1[i] - c0[i];
      if (n <= 0) continue;
      for (int r = 0; r < group; ++r) {
        const int h = i * group + r;
        float* x = scores + size_t(h) * ld + size_t(c0[i]);
        st.m[h] = max_of(x, n);
        st.l[h] = exp_sum(x, n, st.m[h]);
      }
    }
    for_each(sum_values, [&](int h0, int nq, const KiviSpan* sp, int ns) {
      kivi_v_spans(scores + size_t(h0) * ld, int(ld), nq, sp, ns, D, bits_, st.acc + size_t(h0) * size_t(D),
                   st.z + h0);
    });
  };
  // Query t0 + i's heads of KV head g, from the state of the tile.
  auto write_out = [&](int t0, int nt, int g, const State& st) {
    for (int i = 0; i < nt; ++i)
      for (int r = 0; r < group; ++r) {
        const int h = i * group + r;
        float* o = out + (size_t(t0 + i) * size_t(n_heads) + size_t(g) * size_t(group) + size_t(r)) * size_t(D);
        const float* acc = st.acc + size_t(h) * size_t(D);
        const float inv = 1.0f / st.l[h];
        for (int d = 0; d < D; ++d) o[d] = (acc[d] + st.z[h]) * inv;
      }
  };

  const size_t items = size_t(T) * size_t(H);
  // Each thread's scratch, then a part's state, then the running one. Obtained through a function
  // call on the thread that uses it: a block-scope thread_local is only constructed (and destroyed at
  // thread exit) on threads that pass its declaration, which pool workers running the lambda do not.
  auto local_buffers = [&] {
    std::vector<float>& local = attention_scratch();
    const size_t need = scratch_floats + 2 * tile_state_floats + 15;
    if (local.size() < need) local.resize(need);
    // From a 64-byte boundary: the kernels' full-register loads and stores of scores and queries
    // never straddle two cache lines.
    const uintptr_t a = reinterpret_cast<uintptr_t>(local.data());
    return local.data() + ((64 - a % 64) % 64) / sizeof(float);
  };
  if (pool.size() > 1 && items < 4 * size_t(pool.size())) {
    // Few (token, KV head) pairs (decode): every part is a piece of work, merged afterwards.
    thread_local std::vector<float> parts;  // [T][H][n_parts] states
    const size_t need = items * size_t(n_parts) * state_floats;
    if (parts.size() < need) parts.resize(need);
    float* pbuf = parts.data();
    pool.parallel_for(items * size_t(n_parts), [&](size_t begin, size_t end) {
      float* buf = local_buffers();
      for (size_t it = begin; it < end; ++it) {
        const int t = int(it / (size_t(H) * size_t(n_parts))), g = int(it / size_t(n_parts) % size_t(H));
        const int part = int(it % size_t(n_parts));
        State st(pbuf + it * state_floats, group);
        if (sees_part(t, part))
          run_part(t, 1, g, part, st, buf);
        else
          st.reset(group, D);
      }
    });
    float* buf = local_buffers();
    State run(buf + scratch_floats + tile_state_floats, group);
    for (size_t it = 0; it < items; ++it) {
      run.reset(group, D);
      for (int part = 0; part < n_parts; ++part)
        run.merge(State(pbuf + (it * size_t(n_parts) + size_t(part)) * state_floats, group), group, D);
      write_out(int(it / size_t(H)), 1, int(it % size_t(H)), run);
    }
  } else {
    // (tile of kTile tokens, KV head) pieces.
    const size_t n_tiles = size_t(ceil_div(T, kTile));
    pool.parallel_for(n_tiles * size_t(H), [&](size_t begin, size_t end) {
      float* buf = local_buffers();
      for (size_t it = begin; it < end; ++it) {
        const int t0 = int(it / size_t(H)) * kTile, g = int(it % size_t(H));
        const int nt = std::min(kTile, T - t0), nh = nt * group;
        State part_st(buf + scratch_floats, nh), run(buf + scratch_floats + tile_state_floats, nh);
        run.reset(nh, D);
        for (int part = 0; part < n_parts; ++part) {
          bool seen = false;
          for (int i = 0; i < nt && !seen; ++i) seen = sees_part(t0 + i, part);
          if (!seen) continue;
          run_part(t0, nt, g, part, part_st, buf);
          run.merge(part_st, nh, D);
        }
        write_out(t0, nt, g, run);
      }
    });
  }
}

// ---------------------------------------------------------------------------------------------
// Policy: eviction and quantization, after each attention call.

void KVCache::release_front(Layer& L) {
  const Entry e = L.stream[0];
  if (e.quantized) {
    quant_pool_.release(e.id);
    --L.n_quant;
  } else {
    dense_pool_.release(e.id);
  }
  L.stream.pop_front();
  L.begin += cfg_.group_size;
}

void KVCache::quantize_block(Layer& L, size_t entry) {
  Entry& e = L.stream[entry];
  PTLLM_CHECK(!e.quantized && dense_ == DType::F32);
  const int B = cfg_.group_size, D = shape_.head_dim, H = shape_.n_kv_heads;
  // On a shared pool another sequence may have quantized this very content already (quantization is
  // a function of the group's content): take its group instead.
  if (const BlockKey* key = dense_pool_.key_of(e.id)) {
    BlockKey qkey = *key;
    qkey.quantized = true;
    const int32_t hit = quant_pool_.find(qkey, dense_pool_.tokens_of(e.id));
    if (hit >= 0) {
      dense_pool_.release(e.id);
      e = {hit, true};
      return;
    }
  }
  const size_t pk = packed_bytes(D, bits_);
  const int32_t qid = quant_pool_.acquire();
  PTLLM_CHECK(qid >= 0);  // a private pool is sized for the worst case; a shared one is checked before the step
  const float* src = reinterpret_cast<const float*>(dense_pool_.data(e.id));
  const float* vsrc = src + size_t(B) * size_t(shape_.kv_dim());
  uint8_t* blk = quant_pool_.data(qid);
  auto u16 = [&](size_t off) { return reinterpret_cast<uint16_t*>(blk + off); };
  for (int g = 0; g < H; ++g) {
    const KiviOffsets o = kivi_offsets(g, H, B, D, pk);
    // K: one (scale, zero) per channel over the group, computed once, never again.
    quantize_k_group(src + size_t(g) * size_t(B) * size_t(D), size_t(D), B, D, bits_, blk + o.kc, u16(o.ks),
                     u16(o.kz));
    // V: one (scale, zero) per token.
    for (int j = 0; j < B; ++j)
      quantize_v_token(vsrc + (size_t(g) * size_t(B) + size_t(j)) * size_t(D), D, bits_, blk + o.vc + size_t(j) * pk,
                       u16(o.vs) + j, u16(o.vz) + j);
  }
  if (const BlockKey* key = dense_pool_.key_of(e.id)) {
    BlockKey qkey = *key;
    qkey.quantized = true;
    quant_pool_.publish(qid, qkey, dense_pool_.tokens_of(e.id));
  }
  dense_pool_.release(e.id);
  e = {qid, true};
}

void KVCache::apply_policy(int layer) {
  Layer& L = layers_[size_t(layer)];
  const int B = cfg_.group_size;
  // StreamingLLM or a sliding layer: give back blocks whose every token is out of the last query's window.
  if (L.window > 0) {
    const int64_t lo = L.end - L.window;
    while (!L.stream.empty() && L.begin + B <= lo) release_front(L);
  }
  // KIVI: the residual keeps at least R recent tokens; each full group beyond them is quantized.
  if (bits_ > 0) {
    while (L.n_quant < L.stream.size()) {
      const int64_t residual_start = L.begin + int64_t(L.n_quant) * B;
      if (L.end - residual_start < int64_t(cfg_.residual) + B) break;
      quantize_block(L, L.n_quant);
      ++L.n_quant;
    }
  }
}

// ---------------------------------------------------------------------------------------------

int64_t KVCache::rewind_floor() const {
  int64_t floor = 0;
  for (const Layer& L : layers_) {
    if (L.begin == 0 && L.n_quant == 0) continue;
    // Not into quantized or evicted tokens, and the next query's window must still be stored.
    int64_t f = L.n_sink + L.begin + int64_t(L.n_quant) * cfg_.group_size;
    if (L.window > 0 && L.begin > 0) f = std::max<int64_t>(f, L.n_sink + L.begin + L.window - 1);
    floor = std::max(floor, f);
  }
  return floor;
}

void KVCache::truncate(int64_t n) {
  if (n < 0 || n > n_tokens())
    throw Error("cannot rewind to " + std::to_string(n) + " tokens: the cache holds " + std::to_string(n_tokens()));
  if (n < rewind_floor())
    throw Error("cannot rewind to " + std::to_string(n) + " tokens: tokens before " + std::to_string(rewind_floor()) +
                " have been evicted or quantized");
  if (shares_pool() && dense_pool_.available() < 2 * layers_.size())
    throw KVPoolFull("KV pool: no room to rewind (a shared block would be copied)");
  const int B = cfg_.group_size;
  for (Layer& L : layers_) {
    L.n_sink = int(std::min<int64_t>(L.n_sink, n));
    L.end = std::min<int64_t>(L.end, std::max<int64_t>(0, n - L.n_sink));
    while (L.sinks.size() > ceil_div(L.n_sink, B)) {
      dense_pool_.release(L.sinks.back());
      L.sinks.pop_back();
    }
    while (L.stream.size() > ceil_div(L.end - L.begin, B)) {
      const Entry e = L.stream[L.stream.size() - 1];
      PTLLM_CHECK(!e.quantized);
      dense_pool_.release(e.id);
      L.stream.pop_back();
    }
    // The next append writes into the block now partly filled: it must be this sequence's alone.
    if (L.n_sink < cfg_.sink && L.n_sink % B != 0) own_block(L.sinks.back());
    if ((L.end - L.begin) % B != 0) own_block(L.stream[L.stream.size() - 1].id);
  }
  n_keyed_ = 0;  // the keys are derived again from the history at the next step
}

void KVCache::own_block(int32_t& id) {
  if (dense_pool_.refs(id) == 1) {
    dense_pool_.unpublish(id);
    return;
  }
  const int32_t copy = dense_pool_.acquire();
  PTLLM_CHECK(copy >= 0);  // truncate() checked the room first
  std::memcpy(dense_pool_.data(copy), dense_pool_.data(id), size_t(cfg_.group_size) * dense_token_bytes_);
  dense_pool_.release(id);
  id = copy;
}

void KVCache::clear() {
  n_keyed_ = 0;
  for (Layer& L : layers_) {
    for (int32_t id : L.sinks) dense_pool_.release(id);
    L.sinks.clear();
    while (!L.stream.empty()) release_front(L);
    L.n_sink = 0;
    L.begin = L.end = 0;
  }
}

size_t KVCache::logical_bytes() const {
  const int B = cfg_.group_size, D = shape_.head_dim, H = shape_.n_kv_heads;
  size_t total = 0;
  for (const Layer& L : layers_) {
    // The sinks and stream tokens the last query saw.
    const int64_t sink_lo = L.native > 0 ? std::max<int64_t>(0, L.n_sink + L.end - L.native) : 0;
    total += size_t(std::max<int64_t>(0, L.n_sink - sink_lo)) * dense_token_bytes_;
    const int64_t lo = L.window > 0 ? std::max<int64_t>(0, L.end - L.window) : 0;
    for (size_t e = 0; e < L.stream.size(); ++e) {
      const int64_t first = L.begin + int64_t(e) * B;
      const int64_t visible = std::max<int64_t>(0, std::min<int64_t>(first + B, L.end) - std::max(first, lo));
      if (visible == 0) continue;
      if (L.stream[e].quantized) {
        // codes for K and V, V scale+zero per token; K scale+zero per channel for the group
        total += size_t(H) * (size_t(visible) * (2 * packed_bytes(D, bits_) + 2 * sizeof(uint16_t)) +
                              2 * sizeof(uint16_t) * size_t(D));
      } else {
        total += size_t(visible) * dense_token_bytes_;
      }
    }
  }
  return total;
}

size_t KVCache::physical_bytes() const { return dense_pool_.physical_bytes() + quant_pool_.physical_bytes(); }

// ---------------------------------------------------------------------------------------------
// Prefix sharing. The token blocks of a sequence are its sink blocks (the first N tokens in blocks of
// B, the last one shorter when B does not divide N), then stream blocks of B tokens; every layer
// stores them alike. A token block's key chains the previous one's with its first index and token
// ids (XXH3-128), from a root that hashes the KV settings and the shape: two blocks share a key only
// if every token before and in them is the same, and so are their bytes.

namespace {
struct Key128 {
  uint64_t lo, hi;
};

Key128 root_key(const KVShape& shape, const KVCacheConfig& cfg) {
  const std::string salt = cfg.describe() + " L" + std::to_string(shape.n_layers) + " H" +
                           std::to_string(shape.n_kv_heads) + " D" + std::to_string(shape.head_dim);
  const XXH128_hash_t h = XXH3_128bits(salt.data(), salt.size());
  return {h.low64, h.high64};
}

Key128 chain_key(Key128 parent, int64_t start, std::span<const int32_t> tokens) {
  const XXH128_hash_t t = XXH3_128bits(tokens.data(), tokens.size_bytes());
  const uint64_t words[5] = {parent.lo, parent.hi, uint64_t(start), t.low64, t.high64};
  const XXH128_hash_t h = XXH3_128bits(words, sizeof words);
  return {h.low64, h.high64};
}
}  // namespace

KVCache::TokenBlock KVCache::token_block(size_t j) const {
  const int B = cfg_.group_size, N = cfg_.streaming() ? cfg_.sink : 0;
  const size_t n_sink_blocks = ceil_div(N, B);
  if (j < n_sink_blocks) return {int64_t(j) * B, std::min(B, N - int(j) * B)};
  return {N + int64_t(j - n_sink_blocks) * B, B};
}

// The block holding token block j in layer L, or -1 when it is not stored (evicted, not yet there).
int32_t KVCache::block_of(const Layer& L, size_t j, bool* quantized) const {
  const int B = cfg_.group_size, N = cfg_.streaming() ? cfg_.sink : 0;
  const size_t n_sink_blocks = ceil_div(N, B);
  *quantized = false;
  if (j < n_sink_blocks) return j < L.sinks.size() ? L.sinks[j] : -1;
  const int64_t entry = int64_t(j - n_sink_blocks) - L.begin / B;
  if (entry < 0 || entry >= int64_t(L.stream.size())) return -1;
  *quantized = L.stream[size_t(entry)].quantized;
  return L.stream[size_t(entry)].id;
}

void KVCache::end_step(std::span<const int32_t> history) {
  PTLLM_CHECK(int64_t(history.size()) == n_tokens());
  if (pool_->keyed()) {
    if (n_keyed_ == 0) {
      const Key128 r = root_key(shape_, cfg_);
      chain_lo_ = r.lo;
      chain_hi_ = r.hi;
    }
    // Publish every token block filled since the last step, in every layer that still stores it.
    for (TokenBlock tb = token_block(n_keyed_); tb.start + tb.len <= int64_t(history.size());
         tb = token_block(++n_keyed_)) {
      const auto ids = history.subspan(size_t(tb.start), size_t(tb.len));
      const Key128 k = chain_key({chain_lo_, chain_hi_}, tb.start, ids);
      chain_lo_ = k.lo;
      chain_hi_ = k.hi;
      for (size_t l = 0; l < layers_.size(); ++l) {
        bool quantized;
        const int32_t id = block_of(layers_[l], n_keyed_, &quantized);
        if (id >= 0) (quantized ? quant_pool_ : dense_pool_).publish(id, {k.lo, k.hi, int32_t(l), quantized}, ids);
      }
    }
  }
  for (int l = 0; l < shape_.n_layers; ++l) apply_policy(l);
}

BlocksNeeded KVCache::blocks_needed(int T) const {
  // Per layer: the blocks T tokens start (one more for a partly filled one), and as many groups
  // quantized after them.
  const size_t per = ceil_div(T, cfg_.group_size) + 1;
  const size_t L = layers_.size();
  return {L * per, bits_ ? L * per : 0};
}

// The longest run of `tokens`' token blocks (the last token left out) that every layer's pool holds,
// with a reference taken on each: got[block * layers + layer]. A layer's stream blocks are KIVI
// groups first, then full-precision blocks, as the policy leaves them.
size_t KVCache::adoptable_blocks(std::span<const int32_t> tokens, std::vector<Adopted>& got) {
  const size_t L = layers_.size();
  const size_t n_sink_blocks = ceil_div(cfg_.streaming() ? cfg_.sink : 0, cfg_.group_size);
  const size_t ring = layers_[0].stream.capacity();
  std::vector<uint8_t> dense_seen(L, 0);
  Key128 key = root_key(shape_, cfg_);
  size_t m = 0;
  for (TokenBlock tb = token_block(0); tb.start + tb.len < int64_t(tokens.size()); tb = token_block(++m)) {
    if (m >= n_sink_blocks && m - n_sink_blocks + 2 >= ring) break;  // the ring holds them until the policy runs
    const auto span = tokens.subspan(size_t(tb.start), size_t(tb.len));
    key = chain_key(key, tb.start, span);
    size_t l = 0;
    for (; l < L; ++l) {
      const BlockKey k{key.lo, key.hi, int32_t(l), false};
      Adopted a{dense_pool_.find(k, span), false};
      if (a.id >= 0) {
        dense_seen[l] = 1;
      } else if (bits_ && m >= n_sink_blocks && !dense_seen[l]) {
        BlockKey q = k;
        q.quantized = true;
        a = {quant_pool_.find(q, span), true};
      }
      if (a.id < 0) break;
      got.push_back(a);
    }
    if (l < L) {  // a layer misses: give back this block's references
      for (; l > 0; --l) {
        const Adopted a = got.back();
        got.pop_back();
        (a.quantized ? quant_pool_ : dense_pool_).release(a.id);
      }
      break;
    }
  }
  return m;
}

// Whether m adopted blocks leave no KIVI group where this sequence's own policy, having computed
// them, would keep full precision; and how many groups that policy would add (*to_quantize).
bool KVCache::adoption_exact(size_t m, const std::vector<Adopted>& got, size_t* to_quantize) const {
  const int B = cfg_.group_size;
  const size_t L = layers_.size();
  const size_t n_sink_blocks = ceil_div(cfg_.streaming() ? cfg_.sink : 0, B);
  const int64_t E = m > n_sink_blocks ? int64_t(m - n_sink_blocks) * B : 0;  // stream tokens
  *to_quantize = 0;
  for (size_t l = 0; l < L; ++l) {
    const int64_t w = layers_[l].window;
    const int64_t k0 = w > 0 ? std::max<int64_t>(0, (E - w) / B) : 0;  // blocks its window evicts
    const int64_t want = bits_ ? std::max<int64_t>(0, (E - k0 * B - cfg_.residual) / B) : 0;
    int64_t q = 0;
    for (size_t j = n_sink_blocks; j < m; ++j) q += got[j * L + l].quantized ? 1 : 0;
    const int64_t kept = std::max<int64_t>(0, q - k0);
    if (kept > want) return false;
    *to_quantize += size_t(want - kept);
  }
  return true;
}

int64_t KVCache::adopt_prefix(std::span<const int32_t> tokens) {
  PTLLM_CHECK(n_tokens() == 0);
  if (!shares_pool() || !pool_->keyed()) return 0;
  const size_t L = layers_.size();
  std::vector<Adopted> got;
  size_t m = adoptable_blocks(tokens, got);
  size_t to_quantize = 0;
  auto drop_last = [&] {
    for (size_t l = 0; l < L; ++l) {
      const Adopted a = got.back();
      got.pop_back();
      (a.quantized ? quant_pool_ : dense_pool_).release(a.id);
    }
    --m;
  };
  while (m > 0 && !adoption_exact(m, got, &to_quantize)) drop_last();
  // The policy after adoption quantizes what this sequence would have: room for it, or no adoption.
  if (to_quantize > quant_pool_.available())
    while (m > 0) drop_last();
  if (m == 0) return 0;
  const size_t n_sink_blocks = ceil_div(cfg_.streaming() ? cfg_.sink : 0, cfg_.group_size);
  for (size_t l = 0; l < L; ++l) {
    Layer& layer = layers_[l];
    for (size_t j = 0; j < m; ++j) {
      const Adopted a = got[j * L + l];
      if (j < n_sink_blocks) {
        layer.sinks.push_back(a.id);
        continue;
      }
      layer.stream.push_back({a.id, a.quantized});
      if (a.quantized) ++layer.n_quant;
    }
    const TokenBlock last = token_block(m - 1);
    const int64_t n = last.start + last.len;
    layer.n_sink = int(std::min<int64_t>(n, cfg_.streaming() ? cfg_.sink : 0));
    layer.begin = 0;
    layer.end = n - layer.n_sink;
  }
  n_keyed_ = 0;
  return n_tokens();
}

// ---------------------------------------------------------------------------------------------
// Serialization: per layer {n_sink i32, window i32 (the model's sliding window, 0: full attention),
// begin i64, end i64, n_quant u32, n_sink_blocks u32, n_entries u32}, then the sink blocks, then per
// stream entry {quantized u8, block bytes}.
// Little-endian, exact block sizes (the pool's alignment padding is not written).


void KVCache::serialize(std::string& out) const {
  const size_t dense_bytes = size_t(cfg_.group_size) * dense_token_bytes_;
  const size_t quant_bytes = bits_ ? size_t(shape_.n_kv_heads) * kivi_block_bytes_per_head(cfg_.group_size, shape_.head_dim, bits_) : 0;
  for (const Layer& L : layers_) {
    put_bytes<int32_t>(out, L.n_sink);
    put_bytes<int32_t>(out, L.native);
    put_bytes<int64_t>(out, L.begin);
    put_bytes<int64_t>(out, L.end);
    put_bytes<uint32_t>(out, uint32_t(L.n_quant));
    put_bytes<uint32_t>(out, uint32_t(L.sinks.size()));
    put_bytes<uint32_t>(out, uint32_t(L.stream.size()));
    for (int32_t id : L.sinks) out.append(reinterpret_cast<const char*>(dense_pool_.data(id)), dense_bytes);
    for (size_t e = 0; e < L.stream.size(); ++e) {
      const Entry& en = L.stream[e];
      put_bytes<uint8_t>(out, en.quantized ? 1 : 0);
      if (en.quantized)
        out.append(reinterpret_cast<const char*>(quant_pool_.data(en.id)), quant_bytes);
      else
        out.append(reinterpret_cast<const char*>(dense_pool_.data(en.id)), dense_bytes);
    }
  }
}

void KVCache::deserialize(std::string_view in) {
  PTLLM_CHECK(n_tokens() == 0);
  const int B = cfg_.group_size;
  const size_t dense_bytes = size_t(B) * dense_token_bytes_;
  const size_t quant_bytes = bits_ ? size_t(shape_.n_kv_heads) * kivi_block_bytes_per_head(B, shape_.head_dim, bits_) : 0;
  ByteReader r(in, "KV state");
  try {
    int64_t tokens = -1;
    for (Layer& L : layers_) {
      const int32_t n_sink = r.get<int32_t>();
      // Another model's windows would leave blocks this one's attention reads, or needs, missing.
      if (r.get<int32_t>() != L.native) throw Error("KV state was written for a model with other sliding windows");
      const int64_t begin = r.get<int64_t>(), end = r.get<int64_t>();
      const uint32_t n_quant = r.get<uint32_t>(), n_sink_blocks = r.get<uint32_t>(), n_entries = r.get<uint32_t>();
      const bool ok = n_sink >= 0 && n_sink <= (cfg_.streaming() ? cfg_.sink : 0) && begin >= 0 && begin % B == 0 &&
                      begin <= end && n_sink_blocks == ceil_div(n_sink, B) && n_entries == ceil_div(end - begin, B) &&
                      n_entries <= L.stream.capacity() && n_quant <= n_entries && (bits_ > 0 || n_quant == 0) && (tokens < 0 || tokens == n_sink + end) &&
                      (unbounded_ || n_sink + end <= cfg_.ctx_size) &&
                      // the next query's window must still be stored (rewind_floor)
                      (begin == 0 || (L.window > 0 && begin <= end - L.window + 1));
      if (!ok) throw Error("KV state has inconsistent block counts");
      tokens = n_sink + end;
      for (uint32_t b = 0; b < n_sink_blocks; ++b) {
        const int32_t id = dense_pool_.acquire();
        if (id < 0) throw Error("KV state holds more blocks than the configuration allows");
        L.sinks.push_back(id);
        std::memcpy(dense_pool_.data(id), r.bytes(dense_bytes), dense_bytes);
      }
      L.n_sink = n_sink;
      L.begin = L.end = begin;
      for (uint32_t e = 0; e < n_entries; ++e) {
        const bool quantized = r.get<uint8_t>() != 0;
        if (quantized != (e < n_quant)) throw Error("KV state has quantized blocks out of order");
        BlockPool& pool = quantized ? quant_pool_ : dense_pool_;
        const int32_t id = pool.acquire();
        if (id < 0) throw Error("KV state holds more blocks than the configuration allows");
        L.stream.push_back({id, quantized});
        if (quantized) ++L.n_quant;
        const size_t n = quantized ? quant_bytes : dense_bytes;
        std::memcpy(pool.data(id), r.bytes(n), n);
      }
      L.end = end;
    }
    if (r.pos() != in.size()) throw Error("KV state has trailing bytes");
  } catch (const Error&) {
    clear();
    throw;
  }
}

KVCache::Located KVCache::locate(int layer, int64_t index) const {
  const Layer& L = layers_[size_t(layer)];
  const int B = cfg_.group_size;
  if (index < L.n_sink) return {dense_pool_.data(L.sinks[size_t(index / B)]), false, int(index % B)};
  const int64_t s = index - L.n_sink;
  PTLLM_CHECK(s >= L.begin && s < L.end);
  const Entry& e = L.stream[size_t((s - L.begin) / B)];
  return {e.quantized ? quant_pool_.data(e.id) : dense_pool_.data(e.id), e.quantized, int(s % B)};
}

void KVCache::read_key(int layer, int64_t index, int g, float* out) const {
  const Located at = locate(layer, index);
  const int B = cfg_.group_size, D = shape_.head_dim, H = shape_.n_kv_heads;
  if (!at.quantized) {
    load_from(at.block + (size_t(g) * size_t(B) + size_t(at.slot)) * size_t(D) * dtype_size(dense_), dense_, out, D);
    return;
  }
  const size_t pk = packed_bytes(D, bits_);
  const KiviOffsets o = kivi_offsets(g, H, B, D, pk);
  std::vector<uint8_t> row(pk);
  k_rows_from_group(KRows{at.block + o.kc, B, at.slot}, 1, pk, row.data());
  dequantize_k_group(row.data(), reinterpret_cast<const uint16_t*>(at.block + o.ks),
                     reinterpret_cast<const uint16_t*>(at.block + o.kz), 1, D, bits_, out);
}

void KVCache::read_value(int layer, int64_t index, int g, float* out) const {
  const Located at = locate(layer, index);
  const int B = cfg_.group_size, D = shape_.head_dim, H = shape_.n_kv_heads;
  if (!at.quantized) {
    const size_t half = size_t(B) * size_t(shape_.kv_dim()) * dtype_size(dense_);
    load_from(at.block + half + (size_t(g) * size_t(B) + size_t(at.slot)) * size_t(D) * dtype_size(dense_), dense_, out, D);
    return;
  }
  const size_t pk = packed_bytes(D, bits_);
  const KiviOffsets o = kivi_offsets(g, H, B, D, pk);
  const uint16_t* vs = reinterpret_cast<const uint16_t*>(at.block + o.vs);
  const uint16_t* vz = reinterpret_cast<const uint16_t*>(at.block + o.vz);
  dequantize_v_token(at.block + o.vc + size_t(at.slot) * pk, vs[at.slot], vz[at.slot], D, bits_, out);
}

}  // namespace ptllm
