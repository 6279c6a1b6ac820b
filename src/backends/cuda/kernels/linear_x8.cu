// linear_x8.cuh's kernel (nvcc only).
//
// Hopper's mma.sync has no FP8 form of its own (ptxas turns m16n8k32.e4m3 into e4m3 -> f16 conversions, two
// f16 MMAs and adds between them), so the kernel does that conversion itself, once per weight, and feeds f16
// m16n8k16 MMAs chained on one accumulator: every e4m3 number is an f16 number, products are exact in f32.
// x arrives as f16 already (launch_act_quant_f16), so its window is a plain copy.
//
// Grid: x = 128-row tiles of W, y = K splits, z = token tiles of 8*NT tokens. Block: 8 warps, one 16-row m-tile
// each. Weights: each lane copies its own 16-byte runs of rows g and g + 8 (two 64-column chunks of a
// 128-column block) into a per-warp ring of kX8Stages blocks with cp.async (3 blocks, 6 KB, in flight a
// warp) and reads back only what it copied. Lane t's 16 bytes of a chunk are columns 16t .. 16t + 15; MMA j
// (k16) of the chunk takes its word j: k slots 2t, 2t+1 are columns 16t + 4j, +1 (the word's low half: a0 row
// g, a1 row g + 8) and slots 2t+8, 2t+9 columns 16t + 4j + 2, +3 (high half: a2, a3). x is staged in its
// natural column order, so the B fragment of token g (b0 = slots 2t, 2t+1; b1 = 2t+8, 2t+9) is f16 words 2j,
// 2j + 1 of the lane's 32 bytes of the chunk.
//
// Sums: per 128-column block, the eight MMAs' f32 sum times sw * sx (one weight scale for the warp, one x
// scale per token) goes into the group's sum; groups of kb_per_group blocks (from the weight's shape alone)
// are added in order, whether one block walks them or each is a block whose partials the last block adds
// (finish_split_k): a token's bits depend on neither T nor its neighbours.
#include "backends/cuda/kernels/linear_x8.cuh"

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/stream_tile.cuh"
#include "backends/cuda/kernels/wgmma.cuh"

namespace tern::cuda {

namespace dev {

constexpr int kX8Rows = 128, kX8Warps = 8;
constexpr int kX8Stages = 4;                   // 128-column blocks a warp ring holds (3 in flight)
constexpr int kX8StageBytes = 4 * 32 * 16;     // 2 rows x 2 chunks x 32 lanes x 16 B
constexpr int kX8MaxWin = 8;                   // x window, 128-column blocks
constexpr int kX8MaxSmem = 200 * 1024;

struct X8Args {
  const uint8_t* w;
  const uint8_t* s;
  int scale_f32;
  int64_t s_cols, out, in, rows_per_group;
  const uint16_t* xh;  // f16 [T, xcols] (mma.sync form)
  const uint8_t* xq;   // e4m3 [T, xcols] (wgmma form)
  const float* sx;     // [T, xcols / 128]
  int64_t xcols;
  int64_t T, nkb, kb_per_group;
  int win;  // window, 128-column blocks
  float* y;
  float* partial;
  int* counters;
};

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The four e4m3 bytes of `w` as two f16x2 (bytes 0, 1 -> lo; 2, 3 -> hi; the lower byte in the lower half), exactly.
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

// Bytes between window rows: f16, 256 bytes a block, + 16 so that the two rows of a quarter-warp's 16-byte loads
// (lanes t = 0..3 at 32-byte steps) fall in different banks.
__host__ __device__ constexpr int x8_win_stride(int win) { return win * 256 + 16; }

template <int NT>
__global__ void __launch_bounds__(kX8Warps * 32) linear_x8_kernel(X8Args a) {
  constexpr int kTokens = 8 * NT;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  uint8_t* ring = smem + warp * kX8Stages * kX8StageBytes;
  uint8_t* win = smem + kX8Warps * kX8Stages * kX8StageBytes;
  const int wstride = x8_win_stride(a.win);
  float* sxw = reinterpret_cast<float*>(win + kTokens * wstride);  // [kTokens][win]
  float* wtab = sxw + kTokens * a.win;                              // [n]: the tile's weight scales

  const int64_t tile_row0 = static_cast<int64_t>(blockIdx.x) * kX8Rows;
  const int64_t row0 = tile_row0 + warp * 16;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.z) * kTokens;
  const int ksplit = gridDim.y;
  const int64_t kb_begin = ksplit > 1 ? blockIdx.y * a.kb_per_group : 0;
  const int64_t kb_end = ksplit > 1 ? min(a.nkb, kb_begin + a.kb_per_group) : a.nkb;
  const int n = static_cast<int>(kb_end - kb_begin);
  const int live = static_cast<int>(min(a.T - tok0, static_cast<int64_t>(kTokens)));

