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

__device__ __forceinline__ const uint8_t* paged_row(const PagedRowsDesc& p, int64_t r) {
  return p.pool + static_cast<int64_t>(p.table[r / p.rows_per_page]) * p.page_bytes + p.offset +
         (r % p.rows_per_page) * p.row_bytes;
}

}  // namespace tern::cuda
