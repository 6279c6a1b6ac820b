// Launchers of the read-bandwidth probe kernels (read_probe.cu; the sweep is timing.cpp's
// read_bandwidth_probes).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

void prepare_read_probes();
// Streams nstages * stage_bytes bytes of buf through rings of `stages` slots, `copies` bulk copies a stage;
// the blocks side by side, or each through its own contiguous range (own_range).
void launch_bulk_read(const uint8_t* buf, int64_t nstages, int stage_bytes, int stages, int copies, bool own_range,
                      int grid, uint32_t* sink, cudaStream_t stream);
// Reads `bytes` of buf with `unroll` 16-byte loads in flight a thread, 256 threads a block.
void launch_ldg_read(const uint8_t* buf, int64_t bytes, int unroll, int grid, uint32_t* sink, cudaStream_t stream);

}  // namespace tern::cuda
