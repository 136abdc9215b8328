// A block table: one sequence's blocks of one layer (block_table.h).
#include "kv/block_table.h"

#include <algorithm>

#include "kv/block_pool.h"

namespace ptllm::kvdetail {

int64_t BlockTable::seen() const { return n_sink + (window > 0 ? std::min<int64_t>(end, window) : end); }

BlockTable::Where BlockTable::locate(int64_t index, int B) const {
  PTLLM_CHECK(index >= 0);
  if (index < n_sink) return {Entry{sinks[size_t(index / B)], false}, int(index % B)};
  const int64_t s = index - n_sink;
  PTLLM_CHECK(s >= begin && s < end);
  return {stream[size_t((s - begin) / B)], int(s % B)};
}

Entry BlockTable::block_of(size_t j, size_t n_sink_blocks, int B) const {
  if (j < n_sink_blocks) return j < sinks.size() ? Entry{sinks[j], false} : Entry{};
  const int64_t entry = int64_t(j - n_sink_blocks) - begin / B;
  if (entry < 0 || entry >= int64_t(stream.size())) return Entry{};
  return stream[size_t(entry)];
}

int64_t BlockTable::rewind_floor(int B) const {
  if (begin == 0 && n_quant == 0) return 0;
  int64_t f = n_sink + begin + int64_t(n_quant) * B;
  if (window > 0 && begin > 0) f = std::max<int64_t>(f, n_sink + begin + window - 1);
  return f;
}

size_t BlockTable::logical_bytes(int B, const TokenBytes& bytes) const {
  // The sinks and stream tokens the last query saw.
  const int64_t sink_lo = native > 0 ? std::max<int64_t>(0, n_sink + end - native) : 0;
  size_t total = size_t(std::max<int64_t>(0, n_sink - sink_lo)) * bytes.dense;
  const int64_t lo = window > 0 ? std::max<int64_t>(0, end - window) : 0;
  for (size_t e = 0; e < stream.size(); ++e) {
    const int64_t first = begin + int64_t(e) * B;
    const int64_t visible = std::max<int64_t>(0, std::min<int64_t>(first + B, end) - std::max(first, lo));
    if (visible == 0) continue;
    total += stream[e].quantized ? size_t(visible) * bytes.quant + bytes.quant_group : size_t(visible) * bytes.dense;
  }
  return total;
}

void BlockTable::release_front(BlockPool& dense, BlockPool& quant, int B) {
  const Entry e = stream[0];
  if (e.quantized) {
    quant.release(e.id);
    --n_quant;
  } else {
    dense.release(e.id);
  }
  stream.pop_front();
  begin += B;
}

void BlockTable::truncate(int64_t n, int B, BlockPool& dense) {
  PTLLM_CHECK(n >= rewind_floor(B));
  n_sink = int(std::min<int64_t>(n_sink, n));
  end = std::min<int64_t>(end, std::max<int64_t>(0, n - n_sink));
  while (sinks.size() > ceil_div(n_sink, B)) {
    dense.release(sinks.back());
    sinks.pop_back();
  }
  while (stream.size() > ceil_div(end - begin, B)) {
    const Entry e = stream[stream.size() - 1];
    PTLLM_CHECK(!e.quantized);
    dense.release(e.id);
    stream.pop_back();
  }
}

void BlockTable::clear(BlockPool& dense, BlockPool& quant, int B) {
  for (int32_t id : sinks) dense.release(id);
  sinks.clear();
  while (!stream.empty()) release_front(dense, quant, B);
  n_sink = 0;
  begin = end = 0;
}

}  // namespace ptllm::kvdetail
