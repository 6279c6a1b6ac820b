// Lightning indexer: f32 scores (CUDA cores: the top-k must agree with the CPU reference, so no bf16
// rounding here), then an exact top-k per query by radix select on order-preserving float keys.
#include <algorithm>

#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/indexer.cuh"

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

constexpr int kKeysPerBlock = 64, kHeadsMax = 64, kDimChunk = 64;

// Block per (query, 64 keys). Thread (kg, hg) accumulates 4 keys x 4 heads over the dims, which pass
// through shared memory in chunks of 64 (q and keys stored dim-major, so each step is two 16-byte loads).
__global__ void __launch_bounds__(256) indexer_scores_kernel(IndexerParams p, float* scores) {
  __shared__ __align__(16) float qs[kDimChunk][kHeadsMax];
  __shared__ __align__(16) float ks[kDimChunk][kKeysPerBlock];
  __shared__ float red[16][kKeysPerBlock];
  const int64_t i = blockIdx.y, s0 = static_cast<int64_t>(blockIdx.x) * kKeysPerBlock;
  const int kg = threadIdx.x % 16, hg = threadIdx.x / 16;
  const int64_t visible = (p.positions[i] + 1) / p.ratio;
  int64_t num_keys = 0;
  const PagedRowsDesc keys = keys_of(p, i, num_keys);
  if (s0 >= num_keys) return;  // decode mode: beyond this slot's keys (the whole block)
  float acc[4][4] = {};
  for (int64_t d0 = 0; d0 < p.dim; d0 += kDimChunk) {
#pragma unroll
    for (int idx = threadIdx.x; idx < kDimChunk * kHeadsMax; idx += blockDim.x) {
      const int h = idx / kDimChunk, d = idx % kDimChunk;
      qs[d][h] = (h < p.heads && d0 + d < p.dim) ? p.q[(i * p.heads + h) * p.dim + d0 + d] : 0.0f;
    }
#pragma unroll
    for (int idx = threadIdx.x; idx < kDimChunk * kKeysPerBlock; idx += blockDim.x) {
      const int kk = idx / kDimChunk, d = idx % kDimChunk;
      const int64_t s = s0 + kk;
      ks[d][kk] = (s < num_keys && d0 + d < p.dim) ? reinterpret_cast<const float*>(paged_row(keys, s))[d0 + d] : 0.0f;
    }
    __syncthreads();
#pragma unroll 4
    for (int d = 0; d < kDimChunk; ++d) {
      const float4 k4 = *reinterpret_cast<const float4*>(&ks[d][4 * kg]);
      const float4 q4 = *reinterpret_cast<const float4*>(&qs[d][4 * hg]);
      const float kv[4] = {k4.x, k4.y, k4.z, k4.w}, qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] += qv[b] * kv[a];
    }
    __syncthreads();
  }
  const float head_scale = rsqrtf(static_cast<float>(p.heads)), dot_scale = rsqrtf(static_cast<float>(p.dim));
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    float part = 0.0f;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int h = 4 * hg + b;
      if (h < p.heads) part += (fmaxf(acc[a][b], 0.0f) * dot_scale) * (p.weights[i * p.heads + h] * head_scale);
    }
    red[hg][4 * kg + a] = part;
  }
  __syncthreads();
  if (threadIdx.x < kKeysPerBlock) {
    const int64_t s = s0 + threadIdx.x;
    if (s < num_keys) {
      float total = 0.0f;
      for (int g = 0; g < 16; ++g) total += red[g][threadIdx.x];
      scores[i * p.num_keys + s] = s < visible ? total : -INFINITY;
    }
  }
}

constexpr int kTopkThreads = 512;

