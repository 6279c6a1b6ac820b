// mHC kernels. The mixing logits are (2+hc)*hc dot products of length hc*D per token: hc_mix splits that
// length over blocks (each block reads its slice of fn once for 4 tokens) and writes partial sums; the
// finish kernels add them in a fixed order, so results do not depend on scheduling.
#include <algorithm>

#include "backends/cuda/kernels/device_common.cuh"
#include "backends/cuda/kernels/mhc.cuh"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kTokensPerBlock = 4;
constexpr int kMixThreads = 256;
constexpr int kMaxHc = 8;

int mix_splits(int64_t hc, int64_t D) {
  const int64_t n = hc * D;
  return static_cast<int>(std::clamp<int64_t>(n / 512, 1, 32));
}

// partial[t][split][0..MIX) = fn[j, slice] . flat[t, slice];  partial[t][split][MIX] = sum of squares.
template <int MIX>
__global__ void __launch_bounds__(kMixThreads) hc_mix_kernel(const float* streams, const float* fn, int64_t T,
                                                             int64_t N, float* partial) {
  const int split = blockIdx.x, splits = gridDim.x;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTokensPerBlock;
  const int64_t per = (N + splits - 1) / splits;
  const int64_t k0 = split * per, k1 = min(N, k0 + per);
  float acc[kTokensPerBlock][MIX + 1];
#pragma unroll
  for (int i = 0; i < kTokensPerBlock; ++i)
#pragma unroll
    for (int j = 0; j <= MIX; ++j) acc[i][j] = 0.0f;
  for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
    float x[kTokensPerBlock];
#pragma unroll
    for (int i = 0; i < kTokensPerBlock; ++i) {
      x[i] = t0 + i < T ? streams[(t0 + i) * N + k] : 0.0f;
      acc[i][MIX] += x[i] * x[i];
    }
#pragma unroll
    for (int j = 0; j < MIX; ++j) {
      const float w = fn[j * N + k];
#pragma unroll
      for (int i = 0; i < kTokensPerBlock; ++i) acc[i][j] += w * x[i];
    }
  }
  __shared__ float red[kMixThreads / 32][kTokensPerBlock][MIX + 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int i = 0; i < kTokensPerBlock; ++i)
#pragma unroll
    for (int j = 0; j <= MIX; ++j) {
      const float v = warp_sum(acc[i][j]);
      if (lane == 0) red[warp][i][j] = v;
    }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kTokensPerBlock * (MIX + 1); idx += blockDim.x) {
    const int i = idx / (MIX + 1), j = idx % (MIX + 1);
    if (t0 + i >= T) continue;
    float s = 0.0f;
    for (int w = 0; w < kMixThreads / 32; ++w) s += red[w][i][j];
    partial[((t0 + i) * splits + split) * (MIX + 1) + j] = s;
  }
}

// Threads 0..mix of the block add the partials of one logit (or the sum of squares) each, in split order;
// then every thread may read m[0..mix), already times rsqrt(mean(flat^2) + eps).
__device__ void finish_logits(const float* partial, int64_t t, int splits, int mix, int64_t N, float eps, float* m) {
  const float* p = partial + t * splits * (mix + 1);
  if (threadIdx.x <= mix) {
    float v = 0.0f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) v += p[s * (mix + 1) + threadIdx.x];
    m[threadIdx.x] = v;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(m[mix] / static_cast<float>(N) + eps);
  __syncthreads();
  if (threadIdx.x < mix) m[threadIdx.x] *= inv;
  __syncthreads();
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

// hc == 4 (the host checks): warp 0 holds C in lanes (j, k) = (lane / 4 % 4, lane % 4) and runs the
// softmax and Sinkhorn with shuffles, in the reference's order of operations.
__global__ void hc_pre_finish_kernel(HcParams a, int splits) {
  constexpr int hc = 4;
  const int64_t t = blockIdx.x, D = a.D;
  __shared__ float pre[hc];
  __shared__ float m[(2 + hc) * hc + 1];
  finish_logits(a.partial, t, splits, (2 + hc) * hc, hc * D, a.norm_eps, m);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, i = lane & 15, j = i / 4, k = i % 4;
    if (lane < hc) {
      pre[lane] = sigmoidf_(m[lane] * a.scale[0] + a.base[lane]) + a.hc_eps;
      a.post[t * hc + lane] = 2.0f * sigmoidf_(m[hc + lane] * a.scale[1] + a.base[hc + lane]);
    }
    float c = m[2 * hc + i] * a.scale[2] + a.base[2 * hc + i];
    c = expf(c - row_max4(c));
    c = c / row_sum4(c) + a.hc_eps;
    for (int it = 0; it < a.sinkhorn_iters; ++it) {
      if (it > 0) c /= row_sum4(c) + a.hc_eps;
      c /= col_sum4(c) + a.hc_eps;
    }
    if (lane < 16) a.comb[t * hc * hc + j * hc + k] = c;
  }
  __syncthreads();
  const float* X = a.streams + t * hc * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < hc; ++i) acc += pre[i] * X[i * D + d];
    a.collapsed[t * D + d] = acc;
  }
}

