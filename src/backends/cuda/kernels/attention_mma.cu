// Sparse attention on tensor cores (FP8 rows, up to 64 heads): grid (split, query), one block of 8 warps per
// (query, split) covering all heads (padded to 64 = 4 m-tiles of 16), the query's splits one thread-block
// cluster. Per tile of 64 keys:
//   1. the rows' raw bytes arrive by cp.async (double-buffered: the next tile's bytes are in flight while the
//      block computes on this one) and are decoded once into shared memory as bf16 (e4m3 * e8m0 scale and
//      the bf16 rope dims are exact in bf16);
//   2. S = Q K^T with mma.sync m16n8k16 (bf16 operands, f32 accumulation): warp (mp, qq) computes heads
//      32mp .. 32mp+31 against keys 16qq .. 16qq+15 over all head_dim dims;
//   3. online softmax in f32 (base 2): the tile's row maxima meet in shared memory, P = 2^(s - m) is rounded
//      to bf16 (the row sums add the rounded values) and stored for all warps;
//   4. O += P V with V = the same shared tile: warp (mp, qq) owns heads 32mp .. 32mp+31 x dims
//      qq * head_dim/4 .. (qq+1) * head_dim/4 of O in registers (the rows it computed scores for, so its
//      running max is the one its O needs).
// Then each block puts its (max, sum, O) in shared memory and, after a cluster barrier, every block merges a
// slice of the heads over all splits (read from the other blocks' shared memory), in split order, with the
// sink: out = sum_s O_s 2^(m_s - top) / (sum_s l_s 2^(m_s - top) + 2^(sink - top)).
//
// Splits: runs of about kMmaKeysPerSplit keys, at most kMaxSplits (CSA 128 + 512 keys: 5 blocks of 2 tiles).
// Shared memory at head_dim 512: 224,000 bytes (one block per SM), 254 registers per thread, no spills.
//
// Batch invariance: a query's splits depend on its own key count only (mma_split_plan); the cluster size
// of a launch (the most splits any of its queries may need) only decides which block does which part of
// the merge and the q load, never the arithmetic, so a query's output is the same bits whatever shares the
// launch, in a prefill chunk and in a decode step.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>

#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/attention_keys.cuh"
#include "backends/cuda/kernels/attention_split.cuh"
#include "backends/cuda/kernels/attention_tile.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/mma_tile.cuh"

