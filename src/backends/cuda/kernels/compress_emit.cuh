// Decode steps: a compressor's whole emit chain in one launch (host interface). Per slot: the accumulator
// update of compressor_kernel's decode mode and, when the slot's token closes a window, the entry RMS-normed,
// RoPE'd at its position, packed to the row format and stored into the slot's paged rows -- what
// compressor_kernel, rms_norm_row_kernel, rope_kernel, kv_pack_kernel and store_rows_kernel do in turn, with
// their device code (compressor_dev.cuh, norm_dev.cuh, rope_dev.cuh, kv_row_dev.cuh), so the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/compressor.cuh"
#include "backends/cuda/kernels/kv_row.cuh"
#include "backends/cuda/kernels/norm.cuh"
#include "backends/cuda/kernels/paged_rows.cuh"

namespace tern::cuda {

struct CompressEmitParams {
  CompressorParams compressor;  // decode mode (positions, accs, slots); emitted unused
  const void* norm = nullptr;   // [width]
  NormWeight norm_kind = NormWeight::f32;
  float eps = 0.0f;
  const float* inv_freq = nullptr;  // [half]: the entry's RoPE at position (position / ratio) * ratio
  int64_t half = 0;
  KvRowDesc format;  // head_dim == width
  // Slot i's rows: pool and block table at pools[i] / tables[i], geometry in `paged`; the entry is row
  // position / ratio.
  PagedRowsDesc paged;
  const uint64_t* pools = nullptr;
  const uint64_t* tables = nullptr;
};

// Whether the fused kernel takes entries of `width` dims: 128, 256 or 512 (a thread per channel, the norm in
// rms_norm_row_kernel's register layout; 1024 threads of 64 registers spilled, and no V4 compressor is that wide).
bool compress_emit_width_supported(int64_t width);
void launch_compress_emit(const CompressEmitParams& p, cudaStream_t stream);

}  // namespace tern::cuda
