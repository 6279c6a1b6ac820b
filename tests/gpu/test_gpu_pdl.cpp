// Programmatic dependent launch (kernels/launch.cuh) on the GPU. With PDL a kernel may start while the one
// before it is finishing; only its grid_dependency_wait() keeps it from reading what that kernel has not
// written yet, or from overwriting what it still reads. So each test runs work in which every kernel reads
// what the kernel just before it wrote (and one overwrites a buffer the kernel before it reads) with PDL off
// (the reference), with PDL on, and replayed from CUDA graphs captured with PDL on and off, over repetitions
// whose inputs alternate and whose outputs and intermediates are poisoned first (NaN, expert index -1): a
// kernel that read too early would see poison or the previous repetition's values. Every output must be the
// reference's bits, and the graph captured with PDL on must link its kernels by programmatic edges.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/kernels/linear.cuh"
#include "backends/cuda/kernels/pdl.cuh"
#include "core/error.h"
#include "gpu_test_util.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "shapes.h"

namespace tern::gputest {
namespace {

#define CHECK_CUDA(call) \
  ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

using ops::WeightFormat;

// Work over fixed device buffers (nothing allocates in issue(), so it can be captured): before each run every
// input is set to one of its host variants and every output poisoned.
struct Work {
  struct Input {
    const cuda::DeviceTensor* dev;
    std::vector<Tensor> variants;
  };
  std::vector<Input> inputs;
  std::vector<std::pair<std::string, const cuda::DeviceTensor*>> outputs;
  std::function<void()> issue;
  int variants() const { return inputs.empty() ? 1 : static_cast<int>(inputs[0].variants.size()); }
};

constexpr int kRepetitions = 6;

void set_inputs(const Work& w, int v) {
  for (const Work::Input& in : w.inputs) cuda::copy_to_device(in.variants[v], *in.dev);
  for (const auto& [name, dev] : w.outputs) cuda::fill_bytes(*dev, 0xff);
  cuda::register_backend().synchronize();  // the memsets, before work on another stream
}

std::vector<Tensor> get_outputs(const Work& w) {
  std::vector<Tensor> out;
  for (const auto& [name, dev] : w.outputs) out.push_back(cuda::to_host(*dev));
  return out;
}

// Eagerly on the backend's stream.
std::vector<Tensor> run_eager(const Work& w, int v) {
  set_inputs(w, v);
  w.issue();
  cuda::register_backend().synchronize();
  return get_outputs(w);
}

// EXPECTs every output equal to the reference, byte for byte.
void expect_same_bits(const Work& w, const std::vector<Tensor>& got, const std::vector<Tensor>& ref,
                      const std::string& what) {
  for (size_t i = 0; i < ref.size(); ++i) {
    const size_t words = ref[i].nbytes() / 4;
    int64_t differ = 0;
    for (size_t j = 0; j < words; ++j)
      differ += std::memcmp(got[i].data<char>() + 4 * j, ref[i].data<char>() + 4 * j, 4) != 0;
    EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << words << " words of " << w.outputs[i].first
                         << " differ from the run with PDL off";
  }
}

// A graph of the work captured on `stream`, and how its kernels are linked.
struct Captured {
  cudaGraphExec_t exec = nullptr;
  int kernel_edges = 0, programmatic_edges = 0;
  ~Captured() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
};

void capture(const Work& w, cudaStream_t stream, Captured& out) {
  cuda::CudaBackend& be = cuda::register_backend();
  void* const previous = be.stream();
  be.set_stream(stream);
  cudaGraph_t graph = nullptr;
  const cudaError_t begin = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (begin != cudaSuccess) be.set_stream(previous);
  CHECK_CUDA(begin);
  try {
    w.issue();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    be.set_stream(previous);
    throw;
  }
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  be.set_stream(previous);
  CHECK_CUDA(end);
  size_t n = 0;
  CHECK_CUDA(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (n > 0) CHECK_CUDA(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n));
  for (size_t i = 0; i < n; ++i) {
    cudaGraphNodeType a{}, b{};
    CHECK_CUDA(cudaGraphNodeGetType(from[i], &a));
    CHECK_CUDA(cudaGraphNodeGetType(to[i], &b));
    out.kernel_edges += a == cudaGraphNodeTypeKernel && b == cudaGraphNodeTypeKernel;
    out.programmatic_edges += data[i].type == cudaGraphDependencyTypeProgrammatic;
  }
  CHECK_CUDA(cudaGraphInstantiate(&out.exec, graph, 0));
  cudaGraphDestroy(graph);
}

void replay(const Work& w, const Captured& g, cudaStream_t stream, int v, std::vector<Tensor>& out) {
  set_inputs(w, v);
  CHECK_CUDA(cudaGraphLaunch(g.exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  out = get_outputs(w);
}

// The whole check: PDL off eagerly (the reference, every float output written and finite), PDL on eagerly,
// and graphs captured with PDL on (every kernel-to-kernel edge programmatic) and off (none), replayed.
void check_pdl(const Work& w, const std::string& what) {
  std::vector<std::vector<Tensor>> ref;
  {
    PdlGuard off(false);
    for (int v = 0; v < w.variants(); ++v) ref.push_back(run_eager(w, v));
  }
  for (size_t i = 0; i < w.outputs.size(); ++i) {
    if (ref[0][i].dtype() != DType::f32) continue;
    int64_t bad = 0;
    for (int64_t j = 0; j < ref[0][i].numel(); ++j) bad += !std::isfinite(ref[0][i].data<float>()[j]);
    ASSERT_EQ(bad, 0) << what << ": the reference's " << w.outputs[i].first
                      << " is not all written and finite";
  }
  {
    PdlGuard on(true);
    for (int rep = 0; rep < kRepetitions; ++rep) {
      const int v = rep % w.variants();
      expect_same_bits(w, run_eager(w, v), ref[v], cat(what, ", PDL on, eager, repetition ", rep));
    }
  }
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (bool pdl : {true, false}) {
    Captured g;
    {
      PdlGuard guard(pdl);
      capture(w, stream, g);
    }
    if (::testing::Test::HasFatalFailure()) break;
    std::printf("[pdl] %s, graph captured with PDL %s: %d kernel-to-kernel edges, %d programmatic\n",
                what.c_str(), pdl ? "on" : "off", g.kernel_edges, g.programmatic_edges);
    EXPECT_GT(g.kernel_edges, 0) << what;
    EXPECT_EQ(g.programmatic_edges, pdl ? g.kernel_edges : 0) << what << ", PDL " << (pdl ? "on" : "off");
    // The attribute lives in the graph: replays do not look at the switch (flip it to show it).
    PdlGuard flipped(!pdl);
    for (int rep = 0; rep < kRepetitions; ++rep) {
      const int v = rep % w.variants();
      std::vector<Tensor> got;
      replay(w, g, stream, v, got);
      if (::testing::Test::HasFatalFailure()) break;
      expect_same_bits(w, got, ref[v],
                       cat(what, ", graph captured with PDL ", pdl ? "on" : "off", ", replay ", rep));
    }
  }
  cudaStreamDestroy(stream);
  cuda::register_backend().check_device_errors();
}

// A device copy of a random weight of format f, [out, in], values of std 1 / sqrt(in).
ops::Weight device_weight(cuda::WeightStore& store, WeightFormat f, int64_t out, int64_t in, Rand& r,
                          const char* name) {
  return store.upload(random_weight(f, out, in, r, 1.0f / std::sqrt(static_cast<float>(in)), name).w);
}

// A long product whose output is the next product's x (each of its blocks writes its outputs last, so a
// consumer reading early sees poison), then an add that overwrites that x while the product before it may
// still read it: y = A x (fp8 [16384, 4096], 64 MiB), z = B y (fp8 [4096, 16384]), y += d.
TEST(GpuPdl, LinearAfterALongKernelReadsItsFinishedOutput) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  constexpr int64_t kBig = 16384, kIn = 4096;
  cuda::WeightStore store;
  const ops::Weight a = device_weight(store, WeightFormat::fp8_block, kBig, kIn, r, "long.a");
  const ops::Weight b = device_weight(store, WeightFormat::fp8_block, kIn, kBig, r, "long.b");
  for (int64_t T : {1, 16, 64}) {
    const cuda::DeviceTensor x(DType::f32, {T, kIn}), d(DType::f32, {T, kBig}), y(DType::f32, {T, kBig}),
        z(DType::f32, {T, kIn});
    Work w;
    w.inputs = {{&x, {random_f32({T, kIn}, r), random_f32({T, kIn}, r)}},
                {&d, {random_f32({T, kBig}, r), random_f32({T, kBig}, r)}}};
    w.outputs = {{"y (after y += d)", &y}, {"z", &z}};
    w.issue = [&] {
      ops::linear(cuda::context(), x, a, y);
      ops::linear(cuda::context(), y, b, z);
      ops::add(cuda::context(), d, y);
    };
    check_pdl(w, cat("long product then its consumer, T=", T));
  }
}

// A decode-like chain at V4-Flash widths in which every kernel consumes the previous one's output: the norm,
// FP8 / MXFP4 / bf16 products on the streaming and bulk kernels (weights copied before the wait; from 9
// tokens x windows made by their own kernel), an add into a buffer the product before it reads, the exact
// router product and routing (data-dependent picks), the routed experts (plan, up, down, combine).
TEST(GpuPdl, DecodeChainSameBitsOnOffAndInGraphs) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  const Shapes& s = kV4Flash;
  const int64_t D = s.D, Q = 8192, E = 8, k = s.experts_per_token, C = 1024;
  cuda::WeightStore store;
  const ops::Weight wq = device_weight(store, WeightFormat::fp8_block, Q, D, r, "chain.wq");
  const ops::Weight wo = device_weight(store, WeightFormat::fp8_block, D, Q, r, "chain.wo");
  const ops::Weight we = device_weight(store, WeightFormat::mxfp4, D, D, r, "chain.we");
  ops::Weight wg = device_weight(store, WeightFormat::fp8_block, E, D, r, "chain.gate");
  wg.exact = true;
  const ops::Weight wc = device_weight(store, WeightFormat::bf16, C, D, r, "chain.wc");
  const RandomExperts experts(WeightFormat::mxfp4, E, D, s.inter, r);
  const cuda::DeviceTensor norm_w = upload(random_f32({D}, r)), bias = upload(random_f32({E}, r, 0.1f));
  for (int64_t T : {1, 16, 64}) {
    const cuda::DeviceTensor x(DType::f32, {T, D}), add_q(DType::f32, {T, Q}), h(DType::f32, {T, D}),
        q(DType::f32, {T, Q}), o(DType::f32, {T, D}), e(DType::f32, {T, D}), g(DType::f32, {T, E}),
        idx(DType::i32, {T, k}), wts(DType::f32, {T, k}), m(DType::f32, {T, D}), c(DType::f32, {T, C});
    Work w;
    w.inputs = {{&x, {random_f32({T, D}, r), random_f32({T, D}, r)}},
                {&add_q, {random_f32({T, Q}, r), random_f32({T, Q}, r)}}};
    w.outputs = {{"h = rms_norm(x)", &h},
                 {"q = wq h, then q += add_q", &q},
                 {"o = wo q", &o},
                 {"e = we o (mxfp4)", &e},
                 {"g = gate e (exact)", &g},
                 {"routed indices", &idx},
                 {"routed weights", &wts},
                 {"m = experts(e)", &m},
                 {"c = wc m (bf16)", &c}};
    w.issue = [&] {
      ops::rms_norm(cuda::context(), x, norm_w, 1e-6f, h);
      ops::linear(cuda::context(), h, wq, q);
      ops::linear(cuda::context(), q, wo, o);
      ops::add(cuda::context(), add_q, q);
      ops::linear(cuda::context(), o, we, e);
      ops::linear(cuda::context(), e, wg, g);
      ops::route_scored(cuda::context(), g, bias, 1.5f, idx, wts);
      ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{e, idx, wts, experts.on_device, 10.0f, m});
      ops::linear(cuda::context(), m, wc, c);
    };
    check_pdl(w, cat("decode chain, T=", T));
  }
}

// The exact products on tensor cores (linear_exact_tc_kernel, TERN_EXACT_PATH=tc: weights read before the wait,
// K slices summed through a thread-block cluster) in a chain where each reads what the kernel before it wrote and
// an add overwrites a product's x right after it: the V4 router gate (bf16) on a norm's output, the indexer's
// wq_b (FP8) on a product's output, weights_proj (bf16) on that norm again; at 1, 16 and 64 tokens.
TEST(GpuPdl, ExactTcChainSameBitsOnOffAndInGraphs) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  const Shapes& s = kV4Flash;
  const int64_t D = s.D, Q = s.q_rank, E = s.experts, H = s.index_heads, IQ = s.index_heads * s.index_dim;
  cuda::WeightStore store;
  const ops::Weight wqa = device_weight(store, WeightFormat::fp8_block, Q, D, r, "chain.wq_a");
  ops::Weight gate = device_weight(store, WeightFormat::bf16, E, D, r, "chain.gate");
  ops::Weight wqb = device_weight(store, WeightFormat::fp8_block, IQ, Q, r, "chain.idx_wq_b");
  ops::Weight wproj = device_weight(store, WeightFormat::bf16, H, D, r, "chain.weights_proj");
  gate.exact = wqb.exact = wproj.exact = true;
  const cuda::DeviceTensor norm_w = upload(random_f32({D}, r));
  struct TcGuard {
    cuda::ExactPath saved = cuda::exact_path();
    TcGuard() { cuda::set_exact_path(cuda::ExactPath::tensor_cores); }
    ~TcGuard() { cuda::set_exact_path(saved); }
  } tc;
  for (int64_t T : {1, 16, 64}) {
    const cuda::DeviceTensor x(DType::f32, {T, D}), add_q(DType::f32, {T, Q}), h(DType::f32, {T, D}),
        g(DType::f32, {T, E}), q(DType::f32, {T, Q}), iq(DType::f32, {T, IQ}), wts(DType::f32, {T, H});
    Work w;
    w.inputs = {{&x, {random_f32({T, D}, r), random_f32({T, D}, r)}},
                {&add_q, {random_f32({T, Q}, r), random_f32({T, Q}, r)}}};
    w.outputs = {{"h = rms_norm(x)", &h},
                 {"g = gate h (exact, bf16)", &g},
                 {"q = wq_a h, then q += add_q", &q},
                 {"iq = idx.wq_b q (exact, fp8)", &iq},
                 {"weights = weights_proj h (exact, bf16)", &wts}};
    w.issue = [&] {
      ops::rms_norm(cuda::context(), x, norm_w, 1e-6f, h);
      ops::linear(cuda::context(), h, gate, g);
      ops::linear(cuda::context(), h, wqa, q);
      ops::linear(cuda::context(), q, wqb, iq);
      ops::add(cuda::context(), add_q, q);
      ops::linear(cuda::context(), h, wproj, wts);
    };
    check_pdl(w, cat("exact tc chain, T=", T));
  }
}

// The switch (TERN_PDL, set_pdl_enabled) and what the startup report says about it.
TEST(GpuPdl, SwitchIsReportedInTheKernelPaths) {
  TERN_REQUIRE_GPU();
  for (bool on : {true, false}) {
    PdlGuard guard(on);
    EXPECT_EQ(cuda::pdl_enabled(), on);
    const std::vector<std::string> paths = cuda::register_backend().kernel_paths();
    ASSERT_FALSE(paths.empty());
    const std::string want = on ? "programmatic dependent launch on" : "programmatic dependent launch off";
    EXPECT_NE(paths.back().find(want), std::string::npos) << paths.back();
  }
}

}  // namespace
}  // namespace tern::gputest
