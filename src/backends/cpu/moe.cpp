// Routing (scored and hash) and the routed experts.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"

namespace tern::cpu {
namespace {

// sqrt(softplus(x)) with torch's softplus threshold (x > 20: softplus(x) = x).
float sqrt_softplus(float x) {
  return std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));
}

// weights[t, j] = score[picked j] / (sum + 1e-20) * routed_scale
void normalize(const float* scores, const int32_t* picked, int64_t k, float routed_scale, float* weights) {
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) sum += weights[j] = scores[picked[j]];
  for (int64_t j = 0; j < k; ++j) weights[j] = weights[j] / (sum + 1e-20f) * routed_scale;
}

}  // namespace

void CpuBackend::route_scored(const TensorView& logits, const TensorView& bias, float routed_scale,
                              const TensorView& indices, const TensorView& weights) {
  require_f32("route_scored", {&logits, &weights});
  const int64_t T = logits.dim(0), E = logits.dim(1), k = indices.dim(1);
  std::vector<float> scores(E), biased(E);
  std::vector<int32_t> order(E);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      scores[e] = sqrt_softplus(logits.data_as<const float>()[t * E + e]);
      biased[e] = scores[e] + bias.data_as<const float>()[e];  // the bias only selects
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t x, int32_t y) {
      return biased[x] > biased[y] || (biased[x] == biased[y] && x < y);
    });
    int32_t* picked = indices.data_as<int32_t>() + t * k;
    std::copy(order.begin(), order.begin() + k, picked);
    normalize(scores.data(), picked, k, routed_scale, weights.data_as<float>() + t * k);
  }
}

void CpuBackend::route_hash(const TensorView& logits, const TensorView& tid2eid, const TensorView& token_ids,
                            float routed_scale, const TensorView& indices, const TensorView& weights) {
  require_f32("route_hash", {&logits, &weights});
  const int64_t T = logits.dim(0), E = logits.dim(1), k = indices.dim(1), vocab = tid2eid.dim(0);
  std::vector<float> scores(E);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t token = token_ids.data_as<const int64_t>()[t];
    TERN_CHECK(token >= 0 && token < vocab, "route_hash: token ", token, " outside tid2eid's ", vocab,
               " rows");
    int32_t* picked = indices.data_as<int32_t>() + t * k;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = tid2eid.dtype() == DType::i64 ? tid2eid.data_as<const int64_t>()[token * k + j]
                                                      : tid2eid.data_as<const int32_t>()[token * k + j];
      TERN_CHECK(e >= 0 && e < E, "route_hash: tid2eid[", token, "] names expert ", e, " of ", E);
      picked[j] = static_cast<int32_t>(e);
    }
    for (int64_t e = 0; e < E; ++e) scores[e] = sqrt_softplus(logits.data_as<const float>()[t * E + e]);
    normalize(scores.data(), picked, k, routed_scale, weights.data_as<float>() + t * k);
  }
}

// Experts in increasing id order, each over the tokens routed to it (gather, SwiGLU MLP, weighted add).
void CpuBackend::moe_experts(const ops::MoeExpertsArgs& a) {
  require_f32("moe_experts", {&a.x, &a.weights, &a.out});
  const int64_t T = a.x.dim(0), D = a.x.dim(1), k = a.indices.dim(1);
  const auto* idx = a.indices.data_as<const int32_t>();
  const auto* wts = a.weights.data_as<const float>();
  float* out = a.out.data_as<float>();
  std::fill(out, out + T * D, 0.0f);
  for (int64_t j = 0; j < T * k; ++j)
    TERN_CHECK(idx[j] >= 0 && idx[j] < static_cast<int64_t>(a.experts.size()), "moe_experts: expert index ",
               idx[j], " out of range");
  for (int64_t e = 0; e < static_cast<int64_t>(a.experts.size()); ++e) {
    std::vector<int64_t> slots;  // t * k + j of the (token, pick) pairs routed to e
    for (int64_t j = 0; j < T * k; ++j)
      if (idx[j] == e) slots.push_back(j);
    if (slots.empty()) continue;
    const ops::Expert& ex = a.experts[e];
    const auto n = static_cast<int64_t>(slots.size());
    const int64_t inter = ex.w1.out;
    std::vector<float> xs(n * D), gate(n * inter), up(n * inter), y(n * D);
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(a.x.data_as<const float>() + (slots[r] / k) * D, D, xs.data() + r * D);
    matmul_rows(xs.data(), n, D, inter, ex.w1, gate.data());
    matmul_rows(xs.data(), n, D, inter, ex.w3, up.data());
    for (int64_t i = 0; i < n * inter; ++i)
      gate[i] = silu(std::min(gate[i], a.limit)) * std::clamp(up[i], -a.limit, a.limit);
    matmul_rows(gate.data(), n, inter, D, ex.w2, y.data());
    for (int64_t r = 0; r < n; ++r)
      for (int64_t d = 0; d < D; ++d) out[(slots[r] / k) * D + d] += y[r * D + d] * wts[slots[r]];
  }
  if (!a.shared.empty()) {  // after the routed sum, as a separate add would (the CPU has no side branch to join)
    const float* s = a.shared.data_as<const float>();
    for (int64_t i = 0; i < T * D; ++i) out[i] += s[i];
  }
}

}  // namespace tern::cpu
