// Speculative-decoding acceptance from the server's /metrics: counter deltas and the figures derived
// from them (vLLM's definitions), which namespace is read, the "not reported" cases, and how the text,
// JSON and HTML reports show both.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "bench/report.h"
#include "bench/speculative.h"

namespace tern::bench {
namespace {

// /metrics as tern serve writes it (net/prometheus.cpp's shape): HELP, TYPE, one label set a series.
std::string tern_metrics(double drafts, double draft_tokens, double accepted, std::vector<double> per_pos) {
  std::string out =
      "# HELP tern:spec_decode_num_drafts_total Verify rounds.\n# TYPE tern:spec_decode_num_drafts_total "
      "counter\n"
      "tern:spec_decode_num_drafts_total{model_name=\"tern-tiny-v4\"} " +
      std::to_string(drafts) + "\n" +
      "tern:spec_decode_num_draft_tokens_total{model_name=\"tern-tiny-v4\"} " + std::to_string(draft_tokens) +
      "\n" + "tern:spec_decode_num_accepted_tokens_total{model_name=\"tern-tiny-v4\"} " +
      std::to_string(accepted) + "\n" + "# TYPE tern:spec_decode_num_accepted_tokens_per_pos_total counter\n";
  for (std::size_t i = 0; i < per_pos.size(); ++i)
    out += "tern:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"tern-tiny-v4\",position=\"" +
           std::to_string(i) + "\"} " + std::to_string(per_pos[i]) + "\n";
  return out + "tern:http_connections{model_name=\"tern-tiny-v4\"} 3\n";
}

MetricsScrape scrape_of(const std::string& text) {
  return {true, "", parse_prometheus_text(text)};
}
MetricsScrape failed_scrape(const std::string& why) {
  return {false, why, {}};
}

TEST(BenchSpeculative, DeltasAndDerivedFigures) {
  SpecCounters before{"tern", 100, 300, 150, {{0, 80}, {1, 50}, {2, 20}}};
  SpecCounters after{"tern", 1100, 3300, 2150, {{0, 980}, {1, 750}, {2, 420}}};
  SpeculativeStats s = stats_from_deltas(before, after);
  EXPECT_EQ(s.source, "tern");
  EXPECT_TRUE(s.run_delta);
  EXPECT_DOUBLE_EQ(*s.drafts, 1000);
  EXPECT_DOUBLE_EQ(*s.draft_tokens, 3000);
  EXPECT_DOUBLE_EQ(*s.accepted_tokens, 2000);
  EXPECT_DOUBLE_EQ(*s.acceptance_rate, 2000.0 / 3000);  // accepted / draft tokens
  EXPECT_DOUBLE_EQ(*s.acceptance_length, 3.0);          // 1 + accepted / drafts
  ASSERT_EQ(s.per_position.size(), 3u);                 // accepted at i / drafts
  EXPECT_DOUBLE_EQ(s.per_position[0], 0.9);
  EXPECT_DOUBLE_EQ(s.per_position[1], 0.7);
  EXPECT_DOUBLE_EQ(s.per_position[2], 0.4);
}

TEST(BenchSpeculative, OutcomeFromTwoScrapes) {
  SpeculativeOutcome o = speculative_outcome(scrape_of(tern_metrics(10, 30, 12, {8, 4, 0})),
                                             scrape_of(tern_metrics(60, 180, 87, {48, 29, 10, 0})));
  ASSERT_TRUE(o.stats) << o.note;
  EXPECT_EQ(o.note, "");
  EXPECT_DOUBLE_EQ(*o.stats->drafts, 50);
  EXPECT_DOUBLE_EQ(*o.stats->acceptance_rate, 75.0 / 150);
  EXPECT_DOUBLE_EQ(*o.stats->acceptance_length, 1 + 75.0 / 50);
  // A position first seen after the run counts from 0.
  EXPECT_EQ(o.stats->per_position, (std::vector<double>{40.0 / 50, 25.0 / 50, 10.0 / 50, 0}));
}

TEST(BenchSpeculative, CountersAbsentBeforeTheRunStartAtZero) {
  SpeculativeOutcome o =
      speculative_outcome(scrape_of("tern:http_connections 1\n"), scrape_of(tern_metrics(4, 8, 6, {4, 2})));
  ASSERT_TRUE(o.stats);
  EXPECT_DOUBLE_EQ(*o.stats->acceptance_length, 2.5);
  EXPECT_EQ(o.stats->per_position, (std::vector<double>{1.0, 0.5}));
}

TEST(BenchSpeculative, ReadsVllmAndLlamaCppCountersAndPrefersTern) {
  std::string vllm =
      "vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m\"} 2.0e1\n"
      "vllm:spec_decode_num_drafts_total{engine=\"1\",model_name=\"m\"} 20.0\n"
      "vllm:spec_decode_num_drafts_created{engine=\"0\",model_name=\"m\"} 1.7e9\n"
      "vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"m\"} 120.0\n"
      "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"m\"} 60.0\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"m\",position=\"0\"} "
      "36.0\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"1\",model_name=\"m\",position=\"0\"} 4.0\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"m\",position=\"1\"} "
      "20.0\n";
  SpeculativeOutcome o = speculative_outcome(scrape_of(""), scrape_of(vllm));
  ASSERT_TRUE(o.stats);
  EXPECT_EQ(o.stats->source, "vllm");
  EXPECT_DOUBLE_EQ(*o.stats->drafts, 40);  // both engines
  EXPECT_EQ(o.stats->per_position, (std::vector<double>{1.0, 0.5}));

  std::string llama =
      "llamacpp:spec_decode_num_drafts_total 10\nllamacpp:spec_decode_num_draft_tokens_total 30\n"
      "llamacpp:spec_decode_num_accepted_tokens_total 15\n";
  o = speculative_outcome(scrape_of(""), scrape_of(llama));
  ASSERT_TRUE(o.stats);
  EXPECT_EQ(o.stats->source, "llamacpp");
  EXPECT_DOUBLE_EQ(*o.stats->acceptance_length, 2.5);
  EXPECT_TRUE(o.stats->per_position.empty());

  o = speculative_outcome(scrape_of(""), scrape_of(vllm + tern_metrics(1, 2, 1, {1})));
  EXPECT_EQ(o.stats->source, "tern");
}

TEST(BenchSpeculative, SglangGaugesAreReportedAsGauges) {
  std::string sglang =
      "# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.\n"
      "# TYPE sglang:spec_accept_length gauge\n"
      "sglang:spec_accept_length{model_name=\"m\",tp_rank=\"0\"} 3.2\n"
      "sglang:spec_accept_rate{model_name=\"m\",tp_rank=\"0\"} 0.55\n";
  SpeculativeOutcome o = speculative_outcome(scrape_of(""), scrape_of(sglang));
  ASSERT_TRUE(o.stats);
  EXPECT_EQ(o.stats->source, "sglang");
  EXPECT_FALSE(o.stats->run_delta);
  EXPECT_DOUBLE_EQ(*o.stats->acceptance_length, 3.2);
  EXPECT_DOUBLE_EQ(*o.stats->acceptance_rate, 0.55);
  EXPECT_FALSE(o.stats->drafts);
  EXPECT_NE(o.note.find("not this run's totals"), std::string::npos);

  o = speculative_outcome(scrape_of(""), scrape_of("sglang:spec_accept_length{model_name=\"m\"} 0.0\n"));
  EXPECT_FALSE(o.stats);  // SGLang sets it to 0 when it does not speculate
}

TEST(BenchSpeculative, NotReportedCases) {
  MetricsScrape good = scrape_of(tern_metrics(1, 2, 1, {1}));
  SpeculativeOutcome o = speculative_outcome(failed_scrape("cannot connect: Connection refused"), good);
  EXPECT_FALSE(o.stats);
  EXPECT_EQ(o.note, "GET /metrics before the run: cannot connect: Connection refused");
  o = speculative_outcome(good, failed_scrape("answered HTTP 404"));
  EXPECT_FALSE(o.stats);
  EXPECT_EQ(o.note, "GET /metrics after the run: answered HTTP 404");
  o = speculative_outcome(scrape_of("tern:http_connections 1\n"), scrape_of("tern:http_connections 2\n"));
  EXPECT_FALSE(o.stats);
  EXPECT_NE(o.note.find("no spec_decode_num_drafts_total counter"), std::string::npos) << o.note;
  o = speculative_outcome(scrape_of(tern_metrics(10, 20, 10, {})), scrape_of(tern_metrics(2, 4, 2, {})));
  EXPECT_FALSE(o.stats);
  EXPECT_NE(o.note.find("went down"), std::string::npos);
}

TEST(BenchSpeculative, ZeroDraftsIsReportedWithoutRates) {
  SpeculativeOutcome o =
      speculative_outcome(scrape_of(tern_metrics(5, 10, 5, {5})), scrape_of(tern_metrics(5, 10, 5, {5})));
  ASSERT_TRUE(o.stats);
  EXPECT_DOUBLE_EQ(*o.stats->drafts, 0);
  EXPECT_FALSE(o.stats->acceptance_rate);
  EXPECT_FALSE(o.stats->acceptance_length);
  EXPECT_TRUE(o.stats->per_position.empty());
  EXPECT_NE(o.note.find("no drafts"), std::string::npos);
}

// One summary line as report_text.cpp lays it out: name left in 40 columns, value right in 12.
std::string row(std::string name, const std::string& value) {
  name.resize(40, ' ');
  return name + " " + std::string(12 - value.size(), ' ') + value + "\n";
}

RunReport run_with(SpeculativeOutcome spec, const std::string& label = "C=1") {
  RunReport r;
  r.label = label, r.max_concurrency = 1;
  RequestResult q;
  q.success = true, q.usage_reported = true, q.ttft_s = 0.05, q.latency_s = 0.1, q.output_len = 3,
  q.input_len = 8;
  q.itl_s = {0.02, 0.03};
  r.results = {q};
  r.summary = summarize(r.results, Slo{});
  r.speculative = std::move(spec);
  return r;
}

SpeculativeOutcome reported() {
  return {
      stats_from_deltas({"tern", 0, 0, 0, {}}, {"tern", 1000, 3000, 2000, {{0, 900}, {1, 700}, {2, 400}}}),
      ""};
}

RunContext context() {
  RunContext ctx;
  ctx.backend = "tern-bench openai-chat", ctx.workload = "random", ctx.tokenizer = "synthetic";
  return ctx;
}

TEST(BenchSpeculative, TextReportHasVllmsBlock) {
  std::ostringstream out;
  print_summary(out, context(), run_with(reported()));
  std::string text = out.str();
  EXPECT_NE(text.find("-----Speculative Decoding-----"), std::string::npos) << text;
  EXPECT_NE(text.find(row("Acceptance rate (%):", "66.67")), std::string::npos) << text;
  EXPECT_NE(text.find(row("Acceptance length:", "3.00")), std::string::npos) << text;
  EXPECT_NE(text.find(row("Drafts:", "1000")), std::string::npos) << text;
  EXPECT_NE(text.find(row("Draft tokens:", "3000")), std::string::npos) << text;
  EXPECT_NE(text.find(row("Accepted tokens:", "2000")), std::string::npos) << text;
  EXPECT_NE(text.find("Per-position acceptance (%):\n  Position 0:"), std::string::npos) << text;
  EXPECT_NE(text.find(row("  Position 2:", "40.00")), std::string::npos) << text;
  EXPECT_NE(text.find("tern: counters, run delta"), std::string::npos) << text;
  EXPECT_EQ(text.find("not reported"), std::string::npos);
}

TEST(BenchSpeculative, TextReportSaysNotReported) {
  std::ostringstream out;
  print_summary(out, context(), run_with({std::nullopt, "GET /metrics after the run: answered HTTP 404"}));
  std::string text = out.str();
  EXPECT_NE(
      text.find("speculative decoding: not reported by the server (GET /metrics after the run: answered "
                "HTTP 404)\n"),
      std::string::npos)
      << text;
  EXPECT_EQ(text.find("Speculative Decoding"), std::string::npos);
}

TEST(BenchSpeculative, SweepTableGainsAcceptanceLengthOnlyWhenReported) {
  std::ostringstream with, without;
  print_sweep_table(with, {run_with(reported(), "C=1"), run_with({}, "C=2")});
  EXPECT_EQ(with.str().rfind(
                "| Configuration | Throughput (tok/s) | TPOT (ms) | TTFT (ms) | Acceptance length |\n", 0),
            0u);
  EXPECT_NE(with.str().find(" 3.00 |\n| C=2 |"), std::string::npos) << with.str();
  EXPECT_NE(with.str().find(" - |\n"), std::string::npos) << with.str();
  print_sweep_table(without, {run_with({}, "C=1")});
  EXPECT_EQ(without.str().rfind("| Configuration | Throughput (tok/s) | TPOT (ms) | TTFT (ms) |\n", 0), 0u);
}

TEST(BenchSpeculative, JsonObjectOrNullAndRoundTrip) {
  nlohmann::json j = result_json(context(), run_with(reported()), false);
  ASSERT_TRUE(j["speculative"].is_object());
  const auto& s = j["speculative"];
  EXPECT_EQ(s["source"], "tern");
  EXPECT_EQ(s["run_delta"], true);
  EXPECT_EQ(s["drafts"], 1000);
  EXPECT_EQ(s["draft_tokens"], 3000);
  EXPECT_EQ(s["accepted_tokens"], 2000);
  EXPECT_DOUBLE_EQ(s["acceptance_rate"].get<double>(), 2.0 / 3);
  EXPECT_DOUBLE_EQ(s["acceptance_length"].get<double>(), 3.0);
  EXPECT_EQ(s["per_position_acceptance_rate"].size(), 3u);
  EXPECT_TRUE(j.contains("mean_ttft_ms"));  // the sglang keys stay where they were

  nlohmann::json none = result_json(context(), run_with({std::nullopt, "no counters"}), false);
  EXPECT_TRUE(none.contains("speculative"));
  EXPECT_TRUE(none["speculative"].is_null());
  EXPECT_EQ(none["tern"]["speculative_note"], "no counters");

  auto path = (std::filesystem::temp_directory_path() / "tern_bench_spec_roundtrip.jsonl").string();
  std::filesystem::remove(path);
  append_json_lines(path, context(), {run_with(reported()), run_with({std::nullopt, "no counters"}, "C=2")},
                    true);
  RunContext ctx;
  auto back = runs_from_json_lines(path, ctx);
  ASSERT_EQ(back.size(), 2u);
  ASSERT_TRUE(back[0].speculative.stats);
  EXPECT_DOUBLE_EQ(*back[0].speculative.stats->acceptance_length, 3.0);
  EXPECT_EQ(back[0].speculative.stats->per_position, reported().stats->per_position);
  EXPECT_FALSE(back[1].speculative.stats);
  EXPECT_EQ(back[1].speculative.note, "no counters");
}

TEST(BenchSpeculative, HtmlTableOrNote) {
  std::string html =
      html_report(context(), {run_with(reported(), "C=1"), run_with({std::nullopt, "x"}, "C=2")});
  EXPECT_NE(html.find("<h2>Speculative decoding</h2>"), std::string::npos);
  EXPECT_NE(html.find("<th>Position 2 (%)</th></tr>"), std::string::npos);
  EXPECT_NE(html.find("<tr><td>C=1</td><td>66.67</td><td>3.00</td><td>1000</td><td>3000</td><td>2000</td>"
                      "<td>90.0</td><td>70.0</td><td>40.0</td></tr>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<tr><td>C=2</td><td colspan='8'>not reported (x)</td></tr>"), std::string::npos);
  std::string none = html_report(context(), {run_with({std::nullopt, "no counters"})});
  EXPECT_EQ(none.find("<h2>Speculative decoding</h2>"), std::string::npos);
  EXPECT_NE(none.find("Speculative decoding: not reported by the server (no counters).</p>"),
            std::string::npos);
}

}  // namespace
}  // namespace tern::bench
