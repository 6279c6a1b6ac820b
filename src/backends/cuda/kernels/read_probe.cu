// Read-bandwidth probes (tern_gpu_bench --only probe): how fast this card streams a buffer it only reads, by
// the two ways the decode kernels fetch weights, over a sweep of how many bytes each multiprocessor keeps in
// flight. Why: the MoE decode kernel reached 60-63% of copy bandwidth with its arithmetic removed (session 8
// ablation), so the question is what the fetch pattern itself can give on this card: the ceilings to hold
// the kernels against, measured in the same run.
//
// - bulk: a block of one producer warp and one consumer warp per ring: the producer fills `stages` slots of
//   `stage_bytes` with cp.async.bulk (`copies` equal copies a stage, one per lane), the consumer waits for each
//   slot, reads one word of it and releases it (bulk_pipe.cuh's protocol). Block b takes stages b, b + G, ...
//   of the buffer, so each stage is one contiguous run.
// - ldg: every thread keeps `unroll` 16-byte ld.global.nc loads in flight, grid-strided.
// - tile (session 31): the prefill grouped MoE kernels' pattern: a block walks a tile of `rows` weight rows of
//   `row_bytes` in stages of `chunk` bytes a row (a cp.async ring of STAGES slots of rows x chunk bytes, 128
//   threads, 16 bytes a thread and piece, consecutive threads along a row's chunk), tiles b, b + G, ... Why: the
//   grouped kernels read 256 rows x 64 bytes a stage and reach ~55-61% of copy at 1K tokens where the decode
//   ring's 32 KB runs reach the copy rate; the sweep over chunk at a fixed stage size tells whether the short
//   per-row runs (DRAM page locality) are the ceiling; the 64-byte rows again with the L2 prefetch hints of
//   cp_async16_l2 (session 32), which ask DRAM for 128 / 256 bytes a row at once without changing the layout.
#include <cuda_runtime.h>

#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/bulk_pipe.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/read_probe.cuh"
#include "backends/cuda/kernels/stream_tile.cuh"

