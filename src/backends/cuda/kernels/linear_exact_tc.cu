// The exact products (ops::Weight::exact: the router gates, the indexer's projections) on tensor cores
// (TERN_EXACT_PATH: auto for FP8 weights, tc for all), f32-accurate and batch invariant.
//
// Numerics. A bf16 weight is a bf16 number; an FP8 one is e4m3 times its power-of-two (e8m0) block scale, also a
// bf16 number exactly (4 significant bits). x (f32) is cut into three bf16 terms, x = hi + mid + lo exactly:
// hi = x truncated to bf16 (its top 16 bits), mid = (x - hi) truncated, lo = x - hi - mid. Each difference is
// exact in f32; hi holds x's leading 8 significant bits, mid the next 8 (or more where zeros follow), so lo has
// at most 8 and is exactly a bf16 number (for |x| >= 2^-110, checked over 5e7 random floats; below, lo is an f32
// subnormal and may lose bits under 2^-133). So
// W x = W lo + W mid + W hi, each product w * x_i exact inside the tensor core. A k-step (16 columns) is three
// mma.sync m16n8k16 chained from zero, smallest first (d = W lo; d += W mid; d += W hi: the tensor core adds the
// 16 exact products and d, truncating to f32), and the k-steps' d are added in f32 (round to nearest) in column
// order. Error bound against the exact W x, with S = sum_k |w_k x_k|: a k-step's d is off by at most ~16 * 2^-23
// of its largest product (each product aligned to the largest and truncated, the model measured for Ampere's
// tensor cores), <= 2^-19 S over all k-steps; the in/16 k-step terms and in/128 piece sums (below) add <= 2^-24
// of a partial sum each: |y - W x| <= (2^-19 + (in/16 + in/128) 2^-24) S, for 4 096 columns 1.9e-6 S + 1.7e-5 S
// worst case (the CUDA-core kernels' in/8 additions a lane: ~3e-5 S). Expected, the roundings being of random
// sign: ~1e-7 of ||y||, an f32 product's. Non-finite x: hi = x, mid = lo = 0 (inf * w as in f32).
//
// The order of every sum is fixed by the weight's shape, never by T or the other tokens: a warp owns 128 columns
// (a "piece", two 64-column chunks: 8 k-steps) of 32 rows; its sum over the piece is ((0 + d_0) + d_1) + ... +
// d_7; a row's result is ((0 + piece_0) + piece_1) + ... over its in / 128 pieces in column order. The mma k order
// inside a k-step is mma_tile.cuh's (each lane's own 16 contiguous columns of a chunk; x with the same
// permutation). A token only ever occupies an mma column, and columns never mix, so its bits do not depend on
// which tile it shares or with whom (the same for eager runs and CUDA graphs).
//
// Layout. Block: 4 warps = wm rows of warps x wk along K (wk from the row length: 1 up to 1 024 columns, 2 up to
// 2 048, 4 up to 4 096), so a block covers 32 wm rows x 128 wk columns; the K slices of one row tile (up to 8) are
// one thread-block cluster. Each warp loads its 32 x 128 weights into registers once (64 registers as bf16
// pairs), all loads in flight before the PDL wait; then per pass of up to `tch` tokens the block stages its
// tokens' x for its columns as the three bf16 planes in shared memory (converted once per block), each warp runs
// its piece's mma for every 8-token n-tile and stores its piece sums into the shared memory of the cluster block
// that owns those rows (distributed shared memory: the cluster's blocks share out the row tile's rows), and
// after a cluster barrier each block adds up its rows' pieces in order from its own shared memory: no
// workspace, no counters, no second kernel. Every weight byte is read once per launch whatever T (the weights
// stay in registers across passes).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>

#include "backends/cuda/kernels/bulk_pipe.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/linear.cuh"
#include "backends/cuda/kernels/mma_tile.cuh"
#include "core/env.h"
#include "core/error.h"

