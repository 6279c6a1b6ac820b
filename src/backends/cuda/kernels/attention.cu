// Sparse attention, the f32 CUDA-core path (f32 rows and shapes the tensor-core path does not take): grid (query, group of 8 heads, key split). Each block
// walks its split of the query's keys in tiles of 16 rows, decoded once into shared memory and shared by
// the 8 heads (one warp each; a lane holds head_dim/32 dims of q and of the output). Online softmax per
// head; with several splits the partial (max, sum, rows) go to the workspace and a combine kernel adds
// the sink. Masked keys (a -1 pick) weigh nothing.
//
// Batch invariance: how a query's keys are cut into splits depends on its own key count only (runs of
// kKeysPerSplit keys, at most kMaxSplits runs), never on how many queries share the launch, so a query's
// output is the same bits in a prefill chunk of any size and in a decode step. A launch covers at most
// kMaxPartialFloats of partials; longer chunks are launched in query ranges.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/attention_keys.cuh"
#include "backends/cuda/kernels/attention_split.cuh"
#include "backends/cuda/kernels/kv_row_dev.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/rope.cuh"
#include "core/env.h"
#include "core/error.h"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kHeadsPerBlock = 8, kTile = 16;
constexpr int64_t kKeysPerSplit = 64, kMaxSplits = 64, kMaxPartialFloats = int64_t{1} << 25;

__host__ __device__ inline KeySplits split_plan(int64_t keys) { return plan_key_splits(keys, kKeysPerSplit, kMaxSplits); }

// A tile's raw bytes in registers: warp w loads rows w and w + 8 of the tile (FP8 rows: 8-byte granules, 8
// e4m3 values or 4 bf16 rope values each, and the granule's scale byte; f32 rows: float4), so the loads of
// the next tile can be in flight while the block computes on this one.
constexpr int kRowsPerWarp = kTile / kHeadsPerBlock;

// Two e4m3 values (low byte first) as f32, exactly (every e4m3 value, subnormals and NaN included, is an f16).
__device__ __forceinline__ float2 e4m3x2_to_f32(uint16_t two) {
  const __half2 h(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3));
  return __half22float2(h);
}

template <int HD, bool FP8>
struct TileRegs {
  static constexpr int kVec = HD / 4 / 32;             // f32 rows: float4 per lane and row
  static constexpr int kPer = (HD / 8 + 31) / 32 + 1;  // FP8 rows: granules per lane (nope / 8 + rope / 4)
  float4 f[FP8 ? 1 : kRowsPerWarp][FP8 ? 1 : kVec];
  uint2 v[FP8 ? kRowsPerWarp : 1][FP8 ? kPer : 1];
  uint8_t sc[FP8 ? kRowsPerWarp : 1][FP8 ? kPer : 1];
};

template <int HD, bool FP8>
__device__ __forceinline__ void load_tile(const KvRowDesc& f, const uint8_t* const* rows, TileRegs<HD, FP8>& t) {
  using Regs = TileRegs<HD, FP8>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if constexpr (!FP8) {
#pragma unroll
    for (int u = 0; u < kRowsPerWarp; ++u)
#pragma unroll
      for (int c = 0; c < Regs::kVec; ++c) {
        const uint8_t* row = rows[warp + kHeadsPerBlock * u];
        t.f[u][c] = row != nullptr ? __ldg(reinterpret_cast<const float4*>(row) + lane + 32 * c) : make_float4(0, 0, 0, 0);
      }
  } else {
  const int nope = static_cast<int>(f.head_dim - f.rope_dim), fp8_gran = nope / 8;
  const int granules = fp8_gran + static_cast<int>(f.rope_dim) / 4;
  const int scale_at = nope + 2 * static_cast<int>(f.rope_dim);
#pragma unroll
  for (int u = 0; u < kRowsPerWarp; ++u)
#pragma unroll
    for (int c = 0; c < Regs::kPer; ++c) {
      const uint8_t* row = rows[warp + kHeadsPerBlock * u];
      const int g = lane + 32 * c;
      t.v[u][c] = make_uint2(0, 0);
      t.sc[u][c] = 127;
      if (row != nullptr && g < granules) {
        t.v[u][c] = __ldg(reinterpret_cast<const uint2*>(row) + g);
        if (g < fp8_gran) t.sc[u][c] = __ldg(row + scale_at + g / 8);
      }
    }
  }
}

