// The bulk-copy linear kernel for FP8-block and bf16 weights at decode sizes (nvcc only; instantiated per
// format in linear_bulk_<fmt>.cu). Same tiles, K groups, x window and fragments as linear_stream_kernel
// (linear_stream_impl.cuh), so FP8 results are the SAME BITS; what changes is how the weights arrive.
//
// Why: linear_stream_kernel's lanes each copy 16-byte runs with cp.async (4 warps x 8 KB in flight per block,
// ~12% occupancy): DRAM 37% busy and no eligible warp 63% of the cycles at T = 1. Here each warp owns a ring
// of S stages; a stage is its 16 rows x SC chunks, one cp.async.bulk per row (a contiguous run of SC * 64
// bytes of FP8, SC * 128 of bf16) completing on the slot's mbarrier (bulk_pipe.cuh's WarpRing). A warp keeps
// (S - 1) stages in flight without holding registers or issuing per-16-byte instructions, the block's 8 warps
// never wait on each other's copies (only at x window changes), and the plan sizes the rings so that two
// blocks (16 warps, 100+ KB of weights in flight) fit a multiprocessor.
//
// Grid: x = 128-row tiles (8 warps x one m-tile of 16 rows), y = K splits, z = token tiles of 8 * NT tokens.
// Each warp reuses every weight fragment over all NT n-tiles (T <= 64 is one pass over the weights).
// Numerics (mma_tile.cuh): weights exact in bf16 (FP8: e4m3 raw times the exact scale multiplier), x rounded
// to bf16 once in the window, f32 accumulation. K order: groups of `chunks_per_group` chunks from the weight's
// shape alone; a group is summed with one accumulator in chunk and k-step order, the groups are added as
// (((0 + g0) + g1) + ...) in this block or by the last-arriving block of a split. A token's bits depend on
// neither T nor its tile neighbours.
#pragma once

#include "backends/cuda/kernels/bulk_pipe.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/linear.cuh"

namespace tern::cuda {

// Host-side plan (linear.cu, plan_linear_bulk).
struct BulkLinearPlan {
  int nt = 1;
  int64_t bx = 0, bz = 0;
  int ksplit = 1;
  int64_t chunks_per_group = 0;
  int win_chunks = 0;   // x window, chunks
  int scale_words = 0;  // fp8 scale multipliers staged per block
  int stages = 0;       // ring stages per warp
  int stage_chunks = 0; // chunks per stage (SC)
  int row_stride = 0;   // bytes between a stage's rows (SC * chunk bytes, padded against bank conflicts)
  size_t smem = 0;
};

namespace dev {

constexpr int kBulkLinWarps = 8;              // one m-tile (16 rows) each: 128-row tiles as linear_stream
constexpr int kBulkLinRows = 16 * kBulkLinWarps;
constexpr int kBulkLinMaxSmem = 225 * 1024;   // under sm_90's 227 KB opt-in limit: the kernel has static shared memory too

// Bytes of one weight row per chunk (64 columns) in the bulk kernel's formats.
template <WeightFormat F>
constexpr int bulk_chunk_bytes() {
  return F == WeightFormat::fp8_block ? 64 : 128;
}

struct BulkLinArgs {
  MatRef mat;
  int64_t out, row_bytes, rows_per_group, x_stride, T, nchunks, chunks_per_group;
  int win_chunks, scale_words, stages, stage_chunks, row_stride;
  const float* x;
  const uint8_t* xw;     // x's windows made once for the product (linear_x_window_kernel), or nullptr: staged here
  int64_t xw_row_bytes;  // bytes between xw's token rows
  float* y;
  float* partial;
  int* counters;
};

// acc += one chunk: the lane's rows g and g+8 at `w` and `w + 8 * row_stride` of the stage (its 16 (FP8) or
// 32 (bf16) bytes of the chunk: the mma_tile.cuh lane-contiguous k permutation), x from the window chunk at
// `xb` (lane offset applied). Same instruction order per accumulator as stream_tile.cuh's consume_chunk.
template <WeightFormat F, int NT>
__device__ __forceinline__ void bulk_lin_chunk(uint32_t w, int row8, uint32_t xb, int wstride, int n_live,
                                               uint32_t fmult, float (&acc)[NT][4]) {
  LaneRow<F> r0, r1;
#pragma unroll
  for (int i = 0; i < Fmt<F>::kLaneBytes / 16; ++i) {
    r0.v[i] = lds128_at(w + 16 * i);
    r1.v[i] = lds128_at(w + row8 + 16 * i);
  }
  const uint32_t m[2] = {fmult, fmult};
  static_for<XWindow<F>::kPieces>([&](auto qc) {
    constexpr int Q = decltype(qc)::value;
    uint4 b[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n)
      if (n < n_live) b[n] = lds128_at(xb + n * 8 * wstride + Q * 64);
    static_for<2>([&](auto hc) {
      constexpr int H = decltype(hc)::value, S = 2 * Q + H;
      const uint32_t a0 = a_pair<F, S, 0>(r0, m), a1 = a_pair<F, S, 0>(r1, m);
      const uint32_t a2 = a_pair<F, S, 1>(r0, m), a3 = a_pair<F, S, 1>(r1, m);
#pragma unroll
      for (int n = 0; n < NT; ++n)
        if (n < n_live) mma_bf16(acc[n], a0, a1, a2, a3, H == 0 ? b[n].x : b[n].z, H == 0 ? b[n].y : b[n].w);
    });
  });
}

template <WeightFormat F, int NT>
__global__ void __launch_bounds__(kBulkLinWarps * 32) linear_bulk_kernel(BulkLinArgs a) {
  constexpr int kChunk = Fmt<F>::kChunk, kCB = bulk_chunk_bytes<F>();
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // Layout: [8 warp rings][x window][fp8 scale table][barriers 8 x stages].
  const int stage_bytes = 16 * a.row_stride, ring_bytes = a.stages * stage_bytes;
  uint8_t* win = smem + kBulkLinWarps * ring_bytes;
  const int wstride = XWindow<F>::stride(a.win_chunks * kChunk);
  const int win_bytes = XWindow<F>::bytes(8 * NT, a.win_chunks * kChunk);
  uint32_t* fp8_tab = reinterpret_cast<uint32_t*>(win + win_bytes);
  uint64_t* bars = reinterpret_cast<uint64_t*>(win + win_bytes + ((a.scale_words * 4 + 15) / 16) * 16);
  const WarpRing ring{bars + warp * a.stages, a.stages};
  if (lane == 0) ring.init();
  mbar_init_fence();
  __syncthreads();

  const int64_t tile_row0 = static_cast<int64_t>(blockIdx.x) * kBulkLinRows;
  const int64_t row0 = tile_row0 + warp * 16;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.z) * NT * 8;
  const int ksplit = gridDim.y;
  const int64_t c_begin = ksplit > 1 ? blockIdx.y * a.chunks_per_group : 0;
  const int64_t c_end = ksplit > 1 ? min(a.nchunks, c_begin + a.chunks_per_group) : a.nchunks;
  const int n = static_cast<int>(c_end - c_begin);
  const int SC = a.stage_chunks, nstages = (n + SC - 1) / SC;
  const int64_t live_toks = min(a.T - tok0, static_cast<int64_t>(NT * 8));
  const int n_live = static_cast<int>((live_toks + 7) / 8);

