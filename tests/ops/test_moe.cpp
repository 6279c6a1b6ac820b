// Routing (sqrt-softplus scores, bias for selection only, hash tables) and clamped SwiGLU experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "backends/cpu/cpu_backend.h"
#include "ops/elementwise.h"
#include "ops/moe.h"
#include "test_util.h"

namespace tern {
namespace {

double sqrt_softplus(double x) {
  return std::sqrt(std::log1p(std::exp(x)));
}

TEST(Routing, ScoredPicksTopKOfBiasedScoresAndWeightsUnbiased) {
  test::Random rng(41);
  const int64_t T = 6, E = 16, k = 4;
  Tensor logits = rng.tensor({T, E}, 2.0f), bias = rng.tensor({E}, 0.5f);
  Tensor idx(DType::i32, {T, k}), w(DType::f32, {T, k});
  ops::route_scored(cpu::context(), logits, bias, 1.5f, idx, w);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<std::pair<double, int>> order;
    for (int e = 0; e < E; ++e)
      order.emplace_back(-(sqrt_softplus(logits.data<float>()[t * E + e]) + bias.data<float>()[e]), e);
    std::sort(order.begin(), order.end());
    std::set<int> want, got;
    double sum = 0;
    for (int j = 0; j < k; ++j) {
      want.insert(order[j].second);
      got.insert(idx.data<int32_t>()[t * k + j]);
      sum += sqrt_softplus(logits.data<float>()[t * E + order[j].second]);
    }
    EXPECT_EQ(want, got);
    for (int j = 0; j < k; ++j) {
      const int e = idx.data<int32_t>()[t * k + j];
      EXPECT_NEAR(w.data<float>()[t * k + j], sqrt_softplus(logits.data<float>()[t * E + e]) / sum * 1.5,
                  1e-6);
    }
  }
}

TEST(Routing, HashUsesTheTableAndStillWeightsByScore) {
  test::Random rng(42);
  const int64_t T = 5, E = 8, k = 2, vocab = 20;
  Tensor logits = rng.tensor({T, E}), table(DType::i64, {vocab, k}), ids(DType::i64, {T});
  for (int64_t v = 0; v < vocab; ++v) {
    table.data<int64_t>()[v * k] = v % E;
    table.data<int64_t>()[v * k + 1] = (v + 3) % E;
  }
  for (int64_t t = 0; t < T; ++t) ids.data<int64_t>()[t] = rng.integer(0, vocab - 1);
  Tensor idx(DType::i32, {T, k}), w(DType::f32, {T, k});
  ops::route_hash(cpu::context(), logits, table, ids, 1.5f, idx, w);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t v = ids.data<int64_t>()[t];
    const double s0 = sqrt_softplus(logits.data<float>()[t * E + v % E]);
    const double s1 = sqrt_softplus(logits.data<float>()[t * E + (v + 3) % E]);
    EXPECT_EQ(idx.data<int32_t>()[t * k], v % E);
    EXPECT_EQ(idx.data<int32_t>()[t * k + 1], (v + 3) % E);
    EXPECT_NEAR(w.data<float>()[t * k], s0 / (s0 + s1) * 1.5, 1e-6);
  }
  table.data<int64_t>()[ids.data<int64_t>()[0] * k] = E;  // names a missing expert
  EXPECT_THROW(ops::route_hash(cpu::context(), logits, table, ids, 1.5f, idx, w), Error);
}

// E random f32 experts (D -> inter -> D, std 0.4) and the tensors they view.
struct F32Experts {
  std::vector<Tensor> keep;
  std::vector<ops::Expert> experts;
  F32Experts(test::Random& rng, int64_t E, int64_t D, int64_t inter) {
    keep.reserve(3 * E);  // the views below stay valid
    auto weight = [&](int64_t out, int64_t in) {
      keep.push_back(rng.tensor({out, in}, 0.4f));
      return ops::Weight{ops::WeightFormat::f32, out, in, keep.back().view(), {}, 1.0f, "w"};
    };
    for (int64_t e = 0; e < E; ++e) experts.push_back({weight(inter, D), weight(D, inter), weight(inter, D), {}});
  }
};

