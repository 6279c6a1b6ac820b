// V4 attention of one sequence's chunk of queries: shared-KV MQA (K = V = one row per key) over the
// sliding window and the compressed rows, with a learned sink per head in the softmax denominator.
//   o_h = sum_j e^{s_hj} K_j / (sum_j e^{s_hj} + e^{sink_h}),  s_hj = scale * q_h . K_j
// Keys of query i at position p = start + i:
//   window:     positions max(0, p-window+1) .. p; rows >= start come from chunk_rows, older ones from the
//               ring (position j at slot j % window).
//   compressed: entries w < (p+1)/ratio; all of them (HCA) or only selected[i] (CSA, -1 = none). They live
//               in pages of the state pool (core/paged_rows.h): entry w is compressed.row(w).
// The output keeps K's RoPE rotation on its rope dims: the caller applies the inverse RoPE.
#pragma once

#include <cstdint>

#include "core/paged_rows.h"
#include "core/tensor.h"
#include "ops/act_quant.h"
#include "ops/kv_row.h"

namespace tern::ops {

class Context;  // ops/context.h: each op runs in one

struct AttentionArgs {
  TensorView q;       // f32 [n, heads, head_dim]
  int64_t start = 0;  // position of q[0]; q[i] is at start + i
  KvRowFormat format;
  TensorView chunk_rows;  // u8 [n, row_bytes]: the chunk's own kv rows
  TensorView ring;        // u8 [window, row_bytes]
  int64_t window = 0;
  PagedRows compressed;   // rows of row_bytes covering >= num_compressed entries, or empty
  int64_t num_compressed = 0;
  int ratio = 0;        // 0: no compressed rows
  TensorView selected;  // i32 [n, k] or empty (all visible compressed rows)
  TensorView sinks;     // f32 [heads]
  float scale = 1.0f;   // softmax scale, head_dim^-0.5
  // Each query's position (i64 [n]) for the two rotations below.
  TensorView positions;
  // Set: q is as wq_b wrote it, and the op first norms each head (RMS over head_dim, no weight, q_norm_eps) and
  // rotates its last 2 * q_inv_freq.dim(0) dims at positions, exactly ops::norm_rope(q, {}, q_norm_eps, positions,
  // q_inv_freq): where a backend's kernel can do it in its q load (the CUDA prefill kernels) q's own pass goes.
  TensorView q_inv_freq;
  float q_norm_eps = 0.0f;
  // Set: each head's output rotated back at positions in its last 2 * out_inv_freq.dim(0) dims: what
  // ops::rope(out, positions, out_inv_freq, inverse) would do after the op (the same bits).
  TensorView out_inv_freq;
};

// out f32 [n, heads, head_dim]
void sparse_attention(const Context& ctx, const AttentionArgs& a, const TensorView& out);
// The same output quantised for an FP8 product (out: n rows of heads * head_dim columns, act_quant.h), as
// act_quant would quantise the f32 one: what the output projection wo_a takes, without the heads in f32 (1 GiB a
// layer at 8K tokens) written and read back. The CUDA prefill kernels quantise in their epilogue.
void sparse_attention(const Context& ctx, const AttentionArgs& a, const Fp8Rows& out);

}  // namespace tern::ops