  // Rows of this warp inside the matrix (a partial last tile copies only those; the others keep stale bytes
  // that reach only output rows that are never stored: mma rows are independent).
  const int64_t left = a.out - row0;
  const int valid_rows = left <= 0 ? 0 : left >= 16 ? 16 : static_cast<int>(left);
  const uint32_t ring0 = smem_addr(smem) + warp * ring_bytes;
  // Stage s of this warp: rows row0 .. row0 + 15, chunks [c_begin + s*SC, + min(SC, n - s*SC)).
  auto issue = [&](int s) {
    const int nch = min(SC, n - s * SC);
    const uint32_t bytes = static_cast<uint32_t>(nch * kCB);
    if (lane == 0) ring.arm(s, bytes * static_cast<uint32_t>(valid_rows));
    __syncwarp();
    if (lane < valid_rows) {
      const uint8_t* src = a.mat.w + (row0 + lane) * a.row_bytes + (c_begin + static_cast<int64_t>(s) * SC) * kCB;
      uint8_t* dst = smem + warp * ring_bytes + ring.slot(s) * stage_bytes + lane * a.row_stride;
      bulk_copy_g2s(dst, src, bytes, ring.bar(s));
    }
  };
  // Before the wait (PDL, launch.cuh): only shared memory (the barriers above) and the weights, which no
  // kernel writes. Every stage of the ring is filled and the FP8 scale table staged while the previous kernel
  // finishes; x, y, the partials and the counters are touched only after grid_dependency_wait().
  for (int s = 0; s < min(a.stages, nstages); ++s) issue(s);
  const int64_t sb0 = c_begin * kChunk / 128;  // first fp8 scale block of the range
  if constexpr (F == WeightFormat::fp8_block) stage_fp8_scales(a.mat, tile_row0, sb0, a.scale_words, fp8_tab);
  grid_dependency_wait();

  const int64_t xcol0 = (tile_row0 / a.rows_per_group) * a.mat.in;