TEST(Experts, WeightedSumOfClampedSwiGluExperts) {
  test::Random rng(43);
  const int64_t T = 7, D = 24, inter = 16, E = 4, k = 2;
  const float limit = 1.5f;  // small, so the clamps bite
  const F32Experts f32(rng, E, D, inter);
  const std::vector<ops::Expert>& experts = f32.experts;
  Tensor x = rng.tensor({T, D}), idx(DType::i32, {T, k}), w = rng.tensor({T, k});
  for (int64_t t = 0; t < T; ++t)
    idx.data<int32_t>()[t * k] = t % E, idx.data<int32_t>()[t * k + 1] = (t + 1) % E;
  Tensor out(DType::f32, {T, D});
  ops::moe_experts(cpu::context(), {x, idx, w, experts, limit, out});
  float worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> want(D, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const ops::Expert& ex = experts[idx.data<int32_t>()[t * k + j]];
      std::vector<double> act(inter);
      for (int64_t i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int64_t d = 0; d < D; ++d) {
          g += double(ex.w1.weight.data_as<float>()[i * D + d]) * x.data<float>()[t * D + d];
          u += double(ex.w3.weight.data_as<float>()[i * D + d]) * x.data<float>()[t * D + d];
        }
        g = std::min<double>(g, limit);
        u = std::clamp<double>(u, -limit, limit);
        act[i] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t d = 0; d < D; ++d) {
        double y = 0;
        for (int64_t i = 0; i < inter; ++i)
          y += double(ex.w2.weight.data_as<float>()[d * inter + i]) * act[i];
        want[d] += y * w.data<float>()[t * k + j];
      }
    }
    for (int64_t d = 0; d < D; ++d)
      worst = std::max(worst, float(std::fabs(want[d] - out.data<float>()[t * D + d])));
  }
  EXPECT_LE(worst, 1e-5f);

  // A shared output is added after the routed sum: the bits of moe_experts, then add (the model's old sequence).
  Tensor shared = rng.tensor({T, D}), with(DType::f32, {T, D}), then(DType::f32, {T, D});
  ops::moe_experts(cpu::context(), {x, idx, w, experts, limit, with, shared});
  std::memcpy(then.data<float>(), out.data<float>(), T * D * 4);
  ops::add(cpu::context(), shared, then);
  EXPECT_EQ(std::memcmp(with.data<float>(), then.data<float>(), T * D * 4), 0);
  Tensor wrong(DType::f32, {T, D + 1});
  EXPECT_THROW(ops::moe_experts(cpu::context(), {x, idx, w, experts, limit, with, wrong}), Error);
}

// moe_experts with its routing (MoeExpertsArgs::route, scored and hash): the picks, weights and output of the route
// op then moe_experts, bit for bit; logits of another shape are refused before anything is written.
TEST(Experts, RoutingInsideGivesTheBitsOfRouteThenExperts) {
  test::Random rng(44);
  const int64_t T = 5, D = 16, inter = 8, E = 6, k = 2, vocab = 11;
  const F32Experts f32(rng, E, D, inter);
  const std::vector<ops::Expert>& experts = f32.experts;
  Tensor x = rng.tensor({T, D}), logits = rng.tensor({T, E}, 2.0f), bias = rng.tensor({E}, 0.5f);
  Tensor table(DType::i64, {vocab, k}), ids(DType::i64, {T});
  for (int64_t v = 0; v < vocab; ++v) table.data<int64_t>()[v * k] = v % E, table.data<int64_t>()[v * k + 1] = (v + 1) % E;
  for (int64_t t = 0; t < T; ++t) ids.data<int64_t>()[t] = rng.integer(0, vocab - 1);
  for (const bool hashed : {false, true}) {
    Tensor idx(DType::i32, {T, k}), w(DType::f32, {T, k}), want(DType::f32, {T, D});
    if (hashed)
      ops::route_hash(cpu::context(), logits, table, ids, 1.5f, idx, w);
    else
      ops::route_scored(cpu::context(), logits, bias, 1.5f, idx, w);
    ops::moe_experts(cpu::context(), {x, idx, w, experts, 1.5f, want});
    ops::MoeRouting route;
    route.logits = logits;
    route.routed_scale = 1.5f;
    if (hashed)
      route.tid2eid = table, route.token_ids = ids;
    else
      route.bias = bias;
    Tensor idx2(DType::i32, {T, k}), w2(DType::f32, {T, k}), got(DType::f32, {T, D});
    ops::moe_experts(cpu::context(), {x, idx2, w2, experts, 1.5f, got, {}, route});
    EXPECT_EQ(std::memcmp(idx2.data<int32_t>(), idx.data<int32_t>(), T * k * 4), 0) << hashed;
    EXPECT_EQ(std::memcmp(w2.data<float>(), w.data<float>(), T * k * 4), 0) << hashed;
    EXPECT_EQ(std::memcmp(got.data<float>(), want.data<float>(), T * D * 4), 0) << hashed;
    // Logits (and bias) of E - 1 experts for E experts: refused by moe_experts' own check.
    Tensor narrow = rng.tensor({T, E - 1}), narrow_bias = rng.tensor({E - 1}), untouched(DType::f32, {T, D});
    std::memcpy(untouched.data<float>(), got.data<float>(), T * D * 4);
    route.logits = narrow;
    if (!hashed) route.bias = narrow_bias;
    EXPECT_THROW(ops::moe_experts(cpu::context(), {x, idx2, w2, experts, 1.5f, got, {}, route}), Error) << hashed;
    EXPECT_EQ(std::memcmp(untouched.data<float>(), got.data<float>(), T * D * 4), 0) << hashed;
  }
}

TEST(Elementwise, SwigluClampsGateAboveAndUpBothWays) {
  Tensor g(DType::f32, {3}), u(DType::f32, {3}), o(DType::f32, {3});
  const float gv[] = {20.0f, -1.0f, 0.5f}, uv[] = {-30.0f, 30.0f, 2.0f};
  std::copy_n(gv, 3, g.data<float>());
  std::copy_n(uv, 3, u.data<float>());
  ops::swiglu(cpu::context(), g, u, 10.0f, o);
  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  EXPECT_NEAR(o.data<float>()[0], silu(10) * -10, 1e-4);
  EXPECT_NEAR(o.data<float>()[1], silu(-1) * 10, 1e-5);
  EXPECT_NEAR(o.data<float>()[2], silu(0.5) * 2, 1e-6);
}

}  // namespace
}  // namespace tern
