// Writes tests/data/gguf/ggml-quant-reference.gguf: float rows and what ggml's own quantizers make
// of them, for the byte-for-byte test of kernels/ggml_ref.cpp's quantizers (tests/test_ggml.cpp).
// Not part of the build: it links a llama.cpp build's libggml-base, which has ggml_quantize_chunk
// (the function llama-quantize calls per tensor; without an importance matrix it runs the
// quantize_row_*_ref functions).
//
//   B=/path/to/llama.cpp
//   cc -O2 -o /tmp/mkref scripts/make_ggml_quant_reference.c -I$B/ggml/include -L$B/build/bin -lggml-base -lm
//   build/posttrainllm quantize ../shared/models/kjv-small /tmp/kjv-small-F32.gguf --format gguf --type F32
//   export LD_LIBRARY_PATH=$B/build/bin; G=../shared/models/gguf
//   /tmp/mkref $G/kjv-tiny-F32.gguf tests/data/gguf/ggml-quant-reference.gguf /tmp/kjv-small-F32.gguf
//
// Rows (256 values each, one K-quant super-block wide): real weights of kjv-tiny (its 128-wide
// rows taken two at a time), synthetic rows that reach the quantizers' corner cases, and blocks of
// kjv-small, the first of them the one block of its 102,946 where a quantizer that summed
// w * diff * diff instead of ggml's w * (diff * diff) chose another Q5_K min.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

enum { COLS = 256, REAL_ROWS = 16, SYN_ROWS = 24, SMALL_ROWS = 9 };

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(void) {  // xorshift64*, in (0, 1)
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  return ((rng_state * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0) + 1e-17;
}
static float gauss(void) { return (float)(sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform())); }

