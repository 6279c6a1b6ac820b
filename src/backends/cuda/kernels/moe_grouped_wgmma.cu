// The wgmma (sm_90a warpgroup MMA) form of the grouped FP4 expert GEMMs (moe_grouped_wgmma.cuh): the same
// plan, tile table scheme, SwiGLU and combine as moe_grouped.cu, with the products transposed (D^T = W x^T)
// so that the FP4 weights, decoded in registers, are wgmma's A operand (A may come from registers, B only
// from shared memory) and the pairs' activations are B, read by the tensor cores straight from shared memory.
//
// Persistent blocks (one a multiprocessor, tiles b, b + grid, ...; the ring runs on across tiles, so a tile's
// first copies overlap the previous tile's epilogue). Block: 2 consumer warpgroups (warps 0..7, setmaxnreg
// 232) and a producer warpgroup (warps 8..11, setmaxnreg 40). A tile is 256 weight rows x NT pairs of one
// expert (NT = 32, 64, 96 or 128 from the mean pairs per expert; 112 too by TERN_MOE_WGMMA_N); warpgroup wg owns
// weight rows 128 wg .. 128 wg + 127 as two m64 slabs (mt = 0, 1), each against all NT pairs (wgmma
// m64nNTk16, NT/2 f32 accumulators a slab a thread). K = 128 columns a stage; a ring slot (WgTile) holds the
// 256 rows' FP4 bytes (16 KB), their scale bytes (4 e8m0 or 8 ue4m3 a row) and the x tile (NT pairs x 128
// bf16 as 16 planes), on a 3- or 4-deep mbarrier ring (WgTile::kStages; bulk_pipe.cuh's BulkRing). The
// FP4 rows (64 bytes a row a stage, 2 KB apart in global memory) and the scales go by cp.async from all 128
// producer threads (16 bytes a thread and row piece, as the mma.sync kernels load them; each thread arrives
// on the slot's full barrier through cp.async.mbarrier.arrive.noinc once its copies land), the x planes by
// 16 bulk copies (NT x 16 contiguous bytes each) counted as transaction bytes; by default 2 blocks form a cluster
// over n-tiles of one m-tile and each copies half the planes into both (multicast; see the kernel). The consumers
// read everything of a stage from shared memory: no global loads in the K loop.
//
// Pipeline (the kernel's comment has the details): two wgmma groups in flight, one k-step (16 columns, both
// slabs) a group; the FP4 decode of k-step s + 1 into the second set of A registers runs while group s does;
// a slot is released one k-step into the next stage, never by draining; only a tile's end drains.
//
// Session 9's first version (27 ms a layer at 8K, 3x the mma.sync kernel) drained the wgmma pipeline every
// stage, copied the FP4 rows as 256 bulk copies of 64 bytes a stage from one producer warp and read the
// scales from global memory in the K loop.
//
// Activation layout ("planes"): the gather (and the up kernel, for h) store a [rows, K] bf16 matrix as
// K/8 planes of [rows][8]: element (r, c) at ((c / 8) * rows + r) * 8 + c % 8, where c is the STORED column.
// Then the NT pairs x 8 columns of one plane are one contiguous run of NT x 16 bytes (one bulk copy for any
// first pair), and in shared memory plane c of the stage sits at c * NT * 16: core matrices (8 pairs x 16
// bytes) are contiguous 128-byte blocks, 128 bytes apart along N (the descriptor's stride byte offset) and
// NT * 16 bytes apart along K (leading byte offset): the no-swizzle K-major layout. rows = P + kWgMaxTok: a
// tile's last pairs may run past P (their columns of D are never stored; column n of D^T depends only on pair
// n, so whatever those rows hold cannot reach a stored value).
//
// K order. wgmma's A fragment is the mma.m16n8k16 one (per warp, its 16-row slab): lane (g, t) holds in reg
// 0 / 1 rows g / g+8 at k slots 2t, 2t+1, in reg 2 / 3 the same rows at slots 2t+8, 2t+9. A lane decodes its
// own 16 contiguous FP4 bytes of each row (physical columns 32t .. 32t+31 of the stage): k-step s takes word
// s/2, nibble pair 2(s%2) for slots 2t, 2t+1 and pair 2(s%2)+1 for 2t+8, 2t+9 (mma_tile.cuh's e2m1x2
// decoders: pair i = nibbles i, i+4). So stored column 16 s + 8 q + 2 t + j of a 128-column block holds
// physical column 32 t + 8 (s/2) + 2 (s%2) + q + 4 j (wg_physical), and B's k slots follow the stored order.
//
// Up: slab row 16 sigma + r (sigma = 4 (2 wg + mt) + warp) is w1 row (r < 8) or w3 row (r >= 8) number
// n_tile * 128 + 8 sigma + r % 8, so a thread's accumulators of rows g and g+8 are gate and up of one h
// column and SwiGLU runs in registers. Down: slab rows are w2 rows n_tile * 256 + row.
// Weights enter as W * 2^-16 (mma_tile.cuh) and the sums are scaled by 2^16 and NVFP4's global scales.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>

#include "backends/cuda/kernels/act_quant.cuh"
#include "backends/cuda/kernels/bulk_pipe.cuh"
#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/mma_tile.cuh"
#include "backends/cuda/kernels/moe_grouped.cuh"
#include "backends/cuda/kernels/moe_grouped_wgmma.cuh"
#include "backends/cuda/kernels/moe_grouped_wgmma_impl.cuh"
#include "backends/cuda/kernels/wgmma.cuh"
#include "core/env.h"
#include "core/error.h"

