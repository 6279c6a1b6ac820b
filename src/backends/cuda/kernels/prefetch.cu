// L2 prefetch of a weight's bytes: at small batches a decode step's dense products stream their weights from
// DRAM while the latency-bound kernels between them (norms, RoPE, the indexer, attention) leave DRAM idle; a
// product whose weights were asked into L2 during that idle time reads them from L2 (docs/cuda-backend.md,
// "L2 prefetch"). cp.async.bulk.prefetch.L2 (sm_90) is a hint served by the copy engine of the issuing
// multiprocessor: nothing tracks its completion, so the kernel ends as soon as it has issued them.
#include <algorithm>

#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/prefetch.cuh"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kPrefetchThreads = 32;
constexpr int64_t kPrefetchChunk = 16 * 1024;  // bytes a prefetch instruction

__global__ void __launch_bounds__(kPrefetchThreads) l2_prefetch_kernel(const uint8_t* p, int64_t bytes) {
  // Before the wait: the prefetches, of a weight's bytes only (no kernel writes weights), so they overlap the
  // previous kernel; then the wait that the PDL rule asks of every kernel.
  const int64_t chunks = (bytes + kPrefetchChunk - 1) / kPrefetchChunk;
  for (int64_t c = blockIdx.x + static_cast<int64_t>(gridDim.x) * threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = c * kPrefetchChunk;
    const auto size = static_cast<uint32_t>(min(kPrefetchChunk, bytes - at));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + at), "r"(size) : "memory");
  }
  pdl_prologue();
}

}  // namespace
}  // namespace dev

void launch_l2_prefetch(const void* p, int64_t bytes, cudaStream_t stream) {
  bytes = bytes / 16 * 16;  // (the bulk prefetch's sizes are multiples of 16; weights are)
  if (p == nullptr || bytes <= 0 || reinterpret_cast<uintptr_t>(p) % 16 != 0) return;
  constexpr int64_t kL2PrefetchBlocks = 128;  // spread over the multiprocessors' copy engines
  const int64_t chunks = (bytes + dev::kPrefetchChunk - 1) / dev::kPrefetchChunk;
  // A chunk a block first (a 32 MB product's 2 048 chunks: 16 a multiprocessor), then a warp's worth each.
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(kL2PrefetchBlocks, chunks));
  launch(dev::l2_prefetch_kernel, blocks, dev::kPrefetchThreads, 0, stream, static_cast<const uint8_t*>(p), bytes);
}

}  // namespace tern::cuda
