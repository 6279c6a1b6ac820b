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
// Reads `tiles` tiles of `rows` rows x `row_bytes` (back to back from buf), each block its tiles b, b + grid, ... in
// stages of `chunk` bytes a row through a cp.async ring of `stages` (2-4) slots, 128 threads a block, with at least
// `smem` bytes of shared memory a block (to hold the blocks a multiprocessor to a number); `l2_prefetch`: the
// cp.async's L2 prefetch size hint (0, 128 or 256 bytes; stream_tile.cuh's cp_async16_l2).
void launch_tile_read(const uint8_t* buf, int64_t tiles, int rows, int row_bytes, int chunk, int stages, int smem,
                      int l2_prefetch, int grid, uint32_t* sink, cudaStream_t stream);
// Reads `bytes` of buf with `unroll` 16-byte loads in flight a thread, 256 threads a block.
void launch_ldg_read(const uint8_t* buf, int64_t bytes, int unroll, int grid, uint32_t* sink, cudaStream_t stream);

// The FP4 decode probe (fp4_decode_probe.cu): items of 64 rows x 4096 FP4 columns plus scales
// (fp4_decode_probe_item_bytes() each) streamed through `stages` 35 KB slots (one ring of stages / consumers
// slots a warpgroup), decoded by `variant`
// (0 bytes only, 1 bf16 + mma.sync, 2 e4m3 natural layout + wgmma, 3 e4m3 moved signs + wgmma; _name) with 2 or 3
// consumer warpgroups a block. With `check` (variants 2 and 3): x (e4m3, 8 tokens x 1 024 columns in the wgmma B
// layout, fp4_decode_probe.cu) for each 1 024 columns of an item, token n's sums scaled by 1 (n even) or 0.5 (odd),
// and each item's sums stored, f32 [items, 64, 8] (GpuDecodeProbe.E4m3SumsMatchTheHost).
void prepare_fp4_decode_probe();
const char* fp4_decode_probe_name(int variant);
int64_t fp4_decode_probe_item_bytes();
int fp4_decode_probe_max_stages();
void launch_fp4_decode_probe(int variant, int consumers, const uint8_t* buf, int64_t items, int stages, int grid,
                             uint32_t* sink, cudaStream_t stream, const uint32_t* x = nullptr, float* check = nullptr);

}  // namespace tern::cuda
