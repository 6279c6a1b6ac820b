// Speculative-decoding acceptance as the server reports it at GET /metrics, read once before and once
// after a run, so a benchmark of a speculating server says how much speculation it got (as vllm bench
// serve does). Sources, in the order they are looked for:
//   tern:, vllm:, llamacpp:  cumulative counters spec_decode_num_drafts_total, _num_draft_tokens_total,
//                            _num_accepted_tokens_total, _num_accepted_tokens_per_pos_total{position="i"};
//                            the run's figures are their differences (summed over label sets)
//   sglang:                  gauges spec_accept_length and spec_accept_rate, read after the run; SGLang
//                            computes them over its recent log window, so they are not this run's totals
// The server's metrics are an addition: nothing here fails a benchmark.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/prometheus_text.h"
#include "bench/request.h"

namespace tern::bench {

// One GET /metrics.
struct MetricsScrape {
  bool ok = false;
  std::string error;  // why not ok: "cannot connect: ...", "answered HTTP 404", ...
  PromText text;
};
// GET /metrics at the target's host and port, with its bearer key. Never throws.
MetricsScrape scrape_metrics(const Target& target, double timeout_s);

// One reading of the cumulative counters of one namespace.
struct SpecCounters {
  std::string source;  // "tern", "vllm", "llamacpp"
  double drafts = 0, draft_tokens = 0, accepted_tokens = 0;
  std::map<int, double> accepted_per_position;
};
// The counters of namespace `source` ("tern", ...); nullopt when it has no drafts counter.
std::optional<SpecCounters> read_spec_counters(const PromText& text, const std::string& source);

// What one run reports.
struct SpeculativeStats {
  std::string source;     // "tern", "vllm", "llamacpp" (counter deltas) or "sglang" (gauges)
  bool run_delta = true;  // false: SGLang's recent-window gauges, read after the run
  std::optional<double> drafts, draft_tokens, accepted_tokens;  // verify rounds and tokens in the run
  std::optional<double> acceptance_rate;                        // accepted / draft tokens, 0..1
  std::optional<double> acceptance_length;  // 1 + accepted / drafts: tokens per verify round, bonus included
  std::vector<double> per_position;         // accepted at draft position i / drafts, 0..1
};

struct SpeculativeOutcome {
  std::optional<SpeculativeStats> stats;  // nullopt: not reported by the server
  std::string note;                       // why not, or a remark on the figures
};

// The run's figures from the scrapes before and after it.
SpeculativeOutcome speculative_outcome(const MetricsScrape& before, const MetricsScrape& after);
// Derived figures from counter deltas (drafts 0: rates and length left empty).
SpeculativeStats stats_from_deltas(const SpecCounters& before, const SpecCounters& after);

}  // namespace tern::bench