// The registers of load_tile decoded to f32 into the shared tile.
template <int HD, bool FP8>
__device__ __forceinline__ void store_tile(const KvRowDesc& f, const TileRegs<HD, FP8>& t, float (*tile)[HD]) {
  using Regs = TileRegs<HD, FP8>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if constexpr (!FP8) {
#pragma unroll
    for (int u = 0; u < kRowsPerWarp; ++u)
#pragma unroll
      for (int c = 0; c < Regs::kVec; ++c)
        *reinterpret_cast<float4*>(&tile[warp + kHeadsPerBlock * u][4 * (lane + 32 * c)]) = t.f[u][c];
  } else {
  const int nope = static_cast<int>(f.head_dim - f.rope_dim), fp8_gran = nope / 8;
  const int granules = fp8_gran + static_cast<int>(f.rope_dim) / 4;
#pragma unroll
  for (int u = 0; u < kRowsPerWarp; ++u)
#pragma unroll
    for (int c = 0; c < Regs::kPer; ++c) {
      const int g = lane + 32 * c;
      if (g >= granules) continue;
      float* dst = tile[warp + kHeadsPerBlock * u];
      if (g < fp8_gran) {
        const float sc = e8m0_to_f32(t.sc[u][c]);
        const uint32_t w[2] = {t.v[u][c].x, t.v[u][c].y};
        float o[8];
#pragma unroll
        for (int b = 0; b < 8; b += 2) {  // hardware e4m3x2 -> f16x2 (exact), then f32
          const float2 v = e4m3x2_to_f32(static_cast<uint16_t>(w[b / 4] >> (8 * (b % 4))));
          o[b] = v.x * sc;
          o[b + 1] = v.y * sc;
        }
        *reinterpret_cast<float4*>(dst + 8 * g) = make_float4(o[0], o[1], o[2], o[3]);
        *reinterpret_cast<float4*>(dst + 8 * g + 4) = make_float4(o[4], o[5], o[6], o[7]);
      } else {
        const int d = nope + 4 * (g - fp8_gran);
        *reinterpret_cast<float4*>(dst + d) =
            make_float4(__uint_as_float(t.v[u][c].x << 16), __uint_as_float(t.v[u][c].x & 0xffff0000u),
                        __uint_as_float(t.v[u][c].y << 16), __uint_as_float(t.v[u][c].y & 0xffff0000u));
      }
    }
  }
}

// Keys whose rows are looked up in one go (threads 0..63 in parallel: one round of index / block-table
// loads per 64 keys instead of one per tile).
constexpr int kRowsPerRound = 64;

