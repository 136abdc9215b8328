#pragma once
// The byte layouts of stored KV blocks: what the cache writes, the kernels read and the cache file
// copies, stated once.
//
// A full-precision block of B tokens, one layer, every KV head: K [kv_head][token][head_dim], then V
// the same, each element in the cache's dense dtype (F32, F16, BF16).
// A KIVI group of G tokens: per KV head the K codes (in tiles, below) and V codes, then f16 K scale
// and zero per channel and V scale and zero per token (kivi_offsets).
#include <cstddef>
#include <cstdint>

namespace ptllm {

inline size_t packed_bytes(int n, int bits) { return (size_t(n) * size_t(bits) + 7) / 8; }

// A K group's codes as stored: G rows of pk = packed_bytes(D) bytes, in tiles of 16 keys (the last
// narrower when G % 16 != 0); a tile's rows are cut into columns of 4 bytes (the last narrower when
// pk % 4 != 0) and a column holds its bytes of the tile's keys one after another. So 4 bytes of
// each of 16 keys are 64 consecutive bytes: the order the AVX-512 VNNI kernel multiplies them in
// (one key a 32-bit lane), read with one load instead of a transpose. Byte b of key j's row:
// (Keys in key j's tile: 16, or fewer in a narrower last tile.)
inline size_t k_tile_keys(int j, int G) { return size_t(G - j / 16 * 16 < 16 ? G - j / 16 * 16 : 16); }
inline size_t k_code_offset(int j, size_t b, size_t pk, int G) {
  const int t0 = j / 16 * 16;
  const size_t c = b / 4 * 4, cw = pk - c < 4 ? pk - c : 4;
  return size_t(t0) * pk + c * k_tile_keys(j, G) + size_t(j - t0) * cw + (b - c);
}
// Byte offsets of KV head g's parts in a quantized block of H heads and G tokens: K codes [H][G][pk],
// V codes [H][G][pk], then f16 K scales [H][D], K zeros [H][D], V scales [H][G], V zeros [H][G].
// The one statement of that layout: the cache's policy writes it, attention reads it.
struct KiviOffsets {
  size_t kc, vc, ks, kz, vs, vz;
};
inline KiviOffsets kivi_offsets(int g, int H, int G, int D, size_t pk) {
  const size_t codes = size_t(G) * pk, f16 = sizeof(uint16_t), scales = 2 * size_t(H) * codes;
  const size_t hd = size_t(H) * size_t(D), hg = size_t(H) * size_t(G);
  return {size_t(g) * codes,
          (size_t(H) + size_t(g)) * codes,
          scales + f16 * size_t(g) * size_t(D),
          scales + f16 * (hd + size_t(g) * size_t(D)),
          scales + f16 * (2 * hd + size_t(g) * size_t(G)),
          scales + f16 * (2 * hd + hg + size_t(g) * size_t(G))};
}

// Bytes a quantized block of G tokens takes for one KV head: codes for K and V, f16 scale and zero
// per K channel and per V token.
inline size_t kivi_block_bytes_per_head(int G, int D, int bits) {
  return 2 * size_t(G) * packed_bytes(D, bits) + 2 * sizeof(uint16_t) * size_t(D) + 2 * sizeof(uint16_t) * size_t(G);
}

}  // namespace ptllm
