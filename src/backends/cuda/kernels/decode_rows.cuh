// Decode steps: each slot's new row stored into its own sequence's state: its window ring (an address per
// slot) or its paged compressed rows / indexer keys (a pool and block table per slot), so the launch is the
// same every step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/paged_rows.cuh"

namespace tern::cuda {

struct StoreRowsParams {
  const uint8_t* src = nullptr;        // [slots, row_bytes]: slot i's row
  const int64_t* positions = nullptr;  // [slots]: slot i's token position; -1 = inert (stores nothing)
  int64_t slots = 0, row_bytes = 0;
  // ratio == 0: window ring at rings[i], the row goes to ring slot position % window; with firsts (a sequence
  // in consecutive slots), not when slot i + window is of the same sequence (its token takes that ring slot).
  const uint64_t* rings = nullptr;
  const int64_t* firsts = nullptr;
  int64_t window = 0;
  // ratio > 0: paged rows (geometry in `paged`, slot i's pool and block table at pools[i] / tables[i]); a
  // row is stored only when the token closes a window ((position + 1) % ratio == 0), as entry position / ratio.
  int ratio = 0;
  PagedRowsDesc paged;
  const uint64_t* pools = nullptr;
  const uint64_t* tables = nullptr;
};

void launch_store_rows(const StoreRowsParams& p, cudaStream_t stream);

}  // namespace tern::cuda