namespace tern::cuda {
namespace dev {
namespace {
namespace cg = cooperative_groups;

inline constexpr int kWgWBytes = kWgRows * kWgK / 2;  // 16 KB of FP4 a stage
inline constexpr int kWgProducerRegs = 40, kWgConsumerRegs = 232;  // 128 x 40 + 256 x 232 <= 64 K

// Stored position p (0..127) of a 128-column block -> the physical column it holds, and the inverse.
__host__ __device__ inline constexpr int wg_physical(int p) {
  const int s = p >> 4, q = (p >> 3) & 1, t = (p >> 1) & 3, j = p & 1;
  return 32 * t + 8 * (s >> 1) + 2 * (s & 1) + q + 4 * j;
}
__host__ __device__ inline constexpr int wg_stored(int c) {
  const int t = c >> 5, a = (c >> 3) & 3, j = (c >> 2) & 1, b = (c >> 1) & 1, q = c & 1;
  return 16 * (2 * a + b) + 8 * q + 2 * t + j;
}
__host__ __device__ constexpr bool wg_permutation_ok() {
  for (int p = 0; p < 128; ++p)
    if (wg_stored(p) < 0 || wg_stored(p) > 127 || wg_physical(wg_stored(p)) != p ||
        wg_stored(wg_physical(p)) != p)
      return false;
  // The decode: k-step s, lane t, slot pair q (0: 2t,2t+1; 1: 2t+8,2t+9), half j reads nibble 2(s%2) + q + 4j
  // of word s/2 of the lane's 16 bytes, i.e. physical column 32t + 8(s/2) + 2(s%2) + q + 4j.
  for (int s = 0; s < 8; ++s)
    for (int t = 0; t < 4; ++t)
      for (int q = 0; q < 2; ++q)
        for (int j = 0; j < 2; ++j)
          if (wg_physical(16 * s + 8 * q + 2 * t + j) != 32 * t + 8 * (s / 2) + 2 * (s % 2) + q + 4 * j)
            return false;
  return true;
}
static_assert(wg_permutation_ok());

// A producer thread's share of a tile's FP4 rows and scale bytes, stage after stage.
// Producer thread p: 16-byte piece p % 4 of tile rows p / 4 + 32 j (j < 8) and the scale bytes (kScaleBytes a row
// and 128 columns: 4 e8m0, or 8 ue4m3) of rows p and p + 128. A thread's rows all come from one matrix (up: bit 3
// of the tile row picks w1 or w3, and 32 j / 128 j leave it alone). Tile rows m and m + 32 j (up: m + 16 j... see
// wg_weight_row: 32 tile rows are 16 rows of one matrix) are matrix rows row(m) + kStep j; down's last n-tile may
// run past N (D % 256 == 128): those rows are zero-filled (src-size 0) and their outputs never stored.
template <bool UP, int kScaleBytes>
struct WgWeightCopier {
  static constexpr int kStepW = UP ? 16 : 32, kStepS = UP ? 64 : 128;
  const uint8_t* wsrc;
  const uint8_t* ssrc;
  int row_w, row_s, prow, piece, p, l2_hint;
  int64_t N, w_row_bytes, s_row_bytes;
  __device__ __forceinline__ WgWeightCopier(const ExpertDesc& ed, int p_, int n_tile, int64_t N_, int64_t K,
                                            int l2_hint_)
      : p(p_), l2_hint(l2_hint_), N(N_), w_row_bytes(K / 2), s_row_bytes(K * kScaleBytes / kWgK) {
    prow = p >> 2, piece = p & 3;
    int which_w, which_s;
    row_w = static_cast<int>(wg_weight_row<UP>(prow, n_tile, N, which_w));
    row_s = static_cast<int>(wg_weight_row<UP>(p, n_tile, N, which_s));
    wsrc = static_cast<const uint8_t*>(ed.w[which_w]) + row_w * w_row_bytes + piece * 16;
    ssrc = static_cast<const uint8_t*>(ed.s[which_s]) + row_s * s_row_bytes;
  }
  // The stage at shared address st: row m's 64 bytes at st + m * row_pitch, its scale bytes at st + sc_off + 8 m
  // (unless `scales` is false: scale_group copied them); then the sources move on by 128 columns. The caller arrives
  // on the stage's barrier after.
  __device__ __forceinline__ void stage(uint32_t st, int row_pitch, int sc_off, bool scales = true) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const bool ok = UP || row_w + kStepW * j < N;
      cp_async16_l2(st + (prow + 32 * j) * row_pitch + piece * 16, ok ? wsrc + kStepW * j * w_row_bytes : wsrc,
                    ok ? 16 : 0, l2_hint);
    }
    if (scales) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const bool ok = UP || row_s + kStepS * j < N;
        cp_async_at<kScaleBytes>(st + sc_off + (p + 128 * j) * 8, ok ? ssrc + kStepS * j * s_row_bytes : ssrc, ok);
      }
    }
    wsrc += kWgK / 2;
    ssrc += kScaleBytes;
  }
  // Stages per scale group: 16 bytes of a row's scales.
  static constexpr int kGroupStages = 16 / kScaleBytes;
  // The scale bytes of the next kGroupStages stages at once (call before stage(), at a group's first stage; a row's
  // scale bytes a multiple of 16): rows m = p, p + 128 at dst + 16 m. One 16-byte copy a row where stage() makes
  // kGroupStages copies of 4 or 8 bytes, each a whole 32-byte sector in L2 (session 36's ncu: 28% excess sectors).
  __device__ __forceinline__ void scale_group(uint32_t dst) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const bool ok = UP || row_s + kStepS * j < N;
      cp_async16_l2(dst + (p + 128 * j) * 16, ok ? ssrc + kStepS * j * s_row_bytes : ssrc, ok ? 16 : 0, 0);
    }
  }
};

