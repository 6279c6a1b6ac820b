// FP8 weights x FP8 activations (--activations fp8, ops/act_quant.h) for decode-sized products (one token tile
// streams the weights once up to 64 tokens). Host interface.
//
//   y[t, r] = sum over 128-column blocks b of  sw[r / 128, b] * sx[t, b] * sum_{k in b} wq[r, k] * xq[t, k]
//
// wq, sw: the checkpoint's FP8 weight and its 128x128 block scales; xq, sx: x quantised by act_quant. Each
// block's sum comes from eight f16 m16n8k16 MMAs on the exact f16 images of the e4m3 numbers (one hardware
// conversion a pair of weights) and is scaled into an f32 accumulator, as DeepSeek's reference promotes every
// 128 columns: no scale multiply per weight and no x conversion, against linear_stream's bf16 path.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/linear.cuh"

namespace tern::cuda {

// Every decode size (the library takes >= 512 tokens), so that a token's bits never depend on its batch. Measured
// on the H200 (results.md, session 13) against linear_stream's bf16 path: 10% faster on the 32 MB products at one
// token (wo_a, wo_b 16.9 against 18.7 us), even at 16 tokens, 20-60% slower at 64 (wq_b 45.5 against 33.9 us): each
// warp reads 16 bytes of x from shared memory per weight byte there, the shared-memory bandwidth of a
// multiprocessor at the copy rate. The next step for 16-64 tokens: wgmma (x and the weights read by the tensor
// cores from shared memory, FP8 at its own rate).
// True when the kernel takes this product: FP8-block weight, in a multiple of 128, out and each row group
// multiples of 128 (every 128-row tile inside one group and one scale row), 16-byte aligned weight rows.
bool linear_x8_ok(const LinearParams& p);
// Floats of split-K workspace launch_linear_x8 wants in p.partial (0: none) given p.partial_floats' budget
// is unknown: the most it can use.
int64_t linear_x8_partial_floats(const LinearParams& p);
// Which form runs: wgmma (the default: x as e4m3 bytes from launch_act_quant) or mma.sync (TERN_X8=mma: x as the
// f16 images of its e4m3 values from launch_act_quant_f16).
bool linear_x8_wgmma();
// y = W x for x quantised as linear_x8_wgmma() says ([T, x_stride], x_stride = the row's columns, groups * in for a
// grouped product) and sx (f32 [T, x_stride / 128]). p.x is not read.
void launch_linear_x8(const LinearParams& p, const void* x, const float* sx, cudaStream_t stream);

}  // namespace tern::cuda
