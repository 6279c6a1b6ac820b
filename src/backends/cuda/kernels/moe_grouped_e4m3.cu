// The grouped MXFP4 expert GEMMs on e4m3 wgmma (moe_grouped_e4m3.cuh), both operands from shared memory: the
// producer warpgroup decodes each stage's FP4 weights to e4m3 once, into the stage, and the consumers only issue
// wgmma and promote (attention version 5's move, decode once and copy after, applied to the experts). Plan, tile
// table and persistent walk are moe_grouped_wgmma.cu's (moe_grouped_wgmma_impl.cuh); what differs:
//
// Tile: 128 weight rows (two consumer warpgroups of one m64 slab each) x NT pairs (32, 64, 96 or 128), K = 128
// columns a stage. Up: tile row 16 sigma + r (sigma = 4 wg + warp) is w1 row (r < 8) or w3 row (r >= 8) number
// n_tile * 64 + 8 sigma + r % 8, so a thread's rows g and g + 8 are gate and up of one h column and SwiGLU runs in
// registers; a tile makes 64 h columns. Down: tile row m is w2 row n_tile * 128 + m.
//
// Activations: e4m3 "planes" of 16 columns, [K / 16][rows][16], and f32 scales [K / 128][rows] behind them (one
// power-of-two scale per pair and 128 columns: --activations fp8's blocks). In a stage (128 columns) plane 2 j + h
// (h = 0, 1) holds, at byte i, physical column 32 j + 8 (i / 4) + 4 h + i % 4 (e4_physical), so k32 step j reads
// planes 2 j, 2 j + 1 with the no-swizzle K-major descriptor (LBO = one plane, SBO = 128: the next 8 rows).
//
// Weights in a stage: the same planes for the 128 rows ([8][128][16], 16 KB), written by the producer: its threads
// copy the rows' 64 FP4 bytes a stage (cp.async, 4 threads a row, into the upper half of the stage's weight planes,
// which the decode then overwrites between two producer-only barriers); thread p copies row p's e8m0 scales (16 bytes
// = 4 stages at a time where K % 512 == 0, one copy a row every 4 stages, else 4 bytes a stage) and decodes row p: word t of block j (8
// nibbles, physical columns 32 j + 8 t ..) becomes e4m3 bytes 4 t .. 4 t + 3 of planes 2 j (nibbles 0-3) and 2 j +
// 1 (4-7), by prmt from a magnitude table per d = smax - s_j (the stage's largest of the row's four scales minus
// block j's): e2m1 x 2^-d, exact for d <= 8 (moe_e4m3_fold_ok checks the experts once). The producer decodes stage i
// - kLead while stage i's copies fly (kLead stages of FP4 in flight a block), then arrives on the stage's full
// barrier after a proxy fence (its generic stores before wgmma's async-proxy reads).
//
// Consumers: the stage's four k32 wgmmas (m64nNTk32, A and B by descriptor) sum into a fresh accumulator set
// (scale-d 0 on the first), waited for, then promoted: acc += fresh x 2^(smax - 127) (the row's, from the stage) x sx
// (the pair's), DeepGEMM's scheme (it also bounds the FP8 tensor cores' reduced-precision accumulation to 128 k); then
// the slot is released. The two warpgroups fall into turns, one's MMAs under the other's promotion. (Two fresh sets
// alternating by stage, a group in flight during the promotion, made ptxas serialise every wgmma: it does not follow
// wait_group 1 for accumulators.) 2 x NT / 2 accumulators a thread.
//
// h: the up tile's 64 columns are half of one 128-column quantisation block of h; the two n-tiles of a block run in
// one cluster (n-tiles 2q, 2q + 1: ranks r, r ^ 1), so the up kernel always runs as 2-block clusters. Its
// epilogue stages the bf16-rounded h rows (the bf16 path's values), each pair's largest |h| over its 64 columns goes
// to the peer block by st.async (complete_tx on the peer's exchange barrier, double-buffered by tile parity), and
// both quantise their half with the reference's scale rule of the whole 128 (act_fake_quant_bf16's values, kept as
// codes and scales): the down kernel's e4m3 h planes and scales, in the h buffer, with no kernel between up and down.
//
// x planes by bulk copy, multicast over the cluster as the bf16 kernel's (each block loads 8 / kCta planes).
//
// Measured (session 37, H100, its first form with a thread a row's FP4 copies): correct (GpuActFp8.E4m3*,
// GpuActFp8Linear.MoeAgainstCpu at both shapes) and slower than the bf16 kernels: 8K up 4 863 / down 2 622 us a layer
// against 3 630 / 1 960, 8K prefill 0.754 against 0.698 s; tern_gpu_bench --only moe_prefill 0.63x / 0.70x / 0.82x at
// 1K / 2K / 8K tokens. ncu (the 1K context's up kernel): 49% excess L2 sectors and 46% excess shared wavefronts, all on
// those copies, and the consumers waiting for a full stage in 31.6% of samples: the producer is the bound. The copies
// are 4 threads a row since (not yet measured).
#include <cooperative_groups.h>

