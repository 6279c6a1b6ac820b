// Grouped GEMMs of the routed experts for prefill chunks (moe_grouped.cuh): one block per (job, m-tile of
// BM pairs, n-tile of BN weight rows); x (or h) as bf16 and the raw FP4 weights and their scales stream
// through a cp.async ring in shared memory (GroupedTile::kStages deep), K = 128 columns a stage; the FP4
// nibbles are decoded straight into mma.sync B fragments (Hopper has no FP4 MMA; mma_tile.cuh's exact decoders).
//
// K order. The order of k inside one m16n8k16 does not matter if A and B agree. A quad's lane t decodes its
// own 16 contiguous bytes (32 columns, 32t .. 32t+31 of the stage) of each weight row: k-step S (0..7) takes
// word S/2 of them, nibbles (i, i+4) for i = 2(S%2) (k slots 2t, 2t+1) and i = 2(S%2)+1 (slots 2t+8, 2t+9).
// So the activations are stored with each 32-column group permuted (moe_grouped_k_stored) such that the A
// pair of those slots is one 32-bit word: a lane reads its rows' 32 columns as 4 x 16 bytes, one per two
// k-steps. The gather writes x that way; the up kernel writes h that way for the down kernel.
//
// Weights enter as W * 2^-16 (mma_tile.cuh: keeps every product in bf16 range) and the sums are multiplied by
// 2^16 and NVFP4's per-matrix global scale in the epilogue, per matrix (w1 and w3 may differ).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "backends/cuda/kernels/act_quant.cuh"
#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/mma_tile.cuh"
#include "backends/cuda/kernels/moe_grouped.cuh"
#include "backends/cuda/kernels/stream_tile.cuh"
#include "core/env.h"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kGroupedK = 128;  // K columns per stage

// Physical column (0..31) held at stored position s of a 32-column group: s = 4S + 2q + j holds column
// 8(S/2) + 2(S%2) + q + 4j (k-step S, q = 0 for slots 2t,2t+1 / 1 for slots 2t+8,2t+9, j the half).
__host__ __device__ constexpr int k_physical(int s) {
  return (s & 0x18) | ((s >> 1) & 1) | (((s >> 2) & 1) << 1) | ((s & 1) << 2);
}
// Its inverse: the stored position of physical column p.
__host__ __device__ constexpr int k_stored(int p) {
  return (p & 0x18) | ((p >> 2) & 1) | ((p & 1) << 1) | (((p >> 1) & 1) << 2);
}
__host__ __device__ constexpr bool k_permutation_ok() {
  for (int p = 0; p < 32; ++p)
    if (k_stored(p) < 0 || k_stored(p) > 31 || k_physical(k_stored(p)) != p || k_stored(k_physical(p)) != p) return false;
  // Within 8-column chunks (the gather converts a 16-byte stored chunk from its own 8 columns).
  for (int s = 0; s < 32; ++s)
    if ((k_physical(s) & ~7) != (s & ~7)) return false;
  // The mma pairing: stored 4S + 2q + j is column 8(S/2) + 2(S%2) + q + 4j (what the B decode feeds that slot).
  for (int S = 0; S < 8; ++S)
    for (int q = 0; q < 2; ++q)
      for (int j = 0; j < 2; ++j)
        if (k_physical(4 * S + 2 * q + j) != 8 * (S / 2) + 2 * (S % 2) + q + 4 * j) return false;
  return true;
}
static_assert(k_permutation_ok());

