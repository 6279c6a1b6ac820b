// Manifold-constrained hyper-connections (mHC): hc residual streams mixed around each sub-layer.
//   m    = fn . flat(X) * rsqrt(mean(flat(X)^2) + norm_eps)                       [(2+hc)*hc]
//   pre  = sigmoid(m[0:hc] * scale0 + base[0:hc]) + hc_eps                         [hc]
//   post = 2 * sigmoid(m[hc:2hc] * scale1 + base[hc:2hc])                          [hc]
//   C    = softmax_rows(m[2hc:].view(hc,hc) * scale2 + base[2hc:]) + hc_eps, then Sinkhorn:
//          C /= colsum + hc_eps; (iters-1) x { C /= rowsum + hc_eps; C /= colsum + hc_eps }
//   collapsed = sum_i pre_i X_i                  (then rms_norm when asked: HcPreArgs::normed)  [D]
//               (then rms_norm with a weight when asked: HcPreArgs::normed)
//   X'_k = post_k * a + sum_j C[j,k] X_j            (hc_post; C is applied transposed)
//   hc_head: y = sum_i (sigmoid(m_i * scale + base_i) + hc_eps) X_i with its own fn [hc, hc*D]
#pragma once

#include "core/tensor.h"

namespace tern::ops {

class Context;  // ops/context.h: each op runs in one

struct HcParams {
  int sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;  // rms_norm_eps of the unweighted input norm
};

struct HcPreArgs {
  TensorView streams;  // f32 [T, hc, D]
  TensorView fn;       // f32 [(2+hc)*hc, hc*D]
  TensorView base;     // f32 [(2+hc)*hc]
  TensorView scale;    // f32 [3]
  HcParams params;
  TensorView post;       // out f32 [T, hc]
  TensorView comb;       // out f32 [T, hc, hc]
  TensorView collapsed;  // out f32 [T, D]
  // With `normed`, collapsed = rms_norm(sum_i pre_i X_i, norm (f32 or bf16 [D], or empty), rms_eps): the
  // sub-layer's input norm in the same op (one kernel less on the GPU).
  bool normed = false;
  TensorView norm;
  float rms_eps = 1e-6f;
  // The previous sub-layer's hc_post, folded in (issue #14 item 4: one kernel and one read of the streams less a
  // sub-layer on the GPU): with prev_a set, `streams` is an output too, first written as hc_post(prev_streams,
  // prev_a, prev_post, prev_comb) (the same bits as that op), then read as above. prev_streams must not alias it.
  TensorView prev_streams, prev_a, prev_post, prev_comb;
  bool has_prev() const {
    return !prev_a.empty() || !prev_streams.empty() || !prev_post.empty() || !prev_comb.empty();
  }
  // With `logits` (f32 [T, (2+hc)*hc]) the op writes m there and leaves post and comb (then empty) to hc_comb.
  // Why: post and comb are read only by the next hc_post, and the Sinkhorn's 20 serial steps cost 1.7 us a call
  // on the H100 (results.md, session 26), so the model runs hc_comb on a side branch, off the step's path.
  TensorView logits;
};
void hc_pre(const Context& ctx, const HcPreArgs& a);

// post and comb from the mixing logits m that hc_pre left in `logits` (the formulas above; the same bits as
// hc_pre computing them itself).
struct HcCombArgs {
  TensorView logits;  // f32 [T, (2+hc)*hc]
  TensorView base;    // f32 [(2+hc)*hc]
  TensorView scale;   // f32 [3]
  HcParams params;
  TensorView post;  // out f32 [T, hc]
  TensorView comb;  // out f32 [T, hc, hc]
};
void hc_comb(const Context& ctx, const HcCombArgs& a);

// out f32 [T, hc, D] = post * a + C^T X.  streams [T, hc, D], a [T, D], post [T, hc], comb [T, hc, hc];
// out must not alias streams.
void hc_post(const Context& ctx, const TensorView& streams, const TensorView& a, const TensorView& post,
             const TensorView& comb, const TensorView& out);

struct HcHeadArgs {
  TensorView streams;  // f32 [T, hc, D]
  TensorView fn;       // f32 [hc, hc*D]
  TensorView base;     // f32 [hc]
  TensorView scale;    // f32 [1]
  HcParams params;
  TensorView out;  // f32 [T, D]
};
void hc_head(const Context& ctx, const HcHeadArgs& a);

// streams[t, i] = x[t] for every stream i.  x f32 [T, D], streams f32 [T, hc, D].
void hc_expand(const Context& ctx, const TensorView& x, const TensorView& streams);

}  // namespace tern::ops
