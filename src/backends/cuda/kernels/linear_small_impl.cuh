// The small-T linear kernel for FP8-block and bf16 weights (nvcc only; instantiated per format in
// linear_small_<fmt>.cu; plan in linear_small.cu). docs/cuda-backend.md, "Small-T dense products".
//
// Why: at 1-64 tokens a dense product is a read of its weights, and linear_stream / linear_bulk spend most of a
// small product in fixed latency (ncu, 1024x4096 FP8 at T = 1: 9.6 us for 4 MB, 128 blocks of one 32 KB K slice,
// 0.15 eligible warps): a split-K round trip through global memory at the end of every product, x staged per
// block between two barriers before the first MMA, and too few bytes in flight for the 32 MB ones.
//
// Work: a block is a row panel of `mw` m-tiles (RM = 8 or 16 rows each) times a K segment of `ks` whole K groups;
// inside it `kw` warps share each m-tile, warp (mi, kwi) taking `ks / kw` consecutive groups. Every warp streams
// its own rows through its own ring of stages (bulk_pipe.cuh's WarpRing, filled by one cp.async.bulk per row, row
// runs of `sc` chunks, or by the lanes' 16-byte cp.async), all stages it can hold issued before the PDL wait, so a small product's weights are in
// flight (or in shared memory) before the previous kernel has finished. x comes straight from global memory (L1)
// at up to 16 tokens, or from a shared-memory window of the block's K segment filled once (no refills).
// RM = 8 (one token tile) halves the rows per m-tile (the mma's rows 8..15 are zeros, never stored) so that a
// 1024-row product still makes 128 panels that each hold a whole row: no split-K at all.
//
// Numerics: the K groups are linear_stream's (stream_chunks_per_group: the weight's shape or the tuner's count),
// each group summed with one accumulator in chunk and k-step order from the same A / B fragments (mma_tile.cuh,
// stream_tile.cuh's window byte order: x rounded to bf16 by the same pack), and a row's groups added as
// ((0 + g0) + g1) + ...: the warp that starts a row's sum folds its groups in registers; groups of the other
// warps of the first segment wait in shared memory and that warp adds them in order; later segments store their
// groups one by one, and the last block of the panel to arrive adds prefix + g_ks + g_ks+1 + ... in order (a sum
// that starts at +0 is never -0, so adding a raw group sum equals adding (0 + group)). So FP8 products give the
// bits of linear_stream and bf16 the bits of linear_bulk, for every plan: the plan only moves work between warps
// and blocks, and a token's result depends on neither T nor its neighbours (mma rows and columns are
// independent).
#pragma once

#include "backends/cuda/kernels/bulk_pipe.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/linear.cuh"

