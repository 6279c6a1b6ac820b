// tern bench reads GET /metrics of the test server on loopback before and after each run: the
// acceptance figures cover exactly the measured requests (warm-up excluded), the bearer key goes with
// the GET, and a server without the counters, without /metrics or refusing it never fails the run.
#include <gtest/gtest.h>

#include <sstream>

#include "bench/runner.h"
#include "fake_server.h"

namespace tern::bench {
namespace {

using testing::FakeServer;
using testing::FakeServerOptions;

// Counters that grow with every completion request: 10 verify rounds of 3 draft tokens each, 20 of
// them accepted (9 at position 0, 7 at 1, 4 at 2).
std::string counters(int seen) {
  auto n = [seen](int per_request) { return std::to_string(per_request * seen); };
  return "# HELP tern:spec_decode_num_drafts_total Verify rounds.\n"
         "# TYPE tern:spec_decode_num_drafts_total counter\n"
         "tern:spec_decode_num_drafts_total{model_name=\"ok\"} " +
         n(10) + "\n" + "tern:spec_decode_num_draft_tokens_total{model_name=\"ok\"} " + n(30) + "\n" +
         "tern:spec_decode_num_accepted_tokens_total{model_name=\"ok\"} " + n(20) + "\n" +
         "tern:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"ok\",position=\"0\"} " + n(9) +
         "\n" + "tern:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"ok\",position=\"1\"} " +
         n(7) + "\n" +
         "tern:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"ok\",position=\"2\"} " + n(4) +
         "\n";
}

BenchConfig config_for(const FakeServer& server) {
  BenchConfig config;
  config.target.port = std::to_string(server.port());
  config.target.model = "ok";
  config.workload.num_prompts = 4;
  config.workload.input_len = 8;
  config.workload.output_len = 4;
  config.warmup_requests = 1;
  config.progress = false;
  return config;
}

TEST(ServerMetrics, RunDeltaExcludesWarmUpAndSendsTheKey) {
  FakeServerOptions options;
  options.metrics = counters;
  options.metrics_key = "sekrit";
  FakeServer server(options);
  BenchConfig config = config_for(server);
  config.target.api_key = "sekrit";
  std::ostringstream out;
  BenchOutcome outcome = run_benchmark(config, out);
  ASSERT_EQ(outcome.runs.size(), 1u);
  EXPECT_EQ(outcome.runs[0].summary.completed, 4);
  const SpeculativeOutcome& spec = outcome.runs[0].speculative;
  ASSERT_TRUE(spec.stats) << spec.note;
  EXPECT_DOUBLE_EQ(*spec.stats->drafts, 40);  // 4 measured requests, not the warm-up's 10
  EXPECT_DOUBLE_EQ(*spec.stats->draft_tokens, 120);
  EXPECT_DOUBLE_EQ(*spec.stats->accepted_tokens, 80);
  EXPECT_DOUBLE_EQ(*spec.stats->acceptance_rate, 80.0 / 120);
  EXPECT_DOUBLE_EQ(*spec.stats->acceptance_length, 3.0);
  ASSERT_EQ(spec.stats->per_position.size(), 3u);
  EXPECT_DOUBLE_EQ(spec.stats->per_position[0], 0.9);
  EXPECT_DOUBLE_EQ(spec.stats->per_position[2], 0.4);
  EXPECT_NE(out.str().find("Speculative Decoding"), std::string::npos) << out.str();
  nlohmann::json j = result_json(outcome.context, outcome.runs[0], false);
  EXPECT_EQ(j["speculative"]["drafts"], 40);
}

TEST(ServerMetrics, SweepLevelsEachGetTheirOwnDelta) {
  FakeServerOptions options;
  options.metrics = counters;
  FakeServer server(options);
  BenchConfig config = config_for(server);
  config.sweep = {1, 2};
  std::ostringstream out;
  BenchOutcome outcome = run_benchmark(config, out);
  ASSERT_EQ(outcome.runs.size(), 2u);
  for (const auto& run : outcome.runs) {
    ASSERT_TRUE(run.speculative.stats) << run.speculative.note;
    EXPECT_DOUBLE_EQ(*run.speculative.stats->drafts, 40);
  }
  EXPECT_NE(out.str().find("| Acceptance length |"), std::string::npos) << out.str();
}

TEST(ServerMetrics, RefusedScrapeIsNotReportedAndTheRunCompletes) {
  FakeServerOptions options;
  options.metrics = counters;
  options.metrics_key = "sekrit";  // the bench sends no key
  FakeServer server(options);
  std::ostringstream out;
  BenchOutcome outcome = run_benchmark(config_for(server), out);
  EXPECT_EQ(outcome.runs[0].summary.completed, 4);
  EXPECT_FALSE(outcome.runs[0].speculative.stats);
  EXPECT_EQ(outcome.runs[0].speculative.note, "GET /metrics before the run: answered HTTP 401");
  EXPECT_NE(out.str().find("speculative decoding: not reported by the server"), std::string::npos)
      << out.str();
}

TEST(ServerMetrics, NoMetricsEndpointIsNotReported) {
  FakeServer server;  // GET /metrics is a 404
  std::ostringstream out;
  BenchOutcome outcome = run_benchmark(config_for(server), out);
  EXPECT_EQ(outcome.runs[0].summary.completed, 4);
  EXPECT_FALSE(outcome.runs[0].speculative.stats);
  nlohmann::json j = result_json(outcome.context, outcome.runs[0], false);
  EXPECT_TRUE(j["speculative"].is_null());
  EXPECT_EQ(j["tern"]["speculative_note"], "GET /metrics before the run: answered HTTP 404");
}

TEST(ServerMetrics, CanBeTurnedOff) {
  FakeServerOptions options;
  options.metrics = counters;
  FakeServer server(options);
  BenchConfig config = config_for(server);
  config.server_metrics = false;
  std::ostringstream out;
  BenchOutcome outcome = run_benchmark(config, out);
  EXPECT_FALSE(outcome.runs[0].speculative.stats);
  EXPECT_EQ(outcome.runs[0].speculative.note, "GET /metrics not read: --no-server-metrics");
}

}  // namespace
}  // namespace tern::bench
