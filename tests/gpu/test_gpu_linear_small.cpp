// The small-T linear kernel (variant 4, kernels/linear_small_impl.cuh) against the CPU reference and against
// variant 0's kernels, bit for bit: it keeps their K groups and summation order, so a token's product must be
// the same bits whichever kernel, plan or batch computes it (a step of 64 tokens and one of 65 take different
// kernels). Every plan the model can pick, plain and grouped (wo_a), at 1..64 tokens; and a product split over
// K segments replayed from a CUDA graph (its arrival counters must return to zero).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/kernels/linear.cuh"
#include "gpu_test_util.h"
#include "ops/linear.h"
#include "shapes.h"

namespace tern::gputest {
namespace {

using ops::WeightFormat;

#define CHECK_CUDA(call) \
  ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

// Restores the process-wide linear variant and the forced small-T plan when a test ends.
struct SmallGuard {
  int saved = cuda::linear_variant();
  ~SmallGuard() {
    cuda::set_linear_variant(saved);
    cuda::set_linear_small_plan("");
  }
};

struct Case {
  const char* name;
  WeightFormat format;
  int64_t out, in, groups;  // groups > 1: grouped_linear (wo_a), x [T, groups, in]
};

// The FP8 and bf16 products of a decode step at these shapes (stacked ones as the model stacks them), and odd
// row counts (a partial last panel).
std::vector<Case> cases(const Shapes& s) {
  const int64_t D = s.D, in_g = s.heads / s.groups * s.head_dim;
  return {
      {"wq_a|wkv", WeightFormat::fp8_block, s.q_rank + s.head_dim, D, 1},
      {"wq_a", WeightFormat::fp8_block, s.q_rank, D, 1},
      {"wq_b", WeightFormat::fp8_block, s.heads * s.head_dim, s.q_rank, 1},
      {"wo_a (grouped)", WeightFormat::fp8_block, s.groups * s.o_rank, in_g, s.groups},
      {"wo_b", WeightFormat::fp8_block, D, s.groups * s.o_rank, 1},
      {"shared.w1|w3", WeightFormat::fp8_block, 2 * s.inter, D, 1},
      {"shared.w2", WeightFormat::fp8_block, D, s.inter, 1},
      {"fp8 odd rows", WeightFormat::fp8_block, 200, D, 1},
      {"comp.wkv|wgate", WeightFormat::bf16, 4 * s.head_dim, D, 1},
      {"comp 512 rows", WeightFormat::bf16, 512, D, 1},
      {"bf16 odd rows", WeightFormat::bf16, 200, D, 1},
  };
}

struct Product {
  const Case& c;
  HostWeight hw;
  ops::Weight dw;
  Product(const Case& c, cuda::WeightStore& store, Rand& r)
      : c(c), hw(random_weight(c.format, c.out, c.in, r, 1.0f / std::sqrt(static_cast<float>(c.in)), c.name)),
        dw(store.upload(hw.w)) {}
  Tensor x(int64_t T, Rand& r) const { return c.groups > 1 ? random_f32({T, c.groups, c.in}, r) : random_f32({T, c.in}, r); }
  Shape y_shape(int64_t T) const { return c.groups > 1 ? Shape{T, c.groups, c.out / c.groups} : Shape{T, c.out}; }
  void run(const TensorView& x, const TensorView& y, const ops::Weight& w) const {
    if (c.groups > 1) ops::grouped_linear(x, w, y);
    else ops::linear(x, w, y);
  }
  // The product on the GPU under `variant` (and a forced small-T plan, "" for the model's) into a poisoned y.
  cuda::DeviceTensor gpu_dev(const cuda::DeviceTensor& dx, int64_t T, int variant, const std::string& plan = "") const {
    auto y = poisoned(DType::f32, y_shape(T));
    cuda::set_linear_variant(variant);
    cuda::set_linear_small_plan(plan);
    run(dx, y, dw);
    cuda::set_linear_small_plan("");
    return y;
  }
  Tensor gpu(const cuda::DeviceTensor& dx, int64_t T, int variant, const std::string& plan = "") const {
    return cuda::to_host(gpu_dev(dx, T, variant, plan));
  }
  cuda::LinearParams params(int64_t T) const { return linear_shape_params(c.format, c.out, c.in, c.groups, T); }
};

int64_t differing(const Tensor& a, const Tensor& b) {
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(a.data<float>() + i, b.data<float>() + i, 4) != 0) ++n;
  return n;
}

class GpuLinearSmall : public ::testing::TestWithParam<Shapes> {};

// 1, 2, 7: one n-tile (8-row m-tiles possible, x straight from memory); 16: two; 20: four (x window); 33, 64:
// eight. Against the CPU and, bit for bit, against variant 0 (linear_stream for FP8, linear_bulk for bf16).
TEST_P(GpuLinearSmall, MatchesCpuAndTheDefaultKernelsBits) {
  TERN_REQUIRE_GPU();
  SmallGuard guard;
  Rand r(fresh_seed());
  cuda::WeightStore store;
  for (const Case& c : cases(GetParam())) {
    const Product p(c, store, r);
    for (int64_t T : {1, 2, 7, 16, 20, 33, 64}) {
      ASSERT_TRUE(cuda::linear_small_ok(p.params(T))) << c.name << " T=" << T << ": no small-T plan";
      const Tensor x = p.x(T, r);
      Tensor ref(DType::f32, p.y_shape(T));
      p.run(x, ref, p.hw.w);
      auto dx = upload(x);
      const Tensor base = p.gpu(dx, T, 0);
      const cuda::DeviceTensor dsmall = p.gpu_dev(dx, T, 4);
      const std::string what = cat(c.name, " T=", T, " [", cuda::linear_small_plans(p.params(T), 1)[0].name, "]");
      expect_close(dsmall, ref, kTolBf16, "linear_small " + what);
      EXPECT_EQ(differing(cuda::to_host(dsmall), base), 0) << what << ": outputs differ from variant 0's kernel";
    }
  }
  cuda::register_backend().check_device_errors();
}

// Every plan (row panels of 8 / 16-row m-tiles, K segments, warps per m-tile, x window or not, bulk or lane
// copies) gives the same bits: the plan only moves work between warps and blocks. At the V4-Flash shapes a
// spread of at most 40 plans (every k-th by the model's order), at the fixture's all of them.
TEST_P(GpuLinearSmall, EveryPlanGivesTheSameBits) {
  TERN_REQUIRE_GPU();
  SmallGuard guard;
  Rand r(fresh_seed());
  cuda::WeightStore store;
  for (const Case& c : cases(GetParam())) {
    const Product p(c, store, r);
    for (int64_t T : {2, 16, 20, 33}) {
      auto dx = upload(p.x(T, r));
      const Tensor base = p.gpu(dx, T, 0);
      const std::vector<cuda::SmallPlanInfo> plans = cuda::linear_small_plans(p.params(T), 1 << 20);
      ASSERT_FALSE(plans.empty()) << c.name << " T=" << T;
      const size_t step = (plans.size() + 39) / 40;
      int split = 0;
      for (size_t i = 0; i < plans.size(); i += step) {
        split += plans[i].segs > 1;
        const Tensor got = p.gpu(dx, T, 4, plans[i].name);
        EXPECT_EQ(differing(got, base), 0) << c.name << " T=" << T << " plan [" << plans[i].name << "]: outputs differ "
                                           << "from variant 0's kernel";
      }
      std::printf("[linear_small] %s T=%lld: %zu plans, %zu run (%d split over K)\n", c.name,
                  static_cast<long long>(T), plans.size(), (plans.size() + step - 1) / step, split);
    }
  }
  cuda::register_backend().check_device_errors();
}

// A token's bits do not depend on the batch: rows of a 100-token product (past 64 tokens: variant 0's kernels)
// equal the same rows computed alone and in batches of 2 .. 64 at other offsets by the small-T kernel.
TEST_P(GpuLinearSmall, BatchInvariant) {
  TERN_REQUIRE_GPU();
  SmallGuard guard;
  Rand r(fresh_seed());
  cuda::WeightStore store;
  const int64_t N = 100;
  for (const Case& c : cases(GetParam())) {
    const Product p(c, store, r);
    const Tensor x = p.x(N, r);
    const Tensor all = p.gpu(upload(x), N, 4);
    const int64_t row = x.numel() / N, yrow = all.numel() / N;
    for (int64_t T : {1, 2, 7, 16, 33, 64}) {
      const int64_t off = r.index(N - T + 1);
      Tensor xs(DType::f32, c.groups > 1 ? Shape{T, c.groups, c.in} : Shape{T, c.in});
      std::memcpy(xs.data<float>(), x.data<float>() + off * row, T * row * sizeof(float));
      const Tensor part = p.gpu(upload(xs), T, 4);
      int64_t differ = 0;
      for (int64_t i = 0; i < T * yrow; ++i)
        if (std::memcmp(part.data<float>() + i, all.data<float>() + off * yrow + i, 4) != 0) ++differ;
      EXPECT_EQ(differ, 0) << c.name << ": " << differ << " outputs of tokens " << off << ".." << off + T - 1
                           << " differ between a batch of " << T << " and the batch of " << N;
    }
  }
}

// A product split over K segments (partial sums, a per-panel arrival counter that the last block returns to
// zero) captured three times in one CUDA graph and replayed: every replay must give the eager bits (a counter
// left non-zero would make a later product's blocks miss or misplace the last arrival).
TEST_P(GpuLinearSmall, SplitPlansReplayFromGraphs) {
  TERN_REQUIRE_GPU();
  SmallGuard guard;
  Rand r(fresh_seed());
  cuda::WeightStore store;
  const Shapes& s = GetParam();
  const Case c{"wq_a", WeightFormat::fp8_block, s.q_rank, s.D, 1};
  const Product p(c, store, r);
  cuda::CudaBackend& backend = cuda::register_backend();
  for (int64_t T : {1, 33}) {
    std::string split;
    for (const cuda::SmallPlanInfo& info : cuda::linear_small_plans(p.params(T), 1 << 20))
      if (info.segs > 1) {
        split = info.name;
        break;
      }
    ASSERT_FALSE(split.empty()) << "no plan splits K for wq_a at T=" << T;
    const std::vector<Tensor> xs{p.x(T, r), p.x(T, r)};
    std::vector<cuda::DeviceTensor> dx, dy;
    for (int i = 0; i < 3; ++i) {
      dx.push_back(upload(xs[i % 2]));
      dy.push_back(poisoned(DType::f32, p.y_shape(T)));
    }
    cuda::set_linear_variant(4);
    cuda::set_linear_small_plan(split);
    std::vector<Tensor> eager;
    for (int i = 0; i < 3; ++i) {
      p.run(dx[i], dy[i], p.dw);  // also grows the workspace, so that nothing allocates while capturing
      eager.push_back(cuda::to_host(dy[i]));
    }
    cudaStream_t stream = nullptr;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    void* const previous = backend.stream();
    backend.set_stream(stream);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 3; ++i) p.run(dx[i], dy[i], p.dw);
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    backend.set_stream(previous);
    for (int rep = 0; rep < 5; ++rep) {
      for (auto& y : dy) cuda::fill_bytes(y, 0xff);
      backend.synchronize();
      CHECK_CUDA(cudaGraphLaunch(exec, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      for (int i = 0; i < 3; ++i)
        EXPECT_EQ(differing(cuda::to_host(dy[i]), eager[i]), 0)
            << "T=" << T << " plan [" << split << "] replay " << rep << " product " << i << ": differs from eager";
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    std::printf("[linear_small] wq_a T=%lld plan [%s]: 5 graph replays of 3 products equal eager\n",
                static_cast<long long>(T), split.c_str());
  }
  backend.check_device_errors();
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuLinearSmall, ::testing::Values(kFixture, kV4Flash), ShapeName());

}  // namespace
}  // namespace tern::gputest