template <int DPL, bool FP8>  // float4 groups per lane: head_dim = 128 * DPL; FP8 or f32 rows
__global__ void __launch_bounds__(256, FP8 ? 2 : 1) attention_kernel(AttentionParams a, int64_t q0, int zsplits) {
  pdl_prologue();
  constexpr int HD = 128 * DPL;
  __shared__ __align__(16) float tile[kTile][HD];
  __shared__ const uint8_t* rows[kRowsPerRound];
  __shared__ float scores[kHeadsPerBlock][kTile];
  const int64_t i = q0 + blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t h = static_cast<int64_t>(blockIdx.y) * kHeadsPerBlock + warp;
  const int split = blockIdx.z;
  const KeyList kl = keys_of(a, i);
  if (kl.p < 0) {  // an inert decode slot: zeros, no reads
    if (split == 0 && h < a.heads)
      for (int d = lane; d < HD; d += 32) a.out[(i * a.heads + h) * HD + d] = 0.0f;
    return;
  }
  const int64_t total = kl.nwin + kl.count;
  const KeySplits plan = split_plan(total);
  if (split >= plan.splits) return;  // the whole block: the plan is the query's
  const int splits = plan.splits;
  const int64_t j0 = split * plan.per, j1 = min(total, j0 + plan.per);
  const bool active = h < a.heads;

  float4 q[DPL], o[DPL];
#pragma unroll
  for (int r = 0; r < DPL; ++r) {
    q[r] = active ? *reinterpret_cast<const float4*>(a.q + (i * a.heads + h) * HD + 128 * r + 4 * lane)
                  : make_float4(0, 0, 0, 0);
    o[r] = make_float4(0, 0, 0, 0);
  }
  float m = -INFINITY, l = 0.0f;
  TileRegs<HD, FP8> next;
  for (int64_t jr = j0; jr < j1; jr += kRowsPerRound) {
    const int nr = static_cast<int>(min(static_cast<int64_t>(kRowsPerRound), j1 - jr));
    const int tiles = (nr + kTile - 1) / kTile;
    __syncthreads();  // the previous round's rows are no longer read
    if (threadIdx.x < kRowsPerRound) rows[threadIdx.x] = threadIdx.x < nr ? key_row(a, i, kl, jr + threadIdx.x) : nullptr;
    __syncthreads();
    load_tile<HD, FP8>(a.fmt, rows, next);
    for (int t = 0; t < tiles; ++t) {
      const uint8_t* const* trows = rows + kTile * t;
      store_tile<HD, FP8>(a.fmt, next, tile);
      __syncthreads();
      if (t + 1 < tiles) load_tile<HD, FP8>(a.fmt, trows + kTile, next);  // in flight during this tile's math
      if (active) {
        // Scores of the tile's keys (lane 0 keeps them in shared memory; every lane reads them back).
        float tile_max = -INFINITY;
#pragma unroll 2
        for (int jj = 0; jj < kTile; ++jj) {
          float part = 0.0f;
#pragma unroll
          for (int r = 0; r < DPL; ++r) {
            const float4 k4 = *reinterpret_cast<const float4*>(&tile[jj][128 * r + 4 * lane]);
            part += q[r].x * k4.x + q[r].y * k4.y + q[r].z * k4.z + q[r].w * k4.w;
          }
          float sj = warp_sum(part) * a.scale;
          if (trows[jj] == nullptr) sj = -INFINITY;
          tile_max = fmaxf(tile_max, sj);
          if (lane == 0) scores[warp][jj] = sj;
        }
        __syncwarp();
        if (tile_max > -INFINITY) {
          const float m_new = fmaxf(m, tile_max);
          const float corr = expf(m - m_new);
          l *= corr;
#pragma unroll
          for (int r = 0; r < DPL; ++r) o[r].x *= corr, o[r].y *= corr, o[r].z *= corr, o[r].w *= corr;
#pragma unroll 2
          for (int jj = 0; jj < kTile; ++jj) {
            const float pj = expf(scores[warp][jj] - m_new);
            l += pj;
#pragma unroll
            for (int r = 0; r < DPL; ++r) {
              const float4 k4 = *reinterpret_cast<const float4*>(&tile[jj][128 * r + 4 * lane]);
              o[r].x += pj * k4.x, o[r].y += pj * k4.y, o[r].z += pj * k4.z, o[r].w += pj * k4.w;
            }
          }
          m = m_new;
        }
        __syncwarp();
      }
      __syncthreads();  // the tile is consumed before the next store
    }
  }
  if (!active) return;
  if (splits == 1) {
    const float sink = a.sinks[h];
    const float top = fmaxf(m, sink);
    const float keep = expf(m - top);
    const float inv = 1.0f / (l * keep + expf(sink - top));
    float* dst = a.out + (i * a.heads + h) * HD;
#pragma unroll
    for (int r = 0; r < DPL; ++r) {
      const float f = keep * inv;
      *reinterpret_cast<float4*>(dst + 128 * r + 4 * lane) = make_float4(o[r].x * f, o[r].y * f, o[r].z * f, o[r].w * f);
    }
    return;
  }
  float* part = a.partial + ((static_cast<int64_t>(blockIdx.x) * a.heads + h) * zsplits + split) * (HD + 4);
#pragma unroll
  for (int r = 0; r < DPL; ++r) *reinterpret_cast<float4*>(part + 128 * r + 4 * lane) = o[r];
  if (lane == 0) part[HD] = m, part[HD + 1] = l;
}

