// L2 prefetch of weights ahead of the products that read them (prefetch.cu; ops::prefetch_weights).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

constexpr int kMaxPrefetchRanges = 4;

struct PrefetchRanges {
  const void* p[kMaxPrefetchRanges] = {};
  int64_t bytes[kMaxPrefetchRanges] = {};
  int n = 0;
};

// Asks the memory system to bring the ranges into L2, in order, and returns: one kernel issues bulk
// prefetches (cp.async.bulk.prefetch.L2) and completes once the previous kernel of the stream has (PDL rule),
// without waiting for the bytes. Each range is widened to 16-byte boundaries.
void launch_l2_prefetch(const PrefetchRanges& r, cudaStream_t stream);

}  // namespace tern::cuda
