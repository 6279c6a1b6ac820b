// Per-request measurements and the summary metrics of serving.md, computed the way sglang's
// bench_serving and vLLM's bench serve compute them (numpy's linear-interpolation percentiles,
// population standard deviation, TPOT only for requests with more than one output token).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tern::bench {

struct RequestResult {
  bool success = false;
  std::string reason;        // failure category ("connect", "http 500", "timeout", ...)
  std::string error;         // the full message
  int input_len = 0;         // the server's usage.prompt_tokens when reported, else the workload's
  int output_len = 0;        // usage.completion_tokens; the request's max_tokens if not reported
  bool usage_reported = false;
  double start_s = 0;        // send time, seconds from the start of the run
  double ttft_s = 0;         // first content chunk minus send time
  double latency_s = 0;      // last byte of the stream minus send time
  std::vector<double> itl_s; // gaps between consecutive content chunks
};

struct Distribution {
  double mean = 0, median = 0, std = 0, p90 = 0, p95 = 0, p99 = 0, max = 0;
  std::size_t count = 0;
};

// numpy.percentile with the default linear interpolation; `sorted` ascending, p in [0, 100].
double percentile(const std::vector<double>& sorted, double p);
Distribution distribution(std::vector<double> values);

struct Slo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};
// Parses "ttft:200,tpot:50" (e2el also accepted); throws tern::Error on anything else.
Slo parse_slo(const std::string& text);

struct ClientOverhead {
  Distribution chunk_ms;     // socket arrival (kernel timestamp) to recorded, per chunk
  bool kernel_timestamps = false;
};

struct Summary {
  int completed = 0, failed = 0;
  std::map<std::string, int> failures;           // reason -> count
  std::map<std::string, std::string> failure_example;  // reason -> one full message
  double duration_s = 0;
  long total_input = 0, total_output = 0;
  double request_throughput = 0, input_throughput = 0, output_throughput = 0, total_throughput = 0;
  Distribution ttft_ms, tpot_ms, itl_ms, e2e_ms;
  double concurrency = 0;                        // sum of E2E latencies / duration
  double max_output_tokens_per_s = 0;            // peak over 1-second buckets of chunk times
  int max_concurrent_requests = 0;
  std::optional<double> goodput;                 // requests/s meeting every SLO
  bool usage_missing = false;                    // some request had no usage: output_len assumed
};

// duration_s: first send to last completion (failed requests included), as serving.md defines it.
Summary summarize(const std::vector<RequestResult>& results, const Slo& slo);
double run_duration(const std::vector<RequestResult>& results);

}  // namespace tern::bench
