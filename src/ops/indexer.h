// The lightning indexer of CSA layers: scores the compressed indexer keys for each query and keeps the
// top-k that the query may see (entry s is visible at position p iff s < (p+1) / ratio).
//   score_s = sum_h (w_h * heads^-0.5) * ReLU(q_h . k_s) * dim^-0.5
#pragma once

#include <cstdint>

#include "core/paged_rows.h"
#include "core/tensor.h"

namespace tern::ops {

class Context;  // ops/context.h: each op runs in one

struct IndexerArgs {
  TensorView q;        // f32 [n, heads, dim], RoPE already applied
  TensorView weights;  // f32 [n, heads]: weights_proj(h), unscaled
  PagedRows keys;      // rows of dim f32 (row_bytes = 4 dim) covering >= num_keys: the sequence's indexer keys
  int64_t num_keys = 0;
  TensorView positions;  // i64 [n]
  int ratio = 4;
};

// scores f32 [n, num_keys]; -inf where the entry is not visible to the query.
void indexer_scores(const Context& ctx, const IndexerArgs& a, const TensorView& scores);

// indices i32 [n, topk]: the visible entries with the highest scores, best first (ties: lower index
// first), then -1 where fewer than topk are visible.
void indexer_topk(const Context& ctx, const IndexerArgs& a, int topk, const TensorView& indices);

}  // namespace tern::ops