// Where a finished tile goes (the epilogues; accumulator i of slab mt: tile row 16 w + g + 8 ((i / 2) %
// 2), pair 8 (i / 4) + 2 t + i % 2; rows g, g + 8 of the thread's slab are mrow[mt][0], mrow[mt][1]).
struct WgTileOut {
  int wg, w, g, t, tid;
  int n_tile, first, row0, count;
};

// The up epilogue's h staging: the tile's 16 planes (wg_store_h).
template <int NT>
inline constexpr int kWgHStageBytes = 16 * NT * 16;

// Up: SwiGLU of the w1 (x m1) and w3 (x m3) sums, clamped by `limit`, into h's bf16 planes ([inter / 8][rows][8],
// the stored K order of wg_stored). The block's 128 h columns are one 128-column block of h (inter % 128 == 0),
// i.e. 16 planes x NT pairs x 16 bytes, each plane one contiguous run in h: staged in shared memory at `hs` (a
// thread's values are single bf16 scattered over 4 planes; kWgHStageBytes) and written as 16-byte rows, valid pairs
// only.
template <int NT>
__device__ __forceinline__ void wg_store_h(const float (&acc)[2][NT / 2], float m1, float m3, float limit,
                                           uint16_t* hs, uint16_t* h, int64_t rows, const WgTileOut& o) {
  // A thread's h column 8 sigma + g (sigma = 4 (2 wg + mt) + w) lies in plane wg_stored(...) / 8 = 2 (2 w + b) + q
  // (b, q: bits 1, 0 of g). (Session 35 staged the planes in two halves of 8, each by the warps that hold it, to
  // leave the ring room: slower, session 36.)
  named_bar_sync(1, kWgConsumerWarps * 32);  // every consumer thread is done copying out the previous tile's h
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int p = wg_stored(8 * (4 * (2 * o.wg + mt) + o.w) + o.g);
    uint16_t* hp = hs + (p >> 3) * NT * 8 + (p & 7);
#pragma unroll
    for (int j = 0; j < NT / 8; ++j)
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) {
        const float gate = acc[mt][4 * j + e2] * m1, up = acc[mt][4 * j + 2 + e2] * m3;
        const float v = siluf_(fminf(gate, limit)) * fminf(fmaxf(up, -limit), limit);
        hp[(8 * j + 2 * o.t + e2) * 8] = static_cast<uint16_t>(pack_bf16(v, 0.0f) & 0xffffu);
      }
  }
  named_bar_sync(1, kWgConsumerWarps * 32);  // both consumer warpgroups' rows are staged
  const uint4* src = reinterpret_cast<const uint4*>(hs);
  for (int i = o.tid; i < 16 * NT; i += kWgConsumerWarps * 32) {
    const int plane = i / NT, n = i - plane * NT;
    if (o.row0 + n < o.count)
      *reinterpret_cast<uint4*>(h + ((static_cast<int64_t>(o.n_tile) * 16 + plane) * rows + o.first + o.row0 + n) * 8) =
          src[i];
  }
}

// Down: y[first + pair, column] = sum x m2 for the tile's columns below N and its valid pairs.
template <int NT>
__device__ __forceinline__ void wg_store_y(const float (&acc)[2][NT / 2], float m2, float* y, int64_t N,
                                           const int (&mrow)[2][2], const WgTileOut& o) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t col = static_cast<int64_t>(o.n_tile) * kWgRows + mrow[mt][h];
      if (col >= N) continue;
#pragma unroll
      for (int j = 0; j < NT / 8; ++j)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          const int r = o.row0 + 8 * j + 2 * o.t + e2;
          if (r < o.count) y[static_cast<int64_t>(o.first + r) * N + col] = acc[mt][4 * j + 2 * h + e2] * m2;
        }
    }
}

