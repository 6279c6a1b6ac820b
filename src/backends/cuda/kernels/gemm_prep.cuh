// Operands for the library GEMMs (library_gemm.h): x rounded to bf16, weights expanded to bf16 (exact) or f32,
// and the MoE's pieces around its per-expert products (gathered rows, expanded experts, SwiGLU). Host
// interface; the kernels are in gemm_prep.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/linear.cuh"
#include "backends/cuda/kernels/moe.cuh"

namespace tern::cuda {

// The expanders read 16 columns at a time: `in` a multiple of 32 and the weight and scale addresses aligned.
bool expand_ok(const DeviceMat& w);

// out[r, c] = W[r, c] as bf16 (bits). Exact for fp8 block, mxfp4 and (without its global scale, which the caller
// puts into the GEMM's alpha) nvfp4; bf16 is copied; f32 is rounded to nearest even.
void launch_expand_bf16(const DeviceMat& w, uint16_t* out, cudaStream_t stream);
// out[r, c] = W[r, c] in f32, NVFP4's global scale included (what the CPU's dequantize gives).
void launch_expand_f32(const DeviceMat& w, float* out, cudaStream_t stream);

// y[r, 0:cols] = bf16(x[r * ld + 0:cols]) for r < rows (cols a multiple of 8, x 16-byte aligned rows).
void launch_round_bf16(const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* y, cudaStream_t stream);
// Three bf16 planes [3][rows, cols] whose sum is x exactly (to f32's 24 bits): the exact path's x for weights that
// are bf16 numbers (cols % 8 == 0, x 16-byte aligned with ld % 4 == 0).
void launch_split_bf16x3(const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* y, cudaStream_t stream);

// MoE: xs[slot] = bf16(x[sorted[slot] / k]) for the P sorted pairs.
void launch_moe_gather_bf16(const float* x, const int* sorted, int64_t P, int k, int64_t D, uint16_t* xs,
                            cudaStream_t stream);
// MoE: out[j] = w1, w3, w2 of expert jobs[3 * (first + j)] as bf16 (without NVFP4's global scales), each
// inter * D elements, for j < count.
void launch_moe_expand(const ExpertDesc* experts, WeightFormat kind, bool scale_f32, const int* jobs, int first,
                       int count, int64_t D, int64_t inter, uint16_t* out, cudaStream_t stream);
// MoE: h[r, c] = bf16(silu(min(g, limit)) * clamp(u, -limit, limit)), g = h13[r, c], u = h13[r, inter + c].
void launch_moe_swiglu_bf16(const float* h13, int64_t rows, int64_t inter, float limit, uint16_t* h,
                            cudaStream_t stream);

// Block scales as f32 for cuBLASLt's block-scaled FP8 products (LibraryGemm::fp8_block): out[r * ld + c] =
// s[r, c] for c < cols, 0 in the padding columns cols <= c < ld. s is [rows, cols] row-major, e8m0 bytes or (scale_f32)
// f32; once per weight at load, so the product reads f32 scales in the padded layout cuBLASLt asks for.
void launch_block_scales_f32(const void* s, bool scale_f32, int64_t rows, int64_t cols, int64_t ld, float* out,
                             cudaStream_t stream);

// Random e4m3 bytes of magnitude under 2, never NaN (benchmarks of the library's FP8 rate).
void launch_fill_random_e4m3(uint8_t* out, int64_t n, uint64_t seed, cudaStream_t stream);

// Random bf16 values of standard deviation about `sigma` (benchmarks of the library's rate).
void launch_fill_random_bf16(uint16_t* out, int64_t n, float sigma, uint64_t seed, cudaStream_t stream);

}  // namespace tern::cuda
