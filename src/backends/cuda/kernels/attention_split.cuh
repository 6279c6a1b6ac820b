// How the tensor-core decode kernels cut a query's keys into splits (nvcc only): attention_mma_kernel
// (attention_mma.cu) and attention_heads_kernel (attention_heads.cu) share this plan, so a query's splits,
// and with them its online-softmax tiles and its merge order, are the same in both (their bits are equal).
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/attention.cuh"

namespace tern::cuda::dev {

constexpr int kMmaMaxSplits = 8;           // a query's splits are one cluster: the portable cluster size
// The default of AttentionParams::split_keys (TERN_ATTENTION_SPLIT_KEYS): CSA's 640-key bound 5 splits of 2 full tiles.
constexpr int64_t kMmaKeysPerSplit = kAttentionSplitKeysDefault;

struct KeySplits {
  int splits;
  int64_t per;  // keys a split (the last may have fewer)
};

// A query's splits from its key count only (so its bits do not depend on the batch): runs of about
// `keys_per_split` keys, at least one split and at most `max_splits`. The f32 kernel (attention.cu) uses it too.
__host__ __device__ inline KeySplits plan_key_splits(int64_t keys, int64_t keys_per_split, int64_t max_splits) {
  int64_t s = (keys + keys_per_split - 1) / keys_per_split;
  s = s < 1 ? 1 : s > max_splits ? max_splits : s;
  const int64_t per = (keys + s - 1) / s;
  return {static_cast<int>(s), per < 1 ? 1 : per};
}

// The tensor-core kernels' splits: runs of about split_keys keys (AttentionParams::split_keys), at most kMmaMaxSplits.
__host__ __device__ inline KeySplits mma_split_plan(int64_t keys, int64_t split_keys) {
  return plan_key_splits(keys, split_keys, kMmaMaxSplits);
}

// Keys of the launch's longest query (decode mode: the bound over any position): the cluster size of a
// launch is mma_split_plan(mma_max_keys(p)).splits, a host-side bound (no device read).
inline int64_t mma_max_keys(const AttentionParams& p) {
  const int64_t comp = p.ratio == 0 ? 0 : (p.selected != nullptr ? p.k_sel : p.num_compressed);
  if (p.positions != nullptr) return p.window + comp;
  return (p.window < p.start + p.n ? p.window : p.start + p.n) + comp;
}

}  // namespace tern::cuda::dev
