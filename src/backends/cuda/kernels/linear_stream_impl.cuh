// The streaming linear kernel for FP8 / FP4 weights (stream_tile.cuh), instantiated per format in
// linear_stream_<fmt>.cu (nvcc only).
//
// Grid: x = 128-row tiles of W, y = K splits, z = token tiles of 8*NT tokens (one tile up to 64 tokens, so a
// decode step reads every weight byte once). Block: 128 / (16*MT) warps of MT m-tiles each. The K range
// is cut into groups of `chunks_per_group` chunks chosen from the weight's shape alone; each output is
// (((0 + g0) + g1) + ...) over the groups, whether a block walks them all (ksplit 1) or each group is a
// block whose partial sums the last-arriving block adds in split order. So a token's bits do not depend
// on T or on which tokens share its tile.
#pragma once

#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/linear.cuh"
#include "backends/cuda/kernels/stream_tile.cuh"

namespace tern::cuda {

struct StreamPlan {
  int mt = 2, nt = 1;
  int64_t bx = 0, bz = 0;
  int ksplit = 1;
  int64_t chunks_per_group = 0;
  int win_chunks = 0;  // x window, chunks
  int scale_words = 0; // fp8 scale multipliers staged per block
  size_t smem = 0;
};

// m-tiles a warp below 64 tokens for nt n-tiles and a weight of `weights` elements (linear.cu).
int stream_m_tiles(int nt, int64_t weights);
// n-tiles a token tile at most for a weight of `weights` elements (linear.cu: 4 up to 8M, else 8).
int stream_max_n_tiles(int64_t weights);
StreamPlan plan_linear_stream(const LinearParams& p);

namespace dev {

constexpr int kStreamRows = 128;                 // weight rows per block
constexpr int kStreamMaxSmem = 200 * 1024;       // dynamic shared memory any plan may ask for
// Bytes of x window per block for NT n-tiles: small ones leave room for 2-3 blocks per multiprocessor;
// NT = 8 runs one block per multiprocessor (registers), so its window covers 1024 columns of 64 tokens.
__host__ __device__ constexpr int stream_x_budget(int nt) { return nt == 8 ? 136 * 1024 : nt == 4 ? 48 * 1024 : 24 * 1024; }

__host__ __device__ constexpr int stream_warps(int mt) { return kStreamRows / (16 * mt); }

struct StreamArgs {
  MatRef mat;
  int64_t out, row_bytes, rows_per_group, x_stride, T, nchunks, chunks_per_group;
  int win_chunks, scale_words;
  const float* x;
  const uint8_t* xw;     // x's windows made once for the product (linear_x_window_kernel), or nullptr: staged here
  int64_t xw_row_bytes;  // bytes between xw's token rows
  float* y;
  float* partial;
  int* counters;
};

template <WeightFormat F, int MT, int NT>
__global__ void __launch_bounds__(stream_warps(MT) * 32) linear_stream_kernel(StreamArgs a) {
  constexpr int kWarps = stream_warps(MT), kChunk = Fmt<F>::kChunk;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  uint8_t* ring = smem + warp * ring_bytes<F, MT>();
  uint8_t* win = smem + kWarps * ring_bytes<F, MT>();
  const int wstride = XWindow<F>::stride(a.win_chunks * kChunk);
  uint32_t* fp8_tab = reinterpret_cast<uint32_t*>(win + XWindow<F>::bytes(8 * NT, a.win_chunks * kChunk));

  const int64_t tile_row0 = static_cast<int64_t>(blockIdx.x) * kStreamRows;
  const int64_t row0 = tile_row0 + warp * 16 * MT;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.z) * NT * 8;
  const int ksplit = gridDim.y;
  const int64_t c_begin = ksplit > 1 ? blockIdx.y * a.chunks_per_group : 0;
  const int64_t c_end = ksplit > 1 ? min(a.nchunks, c_begin + a.chunks_per_group) : a.nchunks;
  const int n = static_cast<int>(c_end - c_begin);
  const int64_t live_toks = min(a.T - tok0, static_cast<int64_t>(NT * 8));
  const int n_live = static_cast<int>((live_toks + 7) / 8);

