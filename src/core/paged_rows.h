// Rows that live in fixed-size pages of one pool instead of one contiguous buffer: a sequence's compressed
// rows or indexer keys in the state pool (cache/page_pool.h). Row r is at byte
//   offset_in_page + (r % rows_per_page) * row_bytes   of page   block_table[r / rows_per_page].
// A view like TensorView (it owns nothing). It lives in core because the cache makes it and the ops read it,
// and neither may include the other.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace tern {

struct PagedRows {
  TensorView pool;         // u8 [num_pages, page_bytes]: the whole pool
  TensorView block_table;  // i32 [pages], on the pool's device: pages holding rows 0 .. pages * rows_per_page - 1
  int64_t offset_in_page = 0;
  int64_t rows_per_page = 0;
  int64_t row_bytes = 0;

  bool empty() const { return pool.empty(); }
  Device device() const { return pool.device(); }
  int64_t page_bytes() const { return pool.empty() ? 0 : pool.dim(1); }
  // Rows the block table covers.
  int64_t capacity() const { return block_table.empty() ? 0 : block_table.numel() * rows_per_page; }
  // Address of row r (on the pool's device). Reads the block table: a host table only.
  std::byte* row(int64_t r) const {
    const int64_t page = block_table.data_as<const int32_t>()[r / rows_per_page];
    return pool.data_as<std::byte>() + page * page_bytes() + offset_in_page + (r % rows_per_page) * row_bytes;
  }
};

}  // namespace tern
