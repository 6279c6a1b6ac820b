// L2 prefetch of a weight's bytes (ops::prefetch): docs/cuda-backend.md, "L2 prefetch".
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

// Asks the L2 for bytes [p, p + bytes) (p 16-byte aligned; a tail below 16 bytes is left out), in 16 KB bulk
// prefetches spread over up to kL2PrefetchBlocks blocks. A hint: nothing waits for the bytes, nothing changes.
void launch_l2_prefetch(const void* p, int64_t bytes, cudaStream_t stream);

}  // namespace tern::cuda