  const int64_t r_lo = row0 + g, r_hi = r_lo + 8;
  const bool ok_lo = r_lo < a.out, ok_hi = r_hi < a.out;
  const uint8_t* w_lo = a.w + (ok_lo ? r_lo * a.in : 0) + t * 16;  // a mapped address even when out of range
  const uint8_t* w_hi = a.w + (ok_hi ? r_hi * a.in : 0) + t * 16;
  auto issue = [&](int slot, int64_t kb) {
    uint8_t* st = ring + slot * kX8StageBytes + lane * 16;
    const int64_t c = kb * 128;
    cp_async16(st, w_lo + c, ok_lo);
    cp_async16(st + 32 * 16, w_hi + c, ok_hi);
    cp_async16(st + 64 * 16, w_lo + c + 64, ok_lo);
    cp_async16(st + 96 * 16, w_hi + c + 64, ok_hi);
  };
  // Before the wait (PDL, launch.cuh): only the weights and their scales, which no kernel writes.
#pragma unroll
  for (int i = 0; i < kX8Stages - 1; ++i) {
    if (i < n) issue(i, kb_begin + i);
    cp_async_commit();
  }
  {
    const int64_t srow = tile_row0 / 128;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const int64_t idx = srow * a.s_cols + kb_begin + j;
      wtab[j] = a.scale_f32 ? reinterpret_cast<const float*>(a.s)[idx] : e8m0_to_f32(a.s[idx]);
    }
  }
  grid_dependency_wait();