// Synthetic row r: each row tests a case where a quantizer branches.
static void synthetic(int r, float* x) {
  for (int i = 0; i < COLS; ++i) x[i] = 0.02f * gauss();
  switch (r) {
    case 0: memset(x, 0, COLS * sizeof(float)); break;                    // all zero
    case 1: for (int i = 0; i < COLS; ++i) x[i] = 0.25f; break;           // constant > 0
    case 2: for (int i = 0; i < COLS; ++i) x[i] = -0.125f; break;         // constant < 0
    case 3: for (int i = 0; i < COLS; ++i) x[i] = fabsf(x[i]); break;     // all positive (min 0)
    case 4: for (int i = 0; i < COLS; ++i) x[i] = -fabsf(x[i]); break;    // all negative
    case 5: x[17] = 3.0f; break;                                          // one outlier
    case 6: x[200] = -3.0f; break;
    case 7: for (int i = 0; i < COLS; ++i) x[i] *= 1e-6f; break;          // f16-subnormal scales
    case 8: for (int i = 0; i < COLS; ++i) x[i] *= 2000.f; break;         // large values
    case 9: for (int i = 0; i < COLS; ++i) x[i] = (i & 1) ? 0.5f : -0.5f; break;
    case 10: memset(x + 32, 0, 64 * sizeof(float)); break;               // zero sub-blocks
    case 11: for (int i = 0; i < 16; ++i) x[i] = 0; break;               // a zero 16-group
    case 12: for (int i = 0; i < COLS; ++i) x[i] = (float)(i % 16) / 15.f; break;  // exact grid
    case 13: for (int i = 0; i < COLS; ++i) x[i] = (float)(i % 32) - 16.f; break;
    case 14: for (int i = 0; i < COLS; ++i) x[i] += (i / 32) * 0.05f; break;  // shifted sub-blocks
    case 15: for (int i = 0; i < COLS; ++i) x[i] *= (float)(1 + (i / 32) * 4); break;  // scale ramps
    case 16: for (int i = 0; i < COLS; ++i) x[i] = 0.01f * (float)i; break;   // monotone
    case 17: for (int i = 128; i < COLS; ++i) x[i] *= 100.f; break;           // two magnitudes
    default: break;                                                           // plain Gaussian
  }
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s kjv-tiny-F32.gguf OUT.gguf kjv-small-F32.gguf\n", argv[0]);
    return 2;
  }
  struct ggml_context* src_ctx = NULL;
  struct gguf_init_params ip = {.no_alloc = false, .ctx = &src_ctx};
  struct gguf_context* src = gguf_init_from_file(argv[1], ip);
  if (!src) {
    fprintf(stderr, "%s: cannot read\n", argv[1]);
    return 1;
  }
  const int rows = REAL_ROWS + SYN_ROWS + SMALL_ROWS;
  float* x = malloc(sizeof(float) * COLS * rows);
  // Four rows of 256 from each of four tensors, from their middle (not the first rows).
  const char* names[4] = {"blk.0.attn_q.weight", "blk.1.ffn_down.weight", "token_embd.weight", "blk.3.attn_v.weight"};
  for (int t = 0; t < 4; ++t) {
    struct ggml_tensor* w = ggml_get_tensor(src_ctx, names[t]);
    if (!w || w->type != GGML_TYPE_F32 || ggml_nelements(w) < 8 * COLS) {
      fprintf(stderr, "%s: no F32 tensor %s\n", argv[1], names[t]);
      return 1;
    }
    const float* d = (const float*)w->data + (ggml_nelements(w) / 2 / COLS) * COLS;
    memcpy(x + (size_t)t * 4 * COLS, d, sizeof(float) * 4 * COLS);
  }
  for (int r = 0; r < SYN_ROWS; ++r) synthetic(r, x + (size_t)(REAL_ROWS + r) * COLS);
  // kjv-small: (tensor, first value) of each block.
  struct ggml_context* small_ctx = NULL;
  struct gguf_init_params sp = {.no_alloc = false, .ctx = &small_ctx};
  if (!gguf_init_from_file(argv[3], sp)) {
    fprintf(stderr, "%s: cannot read\n", argv[3]);
    return 1;
  }
  const struct {
    const char* name;
    long offset;
  } blocks[SMALL_ROWS] = {{"blk.4.ffn_gate.weight", 104L * 512},  {"blk.0.attn_q.weight", 77L * 512},
                          {"blk.0.attn_v.weight", 5L * 512 + 256}, {"blk.3.ffn_down.weight", 9L * 1376},
                          {"blk.7.ffn_up.weight", 1000L * 512},   {"blk.7.attn_output.weight", 300L * 512},
                          {"token_embd.weight", 4321L * 512},     {"token_embd.weight", 0},
                          {"blk.2.attn_k.weight", 127L * 512 + 256}};
  for (int r = 0; r < SMALL_ROWS; ++r) {
    struct ggml_tensor* w = ggml_get_tensor(small_ctx, blocks[r].name);
    if (!w || w->type != GGML_TYPE_F32 || ggml_nelements(w) < blocks[r].offset + COLS) {
      fprintf(stderr, "%s: no F32 tensor %s of that size\n", argv[3], blocks[r].name);
      return 1;
    }
    memcpy(x + (size_t)(REAL_ROWS + SYN_ROWS + r) * COLS, (const float*)w->data + blocks[r].offset,
           sizeof(float) * COLS);
  }

  const enum ggml_type types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
                                  GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
  const int ntypes = sizeof(types) / sizeof(types[0]);
  struct ggml_init_params cp = {.mem_size = 16 << 20, .mem_buffer = NULL, .no_alloc = false};
  struct ggml_context* ctx = ggml_init(cp);
  struct gguf_context* out = gguf_init_empty();
  gguf_set_val_str(out, "general.description",
                   "rows x (F32) and ggml_quantize_chunk's output for each type (tensor x.TYPE), no importance matrix");
  struct ggml_tensor* xt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, COLS, rows);
  ggml_set_name(xt, "x");
  memcpy(xt->data, x, sizeof(float) * COLS * rows);
  gguf_add_tensor(out, xt);
  for (int i = 0; i < ntypes; ++i) {
    struct ggml_tensor* q = ggml_new_tensor_2d(ctx, types[i], COLS, rows);
    char name[64];
    snprintf(name, sizeof name, "x.%s", ggml_type_name(types[i]));
    ggml_set_name(q, name);
    ggml_quantize_chunk(types[i], x, q->data, 0, rows, COLS, NULL);
    gguf_add_tensor(out, q);
  }
  if (!gguf_write_to_file(out, argv[2], false)) {
    fprintf(stderr, "%s: cannot write\n", argv[2]);
    return 1;
  }
  printf("%s: %d rows of %d, %d types\n", argv[2], rows, COLS, ntypes);
  return 0;
}
