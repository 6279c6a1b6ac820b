// RMSNorm: one warp per row for rows up to 1024 wide (the per-head norms; vectorised when the width is a
// multiple of 128), one block per row otherwise.
#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/norm.cuh"

namespace tern::cuda {
namespace dev {
namespace {

__device__ __forceinline__ float norm_weight(const void* w, NormWeight kind, int64_t i) {
  switch (kind) {
    case NormWeight::none: return 1.0f;
    case NormWeight::f32: return static_cast<const float*>(w)[i];
    case NormWeight::bf16: return bf16_bits_to_f32(static_cast<const uint16_t*>(w)[i]);
  }
  return 1.0f;
}

__global__ void rms_norm_warp_kernel(const float* x, const void* w, NormWeight kind, float eps, int64_t rows,
                                     int64_t dim, float* out) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* src = x + row * dim;
  float ss = 0.0f;
  for (int64_t i = lane; i < dim; i += 32) ss += src[i] * src[i];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  for (int64_t i = lane; i < dim; i += 32) out[row * dim + i] = norm_weight(w, kind, i) * (src[i] * inv);
}

// Rows of kVec * 128 columns (the per-head norms: 128 .. 1024), one warp each: the row stays in registers
// (kVec float4 per lane, all loads in flight at once) and is read once; the scalar kernel above re-read it and
// had one 4-byte load per lane in flight (7 us a call at 16 tokens). Lane l sums columns 4(l + 32v) .. +3 for
// v in order, then the warp sum: the same order for a row whatever the other rows.
template <int kVec>
__global__ void rms_norm_vec_kernel(const float* x, const void* w, NormWeight kind, float eps, int64_t rows,
                                    float* out) {
  constexpr int kDim = kVec * 128;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float4* src = reinterpret_cast<const float4*>(x + row * kDim);
  float4 v[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = src[lane + 32 * i];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(kDim) + eps);
  float4* dst = reinterpret_cast<float4*>(out + row * kDim);
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const int64_t c = 4 * (lane + 32 * i);
    dst[lane + 32 * i] = make_float4(norm_weight(w, kind, c) * (v[i].x * inv), norm_weight(w, kind, c + 1) * (v[i].y * inv),
                                     norm_weight(w, kind, c + 2) * (v[i].z * inv), norm_weight(w, kind, c + 3) * (v[i].w * inv));
  }
}

__global__ void rms_norm_block_kernel(const float* x, const void* w, NormWeight kind, float eps, int64_t dim,
                                      float* out) {
  __shared__ float scratch[32];
  const float* src = x + static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += src[i] * src[i];
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  float* dst = out + static_cast<int64_t>(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = norm_weight(w, kind, i) * (src[i] * inv);
}

}  // namespace
}  // namespace dev

void launch_rms_norm(const float* x, const void* weight, NormWeight kind, float eps, int64_t rows, int64_t dim,
                     float* out, cudaStream_t stream) {
  if (rows == 0 || dim == 0) return;
  const unsigned warp_blocks = static_cast<unsigned>((rows + 7) / 8);
  const bool vec_ok = dim % 128 == 0 && dim <= 1024 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec_ok) {
    switch (dim / 128) {
      case 1: dev::rms_norm_vec_kernel<1><<<warp_blocks, 256, 0, stream>>>(x, weight, kind, eps, rows, out); return;
      case 2: dev::rms_norm_vec_kernel<2><<<warp_blocks, 256, 0, stream>>>(x, weight, kind, eps, rows, out); return;
      case 4: dev::rms_norm_vec_kernel<4><<<warp_blocks, 256, 0, stream>>>(x, weight, kind, eps, rows, out); return;
      case 8: dev::rms_norm_vec_kernel<8><<<warp_blocks, 256, 0, stream>>>(x, weight, kind, eps, rows, out); return;
      default: break;
    }
  }
  if (dim <= 1024) {
    dev::rms_norm_warp_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(x, weight, kind, eps, rows,
                                                                                         dim, out);
  } else {
    dev::rms_norm_block_kernel<<<static_cast<unsigned>(rows), 512, 0, stream>>>(x, weight, kind, eps, dim, out);
  }
}

}  // namespace tern::cuda
