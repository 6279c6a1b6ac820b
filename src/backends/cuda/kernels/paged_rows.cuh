// Rows in pages of the state pool (core/paged_rows.h) as the kernels read them: row r is at
// offset + (r % rows_per_page) * row_bytes of page table[r / rows_per_page]. One lookup per row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

struct PagedRowsDesc {
  const uint8_t* pool = nullptr;   // [pages, page_bytes]
  const int32_t* table = nullptr;  // device block table
  int64_t page_bytes = 0, offset = 0, rows_per_page = 1, row_bytes = 0;
};

// Index: the type of the page / slot division (int64_t; uint32_t where rows stay below 2^31 and the registers
// of a 64-bit division matter, attention_heads_kernel).
template <typename Index = int64_t>
__device__ __forceinline__ const uint8_t* paged_row(const PagedRowsDesc& p, int64_t r) {
  const Index ri = static_cast<Index>(r), per = static_cast<Index>(p.rows_per_page);
  return p.pool + static_cast<int64_t>(p.table[ri / per]) * p.page_bytes + p.offset +
         static_cast<int64_t>(ri % per) * p.row_bytes;
}

// Decode steps: row r of slot `slot`'s paged rows, whose pool and block table are at pools[slot] / tables[slot]
// (geometry from `geometry`).
__device__ __forceinline__ uint8_t* slot_paged_row(PagedRowsDesc geometry, const uint64_t* pools,
                                                   const uint64_t* tables, int64_t slot, int64_t r) {
  geometry.pool = reinterpret_cast<const uint8_t*>(pools[slot]);
  geometry.table = reinterpret_cast<const int32_t*>(tables[slot]);
  return const_cast<uint8_t*>(paged_row(geometry, r));
}

}  // namespace tern::cuda
