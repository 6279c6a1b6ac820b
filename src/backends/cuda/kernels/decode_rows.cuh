// Decode steps: each slot's new row stored into its own sequence's state, at an address taken from a
// per-slot table (so the launch is the same every step, and paged state is a different table).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

struct StoreRowsParams {
  const uint8_t* src = nullptr;        // [slots, row_bytes]: slot i's row
  const uint64_t* dest = nullptr;      // [slots]: address of slot i's destination rows
  const int64_t* positions = nullptr;  // [slots]: slot i's token position; -1 = inert (stores nothing)
  int64_t slots = 0, row_bytes = 0;
  // ratio == 0: window ring, the row goes to slot position % window. ratio > 0: compressed rows, a row
  // is stored only when the token closes a window ((position + 1) % ratio == 0), at entry position / ratio.
  int ratio = 0;
  int64_t window = 0;
};

void launch_store_rows(const StoreRowsParams& p, cudaStream_t stream);

}  // namespace tern::cuda