// Warp tile: MT m-tiles of 16 pairs x NT n-tiles of 8 weight rows; the warps sit side by side along N, each
// taking all BM pairs of the tile, so each weight element is decoded once per block and each decoded B fragment
// feeds MT mma (an x fragment, read from shared memory, feeds NT).
// - BM x BN = 32 x 256 / 64 x 128 (tile config "old"; 4 warps, 3 stages of ~26 KB, two blocks a multiprocessor):
//   warp tiles 32 x 64 (few pairs an expert, memory-bound) or 64 x 32 (a decoded fragment feeds 4 mma).
// - 128 x 256 (default) / 128 x 128 (from ~96 pairs an expert): 8 warps of 128 pairs x 32 / 16 weight rows, 4
//   stages of 50 / 41 KB, one block a multiprocessor (8 warps; up to 255 registers a thread: 238-248 / 146-153,
//   no spills), and the mma's operands swapped (kSwapAB): weights as A (m-tiles of 16 rows), pairs as B
//   (n-tiles of 8). mma.sync wants A in 4 consecutive registers: x as A (rows g and g+8 interleaved word by
//   word) cost ~3.4 register moves an mma in the old tiles' SASS, where decoded weights land in place and a
//   pair's B fragment is 2 consecutive words of one lds.128. A decoded fragment feeds 16 mma (old: 4), and m-
//   tiles' worth of pairs past the job are skipped (kSkipDead, 32 pairs at a time). SASS of the K loop (per
//   mma, all instructions): 64 x 128 7.6, 32 x 256 9.3; 128 x 256 3.1, 128 x 128 4.0. 128 x 256 also reads
//   half the x bytes from shared memory an mma (x re-read from L2 once per 128 h / 256 output columns).
// - SWAP on the 32 / 64-pair tiles too (session 10, the default): the same 4 warps and stages, weights as A, so
//   a decoded A fragment feeds BM / 8 mma and lands in place (the unswapped 32 x 256 took 9.3 instructions an
//   mma); SWAP = false keeps them as they were (tile config "small-unswapped", for A/B).
// W: the block's warps. The 32-pair tile also runs as 8 warps of 32 weight rows (tile config "8-warp-32", session
// 33): at 1K tokens its 4 warps of 64 rows hold 216 registers, so 2 blocks = 8 warps an SM issue 0.52 a cycle a
// scheduler (ncu: issue-bound, 4.15 instructions a weight); 8 warps of half the accumulators and fragments fit
// 128 registers, 16 warps an SM on the same shared memory and the same products in the same order (same bits).
template <int BM, int BN_, bool SWAP = (BM >= 128), int W = (BM >= 128 ? 8 : 4)>
struct GroupedTile {
  static constexpr int kWarps = W;
  static constexpr int kThreads = kWarps * 32;
  // The 32 / 64-pair tiles at 4 stages (two blocks of 104 / 100 KB a multiprocessor) were slower (session 31, H100,
  // 1K prefill: the up kernel 1 306 -> 1 603 us a layer, 0.162 -> 0.175 s; 2K the same): they stay at 3.
  static constexpr int kStages = BM >= 128 ? 4 : 3;
  static constexpr int kMinBlocks = BM >= 128 ? 1 : 2;  // __launch_bounds__: 255 / 128 registers a thread
  static constexpr bool kSkipDead = SWAP;               // zero-fill dead x rows, skip their mma
  static constexpr bool kSwapAB = SWAP;                 // weights as the mma's A operand (see below)
  static constexpr int BN = BN_, MT = BM / 16, WN = BN / kWarps, NT = WN / 8;
  // Accumulator tiles: [m-tiles of 16 pairs][n-tiles of 8 weight rows], or swapped [m-tiles of 16 weight rows]
  // [n-tiles of 8 pairs].
  static constexpr int AM = kSwapAB ? WN / 16 : MT, AN = kSwapAB ? BM / 8 : NT;
  // Rows of a warp holding w1 (the first half) and w3 (the second) of the same h columns, up: the warp's WN
  // rows, or each 16-row m-tile when swapped (gate in c0/c1, up in c2/c3 of the same lane).
  static constexpr int kUpGroup = kSwapAB ? 16 : WN;
  static constexpr int kXBytes = BM * kGroupedK * 2;  // bf16 rows of 256 bytes
  static constexpr int kWBytes = BN * kGroupedK / 2;  // fp4 rows of 64 bytes
  static constexpr int kSBytes = BN * 8;              // one 4-byte (mxfp4) or 8-byte (nvfp4) scale word a row
  static constexpr int kStage = kXBytes + kWBytes + kSBytes;
  static constexpr int kSmem = kStage * kStages;
  static_assert(WN * kWarps == BN && NT * 8 == WN && NT % 2 == 0, "up needs w1 and w3 n-tiles in every warp");
  static_assert(!kSwapAB || (WN % 16 == 0 && BM % 32 == 0), "swapped: whole 16-row m-tiles, 32-pair groups");
  static_assert(kSkipDead || MT * NT == 16, "the old tiles: 64 accumulators a lane");
  static_assert(kSmem <= 227 * 1024, "shared memory of one block");
};

// 16-byte chunk c (0..15) of x row r sits at chunk x_chunk(r, c): a lds.128 phase (lanes g, g+1 of a quad
// pair, chunks 4t + i) then touches 8 distinct bank groups (row parity and chunk bit 3 flip bits 0 and 1).
__device__ __forceinline__ int x_chunk(int r, int c) { return c ^ (((c >> 3) & 1) << 1) ^ (r & 1); }

struct GroupedArgs {
  const ExpertDesc* experts;
  const int* jobs;
  const int* num_jobs;
  const int* tile_first;
  const uint16_t* a;  // [P, K] bf16, K permuted (gathered x for up, h for down)
  int64_t K, N;       // N: rows of one weight matrix (up: inter, down: D)
  int n_tiles;
  float limit;
  uint16_t* h;  // up: [P, inter]
  float* y;     // down: [P, D]
  int l2_hint;  // the weight copies' L2 prefetch size (moe_l2_hint)
};

