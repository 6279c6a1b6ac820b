// Decode steps: a compressor's emit chain in one launch, one block per slot and one thread per channel
// (width threads); a sequence of several tokens is its first slot's block's (the others return), which walks the
// chunk's windows in order. Each thread folds its channel (no barrier: no thread reads another channel's
// accumulators); each window the chunk closes puts its entry in shared memory, warp 0 norms it in the register layout of
// rms_norm_row_kernel, the rope pairs are rotated one per thread, and the block packs the row straight into the
// slot's paged row. Replaces five launches per compressor (compressor, rms_norm, rope, kv_pack, store_rows).
#include "backends/cuda/kernels/compress_emit.cuh"
#include "backends/cuda/kernels/compressor_dev.cuh"
#include "backends/cuda/kernels/kv_row_dev.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/norm_dev.cuh"
#include "backends/cuda/kernels/rope_dev.cuh"

namespace tern::cuda {
namespace dev {
namespace {

// The entry of window w (each thread its channel's value): rms_norm, RoPE at w * ratio, packed into entry w of the
// slot's paged rows. Every thread of the block calls it.
template <int kCols>
__device__ void emit_entry(const CompressEmitParams& p, float* entry, float value, int64_t w, int64_t slot) {
  constexpr int kWidth = kCols * 32;
  const int c = threadIdx.x;
  __syncthreads();  // the previous entry's pack has read the buffer
  entry[c] = value;
  __syncthreads();
  if (threadIdx.x < 32) {  // rms_norm of the entry (each lane reads and writes only its own columns)
    const int lane = threadIdx.x;
    float v[kCols], wv[kCols];
#pragma unroll
    for (int i = 0; i < kCols; ++i) v[i] = entry[lane + 32 * i];
    load_norm_weights(p.norm, p.norm_kind, lane, wv);
    rms_norm_lanes(v, wv, p.eps);
#pragma unroll
    for (int i = 0; i < kCols; ++i) entry[lane + 32 * i] = v[i];
  }
  __syncthreads();
  if (threadIdx.x < p.half)  // RoPE of the last 2 * half dims at the entry's position
    rope_pair(entry + kWidth - 2 * p.half + 2 * threadIdx.x, p.inv_freq[threadIdx.x], w * p.compressor.ratio, false);
  __syncthreads();
  pack_kv_row(entry, p.format, slot_paged_row(p.paged, p.pools, p.tables, slot, w), threadIdx.x, kWidth);
}

template <int kCols>
__global__ void __launch_bounds__(kCols * 32) compressor_emit_kernel(CompressEmitParams p) {
  pdl_prologue();
  __shared__ float entry[kCols * 32];
  CompressorParams cp = p.compressor;
  const int64_t slot = blockIdx.x;
  if (!select_decode_slot(cp, slot)) return;  // inert: the whole block
  const int c = threadIdx.x;
  const int64_t w0 = cp.start_pos / cp.ratio, wlast = (cp.start_pos + cp.n - 1) / cp.ratio;
  // The pending accumulators, read before the chunk's last window replaces them (each thread its own channel).
  const Acc acc0 = pending_acc(cp, 0, c), acc1 = cp.overlap ? pending_acc(cp, 1, c) : Acc{};
  for (int64_t w = w0; w <= wlast; ++w) {  // one window for a one-token chunk
    bool complete = false;
    const float value = fold_window(cp, c, w, acc0, acc1, &complete);
    if (!complete) continue;  // the same for every thread of the block (it depends on the positions only)
    emit_entry<kCols>(p, entry, value, w, slot);
  }
}

}  // namespace
}  // namespace dev

bool compress_emit_width_supported(int64_t width) {
  return width == 128 || width == 256 || width == 512;
}

void launch_compress_emit(const CompressEmitParams& p, cudaStream_t stream) {
  const unsigned slots = static_cast<unsigned>(p.compressor.slots);
  if (slots == 0) return;
  switch (p.compressor.width) {
    case 128: launch(dev::compressor_emit_kernel<4>, slots, 128, 0, stream, p); return;
    case 256: launch(dev::compressor_emit_kernel<8>, slots, 256, 0, stream, p); return;
    case 512: launch(dev::compressor_emit_kernel<16>, slots, 512, 0, stream, p); return;
    default: break;  // the backend checked compress_emit_width_supported
  }
}

}  // namespace tern::cuda
