// Speculative acceptance (engine/speculative.h) and the distributions it takes (Sampler::distribution): greedy drafts
// give greedy decoding's tokens; sampled drafts give tokens distributed as the target's, whatever the draft
// distribution (checked by drawing many rounds).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"
#include "engine/speculative.h"

namespace tern::engine {
namespace {

TEST(SpecAcceptGreedy, KeepsDraftsWhileTheyAreTheTargetsChoice) {
  const std::vector<int32_t> target = {5, 7, 2, 9};
  EXPECT_EQ(accept_greedy(target, std::vector<int32_t>{5, 7, 2}).accepted, 3);
  EXPECT_EQ(accept_greedy(target, std::vector<int32_t>{5, 7, 2}).next, 9);  // the bonus token
  const SpecVerdict mid = accept_greedy(target, std::vector<int32_t>{5, 7, 3});
  EXPECT_EQ(mid.accepted, 2);
  EXPECT_EQ(mid.next, 2);  // the target's choice where the draft parted
  const SpecVerdict first = accept_greedy(target, std::vector<int32_t>{4, 7, 2});
  EXPECT_EQ(first.accepted, 0);
  EXPECT_EQ(first.next, 5);  // later matches do not count after a rejection
  EXPECT_EQ(accept_greedy(std::vector<int32_t>{3}, std::vector<int32_t>{}).next, 3);  // k = 0: plain decoding
  EXPECT_THROW(accept_greedy(target, std::vector<int32_t>{5, 7}), Error);
}

// A random distribution over `vocab` tokens with some zeros (tokens the sampling excludes).
std::vector<float> random_row(int64_t vocab, std::mt19937_64& g, bool zeros) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> r(vocab);
  float s = 0.0f;
  for (int64_t i = 0; i < vocab; ++i) {
    r[i] = zeros && i % 3 == 1 ? 0.0f : u(g) + 0.05f;
    s += r[i];
  }
  for (float& x : r) x /= s;
  return r;
}

int32_t draw(const std::vector<float>& row, std::mt19937_64& g) {
  std::discrete_distribution<int32_t> d(row.begin(), row.end());
  return d(g);
}

// The emitted token at position 0 of a round follows p_0, and, in the rounds that keep draft 0, the token at
// position 1 follows p_1: speculative sampling preserves the target's distribution whatever q is (here q has zeros
// where p has mass and mass where p has zeros, and the drafts are drawn from q).
TEST(SpecAcceptSampled, EmittedTokensFollowTheTarget) {
  const int64_t V = 6, k = 2, rounds = 400000;
  std::mt19937_64 g(20261204);
  std::vector<std::vector<float>> p = {random_row(V, g, true), random_row(V, g, false), random_row(V, g, true)};
  std::vector<std::vector<float>> q = {random_row(V, g, false), random_row(V, g, true)};
  std::vector<float> pf, qf;
  for (const auto& r : p) pf.insert(pf.end(), r.begin(), r.end());
  for (const auto& r : q) qf.insert(qf.end(), r.begin(), r.end());
  std::vector<int64_t> first(V, 0), second(V, 0);
  int64_t reached_second = 0, kept = 0;
  std::mt19937_64 rng(7), draft_rng(11);
  for (int64_t n = 0; n < rounds; ++n) {
    const std::vector<int32_t> drafts = {draw(q[0], draft_rng), draw(q[1], draft_rng)};
    const SpecVerdict v = accept_sampled(pf, qf, V, drafts, rng);
    ASSERT_GE(v.accepted, 0);
    ASSERT_LE(v.accepted, k);
    kept += v.accepted;
    ++first[v.accepted == 0 ? v.next : drafts[0]];
    if (v.accepted >= 1) {
      ++reached_second;
      ++second[v.accepted == 1 ? v.next : drafts[1]];
    }
  }
  for (int64_t i = 0; i < V; ++i) {
    const double f = static_cast<double>(first[i]) / rounds, s = static_cast<double>(second[i]) / reached_second;
    // 5 standard deviations of a frequency estimate
    EXPECT_NEAR(f, p[0][i], 5 * std::sqrt(p[0][i] * (1 - p[0][i]) / rounds) + 1e-6) << "position 0, token " << i;
    EXPECT_NEAR(s, p[1][i], 5 * std::sqrt(p[1][i] * (1 - p[1][i]) / reached_second) + 1e-6) << "position 1, token " << i;
  }
  // The expected acceptance of draft 0 is sum_x min(p_0(x), q_0(x)).
  double overlap = 0.0;
  for (int64_t i = 0; i < V; ++i) overlap += std::min(p[0][i], q[0][i]);
  EXPECT_NEAR(static_cast<double>(reached_second) / rounds, overlap, 0.005);
  EXPECT_GT(kept, 0);
}

// Drafts from the target's own distribution are always kept; the bonus token then follows p_k.
// The (1 - alpha) quantile of the chi-square distribution with `dof` degrees of freedom, by Wilson and Hilferty's
// cube approximation (within 1% of the table at these dof), from the standard normal quantile z of 1 - alpha.
double chi_square_quantile(int dof, double z) {
  const double k = dof, c = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - c + z * std::sqrt(c), 3.0);
}