namespace tern::cuda {

// Host-side plan (linear_small.cu). Grid: x = row panels, y = K segments.
struct SmallLinearPlan {
  int nt = 1;              // n-tiles of 8 tokens (T <= 8 * nt, at most 64 tokens)
  int rm = 16;             // rows per m-tile: 16, or 8 (nt == 1 only)
  int mw = 1, kw = 1;      // m-tiles per block, warps per m-tile
  int ks = 1;              // K groups per segment (the last one may be short)
  bool window = false;     // x from a shared-memory window of the segment (else from global memory)
  bool lsu = false;        // stages copied by the lanes' 16-byte cp.async (else one cp.async.bulk per row)
  int sc = 1, stages = 1;  // chunks per ring stage, stages per warp ring
  int row_stride = 0;      // bytes between a stage's rows (bank-conflict padding)
  int64_t cpg = 0, ngroups = 0, panels = 0, segs = 0;
  int win_chunks = 0, scale_words = 0;
  int ring_bytes = 0, win_off = 0, tab_off = 0, fold_off = 0, bar_off = 0;  // shared-memory layout
  size_t smem = 0;
  double model_us = 0;  // the planner's estimate (benchmarks print it beside the measurement)
  int warps() const { return mw * kw; }
};

SmallLinearPlan plan_linear_small(const LinearParams& p);  // panels == 0: no plan fits
std::string small_plan_name(const SmallLinearPlan& plan);

namespace dev {

// Threads a block may have: 16 warps up to 32 tokens (<= 128 registers), 8 at 64 tokens (8 n-tiles' two
// accumulator sets take ~130 registers). At one n-tile the FP8 kernel fits 64 registers (ptxas, no spills), so
// two 16-warp blocks share a multiprocessor: the next product's blocks can be placed beside this one's (PDL) and
// fetch their weights while it finishes (bf16, with twice the weight registers, spilled at 64: not bounded).
__host__ __device__ constexpr int small_max_warps(int nt) { return nt >= 8 ? 8 : 16; }
__host__ __device__ constexpr int small_min_blocks(int nt, bool fp8) { return nt == 1 && fp8 ? 2 : 1; }
constexpr int kSmallMaxSmem = 225 * 1024;  // under sm_90's 227 KB opt-in: the kernel has a little static smem too

struct SmallLinArgs {
  MatRef mat;
  int64_t out, row_bytes, rows_per_group, x_stride, T, nchunks, cpg, ngroups;
  int mw, kw, ks, sc, stages, row_stride, win_chunks, scale_words, lsu;
  int ring_bytes, win_off, tab_off, fold_off, bar_off;
  const float* x;
  const uint8_t* xw;     // x's windows made once for the product (linear_x_window_kernel), or nullptr
  int64_t xw_row_bytes;  // bytes between xw's token rows
  float* y;
  float* partial;  // [group][T][out]: segment 0's prefix at group ks - 1, later segments' groups one by one
  int* counters;   // one per row panel, kept at zero
};

// When every earlier cp.async of this thread has completed, one arrival on `bar` (whose count includes it).
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// acc[n] += one chunk of the warp's rows (lane rows g and, for RM = 16, g + 8: the A fragments of
// stream_tile.cuh / linear_bulk) times x: from the window at `xb` (lane offset applied) or, in direct mode, from
// the lane's token rows xr[n] at column `lcol` (the same bf16 pack of the same columns the window holds).
// Per accumulator the k-steps run S = 0..3, as in consume_chunk, so the sums are the same.
template <WFmt F, int NT, int RM, bool kWindow>
__device__ __forceinline__ void small_chunk(uint32_t w, int row8, const float* const (&xr)[NT], int64_t lcol,
                                            uint32_t xb, int wstride, int nlive, uint32_t fmult,
                                            float (&acc)[NT][4]) {
  LaneRow<F> r0, r1;
#pragma unroll
  for (int i = 0; i < Fmt<F>::kLaneBytes / 16; ++i) {
    r0.v[i] = lds128_at(w + 16 * i);
    if constexpr (RM == 16) r1.v[i] = lds128_at(w + row8 + 16 * i);
  }
  const uint32_t m[2] = {fmult, fmult};
  auto apair = [&](auto sc, auto pc, const LaneRow<F>& r) {
    return a_pair<F, decltype(sc)::value, decltype(pc)::value>(r, m);
  };
  if constexpr (kWindow) {
    static_for<XWindow<F>::kPieces>([&](auto qc) {
      constexpr int Q = decltype(qc)::value;
      uint4 b[NT];
#pragma unroll
      for (int n = 0; n < NT; ++n)
        if (n < nlive) b[n] = lds128_at(xb + n * 8 * wstride + Q * 64);
      static_for<2>([&](auto hc) {
        constexpr int H = decltype(hc)::value, S = 2 * Q + H;
        using SC = std::integral_constant<int, S>;
        const uint32_t a0 = apair(SC{}, std::integral_constant<int, 0>{}, r0);
        const uint32_t a2 = apair(SC{}, std::integral_constant<int, 1>{}, r0);
        uint32_t a1 = 0, a3 = 0;
        if constexpr (RM == 16) {
          a1 = apair(SC{}, std::integral_constant<int, 0>{}, r1);
          a3 = apair(SC{}, std::integral_constant<int, 1>{}, r1);
        }
#pragma unroll
        for (int n = 0; n < NT; ++n)
          if (n < nlive) mma_bf16(acc[n], a0, a1, a2, a3, H == 0 ? b[n].x : b[n].z, H == 0 ? b[n].y : b[n].w);
      });
    });
  } else {
    // Every x load of the chunk first (L1 hits after the first warp of the block), then the weights' decode.
    float4 xv[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int s = 0; s < 4; ++s)
        xv[n][s] = n < nlive && xr[n] != nullptr ? __ldg(reinterpret_cast<const float4*>(xr[n] + lcol + 4 * s))
                                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    static_for<4>([&](auto sc) {
      constexpr int S = decltype(sc)::value;
      const uint32_t a0 = apair(sc, std::integral_constant<int, 0>{}, r0);
      const uint32_t a2 = apair(sc, std::integral_constant<int, 1>{}, r0);
      uint32_t a1 = 0, a3 = 0;
      if constexpr (RM == 16) {
        a1 = apair(sc, std::integral_constant<int, 0>{}, r1);
        a3 = apair(sc, std::integral_constant<int, 1>{}, r1);
      }
#pragma unroll
      for (int n = 0; n < NT; ++n)
        if (n < nlive)
          mma_bf16(acc[n], a0, a1, a2, a3, pack_bf16(xv[n][S].x, xv[n][S].y), pack_bf16(xv[n][S].z, xv[n][S].w));
    });
  }
}

// Stores one fragment set (rows row0 + g (+ 8 for RM = 16), tokens 8n + 2t (+1)) times `mult` at
// dst[tok * out + row], inside the matrix and T.
template <int NT, int RM>
__device__ __forceinline__ void small_store(float* dst, const float (&v)[NT][4], int64_t row0, int64_t out,
                                            int64_t T, float mult) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (RM == 8 && (e >> 1) != 0) continue;
      const int64_t row = row0 + g + 8 * (e >> 1), tok = 8 * n + 2 * t + (e & 1);
      if (row < out && tok < T) dst[tok * out + row] = v[n][e] * mult;
    }
}