namespace tern::cuda {
namespace dev {
namespace {

namespace cg = cooperative_groups;

constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kTcRows = 32;           // weight rows a warp owns: two m-tiles of 16
constexpr int kTcPiece = 128;         // columns a warp owns: two 64-column chunks, 8 k-steps
constexpr int kTcMaxSlices = 8;       // K slices of a row tile = blocks of a cluster (the portable cluster size)
constexpr int kTcMaxTokens = 64;      // tokens a pass stages at most
constexpr int kTcXBudget = 100 * 1024;  // bytes of x planes a pass may stage (sets tch for long rows)

struct TcArgs {
  const uint8_t* w;  // [out, in] bf16 or e4m3, row-major
  const uint8_t* s;  // FP8: e8m0 scales [ceil(out / 128), s_cols]
  int64_t out, in, s_cols;
  const float* x;
  int64_t x_stride, rows_per_group, T;
  float* y;   // [T, out]
  int wk;     // warps along K in a block (1, 2 or 4); 4 / wk along rows
  int tch;    // tokens a pass stages (a multiple of 8)
};

// Shared memory: three x planes [tch][2 bk + 16 bytes] (the 16-byte pad puts a quarter-warp's rows g, g+1 on
// different banks), then the piece sums this block adds up: the rows [rank R, rank R + R) of the row tile
// (R = ceil(bm / slices)), every piece of the row, [slices * wk][tch][R], written by the cluster's blocks.
__host__ __device__ constexpr int tc_x_row_bytes(int bk) { return 2 * bk + 16; }
__host__ __device__ constexpr int tc_owned_rows(int bm, int slices) { return (bm + slices - 1) / slices; }
__host__ __device__ constexpr size_t tc_smem_bytes(int wk, int slices, int tch) {
  return static_cast<size_t>(3) * tch * tc_x_row_bytes(kTcPiece * wk) +
         static_cast<size_t>(4) * slices * wk * tch * tc_owned_rows(kTcRows * (kTcWarps / wk), slices);
}

__device__ __forceinline__ float bf16_trunc(float v) { return __uint_as_float(__float_as_uint(v) & 0xffff0000u); }

// The top halves of two floats as bf16x2 (a in the low half).
__device__ __forceinline__ uint32_t top_halves(float a, float b) {
  return prmt(__float_as_uint(a), __float_as_uint(b), 0x7632u);
}

// x = hi + mid + lo exactly, two values at a time (see the file comment).
__device__ __forceinline__ void split3(float a, float b, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
  const bool fa = fabsf(a) < INFINITY, fb = fabsf(b) < INFINITY;
  // A NaN whose payload sits in the low bits would truncate to inf: take the canonical NaN.
  const float ha = fa ? bf16_trunc(a) : (a != a ? nan_f32() : a);
  const float hb = fb ? bf16_trunc(b) : (b != b ? nan_f32() : b);
  const float ra = fa ? a - ha : 0.0f, rb = fb ? b - hb : 0.0f;
  const float ma = bf16_trunc(ra), mb = bf16_trunc(rb);
  hi = top_halves(ha, hb);
  mid = top_halves(ma, mb);
  lo = top_halves(ra - ma, rb - mb);
}

// Two e4m3 bytes (bits 0..15 of `two`, the first in the low half) times the block scale as bf16x2: the hardware
// e4m3 -> f16 conversion (exact, subnormals and NaN included), f32, times the power-of-two scale (exact), bf16
// (exact: 4 significant bits, unless the product leaves bf16's normal range, which no real scale reaches).
__device__ __forceinline__ uint32_t e4m3x2_scaled(uint32_t two, float scale) {
  uint32_t h2;
  asm("{\n .reg .b16 s;\n cvt.u16.u32 s, %1;\n cvt.rn.f16x2.e4m3x2 %0, s;\n}" : "=r"(h2) : "r"(two));
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
  return pack_bf16(f.x * scale, f.y * scale);
}

__device__ __forceinline__ uint4 lds128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }

// A store at a shared::cluster address (bulk_pipe.cuh's cluster_smem_addr).
__device__ __forceinline__ void st_cluster_f32(uint32_t addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}

// Three blocks a multiprocessor by registers (168 each, no spills; left free, ptxas took 254 for FP8): the small
// passes of few tokens are latency-bound and want the warps.
template <bool kFp8>
__global__ void __launch_bounds__(kTcThreads, 3) linear_exact_tc_kernel(TcArgs a) {
  extern __shared__ __align__(16) uint8_t tc_smem[];
  cg::cluster_group cluster = cg::this_cluster();
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t = lane & 3;
  const int wk = warp % a.wk, wm = warp / a.wk;
  const int bm = kTcRows * (kTcWarps / a.wk), bk = kTcPiece * a.wk;
  const int slices = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * bm, wrow0 = row0 + kTcRows * wm;
  const int64_t kb0 = static_cast<int64_t>(blockIdx.x) * bk, wk0 = kb0 + kTcPiece * wk;
  const bool rows_live = wrow0 < a.out;

  // Before the wait: only the weights (and their scales) are read, uploaded by copies (PDL RULE 2): the warp's
  // rows g and g + 8 of its two m-tiles, the lane's 16 columns of each 64-column chunk; every load in flight.
  constexpr int kPer = kFp8 ? 2 : 4;  // 16-byte loads per row: FP8 one a chunk, bf16 two a chunk
  uint4 raw[2][2][kPer];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = wrow0 + 16 * m + g + 8 * h;
      const uint8_t* p = a.w + (row * a.in + wk0 + 16 * t) * (kFp8 ? 1 : 2);
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        // FP8: chunk i at +64 bytes; bf16: chunk i / 2 at +128 bytes, its second 16 bytes at +16
        const int off = kFp8 ? 64 * i : 128 * (i / 2) + 16 * (i % 2);
        raw[m][h][i] = row < a.out ? ldg_stream(p + off) : make_uint4(0, 0, 0, 0);
      }
    }
  // FP8: one scale for the warp's 32 x 128 weights (32-row tiles and 128-column pieces sit inside one block).
  const float scale = kFp8 && rows_live ? e8m0_to_f32(a.s[(wrow0 >> 7) * a.s_cols + (wk0 >> 7)]) : 0.0f;
  grid_dependency_wait();

