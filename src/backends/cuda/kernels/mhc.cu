// mHC kernels. The mixing logits are (2+hc)*hc dot products of length hc*D per token (24 x 16384 for
// V4-Flash): hc_mix splits that length over up to 64 blocks of 256 floats; in a block each warp owns
// rows of fn (row j: warp j % 8) and each lane a float4 of the slice, so a block reads its slice of fn once
// for up to 8 tokens and needs one warp reduction per (token, row). The finish kernels add the partials
// in a fixed order (results do not depend on scheduling nor on the other tokens of the launch), then one
// warp runs the softmax and Sinkhorn while the others collapse the streams, one float4 of D per thread
// with every load issued before the first use.
#include <algorithm>

#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/mhc.cuh"
#include "core/env.h"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kHc = 4;
constexpr int kMixWarps = 8, kMixThreads = 32 * kMixWarps;
constexpr int kMixTokens = kMixWarps;  // tokens per mix block: one a warp
constexpr int64_t kMixSlice = 256;  // floats of the flattened streams per split (before the cap)
constexpr int64_t kMaxSplits = 64;
constexpr int kSumLanes = 8;        // lanes adding one logit's partials
constexpr int kCollapseThreads = 256;
// The finish kernels' float4 a thread of each stream row: VEC = the row's float4 / 256, rounded up to 1, 2, 4 or
// 8 (launch_finish). Until session 33 every launch took kHcMaxD's 8: 164 registers a thread (the slice alone 128),
// so one 288-thread block an SM, 9 warps, where V4-Flash's D = 4 096 needs 4 (96 registers, two blocks an SM). Why
// (session 33, read from the profile and the registers, not yet timed): the 1K prefill's hc_pre_finish took 53 us a
// call for 64 MB of streams, ~21 us at copy. Same bits: the slots past D were zeros, added to nothing.
constexpr int kCollapseVecMax = static_cast<int>(kHcMaxD / 4 / kCollapseThreads);
constexpr int kPreThreads = kCollapseThreads + 32;                              // + the Sinkhorn warp

struct MixPlan {
  int splits;
  int64_t per;  // floats per split, a multiple of 4
};

MixPlan mix_plan(int64_t N) {
  const int64_t s = std::clamp<int64_t>((N + kMixSlice - 1) / kMixSlice, 1, kMaxSplits);
  const int64_t per = ((N + s - 1) / s + 3) / 4 * 4;
  return {static_cast<int>(s), per};
}