namespace tern::cuda {
namespace dev {
namespace {

namespace cg = cooperative_groups;

constexpr int kHeads = kTileHeads;     // heads padded to 4 m-tiles (attention_tile.cuh)
constexpr int kRound = 256;            // keys whose rows are looked up at once (one per thread)
constexpr int kThreads = kTileThreads;  // 8 warps
constexpr int kMaxSplits = kMmaMaxSplits;  // the split plan is attention_split.cuh's (shared with
                                           // attention_heads_kernel, whose bits are this kernel's)

// Shared memory (dynamic), offsets in bytes. The work area holds the bf16 key tile and two raw tiles while
// the block computes, and the block's f32 O for the cluster merge afterwards.
template <int HD>
struct Smem {
  static constexpr int kRowStride = kTileRowStride<HD>;  // bf16 per row of q / key tile
  static constexpr int kPStride = kTileKeys + 8;    // bf16 per row of P
  static constexpr int kOStride = HD + 8;           // f32 per row of O (float2 stores without conflicts)
  static constexpr size_t kQ = 0;
  static constexpr size_t kP = kQ + size_t{kHeads} * kRowStride * 2;
  static constexpr size_t kRows = kP + size_t{kHeads} * kPStride * 2;  // const uint8_t* [kRound]
  static constexpr size_t kTmax = kRows + kRound * 8;                  // f32 [4][kHeads]
  static constexpr size_t kLpart = kTmax + 4 * kHeads * 4;              // f32 [4][kHeads]
  static constexpr size_t kMfin = kLpart + 4 * kHeads * 4;              // f32 [kHeads]
  static constexpr size_t kLfin = kMfin + kHeads * 4;                   // f32 [kHeads]
  static constexpr size_t kWeight = kLfin + kHeads * 4;                 // f32 [kMaxSplits][kHeads]
  static constexpr size_t kMask = kWeight + kMaxSplits * kHeads * 4;    // int [kTileKeys]
  static constexpr size_t kWork = (kMask + kTileKeys * 4 + 127) / 128 * 128;
  static constexpr size_t kKeyTile = size_t{kTileKeys} * kRowStride * 2;
  static constexpr size_t kO = size_t{kHeads} * kOStride * 4;
  // Raw tiles: rows of row_bytes (a multiple of 8) after the key tile.
  __host__ __device__ static size_t raw_tile(int64_t row_bytes) { return raw_tile_bytes(row_bytes); }
  static size_t total(int64_t row_bytes) {
    const size_t tiles = kKeyTile + 2 * raw_tile(row_bytes);
    return kWork + (tiles > kO ? tiles : kO);
  }
};

template <int HD>
__global__ void __launch_bounds__(kThreads, 1) attention_mma_kernel(AttentionParams a, int64_t q0) {
  pdl_prologue();
  using L = Smem<HD>;
  constexpr int kNT = HD / 32;  // n-tiles of 8 dims per warp in P V (a quarter of the dims)
  extern __shared__ __align__(128) uint8_t smem[];
  auto* sQ = reinterpret_cast<__nv_bfloat16*>(smem + L::kQ);
  auto* sP = reinterpret_cast<__nv_bfloat16*>(smem + L::kP);
  auto* sRows = reinterpret_cast<const uint8_t**>(smem + L::kRows);
  auto* sTmax = reinterpret_cast<float*>(smem + L::kTmax);
  auto* sLpart = reinterpret_cast<float*>(smem + L::kLpart);
  auto* sMfin = reinterpret_cast<float*>(smem + L::kMfin);
  auto* sLfin = reinterpret_cast<float*>(smem + L::kLfin);
  auto* sWeight = reinterpret_cast<float*>(smem + L::kWeight);
  auto* sMask = reinterpret_cast<int*>(smem + L::kMask);
  auto* sK = reinterpret_cast<__nv_bfloat16*>(smem + L::kWork);
  uint8_t* sRaw = smem + L::kWork + L::kKeyTile;
  auto* sO = reinterpret_cast<float*>(smem + L::kWork);  // after the last tile
  const size_t raw_tile = L::raw_tile(a.fmt.row_bytes);

  cg::cluster_group cluster = cg::this_cluster();
  const int split = static_cast<int>(blockIdx.x), cluster_size = static_cast<int>(gridDim.x);
  const int64_t i = q0 + blockIdx.y;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int mp = warp & 1, qq = warp >> 1;  // heads 32mp .. 32mp+31; key quarter / dim quarter qq
  const int heads = static_cast<int>(a.heads);

  const KeyList kl = keys_of(a, i);
  const bool live = kl.p >= 0;
  const int64_t total = live ? kl.nwin + kl.count : 0;
  const KeySplits plan = mma_split_plan(total, a.split_keys);
  const int64_t j0 = min(total, split * plan.per), j1 = min(total, j0 + plan.per);
  const bool work = live && split < plan.splits && j0 < j1;
  const float scale2 = a.scale * kLog2e;

  float o[2][kNT][4];
  float m_run[2][2], l_run[2][2];  // [m-tile][row g / g + 8]
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int n = 0; n < kNT; ++n) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.0f;
    m_run[mi][0] = m_run[mi][1] = -INFINITY;
    l_run[mi][0] = l_run[mi][1] = 0.0f;
  }

  for (int64_t jr = j0; work && jr < j1; jr += kRound) {
    const int nr = static_cast<int>(min(static_cast<int64_t>(kRound), j1 - jr));
    const int tiles = (nr + kTileKeys - 1) / kTileKeys;
    __syncthreads();  // the previous round's row addresses are no longer read
    sRows[tid] = tid < nr ? key_row(a, i, kl, jr + tid) : nullptr;
    __syncthreads();
    issue_raw(sRows, min(nr, kTileKeys), a.fmt.row_bytes, sRaw);
    if (jr == j0) {  // q as bf16 (heads past a.heads are zeros), while the first tile's rows are in flight
      const float* src = a.q + i * a.heads * HD;
#pragma unroll 8
      for (int idx = tid; idx < kHeads * HD / 4; idx += kThreads) {
        const int h = idx / (HD / 4), c = idx % (HD / 4);
        const float4 v = h < heads ? __ldg(reinterpret_cast<const float4*>(src + h * HD) + c) : make_float4(0, 0, 0, 0);
        *reinterpret_cast<uint2*>(sQ + h * L::kRowStride + 4 * c) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
      }
    }
    for (int tt = 0; tt < tiles; ++tt) {
      const int nk = min(kTileKeys, nr - kTileKeys * tt);
      const uint8_t* raw = sRaw + (tt & 1) * raw_tile;
      cp_async_wait_all();
      __syncthreads();  // this tile's bytes have landed; the previous tile's P V is done with sK and sP
      decode_tile<HD>(a.fmt, sRows + kTileKeys * tt, nk, raw, sK, sMask);
      __syncthreads();  // the key tile is ready; the raw tile is consumed
      if (tt + 1 < tiles)
        issue_raw(sRows + kTileKeys * (tt + 1), min(kTileKeys, nr - kTileKeys * (tt + 1)), a.fmt.row_bytes,
                  sRaw + ((tt + 1) & 1) * raw_tile);

      attend_tile<HD>(sQ, sK, sP, sTmax, sMask, nk, scale2, o, m_run, l_run, BlockSync{});
    }
  }