#include <algorithm>
#include <limits>
#include <string_view>

#include "backends/cuda/kernels/act_quant.cuh"
#include "backends/cuda/kernels/act_quant_dev.cuh"
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
namespace cg = cooperative_groups;

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

// d[64 x N] (+)= A[64 x 32] * B[32 x N], both e4m3 in shared memory (K-major descriptors); accumulate into d when
// `acc`, else d = the product.
template <int N>
__device__ __forceinline__ void wgmma_ss_k32_e4m3(float (&d)[N / 2], uint64_t da, uint64_t db, int acc);
template <>
__device__ __forceinline__ void wgmma_ss_k32_e4m3<32>(float (&d)[16], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
      "%16, %17, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(acc));
}
template <>
__device__ __forceinline__ void wgmma_ss_k32_e4m3<64>(float (&d)[32], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "%32, %33, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(acc));
}
template <>
__device__ __forceinline__ void wgmma_ss_k32_e4m3<96>(float (&d)[48], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %50, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, "
      "%48, %49, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "l"(da), "l"(db), "r"(acc));
}
template <>
__device__ __forceinline__ void wgmma_ss_k32_e4m3<128>(float (&d)[64], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "%64, %65, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(acc));
}

inline constexpr int kE4Rows = 128;  // weight rows a tile: two consumer warpgroups x one m64 slab
inline constexpr int kE4HPitch = 72;  // bf16 values a staged h row (64 + 8: rows 16 bytes apart in the banks)
inline constexpr int kE4MaxStages = 6;
inline constexpr int kE4ScBytes = 2 * kE4Rows * 16;  // row scales, 16 bytes (4 stages) a row, two groups
// The producer decodes (its row's raw words, the outputs and the fetch side's sources): more registers than the bf16
// kernel's copy-only producer (56 and 72 spilled), fewer for the consumers (2 x 64 accumulators at 128 pairs).
inline constexpr int kE4ProducerRegs = 80, kE4ConsumerRegs = 208;
static_assert(kE4ProducerRegs * kWgProducerThreads + kE4ConsumerRegs * kWgConsumerWarps * 32 <= 64 * 1024);

