// What the grouped MoE kernels on wgmma share (nvcc only): moe_grouped_wgmma.cu's bf16 kernel and
// moe_grouped_e4m3.cu's e4m3 one take the same tiles (256 weight rows x NT pairs of one expert, 128 columns a
// stage), the same block (two consumer warpgroups, one producer warpgroup), the same walk over the plan's
// tile table and the same weight rows per tile row. moe_grouped_wgmma.cu's head comment explains them.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/device_common.cuh"

namespace tern::cuda::dev {

inline constexpr int kWgK = 128;                      // K columns a stage
inline constexpr int kWgMaxTok = 128;                 // most pairs a tile (wgmma N; 32, 64, 96, 112 or 128)
inline constexpr int kWgRows = 256;                   // weight rows a tile (2 warpgroups x 2 m64 slabs)
inline constexpr int kWgWBytes = kWgRows * kWgK / 2;  // 16 KB of FP4 a stage
inline constexpr int kWgSmemMax = 227 * 1024;

inline constexpr int kWgConsumerWarps = 8;
// A whole producer warpgroup (setmaxnreg works per warpgroup and moves its registers to the consumers: 128 x
// 40 + 256 x 232 <= 64 K): its 128 threads copy the FP4 rows and scales with cp.async (16 bytes a thread and
// row piece, 4 or 8 a scale row), its first 16 the x planes by bulk copy.
inline constexpr int kWgProducerThreads = 128;
inline constexpr int kWgThreads = kWgConsumerWarps * 32 + kWgProducerThreads;
inline constexpr int kWgProducerRegs = 40, kWgConsumerRegs = 232;

// Stored position p (0..127) of a 128-column block -> the physical column it holds, and the inverse.
__host__ __device__ inline constexpr int wg_physical(int p) {
  const int s = p >> 4, q = (p >> 3) & 1, t = (p >> 1) & 3, j = p & 1;
  return 32 * t + 8 * (s >> 1) + 2 * (s & 1) + q + 4 * j;
}
__host__ __device__ inline constexpr int wg_stored(int c) {
  const int t = c >> 5, a = (c >> 3) & 3, j = (c >> 2) & 1, b = (c >> 1) & 1, q = c & 1;
  return 16 * (2 * a + b) + 8 * q + 2 * t + j;
}
__host__ __device__ constexpr bool wg_permutation_ok() {
  for (int p = 0; p < 128; ++p)
    if (wg_stored(p) < 0 || wg_stored(p) > 127 || wg_physical(wg_stored(p)) != p ||
        wg_stored(wg_physical(p)) != p)
      return false;
  // The decode: k-step s, lane t, slot pair q (0: 2t,2t+1; 1: 2t+8,2t+9), half j reads nibble 2(s%2) + q + 4j
  // of word s/2 of the lane's 16 bytes, i.e. physical column 32t + 8(s/2) + 2(s%2) + q + 4j.
  for (int s = 0; s < 8; ++s)
    for (int t = 0; t < 4; ++t)
      for (int q = 0; q < 2; ++q)
        for (int j = 0; j < 2; ++j)
          if (wg_physical(16 * s + 8 * q + 2 * t + j) != 32 * t + 8 * (s / 2) + 2 * (s % 2) + q + 4 * j)
            return false;
  return true;
}
static_assert(wg_permutation_ok());

// Shared-memory matrix descriptor, no swizzle: start, leading (K) and stride (M/N) byte offsets, >> 4 each.
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32);
}

// Weight matrix (ExpertDesc order: w1, w2, w3) and row of tile row m (0..255); clamped rows past the matrix
// are read but never stored.
template <bool UP>
__device__ __forceinline__ int64_t wg_weight_row(int m, int n_tile, int64_t N, int& which) {
  int64_t row;
  if constexpr (UP) {
    which = (m & 8) ? 2 : 0;
    row = static_cast<int64_t>(n_tile) * (kWgRows / 2) + 8 * (m >> 4) + (m & 7);
  } else {
    which = 1;
    row = static_cast<int64_t>(n_tile) * kWgRows + m;
  }
  return min(row, N - 1);
}

// Tile t_id of the plan (t_id < tile_first[nj] * n_tiles): its job's expert, first slot and pair count, its
// n-tile and first pair. Within a job m is fastest, so the blocks sharing a weight tile run side by side.
struct WgTileAt {
  int e, first, count, n_tile, row0;
};
// Args: any kernel arguments with jobs, tile_first and n_tiles (WgArgs, the e4m3 kernel's).
template <class Args>
__device__ __forceinline__ WgTileAt wg_tile_at(const Args& a, int nj, int64_t t_id, int nt) {
  int lo = 0, hi = nj - 1;  // the last job whose first tile is at or before t_id (every job has >= 1 m-tile)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (static_cast<int64_t>(a.tile_first[mid]) * a.n_tiles <= t_id)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int m_tiles = a.tile_first[lo + 1] - a.tile_first[lo];
  const int local = static_cast<int>(t_id - static_cast<int64_t>(a.tile_first[lo]) * a.n_tiles);
  return WgTileAt{a.jobs[3 * lo], a.jobs[3 * lo + 1], a.jobs[3 * lo + 2], local / m_tiles,
                  (local % m_tiles) * nt};
}

// cp.async of N bytes (16: .cg, L2 only; 4 / 8: .ca) to a 32-bit shared address; zero-filled when !valid (src
// must still be a mapped address).
template <int N>
__device__ __forceinline__ void cp_async_at(uint32_t dst, const void* src, bool valid) {
  if constexpr (N == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src), "n"(N), "r"(valid ? N : 0)
                 : "memory");
}

}  // namespace tern::cuda::dev
