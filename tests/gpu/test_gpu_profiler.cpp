// The built-in profiler on the GPU: known kernels (ops::linear with bf16 weights -> the dense product's kernels,
// whichever the backend picks for 4 tokens: linear_x8 and its x rounding since session 14, linear_bulk before; each
// runs once a product; ops::rms_norm over 8192 columns -> rms_norm_block_kernel) run eagerly and from
// CUDA graphs must each appear with the exact count, the right category and graph attribution, and the
// profiler's times must agree with CUDA-event timing of the same work (its GPU span inside the events'
// interval, its busy time most of it, each linear at least as long as streaming its weight at twice the HBM
// peak would take).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/profile_report.h"
#include "backends/cuda/profiler.h"
#include "backends/cuda/timing.h"
#include "core/error.h"
#include "gpu_test_util.h"
#include "ops/linear.h"
#include "ops/norm.h"

namespace tern::gputest {
namespace {

#define CHECK_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

constexpr int64_t kOut = 8192, kIn = 4096, kT = 4;
// 64 MiB of bf16 weights (more than L2): nothing on an H200 streams them faster than 20 TB/s (four times its
// HBM peak, L2 hits included), so a shorter linear means the timestamps are wrong.
constexpr double kWeightBytes = 2.0 * kOut * kIn;
constexpr double kMinLinearNs = kWeightBytes / 20e12 * 1e9;

// One linear and one norm over fixed device buffers (no allocation, so it can be captured in a graph).
struct Work {
  HostWeight host;
  cuda::WeightStore store;
  ops::Weight w;
  cuda::DeviceTensor x, y, norm_w, z;
  explicit Work(Rand& r)
      : host(random_weight(ops::WeightFormat::bf16, kOut, kIn, r, 0.02f, "profiled.w")),
        w(store.upload(host.w)),
        x(upload(random_f32({kT, kIn}, r))),
        y(DType::f32, {kT, kOut}),
        norm_w(upload(random_f32({kOut}, r))),
        z(DType::f32, {kT, kOut}) {}
  void issue() {
    ops::linear(cuda::context(), x, w, y);
    ops::rms_norm(cuda::context(), y, norm_w, 1e-6f, z);
  }
};

struct Seen {
  int64_t count = 0, total_ns = 0, graph_count = 0;
  std::vector<std::string> names;  // display names
};

// Every record whose base name is `base`, summed.
Seen find(const cuda::ProfileRecords& r, const std::string& base) {
  Seen s;
  for (const cuda::KernelTime& k : r.kernels) {
    if (cuda::kernel_base_name(k.name) != base) continue;
    s.count += k.count;
    s.total_ns += k.total_ns;
    s.graph_count += k.graph_count;
    s.names.push_back(cuda::kernel_display_name(k.name));
  }
  return s;
}

// Records of every kind, or of kernels only (copy records are named "[memcpy ...]", "[memset]").
int64_t total_count(const cuda::ProfileRecords& r, bool kernels_only = false) {
  int64_t n = 0;
  for (const cuda::KernelTime& k : r.kernels)
    if (!kernels_only || k.name.rfind("[", 0) != 0) n += k.count;
  return n;
}

std::string listing(const cuda::ProfileRecords& r) {
  std::string s;
  for (const cuda::KernelTime& k : r.kernels)
    s += "  " + cuda::kernel_display_name(k.name) + " x" + std::to_string(k.count) + " (" + std::to_string(k.total_ns) +
         " ns, " + std::to_string(k.graph_count) + " from graphs)\n";
  return s;
}

// The records of `calls` (linear, norm) pairs: counts, names, categories, graph attribution. Copies are
// allowed only where the driver may add its own (a graph's first launch uploads it).
// The dense product's kernels: those of category dense_gemm (names and counts summed per kernel).
int dense_kinds(const cuda::ProfileRecords& r) {
  int n = 0;
  for (const cuda::KernelTime& k : r.kernels) n += cuda::categorize_kernel(k.name) == cuda::OpCategory::dense_gemm;
  return n;
}

void expect_pairs(const cuda::ProfileRecords& r, int64_t calls, bool from_graph, bool allow_copies = false) {
  const Seen norm = find(r, "rms_norm_block_kernel");
  EXPECT_EQ(norm.count, calls) << listing(r);
  EXPECT_EQ(norm.graph_count, from_graph ? calls : 0) << listing(r);
  const int kinds = dense_kinds(r);
  ASSERT_GE(kinds, 1) << "no dense product kernel:\n" << listing(r);
  int64_t dense_ns = 0;
  bool product = false;  // one of them is the product proper (the WeightFormat table names it right)
  for (const cuda::KernelTime& k : r.kernels) {
    const cuda::OpCategory c = cuda::categorize_kernel(k.name);
    if (c == cuda::OpCategory::dense_gemm) {
      EXPECT_EQ(k.count, calls) << listing(r);  // every kernel of the product runs once a product
      EXPECT_EQ(k.graph_count, from_graph ? calls : 0) << listing(r);
      dense_ns += k.total_ns;
      const std::string name = cuda::kernel_display_name(k.name);
      product |= name.rfind("linear_bulk_kernel<bf16, ", 0) == 0 || name.rfind("linear_x8_kernel<", 0) == 0;
    } else if (k.name.rfind("[", 0) == 0) {
      EXPECT_EQ(c, cuda::OpCategory::memcpy);
    } else {
      EXPECT_EQ(cuda::kernel_base_name(k.name), "rms_norm_block_kernel") << listing(r);
      EXPECT_EQ(c, cuda::OpCategory::mhc_norm_rope);
    }
  }
  EXPECT_TRUE(product) << listing(r);
  EXPECT_EQ(total_count(r, allow_copies), (kinds + 1) * calls) << "only these kernels ran:\n" << listing(r);
  EXPECT_GE(static_cast<double>(dense_ns) / static_cast<double>(calls), kMinLinearNs)
      << "a 64 MiB linear cannot take less: the timestamps are wrong";
  EXPECT_EQ(r.dropped, 0);
  EXPECT_EQ(r.bad_timestamps, 0);
}

// Profiler figures against the CUDA events recorded around the same work in the same session: the GPU span
// lies inside the events' interval (small slack for the two clocks) and nothing overlaps on one stream (busy =
// summed kernel time: true with programmatic dependent launch off only, as with it a kernel's record starts
// when its blocks start waiting for the previous kernel, so the callers turn it off). How busy the GPU is inside the events' interval is printed, not asserted: the idle
// part is host launch time and CUPTI's own work, which depend on the machine (on the H200 host of
// 2026-12-03 the eager run was 24% busy, the first graph replays 42%).
void expect_consistent(const cuda::ProfileRecords& r, double event_ns) {
  int64_t sum = 0, exposed = 0;
  for (const cuda::KernelTime& k : r.kernels) {
    sum += k.total_ns;
    exposed += k.exposed_ns;
  }
  EXPECT_EQ(exposed, r.busy_ns);  // one stream: the exposed times add up to the busy time (profile_report.h)
  const double busy = static_cast<double>(r.busy_ns), span = static_cast<double>(r.span_ns);
  std::printf("[profiler] events %.1f us, span %.1f us, busy %.1f us, summed %.1f us\n", event_ns / 1e3, span / 1e3,
              busy / 1e3, static_cast<double>(sum) / 1e3);
  EXPECT_GT(busy, 0.0);
  EXPECT_LE(busy, span);
  EXPECT_NEAR(busy, static_cast<double>(sum), 0.01 * static_cast<double>(sum) + 1e3);
  EXPECT_LE(span, event_ns * 1.02 + 20e3);
}

class Events {
 public:
  Events() {
    cudaEventCreate(&a_);
    cudaEventCreate(&b_);
  }
  ~Events() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  void begin(cudaStream_t s) { cudaEventRecord(a_, s); }
  void end(cudaStream_t s) { cudaEventRecord(b_, s); }
  double ns() {
    cudaEventSynchronize(b_);
    float ms = 0;
    cudaEventElapsedTime(&ms, a_, b_);
    return ms * 1e6;
  }

