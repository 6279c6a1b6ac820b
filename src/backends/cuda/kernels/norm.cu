// RMSNorm: one warp per row for rows up to 1024 wide (the per-head norms), one block per row otherwise.
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
  if (dim <= 1024) {
    dev::rms_norm_warp_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(x, weight, kind, eps, rows,
                                                                                         dim, out);
  } else {
    dev::rms_norm_block_kernel<<<static_cast<unsigned>(rows), 512, 0, stream>>>(x, weight, kind, eps, dim, out);
  }
}

}  // namespace tern::cuda
