#include "model/weight_rows.h"

#include "core/error.h"

namespace ptllm {

WeightMatrix weight_rows(const WeightMatrix& w, int r0, int n) {
  PTLLM_CHECK(w.format != WeightFormat::Panels && !w.ggml_pack && !w.affine_pack && r0 >= 0 && n >= 0 && r0 + n <= w.rows);
  WeightMatrix s = w;
  s.f32_tiles = nullptr;  // tiles of the whole matrix: not this slice's
  s.f32_tile_rows = 0;
  s.rows = n;
  s.data = static_cast<const uint8_t*>(w.data) + size_t(r0) * w.row_bytes();
  if (w.format == WeightFormat::Affine) {
    const size_t group_bytes = size_t(w.cols / w.group_size) * dtype_size(w.dtype);
    s.scales = static_cast<const uint8_t*>(w.scales) + size_t(r0) * group_bytes;
    s.biases = static_cast<const uint8_t*>(w.biases) + size_t(r0) * group_bytes;
  }
  return s;
}

}  // namespace ptllm