 private:
  cudaEvent_t a_ = nullptr, b_ = nullptr;
};

// `count` x work.issue() captured into one graph on `stream` (the backend issues on it while capturing); the
// captured graph goes to cuda::trace_graph_edges first where `trace_edges` (as CudaStepGraphs' hook does).
cudaGraphExec_t capture(Work& work, int count, cudaStream_t stream, bool trace_edges = false) {
  cuda::CudaBackend& backend = cuda::register_backend();
  void* const previous = backend.stream();
  backend.set_stream(stream);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < count; ++i) work.issue();
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  backend.set_stream(previous);
  if (end != cudaSuccess) fail("graph capture failed: ", cudaGetErrorString(end));
  if (trace_edges) cuda::trace_graph_edges(graph);
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) fail("graph instantiate failed");
  cudaGraphDestroy(graph);
  return exec;
}

// A TERN_PROFILE_TRACE line's tab-separated fields.
std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> cols;
  for (size_t at = 0;;) {
    const size_t tab = line.find('\t', at);
    cols.push_back(line.substr(at, tab == std::string::npos ? std::string::npos : tab - at));
    if (tab == std::string::npos) return cols;
    at = tab + 1;
  }
}

// A first session, so that CUPTI's one-time costs (first enable, first records of a context) do not open a
// gap at the start of the measured one.
void warm_up(cuda::Profiler& p, Work& work) {
  p.start();
  work.issue();
  p.stop();
}