// A stage of a tile of NT pairs: the 256 rows' FP4 bytes (row m at 64 m), their scale bytes (row m at 8 m: 4
// e8m0 or 8 ue4m3 a row), then the x (h) tile as 16 planes of NT pairs x 8 bf16. 4 stages, 3 where the up
// kernel's h staging (the whole tile at once) leaves no room for the fourth (128 pairs). Session 36 (H100, one
// machine): a ring as deep as shared memory allows (6 stages at 32 / 64 pairs, 4 at 128) with h staged in halves was
// slower (8K up kernel at 128 pairs 4 131-4 151 us a layer against 3 968; 2K at 64 pairs 1 971 against 1 948; the
// down kernels equal): the halves leave half the warps idle in the epilogue and deeper rings bought no wait.
template <int NT, bool UP>
struct WgTile {
  static_assert(NT % 8 == 0 && NT >= 32 && NT <= kWgMaxTok);
  static constexpr int kPlane = NT * 16;
  static constexpr int kScOff = kWgWBytes;
  static constexpr int kXOff = kWgWBytes + kWgRows * 8;
  static constexpr int kXBytes = NT * kWgK * 2;
  static constexpr int kStage = kXOff + kXBytes;
  static constexpr int kHBytes = UP ? kWgHStageBytes<NT> : 0;  // up: h staging, the 16 planes
  static constexpr int kScGroupBytes = 2 * kWgRows * 16;  // TERN_MOE_SCALE_GROUPS: two groups of 16 bytes a row
  static constexpr int kStages = [] {
    int n = 4;
    while (n > 3 && n * kStage + 2 * n * 8 + kHBytes + kScGroupBytes > kWgSmemMax) --n;
    return n;
  }();
  static constexpr int kHStage = kStages * kStage + 2 * kStages * 8;  // after the ring and its barriers
  static constexpr int kScGroupOff = kHStage + kHBytes;
  static constexpr int kSmem = kScGroupOff + kScGroupBytes;
  static_assert(kStage % 128 == 0 && kHStage % 16 == 0 && kScGroupOff % 16 == 0 && kSmem <= kWgSmemMax);
  // A scale group's slot is refilled at the first stage of the group after next, once that stage's slot is free, i.e.
  // once the consumers released the stage kStages before it and so read the scales of the one after that (load_stage
  // runs a stage ahead): that is past the group's last stage while kStages <= stages a group + 2 (NVFP4: 2 + 2).
  static_assert(kStages <= 16 / 8 + 2);
};


// d[64 x N] += A[64 x 16] (registers, bf16) * B[16 x N] (shared memory, K-major, descriptor): scale-d 1,
// no negation, B not transposed.
template <int N>
__device__ __forceinline__ void wgmma_k16(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc);
template <>
__device__ __forceinline__ void wgmma_k16<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_k16<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%"
      "27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_k16<96>(float (&d)[48], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %53, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%"
      "27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, "
      "{%48,%49,%50,%51}, %52, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_k16<112>(float (&d)[56], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %61, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n112k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%"
      "27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%"
      "52,%53,%54,%55}, {%56,%57,%58,%59}, %60, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_k16<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%"
      "27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%"
      "52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

struct WgArgs {
  const ExpertDesc* experts;
  const int* jobs;
  const int* num_jobs;
  const int* tile_first;  // m-tiles of NT pairs before each job
  const uint16_t* a;      // planes [K/8][rows][8] (gathered x for up, h for down)
  int64_t rows;           // rows of a and h
  int64_t K, N;           // N: rows of one weight matrix (up: inter, down: D)
  int n_tiles;
  float limit;
  uint16_t* h;  // up: planes [inter/8][rows][8]
  float* y;     // down: [P, D] by sorted slot
  int l2_hint;  // the weight copies' L2 prefetch size (moe_l2_hint)
  int sc_groups = 0;  // the row scales 16 bytes a row at a time (TERN_MOE_SCALE_GROUPS; a row's scale bytes % 16 == 0)
};

// xw = the pairs' x as bf16 planes, stored K order. One thread per (128-column block, slot, lane t of the
// decode): the 32 physical columns 32t .. 32t+31 become one 32-bit word (stored j = 0, 1) in each of the
// block's 16 planes; 4 consecutive threads fill 16 bytes of a plane row, 8 slots of a warp 128 contiguous
// bytes.
__global__ void moe_grouped_wgmma_gather_kernel(const float* x, const int* sorted, int64_t P, int k,
                                                int64_t D, int64_t rows, uint16_t* xw) {
  pdl_prologue();
  const int64_t n = (D / kWgK) * P * 4;
  uint32_t* out = reinterpret_cast<uint32_t*>(xw);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(i & 3);
    const int64_t sb = i >> 2, kb = sb / P, slot = sb - kb * P;
    // Slots past the plan's pairs (a pair with an invalid expert) are never stored from; stale sorted[].
    const int pair = sorted[slot];
    const bool valid = pair >= 0 && pair < P;
    const float4* src = reinterpret_cast<const float4*>(x + static_cast<int64_t>(valid ? pair / k : 0) * D +
                                                        kb * kWgK + 32 * t);
    float v[32];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const float4 f = valid ? src[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
    }
    // Physical 32t + 8a + 4j + 2b + q -> stored 16(2a + b) + 8q + 2t + j: plane 2(2a + b) + q, word t.
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int64_t plane = kb * 16 + 2 * (2 * a + b) + q;
          out[(plane * rows + slot) * 4 + t] = pack_bf16(v[8 * a + 2 * b + q], v[8 * a + 4 + 2 * b + q]);
        }
  }
}

// One warp: tile_first[j] = sum over jobs i < j of ceil(count_i / bm); tile_first[num_jobs] = the total.
__global__ void moe_grouped_wgmma_tiles_kernel(const int* jobs, const int* num_jobs, int bm,
                                               int* tile_first) {
  pdl_prologue();
  const int nj = *num_jobs, lane = threadIdx.x;
  int base = 0;
  for (int j0 = 0; j0 < nj; j0 += 32) {
    const int j = j0 + lane;
    const int m = j < nj ? (jobs[3 * j + 2] + bm - 1) / bm : 0;
    int incl = m;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (j < nj) tile_first[j] = base + incl - m;
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) tile_first[nj] = base;
}


