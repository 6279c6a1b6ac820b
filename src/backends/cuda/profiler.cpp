// cuda::Profiler over CUPTI's activity API (host code; CUPTI and the CUDA runtime stay inside this file).
//
// CUPTI hands completed activity buffers to buffer_completed() (on its worker thread or inside
// cuptiActivityFlushAll); the records are folded at once into per-name totals and a list of intervals, under
// one mutex. The callbacks are registered once per process and never unregistered: CUPTI is never torn down
// (cuptiFinalize), since tearing it down and re-initialising it has crashed CUDA-graph programs in the past.
#include "backends/cuda/profiler.h"

#include <cuda_runtime.h>
#include <cupti.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_graph_arena.h"
#include "backends/cuda/device_memory.h"
#include "core/env.h"
#include "core/error.h"

namespace tern::cuda {

namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr size_t kRecordAlignment = 8;  // CUPTI's ACTIVITY_RECORD_ALIGNMENT

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

struct Totals {
  int64_t count = 0, total_ns = 0, graph_count = 0;
  int32_t index = 0;  // the owner of this name's spans (ActivitySpan::owner)
};

// What the callbacks fill; one per process.
struct Collector {
  std::mutex mutex;
  std::unordered_map<std::string, Totals> by_name;  // raw (mangled) names
  std::vector<ActivitySpan> intervals;
  // TERN_PROFILE_TRACE: every record's stream and graph node too, written out by collect() (the timeline, for
  // questions the totals cannot answer: which branch a join waited for).
  struct TraceRow {
    uint32_t stream = 0;
    uint64_t node = 0;
  };
  std::vector<TraceRow> trace;  // index-aligned with intervals while `tracing` (write_trace runs before any sort)
  std::string trace_path;       // TERN_PROFILE_TRACE, read at each start()
  bool tracing = false;
  uint64_t first_start = std::numeric_limits<uint64_t>::max(), last_end = 0;
  int64_t dropped = 0, bad_timestamps = 0;
  bool out_of_memory = false;

  void clear() {
    by_name.clear();
    intervals.clear();
    trace.clear();
    first_start = std::numeric_limits<uint64_t>::max();
    last_end = 0;
    dropped = bad_timestamps = 0;
    out_of_memory = false;
  }
  void add(const char* name, uint64_t start, uint64_t end, bool from_graph, uint32_t stream = 0, uint64_t node = 0) {
    if (start == 0 || end < start) {
      ++bad_timestamps;
      return;
    }
    auto [it, fresh] = by_name.try_emplace(name);
    Totals& t = it->second;
    if (fresh) t.index = static_cast<int32_t>(by_name.size() - 1);
    ++t.count;
    t.total_ns += static_cast<int64_t>(end - start);
    if (from_graph) ++t.graph_count;
    intervals.push_back(ActivitySpan{start, end, t.index});
    if (tracing) trace.push_back(TraceRow{stream, node});
    first_start = std::min(first_start, start);
    last_end = std::max(last_end, end);
  }
};

Collector& collector() {
  static Collector c;
  return c;
}

std::atomic<const Profiler*> g_owner{nullptr};

const char* memcpy_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[memcpy HtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[memcpy DtoH]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[memcpy DtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "[memcpy HtoH]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "[memcpy PtoP]";
    default: return "[memcpy other]";
  }
}

void add_record(Collector& c, const CUpti_Activity* r) {
  switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
      c.add(k->name != nullptr ? k->name : "[unnamed kernel]", k->start, k->end, k->graphId != 0, k->streamId,
            k->graphNodeId);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      c.add(memcpy_name(m->copyKind), m->start, m->end, m->graphId != 0, m->streamId, m->graphNodeId);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      c.add("[memset]", m->start, m->end, m->graphId != 0, m->streamId, m->graphNodeId);
      break;
    }
    default: break;  // other kinds are not enabled
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kRecordAlignment, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;  // 0: CUPTI drops records (counted as dropped)
  *max_records = 0;                              // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  Collector& c = collector();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    try {
      CUpti_Activity* record = nullptr;
      while (buffer != nullptr && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS)
        add_record(c, record);
    } catch (...) {  // no exception may cross into CUPTI (std::bad_alloc from the maps)
      c.out_of_memory = true;
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS)
      c.dropped += static_cast<int64_t>(dropped);
  }
  std::free(buffer);
}