__device__ __forceinline__ float dot4(const float4& a, const float4& b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

__device__ __forceinline__ float4 ld4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

// partial[(t * (MIX + 1) + j) * splits + split] = fn[j, slice] . flat(X_t)[slice] (j < MIX) and the slice's
// sum of squares (j == MIX). Every entry is written, empty slices as 0.
// A block's nt tokens share its 8 warps: R = 8 / nt (rounded down to a power of two, at least 1) warps a token,
// warp (g, q) summing rows j = q, q + R, ... of token g. Its lanes hold two float4 of the slice per 256-float
// step; then one reduce-scatter over the lanes leaves slot s's sum in lane s (31 shuffles for up to 32 sums,
// where a warp_sum per value took 5 each). Every sum has warp_sum's tree (pairs 16 lanes apart, then 8, ...)
// and the same per-lane order whatever R, so the bits do not depend on which warp computed it (nor on T).
// (Warps that held 8 tokens' accumulators each ran one block a multiprocessor: 25 us at 64 tokens; a warp a
// token with all 25 sums took 17 us at one token.)
// The previous sub-layer's hc_post folded into hc_pre's mix (HcParams::prev_*): the mix computes the streams it
// reads and writes them.
struct HcPostIn {
  const float* streams = nullptr;  // [T, hc, D], the previous sub-layer's input streams
  const float* a = nullptr;        // [T, D]
  const float* post = nullptr;     // [T, hc]
  const float* comb = nullptr;     // [T, hc, hc]
  float* out = nullptr;            // [T, hc, D]: the streams this hc_pre reads
  int64_t D = 0;
};

// Output stream k of hc_post at 4 dims: post_k y + sum_j C[j][k] X_j, from the 4 input streams' float4 x, the
// sub-layer output's y, the token's comb C [hc][hc] and post_k. hc_post_kernel and the folded mix (hc_post_at) both
// compute it here, so the folded streams are hc_post's bits.
__device__ __forceinline__ float4 hc_post_stream(const float4 (&x)[kHc], const float4& y, const float* C, float post_k,
                                                 int k) {
  float4 mixed = make_float4(0, 0, 0, 0);
#pragma unroll
  for (int j = 0; j < kHc; ++j) {
    const float c = __ldg(C + j * kHc + k);
    mixed.x = fmaf(c, x[j].x, mixed.x);
    mixed.y = fmaf(c, x[j].y, mixed.y);
    mixed.z = fmaf(c, x[j].z, mixed.z);
    mixed.w = fmaf(c, x[j].w, mixed.w);
  }
  return make_float4(fmaf(post_k, y.x, mixed.x), fmaf(post_k, y.y, mixed.y), fmaf(post_k, y.z, mixed.z),
                     fmaf(post_k, y.w, mixed.w));
}

// hc_post of token t at flattened index k (stream k / D, dims k % D .. + 3).
__device__ __forceinline__ float4 hc_post_at(const HcPostIn& in, int64_t t, int64_t k) {
  // (32-bit division: k < hc * D <= 4 * kHcMaxD)
  const int ki = static_cast<int>(k), Di = static_cast<int>(in.D), s = ki / Di, d = ki - s * Di;
  const int64_t D = in.D;
  const float* X = in.streams + t * kHc * D;
  float4 x[kHc];
#pragma unroll
  for (int j = 0; j < kHc; ++j) x[j] = ld4(X + j * D + d);
  return hc_post_stream(x, ld4(in.a + t * D + d), in.comb + t * kHc * kHc, __ldg(in.post + t * kHc + s), s);
}

// hc_mix_kernel's input at flattened index k of token t: hc_post_at's streams (POST; stored to post_in.out when
// `store`) or the streams read.
template <bool POST>
__device__ __forceinline__ float4 mix_input_at(const float* __restrict__ streams, const HcPostIn& post_in, int64_t t,
                                               int64_t N, int64_t k, bool store) {
  if constexpr (POST) {
    const float4 x = hc_post_at(post_in, t, k);
    if (store) *reinterpret_cast<float4*>(post_in.out + t * N + k) = x;
    return x;
  } else {
    return ld4(streams + t * N + k);
  }
}

// POST: the streams come from hc_post_at and the first warp of each token (q == 0) stores them (every (token,
// index) belongs to one split and, in it, to that token's R warps).
template <int MIX, bool POST>
__global__ void __launch_bounds__(kMixThreads) hc_mix_kernel(const float* __restrict__ streams,
                                                             const float* __restrict__ fn, int64_t T, int64_t N,
                                                             int64_t per, bool early_fn, float* __restrict__ partial,
                                                             HcPostIn post_in) {
  static_assert(MIX + 1 <= 32, "one sum per lane after the reduce-scatter");
  // The block's fn columns of one 256-float step, staged by all threads at once (fn comes from DRAM: a warp
  // loading its rows itself kept too few loads in flight).
  __shared__ float4 fn_s[MIX][64];
  const int split = blockIdx.x, splits = gridDim.x;
  const int64_t k0 = split * per, k1 = min(N, k0 + per);
  auto stage_fn = [&](int64_t base) {
    for (int e = threadIdx.x; e < MIX * 64; e += kMixThreads) {
      const int j = e / 64, c = e % 64;
      const int64_t k = base + 4 * c;
      fn_s[j][c] = k < k1 ? ld4(fn + j * N + k) : make_float4(0, 0, 0, 0);
    }
  };
  // Before the wait: a split of one step (V4-Flash's 16 384 floats in 64 splits of 256) stages its fn columns, a
  // weight's (no kernel writes fn), so their DRAM latency overlaps the previous kernel.
  const bool one_step = early_fn && k1 - k0 <= 256;
  if (one_step) stage_fn(k0);
  pdl_prologue();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kMixTokens;
  const int nt = static_cast<int>(min(static_cast<int64_t>(kMixTokens), T - t0));
  const int R = nt == 1 ? 8 : nt == 2 ? 4 : nt <= 4 ? 2 : 1;
  const int g = warp / R, q = warp % R;
  const bool active = g < nt;  // idle warps still stage fn (the barriers need every thread)
  const int64_t t = t0 + (active ? g : 0);
  float v[32];  // v[i]: row q + R i (a fn row below MIX, the sum of squares at MIX, nothing beyond)
#pragma unroll
  for (int i = 0; i < 32; ++i) v[i] = 0.0f;
  for (int64_t base = k0; base < k1; base += 256) {
    const int64_t kb = base + 4 * lane;
    float4 x[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t k = kb + 128 * h;
      x[h] = active && k < k1 ? mix_input_at<POST>(streams, post_in, t, N, k, q == 0) : make_float4(0, 0, 0, 0);
    }
    if (!one_step) {
      __syncthreads();  // the previous step's fn_s is no longer read
      stage_fn(base);
    }
    __syncthreads();
    if (active) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < MIX + 1; ++i) {
          const int j = q + R * i;
          if (j < MIX) v[i] = dot4(fn_s[j][lane + 32 * h], x[h], v[i]);
          else if (j == MIX) v[i] = dot4(x[h], x[h], v[i]);
        }
      }
    }
  }
  if (!active) return;
  // Reduce-scatter: at offset o a lane keeps the half of its n slots its bit o selects and adds the
  // partner's copy of that half; after o = 1, lane s holds slot s summed over all 32 lanes.
