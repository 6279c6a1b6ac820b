// Dispatch in a context: tensors on another device or a missing kernel are a loud error naming the op,
// never a fallback.
#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "ops/backend.h"
#include "ops/branch.h"
#include "ops/context.h"
#include "test_util.h"

namespace tern {
namespace {

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class StubBackend : public ops::Backend {
 public:
  std::string_view name() const override { return "cuda"; }
};

TEST(Dispatch, WrongDeviceAndMissingKernelsAreLoud) {
  float storage[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const TensorView on_gpu(storage, DType::f32, {2, 4}, Device::cuda);
  EXPECT_EQ(message_of([&] { ops::rms_norm(cpu::context(), on_gpu, {}, 1e-6f, on_gpu); }),
            "an op's tensors are on cuda but its context runs cpu on cpu");
  StubBackend stub;
  const ops::Context gpu(stub, Device::cuda);
  EXPECT_EQ(message_of([&] { ops::rms_norm(gpu, on_gpu, {}, 1e-6f, on_gpu); }),
            "no cuda kernel for op rms_norm (f32)");
}

// Side branches (ops/branch.h) reach the device's backend in order: begin, the body's ops, end, then the caller's
// ops, then the join; an error inside the body still ends and joins the branch before it leaves.
class BranchRecorder : public ops::Backend {
 public:
  std::string_view name() const override { return "cuda"; }
  void side_begin(bool) override { log += "b"; }
  void side_end() override { log += "e"; }
  void side_join() override { log += "j"; }
  std::string log;
};

TEST(Dispatch, SideBranchesReachTheBackendInOrder) {
  BranchRecorder rec;
  const ops::Context gpu(rec, Device::cuda);
  ops::run_side(gpu, Device::cuda, [&] { rec.log += "x"; });
  rec.log += "m";
  ops::join_side(gpu, Device::cuda);
  EXPECT_EQ(rec.log, "bxemj");
  rec.log.clear();
  EXPECT_THROW(ops::run_side(gpu, Device::cuda, [&] { fail("inside the branch"); }), Error);
  EXPECT_EQ(rec.log, "bej");
}

// On the CPU a side branch runs at once, in issue order: what it wrote is there when run_side returns.
TEST(Dispatch, CpuSideBranchRunsInIssueOrder) {
  Tensor x(DType::f32, {1, 4}), y(DType::f32, {1, 4});
  for (int i = 0; i < 4; ++i) x.data<float>()[i] = float(i + 1), y.data<float>()[i] = 10.0f;
  ops::run_side(cpu::context(), Device::cpu, [&] { ops::add(cpu::context(), x, y); });
  EXPECT_EQ(y.data<float>()[3], 14.0f);
  ops::join_side(cpu::context(), Device::cpu);
}

TEST(Dispatch, CpuRejectsDtypesItHasNoKernelFor) {
  Tensor x(DType::bf16, {2, 4});
  EXPECT_EQ(message_of([&] { ops::rms_norm(cpu::context(), x, {}, 1e-6f, x); }),
            "no cpu kernel for op rms_norm (bf16)");
}

TEST(Dispatch, ShapeErrorsNameTheArgument) {
  Tensor x(DType::f32, {2, 4}), w(DType::f32, {5});
  EXPECT_EQ(message_of([&] { ops::rms_norm(cpu::context(), x, w, 1e-6f, x); }),
            "rms_norm: weight must have shape [4], found [5]");
  Tensor mixed(DType::f32, {2, 4});
  const TensorView gpu_out(mixed.data<float>(), DType::f32, {2, 4}, Device::cuda);
  EXPECT_EQ(message_of([&] { ops::rms_norm(cpu::context(), x, {}, 1e-6f, gpu_out); }),
            "rms_norm: tensors on different devices");
}

}  // namespace
}  // namespace tern