void check_cupti(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  if (cuptiGetResultString(r, &text) != CUPTI_SUCCESS || text == nullptr) text = "unknown CUPTI error";
  const char* hint = "";
  switch (r) {
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
      hint = ": another tool holds CUPTI (nsys, ncu, compute-sanitizer or a second profiler); run without it";
      break;
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES:
      hint = ": this user may not trace the GPU (driver setting NVreg_RestrictProfilingToAdminUsers)";
      break;
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_NOT_SUPPORTED:
    case CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_CONFIDENTIAL_COMPUTING_NOT_SUPPORTED:
      hint = ": CUPTI cannot trace this device or environment (virtualised GPU, MIG slice, sandboxed runtime)";
      break;
    case CUPTI_ERROR_NOT_INITIALIZED:
    case CUPTI_ERROR_NOT_COMPATIBLE:
      hint = ": libcupti does not match the CUDA driver (use the CUPTI of the toolkit the driver supports)";
      break;
    default: break;
  }
  fail("cuda::Profiler: ", what, " failed: ", text, hint);
}

void check_runtime(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("cuda::Profiler: ", what, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

// Registers the buffer callbacks once per process; throws (every time) if that failed.
void register_callbacks() {
  static const CUptiResult result = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  check_cupti(result, "cuptiActivityRegisterCallbacks");
}

// Executable graphs hold clones of the captured graph's nodes, and CUPTI's records of a replay name the clones,
// where trace_graph_edges wrote the captured graph's edges (session 33: the first traced replay matched no edge).
// With TERN_PROFILE_TRACE set, a resource callback keeps each clone's original node id (cudaGraphInstantiate
// reports every clone), and write_trace writes the original for each record. Another CUPTI subscriber (ncu,
// nsys) makes the subscription fail: the trace then keeps the clones' ids and trace-chain says it finds no edge.
struct CloneMap {
  std::mutex mutex;
  std::unordered_map<uint64_t, uint64_t> original;  // clone id -> captured node id
};
CloneMap& clone_map() {
  static CloneMap m;
  return m;
}

void CUPTIAPI on_resource(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* cbdata) {
  if (domain != CUPTI_CB_DOMAIN_RESOURCE || cbid != CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED || cbdata == nullptr) return;
  const auto* resource = static_cast<const CUpti_ResourceData*>(cbdata);
  const auto* graph = static_cast<const CUpti_GraphData*>(resource->resourceDescriptor);
  if (graph == nullptr || graph->node == nullptr || graph->originalNode == nullptr) return;
  uint64_t clone = 0, original = 0;
  if (cuptiGetGraphNodeId(graph->node, &clone) != CUPTI_SUCCESS ||
      cuptiGetGraphNodeId(graph->originalNode, &original) != CUPTI_SUCCESS)
    return;
  CloneMap& m = clone_map();
  std::lock_guard<std::mutex> lock(m.mutex);
  try {
    m.original[clone] = original;
  } catch (...) {  // no exception may cross into CUPTI; a lost entry leaves that record's clone id in the trace
  }
}

// Subscribes on_resource once per process, at the first profiler made while a trace is asked for
// (TERN_PROFILE_TRACE); never unsubscribed (as the activity callbacks).
void track_graph_clones() {
  static std::mutex mutex;
  static bool subscribed = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (subscribed || env_string("TERN_PROFILE_TRACE").value_or("").empty()) return;
  CUpti_SubscriberHandle subscriber = nullptr;
  if (cuptiSubscribe(&subscriber, on_resource, nullptr) != CUPTI_SUCCESS) return;
  subscribed = true;
  (void)cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED);
}

void disable_all() {
  for (CUpti_ActivityKind k : kKinds) cuptiActivityDisable(k);
}

// With TERN_PROFILE_TRACE=FILE, each session's records are appended to FILE as tab-separated lines (kernel,
// start and end in ns from the session's first start, stream id, graph node id: the captured graph's node, whose
// id the "# graph" edges name; see CloneMap), after a "# session" line, in the order of their starts.
void write_trace(const Collector& c) {
  if (!c.tracing || c.intervals.empty()) return;
  const std::string& path = c.trace_path;
  std::vector<std::string> names(c.by_name.size());
  for (const auto& [name, t] : c.by_name) names[static_cast<size_t>(t.index)] = kernel_display_name(demangle(name.c_str()));
  std::vector<size_t> order(c.intervals.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return c.intervals[a].start < c.intervals[b].start; });
  std::ofstream f(path, std::ios::app);
  TERN_CHECK(f.good(), "cuda::Profiler: cannot append to TERN_PROFILE_TRACE=", path);
  const uint64_t t0 = c.first_start;
  CloneMap& clones = clone_map();
  std::lock_guard<std::mutex> lock(clones.mutex);
  // The captured graph's node id of a record's node (the clone's own where no clone was reported).
  const auto original_node = [&](uint64_t node) {
    const auto it = node != 0 ? clones.original.find(node) : clones.original.end();
    return it != clones.original.end() ? it->second : node;
  };
  f << "# session: " << order.size() << " records (kernel, start ns, end ns, stream, graph node)\n";
  for (size_t i : order) {
    const ActivitySpan& a = c.intervals[i];
    f << names[static_cast<size_t>(a.owner)] << '\t' << (a.start - t0) << '\t' << (a.end - t0) << '\t'
      << c.trace[i].stream << '\t' << original_node(c.trace[i].node) << '\n';
  }
  f.flush();
  TERN_CHECK(f.good(), "cuda::Profiler: writing TERN_PROFILE_TRACE=", path, " failed (the trace is incomplete)");
}

