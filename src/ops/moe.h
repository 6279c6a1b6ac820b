// Mixture of experts: routing and the routed experts.
//   scores = sqrt(softplus(logits))
//   scored routing: picked = top-k of (scores + bias)  (the bias only selects)
//   hash routing:   picked = tid2eid[token]
//   weights = scores[picked] / (sum scores[picked] + 1e-20) * routed_scale
//   expert(x) = w2 (silu(min(w1 x, limit)) * clamp(w3 x, -limit, limit))
#pragma once

#include <span>

#include "core/tensor.h"
#include "ops/weight.h"

namespace tern::ops {

class Context;  // ops/context.h: each op runs in one

// logits f32 [T, E], bias f32 [E]; indices i32 [T, k], weights f32 [T, k] (k from their shape).
void route_scored(const Context& ctx, const TensorView& logits, const TensorView& bias, float routed_scale,
                  const TensorView& indices, const TensorView& weights);
// tid2eid i64|i32 [vocab, k], token_ids i64 [T].
void route_hash(const Context& ctx, const TensorView& logits, const TensorView& tid2eid,
                const TensorView& token_ids, float routed_scale, const TensorView& indices,
                const TensorView& weights);

struct Expert {
  Weight w1, w2, w3;  // gate [inter, D], down [D, inter], up [inter, D]
  // w1 and w3 stacked, [2 inter, D] (the model's shared expert, model/stacked.h: w1 and w3 then view it); empty:
  // apart, as the routed experts' always are (the MoE kernels read those per expert).
  Weight w13;
};

// The routing moe_experts runs itself when `logits` is set (MoeExpertsArgs::route): indices and weights are then
// its outputs, the bits route_scored (bias set) or route_hash (tid2eid and token_ids set) would write. A backend that
// says so (Backend::moe_experts_routes) runs the routing in the launch that plans the experts (the CUDA decode path:
// routing, plan and x's FP8 quantisation in one kernel, three launches on a batch-1 step's path made one); for the
// others moe_experts runs the route op first.
struct MoeRouting {
  TensorView logits;     // f32 [T, E]
  TensorView bias;       // scored: f32 [E]
  TensorView tid2eid;    // hash: i64|i32 [vocab, k]
  TensorView token_ids;  // hash: i64 [T]
  float routed_scale = 1.0f;
  bool hashed() const { return !tid2eid.empty(); }
};

struct MoeExpertsArgs {
  TensorView x;        // f32 [T, D]
  TensorView indices;  // i32 [T, k]: an input, or moe_experts' output when route.logits is set
  TensorView weights;  // f32 [T, k]: likewise
  std::span<const Expert> experts;
  float limit = 10.0f;
  TensorView out;  // f32 [T, D] = sum_k weights[t,k] * expert_{indices[t,k]}(x[t])  (+ shared[t])
  // Optional f32 [T, D] added to out after the routed sum (the shared expert's output: one launch and one pass over
  // out less than a separate add, the same bits). It may be written by the step's open side branch (ops/branch.h):
  // moe_experts joins that branch before it reads `shared`, after issuing the routed products, so they still overlap
  // it; the caller does not join_side itself.
  TensorView shared;
  MoeRouting route;  // empty logits: indices and weights are inputs
};
void moe_experts(const Context& ctx, const MoeExpertsArgs& a);

}  // namespace tern::ops