// One block per (query, head): merge the splits with the sink. A split's record is its hd weighted-row
// floats, then max and sum, padded to hd + 4 floats so every record stays 16-byte aligned. Warp 0 turns
// the (max, sum) pairs into one weight per split; then each dim adds its splits' rows in order.
__global__ void attention_combine_kernel(AttentionParams a, int64_t q0, int zsplits, int64_t hd) {
  pdl_prologue();
  __shared__ float weight[kMaxSplits];
  const int64_t ih = blockIdx.x, h = ih % a.heads, i = q0 + ih / a.heads;
  const KeyList kl = keys_of(a, i);
  const int splits = split_plan(kl.nwin + kl.count).splits;
  if (splits == 1 || kl.p < 0) return;  // written by the attention kernel
  const float* part = a.partial + ih * zsplits * (hd + 4);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const float sink = a.sinks[h];
    float m[2], l[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int s = lane + 32 * u;
      m[u] = s < splits ? part[s * (hd + 4) + hd] : -INFINITY;
      l[u] = s < splits ? part[s * (hd + 4) + hd + 1] : 0.0f;
    }
    const float top = fmaxf(warp_max(fmaxf(m[0], m[1])), sink);
    const float e0 = expf(m[0] - top), e1 = expf(m[1] - top);
    const float denom = warp_sum(l[0] * e0 + l[1] * e1) + expf(sink - top);
    weight[lane] = e0 / denom;
    weight[lane + 32] = e1 / denom;
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) acc += part[s * (hd + 4) + d] * weight[s];
    a.out[(q0 * a.heads + ih) * hd + d] = acc;
  }
}

template <int DPL>
void launch_rows(const AttentionParams& p, dim3 grid, int64_t q0, int splits, cudaStream_t stream) {
  if (p.fmt.fp8)
    launch(attention_kernel<DPL, true>, grid, 256, 0, stream, p, q0, splits);
  else
    launch(attention_kernel<DPL, false>, grid, 256, 0, stream, p, q0, splits);
}

int64_t max_keys(const AttentionParams& p) {
  const int64_t comp = p.ratio == 0 ? 0 : (p.selected != nullptr ? p.k_sel : p.num_compressed);
  if (p.positions != nullptr) return p.window + comp;  // decode mode: the bound over any position
  return std::min(p.window, p.start + p.n) + comp;
}

}  // namespace
}  // namespace dev

namespace {
std::atomic<int> g_attention_decode{-1};  // an AttentionDecode; -1: not read from the environment yet

constexpr const char* kDecodeNames[] = {"cluster", "heads", "heads16", "heads32"};
}  // namespace

AttentionDecode attention_decode() {
  int v = g_attention_decode.load(std::memory_order_relaxed);
  if (v < 0) {
    // heads (attention_heads_kernel, 16 or 32 heads a block by launch size): the default, measured faster at every
    // batch (results.md, session 11 call 8); heads16, heads32 force the block; cluster: attention_mma_kernel, all
    // heads a block.
    const std::string s = env_choice("TERN_ATTENTION_DECODE", {"heads", "heads16", "heads32", "cluster"}, "heads");
    for (int k = 0; k < 4; ++k)
      if (s == kDecodeNames[k]) v = k;
    g_attention_decode.store(v, std::memory_order_relaxed);
  }
  return static_cast<AttentionDecode>(v);
}