  float acc[NT][4], part[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = part[j][i] = 0.0f;

  const uint32_t lane_w = static_cast<uint32_t>(g * a.row_stride + t * Fmt<F>::kLaneBytes);
  const uint32_t lane_x = smem_addr(win) + static_cast<uint32_t>(g * wstride + t * 16);
  const int row8 = 8 * a.row_stride;
  for (int i = 0; i < n; ++i) {
    const int wi = i % a.win_chunks;
    if (wi == 0) {
      __syncthreads();  // every warp is done with the previous window
      const int cols = min(a.win_chunks, n - i) * kChunk;
      fill_x_window<F>(win, n_live * 8, wstride, a.x, a.x_stride, a.T, tok0, xcol0, a.xw, a.xw_row_bytes,
                       (c_begin + i) * kChunk, cols);
      __syncthreads();
    }
    const int s = i / SC, cc = i - s * SC;
    if (cc == 0) ring.wait_full(s);
    uint32_t fm = 0;
    if constexpr (F == WeightFormat::fp8_block) fm = fp8_tab[(c_begin + i) * kChunk / 128 - sb0];
    const uint32_t w = ring0 + ring.slot(s) * stage_bytes + cc * kCB + lane_w;
    bulk_lin_chunk<F, NT>(w, row8, lane_x + wi * XWindow<F>::kChunkBytes, wstride, n_live, fm, part);
    if ((c_begin + i + 1) % a.chunks_per_group == 0 || i == n - 1) {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[j][e] += part[j][e];
          part[j][e] = 0.0f;
        }
    }
    if (cc == SC - 1 || i == n - 1) {  // the stage is read: refill its slot with the stage S ahead
      ring.release();
      if (s + a.stages < nstages) issue(s + a.stages);
    }
  }
  grid_dependents_launch();  // every weight byte is in: the next kernel may be scheduled (docs: "PDL")

  float* dst = ksplit > 1 ? a.partial + static_cast<int64_t>(blockIdx.y) * a.T * a.out : a.y;
  const float mult = ksplit > 1 ? 1.0f : a.mat.out_mult;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = row0 + g + 8 * (e >> 1);
      const int64_t tok = tok0 + 8 * j + 2 * t + (e & 1);
      if (row < a.out && tok < a.T) dst[tok * a.out + row] = acc[j][e] * mult;
    }
  if (ksplit == 1) return;

  finish_split_k(a.partial, a.y, a.counters, blockIdx.x + static_cast<int64_t>(gridDim.x) * blockIdx.z, ksplit,
                 tile_row0, kBulkLinRows, a.out, a.T, tok0, tok0 + live_toks, a.mat.out_mult);
}

template <WeightFormat F, int NT>
void launch_bulk_lin_variant(const BulkLinArgs& a, const BulkLinearPlan& plan, cudaStream_t stream) {
  static const bool attr = [] {
    cudaFuncSetAttribute(linear_bulk_kernel<F, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBulkLinMaxSmem);
    return true;
  }();
  (void)attr;
  const dim3 grid(static_cast<unsigned>(plan.bx), static_cast<unsigned>(plan.ksplit), static_cast<unsigned>(plan.bz));
  launch(linear_bulk_kernel<F, NT>, grid, kBulkLinWarps * 32, plan.smem, stream, a);
}

}  // namespace dev

template <WeightFormat F>
void launch_linear_bulk(const LinearParams& p, const BulkLinearPlan& plan, const uint8_t* xw, cudaStream_t stream) {
  dev::BulkLinArgs a{};
  a.mat.w = static_cast<const uint8_t*>(p.w.w);
  a.mat.s = static_cast<const uint8_t*>(p.w.s);
  a.mat.in = p.w.in;
  a.mat.s_cols = p.w.s_cols;
  a.mat.scale_f32 = p.w.scale_f32 ? 1 : 0;
  a.mat.out_mult = F == WeightFormat::fp8_block ? dev::kWeightShift : 1.0f;
  a.out = p.w.out;
  a.row_bytes = F == WeightFormat::fp8_block ? p.w.in : 2 * p.w.in;
  a.rows_per_group = p.rows_per_group;
  a.x_stride = p.x_stride;
  a.T = p.T;
  a.nchunks = p.w.in / dev::Fmt<F>::kChunk;
  a.chunks_per_group = plan.chunks_per_group;
  a.win_chunks = plan.win_chunks;
  a.scale_words = plan.scale_words;
  a.stages = plan.stages;
  a.stage_chunks = plan.stage_chunks;
  a.row_stride = plan.row_stride;
  a.x = p.x;
  a.xw = xw;
  a.xw_row_bytes = 2 * linear_x_cols(p);
  a.y = p.y;
  a.partial = p.partial;
  a.counters = p.counters;
  switch (plan.nt) {
    case 1: dev::launch_bulk_lin_variant<F, 1>(a, plan, stream); break;
    case 2: dev::launch_bulk_lin_variant<F, 2>(a, plan, stream); break;
    case 4: dev::launch_bulk_lin_variant<F, 4>(a, plan, stream); break;
    default: dev::launch_bulk_lin_variant<F, 8>(a, plan, stream); break;
  }
}

}  // namespace tern::cuda
