// The streaming expert kernels for FP4 experts (stream_tile.cuh), instantiated in moe_stream_fp4.cu (nvcc
// only). Same jobs, workspace and combine as moe_impl.cuh; what changes is how a block streams the weights.
//
// Block (4 warps) = one job x (UP: 16 rows of w1 and the same 16 of w3, SwiGLU fused; DOWN: 32 rows of w2).
// The warps split K by chunks, warp w taking chunks w, w+4, w+8, ...; each warp copies its rows' chunks into
// its own cp.async ring, and x (the job's token rows, or their h rows) is staged once per window as bf16 for
// the block. The four partial sums meet in shared memory and are added in warp order: the order of a pair's
// sum is fixed by the shapes (never by the job's token count), as in moe_impl.cuh.
#pragma once

#include "backends/cuda/kernels/moe_impl.cuh"
#include "backends/cuda/kernels/stream_tile.cuh"

namespace tern::cuda {

namespace dev {

constexpr int kMoeStreamWarps = 4;
constexpr int kMoeStreamXBudget = 68 * 1024;
constexpr int kMoeStreamMaxSmem = 200 * 1024;

// Chunks of x one window holds for `rows` token rows and K = `in` (a multiple of the warp count unless it
// is all of K).
template <WFmt F>
__host__ __device__ inline int moe_stream_window(int rows, int64_t in) {
  const int64_t nch = in / Fmt<F>::kChunk;
  const int64_t fit = ((kMoeStreamXBudget / rows - 64) / 2) / Fmt<F>::kChunk / kMoeStreamWarps * kMoeStreamWarps;
  return static_cast<int>(fit >= nch ? nch : (fit < kMoeStreamWarps ? kMoeStreamWarps : fit));
}

// The window is sized at run time from the job's live token rows (a job of 1..8 pairs stages all of K at
// once), inside a fixed budget.
template <WFmt F>
constexpr int moe_stream_smem() {
  return kMoeStreamWarps * ring_bytes<F, 2>() + kMoeStreamXBudget;
}

template <WFmt F, int NT, bool UP>
__global__ void __launch_bounds__(kMoeStreamWarps * 32) moe_stream_kernel(MoeArgs a) {
  constexpr int kChunk = Fmt<F>::kChunk;
  extern __shared__ __align__(16) uint8_t smem[];
  const int job = blockIdx.y;
  if (job >= *a.num_jobs) return;
  const int e = a.jobs[3 * job], first = a.jobs[3 * job + 1], count = a.jobs[3 * job + 2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const MoeParams& p = a.p;
  const int64_t in = UP ? p.D : p.inter, rows = UP ? p.inter : p.D;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * (UP ? 16 : 32);
  const ExpertDesc ed = p.experts[e];
  MatRef mat[2];
  if constexpr (UP) {
    mat[0] = expert_mat<F>(ed, 0, in, 0);
    mat[1] = expert_mat<F>(ed, 2, in, 0);
  } else {
    mat[0] = mat[1] = expert_mat<F>(ed, 1, in, 0);
  }
  // Row r of this lane: m-tile r/2, row g + 8*(r%2) of it (UP: both m-tiles the same rows of w1 / w3).
  auto tile_row = [&](int r) { return row0 + (UP ? 0 : 16 * (r / 2)) + 8 * (r % 2) + g; };
  LaneSrc<F, 2> src;
  const int64_t rb = row_bytes<F>(in);
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t row = tile_row(r);
    src.w_ok[r] = row < rows;
    src.w[r] = mat[r / 2].w + (src.w_ok[r] ? row * rb : 0);
  }
  {
    const int64_t row = tile_row(t);
    const uint8_t* s = t < 2 ? mat[0].s : mat[1].s;  // selected by value: an indexed MatRef would live in memory
    src.s_ok = row < rows;
    src.s = s + (src.s_ok ? row * mat[0].s_cols : 0);
  }
  uint8_t* ring = smem + warp * ring_bytes<F, 2>();
  uint8_t* win = smem + kMoeStreamWarps * ring_bytes<F, 2>();
  const int64_t nch = in / kChunk;
  const int n_live = (count + 7) / 8;
  const int win_chunks = moe_stream_window<F>(n_live * 8, in);
  const int wstride = XWindow<F>::stride(win_chunks * kChunk);
  const int n_iter = static_cast<int>((nch + kMoeStreamWarps - 1) / kMoeStreamWarps);
  const int iters_per_window = win_chunks / kMoeStreamWarps > 0 ? win_chunks / kMoeStreamWarps : 1;

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    const int64_t c = warp + static_cast<int64_t>(kMoeStreamWarps) * i;
    if (c < nch) issue_chunk<F, 2>(ring, i, src, c, lane);
    cp_async_commit();
  }
  auto xrow = [&](int i) -> const float* {
    if (i >= count) return nullptr;
    return UP ? p.x + static_cast<int64_t>(a.sorted[first + i] / p.k) * p.D
              : a.h + static_cast<int64_t>(first + i) * p.inter;
  };

