// One block per slot: the device decides whether and where the slot's row lands.
#include "backends/cuda/kernels/decode_rows.cuh"
#include "backends/cuda/kernels/launch.cuh"

namespace tern::cuda {
namespace dev {
namespace {

__global__ void store_rows_kernel(StoreRowsParams p) {
  pdl_prologue();
  const int64_t slot = blockIdx.x, pos = p.positions[slot];
  if (pos < 0) return;
  uint8_t* dst = nullptr;
  if (p.ratio > 0) {
    if ((pos + 1) % p.ratio != 0) return;
    dst = slot_paged_row(p.paged, p.pools, p.tables, slot, pos / p.ratio);
  } else {
    // The op's contract for any q (the model refuses q > window today, so this does not fire there).
    if (p.firsts != nullptr && slot + p.window < p.slots && p.firsts[slot + p.window] == p.firsts[slot]) return;
    dst = reinterpret_cast<uint8_t*>(p.rings[slot]) + (pos % p.window) * p.row_bytes;
  }
  const uint8_t* src = p.src + slot * p.row_bytes;
  for (int64_t b = threadIdx.x; b < p.row_bytes; b += blockDim.x) dst[b] = src[b];
}

}  // namespace
}  // namespace dev

void launch_store_rows(const StoreRowsParams& p, cudaStream_t stream) {
  if (p.slots == 0 || p.row_bytes == 0) return;
  launch(dev::store_rows_kernel, static_cast<unsigned>(p.slots), 128, 0, stream, p);
}

}  // namespace tern::cuda
