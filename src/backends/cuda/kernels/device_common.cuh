// Device helpers shared by the kernels (nvcc only): exact decoders of the checkpoint dtypes (tested
// against core/dtype.h), warp reductions, the order-preserving float key of the top-k kernels, and the
// error flag kernels raise for data the host cannot check without a synchronisation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backends/cuda/kernels/errors.h"

namespace tern::cuda::dev {

__device__ __forceinline__ void raise(int* err, int bit) {
  if (err != nullptr) atomicOr(err, bit);
}

__device__ __forceinline__ float nan_f32() { return __int_as_float(0x7fc00000); }

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

// Two floats rounded to nearest-even bf16, lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// e8m0: 2^(b-127); 0xff is NaN; 0 is the subnormal 2^-127.
__device__ __forceinline__ float e8m0_to_f32(uint8_t b) {
  if (b == 0xff) return nan_f32();
  if (b == 0) return __uint_as_float(0x00400000u);
  return __uint_as_float(uint32_t(b) << 23);
}

// e4m3fn: bias 7, 0x7f / 0xff NaN, subnormals m * 2^-9.
__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
  if ((b & 0x7f) == 0x7f) return nan_f32();
  const uint32_t e = (b >> 3) & 0xf, m = b & 7;
  const float v = e == 0 ? static_cast<float>(m) * 0x1p-9f : __uint_as_float(((e + 120) << 23) | (m << 20));
  return (b & 0x80) ? -v : v;
}

__device__ __forceinline__ float ue4m3_to_f32(uint8_t b) { return (b & 0x80) ? nan_f32() : e4m3_to_f32(b); }

// e2m1 (low 4 bits): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
__device__ __forceinline__ float e2m1_to_f32(uint32_t nib) {
  const uint32_t c = nib & 7;
  const float v = c < 2 ? 0.5f * static_cast<float>(c) : __uint_as_float((((c >> 1) + 126) << 23) | ((c & 1) << 22));
  return (nib & 8) ? -v : v;
}

// Blocks of 256 threads for a grid-stride loop over n items: enough to fill the machine, at most 4096.
inline int grid_stride_blocks(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<int>(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats; the call synchronises the block twice.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < warps; ++i) total += scratch[i];
  return total;
}

// Order-preserving map of a float to an unsigned key: a > b (floats, no NaN) iff key(a) > key(b).
__device__ __forceinline__ uint32_t float_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + expf(-x)); }

}  // namespace tern::cuda::dev