// A thread a stored 16-byte chunk (8 columns, k_physical permutes within it) of one slot: a warp's 32 threads take
// 256 consecutive columns of a row, so its loads span 1 KB and its stores 512 contiguous bytes. (Until session 33 a
// thread took 32 columns: a warp's loads 128 bytes apart, 71.5 us a call at 1K on the H100, 31% of copy.)
__global__ void moe_grouped_gather_kernel(const float* x, const int* sorted, int64_t P, int k, int64_t D,
                                          uint16_t* xs) {
  pdl_prologue();
  const int64_t chunks = D / 8, n = P * chunks;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t slot = i / chunks, c0 = (i - slot * chunks) * 8;
    // Slots past the plan's pairs (a pair with an invalid expert, raised by the sort) are never read by a
    // tile; their sorted[] is stale scratch, so it is not trusted as an address.
    const int pair = sorted[slot];
    const bool valid = pair >= 0 && pair < P;
    const float4* src = reinterpret_cast<const float4*>(x + static_cast<int64_t>(valid ? pair / k : 0) * D + c0);
    const float4 lo = valid ? src[0] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 hi = valid ? src[1] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    uint32_t w[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) w[u] = pack_bf16(v[k_physical(2 * u)], v[k_physical(2 * u + 1)]);
    *reinterpret_cast<uint4*>(xs + slot * D + c0) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// One block of 1024 threads (num_jobs <= E <= 1024): tile_first[j] = sum over jobs i < j of ceil(count_i / bm),
// tile_first[num_jobs] = the total.
__global__ void moe_grouped_tiles_kernel(const int* jobs, const int* num_jobs, int bm, int* tile_first) {
  pdl_prologue();
  __shared__ int warp_tiles[32];
  const int nj = *num_jobs, j = threadIdx.x, lane = j & 31, warp = j >> 5;
  const int m = j < nj ? (jobs[3 * j + 2] + bm - 1) / bm : 0;
  int incl = m;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_tiles[warp] = incl;
  __syncthreads();
  for (int w = 0; w < warp; ++w) incl += warp_tiles[w];
  if (j < nj) tile_first[j] = incl - m;
  if (j == nj - 1) tile_first[nj] = incl;
  if (nj == 0 && j == 0) tile_first[0] = 0;
}

// Up (UP): n_local = WN wn + c of a block's BN rows is w1 row (c < WN/2) or w3 row (c >= WN/2) number
// n_tile * BN/2 + wn WN/2 + c % (WN/2), so a warp's n-tiles 0..NT/2-1 (w1) and NT/2..NT-1 (w3) hold gate and up
// of the same h columns in the same lanes and the epilogue applies SwiGLU in registers. Down: w2 row
// n_tile * BN + n_local.
template <WeightFormat F, int BM, int BN_, bool UP, bool SWAP, int W>
__global__ void __launch_bounds__(GroupedTile<BM, BN_, SWAP, W>::kThreads, GroupedTile<BM, BN_, SWAP, W>::kMinBlocks)
    moe_grouped_kernel(GroupedArgs a) {
  grid_dependency_wait();  // the plan, the tile table and the activations are earlier kernels' outputs
  using Tile = GroupedTile<BM, BN_, SWAP, W>;
  constexpr int BN = Tile::BN, MT = Tile::MT, NT = Tile::NT, WN = Tile::WN, kRing = Tile::kStages;
  constexpr bool kNv = F == WeightFormat::nvfp4;
  extern __shared__ __align__(16) uint8_t smem[];

  const int nj = *a.num_jobs;
  const int64_t t = blockIdx.x;
  if (nj == 0 || t >= static_cast<int64_t>(a.tile_first[nj]) * a.n_tiles) return;  // past the plan's tiles
  int lo = 0, hi = nj - 1;  // the last job whose first tile is at or before t (every job has >= 1 m-tile)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (static_cast<int64_t>(a.tile_first[mid]) * a.n_tiles <= t) lo = mid;
    else hi = mid - 1;
  }
  const int job = lo, m_tiles = a.tile_first[job + 1] - a.tile_first[job];
  const int local = static_cast<int>(t - static_cast<int64_t>(a.tile_first[job]) * a.n_tiles);
  // m fastest: the blocks sharing an n-tile's weights run side by side (their second reads hit L2).
  const int n_tile = local / m_tiles, m_tile = local % m_tiles;
  const int e = a.jobs[3 * job], first = a.jobs[3 * job + 1], count = a.jobs[3 * job + 2];
  const int row0 = m_tile * BM;
  const ExpertDesc& ed = a.experts[e];
  const int64_t K = a.K, N = a.N;
  const int64_t w_row_bytes = K / 2, s_row_bytes = kNv ? K / 16 : K / 32;

  const int tid = threadIdx.x;
  // Copy assignments (fixed for the whole K loop): x rows tid/16 + (threads/16) i, chunk tid%16; weight rows
  // tid/4 + (threads/4) i, chunk tid%4 (and that row's scale word when tid%4 == 0). Rows past the job or the
  // matrix read a valid row (the last one), or with kSkipDead zeros for x (no global read): their results are
  // never stored.
  constexpr int kXRows = Tile::kThreads / 16, kWRows = Tile::kThreads / 4;
  constexpr int kXCopies = BM / kXRows, kWCopies = BN / kWRows;
  static_assert(kXCopies * kXRows == BM && kWCopies * kWRows == BN);
  const uint16_t* xsrc[kXCopies];
  int xdst[kXCopies];
  bool xlive[kXCopies];
#pragma unroll
  for (int i = 0; i < kXCopies; ++i) {
    const int r = tid / 16 + kXRows * i, c = tid % 16;
    const int slot = first + min(row0 + r, count - 1);
    xsrc[i] = a.a + static_cast<int64_t>(slot) * K + 8 * c;
    xdst[i] = r * 256 + x_chunk(r, c) * 16;
    xlive[i] = !Tile::kSkipDead || row0 + r < count;
  }
  const uint8_t* wsrc[kWCopies];
  const uint8_t* ssrc[kWCopies];
#pragma unroll
  for (int i = 0; i < kWCopies; ++i) {
    const int n_local = tid / 4 + kWRows * i;
    int which;
    int64_t row;
    if constexpr (UP) {
      constexpr int G = Tile::kUpGroup;
      const int c = n_local % G;
      which = c < G / 2 ? 0 : 2;  // ExpertDesc order: w1, w2, w3
      row = static_cast<int64_t>(n_tile) * (BN / 2) + (G / 2) * (n_local / G) + c % (G / 2);
    } else {
      which = 1;
      row = static_cast<int64_t>(n_tile) * BN + n_local;
    }
    row = min(row, N - 1);
    wsrc[i] = static_cast<const uint8_t*>(ed.w[which]) + row * w_row_bytes + 16 * (tid % 4);
    ssrc[i] = static_cast<const uint8_t*>(ed.s[which]) + row * s_row_bytes;
  }
  auto load_stage = [&](int kb, int stage) {
    uint8_t* xs = smem + stage * Tile::kStage;
    uint8_t* ws = xs + Tile::kXBytes;
    uint8_t* ss = ws + Tile::kWBytes;
#pragma unroll
    for (int i = 0; i < kXCopies; ++i)
      cp_async16(xs + xdst[i], xsrc[i] + static_cast<int64_t>(kb) * kGroupedK, xlive[i]);
#pragma unroll
    for (int i = 0; i < kWCopies; ++i) {
      const int n_local = tid / 4 + kWRows * i;
      cp_async16_l2(smem_addr(ws + n_local * 64 + 16 * (tid % 4)), wsrc[i] + static_cast<int64_t>(kb) * 64, 16,
                    a.l2_hint);
      if (tid % 4 == 0) {
        if constexpr (kNv) cp_async_small<8>(ss + n_local * 8, ssrc[i] + static_cast<int64_t>(kb) * 8, true);
        else cp_async_small<4>(ss + n_local * 8, ssrc[i] + static_cast<int64_t>(kb) * 4, true);
      }
    }
  };

  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int wn = warp;
  constexpr int AM = Tile::AM, AN = Tile::AN;
  float acc[AM][AN][4];
#pragma unroll
  for (int mt = 0; mt < AM; ++mt)
#pragma unroll
    for (int nt = 0; nt < AN; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

  const int kblocks = static_cast<int>(K / kGroupedK);
  // Swapped: 32-pair groups (4 n-tiles) holding at least one of the job's pairs (>= 1: every block's m-tile
  // starts inside its job).
  const int groups_live = min(BM / 32, (count - row0 + 31) / 32);
#pragma unroll
  for (int s = 0; s < kRing - 1; ++s) {
    if (s < kblocks) load_stage(s, s);
    cp_async_commit();
  }
  for (int kb = 0; kb < kblocks; ++kb) {
    cp_async_wait<kRing - 2>();
    __syncthreads();  // stage kb landed for every thread; stage (kb - 1) % kRing is free again
    const int next = kb + kRing - 1;
    if (next < kblocks) load_stage(next, next % kRing);
    cp_async_commit();

    const uint8_t* xs = smem + (kb % kRing) * Tile::kStage;
    const uint8_t* ws = xs + Tile::kXBytes;
    const uint8_t* ss = ws + Tile::kWBytes;
    // This lane's 16 bytes of each of its NT weight rows, and their scale multipliers.
    uint4 wraw[NT];
    uint32_t mult[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int n_local = WN * wn + 8 * nt + g;
      wraw[nt] = lds128(ws + n_local * 64 + 16 * tq);
      if constexpr (kNv) {
        const uint8_t* s = ss + n_local * 8 + 2 * tq;
        ue4m3x2_mult_bf16x2(s[0] | (static_cast<uint32_t>(s[1]) << 8), mult[nt]);
      } else {
        mult[nt][0] = mult[nt][1] = e8m0_mult_bf16x2(ss[n_local * 8 + tq]);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // x chunk i of the lane's 32 columns: k-steps 2i and 2i+1
      if constexpr (Tile::kSwapAB) {
        // Weights as A (16 weight rows g, g+8 of an m-tile: wraw[2 mw], wraw[2 mw + 1]), pairs as B (8 pairs of
        // an n-tile, pair g): the same k slots as below (A pair of slots 2t,2t+1 = nibbles 2 sub, slots
        // 2t+8,2t+9 = nibbles 2 sub + 1; x word 2 sub / 2 sub + 1 of the lane's chunk), so the same products
        // and k order. Why swapped: mma wants its A fragment in 4 consecutive registers; decoded weights land
        // there directly, and a pair's B fragment is 2 consecutive words of one lds.128, where x as A (rows g
        // and g+8 interleaved) took ~2.6 register moves an mma (SASS of the unswapped 128 x 256).
        uint32_t af[2][AM][4];
        static_for<2>([&](auto sub_c) {
          constexpr int sub = decltype(sub_c)::value;
#pragma unroll
          for (int mw = 0; mw < AM; ++mw)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint32_t w = word_of(wraw[2 * mw + h], i), m = mult[2 * mw + h][i / 2];
              af[sub][mw][h] = bf16_mul2(e2m1x2_to_bf16x2_raw<2 * sub>(w), m);
              af[sub][mw][2 + h] = bf16_mul2(e2m1x2_to_bf16x2_raw<2 * sub + 1>(w), m);
            }
        });
        // 32 pairs at a time: their 4 x fragments loaded together, then 4 x 2 x AM mma; the first group past
        // the job's pairs (the same for the whole block) ends the k-steps (rows past the job are zeros).
#pragma unroll
        for (int pg = 0; pg < BM / 32; ++pg) {
          if (pg > 0 && pg >= groups_live) break;
          uint4 xf[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int r = 32 * pg + 8 * q + g;
            xf[q] = lds128(xs + r * 256 + x_chunk(r, 4 * tq + i) * 16);
          }
#pragma unroll
          for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int sub = 0; sub < 2; ++sub)
#pragma unroll
              for (int mw = 0; mw < AM; ++mw)
                mma_bf16(acc[mw][4 * pg + q], af[sub][mw][0], af[sub][mw][1], af[sub][mw][2], af[sub][mw][3],
                         word_of(xf[q], 2 * sub), word_of(xf[q], 2 * sub + 1));
        }
      } else {
        // The 32 / 64-pair tiles (config "old"): x of every m-tile, then per k-step and n-tile decode and mma.
        uint4 ax[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const int r = 16 * mt + g + 8 * hr;
            ax[mt][hr] = lds128(xs + r * 256 + x_chunk(r, 4 * tq + i) * 16);
          }
        static_for<2>([&](auto sub_c) {
          constexpr int sub = decltype(sub_c)::value;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const uint32_t w = word_of(wraw[nt], i);
            const uint32_t m = mult[nt][i / 2];  // nvfp4: columns 0..15 of the lane's 32 (words 0, 1), then 16..31
            const uint32_t b0 = bf16_mul2(e2m1x2_to_bf16x2_raw<2 * sub>(w), m);
            const uint32_t b1 = bf16_mul2(e2m1x2_to_bf16x2_raw<2 * sub + 1>(w), m);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
              mma_bf16(acc[mt][nt], word_of(ax[mt][0], 2 * sub), word_of(ax[mt][1], 2 * sub),
                       word_of(ax[mt][0], 2 * sub + 1), word_of(ax[mt][1], 2 * sub + 1), b0, b1);
          }
        });
      }
    }
  }
  cp_async_wait<0>();
  grid_dependents_launch();  // the weights are read: the next kernel may be scheduled

  if constexpr (Tile::kSwapAB) {
    // acc[mw][p][i]: weight row 16 mw + g + 8 (i / 2) of the warp's WN, pair 8 p + 2 tq + i % 2 of the tile.
    if constexpr (UP) {
      const float m1 = kWeightShift * (kNv ? ed.global_scale[0] : 1.0f);
      const float m3 = kWeightShift * (kNv ? ed.global_scale[2] : 1.0f);
#pragma unroll
      for (int mw = 0; mw < AM; ++mw) {
        const int64_t col = static_cast<int64_t>(n_tile) * (BN / 2) + (WN / 2) * wn + 8 * mw + g;
        if (col >= N) continue;
        const int64_t at = (col & ~int64_t{31}) + k_stored(static_cast<int>(col & 31));
#pragma unroll
        for (int p = 0; p < AN; ++p)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int r = row0 + 8 * p + 2 * tq + j;
            if (r >= count) continue;
            const float gate = acc[mw][p][j] * m1, up = acc[mw][p][2 + j] * m3;
            const float v = siluf_(fminf(gate, a.limit)) * fminf(fmaxf(up, -a.limit), a.limit);
            a.h[static_cast<int64_t>(first + r) * N + at] = static_cast<uint16_t>(pack_bf16(v, 0.0f) & 0xffffu);
          }
      }
    } else {
      const float m2 = kWeightShift * (kNv ? ed.global_scale[1] : 1.0f);
#pragma unroll
      for (int mw = 0; mw < AM; ++mw)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int64_t col = static_cast<int64_t>(n_tile) * BN + WN * wn + 16 * mw + 8 * hr + g;
          if (col >= N) continue;
#pragma unroll
          for (int p = 0; p < AN; ++p)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int r = row0 + 8 * p + 2 * tq + j;
              if (r < count) a.y[static_cast<int64_t>(first + r) * N + col] = acc[mw][p][2 * hr + j] * m2;
            }
        }
    }
  } else if constexpr (UP) {
    const float m1 = kWeightShift * (kNv ? ed.global_scale[0] : 1.0f);
    const float m3 = kWeightShift * (kNv ? ed.global_scale[2] : 1.0f);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = row0 + 16 * mt + g + 8 * (i >> 1);
        if (r >= count) continue;
        uint16_t* hrow = a.h + static_cast<int64_t>(first + r) * N;
#pragma unroll
        for (int nt = 0; nt < NT / 2; ++nt) {
          const int64_t col = static_cast<int64_t>(n_tile) * (BN / 2) + (WN / 2) * wn + 8 * nt + 2 * tq + (i & 1);
          if (col >= N) continue;
          const float gate = acc[mt][nt][i] * m1, up = acc[mt][nt + NT / 2][i] * m3;
          const float v = siluf_(fminf(gate, a.limit)) * fminf(fmaxf(up, -a.limit), a.limit);
          hrow[(col & ~int64_t{31}) + k_stored(static_cast<int>(col & 31))] =
              static_cast<uint16_t>(pack_bf16(v, 0.0f) & 0xffffu);
        }
      }
  } else {
    const float m2 = kWeightShift * (kNv ? ed.global_scale[1] : 1.0f);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = row0 + 16 * mt + g + 8 * hr;
        if (r >= count) continue;
        float* yrow = a.y + static_cast<int64_t>(first + r) * N;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int64_t col = static_cast<int64_t>(n_tile) * BN + WN * wn + 8 * nt + 2 * tq;
          if (col >= N) continue;  // N is even (a multiple of 128): col + 1 < N too
          *reinterpret_cast<float2*>(yrow + col) = make_float2(acc[mt][nt][2 * hr] * m2, acc[mt][nt][2 * hr + 1] * m2);
        }
      }
  }
}

