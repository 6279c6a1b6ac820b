// hc_pre's finish inside the mix kernel (HcParams::finish_in_mix, TERN_HC_FINISH_IN_MIX): at 1-2 tokens the mix
// kernel's last block of a token group runs hc_pre_finish_kernel's work; its outputs must be the two kernels'
// bits, with and without the folded hc_post and the sub-layer's norm, and the arrival counter must come back to
// zero (the next call, as a graph replay, finds it there). GpuV4.Mhc holds both forms to the CPU.
#include <cstring>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels/mhc.cuh"
#include "gpu_test_util.h"
#include "ops/context.h"
#include "ops/mhc.h"
#include "shapes.h"

namespace tern::gputest {
namespace {

class GpuMhc : public ::testing::TestWithParam<Shapes> {};

TEST_P(GpuMhc, FinishInMixBitIdentical) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const ops::Context& ctx = cuda::context();
  const int64_t hc = 4, mix = (2 + hc) * hc;
  // T = 3: past kHcFinishInMixTokens, both settings take the two kernels (the comparison still holds).
  for (int64_t T : {int64_t{1}, int64_t{2}, int64_t{3}}) {
    auto ds = upload(random_f32({T, hc, s.D}, r, 2.0f)), dfn = upload(random_f32({mix, hc * s.D}, r, 0.02f));
    auto db = upload(random_f32({mix}, r, 0.5f)), dsc = upload(random_f32({3}, r, 0.5f));
    auto dsub = upload(random_f32({T, s.D}, r)), dpost0 = upload(random_f32({T, hc}, r, 0.5f));
    auto dcomb0 = upload(random_f32({T, hc, hc}, r, 0.3f)), dnorm = upload(random_bf16({s.D}, r));
    for (int form = 0; form < 4; ++form) {  // bit 0: the sub-layer's norm; bit 1: the previous hc_post folded in
      const bool normed = (form & 1) != 0, folded = (form & 2) != 0;
      Tensor got[3][4];  // [two kernels, in the mix, in the mix again][streams, post, comb, collapsed]
      for (int run = 0; run < 3; ++run) {
        const KnobGuard way("TERN_HC_FINISH_IN_MIX", run > 0 ? 1 : 0);
        auto streams = folded ? poisoned(DType::f32, {T, hc, s.D}) : upload(cuda::to_host(ds));
        auto post = poisoned(DType::f32, {T, hc}), comb = poisoned(DType::f32, {T, hc, hc});
        auto col = poisoned(DType::f32, {T, s.D});
        ops::HcPreArgs a{streams, dfn, db, dsc, {}, post, comb, col};
        if (normed) a.normed = true, a.norm = dnorm, a.rms_eps = 1e-5f;
        if (folded) a.prev_streams = ds, a.prev_a = dsub, a.prev_post = dpost0, a.prev_comb = dcomb0;
        ops::hc_pre(ctx, a);
        got[run][0] = cuda::to_host(streams);
        got[run][1] = cuda::to_host(post);
        got[run][2] = cuda::to_host(comb);
        got[run][3] = cuda::to_host(col);
      }
      const char* what[] = {"streams", "post", "comb", "collapsed"};
      for (int run = 1; run < 3; ++run)
        for (int i = 0; i < 4; ++i)
          EXPECT_EQ(std::memcmp(got[run][i].data<float>(), got[0][i].data<float>(), got[0][i].nbytes()), 0)
              << "T=" << T << (normed ? " normed" : "") << (folded ? " folded" : "") << " run " << run << ": "
              << what[i] << " differs from the two kernels'";
    }
  }
  // Which calls take it (host rule): 1-2 tokens, the switch on, counters given.
  cuda::HcParams p;
  p.finish_in_mix = true;
  int counter = 0;
  p.counters = &counter;
  for (int64_t T : {1, 2, 3, 64}) {
    p.T = T;
    EXPECT_EQ(cuda::hc_finish_in_mix(p), T <= cuda::kHcFinishInMixTokens) << "T=" << T;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuMhc, ::testing::Values(kFixture, kV4Flash), ShapeName());

}  // namespace
}  // namespace tern::gputest