// Persistent: block b takes tiles b, b + gridDim.x, ... Producer and consumers walk the same tiles and stages
// (one RingCursor over the whole walk), so the copies of a tile's first stages overlap the previous epilogue.
//
// The consumers' K loop keeps two wgmma groups in flight and never drains inside a tile: k-step s (16
// columns) is one group (both slabs' m64nNTk16, A = fragments af[s % 2]); right after committing it the
// warpgroup waits for group s - 1 only (wgmma.wait_group 1), whose A registers af[(s + 1) % 2] are then free,
// and decodes k-step s + 1 into them while group s runs. The next stage's raw FP4 words and scale
// multipliers are read from its ring slot at k-step 6 (after k-step 7's decode, the last use of this stage's
// raw words), so k-step 0 of the next stage decodes during group 7. A slot is handed back at k-step 0 of the
// stage after (its last group, 7, is then complete: wgmma reads the x planes until it ends); only the tile's
// end drains (wait_group 0) before the epilogue reads the accumulators.
//
// kCta = 2 (the default where a job's n-tiles pair up; TERN_MOE_WGMMA_CLUSTER=1 turns it off): a cluster
// of kCta blocks takes n-tiles kCta q .. kCta q + kCta - 1 of one m-tile together, so all use the same x tile: each
// block's producer loads 16 / kCta of a stage's 16 x planes and the copy engine multicasts them into every block's
// slots (an x tile is 2/3 of a 128-pair stage's bytes). The blocks walk the same stages in lockstep: a slot is free
// once every block's consumers released it (each consumer warp arrives on every block's empty barrier), and no block
// leaves before the others are done (a cluster barrier at the end). Session 36 (H100, one machine, two rounds): 8K up kernel
// 3 912-3 930 -> 3 707-3 712 us a layer, down 2 120-2 129 -> 1 946-1 949; 2K (64 pairs) up 1 944 -> 1 735, down
// 1 020 -> 920; prefill 8K 0.710 -> 0.695-0.698 s, 4K 0.377-0.379 -> 0.372-0.373, 2K 0.238 -> 0.225-0.226. The
// remote release at cluster scope (.release.cluster, and .acquire.cluster on the producer's wait) had run 21% slower
// than single blocks: a fence and an L1 invalidation in every wait. 4-block clusters (session 37, H100, one round at 8K:
// up 3 826 against 3 643 us a layer, down 2 099 against 1 965, prefill 0.709 against 0.702 s) were slower: removed.
template <WeightFormat F, bool UP, int NT, int kCta>
__global__ void __launch_bounds__(kWgThreads, 1) moe_grouped_wgmma_kernel(WgArgs a) {
  grid_dependency_wait();  // the plan, the tile table and the activations are earlier kernels' outputs
  static_assert(kCta == 1 || kCta == 2);
  constexpr bool kMc = kCta > 1;
  using Tile = WgTile<NT, UP>;
  constexpr int kStages = Tile::kStages;
  constexpr bool kNv = F == WeightFormat::nvfp4;
  extern __shared__ __align__(128) uint8_t smem[];

  const int nj = *a.num_jobs;
  // Work units: a tile, or (kMc) kCta n-tiles of one m-tile; kCta divides n_tiles where kMc runs.
  const int n_units = a.n_tiles / kCta;
  const int64_t units = nj == 0 ? 0 : static_cast<int64_t>(a.tile_first[nj]) * n_units;
  const int64_t unit0 = blockIdx.x / kCta, unit_step = gridDim.x / kCta;
  if (unit0 >= units) return;  // no unit for this block (uniform, and the same for every block of a cluster)
  const uint32_t rank = kMc ? cg::this_cluster().block_rank() : 0;
  const int64_t K = a.K, N = a.N;
  const int kblocks = static_cast<int>(K / kWgK);

  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kStages * Tile::kStage);
  const BulkRing ring{bars, bars + kStages, kStages};
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    // full: the producer threads' cp.async arrivals and the x planes' arming thread (transaction bytes, the planes
    // the peers multicast included). empty: the consumer warps of every block of the cluster (kMc).
    ring.init(kWgConsumerWarps * kCta, kWgProducerThreads + 1);
    mbar_init_fence();
  }
  if constexpr (kMc)
    cg::this_cluster().sync();  // every block's barriers are initialised before any block's copies or arrivals
  else
    __syncthreads();

  if (warp >= kWgConsumerWarps) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kWgProducerRegs));
    // Producer thread p: its share of the weight rows and scales (WgWeightCopier) and, p < 16, x plane p.
    const int p = tid - kWgConsumerWarps * 32;
    const uint32_t smem0 = smem_addr(smem);
    using Copier = WgWeightCopier<UP, kNv ? 8 : 4>;
    RingCursor c;
    int gi = 0;  // the stage's index in the block's walk (scale groups: a tile holds whole groups)
    for (int64_t u = unit0; u < units; u += unit_step) {
      const WgTileAt tl = wg_tile_at(a, nj, u, NT, n_units);
      Copier copier(a.experts[tl.e], p, tl.n_tile * kCta + static_cast<int>(rank), N, K, a.l2_hint);
      for (int kb = 0; kb < kblocks; ++kb, c.next(kStages)) {
        ring.wait_free_at(c.slot, c.parity);
        const uint32_t st = smem0 + c.slot * Tile::kStage;
        uint64_t* full = &ring.full[c.slot];
        // x plane q of the stage: NT x 16 contiguous bytes at plane 16 kb + q of the tile's first pair.
        wg_load_x_planes<16, kCta>(
            p, rank, full, Tile::kPlane, [&](int q) { return smem + c.slot * Tile::kStage + Tile::kXOff + q * Tile::kPlane; },
            [&](int q) { return a.a + ((16 * static_cast<int64_t>(kb) + q) * a.rows + tl.first + tl.row0) * 8; });
        if (a.sc_groups && gi % Copier::kGroupStages == 0)
          copier.scale_group(smem0 + Tile::kScGroupOff + ((gi / Copier::kGroupStages) & 1) * (kWgRows * 16));
        copier.stage(st, kWgK / 2, Tile::kScOff, !a.sc_groups);
        cp_async_mbar_arrive_noinc(full);  // (a group's copy lands before its first stage's arrival)
        ++gi;
      }
    }
    cp_async_wait<0>();  // no cp.async of this thread still in flight when it exits
    if constexpr (kMc) cg::this_cluster().sync();  // the consumers' end (below)
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

  // This thread's raw FP4 words (16 bytes = its 32 columns of each of its 4 rows) and bf16x2 scale
  // multipliers (mxfp4: one e8m0 for the 32 columns; nvfp4: two ue4m3, 16 columns each) of one stage.
  uint4 raw[2][2];
  uint32_t mult[2][2][2];
  constexpr int kGroupStages = WgWeightCopier<UP, kNv ? 8 : 4>::kGroupStages;
  // Stage gi of the walk in ring slot `slot`; its scale bytes in the slot or (sc_groups) in its group.
  const auto load_stage = [&](int slot, int gi) {
    const uint8_t* st = smem + slot * Tile::kStage;
    const uint8_t* sc0 = a.sc_groups ? smem + Tile::kScGroupOff + ((gi / kGroupStages) & 1) * (kWgRows * 16) +
                                           (gi % kGroupStages) * (kNv ? 8 : 4)
                                     : st + Tile::kScOff;
    const int sc_pitch = a.sc_groups ? 16 : 8;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        raw[mt][h] = lds128(st + mrow[mt][h] * (kWgK / 2) + 16 * t);
        const uint8_t* sc = sc0 + mrow[mt][h] * sc_pitch;
        if constexpr (kNv)
          ue4m3x2_mult_bf16x2(*reinterpret_cast<const uint16_t*>(sc + 2 * t), mult[mt][h]);
        else
          mult[mt][h][0] = mult[mt][h][1] = e8m0_mult_bf16x2(sc[t]);
      }
  };
  // A fragments of k-step s (both slabs) from raw / mult.
  uint32_t af[2][2][4];
  const auto decode = [&](auto s_c, uint32_t(&out)[2][4]) {
    constexpr int s = decltype(s_c)::value;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t word = word_of(raw[mt][h], s / 2), m = mult[mt][h][s / 4];
        out[mt][h] = bf16_mul2(e2m1x2_to_bf16x2_raw<2 * (s % 2)>(word), m);          // slots 2t, 2t+1
        out[mt][2 + h] = bf16_mul2(e2m1x2_to_bf16x2_raw<2 * (s % 2) + 1>(word), m);  // slots 2t+8, 2t+9
      }
  };

  const auto release = [&](int slot) {
    if constexpr (kMc)
      ring.release_cluster_at(slot, rank, kCta);
    else
      ring.release_at(slot);
  };
  RingCursor c;
  int gi = 0;  // the stage c's index in the block's walk
  for (int64_t u = unit0; u < units; u += unit_step) {
    const WgTileAt tl = wg_tile_at(a, nj, u, NT, n_units);
    const int n_tile = tl.n_tile * kCta + static_cast<int>(rank), row0 = tl.row0, first = tl.first, count = tl.count;
    const ExpertDesc& ed = a.experts[tl.e];

    float acc[2][NT / 2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < NT / 2; ++i) acc[mt][i] = 0.0f;

    ring.wait_full_at(c.slot, c.parity);
    load_stage(c.slot, gi);
    decode(std::integral_constant<int, 0>{}, af[0]);
    int prev_slot = 0;
    for (int kb = 0; kb < kblocks; ++kb) {
      const uint32_t xaddr = smem_addr(smem + c.slot * Tile::kStage + Tile::kXOff);
      const bool more = kb + 1 < kblocks;
      static_for<8>([&](auto s_c) {
        constexpr int s = decltype(s_c)::value;
        // k-step s: stored columns 16 s .. 16 s + 15 = planes 2 s, 2 s + 1.
        const uint64_t desc = wg_desc(xaddr + 2 * s * Tile::kPlane, Tile::kPlane, 128);
        wgmma_pin(af[s % 2][0]);
        wgmma_pin(af[s % 2][1]);
        wgmma_fence();
        wgmma_k16<NT>(acc[0], af[s % 2][0], desc);
        wgmma_k16<NT>(acc[1], af[s % 2][1], desc);
        wgmma_commit();
        wgmma_wait<1>();  // group s - 1 is done: af[(s + 1) % 2] may be rewritten
        wgmma_pin(acc[0]);
        wgmma_pin(acc[1]);
        if constexpr (s == 0) {
          if (kb > 0) release(prev_slot);  // the previous stage's last group (7) is done
        }
        if constexpr (s < 7) decode(std::integral_constant<int, s + 1>{}, af[(s + 1) % 2]);
        if constexpr (s == 7) {
          // The next stage's raw words (this stage's were last read by k-step 7's decode, at k-step 6) and its k-step
          // 0: waited for here, with group 7 already issued, so a late stage leaves that group running rather than
          // holding it back (session 35; the wait sat at k-step 6, before group 7's issue, and ncu showed the
          // consumers waiting there ~26% of their time at 128 pairs).
          if (more) {
            RingCursor n = c;
            n.next(kStages);
            ring.wait_full_at(n.slot, n.parity);
            load_stage(n.slot, gi + 1);
            decode(std::integral_constant<int, 0>{}, af[0]);
          }
        }
      });
      prev_slot = c.slot;
      c.next(kStages);
      ++gi;
    }
    wgmma_wait<0>();  // the tile's last group: then the accumulators and the last slot are free
    wgmma_pin(acc[0]);
    wgmma_pin(acc[1]);
    release(prev_slot);
    const WgTileOut o{wg, w, g, t, tid, n_tile, first, row0, count};
    if constexpr (UP)
      wg_store_h<NT>(acc, kWeightShift * (kNv ? ed.global_scale[0] : 1.0f), kWeightShift * (kNv ? ed.global_scale[2] : 1.0f),
                     a.limit, reinterpret_cast<uint16_t*>(smem + Tile::kHStage), a.h, a.rows, o);
    else
      wg_store_y<NT>(acc, kWeightShift * (kNv ? ed.global_scale[1] : 1.0f), a.y, N, mrow, o);
  }
  grid_dependents_launch();  // this block's tiles are done: the next kernel may be scheduled
  // The peers' consumers may still arrive on this block's empty barriers: no block leaves before all are done.
  if constexpr (kMc) cg::this_cluster().sync();
}

