// linear_x8.cuh's kernel (nvcc only). FP8 at the tensor cores' own rate is wgmma's alone on Hopper: mma.sync's
// m16n8k32.e4m3 compiles to e4m3 -> f16 conversions and f16 MMAs (session 13's first form, which converted the
// weights itself and took x as f16: 20-60% slower than this one at every size, results.md).
//
#include "backends/cuda/kernels/linear_x8.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <type_traits>

#include "backends/cuda/kernels/act_quant_dev.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/stream_tile.cuh"
#include "backends/cuda/kernels/wgmma.cuh"
#include "core/env.h"
#include "core/error.h"

namespace tern::cuda {

namespace dev {

constexpr int kX8Rows = 128;  // weight rows a block: two warpgroups of 64
constexpr int kX8MaxSmem = 200 * 1024;
constexpr int kX8FusedBytes = 64 * 1024;  // the most shared memory the in-kernel quantised x may take

struct X8Args {
  const uint8_t* w;
  const uint8_t* s;
  int scale_f32;
  int64_t s_cols, out, in, rows_per_group;
  const uint8_t* xq;  // e4m3 [T, xcols]
  const float* sx;    // [T, xcols / 128]
  const float* xf;    // f32 [T, xcols]: when set, the kernel quantises x itself (xq and sx are not read)
  int64_t xcols;
  int64_t T, nkb, kb_per_group;
  float* y;
  float* partial;
  int* counters;
  int cluster;  // the K splits are one cluster (grid y = ksplit <= kX8MaxCluster): sums through shared memory
};

constexpr int kX8MaxCluster = 8;  // the portable cluster size
constexpr int kX8PartStride = kX8Rows + 4;  // floats a token's row of a block's partial sums (4: no bank conflicts)

// Grid: x = 128-row tiles of W, y = K splits, z = token tiles of N tokens (N = 8, 16, 32 or 64: the wgmma's n).
// Block: two warpgroups, 128 weight rows (one scale row block). A ring of kXwStages stages, each a 128-column block
// of the 128 rows (16 KB) and of the N tokens' quantised x (N x 128 bytes), both in the 128-byte-swizzled K-major
// layout (wgmma.cuh: row r at r * 128, its 16-byte granule c at (c ^ (r % 8)) * 16), filled by every thread with
// cp.async (4 weight pieces and up to 2 x pieces a thread) and published by fence.proxy.async + a block barrier.
// Warpgroup w multiplies rows 64w .. 64w + 63 by the x tile: four m64nNk32 e4m3 MMAs (k 32 bytes apart in the
// atom row), the first not accumulating, give the 128-column block's sum alone, which goes into the group's sum
// times sw * sx (one weight scale for the block, one x scale per token) as DeepSeek's reference promotes every 128
// columns. Groups of kb_per_group blocks (from the weight's shape alone) are added in order, whether one block
// walks them or each is a block whose partials the last block adds (finish_split_k): a token's bits depend on
// neither T nor its neighbours. The tensor cores keep about 14 bits of each block's sum (2-4e-4 of a product's
// norm against the CPU's exact sums, as cuBLASLt's FP8 product).
// In-kernel quantisation (a.xf, FP8 weights, token tiles of 8): after the grid dependency wait every block
// quantises its own tokens' x over its K range (act_quant_lane, act_quant's bytes and scales) into a resident
// region of shared memory in the stages' x layout, while the first stages' weights are in flight; the stages then
// carry weights alone. One act_quant launch less per product (a decode step's launches cost ~3 us each at batch 1,
// results.md session 21), for the price of every row tile re-reading x from L2 and a prologue before the first MMA.
// Measured (H100, session 21): at one token 2-2.4 us faster a product (wq_a 5.4 against 7.8 us with act_quant), at 16
// tokens 3-5 us slower (wq_b 21.5 against 16.3: the prologue's L2 round trips outweigh the launch), so tiles of 8 only.
// bf16 weights (the compressors' wkv|wgate) take the same form with x rounded to bf16 in the prologue (round_bf16's
// rounding, so the same bits), one round_bf16 launch less per product.
constexpr int kXwStages = 4;
constexpr int kXwWBytes = kX8Rows * 128;  // a stage's weights: 128 rows x 128 bytes

// One 32-byte k step of a stage: m64nNk32 e4m3 (FP8 weights, OP "k32.f32.e4m3.e4m3", TAIL "") or m64nNk16 bf16
// (bf16 weights, OP "k16.f32.bf16.bf16", TAIL ", 0, 0": no transposes), d[64 x N] (+)= A[64 x k] B[k x N], both
// K-major in shared memory; scale_d 0: d = A B. One macro per N (the operand lists), the forms by OP and TAIL.
#define TERN_X8_HEAD "{\n.reg .pred p;\nsetp.ne.b32 p, %"
#define TERN_X8_MMA8(OP, TAIL)                                                                                  \
  asm volatile(TERN_X8_HEAD "6, 0;\nwgmma.mma_async.sync.aligned.m64n8" OP " {%0, %1, %2, %3}, %4, %5, p, 1, 1" \
               TAIL ";\n}\n"                                                                                    \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                 \
               : "l"(da), "l"(db), "r"(scale_d))
#define TERN_X8_MMA16(OP, TAIL)                                                                                 \
  asm volatile(TERN_X8_HEAD "10, 0;\nwgmma.mma_async.sync.aligned.m64n16" OP                                   \
               " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1" TAIL ";\n}\n"                               \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
               : "l"(da), "l"(db), "r"(scale_d))
#define TERN_X8_MMA32(OP, TAIL)                                                                                  \
  asm volatile(TERN_X8_HEAD "18, 0;\nwgmma.mma_async.sync.aligned.m64n32" OP                                    \
               " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1" TAIL \
               ";\n}\n"                                                                                          \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),         \
                 "+f"(d[15])                                                                                     \
               : "l"(da), "l"(db), "r"(scale_d))
#define TERN_X8_MMA64(OP, TAIL)                                                                                   \
  asm volatile(TERN_X8_HEAD "34, 0;\nwgmma.mma_async.sync.aligned.m64n64" OP                                     \
               " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
               "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1" TAIL ";\n}\n"          \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),   \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),          \
                 "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),        \
                 "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),        \
                 "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                                            \
               : "l"(da), "l"(db), "r"(scale_d))