template <WeightFormat F, int BM, int BN, bool UP, bool SWAP, int W>
void launch_grouped(const GroupedArgs& a, int64_t m_tiles_bound, cudaStream_t stream) {
  using Tile = GroupedTile<BM, BN, SWAP, W>;
  static const bool attr = [] {
    cudaFuncSetAttribute(moe_grouped_kernel<F, BM, BN, UP, SWAP, W>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         Tile::kSmem);
    return true;
  }();
  (void)attr;
  const int64_t blocks = m_tiles_bound * a.n_tiles;
  if (blocks == 0) return;
  launch(moe_grouped_kernel<F, BM, BN, UP, SWAP, W>, static_cast<unsigned>(blocks), Tile::kThreads, Tile::kSmem, stream,
         a);
}

template <WeightFormat F, int BM, int BN, bool SWAP, int W>
void launch_up_down(const MoeParams& p, const MoeGroupedBuffers& b, cudaStream_t stream) {
  const int64_t P = p.T * p.k;
  // sum over jobs of ceil(count / BM) <= P / BM + jobs: the grid's bound without reading the plan back
  const int64_t m_bound = (P + BM - 1) / BM + std::min<int64_t>(P, p.E);
  GroupedArgs a{p.experts, b.jobs, b.num_jobs, b.tile_first, b.xs, p.D, p.inter,
                static_cast<int>((p.inter + BN / 2 - 1) / (BN / 2)), p.limit, b.h, b.y, moe_l2_hint()};
  launch_grouped<F, BM, BN, true, SWAP, W>(a, m_bound, stream);
  if (p.act_fp8) launch_act_fake_quant_bf16_inplace(Bf16Rows{b.h, P, p.inter, p.inter, 0}, stream);
  a.a = b.h;
  a.K = p.inter;
  a.N = p.D;
  a.n_tiles = static_cast<int>((p.D + BN - 1) / BN);
  launch_grouped<F, BM, BN, false, SWAP, W>(a, m_bound, stream);
}