  const int xrow = tc_x_row_bytes(bk), plane = a.tch * xrow;
  const int R = tc_owned_rows(bm, slices), pieces = slices * a.wk, piece = rank * a.wk + wk;
  uint8_t* xs = tc_smem;
  float* sums = reinterpret_cast<float*>(tc_smem + 3 * plane);  // [pieces][tch][R]
  // Every row of the block is in the row group of row0 (a launch condition).
  const float* xg = a.x + (row0 / a.rows_per_group) * a.in + kb0;
  const int groups8 = bk / 8;  // 8-column groups of a staged token row
  // Stages the pass at tc0 (nt tokens, the last n-tile's padding rows as zeros) as three planes.
  const auto stage = [&](int64_t tc0, int nt, int ntiles) {
    for (int i = static_cast<int>(threadIdx.x); i < ntiles * 8 * groups8; i += kTcThreads) {
      const int n = i / groups8, c8 = i % groups8;
      float4 u0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), u1 = u0;
      if (n < nt) {
        const float4* src = reinterpret_cast<const float4*>(xg + (tc0 + n) * a.x_stride + 8 * c8);
        u0 = src[0];
        u1 = src[1];
      }
      uint4 hi, mid, lo;
      split3(u0.x, u0.y, hi.x, mid.x, lo.x);
      split3(u0.z, u0.w, hi.y, mid.y, lo.y);
      split3(u1.x, u1.y, hi.z, mid.z, lo.z);
      split3(u1.z, u1.w, hi.w, mid.w, lo.w);
      uint8_t* dst = xs + n * xrow + 16 * c8;
      *reinterpret_cast<uint4*>(dst) = hi;
      *reinterpret_cast<uint4*>(dst + plane) = mid;
      *reinterpret_cast<uint4*>(dst + 2 * plane) = lo;
    }
  };
  const auto pass_tokens = [&](int64_t tc0) { return static_cast<int>(min(static_cast<int64_t>(a.tch), a.T - tc0)); };
  // The first pass's x is staged while the weight loads fly; the fragments are built after it.
  stage(0, pass_tokens(0), (pass_tokens(0) + 7) >> 3);

  // A fragments [m-tile][chunk][k-step][a0..a3]: a0 / a2 row g, k slots 2t..2t+1 / 2t+8..2t+9; a1 / a3 row g + 8.
  // Lane word i of a chunk holds its columns 2i, 2i+1: k-step S takes words 2S (slots 2t..) and 2S + 1 (2t+8..).
  uint32_t A[2][2][4][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int S = 0; S < 4; ++S)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if constexpr (kFp8) {
            const uint32_t w4 = word_of(raw[m][h][c], S);  // the lane's columns 4S .. 4S + 3 of chunk c
            A[m][c][S][h] = e4m3x2_scaled(w4 & 0xffffu, scale);
            A[m][c][S][2 + h] = e4m3x2_scaled(w4 >> 16, scale);
          } else {
            A[m][c][S][h] = word_of(raw[m][h][2 * c + S / 2], (2 * S) % 4);
            A[m][c][S][2 + h] = word_of(raw[m][h][2 * c + S / 2], (2 * S) % 4 + 1);
          }
        }
  // Converted once, here: keeps the compiler from redoing the FP8 conversion inside the token loop.
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int S = 0; S < 4; ++S)
#pragma unroll
        for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(A[m][c][S][i]));

  for (int64_t tc0 = 0; tc0 < a.T; tc0 += a.tch) {
    const int nt = pass_tokens(tc0), ntiles = (nt + 7) >> 3;
    if (tc0 > 0) stage(tc0, nt, ntiles);
    __syncthreads();
    // The weights are in registers and x is staged: the next kernel may be scheduled (later calls do nothing).
    grid_dependents_launch();

    if (rows_live) {
      for (int j = 0; j < ntiles; ++j) {
        float acc[2][4] = {};
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            // B fragments of token 8j + g, k-steps 2 half and 2 half + 1 of chunk c: the lane's columns 8 half ..
            // 8 half + 7 of the chunk in each plane, one 16-byte load a plane (words as for A).
            const uint8_t* src = xs + (8 * j + g) * xrow + (kTcPiece * wk + 64 * c + 16 * t + 8 * half) * 2;
            uint32_t b[3][4];
#pragma unroll
            for (int p = 0; p < 3; ++p) {
              const uint4 v = lds128(src + p * plane);
              b[p][0] = v.x, b[p][1] = v.y, b[p][2] = v.z, b[p][3] = v.w;
            }
            // Four independent chains (2 k-steps x 2 m-tiles), each lo, then mid, then hi.
            float d[2][2][4] = {};
#pragma unroll
            for (int p = 2; p >= 0; --p)
#pragma unroll
              for (int s2 = 0; s2 < 2; ++s2)
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                  const uint32_t(&af)[4] = A[m][c][2 * half + s2];
                  mma_bf16(d[s2][m], af[0], af[1], af[2], af[3], b[p][2 * s2], b[p][2 * s2 + 1]);
                }
#pragma unroll
            for (int s2 = 0; s2 < 2; ++s2)
#pragma unroll
              for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[m][i] += d[s2][m][i];
          }
        // C fragment: acc[m][i] is row 16m + g + 8 (i / 2), token 8j + 2t + i % 2; each piece sum goes to the
        // shared memory of the block that adds up its row (a store into the cluster: nothing waits for it).
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int r = kTcRows * wm + 16 * m + g + 8 * (i >> 1), owner = r / R;
            const int at = (piece * a.tch + 8 * j + 2 * t + (i & 1)) * R + r - owner * R;
            st_cluster_f32(cluster_smem_addr(sums + at, static_cast<uint32_t>(owner)), acc[m][i]);
          }
      }
    }
    cluster.sync();  // every piece sum of the row tile is in the shared memory of the block that adds it up

    // This block's rows of the tile: each output's pieces added in column order (loaded 8 at a time first).
    for (int o = static_cast<int>(threadIdx.x); o < nt * R; o += kTcThreads) {
      const int n = o / R, rl = o % R;
      const int64_t row = row0 + rank * R + rl;
      if (rank * R + rl >= bm || row >= a.out) continue;
      float sum = 0.0f;
      for (int p0 = 0; p0 < pieces; p0 += 8) {
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = p0 + i < pieces ? sums[((p0 + i) * a.tch + n) * R + rl] : 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (p0 + i < pieces) sum += v[i];
      }
      a.y[(tc0 + n) * a.out + row] = sum;
    }
    // Before the next pass's stores into these sums (and its staging of x) every block must be done reading;
    // after the last pass nothing touches another block's shared memory any more.
    if (tc0 + a.tch < a.T) cluster.sync();
  }
}