TEST(GpuProfiler, EagerKernelsCountedAndTimed) {
  TERN_REQUIRE_GPU();
  PdlGuard serial(false);  // expect_consistent wants kernels that do not overlap (see there)
  Rand r(fresh_seed());
  Work work(r);
  work.issue();  // sizes the workspace; nothing allocates from here on
  cuda::register_backend().synchronize();
  auto stream = static_cast<cudaStream_t>(cuda::register_backend().stream());
  constexpr int kCalls = 50;

  cuda::Profiler p;
  warm_up(p, work);
  Events ev;
  p.start();
  ev.begin(stream);
  for (int i = 0; i < kCalls; ++i) work.issue();
  ev.end(stream);
  p.stop();
  const double event_ns = ev.ns();
  const cuda::ProfileRecords& rec = p.records();
  expect_pairs(rec, kCalls, /*from_graph=*/false);
  // Eager: the host's launches (op checks included) leave gaps; the GPU is still busy for most of it.
  expect_consistent(rec, event_ns);

  // The same pairs timed with CUDA events alone (no profiler): per pair within a loose factor.
  const cuda::Timing t = cuda::time_device([&] { work.issue(); }, 3, 30);
  int64_t sum = 0;
  for (const cuda::KernelTime& k : rec.kernels) sum += k.total_ns;
  const double profiled_us = static_cast<double>(sum) / kCalls / 1e3;
  std::printf("[profiler] per pair: profiler %.1f us of kernels, CUDA events (no profiler) %.1f us\n", profiled_us,
              t.median_us);
  EXPECT_LE(profiled_us, 1.5 * t.median_us + 5.0);
  EXPECT_GE(profiled_us, 0.4 * t.median_us);

  const cuda::ProfileReport rep = cuda::categorize(rec);
  EXPECT_EQ(rep.categories[static_cast<int>(cuda::OpCategory::dense_gemm)].count, kCalls * dense_kinds(rec));
  EXPECT_EQ(rep.categories[static_cast<int>(cuda::OpCategory::mhc_norm_rope)].count, kCalls);
  const std::string table = cuda::format_report(rep, kCalls, 5, "pair");
  std::printf("%s", table.c_str());
  EXPECT_TRUE(table.find("| linear_bulk_kernel<bf16, ") != std::string::npos ||
              table.find("| linear_x8_kernel<") != std::string::npos) << table;
  EXPECT_NE(table.find("| rms_norm_block_kernel | mhc/norm/rope |"), std::string::npos) << table;
}

