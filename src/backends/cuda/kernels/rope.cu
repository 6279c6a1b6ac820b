// RoPE: one thread per (row, head, pair). The angle is fp32 position * inv_freq as in the reference, and
// sinf/cosf are the precise (range-reduced) versions, since positions reach a million.
#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/rope.cuh"

namespace tern::cuda {
namespace dev {
namespace {

__global__ void rope_kernel(float* x, int64_t rows, int64_t heads, int64_t head_dim, const int64_t* positions,
                            const float* inv_freq, int64_t half, int inverse) {
  pdl_prologue();
  const int64_t total = rows * heads * half;
  const int64_t first = head_dim - 2 * half;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pair = i % half, rh = i / half, row = rh / heads;
    const float angle = inv_freq[pair] * static_cast<float>(positions[row]);
    float s, c;
    sincosf(angle, &s, &c);
    if (inverse) s = -s;
    float* v = x + rh * head_dim + first + 2 * pair;
    const float x0 = v[0], x1 = v[1];
    v[0] = x0 * c - x1 * s;
    v[1] = x1 * c + x0 * s;
  }
}

}  // namespace
}  // namespace dev

void launch_rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, const int64_t* positions,
                 const float* inv_freq, int64_t half, bool inverse, cudaStream_t stream) {
  const int64_t total = rows * heads * half;
  if (total == 0) return;
  const int blocks = static_cast<int>(total / 256 + 1 > 65535 ? 65535 : total / 256 + 1);
  launch(dev::rope_kernel, blocks, 256, 0, stream, x, rows, heads, head_dim, positions, inv_freq, half,
         inverse ? 1 : 0);
}

}  // namespace tern::cuda