void set_attention_decode(AttentionDecode d) { g_attention_decode.store(static_cast<int>(d), std::memory_order_relaxed); }

const char* attention_decode_name(AttentionDecode d) { return kDecodeNames[static_cast<int>(d)]; }

AttentionPath attention_path(const AttentionParams& p) {
  if (!attention_built_for(p.fmt.head_dim)) return AttentionPath::f32_cuda_cores_any_width;
  const int64_t hd = p.fmt.head_dim;
  const size_t smem = attention_mma_smem_bytes(p.fmt);
  const bool mma = p.fmt.fp8 && p.heads <= kAttentionMmaMaxHeads && (hd == 128 || hd == 256 || hd == 512) &&
                   smem > 0 && smem <= kAttentionMmaMaxSmem;
  if (!mma) return AttentionPath::f32_cuda_cores;
  const size_t prefill_smem = attention_prefill_smem_bytes(p.fmt);
  const bool prefill = p.prefill && p.positions == nullptr && attention_prefill_enabled() && prefill_smem > 0 &&
                       prefill_smem <= kAttentionMmaMaxSmem;
  if (prefill) return AttentionPath::bf16_tensor_cores_prefill;
  const bool heads = attention_decode() != AttentionDecode::cluster && attention_heads_supported(p.fmt, p.heads);
  return heads ? AttentionPath::bf16_tensor_cores_heads : AttentionPath::bf16_tensor_cores;
}

const char* attention_path_name(AttentionPath path) {
  switch (path) {
    case AttentionPath::bf16_tensor_cores_prefill:
      switch (attention_prefill_version()) {
        case 2: return "bf16 tensor cores, prefill (attention_prefill_wgmma_kernel)";
        case 3: return "bf16 tensor cores, prefill (attention_prefill_wgmma_kernel, overlapped decode)";
        case 4: return "bf16 tensor cores, prefill (attention_prefill_ws_kernel, warp-specialised)";
        case 5: return "bf16 tensor cores, prefill (attention_prefill_ws_kernel on keys decoded once a launch)";
        default: return "bf16 tensor cores, prefill (attention_prefill_kernel)";
      }
    case AttentionPath::bf16_tensor_cores_heads:
      switch (attention_decode()) {
        case AttentionDecode::heads16: return "bf16 tensor cores (attention_heads_kernel, 16 heads a block)";
        case AttentionDecode::heads32: return "bf16 tensor cores (attention_heads_kernel, 32 heads a block)";
        default: return "bf16 tensor cores (attention_heads_kernel, 16 or 32 heads a block by launch size)";
      }
    case AttentionPath::f32_cuda_cores_any_width:
      return "f32 CUDA cores, a head_dim of its own (attention_any_kernel)";
    case AttentionPath::bf16_tensor_cores:
      return attention_decode() == AttentionDecode::cluster
                 ? "bf16 tensor cores (attention_mma_kernel)"
                 : "bf16 tensor cores (attention_mma_kernel: TERN_ATTENTION_DECODE asks for attention_heads_kernel, "
                   "which takes FP8 rows with 64 rope dims only)";
    default: return "f32 CUDA cores (attention_kernel + attention_combine_kernel)";
  }
}

int attention_splits(const AttentionParams& p) { return dev::split_plan(dev::max_keys(p)).splits; }

namespace {
// Queries per launch: all of them unless their partials would pass kMaxPartialFloats.
int64_t queries_per_launch(const AttentionParams& p, int splits) {
  if (splits == 1) return p.n;
  const int64_t per_query = p.heads * splits * (p.fmt.head_dim + 4);
  return std::clamp<int64_t>(dev::kMaxPartialFloats / per_query, 1, p.n);
}
}  // namespace

