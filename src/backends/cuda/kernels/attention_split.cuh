// How the tensor-core decode kernels cut a query's keys into splits (nvcc only): attention_mma_kernel
// (attention_mma.cu) and attention_heads_kernel (attention_heads.cu) share this plan, so a query's splits,
// and with them its online-softmax tiles and its merge order, are the same in both (their bits are equal).
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/attention.cuh"

namespace tern::cuda::dev {

constexpr int kMmaMaxSplits = 8;           // a query's splits are one cluster: the portable cluster size
constexpr int64_t kMmaKeysPerSplit = 128;  // CSA 640 keys: 5 splits of 2 full tiles; HCA 192: 2 splits

struct MmaSplit {
  int splits;
  int64_t per;
};

// A query's splits from its key count only: runs of about kMmaKeysPerSplit keys, at most kMmaMaxSplits.
__host__ __device__ inline MmaSplit mma_split_plan(int64_t keys) {
  int64_t s = (keys + kMmaKeysPerSplit - 1) / kMmaKeysPerSplit;
  s = s < 1 ? 1 : s > kMmaMaxSplits ? kMmaMaxSplits : s;
  const int64_t per = (keys + s - 1) / s;
  return {static_cast<int>(s), per < 1 ? 1 : per};
}

// Keys of the launch's longest query (decode mode: the bound over any position): the cluster size of a
// launch is mma_split_plan(mma_max_keys(p)).splits, a host-side bound (no device read).
inline int64_t mma_max_keys(const AttentionParams& p) {
  const int64_t comp = p.ratio == 0 ? 0 : (p.selected != nullptr ? p.k_sel : p.num_compressed);
  if (p.positions != nullptr) return p.window + comp;
  return (p.window < p.start + p.n ? p.window : p.start + p.n) + comp;
}

}  // namespace tern::cuda::dev
