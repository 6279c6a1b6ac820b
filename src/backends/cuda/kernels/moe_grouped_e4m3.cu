// The grouped MXFP4 expert GEMMs on e4m3 wgmma (moe_grouped_e4m3.cuh). Tiles, block, producer and walk are
// moe_grouped_wgmma.cu's (moe_grouped_wgmma_impl.cuh); what differs:
//
// Activations: e4m3 "planes" of 16 columns, [K / 16][rows][16 bytes], and f32 scales [K / 128][rows] behind them
// (one power-of-two scale per pair and 128 columns: --activations fp8's blocks). In a stage (128 columns) plane
// 2 j + h (h = 0, 1) holds, at byte i, physical column 32 j + 8 (i / 4) + 4 h + i % 4: the k order of the A
// fragment below, so that k32 step j reads planes 2 j, 2 j + 1 with the no-swizzle K-major descriptor (LBO = one
// plane, NT x 16 bytes; SBO = 128, the next 8 pairs), as the bf16 kernel reads its bf16 planes.
//
// Weights: lane t of a warp's A fragment (m16n8k32 layout, checked on the GPU by the decode probe's test) takes
// the 32-bit word at bytes 16 j + 4 t of its row's 64-byte stage row: k32 step j, physical columns 32 j + 8 t ..
// + 7 (one MXFP4 scale block), nibbles 0-3 as k 4 t .. + 3 (registers 0 / 1: rows g / g + 8) and 4-7 as k 16 +
// 4 t .. + 3 (registers 2 / 3). The e2m1 codes become e4m3 bytes by prmt from a magnitude table per d = smax - s_j
// (the stage's largest of the row's four e8m0 scales minus block j's): e2m1 x 2^-d, exact for d <= 8
// (moe_e4m3_fold_ok checks the experts once). The stage's four k32 wgmmas sum into a fresh accumulator set
// (scale-d 0 on the first); then acc += fresh x 2^(smax - 127) x sx(pair), once a stage. Two sets of NT / 2
// accumulators a slab: NT is 32 or 64.
//
// h: the up kernel's epilogue is the bf16 kernel's (SwiGLU in registers, bf16 planes through shared memory);
// then h_to_e4m3 quantises each (pair, 128 columns) as act_fake_quant_bf16 does in place on the bf16 path
// (the same values), into the x buffer as e4m3 planes and scales for the down kernel.
#include <algorithm>
#include <string_view>

#include "backends/cuda/kernels/act_quant.cuh"
#include "backends/cuda/kernels/bulk_pipe.cuh"
#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/kv_row_dev.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/mma_tile.cuh"
#include "backends/cuda/kernels/moe_grouped.cuh"
#include "backends/cuda/kernels/moe_grouped_e4m3.cuh"
#include "backends/cuda/kernels/moe_grouped_wgmma.cuh"
#include "backends/cuda/kernels/moe_grouped_wgmma_impl.cuh"
#include "backends/cuda/kernels/wgmma.cuh"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/cuda_check.h"