int64_t attention_partial_floats(const AttentionParams& p) {
  const AttentionPath path = attention_path(p);
  // Version 5's bf16 copy of the launch's key rows (attention_prefill_kv_bytes).
  if (path == AttentionPath::bf16_tensor_cores_prefill && attention_prefill_version() == 5)
    return (attention_prefill_kv_bytes(p) + 3) / 4;
  if (path != AttentionPath::f32_cuda_cores) return 0;
  const int splits = attention_splits(p);
  return splits > 1 ? queries_per_launch(p, splits) * p.heads * splits * (p.fmt.head_dim + 4) : 0;
}

namespace {
cudaError_t launch_attention_kernels(const AttentionParams& p, AttentionPath path, cudaStream_t stream);
}  // namespace

bool attention_out_in_kernel(const AttentionParams& p, int64_t rope_half) {
  const int64_t hd = p.fmt.head_dim;
  return attention_path(p) == AttentionPath::bf16_tensor_cores_prefill && attention_prefill_version() >= 2 &&
         hd % 256 == 0 && rope_half >= 0 && 2 * rope_half <= 64;
}

bool attention_q_norm_in_kernel(const AttentionParams& p, int64_t rope_half) {
  const int64_t hd = p.fmt.head_dim;
  return attention_path(p) == AttentionPath::bf16_tensor_cores_prefill && hd % 32 == 0 && hd >= 128 && hd <= 512 &&
         rope_half >= 0 && 2 * rope_half <= 128 && (hd - 2 * rope_half) % 2 == 0;  // (kQRopeCols)
}

cudaError_t launch_sparse_attention(const AttentionParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const AttentionPath path = attention_path(p);
  // The heads kernel rotates the rope dims back in its merge where they are whole float4 of pairs (V4: the last
  // 64 of 512); elsewhere rope_kernel after the attention, on the same floats (the same bits).
  const bool in_merge = path == AttentionPath::bf16_tensor_cores_heads &&
                        (p.fmt.head_dim - 2 * p.rope_half) % 4 == 0 && p.rope_half % 2 == 0;
  if (p.rope_inv_freq == nullptr || in_merge) return launch_attention_kernels(p, path, stream);
  AttentionParams plain = p;
  plain.rope_inv_freq = nullptr;
  const cudaError_t e = launch_attention_kernels(plain, path, stream);
  if (e != cudaSuccess) return e;
  launch_rope(p.out, p.n, p.heads, p.fmt.head_dim, p.positions, p.rope_inv_freq, p.rope_half, true, stream);
  return cudaGetLastError();
}

namespace {
cudaError_t launch_attention_kernels(const AttentionParams& p, AttentionPath path, cudaStream_t stream) {
  if (path == AttentionPath::bf16_tensor_cores_prefill) return launch_attention_prefill(p, stream);
  if (path == AttentionPath::bf16_tensor_cores) return launch_attention_mma(p, stream);
  if (path == AttentionPath::bf16_tensor_cores_heads) return launch_attention_heads(p, stream);
  if (path == AttentionPath::f32_cuda_cores_any_width) return launch_attention_any(p, stream);
  const int splits = attention_splits(p);
  const int64_t step = queries_per_launch(p, splits);
  const unsigned groups = static_cast<unsigned>((p.heads + dev::kHeadsPerBlock - 1) / dev::kHeadsPerBlock);
  for (int64_t q0 = 0; q0 < p.n; q0 += step) {
    const int64_t nq = std::min(step, p.n - q0);
    const dim3 grid(static_cast<unsigned>(nq), groups, static_cast<unsigned>(splits));
    switch (p.fmt.head_dim) {
      case 128: dev::launch_rows<1>(p, grid, q0, splits, stream); break;
      case 256: dev::launch_rows<2>(p, grid, q0, splits, stream); break;
      case 512: dev::launch_rows<4>(p, grid, q0, splits, stream); break;
      default: return cudaErrorInvalidValue;  // rejected by the backend's host check
    }
    if (splits > 1)
      launch(dev::attention_combine_kernel, static_cast<unsigned>(nq * p.heads), 128, 0, stream, p, q0,
             splits, p.fmt.head_dim);
  }
  return cudaSuccess;
}
}  // namespace

}  // namespace tern::cuda
