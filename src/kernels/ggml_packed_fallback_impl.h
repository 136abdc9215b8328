// The product of a matrix packed for AVX-512 VNNI (kernels/ggml.h: Q4_0, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K in
// groups of 16 rows) on a variant without the packed kernels, so that tests can switch targets: each row back in
// the file's layout (ggml_unpack_row), then the variant's one-row kernels. Slow; only tests reach it.
// Included inside a variant's namespace, where dot_rows is declared.

PTLLM_GGML_TARGET void packed_rows(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0,
                                   int r1) {
  const GgmlTypeInfo info = ggml_type_info(w.ggml);
  const int nb = w.cols / info.block_elems;
  std::vector<uint8_t> row(size_t(nb) * size_t(info.block_bytes));
  float out[4];
  for (int r = r0; r < r1; ++r) {
    ggml_unpack_row(w, r, row.data());
    for (int t = 0; t < a.T; ++t) {
      dot_rows<1>(w.ggml, row.data(), nb, a, t, out);
      y[size_t(t) * size_t(w.rows) + size_t(r)] = out[0] + (bias ? bias[r] : 0.f);
    }
  }
}
