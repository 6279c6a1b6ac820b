// Library GEMMs (cuBLAS) for products with many tokens: prefill chunks. A decode step streams each weight
// once for a few tokens (our own kernels, weights in their checkpoint format); a prefill chunk multiplies
// thousands of tokens by the same weights, which is tensor-core work a library does at its rate. Here the
// weights are expanded to bf16 (exactly: e4m3, e2m1 times their block scales are bf16 numbers; NVFP4's f32
// global scale goes into alpha) into scratch, x is rounded to bf16 as our kernels round it, and cuBLAS
// accumulates in f32: the numerics of the tensor-core kernels, in another summation order.
//
// FP8 weights can also stay FP8: fp8_block runs cuBLASLt's block-scaled FP8 product (DeepSeek's 1x128 activation
// and 128x128 weight scales, Hopper only) on x quantised by the caller.
//
// Host code of the CUDA backend (includes the runtime API); no cuBLAS header leaves this file pair.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>


namespace tern::cuda {

// Tokens from which linear / grouped_linear / moe_experts take the library path (unless the backend is
// batch invariant). Above every decode graph bucket (at most 256), so a captured decode step never does.
constexpr int64_t kLibraryMinTokens = 512;


// One product of a group: C[n, m] (ldc) = alpha * B[n, k] (ldb) * A[m, k]^T (lda), row-major
// names; A and B bf16, C f32.
struct GroupedProblem {
  const void* a = nullptr;
  const void* b = nullptr;
  float* c = nullptr;
  int n = 0;
  float alpha = 1.0f;
};

// Blocks of a batched product: `batch` of them, the operands `*_stride` elements apart.
struct GemmBatch {
  int batch = 1;
  int64_t x_stride = 0, w_stride = 0, y_stride = 0;
};

class LibraryGemm {
 public:
  // side_streams: how many side streams (each with its handle and a 32 MB workspace) the grouped calls (bf16_each,
  // fp8_block with groups) spread over, at most 4; 0: they run in series on the caller's stream (a backend's side
  // lane, whose products are small: it needs its own workspace, not four more).
  explicit LibraryGemm(int side_streams = 4);
  ~LibraryGemm();
  LibraryGemm(const LibraryGemm&) = delete;
  LibraryGemm& operator=(const LibraryGemm&) = delete;

  // y[T, out] (row stride ldy) = alpha * x[T, in] (ldx) * W[out, in]^T (ldw), batched over `batch`
  // blocks (GemmBatch; batch 1 ignores the strides). bf16 x and W, f32 y and accumulation; beta 1 adds to y.
  void bf16(cudaStream_t s, int64_t T, int64_t out, int64_t in, const void* x, int64_t ldx, const void* w,
            int64_t ldw, float* y, int64_t ldy, float alpha = 1.0f, GemmBatch b = {}, float beta = 0.0f);
  // The same in f32 throughout (the exact path: router gates, indexer projections), no TF32.
  void f32(cudaStream_t s, int64_t T, int64_t out, int64_t in, const float* x, int64_t ldx, const float* w,
           int64_t ldw, float* y, int64_t ldy, GemmBatch b = {});
  // Products sharing m, k and the leading dimensions (the MoE's, one or two per expert), one cublasGemmEx
  // each, spread over side streams (ordered after everything issued on s before, and s after them). (cublasGemmGroupedBatchedEx refuses bf16 inputs with f32 outputs: CUBLAS_STATUS_NOT_SUPPORTED on the
  // H200 with CUDA 13.0, 2026-12-03.)
  void bf16_each(cudaStream_t s, std::span<const GroupedProblem> problems, int64_t m, int64_t k, int64_t lda,
                 int64_t ldb, int64_t ldc);

  // FP8 product with DeepSeek's block scales on cuBLASLt (sm_90 only; library_gemm.cpp gives the sources):
  //   y[t, r] (f32, row stride ldy) = sum over 128-column blocks b of
  //                                   sx[b, t] * sw[r / 128, b] * sum_{k in b} xq[t, k] * wq[r, k]
  // - xq: e4m3 [T, in], row stride ldx bytes (a multiple of 16); wq: e4m3 [out, in] (rows of `in` bytes).
  // - sx: f32 activation scales stored TOKEN-major, [in / 128][T] (sx[b * T + t]: the transpose of a
  //   quantiser's natural [T, in / 128]), as cuBLASLt reads 1x128 scales.
  // - sw: f32 [out / 128][fp8_weight_scale_ld(in)] row-major (the checkpoint's [out / 128, in / 128] with each row
  //   padded to a multiple of 4 scales); launch_block_scales_f32 writes it from e8m0 or f32 scales once per weight.
  // - in % 128 == 0, out % 128 == 0, T % 4 == 0 (see kFp8TokenMultiple), every pointer 16-byte aligned, ldy % 4 == 0.
  // groups > 1: a block-diagonal weight (wo_a): `out` and `in` are one group's; xq [T, groups * in], wq
  // [groups * out, in], y [T, groups * out] (group g maps columns g * in.. of x to columns g * out.. of y), sx
  // [groups * in / 128][T], sw [groups * out / 128][fp8_weight_scale_ld(in)]. One cuBLASLt call per group, the
  // groups spread over side streams (ordered after everything issued on s before, and s after them).
  // Throws tern::Error on a shape or layout it cannot take, or where the card / cuBLAS has no such product.
  void fp8_block(cudaStream_t s, int64_t T, int64_t out, int64_t in, const uint8_t* xq, int64_t ldx, const float* sx,
                 const uint8_t* wq, const float* sw, float* y, int64_t ldy, int groups = 1);
  // Whether this device and the cuBLASLt loaded at run time have fp8_block (compute capability 9.x, cuBLASLt >= 12.9).
  bool fp8_block_supported() const;
  // Row stride (in scales) of fp8_block's weight scales for `in` columns: ceil(in / 128) rounded up to 4.
  static int64_t fp8_weight_scale_ld(int64_t in);
  // fp8_block's token count must be a multiple of this (sx's rows are T scales: 16-byte aligned rows; see the .cpp).
  static constexpr int64_t kFp8TokenMultiple = 4;

  // Time of bf16(T, out, in) (or f32) on random operands in device memory: the library's rate on a shape.
  double time_us(cudaStream_t s, int64_t T, int64_t out, int64_t in, bool f32, int reps);
  // Time of the MoE's products alone on already expanded bf16 experts: T tokens x k picks spread evenly
  // over E experts, w1|w3 ([2 inter, D]) then w2 ([D, inter]) per expert, as the op issues them.
  double time_moe_us(cudaStream_t s, int64_t T, int64_t E, int64_t k, int64_t D, int64_t inter, int reps);
  // Time of fp8_block(T, out, in, groups) on random operands in device memory (unit scales; T a multiple of 4).
  double time_fp8_block_us(cudaStream_t s, int64_t T, int64_t out, int64_t in, int reps, int groups = 1);
  // Times of the same product (one group) on each of the heuristic's first `max_algos` algorithms, in its order
  // (fp8_block runs the first): whether the heuristic's first choice is the fastest at a shape.
  std::vector<double> time_fp8_block_algos_us(cudaStream_t s, int64_t T, int64_t out, int64_t in, int reps,
                                              int max_algos);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern::cuda