template <WFmt F, int NT, int RM, bool kWindow>
__global__ void __launch_bounds__(small_max_warps(NT) * 32, small_min_blocks(NT, F == WFmt::fp8)) linear_small_kernel(SmallLinArgs a) {
  constexpr int kChunk = Fmt<F>::kChunk, kCB = Fmt<F>::kChunk * (F == WFmt::fp8 ? 1 : 2);  // bytes of a row's chunk
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int mi = warp / a.kw, kwi = warp % a.kw;
  const int64_t panel_row0 = static_cast<int64_t>(blockIdx.x) * RM * a.mw, row0 = panel_row0 + mi * RM;
  const int seg = static_cast<int>(blockIdx.y), nseg = static_cast<int>(gridDim.y);
  // Groups of the block's segment [g0s, g1s) and of this warp [ga, gb); chunks [c_begin, c_end).
  const int64_t g0s = static_cast<int64_t>(seg) * a.ks, g1s = min(a.ngroups, g0s + a.ks);
  const int gpw = a.ks / a.kw;
  const int64_t ga = min(g1s, g0s + static_cast<int64_t>(kwi) * gpw), gb = min(g1s, ga + gpw);
  const int64_t left = a.out - row0;
  const int valid_rows = left <= 0 ? 0 : left >= RM ? RM : static_cast<int>(left);
  const int64_t c_begin = ga * a.cpg, c_end = min(a.nchunks, gb * a.cpg);
  const int n = valid_rows > 0 ? static_cast<int>(c_end - c_begin) : 0;  // chunks this warp multiplies
  const int64_t seg_c0 = g0s * a.cpg;

  // The warp's full barriers: one arrival (lane 0's arrive.expect_tx, the bulk copies' bytes) or, with lane
  // copies, 32 (each lane's cp.async arrival once its copies have landed).
  const WarpRing ring{reinterpret_cast<uint64_t*>(smem + a.bar_off) + warp * a.stages, a.stages};
  if (lane == 0)
    for (int s = 0; s < a.stages; ++s) mbar_init(&ring.full[s], a.lsu ? 32u : 1u);
  mbar_init_fence();
  __syncthreads();

  const int SC = a.sc, nst = (n + SC - 1) / SC, stage_bytes = RM * a.row_stride;
  uint8_t* ring_base = smem + warp * a.ring_bytes;
  // Stage s: this warp's rows, chunks [c_begin + s*SC, + min(SC, n - s*SC)): one bulk copy per row, or the
  // rows' 16-byte pieces spread over the lanes (consecutive lanes, consecutive pieces of a row). Rows past the
  // matrix are not copied: they reach only output rows that are never stored.
  auto issue = [&](int s) {
    const uint32_t bytes = static_cast<uint32_t>(min(SC, n - s * SC) * kCB);
    uint8_t* dst = ring_base + ring.slot(s) * stage_bytes;
    const uint8_t* src = a.mat.w + row0 * a.row_bytes + (c_begin + static_cast<int64_t>(s) * SC) * kCB;
    if (a.lsu) {
      const int per_row = static_cast<int>(bytes / 16);
      for (int k = lane; k < valid_rows * per_row; k += 32) {
        const int r = k / per_row, q = k - r * per_row;
        cp_async16(dst + r * a.row_stride + q * 16, src + r * a.row_bytes + q * 16, true);
      }
      cp_async_arrive_noinc(ring.bar(s));
    } else {
      if (lane == 0) ring.arm(s, bytes * static_cast<uint32_t>(valid_rows));
      __syncwarp();
      if (lane < valid_rows) bulk_copy_g2s(dst + lane * a.row_stride, src + lane * a.row_bytes, bytes, ring.bar(s));
    }
  };
  // Before the wait (PDL, launch.cuh): only shared memory (the barriers) and the weights and their scales, which
  // no kernel writes. Every stage the ring holds goes out now (a small product's whole share), and the FP8
  // scale multipliers of the panel's segment are staged; x, y, the partials and the counters are touched only
  // after grid_dependency_wait().
  for (int s = 0; s < min(a.stages, nst); ++s) issue(s);
  const int64_t sb0 = seg_c0 * kChunk / 128;  // first fp8 scale block of the segment
  const uint32_t* tab = reinterpret_cast<const uint32_t*>(smem + a.tab_off);
  if constexpr (F == WFmt::fp8)
    stage_fp8_scales(a.mat, panel_row0, sb0, a.scale_words, reinterpret_cast<uint32_t*>(smem + a.tab_off));
  grid_dependency_wait();
  // Copies all issued: the next kernel may be placed beside this one and start its own (docs: "PDL").
  if (nst <= a.stages) grid_dependents_launch();

  const int nlive = static_cast<int>(min(static_cast<int64_t>(NT), (a.T + 7) / 8));
  const int64_t xcol0 = (panel_row0 / a.rows_per_group) * a.mat.in;  // the panel's row group's x columns
  const int wstride = XWindow<F>::stride(a.win_chunks * kChunk);
  if constexpr (kWindow) {
    const int cols = static_cast<int>(min(a.nchunks, g1s * a.cpg) - seg_c0) * kChunk;
    fill_x_window<F>(smem + a.win_off, nlive * 8, wstride, a.x, a.x_stride, a.T, 0, xcol0, a.xw, a.xw_row_bytes,
                     seg_c0 * kChunk, cols);
  }
  __syncthreads();  // the scale table and the window are in

  const float* xr[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int64_t tok = 8 * j + g;
    xr[j] = tok < a.T ? a.x + tok * a.x_stride + xcol0 : nullptr;
  }
  float acc[NT][4], part[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = part[j][e] = 0.0f;

  // The warp whose run starts at group 0 folds its groups in registers: acc = ((0 + g0) + g1) + ...
  const bool prefix = ga == 0;
  float* slots = reinterpret_cast<float*>(smem + a.fold_off);  // [mw][ks][32 lanes][NT][4]
  const uint32_t ring0 = smem_addr(ring_base);
  const uint32_t lane_w = static_cast<uint32_t>(g * a.row_stride + t * Fmt<F>::kLaneBytes);
  const uint32_t lane_x = smem_addr(smem + a.win_off) + static_cast<uint32_t>(g * wstride + t * 16);
  for (int i = 0; i < n; ++i) {
    const int s = i / SC, cc = i - s * SC;
    if (cc == 0) ring.wait_full(s);
    const int64_t c = c_begin + i;
    uint32_t fm = 0;
    if constexpr (F == WFmt::fp8) fm = tab[c * kChunk / 128 - sb0];
    small_chunk<F, NT, RM, kWindow>(ring0 + ring.slot(s) * stage_bytes + cc * kCB + lane_w, 8 * a.row_stride, xr,
                                    c * kChunk + t * Fmt<F>::kLaneCols,
                                    lane_x + static_cast<uint32_t>(c - seg_c0) * XWindow<F>::kChunkBytes, wstride,
                                    nlive, fm, part);
    if ((c + 1) % a.cpg == 0 || c + 1 == a.nchunks) {  // group c / cpg is complete
      const int64_t j = c / a.cpg;
      if (prefix) {
#pragma unroll
        for (int q = 0; q < NT; ++q)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[q][e] += part[q][e];
      } else if (seg == 0) {  // a later group of the first segment: to its slot, for the prefix warp to add
        float4* sl = reinterpret_cast<float4*>(slots + ((static_cast<int64_t>(mi) * a.ks + j) * 32 + lane) * NT * 4);
#pragma unroll
        for (int q = 0; q < NT; ++q) sl[q] = make_float4(part[q][0], part[q][1], part[q][2], part[q][3]);
      } else {  // a group of a later segment: on its own, for the last block of the panel
        small_store<NT, RM>(a.partial + j * a.T * a.out, part, row0, a.out, a.T, 1.0f);
      }
#pragma unroll
      for (int q = 0; q < NT; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[q][e] = 0.0f;
    }
    if (cc == SC - 1 || i == n - 1) {  // the stage is read: refill its slot with the stage S ahead
      ring.release();
      if (s + a.stages < nst) {
        issue(s + a.stages);
        if (s + a.stages == nst - 1) grid_dependents_launch();
      }
    }
  }

  const float mult = a.mat.out_mult;
  if (seg == 0) {
    // The first segment's other warps' groups, in group order, onto the prefix.
    if (a.kw > 1) {
      __syncthreads();
      if (kwi == 0 && valid_rows > 0) {
        constexpr int kU = NT <= 2 ? 2 : 1;  // slots loaded together, then added in order
        const float4* sl = reinterpret_cast<const float4*>(slots + (static_cast<int64_t>(mi) * a.ks * 32 + lane) * NT * 4);
        for (int64_t j0 = gpw; j0 < g1s; j0 += kU) {
          float4 v[kU][NT];
#pragma unroll
          for (int u = 0; u < kU; ++u)
#pragma unroll
            for (int q = 0; q < NT; ++q)
              if (j0 + u < g1s) v[u][q] = sl[(j0 + u) * 32 * NT + q];
#pragma unroll
          for (int u = 0; u < kU; ++u)
#pragma unroll
            for (int q = 0; q < NT; ++q)
              if (j0 + u < g1s) acc[q][0] += v[u][q].x, acc[q][1] += v[u][q].y, acc[q][2] += v[u][q].z, acc[q][3] += v[u][q].w;
        }
      }
    }
    if (kwi == 0 && valid_rows > 0) {
      if (nseg == 1) small_store<NT, RM>(a.y, acc, row0, a.out, a.T, mult);
      else small_store<NT, RM>(a.partial + (a.ks - 1) * a.T * a.out, acc, row0, a.out, a.T, 1.0f);
    }
  }
  if (nseg == 1) return;

  // Several segments: the last block of the panel to arrive adds prefix + the later groups in group order
  // (arrival counter back to zero, so graph replays equal eager runs).
  __shared__ int is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&a.counters[blockIdx.x], 1) == nseg - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  const int rows = RM * a.mw;
  const int64_t plane = a.T * a.out;
  for (int idx = threadIdx.x; idx < rows * a.T; idx += blockDim.x) {
    const int64_t row = panel_row0 + idx % rows, tok = idx / rows;
    if (row >= a.out) continue;
    const float* p = a.partial + tok * a.out + row;
    float sum = __ldcg(p + (a.ks - 1) * plane);
    for (int64_t j = a.ks; j < a.ngroups; j += 8) {
      float v[8];  // 8 loads in flight, then 8 adds in order
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = j + u < a.ngroups ? __ldcg(p + (j + u) * plane) : 0.0f;
#pragma unroll
      for (int u = 0; u < 8; ++u)
        if (j + u < a.ngroups) sum += v[u];
    }
    a.y[tok * a.out + row] = sum * mult;
  }
  if (threadIdx.x == 0) a.counters[blockIdx.x] = 0;
}

template <WFmt F, int NT, int RM, bool kWindow>
void launch_small_variant(const SmallLinArgs& a, const SmallLinearPlan& plan, cudaStream_t stream) {
  static const bool attr = [] {
    cudaFuncSetAttribute(linear_small_kernel<F, NT, RM, kWindow>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         kSmallMaxSmem);
    return true;
  }();
  (void)attr;
  const dim3 grid(static_cast<unsigned>(plan.panels), static_cast<unsigned>(plan.segs), 1);
  launch(linear_small_kernel<F, NT, RM, kWindow>, grid, plan.warps() * 32, plan.smem, stream, a);
}

}  // namespace dev

