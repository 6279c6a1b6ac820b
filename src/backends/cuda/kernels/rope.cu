// RoPE: one thread per (row, head, pair) (the pair's arithmetic: rope_dev.cuh).
#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/rope.cuh"
#include "backends/cuda/kernels/rope_dev.cuh"

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
    rope_pair(x + rh * head_dim + first + 2 * pair, inv_freq[pair], positions[row], inverse != 0);
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
