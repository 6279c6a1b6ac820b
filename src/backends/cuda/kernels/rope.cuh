// RoPE (host interface): interleaved pairs of the last 2*half dims of each head, rotated in place by
// position * inv_freq (or its negative for the inverse rotation).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

// x [rows, heads, head_dim]; positions [rows]; inv_freq [half].
void launch_rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, const int64_t* positions,
                 const float* inv_freq, int64_t half, bool inverse, cudaStream_t stream);

}  // namespace tern::cuda
