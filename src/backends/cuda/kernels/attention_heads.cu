// Sparse attention on tensor cores with a query's heads split over blocks (TERN_ATTENTION_DECODE=heads):
// attention_heads_kernel<hd, MT> does attention_mma_kernel's arithmetic head for head (the same split plan,
// tiles, fragments, k order, softmax steps, row-sum order and merge order), so its output is the same bits,
// in blocks of 16 * MT heads (MT = 1 or 2 m-tiles of 16) instead of all 64.
//
// Why: attention_mma_kernel runs one block of all 64 heads per (query, split) in 224 KB of shared memory. At
// batch 1 a CSA layer is 5 blocks on 132 SMs and an HCA layer 2, and every SM holds one block of 8 warps that
// stalls at its barriers and loads: 29 us a layer at batch 1 and 16, 62 at 64 (FlashMLA 14 / 19 / 46). Here a
// (query, split) is 4 blocks of 16 heads (MT = 1: a CSA query is 20 blocks) or 2 of 32 (MT = 2), in 88 / 108 KB
// of shared memory and at most 128 registers a thread: two blocks an SM, so one block's row loads, decode and
// barriers run under the other's products. The price of the split: each head group decodes the same rows
// (read again, from L2). attention_heads_per_block takes MT = 1 while a launch fits the GPU in one round of
// two blocks an SM, MT = 2 beyond (half the decode and L2 traffic).
//
// Grid (split, head group, query); a query's splits (mma_split_plan, attention_split.cuh) are one cluster for
// each head group. 8 warps. q goes by cp.async (f32) into the key tile's area first and is rounded to bf16 once
// the row addresses of the first round (up to 256 keys, one a thread, the key order of attention_keys.cuh;
// 32-bit ring and page divisions) are looked up. Per tile of 64 keys (the old kernel's tiles, so the online
// softmax takes the same steps):
//   A. barrier (the previous tile's P V is done with the key tile). The tile's raw rows, in registers (4
//      threads a row: RawShare), are decoded to bf16 into the key tile (fp8x8_to_bf16: the old decode's
//      values, exact). With MT = 1 the next tile's rows are then loaded into the registers, in flight during
//      this tile's products; with MT = 2 there is no register room for that (o is twice the size): a tile's
//      rows are loaded after the previous tile's products, in two halves, and the SM's other block covers the
//      wait.
//   B. barrier. Score warps w < 4 MT (m-tile w / 4, key quarter qq = w % 4): S = Q K^T for the m-tile's heads
//      x keys 16qq .. 16qq+15 over all dims, the old warp's S for those heads (same ldmatrix fragments, same
//      k-step order), scaled, masked, row maxima to shared memory.
//   C. barrier. Every warp: the tile max, the running max and corr for its fragment rows (rows g, g + 8 of each
//      m-tile: the same values in every warp); score warps: P = 2^(s - m) rounded to bf16 into shared memory
//      and the row sums over the rounded values, accumulated per (row, qq, t) exactly as the old warp (qq, t)
//      adds them; every warp rescales its O by corr.
//   D. barrier. Every warp w: O += P V for all the block's heads x dims w * hd/8 .. (hd/8 dims: 8 n-tiles at hd
//      512), each output element's k-steps in the old order.
// Then (max, sum, O) of the block go to shared memory and, after a cluster barrier, each block merges a slice of
// the group's (head, 4 dims) items over the splits in split order, the old merge's expressions (every thread
// issues all its DSMEM loads at once and computes its items' split weights itself: the values the old kernel
// keeps in sWeight), and writes them.
//
// Same bits: every score is the same chain of mma.sync (same operand fragments in the same m16 row and n8
// column, the same k order), every P, max, corr and row sum the same f32 / bf16 operations in the same order,
// every O element the same mma.sync chain and rescales, the merge the same expressions; GpuAttention.
// HeadsKernelSameBits checks it against attention_mma_kernel at V4-Flash shapes and batch 1 .. 128.
//
// Rows: FP8 with 64 rope dims (V4-Flash and the fixture; attention_heads_supported): hd - 64 e4m3 dims, 64
// bf16, the scale bytes in one 8-byte word. At hd 512: shared memory 88,448 bytes (MT = 1) / 108,032 (MT = 2),
// 128 registers (__launch_bounds__(256, 2); no spill at MT = 1, 8 bytes at MT = 2).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>