  LaneSrc<F, MT> src;
#pragma unroll
  for (int r = 0; r < 2 * MT; ++r) {
    const int64_t row = row0 + 16 * (r / 2) + 8 * (r % 2) + g;
    src.w_ok[r] = row < a.out;
    src.w[r] = a.mat.w + (src.w_ok[r] ? row * a.row_bytes : 0);
  }
  if constexpr (is_fp4<F>()) {
    const int64_t row = row0 + 16 * (t / 2) + 8 * (t % 2) + g;
    src.s_ok = t < 2 * MT && row < a.out;
    src.s = a.mat.s + (src.s_ok ? row * a.mat.s_cols : 0);
  }

  // Before the wait (PDL, launch.cuh): only the weights, which no kernel writes. The first kStages - 1 chunks
  // of this lane's rows (and fp4 scale words) go out and the FP8 scale table is staged while the previous
  // kernel finishes; x, y, the partials and the counters are touched only after grid_dependency_wait().
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n) issue_chunk<F, MT>(ring, i, src, c_begin + i, lane);
    cp_async_commit();
  }
  const int64_t sb0 = c_begin * kChunk / 128;  // first fp8 scale block of the range
  if constexpr (F == WeightFormat::fp8_block) stage_fp8_scales(a.mat, tile_row0, sb0, a.scale_words, fp8_tab);
  grid_dependency_wait();

  const int64_t xcol0 = (tile_row0 / a.rows_per_group) * a.mat.in;

  float acc[MT][NT][4], part[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][j][i] = part[m][j][i] = 0.0f;

  // The loop's bookkeeping by counters, not run-time divisions (a 64-bit modulo is a subroutine call): wi is
  // i % win_chunks, gleft the chunks left in the current K group (the group ends where (c_begin + i + 1) is a
  // multiple of chunks_per_group), slot i % kStages; the same chunks, windows, groups and sums.
  const int cpg = static_cast<int>(a.chunks_per_group);
  int wi = 0, slot = 0, gleft = cpg - static_cast<int>(c_begin % cpg);
  [[maybe_unused]] const int sodd = static_cast<int>(c_begin & 1);  // fp8: scale block of chunk i is (i + sodd) / 2 from sb0
  for (int i = 0; i < n; ++i) {
    if (wi == 0) {
      __syncthreads();  // every warp is done with the previous window
      const int cols = min(a.win_chunks, n - i) * kChunk;
      fill_x_window<F>(win, n_live * 8, wstride, a.x, a.x_stride, a.T, tok0, xcol0, a.xw, a.xw_row_bytes,
                       (c_begin + i) * kChunk, cols);
      __syncthreads();
    }
    cp_async_wait<kStages - 2>();
    __syncwarp();
    uint32_t fm[MT];
    if constexpr (F == WeightFormat::fp8_block) {
      static_assert(kChunk == 64, "two FP8 chunks a 128-column scale block");
      const uint32_t v = fp8_tab[(i + sodd) >> 1];
#pragma unroll
      for (int m = 0; m < MT; ++m) fm[m] = v;
    } else {
#pragma unroll
      for (int m = 0; m < MT; ++m) fm[m] = 0;
    }
    if (NT > 1 && n_live == NT) consume_chunk<F, MT, NT, true>(ring, slot, win, wstride, wi, n_live, fm, part);
    else consume_chunk<F, MT, NT>(ring, slot, win, wstride, wi, n_live, fm, part);
    if (--gleft == 0 || i == n - 1) {
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            acc[m][j][e] += part[m][j][e];
            part[m][j][e] = 0.0f;
          }
    }
    // The chunk kStages - 1 ahead goes into the slot just consumed's predecessor, i.e. (i + kStages - 1) % kStages.
    const int ahead = slot == 0 ? kStages - 1 : slot - 1;
    if (i + kStages - 1 < n) issue_chunk<F, MT>(ring, ahead, src, c_begin + i + kStages - 1, lane);
    cp_async_commit();
    if (gleft == 0) gleft = cpg;
    if (++wi == a.win_chunks) wi = 0;
    if (++slot == kStages) slot = 0;
  }
  cp_async_wait<0>();
  grid_dependents_launch();  // every weight byte is in: the next kernel may be scheduled (docs: "PDL")

  float* dst = ksplit > 1 ? a.partial + static_cast<int64_t>(blockIdx.y) * a.T * a.out : a.y;
  const float mult = ksplit > 1 ? 1.0f : a.mat.out_mult;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = row0 + 16 * m + g + 8 * (e >> 1);
        const int64_t tok = tok0 + 8 * j + 2 * t + (e & 1);
        if (row < a.out && tok < a.T) dst[tok * a.out + row] = acc[m][j][e] * mult;
      }
  if (ksplit == 1) return;

  finish_split_k(a.partial, a.y, a.counters, blockIdx.x + static_cast<int64_t>(gridDim.x) * blockIdx.z, ksplit,
                 tile_row0, kStreamRows, a.out, a.T, tok0, tok0 + live_toks, a.mat.out_mult);
}

