// moe_experts with its own scored routing (MoeExpertsArgs::logits): at up to kMoeFrontMaxTokens tokens on the decode
// kernels the CUDA backend routes, quantises x and plans in one launch (moe_front_kernel, TERN_MOE_FRONT); its picks,
// weights and output must be the bits of route_scored's kernel + act_quant + moe_plan (the switch off), and both the
// CPU's picks, at V4-Flash's width and 6 picks (16 experts stand for the 256: the kernels do not depend on their
// number), with f32 and FP8 activations.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels/moe.cuh"
#include "gpu_test_util.h"
#include "ops/moe.h"
#include "shapes.h"

namespace tern::gputest {
namespace {

class GpuMoeFront : public ::testing::TestWithParam<Shapes> {};

TEST_P(GpuMoeFront, RoutingInTheFrontKernelBitIdentical) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::CudaBackend& be = cuda::register_backend();
  const int64_t E = std::min<int64_t>(s.experts, 16), k = s.experts_per_token, D = s.D, inter = s.inter;
  const MoeGroupedMinTokensGuard decode_kernels(65);  // (the default: the decode kernels up to 64 tokens)
  for (bool act_fp8 : {false, true}) {
    if (act_fp8 && (D % 128 != 0 || inter % 128 != 0)) continue;
    RandomExperts experts(ops::WeightFormat::mxfp4, E, D, inter, r);
    for (ops::Expert& e : experts.on_device) e.w1.act_fp8 = e.w2.act_fp8 = e.w3.act_fp8 = act_fp8;
    Tensor bias = random_f32({E}, r, 0.2f);
    auto dbias = upload(bias);
    for (int64_t T : {1, 5, 16, 32, 33}) {
      Tensor x = random_f32({T, D}, r), logits = random_f32({T, E}, r, 2.0f);
      auto dx = upload(x), dlogits = upload(logits);
      // The CPU's picks and weights (route_scored's reference).
      Tensor hidx(DType::i32, {T, k}), hw(DType::f32, {T, k});
      ops::route_scored(cpu::context(), logits, bias, 2.5f, hidx, hw);
      Tensor got[2][3];  // [front off, on][indices, weights, out]
      for (int front = 0; front < 2; ++front) {
        const KnobGuard way("TERN_MOE_FRONT", front);
        const int64_t before = be.fused_quant_calls().moe_front;
        auto idx = poisoned(DType::i32, {T, k}), w = poisoned(DType::f32, {T, k}), out = poisoned(DType::f32, {T, D});
        ops::MoeExpertsArgs a{dx, idx, w, experts.on_device, 10.0f, out};
        a.logits = dlogits;
        a.bias = dbias;
        a.routed_scale = 2.5f;
        ops::moe_experts(cuda::context(), a);
        got[front][0] = cuda::to_host(idx);
        got[front][1] = cuda::to_host(w);
        got[front][2] = cuda::to_host(out);
        const bool took = be.fused_quant_calls().moe_front == before + 1;
        const bool expected = front == 1 && T <= cuda::kMoeFrontMaxTokens && cuda::route_in_registers(E, static_cast<int>(k));
        EXPECT_EQ(took, expected) << "T=" << T << " act_fp8 " << act_fp8 << " front " << front;
      }
      const std::string what = cat("T=", T, act_fp8 ? " (fp8 activations)" : "");
      EXPECT_EQ(std::memcmp(got[0][0].data<int32_t>(), hidx.data<int32_t>(), T * k * 4), 0) << what << ": picks vs CPU";
      for (int64_t i = 0; i < T * k; ++i)
        EXPECT_NEAR(got[0][1].data<float>()[i], hw.data<float>()[i], 1e-5f * std::fabs(hw.data<float>()[i]) + 1e-7f)
            << what << ": routing weight " << i << " vs CPU";
      const char* names[] = {"picks", "weights", "output"};
      for (int i = 0; i < 3; ++i)
        EXPECT_EQ(std::memcmp(got[1][i].view().data(), got[0][i].view().data(), got[0][i].nbytes()), 0)
            << what << ": " << names[i] << " differ between the front kernel and the separate launches";
    }
  }
  be.check_device_errors();
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuMoeFront, ::testing::Values(kFixture, kV4Flash), ShapeName());

}  // namespace
}  // namespace tern::gputest
