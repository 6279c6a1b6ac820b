// The routed experts of a prefill chunk as grouped GEMMs that read the FP4 experts as they are stored
// (moe_grouped.cu; host interface). Replaces the library path's expansion of every touched expert to bf16
// (2 bytes written and read back per weight where the FP4 weight is half a byte) and its host readback of
// the plan: tiles are scheduled from the device job table.
//
//   gather: xs[slot] = bf16(x[sorted[slot] / k]), K permuted within groups of 32 columns (moe_grouped_k_stored)
//   tiles:  tile_first[j] = m-tiles of the jobs before j (one block)
//   up:     per (job, m-tile of pairs, n-tile of w1|w3 rows): h = SwiGLU(x w1^T, x w3^T) as bf16, same K order
//   down:   per (job, m-tile, n-tile of w2 rows): y = h w2^T (f32, by sorted slot); the caller adds the combine
// Numerics are the library path's: bf16 operands (the FP4 weights exactly), f32 accumulation, h rounded to bf16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/moe.cuh"

namespace tern::cuda {

// MXFP4 / NVFP4 experts with D and inter multiples of 128 (the kernels' K step) and at most 1024 experts.
bool moe_grouped_supported(const MoeParams& p);
// Tile configurations (process-wide; benchmarks and tests compare them on the same calls; all give the same
// bits): kMoeGroupedTileDefault takes 32-, 64- or 128-pair tiles (128 x 256 weight rows) by the mean pairs per
// expert, all with the weights as the mma's A operand; kMoeGroupedTileOld only the 32- and 64-pair tiles with x
// as A (the kernels before the 128-pair tile, for A/B); kMoeGroupedTileNarrow the 128 x 128 tile where the
// default takes 128 x 256; kMoeGroupedTileSmallUnswapped session 9's default (32 / 64-pair tiles with x as A,
// 128 x 256 with the weights as A); kMoeGroupedTileWarps8 the default's tiles with the 32-pair one as 8 warps of
// 32 weight rows (16 warps an SM, session 33). Initialised from TERN_MOE_GROUPED_TILE (old, 128x128,
// small-unswapped, 8-warp-32; default or unset the default; anything else is refused); moe_grouped_path_name says
// which runs.
inline constexpr int kMoeGroupedTileDefault = 0, kMoeGroupedTileOld = 1, kMoeGroupedTileNarrow = 2,
                     kMoeGroupedTileSmallUnswapped = 3, kMoeGroupedTileWarps8 = 4;
int moe_grouped_tile_config();
void set_moe_grouped_tile_config(int config);
// Pairs per m-tile (32, 64 or 128) for these params: chosen from the mean pairs per expert and the config.
int moe_grouped_tile_pairs(const MoeParams& p);
// The L2 prefetch size hint (bytes: 0, 128 or 256) on the grouped kernels' FP4 weight copies (this file's and
// moe_grouped_wgmma / _e4m3's): their stages read 64 bytes of each of 256 rows 2 KB apart, so DRAM sees 64-byte
// requests scattered over rows; the hint asks for the aligned 128 / 256 bytes around each at once (the next
// stages' bytes of the row then hit L2). Same bits either way. TERN_MOE_L2_HINT (0, 128, 256; read once; 256 by
// default since session 33: the 1K up / down kernels -3.5% each on the H100, where the tile probe's 64-byte rows went
// from 68% to 103% of copy: locality was a part, not the whole, of their gap); set_moe_l2_hint for in-process A/B.
int moe_l2_hint();
void set_moe_l2_hint(int bytes);
// Name of the kernels launch_moe_grouped takes for these params (startup report, benchmarks, tests).
const char* moe_grouped_path_name(const MoeParams& p);

// The plan (launch_moe_sort's outputs) and the buffers of the grouped path, all device memory.
struct MoeGroupedBuffers {
  const int* sorted = nullptr;    // [P] pair ids by sorted slot
  const int* jobs = nullptr;      // [num_jobs][3] expert, first slot, count
  const int* num_jobs = nullptr;  // device int
  int* tile_first = nullptr;      // [E + 1]
  uint16_t* xs = nullptr;         // [P, D] bf16, K permuted
  uint16_t* h = nullptr;          // [P, inter] bf16, K permuted
  float* y = nullptr;             // [P, D] f32 by sorted slot
};

// gather, tiles, up and down (y complete when the stream reaches it; then launch_moe_combine).
void launch_moe_grouped(const MoeParams& p, const MoeGroupedBuffers& b, cudaStream_t stream);

}  // namespace tern::cuda
