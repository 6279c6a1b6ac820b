// The steps both prefill attention kernels (attention_prefill.cu, mma.sync; attention_prefill_wgmma.cu, wgmma)
// take the same way (nvcc only): a round's row lookups and the query's q rounded to bf16 into shared memory.
// Only where q lands differs (a padded row layout for ldmatrix, a 128-byte-swizzled one for wgmma), so the
// caller passes the byte offset of (head, dim).
#pragma once

#include "backends/cuda/kernels/attention_keys.cuh"
#include "backends/cuda/kernels/attention_tile.cuh"

namespace tern::cuda::dev {

constexpr int kPrefillLookups = 3;                          // row addresses a thread looks up per round
constexpr int kPrefillRound = kPrefillLookups * kTileThreads;  // keys whose rows are looked up at once

// The round's row addresses (keys jr .. jr + nr - 1 of query i), all lookups of a thread in flight together,
// then stored into sRows. The caller orders this against the previous readers of sRows and syncs after.
__device__ __forceinline__ void lookup_round(const AttentionParams& a, int64_t i, const KeyList& kl, int64_t jr,
                                             int nr, int tid, const uint8_t** sRows) {
  const uint8_t* found[kPrefillLookups];
#pragma unroll
  for (int u = 0; u < kPrefillLookups; ++u) {
    const int r = tid + u * kTileThreads;
    found[u] = r < nr ? key_row(a, i, kl, jr + r) : nullptr;
  }
#pragma unroll
  for (int u = 0; u < kPrefillLookups; ++u) sRows[tid + u * kTileThreads] = found[u];
}

// Query i's q as bf16 into sQ at byte offset q_at(head, dim) (dim a multiple of 4; heads past `heads` are
// zeros): kBatch float4 of a thread loaded before any is stored, so 64 KiB of q is in flight per block.
template <int HD, typename QAt>
__device__ __forceinline__ void load_q_bf16(const AttentionParams& a, int64_t i, int heads, int tid, uint8_t* sQ,
                                            QAt q_at) {
  const float4* src = reinterpret_cast<const float4*>(a.q + i * a.heads * HD);
  constexpr int kPer = kTileHeads * HD / 4 / kTileThreads;  // float4 of padded q per thread
  constexpr int kBatch = kPer < 16 ? kPer : 16;
  static_assert(kPer % kBatch == 0, "q batches");
#pragma unroll 1
  for (int b0 = 0; b0 < kPer; b0 += kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = tid + kTileThreads * (b0 + u), h = idx / (HD / 4);
      v[u] = h < heads ? __ldg(src + idx) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = tid + kTileThreads * (b0 + u), h = idx / (HD / 4), c = idx % (HD / 4);
      *reinterpret_cast<uint2*>(sQ + q_at(h, 4 * c)) = make_uint2(pack_bf16(v[u].x, v[u].y), pack_bf16(v[u].z, v[u].w));
    }
  }
}

}  // namespace tern::cuda::dev
