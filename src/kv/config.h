#pragma once
// The KV cache's settings (one struct, one text form) and the model shape it stores.
//
// The text form is describe(): "int4 g32 r128 sink4 w508 pos=cache", every setting that changes what
// is stored; parse_kv_config() reads it back (and any subset of it, applied on top of a base). The
// CLI's flags, `eval --configs` and `cache inspect` all use it.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace ptllm {

enum class KVPrecision : uint8_t { F32, F16, BF16, Int8, Int4, Int2 };
std::string_view kv_precision_name(KVPrecision p);
std::optional<KVPrecision> parse_kv_precision(std::string_view s);
inline bool is_kivi(KVPrecision p) { return p == KVPrecision::Int8 || p == KVPrecision::Int4 || p == KVPrecision::Int2; }
int kivi_bits(KVPrecision p);
// Storage dtype of full-precision tokens: the precision itself when dense, float32 under KIVI.
DType dense_dtype(KVPrecision p);

// absolute: K stored after RoPE at its absolute position, the query rotated at its absolute position
// (the seed's "vanilla" StreamingLLM). cache: K stored before RoPE; a key in cache slot s is rotated
// by s and the query by its own slot (the StreamingLLM paper's scheme).
enum class PositionMode : uint8_t { Absolute, Cache };
std::string_view position_mode_name(PositionMode m);

struct KVCacheConfig;
// The default scheme: `cache` under StreamingLLM (measured better on kjv-small: docs/kv-cache.md),
// `absolute` otherwise (the same attention, without rotating the query per key).
PositionMode default_positions(const KVCacheConfig& c);

struct KVCacheConfig {
  KVPrecision precision = KVPrecision::F32;
  int group_size = 32;      // B: tokens per block, and the KIVI group G
  int residual = 128;       // KIVI: recent tokens kept full precision (a multiple of group_size)
  int sink = 0;             // StreamingLLM: first tokens kept forever
  int window = 0;           // StreamingLLM: recent tokens kept; 0 = no eviction
  PositionMode positions = PositionMode::Absolute;
  int ctx_size = 4096;      // capacity in tokens without StreamingLLM
  bool preallocate = true;  // reserve the whole capacity at construction

  bool streaming() const { return window > 0; }
  // Throws UsageError naming the flag.
  void validate() const;
  // "int4 g32 r128 sink4 w508 pos=cache": every setting that changes what is stored
  // (parse_kv_config reads it back).
  std::string describe() const;
};

struct KVShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  std::vector<float> rope_inv_freq;  // [head_dim/2], needed by PositionMode::Cache
  // [n_layers] the model's sliding window of each layer in tokens (query i sees keys j with
  // i - W < j <= i), 0 = full attention; empty = every layer full.
  std::vector<int> layer_window{};  // (braces: aggregate initializers may leave it out without a warning)
  // [n_layers] the layer whose stored K/V each layer attends to: itself when it stores its own, else
  // an earlier storing layer with the same window (YOCO's KV-shared layers and their donor, which they
  // read as a view: they hold no blocks). Empty = every layer stores its own.
  std::vector<int> kv_source{};
  // [n_layers] each layer's RoPE frequencies [head_dim/2] where they differ between layers (Gemma 3's
  // local and global bases; all zero for a layer without RoPE, which rotates by nothing); empty =
  // rope_inv_freq for every layer. Needed by PositionMode::Cache, as rope_inv_freq.
  std::vector<std::vector<float>> layer_rope_inv_freq{};
  const std::vector<float>& inv_freq_of(int layer) const {
    return layer_rope_inv_freq.empty() ? rope_inv_freq : layer_rope_inv_freq[size_t(layer)];
  }
  int kv_dim() const { return n_kv_heads * head_dim; }
  int window_of(int layer) const { return layer_window.empty() ? 0 : layer_window[size_t(layer)]; }
  int source_of(int layer) const { return kv_source.empty() ? layer : kv_source[size_t(layer)]; }
  bool stores(int layer) const { return source_of(layer) == layer; }
  bool any_shared() const;
  bool any_window() const;
};

// Space-separated tokens applied on top of `base`: a precision (fp32 fp16 bf16 int8 int4 int2),
// g<N> (group size), r<N> (KIVI residual), sink<N> and w<N> (StreamingLLM), pos=absolute|cache.
// Without pos=, the default for the result's window applies. describe() of a config parses back to
// it. Throws UsageError naming the token (unknown, a bad value, a setting given twice); the
// combination is not validated here (validate() does).
KVCacheConfig parse_kv_config(std::string_view text, const KVCacheConfig& base);
// The tokens parse_kv_config() knows, for messages: "fp32 fp16 ... pos=absolute|cache".
std::string kv_config_tokens();

}  // namespace ptllm