template <int N, bool BF16>
__device__ __forceinline__ void wgmma_x8(float (&d)[N / 2], uint64_t da, uint64_t db, int scale_d) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64, "wgmma_x8: N is 8, 16, 32 or 64");
  if constexpr (N == 8) {
    if constexpr (BF16) TERN_X8_MMA8("k16.f32.bf16.bf16", ", 0, 0");
    else TERN_X8_MMA8("k32.f32.e4m3.e4m3", "");
  } else if constexpr (N == 16) {
    if constexpr (BF16) TERN_X8_MMA16("k16.f32.bf16.bf16", ", 0, 0");
    else TERN_X8_MMA16("k32.f32.e4m3.e4m3", "");
  } else if constexpr (N == 32) {
    if constexpr (BF16) TERN_X8_MMA32("k16.f32.bf16.bf16", ", 0, 0");
    else TERN_X8_MMA32("k32.f32.e4m3.e4m3", "");
  } else {
    if constexpr (BF16) TERN_X8_MMA64("k16.f32.bf16.bf16", ", 0, 0");
    else TERN_X8_MMA64("k32.f32.e4m3.e4m3", "");
  }
}
#undef TERN_X8_MMA8
#undef TERN_X8_MMA16
#undef TERN_X8_MMA32
#undef TERN_X8_MMA64
#undef TERN_X8_HEAD