namespace tern::cuda {
namespace dev {
namespace {

// e4m3 byte of a non-negative value that e4m3 holds exactly (0 otherwise): the table's builder.
constexpr uint32_t e4m3_byte(double v) {
  for (uint32_t b = 0; b < 0x7F; ++b) {
    const uint32_t e = b >> 3, m = b & 7;
    double x = e == 0 ? m / 8.0 : (1.0 + m / 8.0);
    for (int i = 0; i < (e == 0 ? 6 : (e < 7 ? 7 - static_cast<int>(e) : 0)); ++i) x /= 2.0;
    for (int i = 7; i < static_cast<int>(e); ++i) x *= 2.0;
    if (x == v) return b;
  }
  return 0;
}
// The e2m1 magnitudes 0, 0.5, 1, 1.5 (word 0) and 2, 3, 4, 6 (word 1) times 2^-d as e4m3 bytes, for d = 0..8.
constexpr uint32_t lut_word(int d, int half) {
  constexpr double kMag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  double scale = 1.0;
  for (int i = 0; i < d; ++i) scale /= 2.0;
  uint32_t w = 0;
  for (int i = 0; i < 4; ++i) w |= e4m3_byte(kMag[4 * half + i] * scale) << (8 * i);
  return w;
}
constexpr int kFoldMaxShift = 8;
struct Lut {
  uint32_t w[2 * (kFoldMaxShift + 1)];
};
constexpr Lut make_lut() {
  Lut l{};
  for (int d = 0; d <= kFoldMaxShift; ++d) l.w[2 * d] = lut_word(d, 0), l.w[2 * d + 1] = lut_word(d, 1);
  return l;
}
constexpr Lut kLut = make_lut();
__constant__ Lut kLutDev = kLut;  // the device's copy (each block stages it in shared memory)
static_assert(kLut.w[0] == 0x3C383000u && kLut.w[1] == 0x4C484440u, "e2m1 magnitudes as e4m3 (d = 0)");
static_assert((kLut.w[16] & 0xff00u) == 0x0100u, "0.5 x 2^-8 = 2^-9, e4m3's least subnormal (d = 8)");
static_assert((kLut.w[17] >> 24) == e4m3_byte(6.0 / 256.0) && e4m3_byte(6.0 / 256.0) != 0, "6 x 2^-8 (d = 8)");

// Eight e2m1 codes (nibble n = column n of the word) as e4m3 from the table pair (l0, l1): lo = nibbles 0-3,
// hi = 4-7, a byte a column, the sign in each nibble's bit 3 moved to the byte's bit 7 (the decode probe's
// natural-layout decode).
__device__ __forceinline__ void e2m1x8_to_e4m3(uint32_t w, uint32_t l0, uint32_t l1, uint32_t& lo, uint32_t& hi) {
  const uint32_t m = w & 0x77777777u;
  const uint32_t t0 = prmt(w, 0u, 0x1100u), t1 = prmt(w, 0u, 0x3322u);  // bytes [b0 b0 b1 b1], [b2 b2 b3 b3]
  lo = prmt(l0, l1, m) | (t0 & 0x80008000u) | ((t0 << 4) & 0x00800080u);
  hi = prmt(l0, l1, m >> 16) | (t1 & 0x80008000u) | ((t1 << 4) & 0x00800080u);
}

// d[64 x N] (+)= A[64 x 32] (registers, e4m3) * B[32 x N] (shared memory, e4m3, K-major, descriptor); accumulate
// into d when `acc`, else d = the product.
template <int N>
__device__ __forceinline__ void wgmma_k32_e4m3(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc, int acc);
template <>
__device__ __forceinline__ void wgmma_k32_e4m3<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t desc, int acc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc));
}
template <>
__device__ __forceinline__ void wgmma_k32_e4m3<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc, int acc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%"
      "27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc));
}

// A stage of a tile of NT pairs: the 256 rows' FP4 bytes (64 bytes a row, rows kRowPitch = 80 bytes apart: a
// warp's A words of rows g = 0..7 at 80 g + 4 t fall in 32 distinct banks, where 64-byte rows put g and g + 2 in the
// same ones), their e8m0 scales (row m at 8 m, 4 bytes used), the x (h) tile as 8 e4m3 planes of NT pairs x 16
// bytes, and the NT pairs' scales of the 128 columns.
template <int NT, bool UP>
struct E4Tile {
  static_assert(NT == 32 || NT == 64);
  static constexpr int kPlane = NT * 16;
  static constexpr int kRowPitch = 80;
  static constexpr int kScOff = kWgRows * kRowPitch;
  static constexpr int kXOff = kScOff + kWgRows * 8;
  static constexpr int kXBytes = 8 * kPlane;
  static constexpr int kXsOff = kXOff + kXBytes;
  static constexpr int kStage = (kXsOff + NT * 4 + 127) / 128 * 128;
  static constexpr int kHBytes = UP ? kWgHStageBytes<NT, 2> : 0;  // up: h staging, half the bf16 planes at a time
  static constexpr int kLutBytes = static_cast<int>(sizeof(Lut));
  static constexpr int kFixed = kHBytes + kLutBytes + 16;
  static constexpr int kStages = (kWgSmemMax - kFixed) / (kStage + 16) >= 6 ? 6 : 4;
  static constexpr int kHStage = kStages * kStage + 2 * kStages * 8;  // after the ring and its barriers
  static constexpr int kLutOff = kHStage + kHBytes;
  static constexpr int kSmem = kLutOff + kLutBytes;
  static_assert(kStage % 128 == 0 && kHStage % 16 == 0 && kLutOff % 8 == 0 && kSmem <= kWgSmemMax);
};