// Pearson's chi-square of counts against probabilities (cells with p = 0 must have no count: returned as +inf).
double chi_square(const std::vector<int64_t>& counts, const std::vector<float>& p, int64_t n, int* dof) {
  double x = 0.0;
  *dof = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0.0f) {
      if (counts[i] != 0) return INFINITY;
      continue;
    }
    const double e = static_cast<double>(n) * p[i];
    x += (static_cast<double>(counts[i]) - e) * (static_cast<double>(counts[i]) - e) / e;
    ++*dof;
  }
  return x;
}

// The same claim as a goodness-of-fit test over many seeds: 40 seeds, each with its own target p and draft q over 5
// tokens (zeros in both, in other places) and 25 000 rounds at k = 2; the emitted token at position 0 and, when draft 0
// is kept, at position 1, pooled per seed, against p_0 and p_1 by Pearson's chi-square. Each of the 80 statistics
// fails above its 1 - 1e-8 quantile, so a correct sampler fails this test with probability below 80 * 1e-8 < 1e-6.
TEST(SpecAcceptSampled, ChiSquareOverManySeeds) {
  const int64_t V = 5, rounds = 25000;
  const double z = 5.612;  // the standard normal's 1 - 1e-8 quantile
  double worst = 0.0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    std::mt19937_64 g(seed * 7919);
    std::vector<std::vector<float>> p = {random_row(V, g, seed % 2 == 0), random_row(V, g, seed % 3 == 0),
                                         random_row(V, g, false)};
    std::vector<std::vector<float>> q = {random_row(V, g, seed % 2 == 1), random_row(V, g, true)};
    std::vector<float> pf, qf;
    for (const auto& r : p) pf.insert(pf.end(), r.begin(), r.end());
    for (const auto& r : q) qf.insert(qf.end(), r.begin(), r.end());
    std::vector<int64_t> first(V, 0), second(V, 0);
    int64_t reached = 0;
    std::mt19937_64 rng(seed), draft_rng(seed + 1000);
    for (int64_t n = 0; n < rounds; ++n) {
      const std::vector<int32_t> drafts = {draw(q[0], draft_rng), draw(q[1], draft_rng)};
      const SpecVerdict v = accept_sampled(pf, qf, V, drafts, rng);
      ++first[v.accepted == 0 ? v.next : drafts[0]];
      if (v.accepted >= 1) ++reached, ++second[v.accepted == 1 ? v.next : drafts[1]];
    }
    int dof0 = 0, dof1 = 0;
    const double x0 = chi_square(first, p[0], rounds, &dof0), x1 = chi_square(second, p[1], reached, &dof1);
    ASSERT_GT(reached, 1000) << "seed " << seed;
    EXPECT_LE(x0, chi_square_quantile(dof0, z)) << "seed " << seed << ": position 0, chi-square " << x0 << ", " << dof0 << " dof";
    EXPECT_LE(x1, chi_square_quantile(dof1, z)) << "seed " << seed << ": position 1, chi-square " << x1 << ", " << dof1 << " dof";
    worst = std::max({worst, x0 / chi_square_quantile(dof0, z), x1 / chi_square_quantile(dof1, z)});
  }
  std::printf("chi-square over 40 seeds: the largest statistic is %.2f of its 1 - 1e-8 quantile\n", worst);
}

