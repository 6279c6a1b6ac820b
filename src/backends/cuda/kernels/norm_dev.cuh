// RMSNorm of one row held by one warp (nvcc only): lane l holds columns l, l + 32, ... in registers. Shared by
// rms_norm_row_kernel and the decode step's fused emit chain (compress_emit.cu), so a compressed entry is
// normed with the same bits either way.
#pragma once

#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/norm.cuh"

namespace tern::cuda::dev {

__device__ __forceinline__ float norm_weight(const void* w, NormWeight kind, int64_t i) {
  switch (kind) {
    case NormWeight::none: return 1.0f;
    case NormWeight::f32: return static_cast<const float*>(w)[i];
    case NormWeight::bf16: return bf16_bits_to_f32(static_cast<const uint16_t*>(w)[i]);
  }
  return 1.0f;
}

// Lane `lane`'s weights of a row of kCols * 32 columns (wv[i]: column lane + 32 i). The weights' format is
// chosen once, outside the loads: a switch per element (norm_weight) made the compiler issue one load after
// another (12.7 us for one 1024-wide row).
template <int kCols>
__device__ __forceinline__ void load_norm_weights(const void* w, NormWeight kind, int lane, float (&wv)[kCols]) {
  if (kind == NormWeight::bf16) {
    const uint16_t* wb = static_cast<const uint16_t*>(w);
#pragma unroll
    for (int i = 0; i < kCols; ++i) wv[i] = bf16_bits_to_f32(wb[lane + 32 * i]);
  } else if (kind == NormWeight::f32) {
    const float* wf = static_cast<const float*>(w);
#pragma unroll
    for (int i = 0; i < kCols; ++i) wv[i] = wf[lane + 32 * i];
  } else {
#pragma unroll
    for (int i = 0; i < kCols; ++i) wv[i] = 1.0f;
  }
}

// v (v[i]: column lane + 32 i of a row of kCols * 32 columns) normed in place, every lane of the warp
// calling: the lane sums its columns in turn, then the warp sum (rms_norm_warp_kernel's order, so the same
// bits), then w * (v * rsqrt(mean + eps)).
template <int kCols>
__device__ __forceinline__ void rms_norm_lanes(float (&v)[kCols], const float (&wv)[kCols], float eps) {
  constexpr int kDim = kCols * 32;
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kCols; ++i) ss += v[i] * v[i];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(kDim) + eps);
#pragma unroll
  for (int i = 0; i < kCols; ++i) v[i] = wv[i] * (v[i] * inv);
}

}  // namespace tern::cuda::dev