// TERN_PROFILE_TRACE: each session's records appended to the file after a "# session" line, in the order of their
// starts, times from the session's first start (what scripts/trace-joins reads); unset, nothing is written.
TEST(GpuProfiler, TraceFileHoldsEachSessionsRecords) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  Work work(r);
  work.issue();
  cuda::register_backend().synchronize();
  cuda::Profiler p;
  warm_up(p, work);
  const std::string path = ::testing::TempDir() + "tern_profile_trace_" + std::to_string(fresh_seed()) + ".tsv";
  std::remove(path.c_str());
  ASSERT_EQ(setenv("TERN_PROFILE_TRACE", path.c_str(), 1), 0);
  constexpr int kCalls = 3;
  for (int session = 0; session < 2; ++session) {
    p.start();
    for (int i = 0; i < kCalls; ++i) work.issue();
    p.stop();
  }
  unsetenv("TERN_PROFILE_TRACE");
  p.start();  // not traced: the file keeps two sessions
  work.issue();
  p.stop();
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  int sessions = 0, rows = 0;
  int64_t last_start = -1;
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("# session", 0) == 0) {
      ++sessions;
      last_start = -1;
      continue;
    }
    ++rows;
    const std::vector<std::string> cols = split_tabs(line);
    ASSERT_EQ(cols.size(), 5u) << line;
    const int64_t start = std::stoll(cols[1]), end = std::stoll(cols[2]);
    EXPECT_GE(start, last_start) << "rows in the order of their starts: " << line;
    EXPECT_GE(end, start) << line;
    EXPECT_GE(start, 0) << line;
    last_start = start;
  }
  EXPECT_EQ(sessions, 2);
  EXPECT_GE(rows, 2 * 2 * kCalls) << "at least two kernels a call (the linear, the norm) in each traced session";
  std::remove(path.c_str());
}

// A traced replay's records name the captured graph's nodes, the ids its "# graph" edges use (scripts/trace-chain
// follows them): the executable graph runs clones of those nodes, under other CUPTI ids (session 33's first traced
// bench-step matched none of its 1 632 nodes to an edge).
TEST(GpuProfiler, TracedReplayNamesTheEdgesNodes) {
  TERN_REQUIRE_GPU();
  PdlGuard serial(false);  // plain full edges between the captured kernels
  Rand r(fresh_seed());
  Work work(r);
  work.issue();
  cuda::register_backend().synchronize();
  const std::string path = ::testing::TempDir() + "tern_profile_edges_" + std::to_string(fresh_seed()) + ".tsv";
  std::remove(path.c_str());
  ASSERT_EQ(setenv("TERN_PROFILE_TRACE", path.c_str(), 1), 0);
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    cuda::Profiler p;  // made before the capture, as bench-step's and the server's (the clones are reported then)
    constexpr int kPerGraph = 3;
    cudaGraphExec_t exec = capture(work, kPerGraph, stream, /*trace_edges=*/true);
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    p.start();
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    p.stop();
    cudaGraphExecDestroy(exec);
  }
  unsetenv("TERN_PROFILE_TRACE");
  cudaStreamDestroy(stream);
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  std::set<std::string> endpoints, nodes;
  int edges = 0;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    const std::vector<std::string> cols = split_tabs(line);
    if (cols[0] == "edge") {
      ASSERT_EQ(cols.size(), 4u) << line;
      ++edges;
      endpoints.insert(cols[1]);
      endpoints.insert(cols[2]);
    } else if (cols.size() == 5 && cols[4] != "0") {
      nodes.insert(cols[4]);
    }
  }
  std::remove(path.c_str());
  ASSERT_GE(edges, 1) << "the captured graph's edges were not written";
  ASSERT_GE(nodes.size(), 2u) << "the replay's records carry no graph node";
  for (const std::string& n : nodes) EXPECT_EQ(endpoints.count(n), 1u) << "record node " << n << " is on no edge";
}