TEST(SpecAcceptSampled, DraftsFromTheTargetAreAllKept) {
  const int64_t V = 5, k = 3, rounds = 200000;
  std::mt19937_64 g(3);
  std::vector<float> pf;
  std::vector<std::vector<float>> p;
  for (int64_t j = 0; j <= k; ++j) {
    p.push_back(random_row(V, g, j % 2 == 0));
    pf.insert(pf.end(), p.back().begin(), p.back().end());
  }
  const std::vector<float> qf(pf.begin(), pf.begin() + k * V);
  std::vector<int64_t> bonus(V, 0);
  std::mt19937_64 rng(5), draft_rng(6);
  for (int64_t n = 0; n < rounds; ++n) {
    const std::vector<int32_t> drafts = {draw(p[0], draft_rng), draw(p[1], draft_rng), draw(p[2], draft_rng)};
    const SpecVerdict v = accept_sampled(pf, qf, V, drafts, rng);
    ASSERT_EQ(v.accepted, k);
    ++bonus[v.next];
  }
  for (int64_t i = 0; i < V; ++i)
    EXPECT_NEAR(static_cast<double>(bonus[i]) / rounds, p[k][i], 5 * std::sqrt(p[k][i] * (1 - p[k][i]) / rounds) + 1e-6);
}

// A greedy draft (q one-hot on the draft) is kept with probability p(draft); a rejection never emits the draft
// again (the residual excludes it); a draft the target excludes (p = 0) is always rejected.
TEST(SpecAcceptSampled, GreedyDraftsAndExcludedTokens) {
  const int64_t V = 4, rounds = 200000;
  const std::vector<float> p = {0.1f, 0.6f, 0.3f, 0.0f, 0.25f, 0.25f, 0.25f, 0.25f};
  std::vector<float> q(V, 0.0f);
  q[1] = 1.0f;
  std::mt19937_64 rng(9);
  int64_t kept = 0;
  for (int64_t n = 0; n < rounds; ++n) {
    const SpecVerdict v = accept_sampled(p, q, V, std::vector<int32_t>{1}, rng);
    kept += v.accepted;
    if (v.accepted == 0) ASSERT_NE(v.next, 1);
    if (v.accepted == 0) ASSERT_NE(v.next, 3);
  }
  EXPECT_NEAR(static_cast<double>(kept) / rounds, 0.6, 0.005);
  std::vector<float> q3(V, 0.0f);
  q3[3] = 1.0f;
  for (int n = 0; n < 1000; ++n) {
    const SpecVerdict v = accept_sampled(p, q3, V, std::vector<int32_t>{3}, rng);
    ASSERT_EQ(v.accepted, 0);
    ASSERT_NE(v.next, 3);
  }
}

