// Sparse attention for a head_dim the other kernels are not built for (the exact mode on models of other shapes:
// `--activations f32`, f32 rows; issue #17): one warp per (query, head), the query's keys in keys_of order (the
// window, then the compressed picks; masked picks weigh nothing), one online-softmax step a key, the sink in the
// denominator. f32 CUDA cores, no splits: slow, for checks and odd shapes, never on a served path of V4-Flash.
#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/attention_keys.cuh"
#include "backends/cuda/kernels/launch.cuh"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kAnyWarps = 8;
constexpr int kAnyMaxDimsPerLane = kAttentionAnyMaxHeadDim / 32;

__global__ void __launch_bounds__(32 * kAnyWarps) attention_any_kernel(AttentionParams a) {
  pdl_prologue();
  const int64_t i = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int64_t h = static_cast<int64_t>(blockIdx.y) * kAnyWarps + (threadIdx.x >> 5);
  if (h >= a.heads) return;
  const int64_t hd = a.fmt.head_dim;
  float* out = a.out + (i * a.heads + h) * hd;
  const KeyList kl = keys_of(a, i);
  if (kl.p < 0) {  // an inert decode slot: zeros, no reads
    for (int64_t d = lane; d < hd; d += 32) out[d] = 0.0f;
    return;
  }
  const float* q = a.q + (i * a.heads + h) * hd;
  float qv[kAnyMaxDimsPerLane], o[kAnyMaxDimsPerLane];
#pragma unroll
  for (int r = 0; r < kAnyMaxDimsPerLane; ++r) {
    const int64_t d = lane + 32 * r;
    qv[r] = d < hd ? q[d] : 0.0f;
    o[r] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = 0; j < kl.nwin + kl.count; ++j) {
    const auto* k = reinterpret_cast<const float*>(key_row(a, i, kl, j));
    if (k == nullptr) continue;
    float part = 0.0f;
#pragma unroll
    for (int r = 0; r < kAnyMaxDimsPerLane; ++r)
      if (lane + 32 * r < hd) part += qv[r] * k[lane + 32 * r];
    const float s = warp_sum(part) * a.scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), pj = expf(s - m_new);
    l = l * corr + pj;
#pragma unroll
    for (int r = 0; r < kAnyMaxDimsPerLane; ++r)
      if (lane + 32 * r < hd) o[r] = o[r] * corr + pj * k[lane + 32 * r];
    m = m_new;
  }
  const float sink = a.sinks[h];
  const float top = fmaxf(m, sink);
  const float keep = expf(m - top);
  const float f = keep / (l * keep + expf(sink - top));
#pragma unroll
  for (int r = 0; r < kAnyMaxDimsPerLane; ++r)
    if (lane + 32 * r < hd) out[lane + 32 * r] = o[r] * f;
}

}  // namespace
}  // namespace dev

cudaError_t launch_attention_any(const AttentionParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  if (p.fmt.fp8 || p.fmt.head_dim <= 0 || p.fmt.head_dim > kAttentionAnyMaxHeadDim) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(p.n), static_cast<unsigned>((p.heads + dev::kAnyWarps - 1) / dev::kAnyWarps));
  launch(dev::attention_any_kernel, grid, 32 * dev::kAnyWarps, 0, stream, p);
  return cudaSuccess;
}

}  // namespace tern::cuda