// A ring slot of a tile of NT pairs: the 128 rows' e4m3 weight planes (the raw FP4 rows land in the upper half,
// row m at kRawOff + 64 m, before the decode), the x tile as 8 e4m3 planes of NT pairs x 16 bytes, the rows'
// 2^(smax - 127) (f32) and the pairs' x scales; 4-byte row scales at kScOff + 4 m where K % 512 != 0. After the ring:
// the row-scale groups (K % 512 == 0), up's h staging and the peer's amax (two tiles), the magnitude table and the
// barriers (full, empty, 2 exchange).
template <int NT, bool UP>
struct E4Tile {
  static_assert(NT % 32 == 0 && NT >= 32 && NT <= kWgMaxTok);
  static constexpr int kAPlane = kE4Rows * 16;
  static constexpr int kRawOff = 4 * kAPlane;
  static constexpr int kPlane = NT * 16;
  static constexpr int kXOff = 8 * kAPlane;
  static constexpr int kXBytes = 8 * kPlane;
  static constexpr int kRsOff = kXOff + kXBytes;
  static constexpr int kXsOff = kRsOff + kE4Rows * 4;
  static constexpr int kScOff = kXsOff + NT * 4;
  static constexpr int kStage = (kScOff + kE4Rows * 4 + 127) / 128 * 128;
  static constexpr int kHBytes = UP ? NT * kE4HPitch * 2 + 2 * NT * 4 : 0;
  static constexpr int kLutBytes = static_cast<int>(sizeof(Lut));
  static constexpr int kStages = [] {
    int n = kE4MaxStages;
    while (n > 3 && n * kStage + kE4ScBytes + kHBytes + kLutBytes + (2 * n + 2) * 8 > kWgSmemMax) --n;
    return n;
  }();
  static constexpr int kScGroupOff = kStages * kStage;
  static constexpr int kHOff = kScGroupOff + kE4ScBytes;
  static constexpr int kAmaxOff = kHOff + NT * kE4HPitch * 2;
  static constexpr int kLutOff = kHOff + kHBytes;
  static constexpr int kBarOff = (kLutOff + kLutBytes + 7) / 8 * 8;
  static constexpr int kSmem = kBarOff + (2 * kStages + 2) * 8;
  // Stages of FP4 in flight ahead of the decode (at most kStages - 2: the decode of stage i - kLead comes before
  // stage i's slot is waited for, and the consumers need a decoded stage to free one).
  static constexpr int kLead = kStages >= 5 ? 3 : kStages - 2;
  // The row-scale groups (kScGroupOff: 2 x 4 stages) are overwritten 8 stages after they land and last read kLead + 3
  // after (kblocks % 4 == 0 where they are used, so a group never straddles tiles).
  static_assert(kLead <= 5);
  static_assert(kStage % 128 == 0 && kHOff % 16 == 0 && kSmem <= kWgSmemMax && kLead >= 1);
  static_assert(!UP || kAmaxOff + 2 * NT * 4 == kLutOff, "up: the h rows, then the peer's amax of two tiles");
};

struct E4Args {
  const ExpertDesc* experts;
  const int* jobs;
  const int* num_jobs;
  const int* tile_first;  // m-tiles of NT pairs before each job
  const uint8_t* a;       // e4m3 planes [K / 16][rows][16] (x for up, h for down)
  const float* as;        // their scales [K / 128][rows]
  int64_t rows;           // rows of a, as, hq and hs
  int64_t K, N;           // N: rows of one weight matrix (up: inter, down: D)
  int n_tiles;            // tiles along N (up: inter / 64, down: D / 128)
  float limit;
  uint8_t* hq;  // up: h's e4m3 planes [inter / 16][rows][16]
  float* hs;    // up: h's scales [inter / 128][rows]
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

// st.async of one 32-bit value into another block's shared memory (cluster address), completing `bytes` = 4 on that
// block's barrier (cluster address) as transaction bytes.
__device__ __forceinline__ void st_async_cluster(uint32_t addr, float v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(addr),
               "r"(__float_as_uint(v)), "r"(bar)
               : "memory");
}

// Up epilogue, thread n < NT of the consumers (pair n of the tile), after the staged h rows are complete: the pair's
// largest |h| over the block's 64 columns to the peer, then its half of the 128-column block as e4m3 planes with the
// scale of both halves' largest. hrow: the pair's 32 staged bf16 pairs; amax_in: this block's exchange slot (the
// peer's value lands there); xbar: its barrier (phase `parity`).
template <int NT>
__device__ __forceinline__ void e4_store_h(const uint4 (&hrow)[8], bool valid, int n, int n_tile, uint32_t rank,
                                           float* amax_in, uint64_t* xbar, uint32_t parity, const E4Args& a,
                                           int64_t row) {
  const float amax = valid ? bf16x8_amax(hrow) : 0.0f;
  const uint32_t peer = rank ^ 1u;
  st_async_cluster(cluster_smem_addr(amax_in + n, peer), amax, cluster_smem_addr(xbar, peer));
  if (n == 0) mbar_arrive_expect_tx(xbar, NT * 4);
  mbar_wait(xbar, parity);
  if (!valid) return;
  const int e = fp8_scale_exponent(fmaxf(amax, amax_in[n]));
  const float inv = ldexpf(1.0f, -e);
  // bf16 value at staged column c (0..63) of the row.
  auto at = [&](int c) -> float {
    const uint4& u = hrow[c >> 3];
    const int el = c & 7;
    const uint32_t word = el < 2 ? u.x : el < 4 ? u.y : el < 6 ? u.z : u.w;
    return __uint_as_float((el & 1) ? (word & 0xffff0000u) : (word << 16));
  };
  // This block's columns are physical 64 r .. 64 r + 63 of 128-column block b: planes 8 b + 4 r + 2 j + h.
  const int64_t b = n_tile >> 1, r = n_tile & 1;
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float q[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) q[i] = at(32 * j + e4_physical(h, i)) * inv;
      *reinterpret_cast<uint4*>(a.hq + ((8 * b + 4 * r + 2 * j + h) * a.rows + row) * 16) = e4m3x16(q);
    }
  if (r == 0) a.hs[b * a.rows + row] = ldexpf(1.0f, e);
}

