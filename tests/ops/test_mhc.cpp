// mHC against a double-precision transcription of deepseek-v4.md section 2; Sinkhorn's output is
// doubly stochastic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "ops/mhc.h"
#include "test_util.h"

namespace tern {
namespace {

constexpr int64_t T = 3, HC = 4, D = 40, MIX = (2 + HC) * HC;

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// m = fn . flat * rsqrt(mean(flat^2) + eps), in double.
std::vector<double> logits_of(const float* X, const float* fn, int64_t mix) {
  double ss = 0;
  for (int64_t i = 0; i < HC * D; ++i) ss += double(X[i]) * X[i];
  const double inv = 1.0 / std::sqrt(ss / (HC * D) + 1e-6);
  std::vector<double> m(mix);
  for (int64_t j = 0; j < mix; ++j) {
    double acc = 0;
    for (int64_t i = 0; i < HC * D; ++i) acc += double(fn[j * HC * D + i]) * X[i];
    m[j] = acc * inv;
  }
  return m;
}

TEST(Mhc, PreMatchesFormulaAndSinkhornIsDoublyStochastic) {
  test::Random rng(21);
  Tensor X = rng.tensor({T, HC, D}), fn = rng.tensor({MIX, HC * D}, 0.05f), base = rng.tensor({MIX}, 0.5f);
  Tensor scale = rng.tensor({3}, 1.0f);
  Tensor post(DType::f32, {T, HC}), comb(DType::f32, {T, HC, HC}), collapsed(DType::f32, {T, D});
  ops::hc_pre(cpu::context(), {X, fn, base, scale, {20, 1e-6f, 1e-6f}, post, comb, collapsed});
  const float* b = base.data<float>();
  const float* s = scale.data<float>();
  float worst = 0, worst_row = 0, worst_col = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* x = X.data<float>() + t * HC * D;
    const std::vector<double> m = logits_of(x, fn.data<float>(), MIX);
    double C[HC][HC];
    for (int64_t j = 0; j < HC; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < HC; ++k)
        sum += C[j][k] = std::exp(m[2 * HC + j * HC + k] * s[2] + b[2 * HC + j * HC + k]);
      for (int64_t k = 0; k < HC; ++k) C[j][k] = C[j][k] / sum + 1e-6;
    }
    for (int it = 0; it < 20; ++it) {
      if (it > 0)
        for (auto& row : C) {
          double sum = 0;
          for (double v : row) sum += v;
          for (double& v : row) v /= sum + 1e-6;
        }
      for (int64_t k = 0; k < HC; ++k) {
        double sum = 0;
        for (int64_t j = 0; j < HC; ++j) sum += C[j][k];
        for (int64_t j = 0; j < HC; ++j) C[j][k] /= sum + 1e-6;
      }
    }
    for (int64_t i = 0; i < HC; ++i)
      worst = std::max(worst, float(std::fabs(2 * sigmoid(m[HC + i] * s[1] + b[HC + i]) -
                                              post.data<float>()[t * HC + i])));
    for (int64_t j = 0; j < HC; ++j) {
      double row = 0, col = 0;
      for (int64_t k = 0; k < HC; ++k) {
        worst = std::max(worst, float(std::fabs(C[j][k] - comb.data<float>()[(t * HC + j) * HC + k])));
        row += comb.data<float>()[(t * HC + j) * HC + k];
        col += comb.data<float>()[(t * HC + k) * HC + j];
      }
      worst_row = std::max(worst_row, float(std::fabs(row - 1)));
      worst_col = std::max(worst_col, float(std::fabs(col - 1)));
    }
    for (int64_t d = 0; d < D; ++d) {
      double want = 0;
      for (int64_t i = 0; i < HC; ++i) want += (sigmoid(m[i] * s[0] + b[i]) + 1e-6) * x[i * D + d];
      worst = std::max(worst, float(std::fabs(want - collapsed.data<float>()[t * D + d])));
    }
  }
  std::printf("hc_pre: max|d| %.3g, Sinkhorn |rowsum-1| %.3g, |colsum-1| %.3g\n", worst, worst_row,
              worst_col);
  EXPECT_LE(worst, 2e-5f);
  EXPECT_LE(worst_col, 1e-5f);
  EXPECT_LE(worst_row, 1e-3f);
}

TEST(Mhc, PostAppliesCombTransposed) {
  test::Random rng(22);
  Tensor X = rng.tensor({T, HC, D}), a = rng.tensor({T, D}), post = rng.tensor({T, HC}),
         comb = rng.tensor({T, HC, HC});
  Tensor out(DType::f32, {T, HC, D});
  ops::hc_post(cpu::context(), X, a, post, comb, out);
  float worst = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < HC; ++k)
      for (int64_t d = 0; d < D; ++d) {
        double want = double(post.data<float>()[t * HC + k]) * a.data<float>()[t * D + d];
        for (int64_t j = 0; j < HC; ++j)
          want += double(comb.data<float>()[(t * HC + j) * HC + k]) * X.data<float>()[(t * HC + j) * D + d];
        worst = std::max(worst, float(std::fabs(want - out.data<float>()[(t * HC + k) * D + d])));
      }
  EXPECT_LE(worst, 1e-5f);
}