// Split K inside one thread-block cluster (X8Args::cluster; the ksplit blocks of a row tile, cluster rank =
// split): each block has stored its sums in its own shared memory (`part`, [token][kX8PartStride]: the
// kernel's epilogue), a cluster barrier publishes them, and block `split` adds rows of the tile's (token,
// row) items split / ksplit .. (split + 1) / ksplit from every block's shared memory (all ksplit loads in
// flight, then added in split order from 0.0f: finish_split_k's order, so the same bits), then a second
// barrier keeps every block's shared memory until all have read it. Where finish_split_k stores the partials
// to L2, fences, counts arrivals with an atomic and has the last block read them back (each step a round trip
// on the critical path of every split product), this is two cluster barriers and reads of the neighbours'
// shared memory.
__device__ __forceinline__ void finish_split_cluster(const X8Args& a, const float* part, int64_t tile_row0,
                                                     int64_t tok0, int live, int ksplit) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int split = static_cast<int>(cluster.block_rank()), items = live * kX8Rows;
  const int lo = split * items / ksplit, hi = (split + 1) * items / ksplit;
  for (int it = lo + static_cast<int>(threadIdx.x); it < hi; it += blockDim.x) {
    const int tok = it / kX8Rows, r = it % kX8Rows;
    float v[kX8MaxCluster];
#pragma unroll
    for (int sp = 0; sp < kX8MaxCluster; ++sp)
      v[sp] = *cluster.map_shared_rank(part + tok * kX8PartStride + r, min(sp, ksplit - 1));  // (sp < ksplit added)
    float s = 0.0f;
#pragma unroll
    for (int sp = 0; sp < kX8MaxCluster; ++sp)
      if (sp < ksplit) s += v[sp];
    if (tile_row0 + r < a.out) a.y[(tok0 + tok) * a.out + tile_row0 + r] = s;
  }
  cluster.sync();
}

// FUSED: the block quantises (FP8) or rounds (bf16) x itself (a.xf; plan_x8 takes it for tiles of 8, or 16 with
// TERN_X8_QUANT_MAX_N):
// a template parameter so that the other forms keep their registers (the prologue's loads in flight took the
// 16-token form from 40 to 121 registers when it was a run-time choice).
template <int N, bool BF16, bool FUSED = false>
__global__ void __launch_bounds__(2 * 128) linear_x8_kernel(X8Args a) {
  constexpr int kE = BF16 ? 2 : 1;  // bytes an element
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // The swizzled tiles need 1024-byte alignment (wgmma.cuh); the launch asks for 1 KB more than the plan.
  const uint32_t raw = smem_addr(smem_raw);
  uint8_t* smem = smem_raw + ((1024 - (raw & 1023)) & 1023);
  constexpr int kStageBytes = kXwWBytes + N * 128;
  static_assert(!FUSED || N <= 16, "linear_x8_kernel: the quantising (rounding) form takes tiles of 8 or 16");
  uint8_t* xs = smem + kXwStages * kStageBytes;  // fused: [n][N x 128] the quantised x of the range (1 KB aligned)
  const int64_t range = gridDim.y > 1 ? a.kb_per_group : a.nkb;  // the most blocks n of K a block walks (plan_x8)
  const int64_t xs_blocks = FUSED ? range : 0;
  float* wtab = reinterpret_cast<float*>(xs + xs_blocks * N * 128);  // [n]
  float* sxs = wtab + range;                                                              // [N][n]: x scales

  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, wq = (tid >> 5) & 3;
  const int64_t tile_row0 = static_cast<int64_t>(blockIdx.x) * kX8Rows;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.z) * N;
  const int ksplit = gridDim.y;
  const int64_t kb_begin = ksplit > 1 ? blockIdx.y * a.kb_per_group : 0;
  const int64_t kb_end = ksplit > 1 ? min(a.nkb, kb_begin + a.kb_per_group) : a.nkb;
  const int n = static_cast<int>(kb_end - kb_begin);
  const int live = static_cast<int>(min(a.T - tok0, static_cast<int64_t>(N)));
  const int64_t xcol0 = (tile_row0 / a.rows_per_group) * a.in;  // x's first column for this row group
  const int64_t wrow = a.in * kE, xrow = a.xcols * kE;           // bytes a weight row, an x row

  // This thread's copies of a stage: weight pieces p = tid + 256 j (row p / 8, granule p % 8), x pieces likewise.
  auto issue_w = [&](int slot, int64_t kb) {
    uint8_t* st = smem + slot * kStageBytes;
#pragma unroll
    for (int j = 0; j < kXwWBytes / 16 / 256; ++j) {
      const int p = tid + 256 * j, r = p >> 3, c = p & 7;
      const int64_t row = tile_row0 + r;
      const bool ok = row < a.out;
      cp_async16(st + r * 128 + ((c ^ (r & 7)) << 4), a.w + (ok ? row * wrow + kb * 128 + c * 16 : 0), ok);
    }
  };
  auto issue_x = [&](int slot, int64_t kb) {
    uint8_t* st = smem + slot * kStageBytes + kXwWBytes;
    for (int p = tid; p < N * 8; p += 256) {
      const int r = p >> 3, c = p & 7;
      const bool ok = r < live;
      cp_async16(st + r * 128 + ((c ^ (r & 7)) << 4),
                 a.xq + (ok ? (tok0 + r) * xrow + xcol0 * kE + kb * 128 + c * 16 : 0), ok);
    }
  };
  // Before the wait (PDL, launch.cuh): only the weights and their scales, which no kernel writes.