template <WeightFormat F, int MT, int NT>
void launch_stream_variant(const StreamArgs& a, const StreamPlan& plan, cudaStream_t stream) {
  static const bool attr = [] {
    cudaFuncSetAttribute(linear_stream_kernel<F, MT, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         kStreamMaxSmem);
    return true;
  }();
  (void)attr;
  const dim3 grid(static_cast<unsigned>(plan.bx), static_cast<unsigned>(plan.ksplit), static_cast<unsigned>(plan.bz));
  launch(linear_stream_kernel<F, MT, NT>, grid, stream_warps(MT) * 32, plan.smem, stream, a);
}

}  // namespace dev

template <WeightFormat F>
void launch_linear_stream(const LinearParams& p, const StreamPlan& plan, const uint8_t* xw, cudaStream_t stream) {
  dev::StreamArgs a{};
  a.mat.w = static_cast<const uint8_t*>(p.w.w);
  a.mat.s = static_cast<const uint8_t*>(p.w.s);
  a.mat.in = p.w.in;
  a.mat.s_cols = p.w.s_cols;
  a.mat.scale_f32 = p.w.scale_f32 ? 1 : 0;
  a.mat.out_mult = dev::kWeightShift * (F == WeightFormat::nvfp4 ? p.w.global_scale : 1.0f);
  a.out = p.w.out;
  a.row_bytes = F == WeightFormat::fp8_block ? p.w.in : p.w.in / 2;
  a.rows_per_group = p.rows_per_group;
  a.x_stride = p.x_stride;
  a.T = p.T;
  a.nchunks = p.w.in / dev::Fmt<F>::kChunk;
  a.chunks_per_group = plan.chunks_per_group;
  a.win_chunks = plan.win_chunks;
  a.scale_words = plan.scale_words;
  a.x = p.x;
  a.xw = xw;
  a.xw_row_bytes = 2 * linear_x_cols(p);
  a.y = p.y;
  a.partial = p.partial;
  a.counters = p.counters;
  switch (plan.nt * 10 + plan.mt) {
    case 12: dev::launch_stream_variant<F, 2, 1>(a, plan, stream); break;
    case 22: dev::launch_stream_variant<F, 2, 2>(a, plan, stream); break;
    case 42: dev::launch_stream_variant<F, 2, 4>(a, plan, stream); break;
    case 11: dev::launch_stream_variant<F, 1, 1>(a, plan, stream); break;
    case 21: dev::launch_stream_variant<F, 1, 2>(a, plan, stream); break;
    case 41: dev::launch_stream_variant<F, 1, 4>(a, plan, stream); break;
    default: dev::launch_stream_variant<F, 1, 8>(a, plan, stream); break;
  }
}

}  // namespace tern::cuda