  const int64_t xcol0 = (tile_row0 / a.rows_per_group) * a.in;  // the row group's first column of x
  const int64_t sx_cols = a.xcols / 128;
  float acc[NT][4], grp[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = grp[j][e] = 0.0f;

  int wi = 0, slot = 0, gleft = static_cast<int>(a.kb_per_group);
  for (int i = 0; i < n; ++i) {
    if (wi == 0) {  // the next window of x: every warp is done with the previous one
      __syncthreads();
      const int cols = min(a.win, n - i), pieces = cols * 16;  // 16-byte pieces of a row
      const int64_t c0 = xcol0 + (kb_begin + i) * 128;
      for (int p = threadIdx.x; p < kTokens * pieces; p += blockDim.x) {
        const int row = p / pieces, piece = p - row * pieces;
        uint8_t* dst = win + row * wstride + piece * 16;
        if (row < live) cp_async16(dst, a.xh + (tok0 + row) * a.xcols + c0 + piece * 8, true);
        else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
      for (int p = threadIdx.x; p < kTokens * cols; p += blockDim.x) {
        const int row = p / cols, c = p - row * cols;
        sxw[row * a.win + c] = row < live ? a.sx[(tok0 + row) * sx_cols + c0 / 128 + c] : 0.0f;
      }
      cp_async_commit();
      cp_async_wait<0>();  // also the weight copies issued so far: the ring's waits below are then no-ops once
      __syncthreads();
    }
    cp_async_wait<kX8Stages - 2>();
    const uint8_t* st = ring + slot * kX8StageBytes + lane * 16;
    const uint4 w[4] = {lds128(st), lds128(st + 32 * 16), lds128(st + 64 * 16), lds128(st + 96 * 16)};
    // A fragments of the block's 8 MMAs (chunk c = j / 4, word j % 4): rows g (w[2c]) and g + 8 (w[2c + 1]).
    uint32_t af[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = j / 4, q = j % 4;
      e4m3x4_to_f16x2x2(word_of(w[2 * c], q), af[j][0], af[j][2]);
      e4m3x4_to_f16x2x2(word_of(w[2 * c + 1], q), af[j][1], af[j][3]);
    }
    const float sw = wtab[i];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (NT > 1 && 8 * j >= live) break;
      const uint8_t* xr = win + (8 * j + g) * wstride + wi * 256 + 32 * t;
      const uint4 x[4] = {lds128(xr), lds128(xr + 16), lds128(xr + 128), lds128(xr + 144)};
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint4& xv = x[2 * (k / 4) + (k % 4) / 2];
        const bool second = (k % 2) == 1;
        mma_f16(part, af[k][0], af[k][1], af[k][2], af[k][3], second ? xv.z : xv.x, second ? xv.w : xv.y);
      }
      const float fa = sw * sxw[(8 * j + 2 * t) * a.win + wi], fb = sw * sxw[(8 * j + 2 * t + 1) * a.win + wi];
      grp[j][0] = fmaf(part[0], fa, grp[j][0]);
      grp[j][1] = fmaf(part[1], fb, grp[j][1]);
      grp[j][2] = fmaf(part[2], fa, grp[j][2]);
      grp[j][3] = fmaf(part[3], fb, grp[j][3]);
    }
    if (--gleft == 0 || i == n - 1) {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[j][e] += grp[j][e];
          grp[j][e] = 0.0f;
        }
      gleft = static_cast<int>(a.kb_per_group);
    }
    // The block kX8Stages - 1 ahead goes into the slot before the one just read.
    const int ahead = slot == 0 ? kX8Stages - 1 : slot - 1;
    if (i + kX8Stages - 1 < n) issue(ahead, kb_begin + i + kX8Stages - 1);
    cp_async_commit();
    if (++wi == a.win) wi = 0;
    if (++slot == kX8Stages) slot = 0;
  }
  cp_async_wait<0>();
  grid_dependents_launch();  // every weight byte is in: the next kernel may be scheduled

  float* dst = ksplit > 1 ? a.partial + static_cast<int64_t>(blockIdx.y) * a.T * a.out : a.y;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = row0 + g + 8 * (e >> 1);
      const int tok = 8 * j + 2 * t + (e & 1);
      if (row < a.out && tok < live) dst[(tok0 + tok) * a.out + row] = acc[j][e];
    }
  if (ksplit == 1) return;
  finish_split_k(a.partial, a.y, a.counters, blockIdx.x + static_cast<int64_t>(gridDim.x) * blockIdx.z, ksplit,
                 tile_row0, kX8Rows, a.out, a.T, tok0, tok0 + live, 1.0f);
}

// ---- The wgmma form: FP8 at the tensor cores' own rate, both operands read from shared memory -------------
//
// Block: two warpgroups, 128 weight rows (one scale row block), N tokens (8, 16, 32 or 64: the wgmma's n). A ring
// of kXwStages stages, each a 128-column block of the 128 rows (16 KB) and of the N tokens' quantised x (N x 128
// bytes), both in the 128-byte-swizzled K-major layout (wgmma.cuh: row r at r * 128, its 16-byte granule c at
// (c ^ (r % 8)) * 16), filled by every thread with cp.async (4 weight pieces and up to 2 x pieces a thread) and
// published by fence.proxy.async + a block barrier. Warpgroup w multiplies rows 64w .. 64w + 63 by the x tile:
// four m64nNk32 e4m3 MMAs (k 32 bytes apart in the atom row) whose first does not accumulate, i.e. the block's sum
// alone; then as the mma.sync form, grp += sum * sw * sx per token, acc += grp at group ends, the same order.
constexpr int kXwStages = 4;
constexpr int kXwWBytes = kX8Rows * 128;  // a stage's weights: 128 rows x 128 bytes

template <int N>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[N / 2], uint64_t da, uint64_t db, int scale_d);
// d[64 x N] (+)= A[64 x 32] B[32 x N], e4m3, both K-major in shared memory; scale_d 0: d = A B.
template <>
__device__ __forceinline__ void wgmma_e4m3<8>(float (&d)[4], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3}, "
      "%4, %5, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wgmma_e4m3<16>(float (&d)[8], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, "
      "%8, %9, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wgmma_e4m3<32>(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wgmma_e4m3<64>(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}