// Persistent, as moe_grouped_wgmma_kernel: a unit is kCta n-tiles of one m-tile (one a cluster block), block b of the
// grid takes units b / kCta, + gridDim.x / kCta, ...; producer and consumers walk the same stages. kCta >= 2 for up
// (the h exchange).
template <bool UP, int NT, int kCta>
__global__ void __launch_bounds__(kWgThreads, 1) moe_grouped_e4m3_kernel(E4Args a) {
  grid_dependency_wait();  // the plan, the tile table and the activations are earlier kernels' outputs
  static_assert(kCta == 1 || kCta == 2);
  static_assert(!UP || kCta == 2, "the up kernel's h blocks span two n-tiles of a cluster");
  constexpr bool kMc = kCta > 1;
  using Tile = E4Tile<NT, UP>;
  constexpr int kStages = Tile::kStages, kLead = Tile::kLead;
  extern __shared__ __align__(128) uint8_t smem[];

  const int nj = *a.num_jobs;
  const int n_units = a.n_tiles / kCta;
  const int64_t units = nj == 0 ? 0 : static_cast<int64_t>(a.tile_first[nj]) * n_units;
  const int64_t unit0 = blockIdx.x / kCta, unit_step = gridDim.x / kCta;
  if (unit0 >= units) return;  // no unit for this block (uniform, and the same for every block of a cluster)
  const uint32_t rank = kMc ? cg::this_cluster().block_rank() : 0;
  const int64_t K = a.K;
  const int kblocks = static_cast<int>(K / kWgK);
  // Row scales 16 bytes (4 stages) at a time where rows of them are 16-byte aligned and tiles hold whole groups.
  const bool sc_groups = K % 512 == 0;

  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Tile::kBarOff);
  const BulkRing ring{bars, bars + kStages, kStages};
  uint64_t* xbar = bars + 2 * kStages;  // [2]: the h exchange, by tile parity
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem + Tile::kLutOff);
  if (tid < 2 * (kFoldMaxShift + 1)) lut[tid] = kLutDev.w[tid];
  if (tid == 0) {
    // full: each producer thread once its row is decoded, and the arming thread (the x planes' transaction bytes,
    // the planes the peers multicast included). empty: the consumer warps of every block of the cluster.
    ring.init(kWgConsumerWarps * kCta, kWgProducerThreads + 1);
    mbar_init(&xbar[0], 1);
    mbar_init(&xbar[1], 1);
    mbar_init_fence();
  }
  if constexpr (kMc)
    cg::this_cluster().sync();  // every block's barriers are initialised before any block's copies or arrivals
  else
    __syncthreads();

  if (warp >= kWgConsumerWarps) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kE4ProducerRegs));
    const int p = tid - kWgConsumerWarps * 32;
    const uint32_t smem0 = smem_addr(smem), lut0 = smem_addr(lut);
    const int64_t my_units = (units - unit0 + unit_step - 1) / unit_step;
    const int64_t total = my_units * kblocks;
    // The fetch side: unit fu, stage fkb, this thread's row sources.
    int64_t fu = unit0;
    int fkb = 0;
    // The FP4 copies: piece p % 4 (16 bytes) of tile rows p / 4 + 32 j (j < 4), matrix rows kStepW j apart (up: 32 tile
    // rows are 16 rows of one matrix; see wg_weight_row), so a warp writes 8 whole 64-byte rows: full sectors in L2 and
    // no bank conflicts. (Session 37's first form had thread p copy its own row: 32 rows x 16 bytes a warp instruction,
    // half of each sector a request, 49% excess sectors and 4-way conflicting shared writes in ncu.)
    constexpr int kStepW = UP ? 16 : 32;
    const uint8_t* wsrc = nullptr;
    const uint8_t* ssrc = nullptr;
    const float* xssrc = nullptr;
    const uint8_t* xsrc = nullptr;
    const auto start_unit = [&] {
      const WgTileAt tl = wg_tile_at(a, nj, fu, NT, n_units);
      const ExpertDesc& ed = a.experts[tl.e];
      const int n_tile = tl.n_tile * kCta + static_cast<int>(rank);
      int which;
      const int64_t wrow = wg_weight_row<UP, kE4Rows>(p >> 2, n_tile, a.N, which);
      wsrc = static_cast<const uint8_t*>(ed.w[which]) + wrow * (K / 2) + (p & 3) * 16;
      const int64_t srow = wg_weight_row<UP, kE4Rows>(p, n_tile, a.N, which);
      ssrc = static_cast<const uint8_t*>(ed.s[which]) + srow * (K / 32);
      xssrc = a.as + tl.first + tl.row0 + (p < NT ? p : 0);
      xsrc = a.a + (tl.first + tl.row0) * static_cast<int64_t>(16);  // plane 0's first pair of the tile
    };
    start_unit();
    RingCursor fc, dc;
    for (int64_t i = 0; i < total + kLead; ++i) {
      if (i >= kLead) {
        // Decode stage i - kLead (its copies were group i - kLead of each producer thread; kLead - 1 newer may fly):
        // every thread's copies of the stage have landed after the barrier.
        cp_async_wait<kLead - 1>();
        named_bar_sync(2, kWgProducerThreads);
        const uint32_t st = smem0 + dc.slot * Tile::kStage;
        uint4 raw[4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {  // block j = (jj + p / 2) % 4: 8 consecutive rows hit distinct banks
          const int j = (jj + (p >> 1)) & 3;
          raw[jj] = lds128_at(st + Tile::kRawOff + p * 64 + 16 * j);
        }
        const int64_t di = i - kLead;
        const uint32_t sc = sc_groups ? lds32_at(smem0 + Tile::kScGroupOff + ((di >> 2) & 1) * (kE4Rows * 16) + p * 16 +
                                                 4 * (di & 3))
                                      : lds32_at(st + Tile::kScOff + 4 * p);
        const uint32_t smax = max(max(sc & 0xffu, (sc >> 8) & 0xffu), max((sc >> 16) & 0xffu, sc >> 24));
        named_bar_sync(2, kWgProducerThreads);  // every row's raw bytes are read: the planes may overwrite them
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int j = (jj + (p >> 1)) & 3;
          const uint32_t d = min(smax - ((sc >> (8 * j)) & 0xffu), static_cast<uint32_t>(kFoldMaxShift));
          const uint2 l = lds64_at(lut0 + 8 * d);
          uint32_t lo[4], hi[4];
          e2m1x8_to_e4m3(raw[jj].x, l.x, l.y, lo[0], hi[0]);
          e2m1x8_to_e4m3(raw[jj].y, l.x, l.y, lo[1], hi[1]);
          e2m1x8_to_e4m3(raw[jj].z, l.x, l.y, lo[2], hi[2]);
          e2m1x8_to_e4m3(raw[jj].w, l.x, l.y, lo[3], hi[3]);
          sts128_at(st + (2 * j) * Tile::kAPlane + p * 16, make_uint4(lo[0], lo[1], lo[2], lo[3]));
          sts128_at(st + (2 * j + 1) * Tile::kAPlane + p * 16, make_uint4(hi[0], hi[1], hi[2], hi[3]));
        }
        sts32_at(st + Tile::kRsOff + 4 * p, __float_as_uint(e8m0_to_f32(static_cast<uint8_t>(smax))));
        fence_proxy_async_smem();  // the planes (generic stores) before the consumers' wgmma reads them
        mbar_arrive(&ring.full[dc.slot]);
        dc.next(kStages);
      }
      if (i < total) {
        // Fetch stage i: the slot, the x planes (bulk, counted as transaction bytes), this row's FP4 bytes and
        // scales and pair p's x scale (cp.async, this thread's group i).
        ring.wait_free_at(fc.slot, fc.parity);
        const uint32_t st = smem0 + fc.slot * Tile::kStage;
        uint64_t* full = &ring.full[fc.slot];
        wg_load_x_planes<8, kCta>(
            p, rank, full, Tile::kPlane, [&](int q) { return smem + fc.slot * Tile::kStage + Tile::kXOff + q * Tile::kPlane; },
            [&](int q) { return xsrc + (8 * static_cast<int64_t>(fkb) + q) * a.rows * 16; });
#pragma unroll
        for (int j = 0; j < 4; ++j)
          cp_async16_l2(st + Tile::kRawOff + ((p >> 2) + 32 * j) * 64 + (p & 3) * 16,
                        wsrc + static_cast<int64_t>(kStepW) * j * (K / 2) + 64 * fkb, 16, a.l2_hint);
        if (sc_groups) {
          if ((fkb & 3) == 0)
            cp_async16_l2(smem0 + Tile::kScGroupOff + ((i >> 2) & 1) * (kE4Rows * 16) + p * 16, ssrc + 4 * fkb, 16, 0);
        } else {
          cp_async_at<4>(st + Tile::kScOff + 4 * p, ssrc + 4 * fkb, true);
        }
        if (p < NT) cp_async_at<4>(st + Tile::kXsOff + 4 * p, xssrc + static_cast<int64_t>(fkb) * a.rows, true);
        fc.next(kStages);
        if (++fkb == kblocks) {
          fkb = 0;
          fu += unit_step;
          if (fu < units) start_unit();
        }
      }
      cp_async_commit();  // group i (empty past the last stage: the wait above counts one group an iteration)
    }
    cp_async_wait<0>();
    if constexpr (kMc) cg::this_cluster().sync();  // the consumers' end (below)
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kE4ConsumerRegs));
  // Consumers. Thread (wg, warp w, g, t) holds tile rows 64 wg + 16 w + g and + 8, pairs 8 jj + 2 t + e2.
  const int wg = warp >> 2, w = warp & 3, g = lane >> 2, t = lane & 3;
  const int row_lo = 64 * wg + 16 * w + g;
  const uint32_t smem0 = smem_addr(smem);

  float acc[NT / 2], fr[NT / 2];
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) fr[i] = 0.0f;  // (scale-d 0 ignores them; defined values only)
  RingCursor c;
  int tiles_done = 0;
  for (int64_t u = unit0; u < units; u += unit_step, ++tiles_done) {
    const WgTileAt tl = wg_tile_at(a, nj, u, NT, n_units);
    const int n_tile = tl.n_tile * kCta + static_cast<int>(rank), row0 = tl.row0, first = tl.first, count = tl.count;
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) acc[i] = 0.0f;
    for (int kb = 0; kb < kblocks; ++kb, c.next(kStages)) {
      // The stage's four k32 wgmmas into the fresh set, waited for; then acc += fresh x 2^(smax - 127) of the row x
      // the pair's x scale, and the slot is free. The other warpgroup's MMAs run under this one's promotion.
      ring.wait_full_at(c.slot, c.parity);
      const uint32_t st = smem0 + c.slot * Tile::kStage;
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint64_t da = wg_desc(st + 2 * j * Tile::kAPlane + wg * (64 * 16), Tile::kAPlane, 128);
        const uint64_t db = wg_desc(st + Tile::kXOff + 2 * j * Tile::kPlane, Tile::kPlane, 128);
        wgmma_ss_k32_e4m3<NT>(fr, da, db, j > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_pin(fr);
      const float r0 = __uint_as_float(lds32_at(st + Tile::kRsOff + 4 * row_lo));
      const float r1 = __uint_as_float(lds32_at(st + Tile::kRsOff + 4 * (row_lo + 8)));
#pragma unroll
      for (int jj = 0; jj < NT / 8; ++jj) {
        const uint2 xs = lds64_at(st + Tile::kXsOff + 4 * (8 * jj + 2 * t));
        const float x0 = __uint_as_float(xs.x), x1 = __uint_as_float(xs.y);
        acc[4 * jj + 0] = fmaf(fr[4 * jj + 0] * r0, x0, acc[4 * jj + 0]);
        acc[4 * jj + 1] = fmaf(fr[4 * jj + 1] * r0, x1, acc[4 * jj + 1]);
        acc[4 * jj + 2] = fmaf(fr[4 * jj + 2] * r1, x0, acc[4 * jj + 2]);
        acc[4 * jj + 3] = fmaf(fr[4 * jj + 3] * r1, x1, acc[4 * jj + 3]);
      }
      if constexpr (kMc)
        ring.release_cluster_at(c.slot, rank, kCta);
      else
        ring.release_at(c.slot);
    }

    if constexpr (UP) {
      uint16_t* hst = reinterpret_cast<uint16_t*>(smem + Tile::kHOff);
      named_bar_sync(1, kWgConsumerWarps * 32);  // the previous tile's staged rows are read
      const int col = 8 * (4 * wg + w) + g;
#pragma unroll
      for (int jj = 0; jj < NT / 8; ++jj)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          const float gate = acc[4 * jj + e2], up = acc[4 * jj + 2 + e2];
          const float v = siluf_(fminf(gate, a.limit)) * fminf(fmaxf(up, -a.limit), a.limit);
          hst[(8 * jj + 2 * t + e2) * kE4HPitch + col] = static_cast<uint16_t>(pack_bf16(v, 0.0f) & 0xffffu);
        }
      named_bar_sync(1, kWgConsumerWarps * 32);  // every pair's 64 columns are staged
      if (tid < NT) {
        uint4 hrow[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) hrow[q] = lds128(hst + tid * kE4HPitch + 8 * q);
        const int buf = tiles_done & 1;
        e4_store_h<NT>(hrow, row0 + tid < count, tid, n_tile, rank,
                       reinterpret_cast<float*>(smem + Tile::kAmaxOff) + buf * NT, &xbar[buf],
                       static_cast<uint32_t>((tiles_done >> 1) & 1), a, first + row0 + tid);
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t col = static_cast<int64_t>(n_tile) * kE4Rows + row_lo + 8 * h;
#pragma unroll
        for (int jj = 0; jj < NT / 8; ++jj)
#pragma unroll
          for (int e2 = 0; e2 < 2; ++e2) {
            const int r = row0 + 8 * jj + 2 * t + e2;
            if (r < count) a.y[static_cast<int64_t>(first + r) * a.N + col] = acc[4 * jj + 2 * h + e2];
          }
      }
    }
  }
  grid_dependents_launch();  // this block's tiles are done: the next kernel may be scheduled
  // The peers' consumers may still arrive on this block's barriers: no block leaves before all are done.
  if constexpr (kMc) cg::this_cluster().sync();
}

