// FP8 weights x FP8 activations (--activations fp8, ops/act_quant.h) for decode-sized products (one token tile
// streams the weights once up to 64 tokens). Host interface.
//
//   y[t, r] = sum over 128-column blocks b of  sw[r / 128, b] * sx[t, b] * sum_{k in b} wq[r, k] * xq[t, k]
//
// wq, sw: the checkpoint's FP8 weight and its 128x128 block scales; xq, sx: x quantised by act_quant. Each
// block's sum comes from wgmma e4m3 MMAs (both operands read from shared memory by the tensor cores) and is scaled
// into an f32 accumulator, as DeepSeek's reference promotes every 128 columns.
//
// The same kernel takes bf16 weights (the compressors' wkv|wgate, the head) times x rounded to bf16 (the bf16
// products' numerics on every path: round_bf16 as the library path, f32 sums), by m64nNk16 bf16 MMAs on 64-column
// stages of the same 128-byte layout, with no scales.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/linear.cuh"

namespace tern::cuda {

// Every decode size (the library takes >= 512 tokens), so that a token's bits never depend on its batch. Measured
// on the H200 (results.md, session 13) against linear_stream's bf16 path: wq_b 12.2 / 12.8 / 17.4 us at 1 / 16 / 64
// tokens against 15.5 / 19.6 / 33.8 (65% of copy at one token), wo_a and wo_b 13.9 against 19.0 at one token; the
// small products (wq_a, wkv) are slower at 64 tokens (wq_a 21.6 against 16.6: 8 row tiles split over K).
// True when the kernel takes this product: FP8-block weight with in a multiple of 128, or bf16 with in a multiple
// of 64; out and each row group multiples of 128 (every 128-row tile inside one group and one scale row),
// 16-byte aligned weight rows.
bool linear_x8_ok(const LinearParams& p);
// Floats of split-K workspace launch_linear_x8 wants in p.partial (0: none) given p.partial_floats' budget
// is unknown: the most it can use.
int64_t linear_x8_partial_floats(const LinearParams& p);
// Whether the product splits K over blocks that add their sums as one thread-block cluster (p.cluster_split and a
// split of 2-8 blocks; the same bits as the workspace's split, finish_split_k).
bool linear_x8_splits_in_cluster(const LinearParams& p);
// y = W x for x quantised by launch_act_quant (xq: e4m3 [T, x_stride], x_stride = the row's columns, groups * in
// for a grouped product; sx: f32 [T, x_stride / 128]); for bf16 weights xq is x rounded to bf16 (launch_round_bf16,
// [T, x_stride] u16) and sx is not read. p.x is not read.
void launch_linear_x8(const LinearParams& p, const uint8_t* xq, const float* sx, cudaStream_t stream);
// Up to 8 tokens whose K range of quantised x fits the kernel's shared memory: the kernel quantises p.x (f32 [T,
// x_stride], 16-byte aligned) itself, act_quant's bytes and scales for FP8 weights, round_bf16's values for bf16, so
// one launch less and the same bits as act_quant (round_bf16) + launch_linear_x8. linear_x8_quantises_x says whether
// a product takes it (else refused).
bool linear_x8_quantises_x(const LinearParams& p);
// The widest token tile that quantises x itself: 8 (the default) or 16 (TERN_X8_QUANT_MAX_N at startup; the
// setter for in-process A/B, CudaBackend::set_knob).
void set_x8_quant_max_n(int n);
int x8_quant_max_n_now();
void launch_linear_x8_quantising(const LinearParams& p, cudaStream_t stream);

}  // namespace tern::cuda
