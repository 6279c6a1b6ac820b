// The Prometheus text reader on exposition text as servers write it: HELP/TYPE comments, several
// label sets, escaped label values, exponent floats, NaN/Inf, timestamps, and lines it must skip.
#include <gtest/gtest.h>

#include <cmath>

#include "bench/prometheus_text.h"

namespace tern::bench {
namespace {

// vLLM 0.10-style output (prometheus_client): counters with _total and _created, two engines, a
// model name with an escaped quote and backslash, a histogram, exponent floats.
constexpr const char* kVllm = R"(# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="org/m \"q\" a\\b"} 6393.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="org/m \"q\" a\\b"} 1.607e+03
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="org/m \"q\" a\\b"} 1.7337e+09
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 5333.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4661.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 1.2e3
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 7E+2
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 12.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 3.0457592010498047e-01
)";

TEST(PrometheusText, SumsACounterOverLabelSets) {
  PromText t = parse_prometheus_text(kVllm);
  EXPECT_EQ(t.skipped_lines, 0);
  ASSERT_TRUE(t.sum("vllm:spec_decode_num_drafts_total"));
  EXPECT_DOUBLE_EQ(*t.sum("vllm:spec_decode_num_drafts_total"), 6393 + 1607);
  EXPECT_DOUBLE_EQ(*t.sum("vllm:spec_decode_num_drafts_created"), 1.7337e9);  // its own name, not summed in
  EXPECT_FALSE(t.sum("vllm:spec_decode_num_drafts"));
  EXPECT_DOUBLE_EQ(*t.sum("vllm:time_to_first_token_seconds_sum"), 0.30457592010498047);
}

TEST(PrometheusText, SumsPerValueOfOneLabel) {
  PromText t = parse_prometheus_text(kVllm);
  auto per_pos = t.sum_by("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position");
  ASSERT_EQ(per_pos.size(), 2u);
  EXPECT_DOUBLE_EQ(per_pos["0"], 5333 + 1200);
  EXPECT_DOUBLE_EQ(per_pos["1"], 4661 + 700);
  EXPECT_TRUE(t.sum_by("vllm:spec_decode_num_drafts_total", "position").empty());
  EXPECT_EQ(t.sum_by("vllm:time_to_first_token_seconds_bucket", "le").count("+Inf"), 1u);
}

TEST(PrometheusText, UnescapesLabelValues) {
  PromText t = parse_prometheus_text(kVllm);
  ASSERT_FALSE(t.samples.empty());
  EXPECT_EQ(t.samples[0].labels.at("model_name"), "org/m \"q\" a\\b");
  EXPECT_EQ(t.samples[0].labels.at("engine"), "0");
  PromText nl = parse_prometheus_text("m{a=\"x\\ny\",b=\"}{,=\"} 1\n");
  ASSERT_EQ(nl.samples.size(), 1u);
  EXPECT_EQ(nl.samples[0].labels.at("a"), "x\ny");
  EXPECT_EQ(nl.samples[0].labels.at("b"), "}{,=");  // braces and commas inside quotes are text
}

TEST(PrometheusText, SpecialValuesTimestampsAndSpacing) {
  PromText t = parse_prometheus_text(
      "a NaN\nb +Inf\nc -Inf\nd 1.5e-3 1712345678901\n  e{x=\"1\",} 2\r\nf{} 3\ng { x = \"1\" } -4.25\n"
      "tern:x_total{model_name=\"tern-tiny-v4\"} 7\n");
  EXPECT_EQ(t.skipped_lines, 0);
  EXPECT_TRUE(std::isnan(*t.sum("a")));
  EXPECT_TRUE(std::isinf(*t.sum("b")) && *t.sum("b") > 0);
  EXPECT_TRUE(std::isinf(*t.sum("c")) && *t.sum("c") < 0);
  EXPECT_DOUBLE_EQ(*t.sum("d"), 1.5e-3);
  EXPECT_DOUBLE_EQ(*t.sum("e"), 2);  // leading spaces, trailing comma, CRLF
  EXPECT_DOUBLE_EQ(*t.sum("f"), 3);
  EXPECT_DOUBLE_EQ(*t.sum("g"), -4.25);
  EXPECT_DOUBLE_EQ(*t.sum("tern:x_total"), 7);
}

TEST(PrometheusText, SkipsMalformedLinesAndKeepsTheRest) {
  PromText t = parse_prometheus_text(
      "good 1\n"
      "no_value\n"
      "bad{x=\"unterminated} 2\n"
      "bad2{x=1} 3\n"
      "bad3 abc\n"
      "bad4 1 2 3\n"
      "bad5{x=\"1\"}4\n"
      "9starts_with_digit 5\n"
      "# a comment with {braces} 6\n"
      "\n"
      "good 2\n");
  EXPECT_EQ(t.skipped_lines, 7);
  EXPECT_DOUBLE_EQ(*t.sum("good"), 3);
  EXPECT_EQ(t.samples.size(), 2u);
}

TEST(PrometheusText, MeanOverLabelSets) {
  PromText t = parse_prometheus_text(
      "sglang:spec_accept_length{model_name=\"m\",tp_rank=\"0\"} 3.0\n"
      "sglang:spec_accept_length{model_name=\"m\",tp_rank=\"1\"} 2.0\n");
  EXPECT_DOUBLE_EQ(*t.mean("sglang:spec_accept_length"), 2.5);
  EXPECT_FALSE(t.mean("sglang:spec_accept_rate"));
}

TEST(PrometheusText, EmptyTextHasNoSamples) {
  PromText t = parse_prometheus_text("");
  EXPECT_TRUE(t.samples.empty());
  EXPECT_EQ(t.skipped_lines, 0);
  EXPECT_FALSE(t.sum("anything"));
}

}  // namespace
}  // namespace tern::bench
