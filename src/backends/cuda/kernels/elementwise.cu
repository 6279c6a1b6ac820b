// Small ops: one thread per output element (or 4), grid-stride loops.
#include <algorithm>

#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/elementwise.cuh"
#include "backends/cuda/kernels/launch.cuh"

namespace tern::cuda {
namespace dev {
namespace {

int grid_for(int64_t n, int threads = 256) {
  return static_cast<int>(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65535));
}

__global__ void embedding_kernel(const void* table, int bf16, int64_t vocab, int64_t D, const int64_t* ids,
                                 int64_t T, float* out, int* err) {
  pdl_prologue();
  const int64_t n = T * D;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, d = i % D, id = ids[t];
    if (id < 0 || id >= vocab) {
      if (d == 0) raise(err, kErrTokenId);
      out[i] = 0.0f;
      continue;
    }
    out[i] = bf16 ? bf16_bits_to_f32(static_cast<const uint16_t*>(table)[id * D + d])
                  : static_cast<const float*>(table)[id * D + d];
  }
}

__global__ void add_kernel(const float* x, float* y, int64_t n) {
  pdl_prologue();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void swiglu_kernel(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, float limit,
                              float* out, int64_t rows, int64_t cols) {
  pdl_prologue();
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    out[i] = siluf_(fminf(gate[r * gate_stride + c], limit)) * fminf(fmaxf(up[r * up_stride + c], -limit), limit);
  }
}

__global__ void gather_rows_kernel(const float* x, int64_t R, int64_t D, const int64_t* rows, int64_t n, float* out,
                                   int* err) {
  pdl_prologue();
  const int64_t total = n * D;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = rows[i / D];
    if (r < 0 || r >= R) {
      if (i % D == 0) raise(err, kErrGatherRow);
      out[i] = 0.0f;
      continue;
    }
    out[i] = x[r * D + i % D];
  }
}

__global__ void hc_expand_kernel(const float* x, int64_t T, int64_t hc, int64_t D, float* streams) {
  pdl_prologue();
  const int64_t total = T * hc * D;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    streams[i] = x[(i / (hc * D)) * D + i % D];
}

}  // namespace
}  // namespace dev

void launch_embedding(const void* table, bool table_bf16, int64_t vocab, int64_t D, const int64_t* ids, int64_t T,
                      float* out, int* err, cudaStream_t stream) {
  if (T * D == 0) return;
  launch(dev::embedding_kernel, dev::grid_for(T * D), 256, 0, stream, table, table_bf16, vocab, D, ids, T,
         out, err);
}

void launch_add(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch(dev::add_kernel, dev::grid_for(n), 256, 0, stream, x, y, n);
}

void launch_swiglu(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, float limit, float* out,
                   int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return;
  launch(dev::swiglu_kernel, dev::grid_for(rows * cols), 256, 0, stream, gate, gate_stride, up, up_stride, limit, out,
         rows, cols);
}

void launch_gather_rows(const float* x, int64_t R, int64_t D, const int64_t* rows, int64_t n, float* out, int* err,
                        cudaStream_t stream) {
  if (n * D == 0) return;
  launch(dev::gather_rows_kernel, dev::grid_for(n * D), 256, 0, stream, x, R, D, rows, n, out, err);
}

void launch_hc_expand(const float* x, int64_t T, int64_t hc, int64_t D, float* streams, cudaStream_t stream) {
  if (T * hc * D == 0) return;
  launch(dev::hc_expand_kernel, dev::grid_for(T * hc * D), 256, 0, stream, x, T, hc, D, streams);
}

}  // namespace tern::cuda