struct E4Args {
  const ExpertDesc* experts;
  const int* jobs;
  const int* num_jobs;
  const int* tile_first;  // m-tiles of NT pairs before each job
  const uint8_t* a;       // e4m3 planes [K / 16][rows][16] (x for up, h for down)
  const float* as;        // their scales [K / 128][rows]
  int64_t rows;           // rows of a, as and h
  int64_t K, N;           // N: rows of one weight matrix (up: inter, down: D)
  int n_tiles;
  float limit;
  uint16_t* h;  // up: bf16 planes [inter / 8][rows][8] (the bf16 kernel's layout and K order)
  float* y;     // down: [P, D] by sorted slot
  int l2_hint;  // the weight copies' L2 prefetch size (moe_l2_hint)
};

// The physical column (0..31 of a k32 block) at byte i of plane half h: 8 (i / 4) + 4 h + i % 4.
__host__ __device__ constexpr int e4_physical(int h, int i) { return 8 * (i / 4) + 4 * h + i % 4; }

// 16 e4m3 bytes (one plane row) from 16 values already divided by their scale.
__device__ __forceinline__ uint4 e4m3x16(const float (&v)[16]) {
  uint32_t w[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    w[q] = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b)
      w[q] |= static_cast<uint32_t>(__nv_cvt_float_to_fp8(v[4 * q + b], __NV_SATFINITE, __NV_E4M3)) << (8 * b);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// x of the sorted pairs as e4m3 planes and scales. Four threads per (128-column block kb, slot), thread j its 32
// columns 32 j .. 32 j + 31 (planes 8 kb + 2 j, + 1); the block's largest |value| over the four by shuffles, then
// the reference's scale rule. x arrives fake-quantised (--activations fp8), so this re-quantisation keeps every
// value (a smaller scale only doubles codes). Slots past the plan's pairs get zeros and scale 1.
__global__ void moe_e4m3_gather_kernel(const float* x, const int* sorted, int64_t P, int k, int64_t D, int64_t rows,
                                       uint8_t* xq, float* xs) {
  pdl_prologue();
  const int64_t n = (D / kWgK) * P * 4;
  // Whole warps iterate (the shuffles below take every lane); lanes past n only shuffle. A group's 4 lanes are
  // live together (n and the block size are multiples of 4).
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i - (threadIdx.x & 31) < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool live = i < n;
    const int j = static_cast<int>(i & 3);
    const int64_t sb = i >> 2, kb = live ? sb / P : 0, slot = live ? sb - kb * P : 0;
    const int pair = live ? sorted[slot] : -1;
    const bool valid = pair >= 0 && pair < P;
    const float4* src =
        reinterpret_cast<const float4*>(x + static_cast<int64_t>(valid ? pair / k : 0) * D + kb * kWgK + 32 * j);
    float v[32];
    float amax = 0.0f;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const float4 f = valid ? src[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)), fmaxf(fabsf(f.z), fabsf(f.w))));
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    if (!live) continue;
    const int e = valid ? fp8_scale_exponent(amax) : 0;
    const float inv = ldexpf(1.0f, -e);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float q[16];
#pragma unroll
      for (int b = 0; b < 16; ++b) q[b] = v[e4_physical(h, b)] * inv;
      *reinterpret_cast<uint4*>(xq + ((kb * 8 + 2 * j + h) * rows + slot) * 16) = e4m3x16(q);
    }
    if (j == 0) xs[kb * rows + slot] = ldexpf(1.0f, e);
  }
}

