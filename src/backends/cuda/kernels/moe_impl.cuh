// Shared pieces of the MoE kernels (nvcc only): the workspace layout the plan kernel fills, and the expert
// kernels (instantiated per weight format in moe_experts_<fmt>.cu).
#pragma once

#include <algorithm>

#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/mma_tile.cuh"
#include "backends/cuda/kernels/moe.cuh"

namespace tern::cuda {

// Pairs per job of the bulk kernels' variant (the x window's rows).
int moe_bulk_job_tokens(const MoeParams& p);

// Byte layout of the MoE workspace for P = T*k pairs.
struct MoeLayout {
  int64_t P = 0, max_jobs = 0, tile = 8;
  size_t sorted = 0, pos = 0, jobs = 0, num_jobs = 0, h = 0, y = 0, total = 0;

  MoeLayout(const MoeParams& p) {
    P = p.T * p.k;
    // Pairs per job: most experts get one job. The bulk kernels take at most their variant's job_tokens (4 or
    // 8: at most one n-tile) per job, so their x window stays small; at up to 64 tokens few experts get more.
    tile = moe_bulk_taken(p) ? moe_bulk_job_tokens(p) : p.T <= 8 ? 8 : p.T <= 64 ? 16 : 32;
    max_jobs = std::min<int64_t>(P, p.E) + P / tile + 1;
    auto take = [&](size_t bytes) {
      const size_t at = total;
      total += (bytes + 255) / 256 * 256;
      return at;
    };
    sorted = take(P * sizeof(int));
    pos = take(P * sizeof(int));
    jobs = take(max_jobs * 3 * sizeof(int));
    num_jobs = take(3 * sizeof(int));  // the job count, then the bulk up and down kernels' item claims
    h = take(P * p.inter * sizeof(float));
    y = take(P * p.D * sizeof(float));
  }
};

// Launches the up (w1, w3 + SwiGLU) and down (w2) kernels for one format.
template <WeightFormat F>
void launch_moe_experts(const MoeParams& p, const MoeLayout& L, char* ws, cudaStream_t stream);

namespace dev {

constexpr int kMoeWarps = 4;
constexpr int kMoeMaxSlices = 8;

// K slices of an expert matrix with `chunks` chunks: each output is ((0 + s_0) + s_1) + ... over the slices
// (each slice summed in chunk order with one accumulator). From the shape alone, and the same in
// moe_expert_kernel and moe_bulk_kernel, so a token's bits do not depend on which kernel the batch size
// picks (nor on the variant). Slice i: chunks [i*per, min((i+1)*per, chunks)), per = ceil(chunks / ks).
__host__ __device__ constexpr int moe_k_slices(int64_t chunks) {
  return chunks >= 32 ? 8 : chunks >= 16 ? 4 : chunks >= 8 ? 2 : 1;
}

struct MoeArgs {
  MoeParams p;
  const int* sorted;  // pair ids grouped by expert
  const int* jobs;    // [max_jobs][3]: expert, first sorted slot, count
  const int* num_jobs;
  float* h;           // [P, inter] by sorted slot
  float* y;           // [P, D] by sorted slot
};

template <WeightFormat F>
__device__ __forceinline__ int64_t scale_cols(int64_t in) {
  if constexpr (F == WeightFormat::fp8_block) return (in + 127) / 128;
  else if constexpr (F == WeightFormat::mxfp4) return in / 32;
  else if constexpr (F == WeightFormat::nvfp4) return in / 16;
  else return 0;
}

template <WeightFormat F>
__device__ __forceinline__ int64_t row_bytes(int64_t in) {
  if constexpr (F == WeightFormat::f32) return in * 4;
  else if constexpr (F == WeightFormat::bf16) return in * 2;
  else if constexpr (F == WeightFormat::fp8_block) return in;
  else return in / 2;
}

template <WeightFormat F>
__device__ __forceinline__ MatRef expert_mat(const ExpertDesc& e, int which, int64_t in, int scale_f32) {
  MatRef m;
  m.w = static_cast<const uint8_t*>(e.w[which]);
  m.s = static_cast<const uint8_t*>(e.s[which]);
  m.in = in;
  m.s_cols = scale_cols<F>(in);
  m.scale_f32 = scale_f32;
  m.out_mult = is_scaled<F>() ? kWeightShift * (F == WeightFormat::nvfp4 ? e.global_scale[which] : 1.0f) : 1.0f;
  return m;
}

// Rows [row, row+16) of matrix `m` for this lane: (g, g+8) pointers and scale rows.
template <WeightFormat F>
__device__ __forceinline__ void tile_rows(const MatRef& m, int64_t row0, int64_t rows, int g, const uint8_t* (&w)[2],
                                          const uint8_t* (&s)[2]) {
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + g + 8 * r;
    const bool in = row < rows;
    w[r] = in ? m.w + row * row_bytes<F>(m.in) : nullptr;
    if constexpr (F == WeightFormat::fp8_block)
      s[r] = m.s + (row0 / 128) * m.s_cols * (m.scale_f32 ? 4 : 1);
    else
      s[r] = in && m.s != nullptr ? m.s + row * m.s_cols : nullptr;
  }
}

// Block (kMoeWarps warps) = one job x 32 weight rows: UP: 16 rows of w1 and the same 16 of w3 (SwiGLU
// fused), DOWN: 32 rows of w2. The warps take the K slices (moe_k_slices); partial sums meet in shared
// memory and are added in slice order.
template <WeightFormat F, int NT, bool UP>
__global__ void __launch_bounds__(kMoeWarps * 32) moe_expert_kernel(MoeArgs a) {
  grid_dependency_wait();  // PDL: first, as the job (and so the expert's weights) is the plan kernel's output
  const int job = blockIdx.y;
  if (job >= *a.num_jobs) return;
  const int e = a.jobs[3 * job], first = a.jobs[3 * job + 1], count = a.jobs[3 * job + 2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const MoeParams& p = a.p;
  const int64_t in = UP ? p.D : p.inter, rows = UP ? p.inter : p.D;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * (UP ? 16 : 32);
  const ExpertDesc ed = p.experts[e];
  const int sf = p.scale_f32 ? 1 : 0;
  MatRef mat[2];
  const uint8_t* wrow[2][2];
  const uint8_t* srow[2][2];
  if constexpr (UP) {
    mat[0] = expert_mat<F>(ed, 0, in, sf);
    mat[1] = expert_mat<F>(ed, 2, in, sf);
    tile_rows<F>(mat[0], row0, rows, g, wrow[0], srow[0]);
    tile_rows<F>(mat[1], row0, rows, g, wrow[1], srow[1]);
  } else {
    mat[0] = mat[1] = expert_mat<F>(ed, 1, in, sf);
    tile_rows<F>(mat[0], row0, rows, g, wrow[0], srow[0]);
    tile_rows<F>(mat[1], row0 + 16, rows, g, wrow[1], srow[1]);
  }
  const float* xrow[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int slot = 8 * n + g;
    if (slot >= count) {
      xrow[n] = nullptr;
    } else if (UP) {
      xrow[n] = p.x + static_cast<int64_t>(a.sorted[first + slot] / p.k) * p.D;
    } else {
      xrow[n] = a.h + static_cast<int64_t>(first + slot) * p.inter;
    }
  }
  constexpr int kChunk = Fmt<F>::kChunk;
  const int64_t chunks = in / kChunk;
  const int ks = moe_k_slices(chunks);
  const int64_t per = (chunks + ks - 1) / ks;
  // Warp w sums slices w, w + kMoeWarps, ... one at a time; the partials meet in shared memory.
  __shared__ float red[kMoeMaxSlices][2][NT][4][32];
  for (int sl = warp; sl < ks; sl += kMoeWarps) {
    const int64_t kb = min(chunks, sl * per) * kChunk, ke = min(chunks, (sl + 1) * per) * kChunk;
    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.0f;
    if (kb < ke) warp_mma<F, 2, NT>(mat, wrow, srow, xrow, kb, ke, acc);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) red[sl][m][n][i][lane] = acc[m][n][i];
  }
  grid_dependents_launch();  // the block's weights are read: the next kernel may be scheduled
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v[2];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        float s = 0.0f;
        for (int sl = 0; sl < ks; ++sl) s += red[sl][m][n][i][lane];
        v[m] = s * mat[m].out_mult;
      }
      const int slot = 8 * n + 2 * t + (i & 1);
      if (slot >= count) continue;
      if constexpr (UP) {
        const int64_t row = row0 + g + 8 * (i >> 1);
        if (row < rows)
          a.h[static_cast<int64_t>(first + slot) * p.inter + row] =
              siluf_(fminf(v[0], p.limit)) * fminf(fmaxf(v[1], -p.limit), p.limit);
      } else {
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const int64_t row = row0 + 16 * m + g + 8 * (i >> 1);
          if (row < rows) a.y[static_cast<int64_t>(first + slot) * p.D + row] = v[m];
        }
      }
    }
}

}  // namespace dev

