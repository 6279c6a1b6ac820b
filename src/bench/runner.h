// A whole `tern bench` invocation: workload, warm-up, one run or a concurrency sweep, reports.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "bench/arrivals.h"
#include "bench/report.h"
#include "bench/request.h"
#include "bench/workload.h"

namespace tern::bench {

struct BenchConfig {
  Target target;
  std::string base_url;
  WorkloadSpec workload;
  ArrivalSpec arrivals;
  int max_concurrency = 0;
  std::vector<int> sweep;          // --sweep-concurrency: one run per level
  int warmup_requests = 1;
  Slo slo;
  std::string tokenizer;           // tokenizer.json; empty: synthetic vocabulary
  std::string output_file;         // JSON lines (sglang's --output-file)
  bool output_details = false;
  std::string html_file;
  bool progress = true;
  bool tag_requests = false;
  bool server_metrics = true;      // read GET /metrics around each run (speculative decoding)
};

struct BenchOutcome {
  RunContext context;
  std::vector<RunReport> runs;
};

// Runs the benchmark, printing summaries (and the sweep table) to `out` and progress to stderr. Without
// a model name it asks the server (discover_model); that failing throws tern::Error.
BenchOutcome run_benchmark(const BenchConfig& config, std::ostream& out);
// One run of a prepared workload (used by run_benchmark and by tests).
RunReport run_once(const BenchConfig& config, const std::vector<RequestSpec>& requests, int max_concurrency,
                   const std::string& label);
// Writes the reports a config asks for (JSON lines, HTML).
void write_reports(const BenchConfig& config, const BenchOutcome& outcome);

}  // namespace tern::bench
