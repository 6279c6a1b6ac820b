// The online compressor: one thread per (channel, window). Each emitted entry is folded independently from the
// chunk's tokens (and, for the chunk's first windows, the pending accumulators), in the same order as the CPU
// reference (the open window's second halves after the previous window's first halves), with the same running
// (max, sum, weighted sum). Blocks hold 32 channels x 8 window lanes.
//
// The pending accumulators are read by the threads of the chunk's first two windows and replaced by the thread
// of its last window, so those three windows are one block's (blockIdx.z = 0: read, barrier, write); the
// windows between them read only the chunk, so they are spread over blocks z >= 1 (a prefill chunk of 8 192
// tokens at ratio 4 has 2 048 windows: walked by 8 lanes of 16 blocks, it took 1.1 ms a call).
#include <algorithm>

#include "backends/cuda/kernels/compressor.cuh"
#include "backends/cuda/kernels/compressor_dev.cuh"
#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/launch.cuh"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kChannels = 32, kLanes = 8;

__global__ void __launch_bounds__(kChannels* kLanes) compressor_kernel(CompressorParams p) {
  pdl_prologue();
  // Decode (step) mode: this block's slot's sequence as its chunk (continuation slots return).
  if (p.positions != nullptr && !select_decode_slot(p, blockIdx.y)) return;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kChannels + (threadIdx.x % kChannels);
  const int lane = threadIdx.x / kChannels;
  const int64_t r = p.ratio, s0 = p.start_pos, end = p.start_pos + p.n;
  const int64_t w0 = s0 / r, wlast = (end - 1) / r;
  if (blockIdx.z > 0) {  // a window strictly between w0 + 1 and wlast: complete, all its tokens in the chunk
    const int64_t w = w0 + 2 + (static_cast<int64_t>(blockIdx.z) - 1) * kLanes + lane;
    if (c >= p.width || w >= wlast) return;
    Acc open;
    if (p.overlap) fold_tokens(p, open, (w - 1) * r, w * r, c);  // the previous window's first halves
    fold_tokens(p, open, w * r, (w + 1) * r, p.overlap ? p.width + c : c);
    p.emitted[emit_row(p, w) * p.width + c] = open.v / open.s;
    return;
  }
  Acc acc0, acc1;
  if (c < p.width) {
    acc0 = pending_acc(p, 0, c);
    if (p.overlap) acc1 = pending_acc(p, 1, c);
  }
  __syncthreads();
  if (c >= p.width) return;
  // Lane 0: w0; lane 1: w0 + 1; lane 2: wlast (each when it exists and is not another lane's).
  const int64_t w = lane == 0 ? w0 : lane == 1 ? w0 + 1 : wlast;
  if (lane > 2 || w > wlast || (lane == 2 && wlast < w0 + 2)) return;
  bool complete = false;
  const float value = fold_window(p, c, w, acc0, acc1, &complete);
  if (complete) p.emitted[emit_row(p, w) * p.width + c] = value;
}

}  // namespace
}  // namespace dev

void launch_compressor(const CompressorParams& p, cudaStream_t stream) {
  const int64_t slots = p.positions != nullptr ? p.slots : 1;
  if ((p.positions == nullptr && p.n == 0) || slots == 0 || p.width == 0) return;
  // Prefill: blocks z >= 1 take the windows strictly between the chunk's second and last (decode: none).
  int64_t middle = 0;
  if (p.positions == nullptr) {
    const int64_t w0 = p.start_pos / p.ratio, wlast = (p.start_pos + p.n - 1) / p.ratio;
    middle = std::max<int64_t>(0, wlast - w0 - 2);
  }
  const dim3 blocks(static_cast<unsigned>((p.width + dev::kChannels - 1) / dev::kChannels),
                    static_cast<unsigned>(slots), static_cast<unsigned>(1 + (middle + dev::kLanes - 1) / dev::kLanes));
  launch(dev::compressor_kernel, blocks, dev::kChannels * dev::kLanes, 0, stream, p);
}

}  // namespace tern::cuda