template <int BM, int BN, bool SWAP = (BM >= 128), int W = (BM >= 128 ? 8 : 4)>
void launch_up_down_fmt(const MoeParams& p, const MoeGroupedBuffers& b, cudaStream_t stream) {
  if (p.kind == WeightFormat::nvfp4) launch_up_down<WeightFormat::nvfp4, BM, BN, SWAP, W>(p, b, stream);
  else launch_up_down<WeightFormat::mxfp4, BM, BN, SWAP, W>(p, b, stream);
}

}  // namespace
}  // namespace dev

bool moe_grouped_supported(const MoeParams& p) {
  return (p.kind == WeightFormat::mxfp4 || p.kind == WeightFormat::nvfp4) && p.D % dev::kGroupedK == 0 &&
         p.inter % dev::kGroupedK == 0 && p.E <= 1024 && p.experts_aligned;
}

namespace {

std::atomic<int> g_tile_config{-1};
std::atomic<int> g_l2_hint{-1};

// The tile launch_moe_grouped takes for these params: BM pairs x BN weight rows, weights as the mma's A (swap).
struct TileShape {
  int bm, bn;
  bool swap;
  int warps = 0;  // 0: the tile's own (4 below 128 pairs, 8 from 128); 8 on the 32-pair tile in config 8-warp-32
};

TileShape tile_shape(const MoeParams& p) {
  // ~24 pairs an expert at 1 024 tokens (V4-Flash): 32-pair tiles (4 warps x 64 weight rows); from ~48 on,
  // 64-pair tiles (4 warps x 32 rows) halve the weight reads and decodes per pair; from ~96 on (~192 at 8 192
  // tokens), 128-pair tiles (8 warps, one block a multiprocessor) halve them again. Below ~96 a 128-pair tile
  // would be mostly dead rows (skipped, but its block still holds the multiprocessor alone); not measured there.
  const int config = moe_grouped_tile_config();
  const bool swap_small =
      config == kMoeGroupedTileDefault || config == kMoeGroupedTileNarrow || config == kMoeGroupedTileWarps8;
  const int small_warps = config == kMoeGroupedTileWarps8 ? 8 : 0;
  if (p.E <= 0) return {32, 256, swap_small, small_warps};
  const int64_t P = p.T * p.k;
  if (config != kMoeGroupedTileOld && P >= 96 * p.E) return {128, config == kMoeGroupedTileNarrow ? 128 : 256, true};
  return P >= 48 * p.E ? TileShape{64, 128, swap_small} : TileShape{32, 256, swap_small, small_warps};
}

}  // namespace