#pragma unroll
  for (int i = 0; i < kXwStages - 1; ++i)
    if (i < n) issue_w(i, kb_begin + i);
  if constexpr (!BF16) {
    const int64_t srow = tile_row0 / 128;
    for (int j = tid; j < n; j += blockDim.x) {
      const int64_t idx = srow * a.s_cols + kb_begin + j;
      wtab[j] = a.scale_f32 ? reinterpret_cast<const float*>(a.s)[idx] : e8m0_to_f32(a.s[idx]);
    }
  }
  grid_dependency_wait();
  // x of the first stages (one commit group per stage: its weights above and its x here).
#pragma unroll
  for (int i = 0; i < kXwStages - 1; ++i) {
    if (i < n && !FUSED) issue_x(i, kb_begin + i);
    cp_async_commit();
  }
  if constexpr (FUSED) {
    // A warp a (token, block) item, kQ = N items' loads in flight before their conversions (a tile's N tokens x n
    // blocks are one or two rounds a warp at the decode products' K ranges: session 21's kQ = 4 took four rounds at
    // 16 tokens, each an L2 round trip before the first MMA); rows past the live tokens are zeros (their sums are
    // never stored). fence_proxy_async + the barrier at the loop's top publish it. FP8: a lane quantises 4 of the
    // block's 128 columns (act_quant_lane: act_quant's bytes and scale); bf16: a lane rounds 2 of its 64 columns
    // (round_bf16_kernel's rounding). Either way 4 bytes a lane, at the same place of the swizzled row.
    using V = std::conditional_t<BF16, float2, float4>;
    constexpr int kCols = BF16 ? 64 : 128, kQ = N;
    const int warp = tid >> 5, items = live * n;
    for (int base = warp; base < items; base += 8 * kQ) {
      V v[kQ];
#pragma unroll
      for (int j = 0; j < kQ; ++j) {
        const int it = base + 8 * j, r = it / n, c = it - r * n;
        if (it < items)
          v[j] = *reinterpret_cast<const V*>(a.xf + (tok0 + r) * a.xcols + xcol0 + (kb_begin + c) * kCols +
                                             (kCols / 32) * lane);
      }
#pragma unroll
      for (int j = 0; j < kQ; ++j) {
        const int it = base + 8 * j, r = it / n, c = it - r * n;
        if (it >= items) break;
        uint32_t q;
        if constexpr (BF16) {
          q = pack_bf16(v[j].x, v[j].y);
        } else {
          int k = 0;
          q = act_quant_lane(v[j], k);
          if (lane == 0) sxs[r * n + c] = ldexpf(1.0f, k);
        }
        *reinterpret_cast<uint32_t*>(xs + c * (N * 128) + r * 128 + (((lane >> 2) ^ (r & 7)) << 4) + (lane & 3) * 4) = q;
      }
    }
    for (int p = tid; p < (N - live) * n * 8; p += blockDim.x) {  // 16-byte pieces of the dead rows
      const int c = p / ((N - live) * 8), q = p - c * (N - live) * 8;
      *reinterpret_cast<uint4*>(xs + c * (N * 128) + (live + q / 8) * 128 + (q % 8) * 16) = make_uint4(0, 0, 0, 0);
    }
    if constexpr (!BF16)
      for (int p = tid; p < (N - live) * n; p += blockDim.x) sxs[live * n + p] = 0.0f;
  } else if constexpr (!BF16) {
    const int64_t sx_cols = a.xcols / 128;
    for (int p = tid; p < N * n; p += blockDim.x) {
      const int r = p / n, c = p - r * n;
      sxs[p] = r < live ? a.sx[(tok0 + r) * sx_cols + xcol0 / 128 + kb_begin + c] : 0.0f;
    }
  }

  float acc[N / 2], grp[N / 2], part[N / 2];