// h (bf16 planes in the bf16 kernel's stored K order, [inter / 8][rows][8]) as e4m3 planes and scales: a thread
// per (row, 128-column block), its 16 bf16 planes (128 values), the block's largest |value|, the reference's
// scale, and 8 e4m3 planes in this kernel's order: act_fake_quant_bf16's values, kept as codes and scales.
__global__ void __launch_bounds__(128) moe_e4m3_h_kernel(const uint16_t* h, int64_t rows, int64_t P, int64_t inter,
                                                         uint8_t* hq, float* hs) {
  pdl_prologue();
  const int64_t blocks = inter / kWgK;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t b = i / P, row = i - b * P;  // consecutive threads: consecutive rows of a block
  if (b >= blocks) return;
  uint4 w[16];
  float amax = 0.0f;
#pragma unroll
  for (int p = 0; p < 16; ++p) {
    w[p] = *reinterpret_cast<const uint4*>(h + ((b * 16 + p) * rows + row) * 8);
    const uint32_t q[4] = {w[p].x, w[p].y, w[p].z, w[p].w};
#pragma unroll
    for (int e = 0; e < 4; ++e)
      amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(q[e] << 16)), fabsf(__uint_as_float(q[e] & 0xffff0000u))));
  }
  const int e = fp8_scale_exponent(amax);
  const float inv = ldexpf(1.0f, -e);
  // bf16 value at stored position s of the block (plane s / 8, element s % 8).
  auto at = [&](int s) -> float {
    const uint4& u = w[s >> 3];
    const int el = s & 7;
    const uint32_t word = el < 2 ? u.x : el < 4 ? u.y : el < 6 ? u.z : u.w;
    return __uint_as_float((el & 1) ? (word & 0xffff0000u) : (word << 16));
  };
#pragma unroll
  for (int plane = 0; plane < 8; ++plane) {
    float q[16];
#pragma unroll
    for (int c = 0; c < 16; ++c) q[c] = at(wg_stored(32 * (plane >> 1) + e4_physical(plane & 1, c))) * inv;
    *reinterpret_cast<uint4*>(hq + ((b * 8 + plane) * rows + row) * 16) = e4m3x16(q);
  }
  hs[b * rows + row] = ldexpf(1.0f, e);
}

// Nonzero in *bad when some row of some matrix of the experts has two e8m0 scales more than 2^8 apart within one
// 128-column group. Block (expert, matrix).
__global__ void moe_e4m3_fold_check_kernel(const ExpertDesc* experts, int64_t D, int64_t inter, int* bad) {
  pdl_prologue();
  const int e = blockIdx.x / 3, which = blockIdx.x % 3;  // w1, w2, w3
  const int64_t rows = which == 1 ? D : inter, K = which == 1 ? inter : D, row_bytes = K / 32, groups = K / kWgK;
  const uint8_t* s = static_cast<const uint8_t*>(experts[e].s[which]);
  int found = 0;
  for (int64_t g = threadIdx.x; g < rows * groups; g += blockDim.x) {
    const int64_t r = g / groups, c = g - r * groups;
    const uint8_t* q = s + r * row_bytes + 4 * c;
    const int hi = max(max(q[0], q[1]), max(q[2], q[3])), lo = min(min(q[0], q[1]), min(q[2], q[3]));
    found |= hi - lo > kFoldMaxShift;
  }
  if (__syncthreads_or(found) && threadIdx.x == 0) atomicOr(bad, 1);
}

