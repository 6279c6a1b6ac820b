// What the grouped MoE kernels on wgmma share (nvcc only): moe_grouped_wgmma.cu's bf16 kernel and
// moe_grouped_e4m3.cu's e4m3 one take the same tiles (256 weight rows x NT pairs of one expert, 128 columns a
// stage), the same block (two consumer warpgroups, one producer warpgroup), the same walk over the plan's
// tile table and the same weight rows per tile row. moe_grouped_wgmma.cu's head comment explains them.
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

// A producer thread's share of a tile's FP4 rows and scale bytes, stage after stage (both kernels' producers).
// Producer thread p: 16-byte piece p % 4 of tile rows p / 4 + 32 j (j < 8) and the scale bytes (kScaleBytes a row
// and 128 columns: 4 e8m0, or 8 ue4m3) of rows p and p + 128. A thread's rows all come from one matrix (up: bit 3
// of the tile row picks w1 or w3, and 32 j / 128 j leave it alone). Tile rows m and m + 32 j (up: m + 16 j... see
// wg_weight_row: 32 tile rows are 16 rows of one matrix) are matrix rows row(m) + kStep j; down's last n-tile may
// run past N (D % 256 == 128): those rows are zero-filled (src-size 0) and their outputs never stored.
template <bool UP, int kScaleBytes>
struct WgWeightCopier {
  static constexpr int kStepW = UP ? 16 : 32, kStepS = UP ? 64 : 128;
  const uint8_t* wsrc;
  const uint8_t* ssrc;
  int row_w, row_s, prow, piece, p, l2_hint;
  int64_t N, w_row_bytes, s_row_bytes;
  __device__ __forceinline__ WgWeightCopier(const ExpertDesc& ed, int p_, int n_tile, int64_t N_, int64_t K,
                                            int l2_hint_)
      : p(p_), l2_hint(l2_hint_), N(N_), w_row_bytes(K / 2), s_row_bytes(K * kScaleBytes / kWgK) {
    prow = p >> 2, piece = p & 3;
    int which_w, which_s;
    row_w = static_cast<int>(wg_weight_row<UP>(prow, n_tile, N, which_w));
    row_s = static_cast<int>(wg_weight_row<UP>(p, n_tile, N, which_s));
    wsrc = static_cast<const uint8_t*>(ed.w[which_w]) + row_w * w_row_bytes + piece * 16;
    ssrc = static_cast<const uint8_t*>(ed.s[which_s]) + row_s * s_row_bytes;
  }
  // The stage at shared address st: row m's 64 bytes at st + m * row_pitch, its scale bytes at st + sc_off + 8 m
  // (unless `scales` is false: scale_group copied them); then the sources move on by 128 columns. The caller arrives
  // on the stage's barrier after.
  __device__ __forceinline__ void stage(uint32_t st, int row_pitch, int sc_off, bool scales = true) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const bool ok = UP || row_w + kStepW * j < N;
      cp_async16_l2(st + (prow + 32 * j) * row_pitch + piece * 16, ok ? wsrc + kStepW * j * w_row_bytes : wsrc,
                    ok ? 16 : 0, l2_hint);
    }
    if (scales) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const bool ok = UP || row_s + kStepS * j < N;
        cp_async_at<kScaleBytes>(st + sc_off + (p + 128 * j) * 8, ok ? ssrc + kStepS * j * s_row_bytes : ssrc, ok);
      }
    }
    wsrc += kWgK / 2;
    ssrc += kScaleBytes;
  }
  // Stages per scale group: 16 bytes of a row's scales.
  static constexpr int kGroupStages = 16 / kScaleBytes;
  // The scale bytes of the next kGroupStages stages at once (call before stage(), at a group's first stage; a row's
  // scale bytes a multiple of 16): rows m = p, p + 128 at dst + 16 m. One 16-byte copy a row where stage() makes
  // kGroupStages copies of 4 or 8 bytes, each a whole 32-byte sector in L2 (session 36's ncu: 28% excess sectors).
  __device__ __forceinline__ void scale_group(uint32_t dst) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const bool ok = UP || row_s + kStepS * j < N;
      cp_async16_l2(dst + (p + 128 * j) * 16, ok ? ssrc + kStepS * j * s_row_bytes : ssrc, ok ? 16 : 0, 0);
    }
  }
};