// The kernels' view of the workspace (MoeArgs, MoeBulkArgs): the plan's outputs and the h / y buffers.
template <class Args>
void point_at_workspace(Args& a, const MoeParams& p, const MoeLayout& L, char* ws) {
  a.p = p;
  a.sorted = reinterpret_cast<const int*>(ws + L.sorted);
  a.jobs = reinterpret_cast<const int*>(ws + L.jobs);
  a.num_jobs = reinterpret_cast<const int*>(ws + L.num_jobs);
  a.h = reinterpret_cast<float*>(ws + L.h);
  a.y = reinterpret_cast<float*>(ws + L.y);
}

template <WeightFormat F>
void launch_moe_experts(const MoeParams& p, const MoeLayout& L, char* ws, cudaStream_t stream) {
  dev::MoeArgs a;
  point_at_workspace(a, p, L, ws);
  const dim3 up(static_cast<unsigned>((p.inter + 15) / 16), static_cast<unsigned>(L.max_jobs));
  const dim3 down(static_cast<unsigned>((p.D + 31) / 32), static_cast<unsigned>(L.max_jobs));
  if (L.tile == 8) {
    launch(dev::moe_expert_kernel<F, 1, true>, up, dev::kMoeWarps * 32, 0, stream, a);
    quantize_moe_h(p, a.h, L.P, stream);
    launch(dev::moe_expert_kernel<F, 1, false>, down, dev::kMoeWarps * 32, 0, stream, a);
  } else if (L.tile == 16) {
    launch(dev::moe_expert_kernel<F, 2, true>, up, dev::kMoeWarps * 32, 0, stream, a);
    quantize_moe_h(p, a.h, L.P, stream);
    launch(dev::moe_expert_kernel<F, 2, false>, down, dev::kMoeWarps * 32, 0, stream, a);
  } else {
    launch(dev::moe_expert_kernel<F, 4, true>, up, dev::kMoeWarps * 32, 0, stream, a);
    quantize_moe_h(p, a.h, L.P, stream);
    launch(dev::moe_expert_kernel<F, 4, false>, down, dev::kMoeWarps * 32, 0, stream, a);
  }
}

}  // namespace tern::cuda