int moe_grouped_tile_config() {
  int v = g_tile_config.load(std::memory_order_relaxed);
  if (v < 0) {
    const std::string s =
        env_choice("TERN_MOE_GROUPED_TILE", {"default", "old", "128x128", "small-unswapped", "8-warp-32"}, "default");
    v = s == "old"               ? kMoeGroupedTileOld
        : s == "128x128"         ? kMoeGroupedTileNarrow
        : s == "small-unswapped" ? kMoeGroupedTileSmallUnswapped
        : s == "8-warp-32"       ? kMoeGroupedTileWarps8
                                 : kMoeGroupedTileDefault;
    g_tile_config.store(v, std::memory_order_relaxed);
  }
  return v;
}

void set_moe_grouped_tile_config(int config) { g_tile_config.store(config, std::memory_order_relaxed); }

int moe_l2_hint() {
  int v = g_l2_hint.load(std::memory_order_relaxed);
  if (v < 0) {
    v = std::stoi(env_choice("TERN_MOE_L2_HINT", {"0", "128", "256"}, "256"));
    g_l2_hint.store(v, std::memory_order_relaxed);
  }
  return v;
}

void set_moe_l2_hint(int bytes) { g_l2_hint.store(bytes, std::memory_order_relaxed); }

int moe_grouped_tile_pairs(const MoeParams& p) { return tile_shape(p).bm; }

