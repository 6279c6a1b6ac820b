// Small ops (host interface): embedding lookup, residual add, clamped SwiGLU, row gather, stream expand.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

// out[t] = table[ids[t]]; table bf16 (table_bf16) or f32 [vocab, D]. Bad ids raise kErrTokenId, row = 0.
void launch_embedding(const void* table, bool table_bf16, int64_t vocab, int64_t D, const int64_t* ids, int64_t T,
                      float* out, int* err, cudaStream_t stream);
void launch_add(const float* x, float* y, int64_t n, cudaStream_t stream);
// gate, up [rows, cols] with their strides from one row to the next (cols, or more for the column ranges of a
// stacked product's output); out [rows, cols] contiguous.
void launch_swiglu(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, float limit, float* out,
                   int64_t rows, int64_t cols, cudaStream_t stream);
// out[i] = x[rows[i]]; x [R, D]. Bad rows raise kErrGatherRow, row = 0.
void launch_gather_rows(const float* x, int64_t R, int64_t D, const int64_t* rows, int64_t n, float* out, int* err,
                        cudaStream_t stream);
// streams[t, i] = x[t] for i < hc.
void launch_hc_expand(const float* x, int64_t T, int64_t hc, int64_t D, float* streams, cudaStream_t stream);

}  // namespace tern::cuda
