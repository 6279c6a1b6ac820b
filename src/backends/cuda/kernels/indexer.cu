// Lightning indexer: f32 scores (CUDA cores: the top-k must agree with the CPU reference, so no bf16
// rounding here), then an exact top-k per query by radix select on order-preserving float keys.
// Decode cost model (64 heads x 128 dims): scores are 16K FMA per key, f32 at 128 FMA/clk/SM (0.5 us for
// 2048 keys, 4 us for 16384 on 132 SMs) over 512 B of key each; the top-k is a few passes over the row
// in shared memory.
#include <algorithm>

#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/indexer.cuh"
#include "backends/cuda/kernels/launch.cuh"

namespace tern::cuda {
namespace dev {
namespace {

// Query i's keys and how many there are (eager: the launch's; decode: slot i's own).
__device__ __forceinline__ PagedRowsDesc keys_of(const IndexerParams& p, int64_t i, int64_t& count) {
  PagedRowsDesc k = p.keys;
  if (p.key_tables == nullptr) {
    count = p.num_keys;
    return k;
  }
  count = p.positions[i] < 0 ? 0 : min(p.num_keys, (p.positions[i] + 1) / p.ratio);
  k.pool = reinterpret_cast<const uint8_t*>(p.pools[i]);
  k.table = reinterpret_cast<const int32_t*>(p.key_tables[i]);
  return k;
}

constexpr int kKeysPerBlock = 32, kDimChunk = 64, kScoreThreads = 256;

__device__ __forceinline__ float4 ld4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

// Block per (query, 32 keys), all heads. The 32 key rows are looked up once; q and the keys pass through
// shared memory dim-major in chunks of 64 dims (float4 global loads, conflict-free transposed stores:
// consecutive threads take consecutive heads / keys). Thread (kg, hg) accumulates keys 2kg, 2kg+1 x heads
// 4hg..4hg+3; the 16 head groups are added in order through shared memory. The host checks heads <= 64
// and dim % 4 == 0.
__global__ void __launch_bounds__(kScoreThreads) indexer_scores_kernel(IndexerParams p, float* scores) {
  pdl_prologue();
  __shared__ __align__(16) float qs[kDimChunk][kMaxIndexerHeads];
  __shared__ __align__(16) float ks[kDimChunk][kKeysPerBlock];
  __shared__ float red[kScoreThreads / 16][kKeysPerBlock];
  __shared__ const float* rows[kKeysPerBlock];
  const int64_t i = blockIdx.y, s0 = static_cast<int64_t>(blockIdx.x) * kKeysPerBlock;
  const int tid = threadIdx.x, kg = tid % 16, hg = tid / 16;
  const int64_t visible = (p.positions[i] + 1) / p.ratio;
  int64_t num_keys = 0;
  const PagedRowsDesc keys = keys_of(p, i, num_keys);
  if (s0 >= num_keys) return;  // decode mode: beyond this slot's keys (the whole block)
  if (tid < kKeysPerBlock)
    rows[tid] = s0 + tid < num_keys ? reinterpret_cast<const float*>(paged_row(keys, s0 + tid)) : nullptr;
  const float* q = p.q + i * p.heads * p.dim;
  float acc[2][4] = {};
  for (int64_t d0 = 0; d0 < p.dim; d0 += kDimChunk) {
    __syncthreads();  // rows written; the previous chunk consumed
    float4 qv[kDimChunk / 4 * kMaxIndexerHeads / kScoreThreads], kv[kDimChunk / 4 * kKeysPerBlock / kScoreThreads];
#pragma unroll
    for (int u = 0; u < kDimChunk / 4 * kMaxIndexerHeads / kScoreThreads; ++u) {
      const int idx = tid + u * kScoreThreads, h = idx % kMaxIndexerHeads;
      const int64_t d = d0 + 4 * (idx / kMaxIndexerHeads);
      qv[u] = h < p.heads && d < p.dim ? ld4(q + h * p.dim + d) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kDimChunk / 4 * kKeysPerBlock / kScoreThreads; ++u) {
      const int idx = tid + u * kScoreThreads, kk = idx % kKeysPerBlock;
      const int64_t d = d0 + 4 * (idx / kKeysPerBlock);
      kv[u] = rows[kk] != nullptr && d < p.dim ? ld4(rows[kk] + d) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kDimChunk / 4 * kMaxIndexerHeads / kScoreThreads; ++u) {
      const int idx = tid + u * kScoreThreads, h = idx % kMaxIndexerHeads, c = idx / kMaxIndexerHeads;
      qs[4 * c][h] = qv[u].x, qs[4 * c + 1][h] = qv[u].y, qs[4 * c + 2][h] = qv[u].z, qs[4 * c + 3][h] = qv[u].w;
    }
#pragma unroll
    for (int u = 0; u < kDimChunk / 4 * kKeysPerBlock / kScoreThreads; ++u) {
      const int idx = tid + u * kScoreThreads, kk = idx % kKeysPerBlock, c = idx / kKeysPerBlock;
      ks[4 * c][kk] = kv[u].x, ks[4 * c + 1][kk] = kv[u].y, ks[4 * c + 2][kk] = kv[u].z, ks[4 * c + 3][kk] = kv[u].w;
    }
    __syncthreads();
#pragma unroll 16
    for (int d = 0; d < kDimChunk; ++d) {
      const float2 k2 = *reinterpret_cast<const float2*>(&ks[d][2 * kg]);
      const float4 q4 = *reinterpret_cast<const float4*>(&qs[d][4 * hg]);
      const float kx[2] = {k2.x, k2.y}, qx[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
      for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] = fmaf(qx[b], kx[a], acc[a][b]);
    }
  }
  const float head_scale = 1.0f / sqrtf(static_cast<float>(p.heads));
  const float dot_scale = 1.0f / sqrtf(static_cast<float>(p.dim));
  float wh[4];
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const int h = 4 * hg + b;
    wh[b] = h < p.heads ? p.weights[i * p.heads + h] * head_scale : 0.0f;
  }
#pragma unroll
  for (int a = 0; a < 2; ++a) {
    float part = 0.0f;
#pragma unroll
    for (int b = 0; b < 4; ++b)
      if (4 * hg + b < p.heads) part += (fmaxf(acc[a][b], 0.0f) * dot_scale) * wh[b];
    red[hg][2 * kg + a] = part;
  }
  __syncthreads();
  if (tid < kKeysPerBlock) {
    const int64_t s = s0 + tid;
    if (s < num_keys) {
      float total = 0.0f;
      for (int g = 0; g < kScoreThreads / 16; ++g) total += red[g][tid];
      scores[i * p.num_keys + s] = s < visible ? total : -INFINITY;
    }
  }
}

// The library path of a prefill (launch_indexer_gather_keys, launch_indexer_reduce): the keys gathered
// out of their pages into one [num_keys, dim] matrix, so that q . k for every (query, head, key) is one f32
// library product S [queries * heads, keys]; then the score of each (query, key) from S as the kernel above
// computes it from its sums (ReLU, dot scale, weight, heads added in order), -inf where not visible.
__global__ void indexer_gather_keys_kernel(PagedRowsDesc keys, int64_t num_keys, int64_t dim, float* out) {
  pdl_prologue();
  const int64_t per = dim / 4, n = num_keys * per;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = i / per, c = (i - s * per) * 4;
    *reinterpret_cast<float4*>(out + s * dim + c) = ld4(reinterpret_cast<const float*>(paged_row(keys, s)) + c);
  }
}

// grid (key blocks of 128, queries of the chunk): S rows (i - first) * heads + h, `cols` keys computed;
// scores of query i for every key < num_keys.
__global__ void __launch_bounds__(128) indexer_reduce_kernel(IndexerParams p, const float* S, int64_t first,
                                                             int64_t cols, float* scores) {
  pdl_prologue();
  __shared__ float wh[kMaxIndexerHeads];
  const int64_t i = first + blockIdx.y, s = static_cast<int64_t>(blockIdx.x) * 128 + threadIdx.x;
  const float head_scale = 1.0f / sqrtf(static_cast<float>(p.heads));
  const float dot_scale = 1.0f / sqrtf(static_cast<float>(p.dim));
  for (int h = threadIdx.x; h < p.heads; h += blockDim.x) wh[h] = p.weights[i * p.heads + h] * head_scale;
  __syncthreads();
  if (s >= p.num_keys) return;
  const int64_t visible = (p.positions[i] + 1) / p.ratio;
  if (s >= visible || s >= cols) {
    scores[i * p.num_keys + s] = -INFINITY;
    return;
  }
  const float* row = S + static_cast<int64_t>(blockIdx.y) * p.heads * cols + s;
  float total = 0.0f;
  for (int h = 0; h < p.heads; ++h) total += (fmaxf(row[h * cols], 0.0f) * dot_scale) * wh[h];
  scores[i * p.num_keys + s] = total;
}

constexpr int kTopkThreads = 1024, kTopkWarps = kTopkThreads / 32;

__device__ __forceinline__ unsigned lanes_below() {
  unsigned m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

// Block per query: radix-select the keep-th largest key (4 passes of 8 bits; same-bin lanes of a warp
// meet in __match_any_sync so a shared-memory bin takes one atomic per warp, not up to 32), take every
// larger entry (warp-aggregated slots) and the lowest-index equal ones, sort them (key descending, index
// ascending) and pad with -1. CACHED: the row's keys are first copied to shared memory (dynamic, sized
// by num_keys on the host), so the passes never go back to L2.
template <bool CACHED>
__global__ void __launch_bounds__(kTopkThreads) indexer_topk_kernel(IndexerParams p, const float* scores, int topk,
                                                                    int32_t* indices) {
  pdl_prologue();
  extern __shared__ uint32_t cache[];
  __shared__ int hist[256];
  __shared__ uint32_t sel_key[kMaxIndexerTopk];
  __shared__ int32_t sel_idx[kMaxIndexerTopk];
  __shared__ uint32_t prefix_s;
  __shared__ int remaining_s, count_s;
  __shared__ int warp_tot[kTopkWarps];
  const int64_t i = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* row = scores + i * p.num_keys;
  int64_t num_keys = 0;
  keys_of(p, i, num_keys);
  const int64_t vis = max(int64_t{0}, min(num_keys, (p.positions[i] + 1) / p.ratio));
  const int keep = static_cast<int>(min(static_cast<int64_t>(topk), vis));
  int32_t* out = indices + i * topk;
  for (int j = keep + tid; j < topk; j += kTopkThreads) out[j] = -1;
  if (keep == 0) return;
  if (CACHED) {
#pragma unroll 8
    for (int64_t s = tid; s < vis; s += kTopkThreads) cache[s] = float_key(row[s]);
  }
  auto key_at = [&](int64_t s) -> uint32_t { return CACHED ? cache[s] : float_key(row[s]); };
  const int64_t span = (vis + kTopkThreads - 1) / kTopkThreads * kTopkThreads;  // whole warps iterate

  // Every visible key taken (a row of at most topk keys: contexts up to topk * ratio): no threshold to find, the
  // entries go to the sort as they are (the same set, so the same sorted output).
  const bool all = p.fast_topk && keep == vis;
  if (all) {
    for (int j = tid; j < keep; j += kTopkThreads) sel_key[j] = key_at(j), sel_idx[j] = j;
  }
  if (tid == 0) prefix_s = 0, remaining_s = keep, count_s = 0;
  for (int shift = 24; shift >= 0 && !all; shift -= 8) {
    for (int b = tid; b < 256; b += kTopkThreads) hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = prefix_s;
#pragma unroll 4
    for (int64_t s = tid; s < span; s += kTopkThreads) {
      const uint32_t u = s < vis ? key_at(s) : 0u;
      const bool in = s < vis && (shift == 24 || (u >> (shift + 8)) == (prefix >> (shift + 8)));
      const unsigned active = __ballot_sync(0xffffffffu, in);
      if (in) {
        const uint32_t bin = (u >> shift) & 255u;
        const unsigned peers = __match_any_sync(active, bin);
        if (lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
      }
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l holds bins 255-8l .. 248-8l (highest first); a warp scan finds the bin holding the
      // remaining-th largest key.
      const int need = remaining_s;
      int local[8], sum = 0;
#pragma unroll
      for (int q = 0; q < 8; ++q) sum += local[q] = hist[255 - 8 * lane - q];
      int incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const int excl = incl - sum;
      const unsigned hit = __ballot_sync(0xffffffffu, excl < need && need <= incl);
      if (lane == __ffs(hit) - 1) {
        int cum = excl, q = 0;
        for (; q < 7; ++q) {
          if (cum + local[q] >= need) break;
          cum += local[q];
        }
        remaining_s = need - cum;
        prefix_s = prefix | (static_cast<uint32_t>(255 - 8 * lane - q) << shift);
      }
    }
    __syncthreads();
  }
  // (Every key taken: no threshold, and thread 0's stores above were never published by a barrier: not read.)
  const uint32_t thresh = all ? 0u : prefix_s;
  const int need_equal = all ? 0 : remaining_s;  // entries equal to thresh to take, lowest index first
  // Larger entries, in any order (sorted below): one slot reservation per warp.
#pragma unroll 4
  for (int64_t s = tid; s < span && !all; s += kTopkThreads) {
    const uint32_t u = s < vis ? key_at(s) : 0u;
    const bool take = s < vis && u > thresh;
    const unsigned ballot = __ballot_sync(0xffffffffu, take);
    if (ballot == 0) continue;
    int base = 0;
    if (lane == 0) base = atomicAdd(&count_s, __popc(ballot));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (take) {
      const int slot = base + __popc(ballot & lanes_below());
      sel_key[slot] = u;
      sel_idx[slot] = static_cast<int32_t>(s);
    }
  }
  // Equal entries: contiguous segments per thread, ranked by a block scan.
  const int64_t seg = all ? 0 : (vis + kTopkThreads - 1) / kTopkThreads;
  const int64_t b0 = tid * seg, b1 = min(vis, b0 + seg);
  int mine = 0;
  for (int64_t s = b0; s < b1; ++s) mine += key_at(s) == thresh;
  int incl = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  int rank = incl - mine;
  for (int w = 0; w < warp; ++w) rank += warp_tot[w];
  const int base = keep - need_equal;
  for (int64_t s = b0; s < b1 && rank < need_equal; ++s)
    if (key_at(s) == thresh) {
      sel_key[base + rank] = thresh;
      sel_idx[base + rank] = static_cast<int32_t>(s);
      ++rank;
    }
  // Bitonic sort of the keep entries (padded to a power of two) by key desc, index asc.
  int size = 1;
  while (size < keep) size <<= 1;
  for (int j = keep + tid; j < size; j += kTopkThreads) sel_key[j] = 0, sel_idx[j] = INT32_MAX;
  __syncthreads();
  if (p.fast_topk && size <= kTopkThreads) {
    // One entry a thread, in registers: the compare-exchanges of partners less than a warp apart by shuffles,
    // the others through shared memory (at 512 entries 10 of the network's 45 stages, two barriers each,
    // where every stage took a barrier). The same network, so the same order (a total one: indices differ).
    uint32_t key = sel_key[tid];
    int32_t idx = sel_idx[tid];
    if (tid >= size) key = 0, idx = INT32_MAX;  // (past the network: never paired with an entry below size)
    for (int k = 2; k <= size; k <<= 1)
      for (int j = k >> 1; j > 0; j >>= 1) {
        uint32_t pk;
        int32_t pi;
        if (j >= 32) {
          sel_key[tid] = key, sel_idx[tid] = idx;
          __syncthreads();
          pk = sel_key[tid ^ j], pi = sel_idx[tid ^ j];
          __syncthreads();  // (the next stage's stores)
        } else {
          pk = __shfl_xor_sync(0xffffffffu, key, j);
          pi = __shfl_xor_sync(0xffffffffu, idx, j);
        }
        const bool mine_better = key > pk || (key == pk && idx < pi);
        const bool lower = (tid & j) == 0, ascending_block = (tid & k) == 0;
        // The lower position of an ascending block keeps the better entry, the upper one the worse; a
        // descending block the other way round.
        if (mine_better != (lower == ascending_block)) key = pk, idx = pi;
      }
    if (tid < keep) out[tid] = idx;
    return;
  }
  for (int k = 2; k <= size; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int x = tid; x < size; x += kTopkThreads) {
        const int y = x ^ j;
        if (y <= x) continue;
        const bool x_first = sel_key[x] > sel_key[y] || (sel_key[x] == sel_key[y] && sel_idx[x] < sel_idx[y]);
        const bool ascending_block = (x & k) == 0;  // this half wants "better first"
        if (x_first != ascending_block) {
          const uint32_t tk = sel_key[x];
          sel_key[x] = sel_key[y], sel_key[y] = tk;
          const int32_t ti = sel_idx[x];
          sel_idx[x] = sel_idx[y], sel_idx[y] = ti;
        }
      }
      __syncthreads();
    }
  for (int j = tid; j < keep; j += kTopkThreads) out[j] = sel_idx[j];
}

}  // namespace
}  // namespace dev

