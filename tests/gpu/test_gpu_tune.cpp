// Kernel tuning on the GPU: every K-group count the tuner may pick gives the CPU reference's product (and
// stays batch invariant), and tune_linears measures what its table lacks, saves nothing itself, applies
// the table, and refuses to change a weight that has already run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "core/error.h"
#include "gpu_test_util.h"
#include "ops/linear.h"
#include "shapes.h"

namespace tern::gputest {
namespace {

using ops::WeightFormat;

TEST(GpuTune, EveryGroupCountGivesTheReferenceProduct) {
  TERN_REQUIRE_GPU();
  cuda::CudaBackend& backend = cuda::register_backend();
  Rand r(fresh_seed());
  cuda::WeightStore store;
  const Shapes& s = kV4Flash;
  struct Case {
    const char* name;
    WeightFormat format;
    int64_t out, in;
  };
  for (const Case c : {Case{"wq_b", WeightFormat::fp8_block, s.heads * s.head_dim / 4, s.q_rank},
                       Case{"shared.w2", WeightFormat::fp8_block, s.D, s.inter},
                       Case{"expert.w1 mxfp4", WeightFormat::mxfp4, s.inter, s.D}}) {
    const HostWeight hw = random_weight(c.format, c.out, c.in, r, 1.0f / std::sqrt(static_cast<float>(c.in)), c.name);
    const ops::Weight dw = store.upload(hw.w);
    const int64_t N = 64;
    const Tensor x = random_f32({N, c.in}, r);
    Tensor ref(DType::f32, {N, c.out});
    ops::linear(cpu::context(), x, hw.w, ref);
    for (int groups : {1, 2, 4, 8, 16, 32, 64}) {
      backend.set_linear_groups(dw, groups);
      auto dx = upload(x), y = poisoned(DType::f32, {N, c.out});
      ops::linear(cuda::context(), dx, dw, y);
      expect_close(y, ref, kTolBf16, cat(c.name, " groups ", groups));
      // Batch invariance with this count: the first token alone gives the same bits.
      const Tensor all = cuda::to_host(y);
      Tensor x1(DType::f32, {1, c.in});
      std::memcpy(x1.data<float>(), x.data<float>(), c.in * sizeof(float));
      auto dx1 = upload(x1), y1 = poisoned(DType::f32, {1, c.out});
      ops::linear(cuda::context(), dx1, dw, y1);
      const Tensor one = cuda::to_host(y1);
      EXPECT_EQ(std::memcmp(one.data<float>(), all.data<float>(), c.out * sizeof(float)), 0) << c.name << " groups " << groups;
    }
    backend.set_linear_groups(dw, 0);
  }
}

TEST(GpuTune, TuneLinearsMeasuresAppliesAndGuards) {
  TERN_REQUIRE_GPU();
  cuda::CudaBackend& backend = cuda::register_backend();
  Rand r(fresh_seed());
  cuda::WeightStore store;
  const Shapes& s = kV4Flash;
  const HostWeight a = random_weight(WeightFormat::fp8_block, s.q_rank, s.D, r, 0.02f, "wq_a");
  const HostWeight b = random_weight(WeightFormat::fp8_block, s.q_rank, s.D, r, 0.02f, "wq_a of another layer");
  const HostWeight g = random_weight(WeightFormat::bf16, s.experts, s.D, r, 0.02f, "gate");
  ops::Weight da = store.upload(a.w), db = store.upload(b.w), dg = store.upload(g.w);
  dg.exact = true;
  const std::vector<ops::LinearUse> uses = {{&da, 1}, {&db, 1}, {&dg, 1}};
  cuda::TuneTable table(backend.tune_device());
  const auto measured = backend.tune_linears(uses, table, true);
  EXPECT_EQ(measured.weights, 3);
  EXPECT_EQ(measured.shapes, 1);  // both wq_a share one shape; the exact gate has no groups
  EXPECT_EQ(measured.measured, 1);
  ASSERT_EQ(table.entries().size(), 1u);
  const cuda::TuneEntry& e = table.entries().begin()->second;
  EXPECT_GE(e.tried.size(), 2u);
  for (const auto& [groups, us] : e.tried) EXPECT_GT(us, 0.0) << groups;
  std::printf("[tune] %s\n", measured.choices.front().c_str());
  // Saved and loaded, the table is applied without measuring.
  const std::string file = cat(std::filesystem::temp_directory_path().string(), "/tern-gpu-tune-", getpid(), ".json");
  table.save(file);
  cuda::TuneTable back = cuda::TuneTable::load(file, backend.tune_device());
  std::filesystem::remove(file);
  const auto cached = backend.tune_linears(uses, back, false);
  EXPECT_EQ(cached.measured, 0);
  EXPECT_EQ(cached.from_table, 1);
  // The tuned weight runs and equals the reference.
  const Tensor x = random_f32({3, s.D}, r);
  Tensor ref(DType::f32, {3, s.q_rank});
  ops::linear(cpu::context(), x, a.w, ref);
  auto dx = upload(x), y = poisoned(DType::f32, {3, s.q_rank});
  ops::linear(cuda::context(), dx, da, y);
  expect_close(y, ref, kTolBf16, "tuned wq_a");
  // Once it has run, another choice for it is refused; the same one is not.
  EXPECT_NO_THROW(backend.tune_linears(uses, back, false));
  cuda::TuneTable other(backend.tune_device());
  const std::string key = table.entries().begin()->first;
  other.put(key, {e.choice == 1 ? 2 : 1, 1.0, {}});
  EXPECT_THROW(backend.tune_linears(uses, other, false), Error);
  backend.set_linear_groups(da, 0);
  backend.set_linear_groups(db, 0);
}

}  // namespace
}  // namespace tern::gputest