  float acc[2][NT][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.0f;
  const uint32_t no_fp8[2] = {0, 0};
  for (int i = 0; i < n_iter; ++i) {
    if (i % iters_per_window == 0) {
      __syncthreads();
      const int64_t wc0 = static_cast<int64_t>(i) * kMoeStreamWarps;  // first chunk of the window
      const int cols = static_cast<int>(min(static_cast<int64_t>(win_chunks), nch - wc0)) * kChunk;
      stage_x<F>(win, n_live * 8, wc0 * kChunk, cols, wstride, xrow, threadIdx.x, blockDim.x);
      __syncthreads();
    }
    const int64_t c = warp + static_cast<int64_t>(kMoeStreamWarps) * i;
    if (c < nch) {
      cp_async_wait<kStages - 2>();
      __syncwarp();
      const int wchunk = static_cast<int>(c - static_cast<int64_t>(i / iters_per_window) * iters_per_window *
                                                 kMoeStreamWarps);
      consume_chunk<F, 2, NT>(ring, i % kStages, win, wstride, wchunk, n_live, no_fp8, acc);
    }
    const int64_t cn = warp + static_cast<int64_t>(kMoeStreamWarps) * (i + kStages - 1);
    if (cn < nch) issue_chunk<F, 2>(ring, (i + kStages - 1) % kStages, src, cn, lane);
    cp_async_commit();
  }
  cp_async_wait<0>();

  // The warps' partial sums, added in warp order (the rings are free now: 4 KB * NT of their 45 KB).
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);  // [warp][m][n][i][32]
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[(((warp * 2 + m) * NT + n) * 4 + i) * 32 + lane] = acc[m][n][i];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int slot = 8 * n + 2 * t + (i & 1);
      if (slot >= count) continue;
      float v[2];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        float s = 0.0f;
        for (int w = 0; w < kMoeStreamWarps; ++w) s += red[(((w * 2 + m) * NT + n) * 4 + i) * 32 + lane];
        v[m] = s * mat[m].out_mult;
      }
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

template <WFmt F, int NT, bool UP>
void launch_moe_stream_kernel(const MoeArgs& a, dim3 grid, cudaStream_t stream) {
  static const bool attr = [] {
    cudaFuncSetAttribute(moe_stream_kernel<F, NT, UP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         kMoeStreamMaxSmem);
    return true;
  }();
  (void)attr;
  moe_stream_kernel<F, NT, UP><<<grid, kMoeStreamWarps * 32, moe_stream_smem<F>(), stream>>>(a);
}

}  // namespace dev

template <dev::WFmt F>
void launch_moe_stream(const MoeParams& p, const MoeLayout& L, char* ws, cudaStream_t stream) {
  dev::MoeArgs a;
  a.p = p;
  a.sorted = reinterpret_cast<const int*>(ws + L.sorted);
  a.jobs = reinterpret_cast<const int*>(ws + L.jobs);
  a.num_jobs = reinterpret_cast<const int*>(ws + L.num_jobs);
  a.h = reinterpret_cast<float*>(ws + L.h);
  a.y = reinterpret_cast<float*>(ws + L.y);
  const dim3 up(static_cast<unsigned>((p.inter + 15) / 16), static_cast<unsigned>(L.max_jobs));
  const dim3 down(static_cast<unsigned>((p.D + 31) / 32), static_cast<unsigned>(L.max_jobs));
  switch (L.tile) {
    case 8:
      dev::launch_moe_stream_kernel<F, 1, true>(a, up, stream);
      dev::launch_moe_stream_kernel<F, 1, false>(a, down, stream);
      break;
    case 16:
      dev::launch_moe_stream_kernel<F, 2, true>(a, up, stream);
      dev::launch_moe_stream_kernel<F, 2, false>(a, down, stream);
      break;
    default:
      dev::launch_moe_stream_kernel<F, 4, true>(a, up, stream);
      dev::launch_moe_stream_kernel<F, 4, false>(a, down, stream);
      break;
  }
}

}  // namespace tern::cuda
