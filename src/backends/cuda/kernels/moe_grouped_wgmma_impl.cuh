// What the grouped MoE kernels on wgmma share (nvcc only): moe_grouped_wgmma.cu's bf16 kernel (256 weight rows a tile)
// and moe_grouped_e4m3.cu's e4m3 one (128) take tiles of NT pairs of one expert and 128 columns a stage, the same
// block (two consumer warpgroups, one producer warpgroup), the same persistent walk over the plan's tile table, the
// same weight rows per tile row and the same x-plane loads (multicast over 2-block clusters). moe_grouped_wgmma.cu's
// head comment explains them.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <algorithm>
#include <limits>

#include "backends/cuda/kernels/bulk_pipe.cuh"
#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/moe.cuh"

namespace tern::cuda::dev {

inline constexpr int kWgK = 128;                      // K columns a stage
inline constexpr int kWgMaxTok = 128;                 // most pairs a tile (wgmma N; 32, 64, 96, 112 or 128)
inline constexpr int kWgRows = 256;                   // weight rows a tile (2 warpgroups x 2 m64 slabs)
inline constexpr int kWgSmemMax = 227 * 1024;

inline constexpr int kWgConsumerWarps = 8;
// A whole producer warpgroup (setmaxnreg works per warpgroup and moves its registers to the consumers; each kernel
// sets its split): its 128 threads copy the weights with cp.async, its first 16 (bf16) or 8 (e4m3) the x planes by
// bulk copy (wg_load_x_planes).
inline constexpr int kWgProducerThreads = 128;
inline constexpr int kWgThreads = kWgConsumerWarps * 32 + kWgProducerThreads;

// Shared-memory matrix descriptor, no swizzle: start, leading (K) and stride (M/N) byte offsets, >> 4 each.
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32);
}

// Weight matrix (ExpertDesc order: w1, w2, w3) and row of tile row m (0..kRows - 1) of a tile of kRows weight rows
// (up: 16-row slabs of 8 w1 rows then 8 w3 rows, so a tile makes kRows / 2 h columns; down: w2 rows in order); clamped
// rows past the matrix are read but never stored.
template <bool UP, int kRows = kWgRows>
__device__ __forceinline__ int64_t wg_weight_row(int m, int n_tile, int64_t N, int& which) {
  int64_t row;
  if constexpr (UP) {
    which = (m & 8) ? 2 : 0;
    row = static_cast<int64_t>(n_tile) * (kRows / 2) + 8 * (m >> 4) + (m & 7);
  } else {
    which = 1;
    row = static_cast<int64_t>(n_tile) * kRows + m;
  }
  return min(row, N - 1);
}

// Tile t_id of the plan (t_id < tile_first[nj] * n_tiles): its job's expert, first slot and pair count, its
// n-tile and first pair. Within a job m is fastest, so the blocks sharing a weight tile run side by side.
struct WgTileAt {
  int e, first, count, n_tile, row0;
};
// Args: any kernel arguments with jobs and tile_first (WgArgs, the e4m3 kernel's). n_tiles: a job's tiles along N
// (a.n_tiles, or its groups of tiles where a cluster of blocks takes a group: then n_tile is the group's).
template <class Args>
__device__ __forceinline__ WgTileAt wg_tile_at(const Args& a, int nj, int64_t t_id, int nt, int n_tiles) {
  int lo = 0, hi = nj - 1;  // the last job whose first tile is at or before t_id (every job has >= 1 m-tile)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (static_cast<int64_t>(a.tile_first[mid]) * n_tiles <= t_id)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int m_tiles = a.tile_first[lo + 1] - a.tile_first[lo];
  const int local = static_cast<int>(t_id - static_cast<int64_t>(a.tile_first[lo]) * n_tiles);
  return WgTileAt{a.jobs[3 * lo], a.jobs[3 * lo + 1], a.jobs[3 * lo + 2], local / m_tiles,
                  (local % m_tiles) * nt};
}

// cp.async of N = 4 or 8 bytes (.ca) to a 32-bit shared address; zero-filled when !valid (src must still be a
// mapped address). The 16-byte weight pieces go by stream_tile.cuh's cp_async16_l2 (its L2 prefetch hint).
template <int N>
__device__ __forceinline__ void cp_async_at(uint32_t dst, const void* src, bool valid) {
  static_assert(N == 4 || N == 8, "4 or 8 bytes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src), "n"(N), "r"(valid ? N : 0)
               : "memory");
}

// A stage's x planes (kPlanes runs of `bytes` contiguous bytes, plane q from src_q to dst_q, as the caller's lambdas
// give them), by producer threads p < kPlanes: the arming thread (p == 0) adds the planes' transaction bytes to the
// stage's full barrier first; with kCta-block clusters each block copies kPlanes / kCta planes and the copy engine
// multicasts them into every block's same slot (each block's barrier gets its bytes). Threads p >= 32 return at once.
template <int kPlanes, int kCta, class Dst, class Src>
__device__ __forceinline__ void wg_load_x_planes(int p, uint32_t rank, uint64_t* full, uint32_t bytes, Dst dst, Src src) {
  if (p >= 32) return;
  if (p == 0) mbar_arrive_expect_tx(full, kPlanes * bytes);
  __syncwarp();
  if (p >= kPlanes) return;
  if constexpr (kCta > 1) {
    if (p / (kPlanes / kCta) == static_cast<int>(rank)) bulk_copy_g2s_multicast(dst(p), src(p), bytes, full, (1u << kCta) - 1);
  } else {
    bulk_copy_g2s(dst(p), src(p), bytes, full);
  }
}

// Blocks of a persistent launch: one a multiprocessor, fewer when the plan's bound has fewer tiles.
inline int64_t wg_blocks(int64_t m_tiles_bound, int n_tiles) {
  static const int sms = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n > 0 ? n : 1;
  }();
  return std::min<int64_t>(m_tiles_bound * n_tiles, sms);
}

// Blocks of a persistent launch of `kernel` that can be resident at once: one a multiprocessor, or (cta > 1) the
// clusters of cta blocks that fit side by side (cudaOccupancyMaxActiveClusters; 0 when none fits). Sets the kernel's
// dynamic shared memory limit first.
template <class Kernel>
int64_t wg_resident_blocks(Kernel kernel, int smem, int cta) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const int64_t sms = wg_blocks(std::numeric_limits<int>::max(), 1);
  if (cta <= 1) return sms;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cta), attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  cfg.gridDim = dim3(static_cast<unsigned>(sms / cta * cta));
  cfg.blockDim = dim3(kWgThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
    clusters = 0;
    (void)cudaGetLastError();  // this query's error only (the caller refuses 0), not an earlier launch's
  }
  return static_cast<int64_t>(clusters) * cta;
}

}  // namespace tern::cuda::dev
