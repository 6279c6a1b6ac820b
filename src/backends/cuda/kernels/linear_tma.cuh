// The TMA decode product for FP8-block weights (linear_tma.cu; TERN_LINEAR_VARIANT=5): host interface, no
// device code. What it is and why: linear_tma.cu's header comment.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/cuda/kernels/linear.cuh"

namespace tern::cuda {

// How linear_tma_kernel runs one product (from the weight's shape, T and the machine; plan_linear_tma).
struct TmaPlan {
  bool ok = false;
  const char* why = "";  // when !ok: why the product stays on linear_stream (linear_path_name says it)
  int nt = 1;            // n-tiles of 8 tokens (T <= 8 * nt)
  int64_t cpg = 0;       // chunks (64 columns) per K group: linear_stream's, from the weight's shape (or the tuner)
  int kg = 1;            // K groups
  int gpb = 1;           // K groups per block
  int cs = 1;            // blocks per cluster: the K-group sets of one row block (kg > 1 finishes through partials)
  int64_t rg = 1;        // row groups (grouped products: each its own x columns)
  int64_t iru = 0;       // 32-row units per row group
  int64_t nrb = 0;       // row blocks per row group (clusters of cs blocks)
  int sc = 0;            // chunks per ring item (one TMA box of 64 bytes x 32 rows per chunk)
  int items = 0;         // ring items per unit (ceil(cpg / sc))
  int slots = 0;         // ring slots
  int win_chunks = 0;    // x window: chunks (a block's K range at most)
  int tab_rows = 0, tab_cols = 0;  // FP8 scale multipliers staged per block
  int win_off = 0, tab_off = 0, bar_off = 0;  // shared-memory layout (from the 1024-aligned base)
  size_t smem = 0;       // dynamic shared memory asked for (1 KB of alignment slack included)
  int64_t grid = 0;      // blocks: rg * nrb * cs
};

// The plan for these params (ok false with `why` when the kernel does not take them). Cheap after the first
// call for a cluster size (the cluster occupancy is queried once and kept).
TmaPlan plan_linear_tma(const LinearParams& p);

// Launches linear_tma_kernel (plan.ok); xw: x's windows made once for the product, or nullptr (staged per block).
void launch_linear_tma(const LinearParams& p, const TmaPlan& plan, const uint8_t* xw, cudaStream_t stream);

}  // namespace tern::cuda