template <bool UP, int NT, int kCta>
void launch_e4m3_as(const E4Args& a, int64_t m_tiles_bound, cudaStream_t stream) {
  constexpr int kSmem = E4Tile<NT, UP>::kSmem;
  static const int64_t resident = wg_resident_blocks(moe_grouped_e4m3_kernel<UP, NT, kCta>, kSmem, kCta);
  TERN_CHECK(resident > 0, "moe_grouped_e4m3_kernel: no ", kCta, "-block cluster of ", kSmem,
             " bytes of shared memory fits (cudaOccupancyMaxActiveClusters)");
  const int64_t blocks = std::min<int64_t>(m_tiles_bound * a.n_tiles, resident) / kCta * kCta;
  if (blocks == 0) return;
  LaunchShape shape{dim3(static_cast<unsigned>(blocks)), dim3(kWgThreads), kSmem, stream};
  shape.cluster_x = kCta > 1 ? kCta : 0;
  launch(shape, moe_grouped_e4m3_kernel<UP, NT, kCta>, a);
}

template <bool UP, int NT>
void launch_e4m3(const E4Args& a, int64_t m_tiles_bound, int cta, cudaStream_t stream) {
  if constexpr (UP) {
    launch_e4m3_as<UP, NT, 2>(a, m_tiles_bound, stream);  // at least 2 (the h exchange)
  } else {
    if (cta == 2)
      launch_e4m3_as<UP, NT, 2>(a, m_tiles_bound, stream);
    else
      launch_e4m3_as<UP, NT, 1>(a, m_tiles_bound, stream);
  }
}

