// The official reference's activation quantisation on the GPU (ops/act_quant.h): each 128 values of a row of
// x scaled by 2^ceil(log2(max(amax, 1e-4) / 448)) and rounded to e4m3, bit for bit as the CPU does it: the e4m3
// bytes and f32 scales (for FP8 x FP8 tensor-core products), or the dequantised values e4m3 * scale in f32 (exact,
// for the kernels that take x as it comes); and bf16 rows quantised in place. Host interface.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

// Rows of x: f32, `x_stride` floats apart (16-byte aligned), `cols` of them (a multiple of 128) quantised.
struct ActRows {
  const float* x = nullptr;
  int64_t T = 0, x_stride = 0, cols = 0;
};

// xq[t, c] e4m3 (row stride cols bytes), sx[t, c / 128] f32; or with sx_token_ld > 0 the scales token-major,
// sx[(c / 128) * sx_token_ld + t] (cuBLASLt's 1x128 layout, LibraryGemm::fp8_block).
void launch_act_quant(const ActRows& r, uint8_t* xq, float* sx, cudaStream_t stream, int64_t sx_token_ld = 0);
// out[t, c] = e4m3(q[t, c]) * scales[(c / 128) * scale_ld + t]: rows act_quant wrote (token-major scales) back in f32,
// exact (ops::Fp8Rows taken by a product that quantises x itself). out [T, cols] contiguous.
void launch_act_dequant(const uint8_t* q, const float* scales, int64_t scale_ld, int64_t T, int64_t cols, float* out,
                        cudaStream_t stream);
// out[t, c] = e4m3(x / s) * s in f32, rows `out_stride` floats apart (out may be x itself).
void launch_act_fake_quant(const ActRows& r, float* out, int64_t out_stride, cudaStream_t stream);

// bf16 rows quantised in place (the MoE's h between its up and down products on the prefill paths): `rows` rows
// of `cols` columns, row-major `stride` elements apart, or with planes > 0 the grouped wgmma kernels' layout
// (element (r, c) at ((c / 8) * planes + r) * 8 + c % 8). A permutation of columns inside each 128-column block
// (the grouped kernels store their K permuted so) quantises the same: a block's scale is its largest |value|.
struct Bf16Rows {
  uint16_t* h = nullptr;
  int64_t rows = 0, cols = 0, stride = 0, planes = 0;
};
void launch_act_fake_quant_bf16_inplace(const Bf16Rows& r, cudaStream_t stream);

}  // namespace tern::cuda