// Persistent, as moe_grouped_wgmma_kernel (its comment): block b takes tiles b, b + gridDim.x, ...; the producer
// warpgroup fills a ring of kStages stages (weights and scales by cp.async, the x planes by bulk copy, the pairs'
// scales by cp.async) and the two consumer warpgroups each own 128 weight rows as two m64 slabs. In a stage: the
// k32 steps' A fragments are decoded one step ahead of the wgmmas (two fragment sets, wait_group 1), the fresh
// sums are complete at the stage's end (wait_group 0), the slot is released, and the promotion adds them into
// the tile's accumulators.
template <bool UP, int NT>
__global__ void __launch_bounds__(kWgThreads, 1) moe_grouped_e4m3_kernel(E4Args a) {
  grid_dependency_wait();  // the plan, the tile table and the activations are earlier kernels' outputs
  using Tile = E4Tile<NT, UP>;
  constexpr int kStages = Tile::kStages;
  extern __shared__ __align__(128) uint8_t smem[];

  const int nj = *a.num_jobs;
  const int64_t tiles = nj == 0 ? 0 : static_cast<int64_t>(a.tile_first[nj]) * a.n_tiles;
  if (static_cast<int64_t>(blockIdx.x) >= tiles) return;  // no tile for this block (uniform)
  const int64_t K = a.K, N = a.N;
  const int kblocks = static_cast<int>(K / kWgK);

  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kStages * Tile::kStage);
  const BulkRing ring{bars, bars + kStages, kStages};
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem + Tile::kLutOff);
  if (tid < 2 * (kFoldMaxShift + 1)) lut[tid] = kLutDev.w[tid];
  if (tid == 0) {
    // full: the producer threads' cp.async arrivals and the x planes' arming thread (transaction bytes).
    ring.init(kWgConsumerWarps, kWgProducerThreads + 1);
    mbar_init_fence();
  }
  __syncthreads();

  if (warp >= kWgConsumerWarps) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kWgProducerRegs));
    // Producer thread p: its share of the weight rows and scales (WgWeightCopier), x plane p (p < 8) and pair p's
    // scale (p < NT).
    const int p = tid - kWgConsumerWarps * 32;
    const uint32_t smem0 = smem_addr(smem);
    RingCursor c;
    for (int64_t t_id = blockIdx.x; t_id < tiles; t_id += gridDim.x) {
      const WgTileAt tl = wg_tile_at(a, nj, t_id, NT, a.n_tiles);
      WgWeightCopier<UP, 4> copier(a.experts[tl.e], p, tl.n_tile, N, K, a.l2_hint);
      const uint8_t* xsrc = a.a + (static_cast<int64_t>(p & 7) * a.rows + tl.first + tl.row0) * 16;
      const float* xssrc = a.as + tl.first + tl.row0 + (p < NT ? p : 0);
      for (int kb = 0; kb < kblocks; ++kb, c.next(kStages)) {
        ring.wait_free_at(c.slot, c.parity);
        const uint32_t st = smem0 + c.slot * Tile::kStage;
        uint64_t* full = &ring.full[c.slot];
        if (p < 32) {
          if (p == 0) mbar_arrive_expect_tx(full, Tile::kXBytes);
          __syncwarp();
          if (p < 8)
            bulk_copy_g2s(smem + c.slot * Tile::kStage + Tile::kXOff + p * Tile::kPlane,
                          xsrc + static_cast<int64_t>(kb) * 8 * a.rows * 16, Tile::kPlane, full);
        }
        copier.stage(st, Tile::kRowPitch, Tile::kScOff);
        if (p < NT) cp_async_at<4>(st + Tile::kXsOff + 4 * p, xssrc + static_cast<int64_t>(kb) * a.rows, true);
        cp_async_mbar_arrive_noinc(full);
      }
    }
    cp_async_wait<0>();  // no cp.async of this thread still in flight when it exits
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kWgConsumerRegs));
  // Consumers. Thread (wg, warp w, g, t) holds tile rows 128 wg + 64 mt + 16 w + 8 h + g (mt, h = 0, 1).
  const int wg = warp >> 2, w = warp & 3, g = lane >> 2, t = lane & 3;
  int mrow[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) mrow[mt][h] = 128 * wg + 64 * mt + 16 * w + 8 * h + g;
  const uint32_t lut0 = smem_addr(lut);

  RingCursor c;
  for (int64_t t_id = blockIdx.x; t_id < tiles; t_id += gridDim.x) {
    const WgTileAt tl = wg_tile_at(a, nj, t_id, NT, a.n_tiles);
    const int n_tile = tl.n_tile, row0 = tl.row0, first = tl.first, count = tl.count;

    float acc[2][NT / 2], fresh[2][NT / 2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < NT / 2; ++i) acc[mt][i] = 0.0f, fresh[mt][i] = 0.0f;

    for (int kb = 0; kb < kblocks; ++kb, c.next(kStages)) {
      ring.wait_full_at(c.slot, c.parity);
      const uint32_t st = smem_addr(smem + c.slot * Tile::kStage);
      // The stage's rows: their 4 e8m0 scales (largest smax, shift d_j = smax - s_j per k32 block) and raw words.
      uint32_t sc[2][2], smax[2][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sc[mt][h] = lds32_at(st + Tile::kScOff + mrow[mt][h] * 8);
          const uint32_t v = sc[mt][h];
          smax[mt][h] = max(max(v & 0xffu, (v >> 8) & 0xffu), max((v >> 16) & 0xffu, v >> 24));
        }
      float xsr[NT / 4];  // the pairs 8 jj + 2 t + e2 of this thread's accumulators
#pragma unroll
      for (int jj = 0; jj < NT / 8; ++jj)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2)
          xsr[2 * jj + e2] = __uint_as_float(lds32_at(st + Tile::kXsOff + 4 * (8 * jj + 2 * t + e2)));
      const uint32_t xaddr = st + Tile::kXOff;
      uint32_t af[2][2][4];
      const auto decode = [&](int j, uint32_t(&out)[2][4]) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t word = lds32_at(st + mrow[mt][h] * Tile::kRowPitch + 16 * j + 4 * t);
            const uint32_t d = min(smax[mt][h] - ((sc[mt][h] >> (8 * j)) & 0xffu), static_cast<uint32_t>(kFoldMaxShift));
            const uint2 l = lds64_at(lut0 + 8 * d);
            e2m1x8_to_e4m3(word, l.x, l.y, out[mt][h], out[mt][2 + h]);
          }
      };
      decode(0, af[0]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint64_t desc = wg_desc(xaddr + 2 * j * Tile::kPlane, Tile::kPlane, 128);
        wgmma_pin(af[j % 2][0]);
        wgmma_pin(af[j % 2][1]);
        wgmma_fence();
        wgmma_k32_e4m3<NT>(fresh[0], af[j % 2][0], desc, j > 0);
        wgmma_k32_e4m3<NT>(fresh[1], af[j % 2][1], desc, j > 0);
        wgmma_commit();
        if (j < 3) {
          wgmma_wait<1>();  // step j - 1 is done: af[(j + 1) % 2] may be rewritten
          decode(j + 1, af[(j + 1) % 2]);
        }
      }
      wgmma_wait<0>();  // the stage's sums are complete, and the slot (x planes) is read
      wgmma_pin(fresh[0]);
      wgmma_pin(fresh[1]);
      ring.release_at(c.slot);
      // acc += fresh x 2^(smax - 127) (rows g, g + 8 of the slab) x sx (the accumulator's pair).
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const float r0 = e8m0_to_f32(static_cast<uint8_t>(smax[mt][0])), r1 = e8m0_to_f32(static_cast<uint8_t>(smax[mt][1]));
#pragma unroll
        for (int i = 0; i < NT / 2; ++i)
          acc[mt][i] = fmaf(fresh[mt][i] * ((i & 2) ? r1 : r0), xsr[2 * (i / 4) + (i & 1)], acc[mt][i]);
      }
    }
    // The weights entered at their values (no 2^-16 shift) and NVFP4 never comes here: multipliers 1.
    const WgTileOut o{wg, w, g, t, tid, n_tile, first, row0, count};
    if constexpr (UP)
      wg_store_h<NT, 2>(acc, 1.0f, 1.0f, a.limit, reinterpret_cast<uint16_t*>(smem + Tile::kHStage), a.h, a.rows, o);
    else
      wg_store_y<NT>(acc, 1.0f, a.y, N, mrow, o);
  }
  grid_dependents_launch();  // this block's tiles are done: the next kernel may be scheduled
}