#pragma unroll
  for (int o = 16, n = 32; o > 0; o >>= 1, n >>= 1) {
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if (i >= n / 2) break;
      const float keep = upper ? v[i + n / 2] : v[i], send = upper ? v[i] : v[i + n / 2];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
  }
  const int j = q + R * lane;
  if (j <= MIX) partial[((t * (MIX + 1)) + j) * splits + split] = v[0];
}

// m[v] = sum over the splits of rows[v * splits ..] for v < nv: kSumLanes lanes per value, each adding
// every kSumLanes-th split in order, then a fixed butterfly. Every thread of the block calls it.
__device__ void sum_partials(const float* rows, int nv, int splits, float* m) {
  const int per_pass = blockDim.x / kSumLanes, part = threadIdx.x % kSumLanes;
  for (int v0 = 0; v0 < nv; v0 += per_pass) {
    const int v = v0 + static_cast<int>(threadIdx.x) / kSumLanes;
    float s = 0.0f;
    if (v < nv) {
#pragma unroll 8
      for (int sp = part; sp < splits; sp += kSumLanes) s += rows[v * splits + sp];
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s += __shfl_xor_sync(0xffffffffu, s, 4);
    if (part == 0 && v < nv) m[v] = s;
  }
}

__device__ __forceinline__ float4 norm_weight4(const void* w, NormWeight kind, int64_t d) {
  if (kind == NormWeight::f32) return ld4(static_cast<const float*>(w) + d);
  if (kind == NormWeight::bf16) {
    const uint2 b = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(w) + d));
    return make_float4(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xffff0000u), __uint_as_float(b.y << 16),
                       __uint_as_float(b.y & 0xffff0000u));
  }
  return make_float4(1, 1, 1, 1);
}

// Threads 0..255: their float4 of each stream's row X[i] (loaded before they are needed: the finish kernels
// issue these loads first, so that they overlap the partial sums and the logits).
template <int VEC>
struct StreamSlice {
  float4 x[VEC][kHc];
};

template <int VEC>
__device__ __forceinline__ void load_slice(const float* X, int64_t D, StreamSlice<VEC>& s) {
  const int tid = threadIdx.x;
  const int64_t nv = D / 4;
#pragma unroll
  for (int u = 0; u < VEC; ++u) {
    const int64_t q = tid + static_cast<int64_t>(u) * kCollapseThreads;
#pragma unroll
    for (int i = 0; i < kHc; ++i) s.x[u][i] = q < nv ? ld4(X + i * D + 4 * q) : make_float4(0, 0, 0, 0);
  }
}