template <int N>
__global__ void __launch_bounds__(2 * 128) linear_x8_wgmma_kernel(X8Args a) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // The swizzled tiles need 1024-byte alignment (wgmma.cuh); the launch asks for 1 KB more than the plan.
  const uint32_t raw = smem_addr(smem_raw);
  uint8_t* smem = smem_raw + ((1024 - (raw & 1023)) & 1023);
  constexpr int kStageBytes = kXwWBytes + N * 128;
  float* wtab = reinterpret_cast<float*>(smem + kXwStages * kStageBytes);  // [n]
  float* sxs = wtab + a.nkb;                                                // [N][n]: x scales of the range

  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, wq = (tid >> 5) & 3;
  const int64_t tile_row0 = static_cast<int64_t>(blockIdx.x) * kX8Rows;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.z) * N;
  const int ksplit = gridDim.y;
  const int64_t kb_begin = ksplit > 1 ? blockIdx.y * a.kb_per_group : 0;
  const int64_t kb_end = ksplit > 1 ? min(a.nkb, kb_begin + a.kb_per_group) : a.nkb;
  const int n = static_cast<int>(kb_end - kb_begin);
  const int live = static_cast<int>(min(a.T - tok0, static_cast<int64_t>(N)));
  const int64_t xcol0 = (tile_row0 / a.rows_per_group) * a.in;

  // This thread's copies of a stage: weight pieces p = tid + 256 j (row p / 8, granule p % 8), x pieces likewise.
  auto issue_w = [&](int slot, int64_t kb) {
    uint8_t* st = smem + slot * kStageBytes;
#pragma unroll
    for (int j = 0; j < kXwWBytes / 16 / 256; ++j) {
      const int p = tid + 256 * j, r = p >> 3, c = p & 7;
      const int64_t row = tile_row0 + r;
      const bool ok = row < a.out;
      cp_async16(st + r * 128 + ((c ^ (r & 7)) << 4), a.w + (ok ? row * a.in + kb * 128 + c * 16 : 0), ok);
    }
  };
  auto issue_x = [&](int slot, int64_t kb) {
    uint8_t* st = smem + slot * kStageBytes + kXwWBytes;
    for (int p = tid; p < N * 8; p += 256) {
      const int r = p >> 3, c = p & 7;
      const bool ok = r < live;
      cp_async16(st + r * 128 + ((c ^ (r & 7)) << 4),
                 a.xq + (ok ? (tok0 + r) * a.xcols + xcol0 + kb * 128 + c * 16 : 0), ok);
    }
  };
  // Before the wait (PDL, launch.cuh): only the weights and their scales, which no kernel writes.
#pragma unroll
  for (int i = 0; i < kXwStages - 1; ++i)
    if (i < n) issue_w(i, kb_begin + i);
  {
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
    if (i < n) issue_x(i, kb_begin + i);
    cp_async_commit();
  }
  const int64_t sx_cols = a.xcols / 128;
  for (int p = tid; p < N * n; p += blockDim.x) {
    const int r = p / n, c = p - r * n;
    sxs[p] = r < live ? a.sx[(tok0 + r) * sx_cols + xcol0 / 128 + kb_begin + c] : 0.0f;
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
    const uint32_t wa = st + wg * 64 * 128, xa = st + kXwWBytes;
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) wgmma_e4m3<N>(part, sw128_desc(wa + 32 * s), sw128_desc(xa + 32 * s), s > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(part);
    const float sw = wtab[i];
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      const float fa = sw * sxs[(8 * j + t2) * n + i], fb = sw * sxs[(8 * j + t2 + 1) * n + i];
      grp[4 * j + 0] = fmaf(part[4 * j + 0], fa, grp[4 * j + 0]);
      grp[4 * j + 1] = fmaf(part[4 * j + 1], fb, grp[4 * j + 1]);
      grp[4 * j + 2] = fmaf(part[4 * j + 2], fa, grp[4 * j + 2]);
      grp[4 * j + 3] = fmaf(part[4 * j + 3], fb, grp[4 * j + 3]);
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
      issue_x(ahead, kb_begin + i + kXwStages - 1);
    }
    cp_async_commit();
    if (++slot == kXwStages) slot = 0;
  }
  cp_async_wait<0>();
  grid_dependents_launch();

  float* dst = ksplit > 1 ? a.partial + static_cast<int64_t>(blockIdx.y) * a.T * a.out : a.y;
  const int64_t row_a = tile_row0 + wg * 64 + wq * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = row_a + 8 * (e >> 1);
      const int tok = 8 * j + t2 + (e & 1);
      if (row < a.out && tok < live) dst[(tok0 + tok) * a.out + row] = acc[4 * j + e];
    }
  if (ksplit == 1) return;
  finish_split_k(a.partial, a.y, a.counters, blockIdx.x + static_cast<int64_t>(gridDim.x) * blockIdx.z, ksplit,
                 tile_row0, kX8Rows, a.out, a.T, tok0, tok0 + live, 1.0f);
}