struct TcPlan {
  int wk = 0, slices = 0, tch = 0;
  size_t smem = 0;
};

// The tiles from the weight's shape (wk, slices), and the tokens a pass stages (from T too: that changes how many
// tokens share a pass, never a sum). False, with the reason, when the kernel cannot take the product.
bool plan_exact_tc(const LinearParams& p, TcPlan& plan, std::string* why) {
  const auto no = [&](const char* reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  const auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (p.w.kind != WeightFormat::bf16 && p.w.kind != WeightFormat::fp8_block) return no("weights neither bf16 nor fp8 block");
  if (p.w.kind == WeightFormat::fp8_block && (p.w.scale_f32 || p.w.s == nullptr))
    return no("fp8 scales not e8m0 (an f32 scale need not be a power of two: not a bf16 number)");
  if (p.w.in % kTcPiece != 0) return no("row length not a multiple of 128");
  int wk = 0;
  for (int c : {1, 2, 4})
    if (p.w.in % (kTcPiece * c) == 0 && p.w.in / (kTcPiece * c) <= kTcMaxSlices) {
      wk = c;
      break;
    }
  if (wk == 0) return no("row too long (at most 4096 columns: 8 slices of 4 warps x 128)");
  const int bm = kTcRows * (kTcWarps / wk);
  if (p.rows_per_group != p.w.out && p.rows_per_group % bm != 0) return no("row groups not whole row tiles");
  if (!aligned16(p.w.w) || !aligned16(p.x) || p.x_stride % 4 != 0) return no("weights or x rows not 16-byte aligned");
  if ((p.w.out + bm - 1) / bm > 65535) return no("too many rows");
  plan.wk = wk;
  plan.slices = static_cast<int>(p.w.in / (kTcPiece * wk));
  const int most = std::min(kTcMaxTokens, kTcXBudget / (3 * tc_x_row_bytes(kTcPiece * wk)) / 8 * 8);
  plan.tch = static_cast<int>(std::min<int64_t>(most, (std::max<int64_t>(p.T, 1) + 7) / 8 * 8));
  plan.smem = tc_smem_bytes(wk, plan.slices, plan.tch);
  return true;
}

template <bool kFp8>
void launch_tc(const LinearParams& p, const TcPlan& plan, cudaStream_t stream) {
  static std::atomic<size_t> opted_in{0};  // the most shared memory asked for so far
  if (plan.smem > opted_in.load()) {
    // A failure shows as the launch's error.
    if (cudaFuncSetAttribute(linear_exact_tc_kernel<kFp8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(plan.smem)) == cudaSuccess)
      opted_in.store(plan.smem);
  }
  const int bm = kTcRows * (kTcWarps / plan.wk);
  TcArgs a{static_cast<const uint8_t*>(p.w.w), static_cast<const uint8_t*>(p.w.s), p.w.out, p.w.in, p.w.s_cols,
           p.x, p.x_stride, p.rows_per_group, p.T, p.y, plan.wk, plan.tch};
  LaunchShape s{dim3(static_cast<unsigned>(plan.slices), static_cast<unsigned>((p.w.out + bm - 1) / bm), 1),
                kTcThreads, plan.smem, stream};
  s.cluster_x = static_cast<unsigned>(plan.slices);
  launch(s, linear_exact_tc_kernel<kFp8>, a);  // check_launch (the caller) reports an error
}

}  // namespace
}  // namespace dev