#pragma unroll
  for (int e = 0; e < N / 2; ++e) acc[e] = grp[e] = part[e] = 0.0f;
  const int t2 = 2 * (lane & 3);  // the first token column of this thread's fragment pairs
  int slot = 0, gleft = static_cast<int>(a.kb_per_group);
  for (int i = 0; i < n; ++i) {
    cp_async_wait<kXwStages - 2>();
    fence_proxy_async();
    __syncthreads();  // the stage is in for every thread's copies; the slot refilled below is read by nobody
    const uint32_t st = smem_addr(smem + slot * kStageBytes);
    const uint32_t wa = st + wg * 64 * 128, xa = FUSED ? smem_addr(xs + i * (N * 128)) : st + kXwWBytes;
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) wgmma_x8<N, BF16>(part, sw128_desc(wa + 32 * s), sw128_desc(xa + 32 * s), s > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(part);
    if constexpr (BF16) {  // no scales: the block's sum as it is
#pragma unroll
      for (int e = 0; e < N / 2; ++e) grp[e] += part[e];
    } else {
      const float sw = wtab[i];
#pragma unroll
      for (int j = 0; j < N / 8; ++j) {
        const float fa = sw * sxs[(8 * j + t2) * n + i], fb = sw * sxs[(8 * j + t2 + 1) * n + i];
        grp[4 * j + 0] = fmaf(part[4 * j + 0], fa, grp[4 * j + 0]);
        grp[4 * j + 1] = fmaf(part[4 * j + 1], fb, grp[4 * j + 1]);
        grp[4 * j + 2] = fmaf(part[4 * j + 2], fa, grp[4 * j + 2]);
        grp[4 * j + 3] = fmaf(part[4 * j + 3], fb, grp[4 * j + 3]);
      }
    }
    if (--gleft == 0 || i == n - 1) {
#pragma unroll
      for (int e = 0; e < N / 2; ++e) {
        acc[e] += grp[e];
        grp[e] = 0.0f;
      }
      gleft = static_cast<int>(a.kb_per_group);
    }
    const int ahead = slot == 0 ? kXwStages - 1 : slot - 1;  // the stage read in the previous iteration
    if (i + kXwStages - 1 < n) {
      issue_w(ahead, kb_begin + i + kXwStages - 1);
      if (!FUSED) issue_x(ahead, kb_begin + i + kXwStages - 1);
    }
    cp_async_commit();
    if (++slot == kXwStages) slot = 0;
  }
  cp_async_wait<0>();
  grid_dependents_launch();

  // The block's sums, token t's row r at dst[t * ld + r]: into its own shared memory when its split
  // adds in the cluster (the ring's, once both warpgroups' MMAs have read their last stage), else into its
  // split's workspace slice or, unsplit, into y.
  const bool in_cluster = ksplit > 1 && a.cluster;
  float* dst;
  int64_t ld, rows;
  if (in_cluster) {
    __syncthreads();
    dst = reinterpret_cast<float*>(smem);
    ld = kX8PartStride;
    rows = kX8Rows;
  } else {
    dst = (ksplit > 1 ? a.partial + static_cast<int64_t>(blockIdx.y) * a.T * a.out : a.y) + tok0 * a.out +
          tile_row0;
    ld = a.out;
    rows = a.out - tile_row0;
  }
  const int row_a = wg * 64 + wq * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = row_a + 8 * (e >> 1), tok = 8 * j + t2 + (e & 1);
      if (row < rows && tok < live) dst[tok * ld + row] = acc[4 * j + e];
    }
  if (ksplit == 1) return;
  if (in_cluster) {
    finish_split_cluster(a, reinterpret_cast<const float*>(smem), tile_row0, tok0, live, ksplit);
    return;
  }
  const int64_t counter = blockIdx.x + static_cast<int64_t>(gridDim.x) * blockIdx.z;
  if constexpr (N >= 16) {  // four rows a load where aligned (out is a multiple of 128)
    if (((reinterpret_cast<uintptr_t>(a.y) | reinterpret_cast<uintptr_t>(a.partial)) & 15) == 0) {
      finish_split_k<4>(a.partial, a.y, a.counters, counter, ksplit, tile_row0, kX8Rows, a.out, a.T, tok0, tok0 + live,
                        1.0f);
      return;
    }
  }
  finish_split_k(a.partial, a.y, a.counters, counter, ksplit, tile_row0, kX8Rows, a.out, a.T, tok0, tok0 + live, 1.0f);
}

