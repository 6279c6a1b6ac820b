// Reports of a benchmark: terminal summary and sweep table, sglang-compatible JSON lines, and a
// self-contained HTML page with SVG plots.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "bench/speculative.h"
#include "bench/stats.h"

namespace tern::bench {

// What was run, printed with every result.
struct RunContext {
  std::string backend;         // e.g. "tern-bench openai-chat"
  std::string base_url;
  std::string model;
  std::string dataset;         // dataset name as sglang spells it (random, sharegpt, ...)
  std::string workload;        // describe(WorkloadSpec): includes the random range semantics
  std::string tokenizer;       // which codec built the prompts
  std::string random_semantics;
  int random_input_len = 0, random_output_len = 0, sharegpt_output_len = 0;
  double random_range_ratio = 0;
  double request_rate = 0;     // inf allowed
  double burstiness = 1;
  int num_prompts = 0, warmup_requests = 0;
  std::uint64_t seed = 0;
};

struct RunReport {
  std::string label;           // "C=8" in a sweep
  int max_concurrency = 0;     // 0: unlimited
  Summary summary;
  ClientOverhead overhead;
  SpeculativeOutcome speculative;  // the server's acceptance figures over this run (GET /metrics)
  std::vector<RequestResult> results;
};

void print_summary(std::ostream& out, const RunContext& ctx, const RunReport& run);
// | Configuration | Throughput (tok/s) | TPOT (ms) | TTFT (ms) | (output throughput, mean TPOT, mean TTFT)
void print_sweep_table(std::ostream& out, const std::vector<RunReport>& runs);

// One result object with sglang bench_serving's field names (plus tern's additions under "tern").
nlohmann::json result_json(const RunContext& ctx, const RunReport& run, bool details);
// Appends one JSON line per run, as sglang does with --output-file.
void append_json_lines(const std::string& path, const RunContext& ctx, const std::vector<RunReport>& runs,
                       bool details);

std::string html_report(const RunContext& ctx, const std::vector<RunReport>& runs);
// Rebuilds runs from JSON lines written with details (tern bench --report-from).
std::vector<RunReport> runs_from_json_lines(const std::string& path, RunContext& ctx);

}  // namespace tern::bench