// The graph's edges by CUPTI node id (trace_graph_edges), each with its type (0: full, 1: programmatic, the PDL
// edges of captured launches). The edge data must be asked for: without it a graph with programmatic edges answers
// cudaErrorLossyQuery (session 31's first form failed so on the GPU).
void write_graph_edges(cudaGraph_t graph, std::ofstream& f) {
  size_t n = 0;
  check_runtime(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n), "cudaGraphGetEdges (count)");
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (n > 0) check_runtime(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n), "cudaGraphGetEdges");
  std::vector<uint64_t> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    check_cupti(cuptiGetGraphNodeId(from[i], &a[i]), "cuptiGetGraphNodeId");
    check_cupti(cuptiGetGraphNodeId(to[i], &b[i]), "cuptiGetGraphNodeId");
  }
  f << "# graph: " << n << " edges (from graph node, to graph node, type)\n";
  for (size_t i = 0; i < n; ++i) f << "edge\t" << a[i] << '\t' << b[i] << '\t' << static_cast<int>(data[i].type) << '\n';
}

ProfileRecords collect(Collector& c) {
  std::lock_guard<std::mutex> lock(c.mutex);
  TERN_CHECK(!c.out_of_memory, "cuda::Profiler: out of host memory while collecting activity records");
  ProfileRecords out;
  write_trace(c);
  const std::vector<int64_t> exposed = expose(c.intervals, c.by_name.size());
  for (const auto& [name, t] : c.by_name)
    out.kernels.push_back(KernelTime{demangle(name.c_str()), t.count, t.total_ns, t.graph_count,
                                     exposed[static_cast<size_t>(t.index)]});
  std::sort(out.kernels.begin(), out.kernels.end(),
            [](const KernelTime& a, const KernelTime& b) { return a.total_ns > b.total_ns; });
  std::sort(c.intervals.begin(), c.intervals.end(),
            [](const ActivitySpan& a, const ActivitySpan& b) { return a.start < b.start; });
  uint64_t busy = 0, open_start = 0, open_end = 0;
  bool open = false;
  for (const ActivitySpan& a : c.intervals) {
    if (open && a.start <= open_end) {
      open_end = std::max(open_end, a.end);
      continue;
    }
    if (open) busy += open_end - open_start;
    open = true;
    open_start = a.start;
    open_end = a.end;
  }
  if (open) busy += open_end - open_start;
  out.busy_ns = static_cast<int64_t>(busy);
  out.span_ns = c.last_end > c.first_start ? static_cast<int64_t>(c.last_end - c.first_start) : 0;
  out.dropped = c.dropped;
  out.bad_timestamps = c.bad_timestamps;
  c.clear();
  return out;
}

}  // namespace