template <int N, bool BF16, bool FUSED = false>
void launch_x8_variant(const X8Args& a, dim3 grid, size_t smem, cudaStream_t stream) {
  static const bool attr = [] {
    cudaFuncSetAttribute(linear_x8_kernel<N, BF16, FUSED>, cudaFuncAttributeMaxDynamicSharedMemorySize, kX8MaxSmem);
    return true;
  }();
  (void)attr;
  LaunchShape shape{grid, 2 * 128, smem, stream};
  if (a.cluster) shape.cluster_y = grid.y;  // a row tile's K splits
  launch(shape, linear_x8_kernel<N, BF16, FUSED>, a);
}

template <bool BF16>
void launch_x8_tokens(int nt, const X8Args& a, dim3 grid, size_t smem, cudaStream_t stream) {
  switch (nt) {
    case 1: return launch_x8_variant<8, BF16>(a, grid, smem, stream);
    case 2: return launch_x8_variant<16, BF16>(a, grid, smem, stream);
    case 4: return launch_x8_variant<32, BF16>(a, grid, smem, stream);
    default: return launch_x8_variant<64, BF16>(a, grid, smem, stream);
  }
}

}  // namespace dev

namespace {

struct X8Plan {
  int nt = 1, ksplit = 1;
  bool fused = false;    // the kernel quantises x itself
  bool cluster = false;  // the K splits add their sums as one cluster (X8Args::cluster), without the workspace
  int64_t bx = 0, bz = 0, nkb = 0, kb_per_group = 1;
  size_t smem = 0;
};

// The widest token tile linear_x8 quantises x in (TERN_X8_QUANT_MAX_N: 8, the default, or 16), for A/B: tiles of
// 16 measured slower with four rounds of loads a warp (session 21), not yet with kQ = N.
std::atomic<int>& x8_quant_max_n_setting() {
  static std::atomic<int> n{std::stoi(env_choice("TERN_X8_QUANT_MAX_N", {"8", "16"}, "8"))};
  return n;
}
int x8_quant_max_n() {
  return x8_quant_max_n_setting().load(std::memory_order_relaxed);
}

// The widest token tile (TERN_X8_MAX_N: 8, 16, 32 or 64, the default), for A/B: narrower tiles make more blocks
// (more of the card streaming) at the price of reading the weights once per tile; a token's bits do not depend on
// its tile's width (GpuActFp8Linear.BatchInvariant), so the choice is free.
int x8_max_tile_n8() {
  static const int n8 = std::stoi(env_choice("TERN_X8_MAX_N", {"8", "16", "32", "64"}, "64")) / 8;
  return n8;
}

// Groups of 128-column blocks from the weight's shape alone: as many as one token tile needs for two blocks a
// multiprocessor, each at least kXwStages - 1 blocks long (a full ring), at most 64. They run as separate
// blocks (split K) when that is cheaper by the rough model of linear_stream's (stream_ksplit): the blocks'
// share of the bandwidth grows with their number; a split writes and reads its partial sums (half price: L2).
// f32_x: whether the kernel may quantise x itself (then fused says whether it does: it also needs p.x 16-byte aligned).
X8Plan plan_x8(const LinearParams& p, bool f32_x) {
  X8Plan pl;
  pl.nt = std::min(p.T <= 8 ? 1 : p.T <= 16 ? 2 : p.T <= 32 ? 4 : 8, x8_max_tile_n8());
  pl.bx = p.w.out / dev::kX8Rows;
  pl.bz = (p.T + 8 * pl.nt - 1) / (8 * pl.nt);
  const bool bf16 = p.w.kind == WeightFormat::bf16;
  pl.nkb = p.w.in * (bf16 ? 2 : 1) / 128;  // 128-byte blocks of a row: 128 FP8 or 64 bf16 columns
  int64_t groups = std::max<int64_t>(1, 2LL * p.num_sms / pl.bx);
  // Where 8 groups a row tile fill 3/4 of the SMs or more at one block an SM, 8 (the portable cluster: the split adds
  // in shared memory, p.cluster_split) rather than 9-16 at two blocks an SM through the workspace: the compressors'
  // bf16 wkv|wgate of a CSA layer (2 048 rows, 16 row tiles) ran 16 splits at 11.4 / 15.3 / 26.8 us at 1 / 16 / 64
  // tokens for 16.8 MB, 49-21% of copy, 8.2 us at one token with the weights in L2 (H100, s24c2). From the shape
  // alone, so a token's bits still depend on nothing else.
  if (groups > dev::kX8MaxCluster && pl.bx * dev::kX8MaxCluster <= p.num_sms &&
      4 * pl.bx * dev::kX8MaxCluster >= 3LL * p.num_sms)
    groups = dev::kX8MaxCluster;
  groups = std::min<int64_t>({groups, std::max<int64_t>(1, pl.nkb / (dev::kXwStages - 1)), 64});
  pl.kb_per_group = (pl.nkb + groups - 1) / groups;
  const int64_t ngroups = (pl.nkb + pl.kb_per_group - 1) / pl.kb_per_group;
  // A split of at most kX8MaxCluster blocks adds its sums in a cluster (p.cluster_split), else through the workspace,
  // while the whole grid is one block an SM: measured on the H100 (session 25, results.md), clusters of 8 took wq_a
  // at 64 tokens from 17.8 to 10.2 us (64 blocks) but wo_b at one token from 14.9 to 18.5 (256 blocks, two an SM:
  // clusters of 8 must sit in one GPC, and the GPCs' uneven SM counts hold fewer than 32 of them at once).
  const bool cluster = p.cluster_split && ngroups <= dev::kX8MaxCluster && pl.bx * pl.bz * ngroups <= p.num_sms;
  const bool fits = cluster || (pl.bx * pl.bz <= p.num_counters && ngroups * p.T * p.w.out <= p.partial_floats);
  const double wbytes = static_cast<double>(p.w.out) * p.w.in * (bf16 ? 2 : 1);
  // A block an SM for the whole bandwidth (linear_stream's model counts 0.6 of one; with that, wo_a at 64 tokens
  // ran 64 blocks unsplit, 57 us for 32 MB: results.md session 14).
  const double share = std::min(1.0, static_cast<double>(pl.bx * pl.bz) / static_cast<double>(p.num_sms));
  const double pbytes = 2.0 * 4.0 * static_cast<double>(ngroups) * static_cast<double>(p.T) * p.w.out;
  pl.ksplit = ngroups > 1 && fits && wbytes + 0.5 * pbytes < wbytes / share ? static_cast<int>(ngroups) : 1;
  pl.cluster = cluster && pl.ksplit > 1;
  const int tokens = 8 * pl.nt;
  // The 128-column blocks one block walks: its split's group, or the whole row.
  const int64_t range = pl.ksplit > 1 ? pl.kb_per_group : pl.nkb;
  // The ring of weight and x stages, the weight scales and x's scales of the block's range (FP8), 1 KB of alignment.
  // (Sized by the whole row until session 29: wo_b's 64 blocks at 64 tokens took 114 KB, one block an SM, so its 256
  // split blocks ran in two waves at 32% of DRAM, 34.8 us against wq_b's 19.0 on the same bytes; H100, ncu.)
  pl.smem = static_cast<size_t>(dev::kXwStages) * (dev::kXwWBytes + tokens * 128) +
            (bf16 ? 0 : static_cast<size_t>(range) * (tokens + 1) * 4) + 1024;
  // In-kernel quantisation: token tiles of 8 (16 with TERN_X8_QUANT_MAX_N=16: measured slower than act_quant + the
  // kernel in session 21, before the prologue's loads went one round) whose K range's quantised x fits 64 KB of
  // shared memory.
  // bf16 (x rounded) only where the grid is one wave of two blocks an SM: the head's 1 010 row tiles would each
  // round x again in four waves of prologues, for one launch saved on a 350 us product.
  pl.fused = f32_x && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && tokens <= x8_quant_max_n() &&
             range * tokens * 128 <= dev::kX8FusedBytes && (!bf16 || pl.bx * pl.ksplit * pl.bz <= 2LL * p.num_sms);
  if (pl.fused) pl.smem += static_cast<size_t>(range) * tokens * 128;
  return pl;
}

}  // namespace