// Threads 0..255: out[d] = sum_i w[i] X[i][d] from their loaded slice; with `normed` then out = weight * (out *
// rsqrt(mean(out^2) + eps)) as rms_norm computes it (the sum of squares meets at named barrier 1, which only
// these threads use).
template <int VEC>
__device__ void collapse_row(const StreamSlice<VEC>& s, const float (&w)[kHc], int64_t D, bool normed,
                             const void* weight, NormWeight kind, float eps, float* out, float* red) {
  const int tid = threadIdx.x;
  const int64_t nv = D / 4;
  float4 c[VEC];
#pragma unroll
  for (int u = 0; u < VEC; ++u) {
    float4 acc = make_float4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < kHc; ++i) {
      acc.x = fmaf(w[i], s.x[u][i].x, acc.x);
      acc.y = fmaf(w[i], s.x[u][i].y, acc.y);
      acc.z = fmaf(w[i], s.x[u][i].z, acc.z);
      acc.w = fmaf(w[i], s.x[u][i].w, acc.w);
    }
    c[u] = acc;
  }
  if (normed) {
    float4 g[VEC];  // the weights, loaded while the sum of squares meets
#pragma unroll
    for (int u = 0; u < VEC; ++u) {
      const int64_t q = tid + static_cast<int64_t>(u) * kCollapseThreads;
      g[u] = q < nv ? norm_weight4(weight, kind, 4 * q) : make_float4(1, 1, 1, 1);
    }
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < VEC; ++u) ss = dot4(c[u], c[u], ss);  // zero beyond D
    ss = warp_sum(ss);
    if ((tid & 31) == 0) red[tid >> 5] = ss;
    asm volatile("bar.sync 1, %0;" ::"n"(kCollapseThreads) : "memory");
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kCollapseThreads / 32; ++i) total += red[i];
    const float inv = 1.0f / sqrtf(total / static_cast<float>(D) + eps);
#pragma unroll
    for (int u = 0; u < VEC; ++u) {
      const int64_t q = tid + static_cast<int64_t>(u) * kCollapseThreads;
      if (q >= nv) break;
      c[u] = make_float4(g[u].x * (c[u].x * inv), g[u].y * (c[u].y * inv), g[u].z * (c[u].z * inv),
                         g[u].w * (c[u].w * inv));
    }
  }
#pragma unroll
  for (int u = 0; u < VEC; ++u) {
    const int64_t q = tid + static_cast<int64_t>(u) * kCollapseThreads;
    if (q >= nv) break;
    *reinterpret_cast<float4*>(out + 4 * q) = c[u];
  }
}

