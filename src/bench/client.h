// The load generator: one Asio event loop on the calling thread drives every request of a run
// (thousands of concurrent streams), one HTTP/1.1 connection per request as sglang and vLLM do.
//
// Timing: each chunk's arrival is the kernel's receive timestamp of the socket read that carried it
// (SO_TIMESTAMPNS), so a busy event loop delays the recording but not the measurement; the
// difference (client overhead) is measured per content chunk and reported.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include "bench/request.h"
#include "bench/stats.h"
#include "bench/workload.h"

namespace tern::bench {

struct Progress {
  int total = 0, done = 0, failed = 0, in_flight = 0;
  long content_chunks = 0;
  double elapsed_s = 0;
};

struct RunOutput {
  std::vector<RequestResult> results;   // in workload order
  std::vector<float> overhead_ms;       // one sample per content chunk
  bool kernel_timestamps = false;       // false: overhead measured from the read's completion
  std::chrono::steady_clock::time_point t0;  // the run's start: start_s is relative to it
};

struct RunOptions {
  std::vector<double> offsets;          // send offsets (s) per request; empty: all at once
  int max_concurrency = 0;              // 0: unlimited
  double progress_interval_s = 0.2;
  std::function<void(const Progress&)> on_progress;  // called on the loop thread
  bool tag_requests = false;            // send "user": "tern-bench-<index>" (tests match on it)
};

// Runs every request to completion, failure or timeout; never throws for a request's failure.
RunOutput run_requests(const Target& target, const std::vector<RequestSpec>& requests, const RunOptions& options);

}  // namespace tern::bench