TEST(GpuProfiler, GraphReplaysCountedPerKernelNode) {
  TERN_REQUIRE_GPU();
  PdlGuard serial(false);  // expect_consistent wants kernels that do not overlap (see there)
  Rand r(fresh_seed());
  Work work(r);
  work.issue();
  cuda::register_backend().synchronize();
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr int kPerGraph = 3, kReplays = 10;
  // Captured and instantiated before the profiler exists (as a server captures its buckets at startup).
  cudaGraphExec_t exec = capture(work, kPerGraph, stream);
  CHECK_CUDA(cudaGraphLaunch(exec, stream));  // upload the graph outside the session
  CHECK_CUDA(cudaStreamSynchronize(stream));

  cuda::Profiler p;
  warm_up(p, work);
  Events ev;
  p.start();
  ev.begin(stream);
  for (int i = 0; i < kReplays; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
  ev.end(stream);
  p.stop();
  expect_pairs(p.records(), kPerGraph * kReplays, /*from_graph=*/true);
  // Replays leave only the graph launches' gaps.
  expect_consistent(p.records(), ev.ns());

  // Per pair, against time_graph's CUDA-event figure for the same pair (without the profiler).
  const cuda::Timing t = cuda::time_graph([&](int) { work.issue(); }, kPerGraph, 10);
  int64_t sum = 0;
  for (const cuda::KernelTime& k : p.records().kernels) sum += k.total_ns;
  const double profiled_us = static_cast<double>(sum) / (kPerGraph * kReplays) / 1e3;
  std::printf("[profiler] graph, per pair: profiler %.1f us, CUDA events %.1f us\n", profiled_us, t.median_us);
  EXPECT_LE(profiled_us, 1.3 * t.median_us + 2.0);
  EXPECT_GE(profiled_us, 0.5 * t.median_us);

  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
}

TEST(GpuProfiler, GraphCapturedInsideTheSession) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  Work work(r);
  work.issue();
  cuda::register_backend().synchronize();
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr int kPerGraph = 2, kReplays = 4;
  cuda::Profiler p;
  p.start();
  cudaGraphExec_t exec = capture(work, kPerGraph, stream);  // capturing runs nothing
  for (int i = 0; i < kReplays; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
  p.stop();
  expect_pairs(p.records(), kPerGraph * kReplays, /*from_graph=*/true, /*allow_copies=*/true);
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
}

TEST(GpuProfiler, CopiesSessionsAndMisuse) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  Work work(r);
  work.issue();
  cuda::register_backend().synchronize();
  cuda::Profiler p;
  EXPECT_THROW(p.stop(), Error);  // not recording

  // A copy up and a memset are recorded as such.
  Tensor host = random_f32({1024}, r);
  cuda::DeviceTensor dev(DType::f32, {1024});
  p.start();
  EXPECT_THROW(p.start(), Error);  // already recording
  cuda::Profiler other;
  EXPECT_THROW(other.start(), Error);  // one profiler at a time
  cuda::copy_to_device(host, dev);
  cuda::fill_bytes(dev, 0);
  p.stop();
  const cuda::ProfileRecords& rec = p.records();
  const Seen up = find(rec, "[memcpy HtoD]"), set = find(rec, "[memset]");
  EXPECT_GE(up.count, 1) << listing(rec);  // a pageable copy may be staged in pieces
  EXPECT_EQ(set.count, 1) << listing(rec);
  EXPECT_EQ(total_count(rec), up.count + set.count) << "no kernel ran:\n" << listing(rec);
  EXPECT_EQ(cuda::categorize_kernel("[memcpy HtoD]"), cuda::OpCategory::memcpy);

  // Each session starts empty.
  p.start();
  work.issue();
  p.stop();
  expect_pairs(p.records(), 1, false);
  p.start();
  work.issue();
  work.issue();
  p.stop();
  expect_pairs(p.records(), 2, false);

  // After p's session another profiler may record; a destroyed running profiler releases CUPTI.
  {
    cuda::Profiler q;
    q.start();
    work.issue();
  }
  other.start();
  work.issue();
  other.stop();
  expect_pairs(other.records(), 1, false);
}

}  // namespace
}  // namespace tern::gputest