template <bool UP, int NT>
void launch_e4m3(const E4Args& a, int64_t m_tiles_bound, cudaStream_t stream) {
  constexpr int kSmem = E4Tile<NT, UP>::kSmem;
  static const bool attr = [] {
    cudaFuncSetAttribute(moe_grouped_e4m3_kernel<UP, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    return true;
  }();
  (void)attr;
  const int64_t blocks = wg_blocks(m_tiles_bound, a.n_tiles);
  if (blocks == 0) return;
  launch(moe_grouped_e4m3_kernel<UP, NT>, static_cast<unsigned>(blocks), kWgThreads, kSmem, stream, a);
}

template <int NT>
void launch_up_down(const MoeParams& p, const MoeGroupedBuffers& b, int64_t rows, cudaStream_t stream) {
  const int64_t P = p.T * p.k;
  const int64_t m_bound = (P + NT - 1) / NT + std::min<int64_t>(P, p.E);
  // The x buffer (rows x D x 2 bytes): x's e4m3 planes and scales for up, then h's for down.
  auto* xq = reinterpret_cast<uint8_t*>(b.xs);
  E4Args a{p.experts, b.jobs, b.num_jobs, b.tile_first, xq, reinterpret_cast<const float*>(xq + rows * p.D), rows,
           p.D, p.inter, static_cast<int>(p.inter / (kWgRows / 2)), p.limit, b.h, b.y, moe_l2_hint()};
  launch_e4m3<true, NT>(a, m_bound, stream);
  float* hs = reinterpret_cast<float*>(xq + rows * p.inter);
  const int64_t h_threads = (p.inter / kWgK) * P;
  launch(moe_e4m3_h_kernel, static_cast<unsigned>((h_threads + 127) / 128), 128, 0, stream, b.h, rows, P, p.inter,
         xq, hs);
  a.a = xq;
  a.as = hs;
  a.K = p.inter;
  a.N = p.D;
  a.n_tiles = static_cast<int>((p.D + kWgRows - 1) / kWgRows);
  launch_e4m3<false, NT>(a, m_bound, stream);
}

}  // namespace
}  // namespace dev