const char* moe_grouped_path_name(const MoeParams& p) {
  const bool nv = p.kind == WeightFormat::nvfp4;
  if (p.E == 0) {  // shape only (CudaBackend::moe_path): the tile is picked per call
    switch (moe_grouped_tile_config()) {
      case kMoeGroupedTileOld:
        return nv ? "moe_grouped_kernel nvfp4 32x256 | 64x128 by pairs per expert (tile config old; mma.sync bf16, fp4 decoded in registers)"
                  : "moe_grouped_kernel mxfp4 32x256 | 64x128 by pairs per expert (tile config old; mma.sync bf16, fp4 decoded in registers)";
      case kMoeGroupedTileNarrow:
        return nv ? "moe_grouped_kernel nvfp4 32x256 | 64x128 | 128x128 by pairs per expert, weights as A (tile config 128x128; mma.sync bf16, fp4 decoded in registers)"
                  : "moe_grouped_kernel mxfp4 32x256 | 64x128 | 128x128 by pairs per expert, weights as A (tile config 128x128; mma.sync bf16, fp4 decoded in registers)";
      case kMoeGroupedTileSmallUnswapped:
        return nv ? "moe_grouped_kernel nvfp4 32x256 | 64x128 (x as A) | 128x256 (weights as A) by pairs per expert (tile config small-unswapped; mma.sync bf16, fp4 decoded in registers)"
                  : "moe_grouped_kernel mxfp4 32x256 | 64x128 (x as A) | 128x256 (weights as A) by pairs per expert (tile config small-unswapped; mma.sync bf16, fp4 decoded in registers)";
      case kMoeGroupedTileWarps8:
        return nv ? "moe_grouped_kernel nvfp4 32x256 (8 warps) | 64x128 | 128x256 by pairs per expert, weights as A (tile config 8-warp-32; mma.sync bf16, fp4 decoded in registers)"
                  : "moe_grouped_kernel mxfp4 32x256 (8 warps) | 64x128 | 128x256 by pairs per expert, weights as A (tile config 8-warp-32; mma.sync bf16, fp4 decoded in registers)";
      default:
        return nv ? "moe_grouped_kernel nvfp4 32x256 | 64x128 | 128x256 by pairs per expert, weights as A (mma.sync bf16, fp4 decoded in registers)"
                  : "moe_grouped_kernel mxfp4 32x256 | 64x128 | 128x256 by pairs per expert, weights as A (mma.sync bf16, fp4 decoded in registers)";
    }
  }
  const TileShape t = tile_shape(p);
  if (t.bm == 128 && t.bn == 256)
    return nv ? "moe_grouped_kernel nvfp4 128x256 (8 warps of 128x32; mma.sync bf16, fp4 decoded in registers)"
              : "moe_grouped_kernel mxfp4 128x256 (8 warps of 128x32; mma.sync bf16, fp4 decoded in registers)";
  if (t.bm == 128)
    return nv ? "moe_grouped_kernel nvfp4 128x128 (8 warps of 128x16; mma.sync bf16, fp4 decoded in registers)"
              : "moe_grouped_kernel mxfp4 128x128 (8 warps of 128x16; mma.sync bf16, fp4 decoded in registers)";
  if (t.bm == 64 && t.swap)
    return nv ? "moe_grouped_kernel nvfp4 64x128 (weights as A; mma.sync bf16, fp4 decoded in registers)"
              : "moe_grouped_kernel mxfp4 64x128 (weights as A; mma.sync bf16, fp4 decoded in registers)";
  if (t.bm == 64)
    return nv ? "moe_grouped_kernel nvfp4 64x128 (x as A; mma.sync bf16, fp4 decoded in registers)"
              : "moe_grouped_kernel mxfp4 64x128 (x as A; mma.sync bf16, fp4 decoded in registers)";
  if (t.swap && t.warps == 8)
    return nv ? "moe_grouped_kernel nvfp4 32x256 (8 warps of 32 rows, weights as A; mma.sync bf16, fp4 decoded in registers)"
              : "moe_grouped_kernel mxfp4 32x256 (8 warps of 32 rows, weights as A; mma.sync bf16, fp4 decoded in registers)";
  if (t.swap)
    return nv ? "moe_grouped_kernel nvfp4 32x256 (weights as A; mma.sync bf16, fp4 decoded in registers)"
              : "moe_grouped_kernel mxfp4 32x256 (weights as A; mma.sync bf16, fp4 decoded in registers)";
  return nv ? "moe_grouped_kernel nvfp4 32x256 (x as A; mma.sync bf16, fp4 decoded in registers)"
            : "moe_grouped_kernel mxfp4 32x256 (x as A; mma.sync bf16, fp4 decoded in registers)";
}

