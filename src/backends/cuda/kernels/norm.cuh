// RMSNorm (host interface): out = x * rsqrt(mean(x^2) + eps) * weight, fp32 arithmetic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

enum class NormWeight : int { none, f32, bf16 };

// x [rows, dim] with x_stride floats from one row to the next (dim, or more for a column range of a stacked
// product's output), out [rows, dim] contiguous (may alias x when x_stride == dim).
void launch_rms_norm(const float* x, int64_t x_stride, const void* weight, NormWeight kind, float eps, int64_t rows,
                     int64_t dim, float* out, cudaStream_t stream);

// launch_rms_norm then RoPE (launch_rope, not inverse) of the last 2 * half dims of each row, in one launch
// with the same bits: rows = tokens * heads rows of dim <= kNormRopeMaxDim, positions [tokens] (row r is
// token r / heads). False (nothing launched) for wider rows: the caller runs the two kernels.
inline constexpr int64_t kNormRopeMaxDim = 1024;
bool launch_norm_rope(const float* x, int64_t x_stride, const void* weight, NormWeight kind, float eps, int64_t rows,
                      int64_t heads, int64_t dim, const int64_t* positions, const float* inv_freq, int64_t half,
                      float* out, cudaStream_t stream);

}  // namespace tern::cuda
