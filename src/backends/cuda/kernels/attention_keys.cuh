// The keys of one query of the sparse attention (ops/attention.h), as both attention kernels walk them
// (nvcc only): the window first, then the compressed entries; key_row gives a key's stored row or nullptr
// for a masked key (a -1 pick). Eager mode: the launch's one sequence; decode mode (AttentionParams::
// positions): slot i's own sequence. The same position gives the same key list in both modes.
#pragma once

#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/device_common.cuh"

namespace tern::cuda::dev {

struct KeyList {
  int64_t p, nwin, count, visible;
  int64_t start;               // position of the first row of chunk
  const uint8_t* chunk;        // this query's chunk rows (row of position start first)
  const uint8_t* ring;
  PagedRowsDesc compressed;    // this query's compressed rows
};

// Query i's keys. p < 0 (decode mode) is an inert slot: it has no keys and reads nothing.
__device__ inline KeyList keys_of(const AttentionParams& a, int64_t i) {
  KeyList k;
  int64_t num_compressed = a.num_compressed;
  if (a.positions != nullptr) {
    k.p = a.positions[i];
    const int64_t first = a.firsts != nullptr && k.p >= 0 ? a.firsts[i] : i;  // its sequence's first slot
    k.start = a.positions[first];
    k.chunk = a.chunk_rows + first * a.fmt.row_bytes;
    k.ring = k.p >= 0 ? reinterpret_cast<const uint8_t*>(a.rings[i]) : nullptr;
    k.compressed = a.compressed;  // the page geometry; the slot's pool and block table:
    if (a.ratio > 0 && k.p >= 0) {
      k.compressed.pool = reinterpret_cast<const uint8_t*>(a.pools[i]);
      k.compressed.table = reinterpret_cast<const int32_t*>(a.comp_tables[i]);
    }
    num_compressed = a.ratio > 0 && k.p >= 0 ? (k.p + 1) / a.ratio : 0;
  } else {
    k.p = a.start + i;
    k.start = a.start;
    k.chunk = a.chunk_rows;
    k.ring = a.ring;
    k.compressed = a.compressed;
  }
  k.nwin = max(int64_t{0}, min(a.window, k.p + 1));
  k.visible = a.ratio > 0 ? min(num_compressed, (k.p + 1) / a.ratio) : 0;
  k.count = a.selected != nullptr ? a.k_sel : k.visible;
  if (a.ratio == 0 || k.p < 0) k.count = 0;
  return k;
}

// Row of key j of query i, or nullptr when masked. Index: the type of the ring slot and page divisions (int64_t;
// attention_heads_kernel passes uint32_t: positions and rows stay below 2^31, and a 64-bit division's registers
// would spill next to its accumulators). The same rows either way.
template <typename Index = int64_t>
__device__ inline const uint8_t* key_row(const AttentionParams& a, int64_t i, const KeyList& k, int64_t j) {
  const int64_t rb = a.fmt.row_bytes;
  if (j < k.nwin) {
    const int64_t pos = k.p - k.nwin + 1 + j;
    return pos >= k.start ? k.chunk + (pos - k.start) * rb
                          : k.ring + static_cast<int64_t>(static_cast<Index>(pos) % static_cast<Index>(a.window)) * rb;
  }
  int64_t w = j - k.nwin;
  if (a.selected != nullptr) {
    w = a.selected[i * a.k_sel + w];
    if (w < 0) return nullptr;
    if (w >= k.visible) {
      raise(a.err, kErrSelected);
      return nullptr;
    }
  }
  return paged_row<Index>(k.compressed, w);
}

}  // namespace tern::cuda::dev