namespace {
// -1: not read from the environment yet; else an ExactPath.
std::atomic<int> g_exact_path{-1};
}  // namespace

ExactPath exact_path() {
  int v = g_exact_path.load(std::memory_order_relaxed);
  if (v < 0) {
    // auto: FP8 exact products on tensor cores, bf16 ones on CUDA cores; tc: every exact product the
    // tensor-core kernel takes; cuda-cores: none.
    const std::string s = env_choice("TERN_EXACT_PATH", {"auto", "tc", "cuda-cores"}, "auto");
    v = static_cast<int>(s == "tc"           ? ExactPath::tensor_cores
                         : s == "cuda-cores" ? ExactPath::cuda_cores
                                             : ExactPath::fp8_on_tensor_cores);
    g_exact_path.store(v, std::memory_order_relaxed);
  }
  return static_cast<ExactPath>(v);
}

void set_exact_path(ExactPath path) { g_exact_path.store(static_cast<int>(path), std::memory_order_relaxed); }

bool exact_on_tensor_cores(WeightFormat kind) {
  const ExactPath p = exact_path();
  return p == ExactPath::tensor_cores || (p == ExactPath::fp8_on_tensor_cores && kind == WeightFormat::fp8_block);
}

bool linear_exact_tc_ok(const LinearParams& p, std::string* why) {
  dev::TcPlan plan;
  return dev::plan_exact_tc(p, plan, why);
}

void launch_linear_exact_tc(const LinearParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  dev::TcPlan plan;
  if (!dev::plan_exact_tc(p, plan, nullptr)) fail("launch_linear_exact_tc: a product the kernel cannot take");
  if (p.w.kind == WeightFormat::fp8_block) dev::launch_tc<true>(p, plan, stream);
  else dev::launch_tc<false>(p, plan, stream);
}

std::string linear_exact_tc_name(const LinearParams& p) {
  dev::TcPlan plan;
  if (!dev::plan_exact_tc(p, plan, nullptr)) return "";
  return cat("linear_exact_tc<", p.w.kind == WeightFormat::fp8_block ? "fp8 block" : "bf16",
             "> (tensor cores, x as three bf16 terms, f32 accumulate; ", plan.slices, " K slice",
             plan.slices > 1 ? "s" : "", " a cluster, ", plan.wk, " warp", plan.wk > 1 ? "s" : "",
             " along K a block)");
}

}  // namespace tern::cuda