const char* moe_grouped_e4m3_refusal(const MoeParams& p) {
  if (p.kind != WeightFormat::mxfp4 || p.scale_f32) return "experts not MXFP4 with e8m0 scales";
  if (!p.act_fp8) return "activations not fp8";
  if (p.D % 128 != 0 || p.inter % 128 != 0 || p.inter * 33 > p.D * 64) return "a shape it does not take";
  if (!p.experts_aligned) return "unaligned experts";
  if (!p.e4m3_fold_ok) return "scales that do not fold (more than 2^8 apart in 128 columns)";
  return nullptr;
}

int moe_grouped_e4m3_tile_pairs(const MoeParams& p) {
  if (p.E <= 0) return 0;
  const int64_t P = p.T * p.k, mean = P / std::max<int64_t>(1, std::min<int64_t>(P, p.E));
  return mean <= 40 ? 32 : 64;
}

const char* moe_grouped_e4m3_path_name(const MoeParams& p) {
  (void)p;
  return "moe_grouped_e4m3_kernel mxfp4 256x{32,64} by pairs per expert (wgmma e4m3, fp4 decoded to e4m3 with "
         "the MXFP4 scales folded per 128 columns, x and h e4m3 1x128, one promotion a stage)";
}

void launch_moe_grouped_e4m3(const MoeParams& p, const MoeGroupedBuffers& b, cudaStream_t stream) {
  const int64_t P = p.T * p.k, rows = moe_grouped_rows(p);
  if (P == 0) return;
  const int nt = moe_grouped_e4m3_tile_pairs(p);
  auto* xq = reinterpret_cast<uint8_t*>(b.xs);
  launch(dev::moe_e4m3_gather_kernel, dev::grid_stride_blocks((p.D / dev::kWgK) * P * 4), 256, 0, stream, p.x,
         b.sorted, P, p.k, p.D, rows, xq, reinterpret_cast<float*>(xq + rows * p.D));
  launch_moe_grouped_tiles(b.jobs, b.num_jobs, nt, b.tile_first, stream);
  if (nt == 32) dev::launch_up_down<32>(p, b, rows, stream);
  else dev::launch_up_down<64>(p, b, rows, stream);
}

bool moe_e4m3_fold_ok(const ExpertDesc* experts, int64_t E, int64_t D, int64_t inter, cudaStream_t stream) {
  if (E == 0) return true;
  DeviceBuffer bad(sizeof(int));
  TERN_CUDA(cudaMemsetAsync(bad.data(), 0, sizeof(int), stream));
  launch(dev::moe_e4m3_fold_check_kernel, static_cast<unsigned>(3 * E), 256, 0, stream, experts, D, inter,
         static_cast<int*>(bad.data()));
  int host = 1;
  TERN_CUDA(cudaMemcpyAsync(&host, bad.data(), sizeof(int), cudaMemcpyDeviceToHost, stream));
  TERN_CUDA(cudaStreamSynchronize(stream));
  return host == 0;
}

}  // namespace tern::cuda