#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/attention_keys.cuh"
#include "backends/cuda/kernels/attention_split.cuh"
#include "backends/cuda/kernels/attention_tile.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/mma_tile.cuh"
#include "backends/cuda/kernels/rope_dev.cuh"

namespace tern::cuda {
namespace dev {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;  // 8 warps
constexpr int kRound = 256;    // keys whose rows are looked up at once (one a thread)
constexpr int kRope = 64;      // rope dims of the rows this kernel takes

// Shared memory (dynamic), offsets in bytes. The key tile's area holds the block's f32 O for the cluster merge
// after the last tile.
template <int HD, int MT>
struct HeadsSmem {
  static constexpr int kRows = 16 * MT;              // heads of the block
  static constexpr int kRowStride = kTileRowStride<HD>;  // bf16 per row of q / key tile
  static constexpr int kOStride = HD + 8;            // f32 per row of O
  static constexpr size_t kKeyTile = size_t{kTileKeys} * kRowStride * 2;
  static constexpr size_t kOBytes = size_t{kRows} * kOStride * 4;
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + size_t{kRows} * kRowStride * 2;
  static constexpr size_t kP = kK + (kKeyTile > kOBytes ? kKeyTile : kOBytes);
  static constexpr size_t kAddr = kP + size_t{kRows} * kTilePStride * 2;  // const uint8_t* [kRound]
  static constexpr size_t kTmax = kAddr + kRound * 8;                      // f32 [4][kRows]
  static constexpr size_t kLpart = kTmax + 4 * kRows * 4;                  // f32 [4][kRows]
  static constexpr size_t kMfin = kLpart + 4 * kRows * 4;                  // f32 [kRows]
  static constexpr size_t kLfin = kMfin + kRows * 4;                       // f32 [kRows]
  static constexpr size_t kMask = kLfin + kRows * 4;                       // int [kTileKeys]
  static constexpr size_t kTotal = kMask + kTileKeys * 4;
  static_assert(kK % 128 == 0 && kP % 16 == 0 && kAddr % 8 == 0, "aligned areas");
};

// One thread's share of a tile's raw rows, in registers: thread (r, q) = (tid / 4, tid % 4) holds row r's FP8
// granules q, q + 4, ... (8 e4m3 bytes each), its bf16 rope granules q, q + 4, q + 8, q + 12 (4 dims each) and
// the row's 8 scale bytes; per load the 4 threads of a row read 32 contiguous bytes. In PARTS parts (loaded and
// decoded one after the other, to bound the registers): part p holds FP8 slots p * kFPart .., the last part
// the rope slots too; every part the scale word.
template <int HD, int PARTS>
struct RawShare {
  static constexpr int kNope = HD - kRope;
  static constexpr int kF = kNope / 32;  // FP8 granule slots: nope / 8 granules over 4 threads
  static constexpr int kR = kRope / 16;  // rope granule slots
  static constexpr int kFPart = (kF + PARTS - 1) / PARTS;
  uint2 f[kFPart], r[kR], sc;
  bool valid;
};

// Part PART of row r = tid / 4 of the tile whose row addresses are `rows` (nk rows; masked rows are nullptr).
template <int HD, int PARTS, int PART>
__device__ __forceinline__ void load_share(const uint8_t* const* rows, int nk, RawShare<HD, PARTS>& raw) {
  using R = RawShare<HD, PARTS>;
  constexpr int kJ0 = PART * R::kFPart, kJ1 = kJ0 + R::kFPart < R::kF ? kJ0 + R::kFPart : R::kF;
  const int r = threadIdx.x >> 2, q = threadIdx.x & 3;
  const uint8_t* src = r < nk ? rows[r] : nullptr;
  raw.valid = src != nullptr;
  if (!raw.valid) return;  // not read: store_share writes zeros
  const uint2* row = reinterpret_cast<const uint2*>(src);
#pragma unroll
  for (int j = kJ0; j < kJ1; ++j) raw.f[j - kJ0] = __ldg(row + q + 4 * j);
  if constexpr (PART == PARTS - 1) {
#pragma unroll
    for (int j = 0; j < R::kR; ++j) raw.r[j] = __ldg(row + R::kNope / 8 + q + 4 * j);
  }
  raw.sc = __ldg(row + (R::kNope + 2 * kRope) / 8);
}

// The part decoded into the key tile (row r at r * kTileRowStride<HD> bf16), with the values of decode_tile_at:
// e4m3 * e8m0 scale as bf16 (exact), the bf16 rope dims copied, zeros for masked rows and rows past the tile's
// keys; mask[r] says which rows are keys.
template <int HD, int PARTS, int PART>
__device__ __forceinline__ void store_share(const RawShare<HD, PARTS>& raw, __nv_bfloat16* tile, int* mask) {
  using R = RawShare<HD, PARTS>;
  constexpr int kJ0 = PART * R::kFPart, kJ1 = kJ0 + R::kFPart < R::kF ? kJ0 + R::kFPart : R::kF;
  const int r = threadIdx.x >> 2, q = threadIdx.x & 3;
  __nv_bfloat16* dst = tile + r * kTileRowStride<HD>;
  if (PART == 0 && q == 0) mask[r] = raw.valid;
#pragma unroll
  for (int j = kJ0; j < kJ1; ++j) {
    // Granule q + 4j covers dims 8(q + 4j) .. + 7, in scale block (q + 4j) / 8 = j / 2 (q < 4).
    const uint32_t word = (j >> 1) < 4 ? raw.sc.x : raw.sc.y;
    const uint8_t sb = static_cast<uint8_t>(word >> (8 * ((j >> 1) & 3)));
    *reinterpret_cast<uint4*>(dst + 8 * (q + 4 * j)) =
        raw.valid ? fp8x8_to_bf16(raw.f[j - kJ0], e8m0_to_f32(sb)) : make_uint4(0, 0, 0, 0);
  }
  if constexpr (PART == PARTS - 1) {
#pragma unroll
    for (int j = 0; j < R::kR; ++j)
      *reinterpret_cast<uint2*>(dst + R::kNope + 4 * (q + 4 * j)) = raw.valid ? raw.r[j] : make_uint2(0, 0);
  }
}

// One key tile for the block's MT m-tiles of heads (steps B-D of the header; the key tile, sMask and sQ are
// complete on entry). Scores: warp w < 4 MT takes m-tile w / 4 x key quarter w % 4 (the old warp's S for those
// heads and keys; warps 4-7 have none at MT = 1). o / m_run: the thread's O and running max of its P V rows
// (rows g, g + 8 of every m-tile); l_run: its row sums of its score rows (m-tile w / 4, quarter w % 4, lane t).
template <int HD, int MT>
__device__ __forceinline__ void attend_heads_tile(const __nv_bfloat16* sQ, const __nv_bfloat16* sK,
                                                  __nv_bfloat16* sP, float* sTmax, const int* sMask, int nk,
                                                  float scale2, float (&o)[MT][HD / 64][4], float (&m_run)[MT][2],
                                                  float (&l_run)[2]) {
  constexpr int kRows = 16 * MT, kNT = HD / 64, kStride = kTileRowStride<HD>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const bool scorer = warp < 4 * MT;
  const int smi = warp >> 2, qq = warp & 3, kb = 16 * qq;
  // S = Q K^T for m-tile smi x keys 16qq .. 16qq+15 (none past nk).
  float s[2][4];
#pragma unroll
  for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
  if (scorer) {
    if (kb < nk) {
      const __nv_bfloat16* qa = sQ + (16 * smi + (lane & 15)) * kStride + (lane >> 4) * 8;
      const __nv_bfloat16* kbp = sK + (kb + (lane & 7) + ((lane >> 4) << 3)) * kStride + ((lane >> 3) & 1) * 8;
      // k-steps unrolled 4 (MT = 1) or 2 (MT = 2: four steps' fragments do not fit next to its 64 O floats).
#pragma unroll(MT == 1 ? 4 : 2)
      for (int k0 = 0; k0 < HD; k0 += 16) {
        uint32_t kf[4], qf[4];
        ldsm_x4(qf, qa + k0);
        ldsm_x4(kf, kbp + k0);
        mma_bf16(s[0], qf[0], qf[1], qf[2], qf[3], kf[0], kf[1]);
        mma_bf16(s[1], qf[0], qf[1], qf[2], qf[3], kf[2], kf[3]);
      }
    }
    // Scaled scores (base 2), masked keys -inf; the warp's row maxima to shared memory.
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int key = kb + 8 * n + 2 * t + c;
          float& v = s[n][2 * hf + c];
          v = key < nk && sMask[key] ? v * scale2 : -INFINITY;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      if (t == 0) sTmax[qq * kRows + 16 * smi + 8 * hf + g] = mx;
    }
  }
  __syncthreads();  // C: every quarter's maxima are in
  // The running max of the thread's rows (the same in every warp), P and the row sums (score warps), O rescaled.
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = 16 * mi + 8 * hf + g;
      const float tmax = fmaxf(fmaxf(sTmax[row], sTmax[kRows + row]), fmaxf(sTmax[2 * kRows + row], sTmax[3 * kRows + row]));
      const float m_new = fmaxf(m_run[mi][hf], tmax);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float corr = exp2f(m_run[mi][hf] - m_use);
      m_run[mi][hf] = m_new;
      if (scorer && mi == smi) {
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const uint32_t p2 = pack_bf16(exp2f(s[n][2 * hf] - m_use), exp2f(s[n][2 * hf + 1] - m_use));
          sum += __uint_as_float(p2 << 16) + __uint_as_float(p2 & 0xffff0000u);
          // Keys past nk are zeros here (-inf scores); P V reads no column at or past 16 * ceil(nk / 16).
          *reinterpret_cast<uint32_t*>(sP + row * kTilePStride + kb + 8 * n + 2 * t) = p2;
        }
        l_run[hf] = l_run[hf] * corr + sum;
      }
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
        o[mi][n][2 * hf] *= corr;
        o[mi][n][2 * hf + 1] *= corr;
      }
    }
  __syncthreads();  // D: P is complete
  // O += P V for the block's heads x dims warp * HD/8 .. over the tile's 16-key steps that hold keys.
  const int ksteps = (nk + 15) / 16;
  const __nv_bfloat16* pa = sP + (lane & 15) * kTilePStride + (lane >> 4) * 8;
  const __nv_bfloat16* vb =
      sK + ((lane & 7) + ((lane >> 3) & 1) * 8) * kStride + warp * (HD / 8) + (lane >> 4) * 8;
  for (int ks = 0; ks < ksteps; ++ks) {
    uint32_t pf[MT][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) ldsm_x4(pf[mi], pa + 16 * mi * kTilePStride + 16 * ks);
#pragma unroll
    for (int np = 0; np < kNT / 2; ++np) {
      uint32_t vf[4];
      ldsm_x4_trans(vf, vb + 16 * ks * kStride + 16 * np);
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        mma_bf16(o[mi][2 * np], pf[mi][0], pf[mi][1], pf[mi][2], pf[mi][3], vf[0], vf[1]);
        mma_bf16(o[mi][2 * np + 1], pf[mi][0], pf[mi][1], pf[mi][2], pf[mi][3], vf[2], vf[3]);
      }
    }
  }
}

