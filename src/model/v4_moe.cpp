// The MoE sub-layer: routing (hash or scored), the routed experts and the shared expert.
#include <functional>

#include "model/v4_batch.h"
#include "ops/branch.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/moe.h"

namespace tern::model {

void Model::moe_block(int l, const Batch& b, const TensorView& h, const TensorView& out) {
  const ModelConfig& c = w_.config;
  const LayerWeights& L = layer(l);
  const int64_t N = b.tokens, k = c.experts_per_token;
  const auto limit = static_cast<float>(c.swiglu_limit);
  const auto routed_scale = static_cast<float>(c.routed_scaling_factor);

  // The shared expert reads only h: a side branch (ops/branch.h; its own stream inside decode graphs) that
  // overlaps the gate, the routing and the routed experts. y = E_shared(h); w1 h and w3 h come from one
  // product (stacked weights), swiglu reads its column ranges.
  const ExpertWeights& shared = L.ffn.shared;
  Tensor y = tensor(DType::f32, {N, c.hidden_size});
  const std::function<void()> comb_task = take_side_task();  // hc_comb of this sub-layer's hc_pre, if apart
  ops::run_side(ctx_, h.device(), [&] {
    const Projections gate_up = project(h, shared.w13, shared.w1, shared.w3);
    Tensor act = tensor(DType::f32, {N, shared.w1.out});
    ops::swiglu(ctx_, gate_up.a, gate_up.b, limit, act);
    ops::linear(ctx_, act, shared.w2, y);
    if (comb_task) comb_task();
  });

  // scores = sqrt(softplus(gate h)); picked by tid2eid[token] (hash layers) or top-k of scores + bias. moe_experts
  // routes (ops::MoeRouting: on the GPU in the launch that plans the experts).
  Tensor logits = tensor(DType::f32, {N, L.ffn.gate.out});
  ops::linear(ctx_, h, L.ffn.gate, logits);
  Tensor picked = tensor(DType::i32, {N, k}), weights = tensor(DType::f32, {N, k});
  ops::MoeRouting route;
  route.logits = logits;
  route.routed_scale = routed_scale;
  if (L.hash_routed) {
    route.tid2eid = L.ffn.tid2eid;
    route.token_ids = b.ids;
  } else {
    route.bias = L.ffn.gate_bias;
  }

  // out = sum_k w_k E_k(h) + E_shared(h): moe_experts adds y in its combine and joins the side branch there.
  ops::moe_experts(ctx_, {h, picked, weights, L.ffn.experts, limit, out, y, route});
  if ((paths_.l2_prefetch & kPrefetchNextQ) != 0 && N <= kPrefetchMaxTokens && l + 1 < c.num_layers) {
    const AttentionWeights& next = layer(l + 1).attn;
    ops::prefetch(ctx_, next.wq_a_wkv.weight.empty() ? next.wq_a : next.wq_a_wkv);
    ops::prefetch(ctx_, next.wq_b);
  }
}

}  // namespace tern::model
