// The grouped FP4 expert GEMMs of prefill chunks on wgmma (moe_grouped_wgmma.cu; host interface): the same
// plan and buffers as moe_grouped.cuh's mma.sync kernels (MoeGroupedBuffers), another activation layout
// (bf16 "planes", see the .cu) for xs and h, which therefore hold moe_grouped_rows(p) rows, not P.
// Chosen by the mean pairs per expert (moe_grouped_wgmma_selected), or forced by TERN_MOE_GROUPED=wgmma|mma.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backends/cuda/kernels/moe_grouped.cuh"

namespace tern::cuda {

// Whether a prefill chunk's grouped experts take the wgmma kernels: TERN_MOE_GROUPED=wgmma always (=e4m3 too, where
// the e4m3 kernels of moe_grouped_e4m3.cuh cannot run), =mma never
// (read at each call, so tests and benchmarks can switch; other values refused); unset or auto, from
// kMoeWgmmaMinPairs mean pairs an expert (measured on the H200, session 10 call 6, one V4-Flash layer: 2K tokens
// (48 an expert) 3.12 -> 2.38 ms, 8K 9.32 -> 5.70 ms; at 1K (24 an expert, a 64-pair tile mostly padding)
// mma.sync's 1.79 beats wgmma's 2.30).
// p.E == 0 (a shape-only query): true only when forced.
inline constexpr int64_t kMoeWgmmaMinPairs = 48;
bool moe_grouped_wgmma_selected(const MoeParams& p);
// "wgmma", "mma", "e4m3" or "" (unset or auto: by pairs per expert), for path names.
const char* moe_grouped_kernel_forced();
// Pairs a tile (wgmma N: 32, 64, 96, 112 or 128): TERN_MOE_WGMMA_N for A/B runs (read at each call; auto or
// unset: the rule; other values refused), else chosen from the mean pairs per expert (0 when p.E == 0, a
// shape-only query). Narrower tiles pad less of an expert's last tile and read the weights more often.
int moe_grouped_wgmma_tile_pairs(const MoeParams& p);
// Rows of xs and h either grouped path may use: P plus one tile of pairs (a tile's last rows may run past P).
int64_t moe_grouped_rows(const MoeParams& p);
// The cluster size (1 or 2) of a launch of n_tiles tiles along N: a cluster takes that many n-tiles of one m-tile
// and shares each stage's x planes by multicast. TERN_MOE_WGMMA_CLUSTER (read at each call; unset: 2; 1: single
// blocks; other values refused), 1 where 2 does not divide n_tiles. Session 36: 2-block clusters 8K prefill -2%, 2K
// -5%; session 37: 4-block clusters slower (removed).
int moe_grouped_wgmma_cluster(int n_tiles);
// Whether the wgmma kernels copy a row's scale bytes 16 at a time (every 4 stages for MXFP4, 2 for NVFP4) into a
// two-group ring rather than 4 or 8 bytes a stage into each stage (TERN_MOE_SCALE_GROUPS=1, read at each call; off
// until measured; session 36's ncu: the per-stage copies were 28% of the up kernel's L2 sectors in excess). The
// same bits either way.
bool moe_scale_groups();
std::string moe_grouped_wgmma_path_name(const MoeParams& p);
// gather, tiles, up and down (y [P, D] complete when the stream reaches it; then launch_moe_combine).
// Same conditions as launch_moe_grouped (moe_grouped_supported).
void launch_moe_grouped_wgmma(const MoeParams& p, const MoeGroupedBuffers& b, cudaStream_t stream);
// tile_first[j] = the m-tiles of `pairs` pairs of the jobs before j, tile_first[num_jobs] their total (one warp;
// the wgmma and e4m3 kernels walk this table).
void launch_moe_grouped_tiles(const int* jobs, const int* num_jobs, int pairs, int* tile_first, cudaStream_t stream);

}  // namespace tern::cuda
