// RoPE of one interleaved pair on the device (nvcc only), shared by rope_kernel and the decode step's fused
// emit chain (compress_emit.cu), so a compressed entry is rotated with the same bits either way.
#pragma once

#include <cstdint>

namespace tern::cuda::dev {

// The sine and cosine of the angle fp32 position * inv_freq (or its negative when inverse). sincosf is the precise
// (range-reduced) version: positions reach a million.
__device__ __forceinline__ void rope_sincos(float inv_freq, int64_t position, bool inverse, float* s, float* c) {
  const float angle = inv_freq * static_cast<float>(position);
  sincosf(angle, s, c);
  if (inverse) *s = -*s;
}

// The pair (v[0], v[1]) rotated by the angle whose sine and cosine rope_sincos gave (a caller that rotates several
// pairs by one angle computes them once: the same bits).
__device__ __forceinline__ void rope_rotate(float* v, float s, float c) {
  const float x0 = v[0], x1 = v[1];
  // The roundings spelled out: written as x0 * c - x1 * s, the compiler contracted the products into fused
  // multiply-adds differently in rope_kernel and in compressor_emit_kernel (v[1]: fma(c, x1, x0 * s) in one,
  // fma(x0, s, c * x1) in the other), so the same source gave other bits. v[1] is rope_kernel's form of before.
  v[0] = __fmaf_rn(x0, c, -__fmul_rn(x1, s));
  v[1] = __fmaf_rn(c, x1, __fmul_rn(x0, s));
}

// The pair (v[0], v[1]) rotated by the angle fp32 position * inv_freq, as in the reference (or by its negative when
// inverse).
__device__ __forceinline__ void rope_pair(float* v, float inv_freq, int64_t position, bool inverse) {
  float s, c;
  rope_sincos(inv_freq, position, inverse, &s, &c);
  rope_rotate(v, s, c);
}

}  // namespace tern::cuda::dev
