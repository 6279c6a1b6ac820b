#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "bench/report.h"
#include "bench/svg_plot.h"

namespace tern::bench {
namespace {

RunReport sample_run(const std::string& label, int c) {
  RunReport r;
  r.label = label, r.max_concurrency = c;
  for (int i = 0; i < 4; ++i) {
    RequestResult q;
    q.success = i != 3, q.usage_reported = true;
    q.reason = q.success ? "" : "timeout", q.error = q.success ? "" : "no complete response within 1 s";
    q.start_s = 0.1 * i, q.ttft_s = 0.05 + 0.01 * i, q.itl_s = {0.02, 0.03}, q.output_len = 3, q.input_len = 8;
    q.latency_s = q.ttft_s + 0.05;
    r.results.push_back(q);
  }
  r.summary = summarize(r.results, Slo{});
  r.overhead.chunk_ms = distribution({0.01, 0.02, 0.03});
  r.overhead.kernel_timestamps = true;
  return r;
}

RunContext sample_context() {
  RunContext ctx;
  ctx.backend = "tern-bench openai-chat", ctx.dataset = "random", ctx.workload = "random, sglang range semantics";
  ctx.request_rate = INFINITY, ctx.random_semantics = "sglang", ctx.tokenizer = "synthetic <test>";
  return ctx;
}

TEST(Report, JsonHasSglangBenchServingFieldNames) {
  nlohmann::json j = result_json(sample_context(), sample_run("C=2", 2), false);
  for (const char* key :
       {"backend", "dataset_name", "request_rate", "max_concurrency", "sharegpt_output_len", "random_input_len",
        "random_output_len", "random_range_ratio", "duration", "completed", "total_input_tokens",
        "total_output_tokens", "request_throughput", "input_throughput", "output_throughput", "total_throughput",
        "mean_e2e_latency_ms", "median_e2e_latency_ms", "std_e2e_latency_ms", "p90_e2e_latency_ms",
        "p99_e2e_latency_ms", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
        "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p95_itl_ms",
        "p99_itl_ms", "concurrency", "max_output_tokens_per_s", "max_concurrent_requests"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["completed"], 3);
  EXPECT_EQ(j["tern"]["failures"]["timeout"]["count"], 1);
  EXPECT_EQ(j["tern"]["random_semantics"], "sglang");
  EXPECT_FALSE(j.contains("ttfts"));
}

TEST(Report, JsonLinesWithDetailsRoundTrip) {
  auto path = (std::filesystem::temp_directory_path() / "tern_bench_roundtrip.jsonl").string();
  std::filesystem::remove(path);
  std::vector<RunReport> runs = {sample_run("C=1", 1), sample_run("C=4", 4)};
  append_json_lines(path, sample_context(), runs, true);
  RunContext ctx;
  auto back = runs_from_json_lines(path, ctx);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].label, "C=4");
  EXPECT_EQ(back[1].max_concurrency, 4);
  EXPECT_EQ(back[0].summary.completed, 3);
  EXPECT_EQ(back[0].summary.failed, 1);
  EXPECT_NEAR(back[0].summary.ttft_ms.mean, runs[0].summary.ttft_ms.mean, 1e-9);
  EXPECT_NEAR(back[0].summary.duration_s, runs[0].summary.duration_s, 1e-9);
  EXPECT_EQ(ctx.random_semantics, "sglang");
  EXPECT_TRUE(std::isinf(ctx.request_rate));
}

TEST(Report, SweepTableHasTheStoryColumns) {
  std::ostringstream out;
  print_sweep_table(out, {sample_run("C=1", 1), sample_run("C=8", 8)});
  std::string text = out.str();
  EXPECT_EQ(text.rfind("| Configuration | Throughput (tok/s) | TPOT (ms) | TTFT (ms) |\n", 0), 0u);
  EXPECT_NE(text.find("| C=8 (1 failed) |"), std::string::npos);
}

TEST(Report, SummaryNamesFailuresSemanticsAndOverhead) {
  std::ostringstream out;
  print_summary(out, sample_context(), sample_run("C=2", 2));
  std::string text = out.str();
  EXPECT_NE(text.find("Failed requests:"), std::string::npos);
  EXPECT_NE(text.find("1 x timeout"), std::string::npos);
  EXPECT_NE(text.find("sglang range semantics"), std::string::npos);
  EXPECT_NE(text.find("kernel SO_TIMESTAMPNS"), std::string::npos);
}

TEST(Report, HtmlIsSelfContained) {
  std::string html = html_report(sample_context(), {sample_run("C=1", 1), sample_run("C=8", 8)});
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("TTFT distribution"), std::string::npos);
  EXPECT_NE(html.find("synthetic &lt;test&gt;"), std::string::npos);  // escaped
  // No script, stylesheet or image is fetched: the only URL is the SVG namespace.
  std::string rest = html;
  for (std::size_t at; (at = rest.find("xmlns='http://www.w3.org/2000/svg'")) != std::string::npos;)
    rest.erase(at, 34);
  EXPECT_EQ(rest.find("http"), std::string::npos);
  EXPECT_EQ(rest.find("<script"), std::string::npos);
}

TEST(SvgPlot, NiceTicks) {
  EXPECT_EQ(nice_ticks(0, 10, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  auto small = nice_ticks(0, 0.9, 4);
  ASSERT_EQ(small.size(), 5u);
  for (std::size_t i = 0; i < small.size(); ++i) EXPECT_NEAR(small[i], 0.2 * i, 1e-12);
  std::string svg = line_plot({"t", "x", "y", true}, {{"s", {1, 8, 64}, {1, 2, 3}, true}});
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

}  // namespace
}  // namespace tern::bench
