// Synthetic weights on the device (host interface of synth.cu): ops/synth.h's kinds, element for element the
// CPU backend's values (ops/synth_values.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

// out[i] = mean + std * unit value (normal) or uniform in [a, b), i < n; f32 or bf16 (out_bf16).
void launch_synth_values(bool normal, uint64_t seed, float a, float b, void* out, bool out_bf16, int64_t n,
                         cudaStream_t stream);
// A [rows, cols] weight of std sigma: e4m3 values with one e8m0 scale per 128x128 block.
void launch_synth_fp8(uint64_t seed, float sigma, int64_t rows, int64_t cols, uint8_t* q, uint8_t* scale,
                      cudaStream_t stream);
// A [rows, cols] weight of std sigma as packed e2m1 pairs: MXFP4 (e8m0 per 32) or NVFP4 (ue4m3 per 16,
// relative to global_scale).
void launch_synth_fp4(bool nvfp4, uint64_t seed, float sigma, float global_scale, int64_t rows, int64_t cols,
                      uint8_t* q, uint8_t* scale, cudaStream_t stream);
// out [rows, k]: k distinct values in [0, choices) per row.
void launch_synth_distinct_rows(uint64_t seed, int64_t rows, int k, int64_t choices, int64_t* out,
                                cudaStream_t stream);

}  // namespace tern::cuda