void trace_graph_edges(CUgraph_st* graph) {
  if (graph == nullptr) return;
  const std::string path = env_string("TERN_PROFILE_TRACE").value_or("");
  if (path.empty()) return;
  std::ofstream f(path, std::ios::app);
  TERN_CHECK(f.good(), "cuda::Profiler: cannot append to TERN_PROFILE_TRACE=", path);
  // A failure to read the edges is written into the trace (trace-chain shows it) rather than failing the capture:
  // the trace is an aid, the graph is the work.
  try {
    write_graph_edges(graph, f);
  } catch (const std::exception& e) {
    cudaGetLastError();
    f << "# graph: edges unavailable: " << e.what() << '\n';
  }
  f.flush();
  TERN_CHECK(f.good(), "cuda::Profiler: writing TERN_PROFILE_TRACE=", path, " failed (the trace is incomplete)");
}

Profiler::Profiler() {
  TERN_CHECK(device_available(), "cuda::Profiler: no usable CUDA device (", device_description(), ")");
  uint32_t version = 0;
  check_cupti(cuptiGetVersion(&version), "cuptiGetVersion (is libcupti loadable?)");
  register_callbacks();
  track_graph_clones();
  set_graph_captured_hook(&trace_graph_edges);
}

Profiler::~Profiler() {
  if (!running_) return;
  try {
    stop();
  } catch (...) {  // a destructor never throws: the records are simply lost
    disable_all();
    g_owner.store(nullptr);
  }
}

void Profiler::start() {
  TERN_CHECK(!running_, "cuda::Profiler::start: already recording");
  const Profiler* expected = nullptr;
  TERN_CHECK(g_owner.compare_exchange_strong(expected, this),
             "cuda::Profiler::start: another Profiler is recording (CUPTI's activity state is process-wide)");
  try {
    check_runtime(cudaDeviceSynchronize(), "cudaDeviceSynchronize before recording");
    // Anything CUPTI still holds from before (nothing is enabled between sessions) is dropped with the clear;
    // a failure here only means there was nothing to flush.
    (void)cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    {
      Collector& c = collector();
      std::lock_guard<std::mutex> lock(c.mutex);
      c.clear();
      c.trace_path = env_string("TERN_PROFILE_TRACE").value_or("");
      c.tracing = !c.trace_path.empty();
    }
    for (CUpti_ActivityKind k : kKinds) check_cupti(cuptiActivityEnable(k), "cuptiActivityEnable");
  } catch (...) {
    disable_all();
    g_owner.store(nullptr);
    throw;
  }
  records_ = ProfileRecords{};
  running_ = true;
}

void Profiler::stop() {
  TERN_CHECK(running_, "cuda::Profiler::stop: not recording (call start() first)");
  running_ = false;
  const cudaError_t sync = cudaDeviceSynchronize();  // every recorded activity has finished
  disable_all();
  const CUptiResult flush = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  g_owner.store(nullptr);
  check_runtime(sync, "cudaDeviceSynchronize before collecting");
  check_cupti(flush, "cuptiActivityFlushAll");
  records_ = collect(collector());
}

}  // namespace tern::cuda