void launch_moe_grouped(const MoeParams& p, const MoeGroupedBuffers& b, cudaStream_t stream) {
  const int64_t P = p.T * p.k;
  if (P == 0) return;
  launch(dev::moe_grouped_gather_kernel, dev::grid_stride_blocks(P * p.D / 8), 256, 0, stream, p.x, b.sorted, P,
         p.k, p.D, b.xs);
  const TileShape t = tile_shape(p);
  launch(dev::moe_grouped_tiles_kernel, 1, 1024, 0, stream, b.jobs, b.num_jobs, t.bm, b.tile_first);
  if (t.bm == 128 && t.bn == 256) dev::launch_up_down_fmt<128, 256>(p, b, stream);
  else if (t.bm == 128) dev::launch_up_down_fmt<128, 128>(p, b, stream);
  else if (t.bm == 64 && t.swap) dev::launch_up_down_fmt<64, 128, true>(p, b, stream);
  else if (t.bm == 64) dev::launch_up_down_fmt<64, 128, false>(p, b, stream);
  else if (t.swap && t.warps == 8) dev::launch_up_down_fmt<32, 256, true, 8>(p, b, stream);
  else if (t.swap) dev::launch_up_down_fmt<32, 256, true>(p, b, stream);
  else dev::launch_up_down_fmt<32, 256, false>(p, b, stream);
}

}  // namespace tern::cuda