template <int HD, int MT>
__global__ void __launch_bounds__(kThreads, 2) attention_heads_kernel(AttentionParams a, int64_t q0) {
  pdl_prologue();
  using L = HeadsSmem<HD, MT>;
  constexpr int kRows = L::kRows;
  constexpr int kNT = HD / 64;
  constexpr int kQPer = kRows * (HD / 4) / kThreads;  // q float4 a thread
  // MT = 1: the next tile's rows in flight during this tile's products (register room: o is 32 floats). MT = 2
  // (o is 64): a tile's rows are loaded after the previous tile's products, in two parts.
  constexpr bool kPrefetch = MT == 1;
  constexpr int kParts = MT == 1 ? 1 : 2;
  static_assert(kQPer * kThreads == kRows * (HD / 4), "q in whole float4 a thread");
  extern __shared__ __align__(128) uint8_t smem[];
  auto* sQ = reinterpret_cast<__nv_bfloat16*>(smem + L::kQ);
  auto* sK = reinterpret_cast<__nv_bfloat16*>(smem + L::kK);
  auto* sO = reinterpret_cast<float*>(smem + L::kK);  // after the last tile
  auto* sP = reinterpret_cast<__nv_bfloat16*>(smem + L::kP);
  auto* sRows = reinterpret_cast<const uint8_t**>(smem + L::kAddr);
  auto* sTmax = reinterpret_cast<float*>(smem + L::kTmax);
  auto* sLpart = reinterpret_cast<float*>(smem + L::kLpart);
  auto* sMfin = reinterpret_cast<float*>(smem + L::kMfin);
  auto* sLfin = reinterpret_cast<float*>(smem + L::kLfin);
  auto* sMask = reinterpret_cast<int*>(smem + L::kMask);

  cg::cluster_group cluster = cg::this_cluster();
  const int split = static_cast<int>(blockIdx.x), cluster_size = static_cast<int>(gridDim.x);
  const int heads = static_cast<int>(a.heads), h0 = static_cast<int>(blockIdx.y) * kRows;
  const int64_t i = q0 + blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

  const KeyList kl = keys_of(a, i);
  const bool live = kl.p >= 0;
  const int64_t total = live ? kl.nwin + kl.count : 0;
  const KeySplits plan = mma_split_plan(total, a.split_keys);
  // Key indices as int (a query has fewer than 2^31 keys): fewer registers next to the accumulators.
  const int j0 = static_cast<int>(min(total, split * plan.per)), j1 = static_cast<int>(min(total, j0 + plan.per));
  const bool work = live && split < plan.splits && j0 < j1;
  const float scale2 = a.scale * kLog2e;

  float o[MT][kNT][4];
  float m_run[MT][2];  // [m-tile][row g / g + 8]
  float l_run[2] = {0.0f, 0.0f};  // score warps: m-tile warp / 4, rows g / g + 8
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int n = 0; n < kNT; ++n) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.0f;
    m_run[mi][0] = m_run[mi][1] = -INFINITY;
  }

  if (work) {
    // q of the block's heads as f32 into the key tile's area by cp.async, issued first: it depends on nothing
    // but the query, so it lands while the row addresses are looked up (no registers held meanwhile).
    const float* qsrc = a.q + (i * a.heads + h0) * HD;
    float* sQf = reinterpret_cast<float*>(smem + L::kK);  // [kRows][HD], free until the first tile
    static_assert(L::kKeyTile >= size_t{kRows} * HD * 4, "f32 q fits the key tile's area");
#pragma unroll
    for (int u = 0; u < kQPer; ++u) {
      const int idx = tid + u * kThreads, hl = idx / (HD / 4);
      if (h0 + hl < heads) cp_async16(sQf + 4 * idx, qsrc + 4 * idx);
    }
    cp_async_commit();
    // The row addresses of keys jr .. jr + nr - 1, one a thread (the key list again, a few cached loads, rather
    // than kept: its registers are not live during the tiles' products).
    auto lookup = [&](int jr, int nr) {
      const KeyList kr = keys_of(a, i);
      sRows[tid] = tid < nr ? key_row<uint32_t>(a, i, kr, jr + tid) : nullptr;
    };
    RawShare<HD, kParts> raw;
    int nr = min(kRound, j1 - j0);
    lookup(j0, nr);
    __syncthreads();
    load_share<HD, kParts, 0>(sRows, min(nr, kTileKeys), raw);  // in flight during the q conversion
    // q as bf16 (zeros past a.heads), as attention_mma_kernel rounds it; before the tiles, while o is not live.
    cp_async_wait_all();
    __syncthreads();  // every thread's q copies have landed
#pragma unroll 4
    for (int u = 0; u < kQPer; ++u) {
      const int idx = tid + u * kThreads, hl = idx / (HD / 4), c = idx % (HD / 4);
      const float4 v = h0 + hl < heads ? *reinterpret_cast<const float4*>(sQf + 4 * idx) : make_float4(0, 0, 0, 0);
      *reinterpret_cast<uint2*>(sQ + hl * L::kRowStride + 4 * c) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
    }
    // (barrier A of the first tile orders these reads of the key tile's area before its decode)
    for (int jr = j0;;) {
      const int tiles = (nr + kTileKeys - 1) / kTileKeys;
      for (int tt = 0; tt < tiles; ++tt) {
        const int nk = min(kTileKeys, nr - kTileKeys * tt);
        const uint8_t* const* trows = sRows + kTileKeys * tt;
        if (!kPrefetch && tt > 0) load_share<HD, kParts, 0>(trows, nk, raw);
        __syncthreads();  // A: the previous tile's P V is done with the key tile
        store_share<HD, kParts, 0>(raw, sK, sMask);
        if constexpr (kParts == 2) {
          load_share<HD, kParts, 1>(trows, nk, raw);
          store_share<HD, kParts, 1>(raw, sK, sMask);
        }
        if (kPrefetch && tt + 1 < tiles)
          load_share<HD, kParts, 0>(trows + kTileKeys, min(kTileKeys, nr - kTileKeys * (tt + 1)), raw);
        __syncthreads();  // B: the key tile (and q) is ready
        attend_heads_tile<HD, MT>(sQ, sK, sP, sTmax, sMask, nk, scale2, o, m_run, l_run);
      }
      jr += kRound;  // the next round (splits of more than kRound keys: HCA past ~250K tokens)
      if (jr >= j1) break;
      nr = min(kRound, j1 - jr);
      __syncthreads();  // the previous round's row addresses are no longer read
      lookup(jr, nr);
      __syncthreads();
      load_share<HD, kParts, 0>(sRows, min(nr, kTileKeys), raw);
    }
  }

  // The block's partial (max, sum, O) into shared memory for the cluster merge.
  __syncthreads();  // the key tile's area is free (the last P V done)
  if (warp < 4 * MT) {  // the score warps: m-tile warp / 4, quarter warp % 4
    const int smi = warp >> 2, qq = warp & 3;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = 16 * smi + 8 * hf + g;
      float l = l_run[hf];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if (t == 0) sLpart[qq * kRows + row] = l;
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
        if (mi == smi && t == 0 && qq == 0) sMfin[row] = m_run[mi][hf];
    }
  }
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = 16 * mi + 8 * hf + g;
#pragma unroll
      for (int n = 0; n < kNT; ++n)
        *reinterpret_cast<float2*>(sO + row * L::kOStride + warp * (HD / 8) + 8 * n + 2 * t) =
            make_float2(o[mi][n][2 * hf], o[mi][n][2 * hf + 1]);
    }
  __syncthreads();
  if (tid < kRows)
    sLfin[tid] = ((sLpart[tid] + sLpart[kRows + tid]) + sLpart[2 * kRows + tid]) + sLpart[3 * kRows + tid];
  cluster.sync();  // every split's partial is visible to the whole cluster

  // Merge the group's (head, 4 dims) items i0 .. i1 over the query's splits, in split order: the old merge's
  // expressions, each thread computing its items' split weights (every split's max and sum, read from the other
  // blocks' shared memory together with the O values, all loads in flight at once).
  const int rows_here = min(kRows, heads - h0);
  const int items = rows_here * (HD / 4);
  const int per_block = (items + cluster_size - 1) / cluster_size;
  const int i0 = min(items, split * per_block), i1 = min(items, i0 + per_block);
  const int splits = plan.splits;
  for (int idx = i0 + tid; idx < i1; idx += kThreads) {
    const int hl = idx / (HD / 4), c = idx % (HD / 4), h = h0 + hl;
    float4 acc = make_float4(0, 0, 0, 0);
    if (live) {
      float ms[kMmaMaxSplits], ls[kMmaMaxSplits];
      float4 vs[kMmaMaxSplits];
#pragma unroll
      for (int sp = 0; sp < kMmaMaxSplits; ++sp)
        if (sp < splits) {
          ms[sp] = *cluster.map_shared_rank(sMfin + hl, sp);
          ls[sp] = *cluster.map_shared_rank(sLfin + hl, sp);
          vs[sp] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(sO + hl * L::kOStride + 4 * c, sp));
        }
      const float sink = a.sinks[h] * kLog2e;
      float top = sink;
#pragma unroll
      for (int sp = 0; sp < kMmaMaxSplits; ++sp)
        if (sp < splits) top = fmaxf(top, ms[sp]);
      float denom = 0.0f;
#pragma unroll
      for (int sp = 0; sp < kMmaMaxSplits; ++sp)
        if (sp < splits) denom += ls[sp] * exp2f(ms[sp] - top);
      denom += exp2f(sink - top);
#pragma unroll
      for (int sp = 0; sp < kMmaMaxSplits; ++sp)
        if (sp < splits) {
          const float w = exp2f(ms[sp] - top) / denom;
          acc.x += vs[sp].x * w;
          acc.y += vs[sp].y * w;
          acc.z += vs[sp].z * w;
          acc.w += vs[sp].w * w;
        }
    }
    if (a.rope_inv_freq != nullptr && 4 * c >= HD - 2 * a.rope_half) {  // (launch_sparse_attention: whole float4 of pairs)
      const int pair = (4 * c - (HD - 2 * static_cast<int>(a.rope_half))) / 2;
      float v[4] = {acc.x, acc.y, acc.z, acc.w};
      rope_pair(v, a.rope_inv_freq[pair], a.positions[i], true);
      rope_pair(v + 2, a.rope_inv_freq[pair + 1], a.positions[i], true);
      acc = make_float4(v[0], v[1], v[2], v[3]);
    }
    reinterpret_cast<float4*>(a.out + (i * a.heads + h) * HD)[c] = acc;
  }
  cluster.sync();  // the other blocks' shared memory stays until every block has read it
}