// The same generator state gives the same verdicts (a seeded request is reproducible); bad input is refused.
TEST(SpecAcceptSampled, SeededAndChecked) {
  const int64_t V = 3;
  const std::vector<float> p = {0.2f, 0.5f, 0.3f, 0.3f, 0.3f, 0.4f};
  const std::vector<float> q = {0.6f, 0.2f, 0.2f};
  std::mt19937_64 a(42), b(42);
  for (int n = 0; n < 100; ++n) {
    const SpecVerdict x = accept_sampled(p, q, V, std::vector<int32_t>{n % 3}, a);
    const SpecVerdict y = accept_sampled(p, q, V, std::vector<int32_t>{n % 3}, b);
    ASSERT_EQ(x.accepted, y.accepted);
    ASSERT_EQ(x.next, y.next);
  }
  EXPECT_THROW(accept_sampled(p, q, V, std::vector<int32_t>{3}, a), Error);     // draft outside the vocabulary
  EXPECT_THROW(accept_sampled(p, q, V, std::vector<int32_t>{0, 1}, a), Error);  // rows for one draft only
  const std::vector<float> zeros(6, 0.0f);
  EXPECT_THROW(accept_sampled(zeros, q, V, std::vector<int32_t>{0}, a), Error);  // a target row with no mass
}

}  // namespace
}  // namespace tern::engine

namespace tern::engine {
namespace {

// Sampler::distribution is what sample() draws from: for the filters and penalties, the frequencies of many seeded
// draws match it (each token within 5 standard deviations), it sums to 1, it is zero where sample() never lands,
// and greedy params give a one-hot row on sample()'s token.
TEST(SamplerDistribution, IsWhatSampleDraws) {
  const std::vector<float> logits = {1.0f, 2.5f, -0.5f, 2.4f, 0.3f, 3.0f, -2.0f, 1.7f, 0.9f, 2.9f, -1.0f, 0.0f};
  const auto V = static_cast<int64_t>(logits.size());
  TokenHistory h;
  h.add_prompt(std::vector<int32_t>{5, 7}, V);
  h.add_output(9, V);
  h.add_output(9, V);
  struct Case {
    const char* name;
    SamplingParams p;
  };
  std::vector<Case> cases(5);
  cases[0] = {"temperature 0.8", {}};
  cases[0].p.temperature = 0.8f;
  cases[1] = {"top-k 4", {}};
  cases[1].p.top_k = 4;
  cases[2] = {"top-p 0.7, temperature 1.3", {}};
  cases[2].p.top_p = 0.7f, cases[2].p.temperature = 1.3f;
  cases[3] = {"min-p 0.2", {}};
  cases[3].p.min_p = 0.2f;
  cases[4] = {"penalties, top-k 6, top-p 0.9", {}};
  cases[4].p.top_k = 6, cases[4].p.top_p = 0.9f, cases[4].p.repetition_penalty = 1.3f,
  cases[4].p.frequency_penalty = 0.4f, cases[4].p.presence_penalty = 0.2f;
  Sampler s;
  for (const Case& c : cases) {
    std::vector<float> dist(V);
    s.distribution(logits, c.p, h, dist);
    double sum = 0;
    for (float x : dist) sum += x;
    EXPECT_NEAR(sum, 1.0, 1e-5) << c.name;
    const int64_t draws = 100000;
    std::vector<int64_t> count(V, 0);
    std::mt19937_64 rng(17);
    for (int64_t n = 0; n < draws; ++n) ++count[s.sample(logits, c.p, h, rng).token];
    for (int64_t i = 0; i < V; ++i) {
      const double f = static_cast<double>(count[i]) / draws;
      if (dist[i] == 0.0f) EXPECT_EQ(count[i], 0) << c.name << ", token " << i;
      EXPECT_NEAR(f, dist[i], 5 * std::sqrt(dist[i] * (1 - dist[i]) / draws) + 1e-6) << c.name << ", token " << i;
    }
  }
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.repetition_penalty = 1.5f;
  std::vector<float> one(V);
  s.distribution(logits, greedy, h, one);
  std::mt19937_64 rng(1);
  const int32_t t = s.sample(logits, greedy, h, rng).token;
  for (int64_t i = 0; i < V; ++i) EXPECT_EQ(one[i], i == t ? 1.0f : 0.0f) << "greedy, token " << i;
  std::vector<float> wrong(V - 1);
  EXPECT_THROW(s.distribution(logits, greedy, h, wrong), Error);
}

}  // namespace
}  // namespace tern::engine