// Sums over the 4 lanes of a row (lanes 4j..4j+3) or of a column (lanes k, k+4, k+8, k+12) of the 4x4
// matrix that lanes 0..15 hold (lanes 16..31 mirror them).
__device__ __forceinline__ float row_sum4(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float col_sum4(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  return v + __shfl_xor_sync(0xffffffffu, v, 8);
}
__device__ __forceinline__ float row_max4(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// One warp: post and comb of token t from its mixing logits, lg(j) = m[j] (normalised: the finish kernel's
// m[j] * inv): lanes < hc write post; lanes (j, k) = (lane / 4 % 4, lane % 4) run the softmax and Sinkhorn of C
// in the reference's order of operations (lanes 16..31 mirror 0..15). hc_pre_finish_kernel and hc_comb_kernel
// both call it, so the logits stored apart give the same bits.
template <class Logit>
__device__ __forceinline__ void post_and_comb_warp(const HcParams& a, int64_t t, Logit lg) {
  const int lane = threadIdx.x & 31, i = lane & 15, j = i / 4, k = i % 4;
  if (lane < kHc) a.post[t * kHc + lane] = 2.0f * sigmoidf_(lg(kHc + lane) * a.scale[1] + a.base[kHc + lane]);
  float c = lg(2 * kHc + i) * a.scale[2] + a.base[2 * kHc + i];
  c = expf(c - row_max4(c));
  c = c / row_sum4(c) + a.hc_eps;
  const int iters = a.sinkhorn_iters > 1 ? a.sinkhorn_iters : 1;  // the columns once even at 0 (as the CPU)
  for (int it = 0; it < iters; ++it) {
    if (it > 0) c /= row_sum4(c) + a.hc_eps;
    c /= col_sum4(c) + a.hc_eps;
  }
  if (lane < 16) a.comb[t * kHc * kHc + j * kHc + k] = c;
}

// One block per token: the logits from the partials (all threads), then the last warp writes post and runs
// the softmax and Sinkhorn (post_and_comb_warp), or with a.logits stores the logits for hc_comb_kernel, while
// threads 0..255 collapse the streams with pre.
template <int VEC>
__global__ void __launch_bounds__(kPreThreads) hc_pre_finish_kernel(HcParams a, int splits) {
  pdl_prologue();
  constexpr int MIX = (2 + kHc) * kHc;
  __shared__ float m[MIX + 1];
  __shared__ float red[kCollapseThreads / 32];
  const int64_t t = blockIdx.x, D = a.D;
  StreamSlice<VEC> slice;
  if (threadIdx.x < kCollapseThreads) load_slice(a.streams + t * kHc * D, D, slice);
  sum_partials(a.partial + t * (MIX + 1) * splits, MIX + 1, splits, m);
  __syncthreads();
  const float inv = 1.0f / sqrtf(m[MIX] / static_cast<float>(kHc * D) + a.norm_eps);
  if (threadIdx.x >= kCollapseThreads) {
    if (a.logits != nullptr) {
      const int lane = threadIdx.x & 31;
      if (lane < MIX) a.logits[t * MIX + lane] = m[lane] * inv;
    } else {
      post_and_comb_warp(a, t, [&](int j) { return m[j] * inv; });
    }
    return;
  }
  float pre[kHc];
#pragma unroll
  for (int i = 0; i < kHc; ++i) pre[i] = sigmoidf_((m[i] * inv) * a.scale[0] + a.base[i]) + a.hc_eps;
  collapse_row(slice, pre, D, a.normed, a.norm_weight, a.norm_kind, a.rms_eps, a.collapsed + t * D, red);
}

// hc_comb: a warp a token, post and comb from the logits hc_pre_finish_kernel stored.
__global__ void __launch_bounds__(32) hc_comb_kernel(HcParams a) {
  pdl_prologue();
  constexpr int MIX = (2 + kHc) * kHc;
  const float* lg = a.logits + static_cast<int64_t>(blockIdx.x) * MIX;
  post_and_comb_warp(a, blockIdx.x, [&](int j) { return lg[j]; });
}

template <int VEC>
__global__ void __launch_bounds__(kCollapseThreads) hc_head_finish_kernel(HcParams a, int splits) {
  pdl_prologue();
  __shared__ float m[kHc + 1];
  __shared__ float red[kCollapseThreads / 32];
  const int64_t t = blockIdx.x, D = a.D;
  StreamSlice<VEC> slice;
  load_slice(a.streams + t * kHc * D, D, slice);
  sum_partials(a.partial + t * (kHc + 1) * splits, kHc + 1, splits, m);
  __syncthreads();
  const float inv = 1.0f / sqrtf(m[kHc] / static_cast<float>(kHc * D) + a.norm_eps);
  float w[kHc];
#pragma unroll
  for (int i = 0; i < kHc; ++i) w[i] = sigmoidf_((m[i] * inv) * a.scale[0] + a.base[i]) + a.hc_eps;
  collapse_row(slice, w, D, false, nullptr, NormWeight::none, 0.0f, a.out + t * D, red);
}

// Block (token, 256 float4 of D): every output stream of the thread's 4 dims from one read of the inputs.
__global__ void __launch_bounds__(256) hc_post_kernel(const float* __restrict__ streams, const float* __restrict__ a,
                                                      const float* __restrict__ post, const float* __restrict__ comb,
                                                      int64_t D, float* __restrict__ out) {
  pdl_prologue();
  const int64_t t = blockIdx.x, q = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (q >= D / 4) return;
  const float* X = streams + t * kHc * D;
  float4 x[kHc];
#pragma unroll
  for (int j = 0; j < kHc; ++j) x[j] = ld4(X + j * D + 4 * q);
  const float4 y = ld4(a + t * D + 4 * q);
  const float* C = comb + t * kHc * kHc;
#pragma unroll
  for (int k = 0; k < kHc; ++k)
    *reinterpret_cast<float4*>(out + (t * kHc + k) * D + 4 * q) = hc_post_stream(x, y, C, __ldg(post + t * kHc + k), k);
}

// The library path's hc_post and the squares column of its mix in one pass (one read of the streams less a
// sub-layer: hc_squares_kernel read the new streams again). Block t: token t's hc_post as hc_post_kernel
// computes it (thread t owns float4 t + 256 q of D, q < DQ = D / 1024, in every stream: the four inputs
// loaded once, the four outputs from hc_post_stream), then the sum of squares of the outputs in
// hc_squares_kernel's order (its thread t adds flattened float4s 4t + 1024 i, i = s DQ + q: stream-major) and
// its block_sum over 256 threads: the same bits as the two kernels.
template <int DQ>
__global__ void __launch_bounds__(256)
    hc_post_squares_kernel(const float* __restrict__ streams, const float* __restrict__ a,
                           const float* __restrict__ post, const float* __restrict__ comb, int64_t D,
                           float* __restrict__ out, float* __restrict__ squares, int64_t ld) {
  pdl_prologue();
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const float* X = streams + t * kHc * D;
  const float* C = comb + t * kHc * kHc;
  float4 o[kHc][DQ];
#pragma unroll
  for (int q = 0; q < DQ; ++q) {
    const int64_t d = 4 * (static_cast<int64_t>(threadIdx.x) + 256 * q);
    float4 x[kHc];
#pragma unroll
    for (int j = 0; j < kHc; ++j) x[j] = ld4(X + j * D + d);
    const float4 y = ld4(a + t * D + d);
#pragma unroll
    for (int k = 0; k < kHc; ++k) {
      o[k][q] = hc_post_stream(x, y, C, __ldg(post + t * kHc + k), k);
      *reinterpret_cast<float4*>(out + (t * kHc + k) * D + d) = o[k][q];
    }
  }
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < kHc; ++k)
#pragma unroll
    for (int q = 0; q < DQ; ++q) s = dot4(o[k][q], o[k][q], s);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) squares[t * ld] = s;
}