template <WeightFormat F, bool UP, int NT, int kCta>
void launch_wgmma_as(const WgArgs& a, int64_t m_tiles_bound, cudaStream_t stream) {
  constexpr int kSmem = WgTile<NT, UP>::kSmem;
  constexpr bool kMc = kCta > 1;
  // Persistent blocks, at most as many as can be resident at once (kMc: the clusters of kCta that fit side by side).
  static const int64_t resident = wg_resident_blocks(moe_grouped_wgmma_kernel<F, UP, NT, kCta>, kSmem, kCta);
  TERN_CHECK(resident > 0, "moe_grouped_wgmma_kernel: no ", kCta, "-block cluster of ", kSmem,
             " bytes of shared memory fits (cudaOccupancyMaxActiveClusters); TERN_MOE_WGMMA_CLUSTER=1 runs single blocks");
  const int64_t blocks = std::min<int64_t>(m_tiles_bound * a.n_tiles, resident) / kCta * kCta;
  if (blocks == 0) return;
  LaunchShape shape{dim3(static_cast<unsigned>(blocks)), dim3(kWgThreads), kSmem, stream};
  shape.cluster_x = kMc ? kCta : 0;
  launch(shape, moe_grouped_wgmma_kernel<F, UP, NT, kCta>, a);
}