template <int NT>
void launch_up_down(const MoeParams& p, const MoeGroupedBuffers& b, int64_t rows, cudaStream_t stream) {
  const int64_t P = p.T * p.k;
  const int64_t m_bound = (P + NT - 1) / NT + std::min<int64_t>(P, p.E);
  // x's e4m3 planes and scales in the x buffer (rows x D x 2 bytes), h's in the h buffer (rows x inter x 2).
  auto* xq = reinterpret_cast<uint8_t*>(b.xs);
  auto* hq = reinterpret_cast<uint8_t*>(b.h);
  float* hs = reinterpret_cast<float*>(hq + rows * p.inter);
  const int up_tiles = static_cast<int>(p.inter / (kE4Rows / 2)), down_tiles = static_cast<int>(p.D / kE4Rows);
  E4Args a{p.experts, b.jobs, b.num_jobs, b.tile_first, xq, reinterpret_cast<const float*>(xq + rows * p.D), rows,
           p.D, p.inter, up_tiles, p.limit, hq, hs, b.y, moe_l2_hint()};
  // The up kernel runs as clusters of at least 2 (its h blocks span n-tiles 2q, 2q + 1; up_tiles is even).
  launch_e4m3<true, NT>(a, m_bound, std::max(2, moe_grouped_wgmma_cluster(up_tiles)), stream);
  a.a = hq;
  a.as = hs;
  a.K = p.inter;
  a.N = p.D;
  a.n_tiles = down_tiles;
  launch_e4m3<false, NT>(a, m_bound, moe_grouped_wgmma_cluster(down_tiles), stream);
}

}  // namespace
}  // namespace dev

