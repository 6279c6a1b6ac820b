// The tensor-core linear kernel, instantiated per weight format in linear_<fmt>.cu (nvcc only).
//
// Grid: x = 128-row blocks of W (4 warps x 32 rows), y = K splits, z = token tiles of NT*8 tokens.
// With several K splits each block writes its partial sums; the last block of a (row block, token tile)
// to arrive adds them in split order, so the result does not depend on scheduling.
#pragma once

#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/linear.cuh"
#include "backends/cuda/kernels/mma_tile.cuh"

namespace tern::cuda {

struct LinearPlan {
  int nt = 1;          // n-tiles per warp (tokens per tile = 8 * nt)
  int64_t bx = 0, bz = 0;
  int ksplit = 1;
  int64_t chunks_per_split = 0;
};

LinearPlan plan_linear(const LinearParams& p);

namespace dev {

struct LinearArgs {
  MatRef mat;
  int64_t out, row_bytes, rows_per_group, x_stride, T;
  const float* x;
  float* y;
  float* partial;
  int* counters;
  int64_t chunks_per_split;
};

template <WeightFormat F, int NT>
__global__ void __launch_bounds__(128) linear_mma_kernel(LinearArgs a) {
  grid_dependency_wait();  // PDL (launch.cuh): weights and x are loaded together below, nothing comes earlier
  constexpr int kChunk = Fmt<F>::kChunk;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * 128 + warp * 32;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.z) * NT * 8;
  const int ksplit = gridDim.y;
  const int64_t nch = a.mat.in / kChunk;
  // chunks_per_split is the group size; with one split the block walks every group.
  const int64_t kb = blockIdx.y * a.chunks_per_split * kChunk;
  const int64_t ke = ksplit == 1 ? nch * kChunk : min(nch, (blockIdx.y + 1) * a.chunks_per_split) * kChunk;

  float acc[2][NT][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.0f;

  if (row0 < a.out && kb < ke) {
    const MatRef mat[2] = {a.mat, a.mat};
    const uint8_t* wrow[2][2];
    const uint8_t* srow[2][2];
    const int scale_bytes = a.mat.scale_f32 ? 4 : 1;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t row = row0 + 16 * m + g + 8 * r;
        const bool in = row < a.out;
        wrow[m][r] = in ? a.mat.w + row * a.row_bytes : nullptr;
        if constexpr (F == WeightFormat::fp8_block)
          srow[m][r] = a.mat.s + (row0 / 128) * a.mat.s_cols * scale_bytes;
        else
          srow[m][r] = in && a.mat.s != nullptr ? a.mat.s + row * a.mat.s_cols : nullptr;
      }
    const int64_t group = row0 / a.rows_per_group;
    const float* xrow[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const int64_t tok = tok0 + 8 * n + g;
      xrow[n] = tok < a.T ? a.x + tok * a.x_stride + group * a.mat.in : nullptr;
    }
    if (ksplit > 1 || ke - kb <= a.chunks_per_split * kChunk) {
      warp_mma<F, 2, NT>(mat, wrow, srow, xrow, kb, ke, acc);
    } else {
      // One block, several groups: add each group's sum in group order, as the split combine does.
      for (int64_t gb = kb; gb < ke; gb += a.chunks_per_split * kChunk) {
        float part[2][NT][4] = {};
        warp_mma<F, 2, NT>(mat, wrow, srow, xrow, gb, min(ke, gb + a.chunks_per_split * kChunk), part);
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[m][n][i] += part[m][n][i];
      }
    }
  }
  grid_dependents_launch();  // the block's weights are read: the next kernel may be scheduled

  float* dst = ksplit > 1 ? a.partial + static_cast<int64_t>(blockIdx.y) * a.T * a.out : a.y;
  const float mult = ksplit > 1 ? 1.0f : a.mat.out_mult;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t row = row0 + 16 * m + g + 8 * (i >> 1);
        const int64_t tok = tok0 + 8 * n + 2 * t + (i & 1);
        if (row < a.out && tok < a.T) dst[tok * a.out + row] = acc[m][n][i] * mult;
      }
  if (ksplit == 1) return;

  finish_split_k(a.partial, a.y, a.counters, blockIdx.x + static_cast<int64_t>(gridDim.x) * blockIdx.z, ksplit,
                 static_cast<int64_t>(blockIdx.x) * 128, 128, a.out, a.T, tok0, min(a.T, tok0 + NT * 8), a.mat.out_mult);
}

}  // namespace dev

template <WeightFormat F>
void launch_linear_mma(const LinearParams& p, const LinearPlan& plan, cudaStream_t stream) {
  dev::LinearArgs a{};
  a.mat.w = static_cast<const uint8_t*>(p.w.w);
  a.mat.s = static_cast<const uint8_t*>(p.w.s);
  a.mat.in = p.w.in;
  a.mat.s_cols = p.w.s_cols;
  a.mat.scale_f32 = p.w.scale_f32 ? 1 : 0;
  a.mat.out_mult = dev::is_scaled<F>() ? dev::kWeightShift * (F == WeightFormat::nvfp4 ? p.w.global_scale : 1.0f)
                                       : 1.0f;
  a.out = p.w.out;
  switch (F) {
    case WeightFormat::f32: a.row_bytes = p.w.in * 4; break;
    case WeightFormat::bf16: a.row_bytes = p.w.in * 2; break;
    case WeightFormat::fp8_block: a.row_bytes = p.w.in; break;
    case WeightFormat::mxfp4:
    case WeightFormat::nvfp4: a.row_bytes = p.w.in / 2; break;
  }
  a.rows_per_group = p.rows_per_group;
  a.x_stride = p.x_stride;
  a.T = p.T;
  a.x = p.x;
  a.y = p.y;
  a.partial = p.partial;
  a.counters = p.counters;
  a.chunks_per_split = plan.chunks_per_split;
  const dim3 grid(static_cast<unsigned>(plan.bx), static_cast<unsigned>(plan.ksplit), static_cast<unsigned>(plan.bz));
  switch (plan.nt) {
    case 1: launch(dev::linear_mma_kernel<F, 1>, grid, 128, 0, stream, a); break;
    case 2: launch(dev::linear_mma_kernel<F, 2>, grid, 128, 0, stream, a); break;
    default: launch(dev::linear_mma_kernel<F, 4>, grid, 128, 0, stream, a); break;
  }
}

}  // namespace tern::cuda