template <WeightFormat F, bool UP, int NT>
void launch_wgmma(const WgArgs& a, int64_t m_tiles_bound, cudaStream_t stream) {
  switch (moe_grouped_wgmma_cluster(a.n_tiles)) {
    case 2:
      launch_wgmma_as<F, UP, NT, 2>(a, m_tiles_bound, stream);
      break;
    default:
      launch_wgmma_as<F, UP, NT, 1>(a, m_tiles_bound, stream);
      break;
  }
}

template <WeightFormat F, int NT>
void launch_up_down(const MoeParams& p, const MoeGroupedBuffers& b, int64_t rows, cudaStream_t stream) {
  const int64_t P = p.T * p.k;
  // sum over jobs of ceil(count / NT) <= P / NT + jobs: the grid's bound without reading the plan back
  const int64_t m_bound = (P + NT - 1) / NT + std::min<int64_t>(P, p.E);
  WgArgs a{p.experts,    b.jobs,  b.num_jobs,
           b.tile_first, b.xs,    rows,
           p.D,          p.inter, static_cast<int>((p.inter + kWgRows / 2 - 1) / (kWgRows / 2)),
           p.limit,      b.h,     b.y,
           moe_l2_hint()};
  // TERN_MOE_SCALE_GROUPS: a row's scales 16 bytes at a time where its scale bytes (K / 128 x 4 or 8) are a multiple of 16.
  const auto groups = [&](int64_t K) {
    return moe_scale_groups() && p.experts_aligned && (K / kWgK * (F == WeightFormat::nvfp4 ? 8 : 4)) % 16 == 0 ? 1 : 0;
  };
  a.sc_groups = groups(p.D);
  launch_wgmma<F, true, NT>(a, m_bound, stream);
  if (p.act_fp8) launch_act_fake_quant_bf16_inplace(Bf16Rows{b.h, P, p.inter, 0, rows}, stream);  // h in planes
  a.a = b.h;
  a.K = p.inter;
  a.N = p.D;
  a.n_tiles = static_cast<int>((p.D + kWgRows - 1) / kWgRows);
  a.sc_groups = groups(p.inter);
  launch_wgmma<F, false, NT>(a, m_bound, stream);
}