void set_x8_quant_max_n(int n) {
  TERN_CHECK(n == 8 || n == 16, "linear_x8: the widest quantising tile is 8 or 16 tokens, not ", n);
  x8_quant_max_n_setting() = n;
}

int x8_quant_max_n_now() {
  return x8_quant_max_n();
}

bool linear_x8_ok(const LinearParams& p) {
  const DeviceMat& w = p.w;
  const bool bf16 = w.kind == WeightFormat::bf16;
  const int64_t block = bf16 ? 64 : 128;  // columns a 128-byte stage holds
  if ((w.kind != WeightFormat::fp8_block && !bf16) || w.in % block != 0 || w.out % 128 != 0 || p.T <= 0) return false;
  if (p.rows_per_group != w.out && p.rows_per_group % 128 != 0) return false;
  if (p.x_stride % block != 0 || reinterpret_cast<uintptr_t>(w.w) % 16 != 0) return false;
  return bf16 || w.s_cols == w.in / 128;
}

int64_t linear_x8_partial_floats(const LinearParams& p) {
  if (!linear_x8_ok(p)) return 0;
  LinearParams q = p;
  q.partial_floats = INT64_MAX;
  q.num_counters = INT64_MAX;
  const X8Plan pl = plan_x8(q, false);
  return pl.ksplit > 1 && !pl.cluster ? static_cast<int64_t>(pl.ksplit) * p.T * p.w.out : 0;
}