const char* moe_grouped_e4m3_refusal(const MoeParams& p) {
  if (p.kind != WeightFormat::mxfp4 || p.scale_f32) return "experts not MXFP4 with e8m0 scales";
  if (!p.act_fp8) return "activations not fp8";
  if (p.D % 128 != 0 || p.inter % 128 != 0) return "a shape it does not take";
  if (!p.experts_aligned) return "unaligned experts";
  if (!p.e4m3_fold_ok) return "scales that do not fold (more than 2^8 apart in 128 columns)";
  return nullptr;
}

int moe_grouped_e4m3_tile_pairs(const MoeParams& p) {
  const int n = moe_grouped_wgmma_tile_pairs(p);
  return n > 96 ? 128 : n;  // the bf16 kernel's rule (TERN_MOE_WGMMA_N included); 112 is not built here
}

std::string moe_grouped_e4m3_path_name(const MoeParams& p) {
  const int n = moe_grouped_e4m3_tile_pairs(p);
  return std::string("moe_grouped_e4m3_kernel mxfp4 128x") +
         (n == 0 ? std::string("{32,64,96,128} by pairs per expert") : std::to_string(n)) +
         " (wgmma e4m3 from shared memory, fp4 decoded to e4m3 by the producer warpgroup with the MXFP4 scales folded "
         "per 128 columns, x and h e4m3 1x128, one promotion a stage under the next stage's MMAs, h quantised in the up "
         "kernel across 2-block clusters)";
}

void launch_moe_grouped_e4m3(const MoeParams& p, const MoeGroupedBuffers& b, cudaStream_t stream) {
  const int64_t P = p.T * p.k, rows = moe_grouped_rows(p);
  if (P == 0) return;
  const int nt = moe_grouped_e4m3_tile_pairs(p);
  auto* xq = reinterpret_cast<uint8_t*>(b.xs);
  launch(dev::moe_e4m3_gather_kernel, dev::grid_stride_blocks((p.D / dev::kWgK) * P * 4), 256, 0, stream, p.x,
         b.sorted, P, p.k, p.D, rows, xq, reinterpret_cast<float*>(xq + rows * p.D));
  launch_moe_grouped_tiles(b.jobs, b.num_jobs, nt, b.tile_first, stream);
  switch (nt) {
    case 32:
      dev::launch_up_down<32>(p, b, rows, stream);
      break;
    case 64:
      dev::launch_up_down<64>(p, b, rows, stream);
      break;
    case 96:
      dev::launch_up_down<96>(p, b, rows, stream);
      break;
    default:
      dev::launch_up_down<128>(p, b, rows, stream);
      break;
  }
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
