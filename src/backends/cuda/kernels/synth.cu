// Synthetic weights on the device: the CPU backend's synth_fill (backends/cpu/synth.cpp) as kernels, with the
// same values (ops/synth_values.h) and the same quantization rules, so the bytes agree.
#include <cuda_bf16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/synth.cuh"
#include "ops/synth_values.h"

namespace tern::cuda {
namespace dev {
namespace {

int grid_for(int64_t n, int threads = 256) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 65536 * 16 ? (blocks > 0 ? blocks : 1) : 65536 * 16);
}

// The smallest power of two >= x (x > 0, finite) as e8m0 bits (core's e8m0_ceil_pow2).
__device__ __forceinline__ uint8_t e8m0_ceil_pow2(float x) {
  const uint32_t u = __float_as_uint(x);
  uint32_t e = (u >> 23) & 0xff;
  if (e == 0) return 0;  // below 2^-126: the smallest scale
  if (u & 0x7fffff) ++e;
  return static_cast<uint8_t>(e > 254 ? 0xff : e);
}
__device__ __forceinline__ float e8m0_to_f32(uint8_t bits) { return __uint_as_float(static_cast<uint32_t>(bits) << 23); }
__device__ __forceinline__ uint8_t f32_to_e4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ float e4m3_to_f32(uint8_t bits) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, __NV_E4M3)));
}
__device__ __forceinline__ uint8_t f32_to_e2m1(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)) & 15;
}

__global__ void synth_values_kernel(bool normal, uint64_t seed, float a, float b, void* out, bool out_bf16, int64_t n) {
  pdl_prologue();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = normal ? synth::normal_value(seed, i, a, b) : synth::uniform_value(seed, i, a, b);
    if (out_bf16) static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
    else static_cast<float*>(out)[i] = v;
  }
}

// One 256-thread block per 128x128 block of the weight: amax, scale, then the values again, quantized.
__global__ void synth_fp8_kernel(uint64_t seed, float sigma, int64_t R, int64_t C, uint8_t* q, uint8_t* scale) {
  pdl_prologue();
  const int64_t bi = (C + 127) / 128, b = blockIdx.x;
  const int64_t r0 = b / bi * 128, c0 = b % bi * 128;
  const int64_t h = R - r0 < 128 ? R - r0 : 128, w = C - c0 < 128 ? C - c0 : 128;
  float amax = 0;
  for (int64_t k = threadIdx.x; k < h * w; k += blockDim.x) {
    const int64_t r = r0 + k / w, c = c0 + k % w;
    amax = fmaxf(amax, fabsf(synth::normal_value(seed, r * C + c, 0.0f, sigma)));
  }
  __shared__ float warp_max[8];
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0;
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, warp_max[i]);
  const uint8_t bits = e8m0_ceil_pow2(fmaxf(amax, 1e-30f) / 448.0f);
  const float s = e8m0_to_f32(bits);
  if (threadIdx.x == 0) scale[b] = bits;
  for (int64_t k = threadIdx.x; k < h * w; k += blockDim.x) {
    const int64_t r = r0 + k / w, c = c0 + k % w;
    q[r * C + c] = f32_to_e4m3(synth::normal_value(seed, r * C + c, 0.0f, sigma) / s);
  }
}

// One thread per scale block (32 values for MXFP4, 16 for NVFP4).
template <bool kNv>
__global__ void synth_fp4_kernel(uint64_t seed, float sigma, float global_scale, int64_t blocks, uint8_t* q, uint8_t* scale) {
  pdl_prologue();
  constexpr int kBlock = kNv ? 16 : 32;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t first = b * kBlock;
    float v[kBlock];
    float amax = 0;
#pragma unroll
    for (int j = 0; j < kBlock; ++j) {
      v[j] = synth::normal_value(seed, first + j, 0.0f, sigma);
      amax = fmaxf(amax, fabsf(v[j]));
    }
    uint8_t bits;
    float s;
    if constexpr (kNv) {
      bits = f32_to_e4m3(amax / (6.0f * global_scale));  // amax >= 0: an unsigned e4m3
      if (bits == 0) bits = 1;
      s = e4m3_to_f32(bits) * global_scale;
    } else {
      bits = e8m0_ceil_pow2(fmaxf(amax, 1e-30f) / 6.0f);
      s = e8m0_to_f32(bits);
    }
    scale[b] = bits;
    uint32_t words[kBlock / 8];
#pragma unroll
    for (int w = 0; w < kBlock / 8; ++w) {
      uint32_t word = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) word |= static_cast<uint32_t>(f32_to_e2m1(v[8 * w + j] / s)) << (4 * j);
      words[w] = word;
    }
    uint32_t* dst = reinterpret_cast<uint32_t*>(q + first / 2);  // 8- or 16-byte aligned: q is 256-aligned
#pragma unroll
    for (int w = 0; w < kBlock / 8; ++w) dst[w] = words[w];
  }
}

__global__ void synth_distinct_rows_kernel(uint64_t seed, int64_t rows, int k, int64_t choices, int64_t* out) {
  pdl_prologue();
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x)
    synth::distinct_row(seed, r, k, choices, out + r * k);
}

}  // namespace
}  // namespace dev

void launch_synth_values(bool normal, uint64_t seed, float a, float b, void* out, bool out_bf16, int64_t n,
                         cudaStream_t stream) {
  if (n == 0) return;
  launch(dev::synth_values_kernel, dev::grid_for(n), 256, 0, stream, normal, seed, a, b, out, out_bf16, n);
}

void launch_synth_fp8(uint64_t seed, float sigma, int64_t rows, int64_t cols, uint8_t* q, uint8_t* scale,
                      cudaStream_t stream) {
  const int64_t blocks = (rows + 127) / 128 * ((cols + 127) / 128);
  if (blocks == 0) return;
  launch(dev::synth_fp8_kernel, static_cast<unsigned>(blocks), 256, 0, stream, seed, sigma, rows, cols, q,
         scale);
}

void launch_synth_fp4(bool nvfp4, uint64_t seed, float sigma, float global_scale, int64_t rows, int64_t cols,
                      uint8_t* q, uint8_t* scale, cudaStream_t stream) {
  const int64_t blocks = rows * cols / (nvfp4 ? 16 : 32);
  if (blocks == 0) return;
  if (nvfp4)
    launch(dev::synth_fp4_kernel<true>, dev::grid_for(blocks), 256, 0, stream, seed, sigma, global_scale,
           blocks, q, scale);
  else
    launch(dev::synth_fp4_kernel<false>, dev::grid_for(blocks), 256, 0, stream, seed, sigma, global_scale,
           blocks, q, scale);
}

void launch_synth_distinct_rows(uint64_t seed, int64_t rows, int k, int64_t choices, int64_t* out,
                                cudaStream_t stream) {
  if (rows == 0) return;
  launch(dev::synth_distinct_rows_kernel, dev::grid_for(rows), 256, 0, stream, seed, rows, k, choices, out);
}

}  // namespace tern::cuda
