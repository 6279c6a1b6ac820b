// KV row packing: one block per row (the row's packing: pack_kv_row in kv_row_dev.cuh).
#include "backends/cuda/kernels/kv_row_dev.cuh"
#include "backends/cuda/kernels/launch.cuh"

namespace tern::cuda {
namespace dev {
namespace {

__global__ void kv_pack_kernel(const float* x, KvRowDesc f, uint8_t* rows) {
  pdl_prologue();
  const int64_t row = blockIdx.x;
  pack_kv_row(x + row * f.head_dim, f, rows + row * f.row_bytes, threadIdx.x, blockDim.x);
}

__global__ void kv_unpack_kernel(const uint8_t* rows, int64_t n, KvRowDesc f, float* x) {
  pdl_prologue();
  const int64_t total = n * f.head_dim;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = kv_value(rows + (i / f.head_dim) * f.row_bytes, f, i % f.head_dim);
}

}  // namespace
}  // namespace dev

void launch_kv_pack(const float* x, int64_t n, const KvRowDesc& f, uint8_t* rows, cudaStream_t stream) {
  if (n == 0) return;
  launch(dev::kv_pack_kernel, static_cast<unsigned>(n), 256, 0, stream, x, f, rows);
}

void launch_kv_unpack(const uint8_t* rows, int64_t n, const KvRowDesc& f, float* x, cudaStream_t stream) {
  const int64_t total = n * f.head_dim;
  if (total == 0) return;
  const int blocks = static_cast<int>(total / 256 + 1 > 65535 ? 65535 : total / 256 + 1);
  launch(dev::kv_unpack_kernel, blocks, 256, 0, stream, rows, n, f, x);
}

}  // namespace tern::cuda