// Where a finished tile goes (both kernels' epilogues; accumulator i of slab mt: tile row 16 w + g + 8 ((i / 2) %
// 2), pair 8 (i / 4) + 2 t + i % 2; rows g, g + 8 of the thread's slab are mrow[mt][0], mrow[mt][1]).
struct WgTileOut {
  int wg, w, g, t, tid;
  int n_tile, first, row0, count;
};

// The up epilogue's h staging: the tile's 16 planes in kParts parts (wg_store_h; 1: all at once, the bf16 kernel; 2:
// half at a time, the e4m3 kernel, whose ring keeps the room).
template <int NT, int kParts>
inline constexpr int kWgHStageBytes = 16 / kParts * NT * 16;

// Up: SwiGLU of the w1 (x m1) and w3 (x m3) sums, clamped by `limit`, into h's bf16 planes ([inter / 8][rows][8],
// the stored K order of wg_stored). The block's 128 h columns are one 128-column block of h (inter % 128 == 0),
// i.e. 16 planes x NT pairs x 16 bytes, each plane one contiguous run in h: staged in shared memory at `hs` (a
// thread's values are single bf16 scattered over 4 planes; kWgHStageBytes, 16 / kParts planes at a time) and written
// as 16-byte rows, valid pairs only.
template <int NT, int kParts>
__device__ __forceinline__ void wg_store_h(const float (&acc)[2][NT / 2], float m1, float m3, float limit,
                                           uint16_t* hs, uint16_t* h, int64_t rows, const WgTileOut& o) {
  // A thread's h column 8 sigma + g (sigma = 4 (2 wg + mt) + w) lies in plane wg_stored(...) / 8 = 2 (2 w + b) + q
  // (b, q: bits 1, 0 of g): planes 0..7 come from warps w = 0, 1 of both warpgroups, 8..15 from w = 2, 3. So with
  // kParts 2 the planes go out in two halves of 8, each staged by the warps that hold it; with kParts 1 all 16 at once
  // by every warp.
  static_assert(kParts == 1 || kParts == 2);
  constexpr int kPP = 16 / kParts;
#pragma unroll 1
  for (int half = 0; half < kParts; ++half) {
    // Every consumer thread is done copying out the previous half (or the previous tile's h).
    named_bar_sync(1, kWgConsumerWarps * 32);
    if (kParts == 1 || (o.w >> 1) == half) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int p = wg_stored(8 * (4 * (2 * o.wg + mt) + o.w) + o.g);
        uint16_t* hp = hs + ((p >> 3) - kPP * half) * NT * 8 + (p & 7);
#pragma unroll
        for (int j = 0; j < NT / 8; ++j)
#pragma unroll
          for (int e2 = 0; e2 < 2; ++e2) {
            const float gate = acc[mt][4 * j + e2] * m1, up = acc[mt][4 * j + 2 + e2] * m3;
            const float v = siluf_(fminf(gate, limit)) * fminf(fmaxf(up, -limit), limit);
            hp[(8 * j + 2 * o.t + e2) * 8] = static_cast<uint16_t>(pack_bf16(v, 0.0f) & 0xffffu);
          }
      }
    }
    named_bar_sync(1, kWgConsumerWarps * 32);  // both consumer warpgroups' parts of the half's rows are staged
    const uint4* src = reinterpret_cast<const uint4*>(hs);
    for (int i = o.tid; i < kPP * NT; i += kWgConsumerWarps * 32) {
      const int plane = kPP * half + i / NT, n = i - (i / NT) * NT;
      if (o.row0 + n < o.count)
        *reinterpret_cast<uint4*>(h + ((static_cast<int64_t>(o.n_tile) * 16 + plane) * rows + o.first + o.row0 + n) * 8) =
            src[i];
    }
  }
}

// Down: y[first + pair, column] = sum x m2 for the tile's columns below N and its valid pairs.
template <int NT>
__device__ __forceinline__ void wg_store_y(const float (&acc)[2][NT / 2], float m2, float* y, int64_t N,
                                           const int (&mrow)[2][2], const WgTileOut& o) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t col = static_cast<int64_t>(o.n_tile) * kWgRows + mrow[mt][h];
      if (col >= N) continue;
#pragma unroll
      for (int j = 0; j < NT / 8; ++j)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          const int r = o.row0 + 8 * j + 2 * o.t + e2;
          if (r < o.count) y[static_cast<int64_t>(o.first + r) * N + col] = acc[mt][4 * j + 2 * h + e2] * m2;
        }
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