template <int MIX>
MixPlan launch_mix(const HcParams& p, cudaStream_t stream) {
  const MixPlan plan = mix_plan(p.hc * p.D);
  const HcPostIn in = p.prev_a != nullptr
                          ? HcPostIn{p.prev_streams, p.prev_a, p.prev_post, p.prev_comb, p.out_streams, p.D}
                          : HcPostIn{};
  const dim3 grid(static_cast<unsigned>(plan.splits), static_cast<unsigned>((p.T + kMixTokens - 1) / kMixTokens));
  if (p.prev_a != nullptr)
    launch(hc_mix_kernel<MIX, true>, grid, kMixThreads, 0, stream, p.streams, p.fn, p.T, p.hc * p.D, plan.per,
           p.early_fn, p.partial, in);
  else
    launch(hc_mix_kernel<MIX, false>, grid, kMixThreads, 0, stream, p.streams, p.fn, p.T, p.hc * p.D, plan.per,
           p.early_fn, p.partial, in);
  return plan;
}

// out[t * ld] = the sum of squares of row t of x [T, N] (one block per token; the library path's mix column
// MIX, beside the library's product).
__global__ void __launch_bounds__(256) hc_squares_kernel(const float* __restrict__ x, int64_t N, int64_t ld,
                                                         float* out) {
  pdl_prologue();
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  float s = 0.0f;
  for (int64_t k = 4 * static_cast<int64_t>(threadIdx.x); k < N; k += 4 * blockDim.x) {
    const float4 v = ld4(x + t * N + k);
    s = dot4(v, v, s);
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) out[t * ld] = s;
}