bool linear_x8_splits_in_cluster(const LinearParams& p) {
  return linear_x8_ok(p) && plan_x8(p, false).cluster;
}

bool linear_x8_quantises_x(const LinearParams& p) {
  return linear_x8_ok(p) && plan_x8(p, true).fused;
}

namespace {

void launch_x8(const LinearParams& p, const X8Plan& pl, const uint8_t* xq, const float* sx, const float* xf,
               cudaStream_t stream) {
  dev::X8Args a{};
  a.w = static_cast<const uint8_t*>(p.w.w);
  a.s = static_cast<const uint8_t*>(p.w.s);
  a.scale_f32 = p.w.scale_f32 ? 1 : 0;
  a.s_cols = p.w.s_cols;
  a.out = p.w.out;
  a.in = p.w.in;
  a.rows_per_group = p.rows_per_group;
  a.xq = xq;
  a.sx = sx;
  a.xf = xf;
  a.xcols = p.x_stride;
  a.T = p.T;
  a.nkb = pl.nkb;
  a.kb_per_group = pl.kb_per_group;
  a.y = p.y;
  a.partial = p.partial;
  a.counters = p.counters;
  a.cluster = pl.cluster ? 1 : 0;
  const dim3 grid(static_cast<unsigned>(pl.bx), static_cast<unsigned>(pl.ksplit), static_cast<unsigned>(pl.bz));
  if (xf != nullptr && p.w.kind == WeightFormat::bf16) {  // the rounding forms (plan_x8 fused, bf16 weights)
    if (pl.nt == 1) dev::launch_x8_variant<8, true, true>(a, grid, pl.smem, stream);
    else dev::launch_x8_variant<16, true, true>(a, grid, pl.smem, stream);
  } else if (xf != nullptr) {  // the quantising forms (plan_x8 fused: FP8, tiles of 8 or 16)
    if (pl.nt == 1) dev::launch_x8_variant<8, false, true>(a, grid, pl.smem, stream);
    else dev::launch_x8_variant<16, false, true>(a, grid, pl.smem, stream);
  } else if (p.w.kind == WeightFormat::bf16) {
    dev::launch_x8_tokens<true>(pl.nt, a, grid, pl.smem, stream);
  } else {
    dev::launch_x8_tokens<false>(pl.nt, a, grid, pl.smem, stream);
  }
}

}  // namespace

void launch_linear_x8(const LinearParams& p, const uint8_t* xq, const float* sx, cudaStream_t stream) {
  launch_x8(p, plan_x8(p, false), xq, sx, nullptr, stream);
}

void launch_linear_x8_quantising(const LinearParams& p, cudaStream_t stream) {
  const X8Plan pl = plan_x8(p, true);
  TERN_CHECK(pl.fused, "launch_linear_x8_quantising: this product does not take x in f32 (linear_x8_quantises_x is "
             "false)");
  launch_x8(p, pl, nullptr, nullptr, p.x, stream);
}

}  // namespace tern::cuda