template <int N>
void launch_x8_wgmma_variant(const X8Args& a, dim3 grid, size_t smem, cudaStream_t stream) {
  static const bool attr = [] {
    cudaFuncSetAttribute(linear_x8_wgmma_kernel<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, kX8MaxSmem);
    return true;
  }();
  (void)attr;
  launch(linear_x8_wgmma_kernel<N>, grid, 2 * 128, smem, stream, a);
}

template <int NT>
void launch_x8_variant(const X8Args& a, dim3 grid, size_t smem, cudaStream_t stream) {
  static const bool attr = [] {
    cudaFuncSetAttribute(linear_x8_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kX8MaxSmem);
    return true;
  }();
  (void)attr;
  launch(linear_x8_kernel<NT>, grid, kX8Warps * 32, smem, stream, a);
}

}  // namespace dev

namespace {

struct X8Plan {
  int nt = 1, ksplit = 1, win = 1;
  int64_t bx = 0, bz = 0, nkb = 0, kb_per_group = 1;
  size_t smem = 0;
};

// Groups of 128-column blocks from the weight's shape alone: as many as one token tile needs for two blocks a
// multiprocessor, each at least kX8Stages - 1 blocks long (a full ring), at most 64. They run as separate
// blocks (split K) when that is cheaper by the rough model linear_stream uses (stream_ksplit): the blocks'
// share of the bandwidth grows with their number; a split writes and reads its partial sums (half price: L2).
X8Plan plan_x8(const LinearParams& p) {
  X8Plan pl;
  pl.nt = p.T <= 8 ? 1 : p.T <= 16 ? 2 : p.T <= 32 ? 4 : 8;
  pl.bx = p.w.out / dev::kX8Rows;
  pl.bz = (p.T + 8 * pl.nt - 1) / (8 * pl.nt);
  pl.nkb = p.w.in / 128;
  int64_t groups = std::max<int64_t>(1, 2LL * p.num_sms / pl.bx);
  groups = std::min<int64_t>({groups, std::max<int64_t>(1, pl.nkb / (dev::kX8Stages - 1)), 64});
  pl.kb_per_group = (pl.nkb + groups - 1) / groups;
  const int64_t ngroups = (pl.nkb + pl.kb_per_group - 1) / pl.kb_per_group;
  const bool fits = pl.bx * pl.bz <= p.num_counters && ngroups * p.T * p.w.out <= p.partial_floats;
  const double wbytes = static_cast<double>(p.w.out) * p.w.in;
  const double share = std::min(1.0, static_cast<double>(pl.bx * pl.bz) / (0.6 * p.num_sms));
  const double pbytes = 2.0 * 4.0 * static_cast<double>(ngroups) * static_cast<double>(p.T) * p.w.out;
  pl.ksplit = ngroups > 1 && fits && wbytes + 0.5 * pbytes < wbytes / share ? static_cast<int>(ngroups) : 1;
  const int64_t range = pl.ksplit > 1 ? pl.kb_per_group : pl.nkb;
  pl.win = static_cast<int>(std::min<int64_t>(range, dev::kX8MaxWin));
  const int tokens = 8 * pl.nt;
  if (linear_x8_wgmma())  // the ring of weight and x stages, the weight scales and x's scales, 1 KB of alignment
    pl.smem = static_cast<size_t>(dev::kXwStages) * (dev::kXwWBytes + tokens * 128) +
              static_cast<size_t>(pl.nkb) * (tokens + 1) * 4 + 1024;
  else
    pl.smem = static_cast<size_t>(dev::kX8Warps) * dev::kX8Stages * dev::kX8StageBytes +
              static_cast<size_t>(tokens) * dev::x8_win_stride(pl.win) + static_cast<size_t>(tokens) * pl.win * 4 +
              static_cast<size_t>(range) * 4;
  return pl;
}

}  // namespace

