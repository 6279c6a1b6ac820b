// A reader of the Prometheus text exposition format (version 0.0.4, what GET /metrics of tern, vLLM,
// SGLang and llama.cpp serve), for the few counters and gauges tern bench reads around a run
// (server_metrics.h). Only samples are kept: comments (# HELP, # TYPE) carry nothing a sum needs.
// src/net/prometheus.h writes this format; nothing there reads it.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tern::bench {

struct PromSample {
  std::string name;                           // e.g. vllm:spec_decode_num_drafts_total
  std::map<std::string, std::string> labels;  // values unescaped (\" \\ \n)
  double value = 0;                           // NaN, +Inf, -Inf allowed
};

struct PromText {
  std::vector<PromSample> samples;
  int skipped_lines = 0;  // lines that are not a valid sample or comment (left out, not fatal)

  // Sum of every sample called `name`, over all its label sets; nullopt when there is none.
  std::optional<double> sum(std::string_view name) const;
  // Sums of the samples called `name` per value of `label` (samples without that label left out).
  std::map<std::string, double> sum_by(std::string_view name, std::string_view label) const;
  // Mean of the samples called `name` over their label sets (gauges of several ranks); nullopt when none.
  std::optional<double> mean(std::string_view name) const;
};

// Never throws: a malformed line is counted in skipped_lines and the rest is read, because a server's
// metrics are an addition to a benchmark and must not stop it.
PromText parse_prometheus_text(std::string_view text);

}  // namespace tern::bench
