#include <gtest/gtest.h>

#include "bench/stats.h"
#include "core/error.h"

namespace tern::bench {
namespace {

TEST(Stats, PercentilesMatchNumpyLinearInterpolation) {
  // numpy.percentile([3, 1, 4, 1.5, 9, 2.6, 5], p) for p = 0, 50, 90, 95, 99, 100
  Distribution d = distribution({3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0});
  EXPECT_DOUBLE_EQ(d.median, 3.0);
  EXPECT_NEAR(d.p90, 6.6, 1e-12);
  EXPECT_NEAR(d.p95, 7.8, 1e-12);
  EXPECT_NEAR(d.p99, 8.76, 1e-12);
  EXPECT_DOUBLE_EQ(d.max, 9.0);
  EXPECT_NEAR(d.mean, 3.7285714285714286, 1e-12);
  EXPECT_NEAR(d.std, 2.498407656153521, 1e-12);  // population std, as numpy.std
  EXPECT_EQ(d.count, 7u);
}

TEST(Stats, EmptyDistributionIsZero) {
  Distribution d = distribution({});
  EXPECT_EQ(d.mean, 0);
  EXPECT_EQ(d.p99, 0);
}

RequestResult ok(double start, double ttft, std::vector<double> itl, int out, int in = 10) {
  RequestResult r;
  r.success = true, r.usage_reported = true;
  r.start_s = start, r.ttft_s = ttft, r.itl_s = std::move(itl), r.output_len = out, r.input_len = in;
  r.latency_s = ttft;
  for (double g : r.itl_s) r.latency_s += g;
  return r;
}

TEST(Stats, SummaryFollowsServingDefinitions) {
  std::vector<RequestResult> rs = {ok(0.0, 0.1, {0.05, 0.05, 0.1}, 4), ok(0.5, 0.3, {0.1}, 2)};
  RequestResult failed;
  failed.reason = "http 500", failed.error = "HTTP 500: boom", failed.start_s = 0.2, failed.latency_s = 0.01;
  rs.push_back(failed);
  Summary s = summarize(rs, Slo{});
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.failures.at("http 500"), 1);
  EXPECT_DOUBLE_EQ(s.duration_s, 0.9);  // first send 0.0, last completion 0.5 + 0.4
  EXPECT_EQ(s.total_output, 6);
  EXPECT_EQ(s.total_input, 20);
  EXPECT_NEAR(s.output_throughput, 6 / 0.9, 1e-9);
  EXPECT_NEAR(s.total_throughput, 26 / 0.9, 1e-9);
  EXPECT_NEAR(s.request_throughput, 2 / 0.9, 1e-9);
  EXPECT_NEAR(s.ttft_ms.mean, 200, 1e-9);
  // TPOT: (0.3 - 0.1) / 3 and (0.4 - 0.3) / 1
  EXPECT_NEAR(s.tpot_ms.mean, (200.0 / 3 + 100.0) / 2, 1e-9);
  EXPECT_EQ(s.itl_ms.count, 4u);
  EXPECT_NEAR(s.itl_ms.max, 100, 1e-9);
  EXPECT_NEAR(s.e2e_ms.mean, 350, 1e-9);
  EXPECT_NEAR(s.concurrency, 0.7 / 0.9, 1e-9);
  EXPECT_FALSE(s.goodput.has_value());
}

TEST(Stats, SingleTokenRequestsHaveNoTpot) {
  Summary s = summarize({ok(0, 0.1, {}, 1)}, Slo{});
  EXPECT_EQ(s.tpot_ms.count, 0u);
  EXPECT_EQ(s.completed, 1);
}

TEST(Stats, GoodputCountsRequestsMeetingEverySlo) {
  std::vector<RequestResult> rs = {ok(0, 0.1, {0.01, 0.01}, 3), ok(0, 0.5, {0.01}, 2), ok(0, 0.1, {0.2}, 2)};
  Summary s = summarize(rs, parse_slo("ttft:200,tpot:50"));
  ASSERT_TRUE(s.goodput.has_value());
  EXPECT_NEAR(*s.goodput, 1 / s.duration_s, 1e-9);  // only the first meets both
}

TEST(Stats, ParseSloRejectsUnknownNamesAndBadNumbers) {
  Slo slo = parse_slo("ttft:250,e2el:3000");
  EXPECT_EQ(*slo.ttft_ms, 250);
  EXPECT_EQ(*slo.e2el_ms, 3000);
  EXPECT_FALSE(slo.tpot_ms);
  EXPECT_THROW(parse_slo("latency:5"), Error);
  EXPECT_THROW(parse_slo("ttft:abc"), Error);
  EXPECT_THROW(parse_slo("ttft"), Error);
  EXPECT_THROW(parse_slo("ttft:-1"), Error);
}

TEST(Stats, PeakOutputTokensPerSecondUsesWholeSecondBuckets) {
  // 3 chunks in second 0, 2 in second 1.
  std::vector<RequestResult> rs = {ok(0, 0.2, {0.3, 0.6, 0.1}, 4), ok(0.1, 0.3, {}, 1)};
  Summary s = summarize(rs, Slo{});
  EXPECT_EQ(s.max_output_tokens_per_s, 3);
  EXPECT_EQ(s.max_concurrent_requests, 2);
}

}  // namespace
}  // namespace tern::bench