template <dev::WFmt F>
void launch_linear_small(const LinearParams& p, const SmallLinearPlan& plan, const uint8_t* xw, cudaStream_t stream) {
  dev::SmallLinArgs a{};
  a.mat.w = static_cast<const uint8_t*>(p.w.w);
  a.mat.s = static_cast<const uint8_t*>(p.w.s);
  a.mat.in = p.w.in;
  a.mat.s_cols = p.w.s_cols;
  a.mat.scale_f32 = p.w.scale_f32 ? 1 : 0;
  a.mat.out_mult = F == dev::WFmt::fp8 ? dev::kWeightShift : 1.0f;
  a.out = p.w.out;
  a.row_bytes = F == dev::WFmt::fp8 ? p.w.in : 2 * p.w.in;
  a.rows_per_group = p.rows_per_group;
  a.x_stride = p.x_stride;
  a.T = p.T;
  a.nchunks = p.w.in / dev::Fmt<F>::kChunk;
  a.cpg = plan.cpg;
  a.ngroups = plan.ngroups;
  a.mw = plan.mw, a.kw = plan.kw, a.ks = plan.ks, a.sc = plan.sc, a.stages = plan.stages;
  a.row_stride = plan.row_stride, a.win_chunks = plan.win_chunks, a.scale_words = plan.scale_words;
  a.lsu = plan.lsu ? 1 : 0;
  a.ring_bytes = plan.ring_bytes, a.win_off = plan.win_off, a.tab_off = plan.tab_off;
  a.fold_off = plan.fold_off, a.bar_off = plan.bar_off;
  a.x = p.x;
  a.xw = xw;
  a.xw_row_bytes = 2 * linear_x_cols(p);
  a.y = p.y;
  a.partial = p.partial;
  a.counters = p.counters;
  using dev::launch_small_variant;
  if (plan.nt == 1 && plan.rm == 8) return launch_small_variant<F, 1, 8, false>(a, plan, stream);
  if (plan.nt == 1) return launch_small_variant<F, 1, 16, false>(a, plan, stream);
  if (plan.nt == 2 && !plan.window) return launch_small_variant<F, 2, 16, false>(a, plan, stream);
  if (plan.nt == 2) return launch_small_variant<F, 2, 16, true>(a, plan, stream);
  if (plan.nt == 4) return launch_small_variant<F, 4, 16, true>(a, plan, stream);
  launch_small_variant<F, 8, 16, true>(a, plan, stream);
}

}  // namespace tern::cuda