template <int VEC>
void launch_finish_vec(const HcParams& p, bool head, int splits, cudaStream_t stream) {
  if (head)
    launch(hc_head_finish_kernel<VEC>, static_cast<unsigned>(p.T), kCollapseThreads, 0, stream, p, splits);
  else
    launch(hc_pre_finish_kernel<VEC>, static_cast<unsigned>(p.T), kPreThreads, 0, stream, p, splits);
}

// The finish kernel (hc_pre's, or hc_head's where `head`) with the slice its D needs (kCollapseVecMax above).
// TERN_HC_FINISH_WIDE (a switch, off; read once): kHcMaxD's slice whatever D, session 32's form, for the A/B.
void launch_finish(const HcParams& p, bool head, int splits, cudaStream_t stream) {
  static_assert(kCollapseVecMax == 8, "launch_finish's widest slice");
  static const bool wide = env_flag("TERN_HC_FINISH_WIDE", false);
  const int64_t per_thread = wide ? kCollapseVecMax : (p.D / 4 + kCollapseThreads - 1) / kCollapseThreads;
  if (per_thread <= 1) launch_finish_vec<1>(p, head, splits, stream);
  else if (per_thread <= 2) launch_finish_vec<2>(p, head, splits, stream);
  else if (per_thread <= 4) launch_finish_vec<4>(p, head, splits, stream);
  else launch_finish_vec<8>(p, head, splits, stream);
}

}  // namespace
}  // namespace dev

void launch_hc_squares(const float* streams, int64_t T, int64_t N, int64_t ld, float* out, cudaStream_t stream) {
  if (T == 0) return;
  launch(dev::hc_squares_kernel, static_cast<unsigned>(T), 256, 0, stream, streams, N, ld, out);
}

bool hc_post_squares_supported(int64_t hc, int64_t D) {
  return hc == dev::kHc && (D == 1024 || D == 2048 || D == 4096);
}

void launch_hc_post_squares(const float* streams, const float* a, const float* post, const float* comb,
                            int64_t T, int64_t D, float* out, float* squares, int64_t ld,
                            cudaStream_t stream) {
  if (T == 0) return;
  const auto grid = static_cast<unsigned>(T);
  switch (D / 1024) {
    case 1:
      launch(dev::hc_post_squares_kernel<1>, grid, 256, 0, stream, streams, a, post, comb, D, out, squares,
             ld);
      break;
    case 2:
      launch(dev::hc_post_squares_kernel<2>, grid, 256, 0, stream, streams, a, post, comb, D, out, squares,
             ld);
      break;
    default:
      launch(dev::hc_post_squares_kernel<4>, grid, 256, 0, stream, streams, a, post, comb, D, out, squares,
             ld);
      break;
  }
}

void launch_hc_finish(const HcParams& p, bool head, int splits, cudaStream_t stream) {
  if (p.T == 0) return;
  dev::launch_finish(p, head, splits, stream);
}

int64_t hc_partial_floats(int64_t T, int64_t hc, int64_t D, bool head) {
  const int64_t mix = head ? hc : (2 + hc) * hc;
  return std::max<int64_t>(1, T * (mix + 1) * dev::mix_plan(hc * D).splits);
}

void launch_hc_pre(const HcParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  const dev::MixPlan plan = dev::launch_mix<(2 + dev::kHc) * dev::kHc>(p, stream);
  dev::launch_finish(p, false, plan.splits, stream);
}

void launch_hc_comb(const HcParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  launch(dev::hc_comb_kernel, static_cast<unsigned>(p.T), 32, 0, stream, p);
}

void launch_hc_head(const HcParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  const dev::MixPlan plan = dev::launch_mix<dev::kHc>(p, stream);
  dev::launch_finish(p, true, plan.splits, stream);
}

void launch_hc_post(const float* streams, const float* a, const float* post, const float* comb, int64_t T,
                    int64_t hc, int64_t D, float* out, cudaStream_t stream) {
  if (T == 0 || D == 0 || hc != dev::kHc) return;  // hc and D % 4 are checked by the backend
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>((D / 4 + 255) / 256));
  launch(dev::hc_post_kernel, grid, 256, 0, stream, streams, a, post, comb, D, out);
}

}  // namespace tern::cuda