  // The block's partial (max, sum, O) into shared memory for the cluster merge.
  __syncthreads();  // the work area is free (no copy in flight, the last P V done)
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = 32 * mp + 16 * mi + 8 * hf + g;
      float l = l_run[mi][hf];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if (t == 0) sLpart[qq * kHeads + row] = l;
      if (t == 0 && qq == 0) sMfin[row] = m_run[mi][hf];
#pragma unroll
      for (int n = 0; n < kNT; ++n)
        *reinterpret_cast<float2*>(sO + row * L::kOStride + qq * (HD / 4) + 8 * n + 2 * t) =
            make_float2(o[mi][n][2 * hf], o[mi][n][2 * hf + 1]);
    }
  __syncthreads();
  if (tid < kHeads) sLfin[tid] = ((sLpart[tid] + sLpart[kHeads + tid]) + sLpart[2 * kHeads + tid]) + sLpart[3 * kHeads + tid];
  cluster.sync();  // every split's partial is visible to the whole cluster

  // Merge heads h0 .. h1 of the query over its splits, in split order.
  const int per_block = (heads + cluster_size - 1) / cluster_size;
  const int h0 = min(heads, split * per_block), h1 = min(heads, h0 + per_block);
  const int splits = plan.splits;
  if (tid < h1 - h0) {
    const int h = h0 + tid;
    const float sink = a.sinks[h] * kLog2e;
    float top = sink;
    for (int sp = 0; sp < splits; ++sp) top = fmaxf(top, *cluster.map_shared_rank(sMfin + h, sp));
    float denom = 0.0f;
    for (int sp = 0; sp < splits; ++sp)
      denom += *cluster.map_shared_rank(sLfin + h, sp) * exp2f(*cluster.map_shared_rank(sMfin + h, sp) - top);
    denom += exp2f(sink - top);
    for (int sp = 0; sp < splits; ++sp)
      sWeight[sp * kHeads + tid] = live ? exp2f(*cluster.map_shared_rank(sMfin + h, sp) - top) / denom : 0.0f;
  }
  __syncthreads();
  const int items = (h1 - h0) * (HD / 4);
  for (int idx = tid; idx < items; idx += kThreads) {
    const int hl = idx / (HD / 4), c = idx % (HD / 4), h = h0 + hl;
    float4 acc = make_float4(0, 0, 0, 0);
    if (live)
      for (int sp = 0; sp < splits; ++sp) {
        const float4 v = *reinterpret_cast<const float4*>(cluster.map_shared_rank(sO + h * L::kOStride + 4 * c, sp));
        const float w = sWeight[sp * kHeads + hl];
        acc.x += v.x * w;
        acc.y += v.y * w;
        acc.z += v.z * w;
        acc.w += v.w * w;
      }
    reinterpret_cast<float4*>(a.out + (i * a.heads + h) * HD)[c] = acc;
  }
  cluster.sync();  // the other blocks' shared memory stays until every block has read it
}

template <int HD>
cudaError_t launch_hd(const AttentionParams& p, int cluster, cudaStream_t stream) {
  const size_t smem = Smem<HD>::total(p.fmt.row_bytes);
  static std::atomic<size_t> opted_in{0};  // the most shared memory asked for so far
  if (smem > opted_in.load()) {
    // A failure shows as the launch's error.
    if (cudaFuncSetAttribute(attention_mma_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)) == cudaSuccess)
      opted_in.store(smem);
  }
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t q0 = 0; q0 < p.n; q0 += kMaxGridY) {
    const int64_t nq = std::min(kMaxGridY, p.n - q0);
    LaunchShape s{dim3(static_cast<unsigned>(cluster), static_cast<unsigned>(nq), 1), kThreads, smem, stream};
    s.cluster_x = static_cast<unsigned>(cluster);
    const cudaError_t err = launch(s, attention_mma_kernel<HD>, p, q0);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace dev

size_t attention_mma_smem_bytes(const KvRowDesc& f) {
  switch (f.head_dim) {
    case 128: return dev::Smem<128>::total(f.row_bytes);
    case 256: return dev::Smem<256>::total(f.row_bytes);
    case 512: return dev::Smem<512>::total(f.row_bytes);
    default: return 0;
  }
}

cudaError_t launch_attention_mma(const AttentionParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const int cluster = dev::mma_split_plan(dev::mma_max_keys(p), p.split_keys).splits;
  switch (p.fmt.head_dim) {
    case 128: return dev::launch_hd<128>(p, cluster, stream);
    case 256: return dev::launch_hd<256>(p, cluster, stream);
    case 512: return dev::launch_hd<512>(p, cluster, stream);
    default: return cudaErrorInvalidValue;  // attention_path sends only these here
  }
}

}  // namespace tern::cuda