template <int HD, int MT>
cudaError_t launch_heads(const AttentionParams& p, int cluster, cudaStream_t stream) {
  using L = HeadsSmem<HD, MT>;
  static std::atomic<bool> configured{false};
  if (!configured.load()) {
    // A failure shows as the launch's error. The carveout: all of the SM's shared memory, so that two blocks
    // fit it (the default may pick a smaller one).
    if (cudaFuncSetAttribute(attention_heads_kernel<HD, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(L::kTotal)) == cudaSuccess &&
        cudaFuncSetAttribute(attention_heads_kernel<HD, MT>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared) == cudaSuccess)
      configured.store(true);
  }
  const unsigned groups = static_cast<unsigned>((p.heads + L::kRows - 1) / L::kRows);
  constexpr int64_t kMaxGridZ = 65535;
  for (int64_t q0 = 0; q0 < p.n; q0 += kMaxGridZ) {
    const int64_t nq = std::min(kMaxGridZ, p.n - q0);
    LaunchShape s{dim3(static_cast<unsigned>(cluster), groups, static_cast<unsigned>(nq)), kThreads, L::kTotal,
                  stream};
    s.cluster_x = static_cast<unsigned>(cluster);
    const cudaError_t err = launch(s, attention_heads_kernel<HD, MT>, p, q0);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <int HD>
cudaError_t launch_hd(const AttentionParams& p, int heads_per_block, int cluster, cudaStream_t stream) {
  return heads_per_block == 16 ? launch_heads<HD, 1>(p, cluster, stream) : launch_heads<HD, 2>(p, cluster, stream);
}

}  // namespace
}  // namespace dev