template <WeightFormat F>
void launch_up_down_n(int nt, const MoeParams& p, const MoeGroupedBuffers& b, int64_t rows,
                      cudaStream_t stream) {
  switch (nt) {
    case 32:
      launch_up_down<F, 32>(p, b, rows, stream);
      break;
    case 64:
      launch_up_down<F, 64>(p, b, rows, stream);
      break;
    case 96:
      launch_up_down<F, 96>(p, b, rows, stream);
      break;
    case 112:
      launch_up_down<F, 112>(p, b, rows, stream);
      break;
    default:
      launch_up_down<F, 128>(p, b, rows, stream);
      break;
  }
}

}  // namespace
}  // namespace dev

const char* moe_grouped_kernel_forced() {
  const std::string v = env_choice("TERN_MOE_GROUPED", {"auto", "wgmma", "mma", "e4m3"}, "auto");
  return v == "wgmma" ? "wgmma" : v == "mma" ? "mma" : v == "e4m3" ? "e4m3" : "";
}

bool moe_grouped_wgmma_selected(const MoeParams& p) {
  const std::string_view forced = moe_grouped_kernel_forced();
  // e4m3: the bf16 wgmma kernel where the e4m3 one cannot run (run_grouped_moe says so).
  if (!forced.empty()) return forced == "wgmma" || forced == "e4m3";
  return p.E > 0 && p.T * p.k >= kMoeWgmmaMinPairs * p.E;
}

int moe_grouped_wgmma_tile_pairs(const MoeParams& p) {
  if (const std::string v = env_choice("TERN_MOE_WGMMA_N", {"auto", "32", "64", "96", "112", "128"}, "auto");
      v != "auto")
    return std::stoi(v);
  if (p.E <= 0) return 0;  // shape only (CudaBackend::moe_path): picked per call
  // Each tile streams the expert's whole weight, so the fewest tiles over an expert's pairs at the mean plus 10%,
  // then the narrowest width with that many (the least padding). Session 36: picking the least padding alone chose
  // 7 x 32 over 2 x 128 at 8K tokens of V4-Flash (mean 192 pairs; the up kernel 8 777 us a layer against 3 869).
  // 112 is not a candidate: at 8K 2 x 128 ran faster than 2 x 112 (session 35, H100: up 3 869 / 3 966 us a layer,
  // down 2 125 / 2 157), at 4K the same.
  const int64_t P = p.T * p.k, mean = P / std::max<int64_t>(1, std::min<int64_t>(P, p.E));
  const int64_t want = std::max<int64_t>(1, mean + mean / 10);
  int best = 128;
  int64_t best_tiles = (want + 127) / 128;
  for (int n : {96, 64, 32}) {  // 32 (session 10): ~24 pairs an expert at 1K tokens of V4-Flash
    const int64_t tiles = (want + n - 1) / n;
    if (tiles <= best_tiles) best = n, best_tiles = tiles;
  }
  return best;
}

int64_t moe_grouped_rows(const MoeParams& p) {
  return p.T * p.k + dev::kWgMaxTok;
}

bool moe_scale_groups() { return env_flag("TERN_MOE_SCALE_GROUPS", false); }

int moe_grouped_wgmma_cluster(int n_tiles) {
  int c = std::stoi(env_choice("TERN_MOE_WGMMA_CLUSTER", {"1", "2"}, "2"));
  while (c > 1 && n_tiles % c != 0) c /= 2;
  return c;
}

std::string moe_grouped_wgmma_path_name(const MoeParams& p) {
  const int n = moe_grouped_wgmma_tile_pairs(p);
  const std::string tile = n == 0 ? "256x{32,64,96,112,128} by pairs per expert" : "256x" + std::to_string(n);
  const int mc = moe_grouped_wgmma_cluster(4);
  return std::string("moe_grouped_wgmma_kernel ") + (p.kind == WeightFormat::nvfp4 ? "nvfp4 " : "mxfp4 ") + tile +
         " (wgmma bf16, fp4 decoded into A registers a k-step ahead, 2 groups in flight, weights by cp.async, x by " +
         (mc > 1 ? "bulk copy multicast to " + std::to_string(mc) +
                       "-block clusters of an m-tile's n-tiles, smaller where a job's n-tiles do not divide)"
                 : std::string("bulk copy)"));
}

void launch_moe_grouped_tiles(const int* jobs, const int* num_jobs, int pairs, int* tile_first, cudaStream_t stream) {
  launch(dev::moe_grouped_wgmma_tiles_kernel, 1, 32, 0, stream, jobs, num_jobs, pairs, tile_first);
}

void launch_moe_grouped_wgmma(const MoeParams& p, const MoeGroupedBuffers& b, cudaStream_t stream) {
  const int64_t P = p.T * p.k, rows = moe_grouped_rows(p);
  if (P == 0) return;
  const int nt = moe_grouped_wgmma_tile_pairs(p);
  launch(dev::moe_grouped_wgmma_gather_kernel, dev::grid_stride_blocks((p.D / dev::kWgK) * P * 4), 256, 0,
         stream, p.x, b.sorted, P, p.k, p.D, rows, b.xs);
  launch_moe_grouped_tiles(b.jobs, b.num_jobs, nt, b.tile_first, stream);
  if (p.kind == WeightFormat::nvfp4)
    dev::launch_up_down_n<WeightFormat::nvfp4>(nt, p, b, rows, stream);
  else
    dev::launch_up_down_n<WeightFormat::mxfp4>(nt, p, b, rows, stream);
}

}  // namespace tern::cuda