namespace tern::cuda {
namespace dev {
namespace {

__global__ void __launch_bounds__(64) bulk_read_kernel(const uint8_t* buf, int64_t nstages, int stage_bytes,
                                                        int stages, int copies, int own_range, uint32_t* sink) {
  pdl_prologue();
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + static_cast<size_t>(stages) * stage_bytes);
  const BulkRing ring{bars, bars + stages, stages};
  if (threadIdx.x == 0) {
    ring.init(1);
    mbar_init_fence();
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Stages b, b + G, ... (all blocks side by side in one region), or with own_range the block's own
  // contiguous range [b * n / G, (b + 1) * n / G) (the blocks' reads megabytes apart, as the MoE kernel's).
  const int64_t first = own_range ? blockIdx.x * nstages / gridDim.x : blockIdx.x;
  const int64_t step = own_range ? 1 : gridDim.x;
  const int64_t mine = own_range ? (blockIdx.x + 1) * nstages / gridDim.x - first
                                 : (nstages - blockIdx.x + gridDim.x - 1) / gridDim.x;
  if (warp == 0) {
    const uint32_t piece = static_cast<uint32_t>(stage_bytes / copies);
    for (int64_t i = 0; i < mine; ++i) {
      const int idx = static_cast<int>(i);
      ring.wait_free(idx);
      if (lane == 0) ring.arm(idx, static_cast<uint32_t>(stage_bytes));
      __syncwarp();
      if (lane < copies) {
        const uint8_t* src = buf + (first + i * step) * stage_bytes + lane * piece;
        bulk_copy_g2s(smem + ring.slot(idx) * stage_bytes + lane * piece, src, piece, ring.full_bar(idx));
      }
    }
    return;
  }
  uint32_t acc = 0;
  for (int64_t i = 0; i < mine; ++i) {
    const int idx = static_cast<int>(i);
    ring.wait_full(idx);
    acc ^= reinterpret_cast<const uint32_t*>(smem + ring.slot(idx) * stage_bytes)[lane];
    ring.release(idx);
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the reads
}

__global__ void __launch_bounds__(256) ldg_read_kernel(const uint4* buf, int64_t n, int unroll, uint32_t* sink) {
  pdl_prologue();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  constexpr int kMax = 8;
  for (; i + (unroll - 1) * stride < n; i += unroll * stride) {
    uint4 v[kMax];
#pragma unroll
    for (int u = 0; u < kMax; ++u)
      if (u < unroll) v[u] = ldg_stream(buf + i + u * stride);
#pragma unroll
    for (int u = 0; u < kMax; ++u)
      if (u < unroll) acc ^= v[u].x ^ v[u].w;
  }
  for (; i < n; i += stride) acc ^= ldg_stream(buf + i).x;
  if (acc == 0x12345678u) sink[0] = acc;
}

template <int STAGES>
__global__ void __launch_bounds__(128) tile_read_kernel(const uint8_t* buf, int64_t tiles, int rows, int row_bytes,
                                                        int chunk, int l2_prefetch, uint32_t* sink) {
  pdl_prologue();
  extern __shared__ __align__(16) uint8_t smem[];
  const int stage_bytes = rows * chunk, pieces = stage_bytes / 16, per_row = chunk / 16, kbs = row_bytes / chunk;
  uint32_t acc = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const uint8_t* tile = buf + t * rows * row_bytes;
    auto load = [&](int kb, int slot) {
      for (int p = threadIdx.x; p < pieces; p += blockDim.x) {
        const int r = p / per_row, c = p - r * per_row;
        cp_async16_l2(smem_addr(smem + slot * stage_bytes + p * 16),
                      tile + static_cast<int64_t>(r) * row_bytes + kb * chunk + c * 16, 16, l2_prefetch);
      }
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < kbs) load(s, s);
      cp_async_commit();
    }
    for (int kb = 0; kb < kbs; ++kb) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();  // stage kb landed; slot (kb - 1) % STAGES is free
      if (kb + STAGES - 1 < kbs) load(kb + STAGES - 1, (kb + STAGES - 1) % STAGES);
      cp_async_commit();
      acc ^= reinterpret_cast<const uint32_t*>(smem + (kb % STAGES) * stage_bytes)[threadIdx.x];
    }
    cp_async_wait<0>();
    __syncthreads();
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

}  // namespace
}  // namespace dev

void prepare_read_probes() {
  TERN_CUDA(cudaFuncSetAttribute(dev::bulk_read_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  TERN_CUDA(cudaFuncSetAttribute(dev::tile_read_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  TERN_CUDA(cudaFuncSetAttribute(dev::tile_read_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  TERN_CUDA(cudaFuncSetAttribute(dev::tile_read_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
}

void launch_bulk_read(const uint8_t* buf, int64_t nstages, int stage_bytes, int stages, int copies, bool own_range,
                      int grid, uint32_t* sink, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(stages) * stage_bytes + 2 * stages * 8;
  launch(dev::bulk_read_kernel, grid, 64, smem, stream, buf, nstages, stage_bytes, stages, copies,
         own_range ? 1 : 0, sink);
}

void launch_tile_read(const uint8_t* buf, int64_t tiles, int rows, int row_bytes, int chunk, int stages, int smem,
                      int l2_prefetch, int grid, uint32_t* sink, cudaStream_t stream) {
  const size_t bytes = std::max<size_t>(static_cast<size_t>(stages) * rows * chunk, static_cast<size_t>(smem));
  switch (stages) {
    case 2: launch(dev::tile_read_kernel<2>, grid, 128, bytes, stream, buf, tiles, rows, row_bytes, chunk, l2_prefetch, sink); break;
    case 3: launch(dev::tile_read_kernel<3>, grid, 128, bytes, stream, buf, tiles, rows, row_bytes, chunk, l2_prefetch, sink); break;
    default: launch(dev::tile_read_kernel<4>, grid, 128, bytes, stream, buf, tiles, rows, row_bytes, chunk, l2_prefetch, sink); break;
  }
}

void launch_ldg_read(const uint8_t* buf, int64_t bytes, int unroll, int grid, uint32_t* sink, cudaStream_t stream) {
  launch(dev::ldg_read_kernel, grid, 256, 0, stream, reinterpret_cast<const uint4*>(buf), bytes / 16, unroll,
         sink);
}

}  // namespace tern::cuda