TEST(Mhc, HeadCollapsesWithSigmoidWeights) {
  test::Random rng(23);
  Tensor X = rng.tensor({T, HC, D}), fn = rng.tensor({HC, HC * D}, 0.05f), base = rng.tensor({HC}, 0.5f);
  Tensor scale = rng.tensor({1});
  Tensor y(DType::f32, {T, D});
  ops::hc_head(cpu::context(), {X, fn, base, scale, {20, 1e-6f, 1e-6f}, y});
  float worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* x = X.data<float>() + t * HC * D;
    const std::vector<double> m = logits_of(x, fn.data<float>(), HC);
    for (int64_t d = 0; d < D; ++d) {
      double want = 0;
      for (int64_t i = 0; i < HC; ++i)
        want += (sigmoid(m[i] * scale.data<float>()[0] + base.data<float>()[i]) + 1e-6) * x[i * D + d];
      worst = std::max(worst, float(std::fabs(want - y.data<float>()[t * D + d])));
    }
  }
  EXPECT_LE(worst, 1e-5f);
}

// The previous sub-layer's hc_post folded into hc_pre (HcPreArgs::prev_*, what the model does between sub-layers):
// the streams it writes and its outputs are those of the two ops in sequence, bit for bit; an output aliasing
// prev_streams or shapes that disagree are refused.
TEST(Mhc, FoldedPostEqualsTheTwoOps) {
  test::Random rng(22);
  Tensor X = rng.tensor({T, HC, D}), a = rng.tensor({T, D}), fn = rng.tensor({MIX, HC * D}, 0.05f);
  Tensor base = rng.tensor({MIX}, 0.5f), scale = rng.tensor({3}, 1.0f);
  Tensor post0 = rng.tensor({T, HC}), comb0 = rng.tensor({T, HC, HC}, 0.3f);
  Tensor next(DType::f32, {T, HC, D}), post(DType::f32, {T, HC}), comb(DType::f32, {T, HC, HC}),
      collapsed(DType::f32, {T, D});
  ops::hc_post(cpu::context(), X, a, post0, comb0, next);
  ops::hc_pre(cpu::context(), {next, fn, base, scale, {20, 1e-6f, 1e-6f}, post, comb, collapsed});
  Tensor fstreams(DType::f32, {T, HC, D}), fpost(DType::f32, {T, HC}), fcomb(DType::f32, {T, HC, HC}),
      fcol(DType::f32, {T, D});
  ops::HcPreArgs f{fstreams, fn, base, scale, {20, 1e-6f, 1e-6f}, fpost, fcomb, fcol};
  f.prev_streams = X, f.prev_a = a, f.prev_post = post0, f.prev_comb = comb0;
  ops::hc_pre(cpu::context(), f);
  for (const auto& [x, y] : {std::pair{&fstreams, &next}, {&fpost, &post}, {&fcomb, &comb}, {&fcol, &collapsed}})
    EXPECT_EQ(std::memcmp(x->data<float>(), y->data<float>(), x->nbytes()), 0);
  ops::HcPreArgs alias = f;
  alias.prev_streams = fstreams;
  EXPECT_THROW(ops::hc_pre(cpu::context(), alias), Error);
  ops::HcPreArgs bad = f;
  const Tensor wide = rng.tensor({T, D + 1});
  bad.prev_a = wide;
  EXPECT_THROW(ops::hc_pre(cpu::context(), bad), Error);
  ops::HcPreArgs partial = f;  // some prev_* without the others
  partial.prev_a = TensorView();
  EXPECT_THROW(ops::hc_pre(cpu::context(), partial), Error);
}

// post and comb apart (HcPreArgs::logits, then hc_comb: what the model does, hc_comb on a side branch): the
// logits are the formula's m, and the outputs are those of the one op, bit for bit; post or comb given beside
// logits, or logits of the wrong shape, are refused.
TEST(Mhc, CombApartEqualsTheOneOp) {
  test::Random rng(23);
  Tensor X = rng.tensor({T, HC, D}), fn = rng.tensor({MIX, HC * D}, 0.05f), base = rng.tensor({MIX}, 0.5f);
  Tensor scale = rng.tensor({3}, 1.0f), norm = rng.tensor({D}, 1.0f);
  const ops::HcParams params{20, 1e-6f, 1e-6f};
  Tensor post(DType::f32, {T, HC}), comb(DType::f32, {T, HC, HC}), collapsed(DType::f32, {T, D});
  ops::hc_pre(cpu::context(), {X, fn, base, scale, params, post, comb, collapsed, true, norm, 1e-5f});
  Tensor logits(DType::f32, {T, MIX}), apost(DType::f32, {T, HC}), acomb(DType::f32, {T, HC, HC}),
      acol(DType::f32, {T, D});
  ops::HcPreArgs a{X, fn, base, scale, params, {}, {}, acol, true, norm, 1e-5f};
  a.logits = logits;
  ops::hc_pre(cpu::context(), a);
  ops::hc_comb(cpu::context(), {logits, base, scale, params, apost, acomb});
  for (const auto& [x, y] : {std::pair{&apost, &post}, {&acomb, &comb}, {&acol, &collapsed}})
    EXPECT_EQ(std::memcmp(x->data<float>(), y->data<float>(), x->nbytes()), 0);
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> m = logits_of(X.data<float>() + t * HC * D, fn.data<float>(), MIX);
    for (int64_t j = 0; j < MIX; ++j)
      EXPECT_NEAR(logits.data<float>()[t * MIX + j], m[j], 1e-5 * (1 + std::fabs(m[j]))) << t << " " << j;
  }
  ops::HcPreArgs both = a;
  both.post = post;
  EXPECT_THROW(ops::hc_pre(cpu::context(), both), Error);
  const Tensor narrow = rng.tensor({T, MIX - 1});
  ops::HcPreArgs bad = a;
  bad.logits = narrow;
  EXPECT_THROW(ops::hc_pre(cpu::context(), bad), Error);
  EXPECT_THROW(ops::hc_comb(cpu::context(), {narrow, base, scale, params, apost, acomb}), Error);
}

}  // namespace
}  // namespace tern
