// RMSNorm (host interface): out = x * rsqrt(mean(x^2) + eps) * weight, fp32 arithmetic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

enum class NormWeight : int { none, f32, bf16 };

// x, out [rows, dim] (out may alias x).
void launch_rms_norm(const float* x, const void* weight, NormWeight kind, float eps, int64_t rows, int64_t dim,
                     float* out, cudaStream_t stream);

}  // namespace tern::cuda