__global__ void hc_head_finish_kernel(HcParams a, int splits) {
  const int64_t t = blockIdx.x, hc = a.hc, D = a.D;
  __shared__ float w[kMaxHc];
  __shared__ float m[kMaxHc + 1];
  finish_logits(a.partial, t, splits, static_cast<int>(hc), hc * D, a.norm_eps, m);
  if (threadIdx.x == 0) {
    for (int i = 0; i < hc; ++i) w[i] = sigmoidf_(m[i] * a.scale[0] + a.base[i]) + a.hc_eps;
  }
  __syncthreads();
  const float* X = a.streams + t * hc * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < hc; ++i) acc += w[i] * X[i * D + d];
    a.out[t * D + d] = acc;
  }
}

__global__ void hc_post_kernel(const float* streams, const float* a, const float* post, const float* comb, int64_t T,
                               int64_t hc, int64_t D, float* out) {
  const int64_t total = T * hc * D;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = i % D, k = (i / D) % hc, t = i / (hc * D);
    const float* X = streams + t * hc * D;
    const float* C = comb + t * hc * hc;
    float mixed = 0.0f;
    for (int64_t j = 0; j < hc; ++j) mixed += C[j * hc + k] * X[j * D + d];
    out[i] = post[t * hc + k] * a[t * D + d] + mixed;
  }
}

template <int MIX>
void launch_mix(const HcParams& p, int splits, cudaStream_t stream) {
  const dim3 grid(splits, static_cast<unsigned>((p.T + kTokensPerBlock - 1) / kTokensPerBlock));
  hc_mix_kernel<MIX><<<grid, kMixThreads, 0, stream>>>(p.streams, p.fn, p.T, p.hc * p.D, p.partial);
}

}  // namespace
}  // namespace dev

int64_t hc_partial_floats(int64_t T, int64_t hc, int64_t D, bool head) {
  const int64_t mix = head ? hc : (2 + hc) * hc;
  return std::max<int64_t>(1, T * dev::mix_splits(hc, D) * (mix + 1));
}

void launch_hc_pre(const HcParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  const int splits = dev::mix_splits(p.hc, p.D);
  dev::launch_mix<24>(p, splits, stream);
  dev::hc_pre_finish_kernel<<<static_cast<unsigned>(p.T), 256, 0, stream>>>(p, splits);
}

void launch_hc_head(const HcParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  const int splits = dev::mix_splits(p.hc, p.D);
  dev::launch_mix<4>(p, splits, stream);
  dev::hc_head_finish_kernel<<<static_cast<unsigned>(p.T), 256, 0, stream>>>(p, splits);
}

void launch_hc_post(const float* streams, const float* a, const float* post, const float* comb, int64_t T,
                    int64_t hc, int64_t D, float* out, cudaStream_t stream) {
  const int64_t total = T * hc * D;
  if (total == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 65535));
  dev::hc_post_kernel<<<blocks, 256, 0, stream>>>(streams, a, post, comb, T, hc, D, out);
}

}  // namespace tern::cuda
