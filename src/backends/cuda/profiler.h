// The built-in GPU profiler, with no CUDA or CUPTI header (tools and tests include this): CUPTI's activity
// API records every kernel, memcpy and memset that runs on the device between start() and stop(), with GPU
// timestamps. Kernels replayed from CUDA graphs are recorded one per kernel node per replay (the profiler
// enables CONCURRENT_KERNEL and never GRAPH_TRACE, which would fold a replay into one record), whether the
// graph was captured before start() or inside the session.
//
//   cuda::Profiler p;          // throws tern::Error saying why when CUPTI cannot be used
//   p.start();                 // waits for the device, then records
//   ... work ...
//   p.stop();                  // waits for the device, stops recording, flushes CUPTI's buffers
//   std::cout << cuda::format_report(cuda::categorize(p.records()), steps);   // profile_report.h
//
// One profiler records at a time per process (CUPTI's activity state is process-wide); start() on a second
// one while the first runs throws. Overhead: CUPTI adds host time to each launch and writes one record
// (about 200 bytes) per kernel into 8 MiB buffers, which the profiler folds into per-kernel totals as they
// fill; it keeps 24 bytes per record for the busy-time union and each kernel's exposed time (expose()), 16 more
// with TERN_PROFILE_TRACE (the timeline written out, docs/cuda-backend.md "Profiler").
// docs/cuda-backend.md ("Profiler") has more.
#pragma once

#include "backends/cuda/profile_report.h"

struct CUgraph_st;  // cudaGraph_t, without the CUDA headers

namespace tern::cuda {

// With TERN_PROFILE_TRACE=FILE: appends the dependencies of a captured graph to FILE, a "# graph" line and one
// "edge<TAB>from<TAB>to" line a dependency, the nodes by CUPTI's graph node ids (the records' node column), so that
// scripts/trace-chain can follow a replayed step's critical path: a replay's kernels come on many CUPTI streams, not
// one a branch (session 31). Every Profiler hands it to CudaStepGraphs (set_graph_captured_hook), which calls it for
// each graph captured after the Profiler was made, before instantiating it; without the variable it does nothing.
void trace_graph_edges(CUgraph_st* graph);

class Profiler {
 public:
  Profiler();
  ~Profiler();  // stops a running session; never throws
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Synchronises the device (work issued before start() is not recorded), clears the previous records and
  // starts recording. Throws if this or another Profiler is already recording, or CUPTI refuses.
  void start();
  // Synchronises the device, stops recording and collects the records (CUPTI buffers flushed). Throws when
  // not recording or when the device reports an error.
  void stop();
  bool running() const { return running_; }
  // The last session's results (empty before the first stop()).
  const ProfileRecords& records() const { return records_; }

 private:
  bool running_ = false;
  ProfileRecords records_;
};

}  // namespace tern::cuda