bool attention_heads_supported(const KvRowDesc& f, int64_t heads) {
  const int64_t hd = f.head_dim;
  return f.fp8 && (hd == 128 || hd == 256 || hd == 512) && f.rope_dim == dev::kRope &&
         f.row_bytes == hd + dev::kRope + 8 && heads >= 1 && heads <= kAttentionMmaMaxHeads;
}

size_t attention_heads_smem_bytes(const KvRowDesc& f, int heads_per_block) {
  const bool one = heads_per_block == 16;
  switch (f.head_dim) {
    case 128: return one ? dev::HeadsSmem<128, 1>::kTotal : dev::HeadsSmem<128, 2>::kTotal;
    case 256: return one ? dev::HeadsSmem<256, 1>::kTotal : dev::HeadsSmem<256, 2>::kTotal;
    case 512: return one ? dev::HeadsSmem<512, 1>::kTotal : dev::HeadsSmem<512, 2>::kTotal;
    default: return 0;
  }
}

int attention_heads_per_block(const AttentionParams& p) {
  switch (attention_decode()) {
    case AttentionDecode::heads16: return 16;
    case AttentionDecode::heads32: return 32;
    default: break;
  }
  if (p.heads <= 16) return 16;  // one group either way; 32 would compute 16 padding rows
  // 16 heads a block while the launch fits the GPU in one round of two blocks an SM; 32 beyond (half the
  // decode and L2 traffic). The bits are the same either way.
  const int64_t cluster = dev::mma_split_plan(dev::mma_max_keys(p), p.split_keys).splits;
  const int64_t blocks16 = p.n * cluster * ((p.heads + 15) / 16);
  return blocks16 <= 2 * static_cast<int64_t>(p.num_sms) ? 16 : 32;
}

cudaError_t launch_attention_heads(const AttentionParams& p, cudaStream_t stream, int heads_per_block) {
  if (p.n == 0) return cudaSuccess;
  if (heads_per_block == 0) heads_per_block = attention_heads_per_block(p);
  if (heads_per_block != 16 && heads_per_block != 32) return cudaErrorInvalidValue;
  if (!attention_heads_supported(p.fmt, p.heads)) return cudaErrorInvalidValue;  // attention_path checks
  const int cluster = dev::mma_split_plan(dev::mma_max_keys(p), p.split_keys).splits;
  switch (p.fmt.head_dim) {
    case 128: return dev::launch_hd<128>(p, heads_per_block, cluster, stream);
    case 256: return dev::launch_hd<256>(p, heads_per_block, cluster, stream);
    case 512: return dev::launch_hd<512>(p, heads_per_block, cluster, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace tern::cuda