bool linear_x8_ok(const LinearParams& p) {
  const DeviceMat& w = p.w;
  if (w.kind != WeightKind::fp8 || w.in % 128 != 0 || w.out % 128 != 0 || p.T <= 0) return false;
  if (p.rows_per_group != w.out && p.rows_per_group % 128 != 0) return false;
  if (p.x_stride % 128 != 0 || reinterpret_cast<uintptr_t>(w.w) % 16 != 0) return false;
  return w.s_cols == w.in / 128;
}

int64_t linear_x8_partial_floats(const LinearParams& p) {
  if (!linear_x8_ok(p)) return 0;
  LinearParams q = p;
  q.partial_floats = INT64_MAX;
  q.num_counters = INT64_MAX;
  const X8Plan pl = plan_x8(q);
  return pl.ksplit > 1 ? static_cast<int64_t>(pl.ksplit) * p.T * p.w.out : 0;
}

bool linear_x8_wgmma() {
  static const bool wgmma = [] {
    const char* e = std::getenv("TERN_X8");
    return e == nullptr || std::string_view(e) != "mma";
  }();
  return wgmma;
}

void launch_linear_x8(const LinearParams& p, const void* x, const float* sx, cudaStream_t stream) {
  const X8Plan pl = plan_x8(p);
  dev::X8Args a{};
  a.w = static_cast<const uint8_t*>(p.w.w);
  a.s = static_cast<const uint8_t*>(p.w.s);
  a.scale_f32 = p.w.scale_f32 ? 1 : 0;
  a.s_cols = p.w.s_cols;
  a.out = p.w.out;
  a.in = p.w.in;
  a.rows_per_group = p.rows_per_group;
  a.xh = static_cast<const uint16_t*>(x);
  a.xq = static_cast<const uint8_t*>(x);
  a.sx = sx;
  a.xcols = p.x_stride;
  a.T = p.T;
  a.nkb = pl.nkb;
  a.kb_per_group = pl.kb_per_group;
  a.win = pl.win;
  a.y = p.y;
  a.partial = p.partial;
  a.counters = p.counters;
  const dim3 grid(static_cast<unsigned>(pl.bx), static_cast<unsigned>(pl.ksplit), static_cast<unsigned>(pl.bz));
  if (linear_x8_wgmma()) {
    switch (pl.nt) {
      case 1:
        dev::launch_x8_wgmma_variant<8>(a, grid, pl.smem, stream);
        break;
      case 2:
        dev::launch_x8_wgmma_variant<16>(a, grid, pl.smem, stream);
        break;
      case 4:
        dev::launch_x8_wgmma_variant<32>(a, grid, pl.smem, stream);
        break;
      default:
        dev::launch_x8_wgmma_variant<64>(a, grid, pl.smem, stream);
        break;
    }
    return;
  }
  switch (pl.nt) {
    case 1:
      dev::launch_x8_variant<1>(a, grid, pl.smem, stream);
      break;
    case 2:
      dev::launch_x8_variant<2>(a, grid, pl.smem, stream);
      break;
    case 4:
      dev::launch_x8_variant<4>(a, grid, pl.smem, stream);
      break;
    default:
      dev::launch_x8_variant<8>(a, grid, pl.smem, stream);
      break;
  }
}

}  // namespace tern::cuda