// Block per query: radix-select the keep-th largest key, take every larger entry and the lowest-index
// equal ones, sort them (key descending, index ascending) and pad with -1.
__global__ void __launch_bounds__(kTopkThreads) indexer_topk_kernel(IndexerParams p, const float* scores, int topk,
                                                                    int32_t* indices) {
  __shared__ int hist[256];
  __shared__ uint32_t sel_key[kMaxIndexerTopk];
  __shared__ int32_t sel_idx[kMaxIndexerTopk];
  __shared__ uint32_t prefix_s;
  __shared__ int remaining_s, count_s;
  __shared__ int warp_tot[kTopkThreads / 32];
  const int64_t i = blockIdx.x;
  const float* row = scores + i * p.num_keys;
  int64_t num_keys = 0;
  keys_of(p, i, num_keys);
  const int64_t vis = max(int64_t{0}, min(num_keys, (p.positions[i] + 1) / p.ratio));
  const int keep = static_cast<int>(min(static_cast<int64_t>(topk), vis));
  int32_t* out = indices + i * topk;
  for (int j = keep + threadIdx.x; j < topk; j += blockDim.x) out[j] = -1;
  if (keep == 0) return;

  if (threadIdx.x == 0) prefix_s = 0, remaining_s = keep;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = prefix_s;
#pragma unroll 4
    for (int64_t s = threadIdx.x; s < vis; s += blockDim.x) {
      const uint32_t u = float_key(row[s]);
      if (shift == 24 || (u >> (shift + 8)) == (prefix >> (shift + 8))) atomicAdd(&hist[(u >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l holds bins 255-8l .. 248-8l (highest first); a warp scan finds the bin holding the
      // remaining-th largest key.
      const int lane = threadIdx.x, need = remaining_s;
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
  const uint32_t thresh = prefix_s;
  const int need_equal = remaining_s;  // entries equal to thresh to take, lowest index first
  if (threadIdx.x == 0) count_s = 0;
  __syncthreads();
  // Larger entries, in any order (sorted below).
#pragma unroll 4
  for (int64_t s = threadIdx.x; s < vis; s += blockDim.x) {
    const uint32_t u = float_key(row[s]);
    if (u > thresh) {
      const int slot = atomicAdd(&count_s, 1);
      sel_key[slot] = u;
      sel_idx[slot] = static_cast<int32_t>(s);
    }
  }
  // Equal entries: contiguous segments per thread, ranked by a block scan.
  const int64_t seg = (vis + blockDim.x - 1) / blockDim.x;
  const int64_t b0 = threadIdx.x * seg, b1 = min(vis, b0 + seg);
  int mine = 0;
#pragma unroll 4
  for (int64_t s = b0; s < b1; ++s) mine += float_key(row[s]) == thresh;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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
    if (float_key(row[s]) == thresh) {
      sel_key[base + rank] = thresh;
      sel_idx[base + rank] = static_cast<int32_t>(s);
      ++rank;
    }
  // Bitonic sort of the keep entries (padded to a power of two) by key desc, index asc.
  int size = 1;
  while (size < keep) size <<= 1;
  for (int j = keep + threadIdx.x; j < size; j += blockDim.x) sel_key[j] = 0, sel_idx[j] = INT32_MAX;
  __syncthreads();
  for (int k = 2; k <= size; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int x = threadIdx.x; x < size; x += blockDim.x) {
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
  for (int j = threadIdx.x; j < keep; j += blockDim.x) out[j] = sel_idx[j];
}

}  // namespace
}  // namespace dev

void launch_indexer_scores(const IndexerParams& p, float* scores, cudaStream_t stream) {
  if (p.n == 0 || p.num_keys == 0) return;
  const dim3 grid(static_cast<unsigned>((p.num_keys + dev::kKeysPerBlock - 1) / dev::kKeysPerBlock),
                  static_cast<unsigned>(p.n));
  dev::indexer_scores_kernel<<<grid, 256, 0, stream>>>(p, scores);
}

void launch_indexer_topk(const IndexerParams& p, const float* scores, int topk, int32_t* indices,
                         cudaStream_t stream) {
  if (p.n == 0) return;
  dev::indexer_topk_kernel<<<static_cast<unsigned>(p.n), dev::kTopkThreads, 0, stream>>>(p, scores, topk, indices);
}

}  // namespace tern::cuda