void launch_indexer_scores(const IndexerParams& p, float* scores, cudaStream_t stream) {
  if (p.n == 0 || p.num_keys == 0) return;
  const dim3 grid(static_cast<unsigned>((p.num_keys + dev::kKeysPerBlock - 1) / dev::kKeysPerBlock),
                  static_cast<unsigned>(p.n));
  launch(dev::indexer_scores_kernel, grid, dev::kScoreThreads, 0, stream, p, scores);
}

void launch_indexer_gather_keys(const IndexerParams& p, float* out, cudaStream_t stream) {
  const int64_t n = p.num_keys * p.dim / 4;
  if (n == 0) return;
  launch(dev::indexer_gather_keys_kernel, dev::grid_stride_blocks(n), 256, 0, stream, p.keys, p.num_keys,
         p.dim, out);
}

void launch_indexer_reduce(const IndexerParams& p, const float* S, int64_t first, int64_t count, int64_t cols,
                           float* scores, cudaStream_t stream) {
  if (count == 0 || p.num_keys == 0) return;
  const dim3 grid(static_cast<unsigned>((p.num_keys + 127) / 128), static_cast<unsigned>(count));
  launch(dev::indexer_reduce_kernel, grid, 128, 0, stream, p, S, first, cols, scores);
}

void launch_indexer_topk(const IndexerParams& p, const float* scores, int topk, int32_t* indices,
                         cudaStream_t stream) {
  if (p.n == 0) return;
  const unsigned grid = static_cast<unsigned>(p.n);
  if (p.num_keys <= kIndexerTopkCachedKeys) {
    static const bool opted_in = [] {  // the cache may pass the default 48 KiB of shared memory
      return cudaFuncSetAttribute(dev::indexer_topk_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kIndexerTopkCachedKeys * sizeof(uint32_t))) == cudaSuccess;
    }();
    (void)opted_in;  // a failure shows as the launch's error
    const size_t smem = static_cast<size_t>(std::max<int64_t>(p.num_keys, 1)) * sizeof(uint32_t);
    launch(dev::indexer_topk_kernel<true>, grid, dev::kTopkThreads, smem, stream, p, scores, topk, indices);
  } else {
    launch(dev::indexer_topk_kernel<false>, grid, dev::kTopkThreads, 0, stream, p, scores, topk, indices);
  }
}

}  // namespace tern::cuda
