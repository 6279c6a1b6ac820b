// RMSNorm and RoPE against their formulas; the inverse frequencies against transformers' values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "backends/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "test_util.h"

namespace tern {
namespace {

TEST(RmsNorm, WeightedAndUnweighted) {
  test::Random rng(3);
  const int64_t rows = 7, dim = 96;
  Tensor x = rng.tensor({rows, dim}, 3.0f);
  Tensor w(DType::bf16, {dim});
  for (int64_t i = 0; i < dim; ++i) w.data<uint16_t>()[i] = f32_to_bf16(1.0f + rng.normal(0.1f));
  Tensor y(DType::f32, {rows, dim}), u(DType::f32, {rows, dim});
  ops::rms_norm(cpu::context(), x, w, 1e-6f, y);
  ops::rms_norm(cpu::context(), x, {}, 1e-6f, u);
  float worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i)
      ss += double(x.data<float>()[r * dim + i]) * x.data<float>()[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
    for (int64_t i = 0; i < dim; ++i) {
      const double n = x.data<float>()[r * dim + i] * inv;
      worst = std::max(
          worst, float(std::fabs(n * bf16_to_f32(w.data<uint16_t>()[i]) - y.data<float>()[r * dim + i])));
      worst = std::max(worst, float(std::fabs(n - u.data<float>()[r * dim + i])));
    }
  }
  EXPECT_LE(worst, 1e-5f);
}

// norm_rope is rms_norm then rope (the CPU runs the two; a backend may fuse them with the same bits): on heads
// in place and on a stacked product's column range with a weight.
TEST(NormRope, IsRmsNormThenRope) {
  test::Random rng(5);
  ops::RopeParams rp;
  rp.dim = 16;
  const Tensor freq = ops::rope_inv_freq(rp);
  const Tensor pos = test::positions_tensor({0, 3, 70000});
  Tensor heads = rng.tensor({3, 2, 48}, 2.0f), two = rng.tensor({3, 2, 48}, 1.0f);
  std::copy_n(heads.data<float>(), heads.numel(), two.data<float>());
  ops::norm_rope(cpu::context(), heads, {}, 1e-6f, pos, freq, heads);
  ops::rms_norm(cpu::context(), two, {}, 1e-6f, two);
  ops::rope(cpu::context(), two, pos, freq);
  EXPECT_EQ(test::max_abs_diff(heads, two), 0.0f);
  const Tensor stacked = rng.tensor({3, 8 + 48}, 2.0f), w = rng.tensor({48}, 1.0f);
  Tensor out(DType::f32, {3, 48}), ref(DType::f32, {3, 48});
  ops::norm_rope(cpu::context(), stacked.view().cols(8, 56), w, 1e-6f, pos, freq, out);
  ops::rms_norm(cpu::context(), stacked.view().cols(8, 56), w, 1e-6f, ref);
  ops::rope(cpu::context(), ref, pos, freq);
  EXPECT_EQ(test::max_abs_diff(out, ref), 0.0f);
}

TEST(Rope, InvFreqMatchesTransformers) {
  // transformers 5.17 DeepseekV4RotaryEmbedding, rope_dim 64: "main" (theta 1e4) and "compress" (theta 1.6e5,
  // YaRN factor 16, original 65536, beta 32/1, attention_factor 1).
  const int idx[] = {0, 5, 10, 15, 20, 25, 31};
  const double main_ref[] = {1.0,
                             0.23713736236095428,
                             0.05623412877321243,
                             0.01333521492779255,
                             0.003162277862429619,
                             0.0007498941849917173,
                             0.0001333521504420787};
  const double compress_ref[] = {1.0,
                                 0.15376456081867218,
                                 0.02364354021847248,
                                 0.0036355385091155767,
                                 0.0002969777851831168,
                                 5.372312443796545e-06,
                                 5.680529397977807e-07};
  const Tensor main = ops::rope_inv_freq({10000.0, 64});
  const Tensor compress = ops::rope_inv_freq({160000.0, 64, true, 16.0, 65536.0, 32.0, 1.0});
  for (int k = 0; k < 7; ++k) {
    EXPECT_NEAR(main.data<float>()[idx[k]], main_ref[k], 1e-6 * main_ref[k]) << idx[k];
    EXPECT_NEAR(compress.data<float>()[idx[k]], compress_ref[k], 1e-6 * compress_ref[k]) << idx[k];
  }
}

TEST(Rope, RotatesTheLastDimsInterleavedAndInverts) {
  test::Random rng(4);
  const int64_t rows = 5, heads = 3, hd = 48, rope_dim = 16, half = rope_dim / 2;
  const Tensor inv = ops::rope_inv_freq({160000.0, rope_dim, true, 16.0, 65536.0, 32.0, 1.0});
  Tensor x = rng.tensor({rows, heads, hd});
  Tensor y = rng.tensor({rows, heads, hd});
  std::copy_n(x.data<float>(), x.numel(), y.data<float>());
  const Tensor pos = test::positions_tensor({0, 1, 7, 1000, 123457});
  ops::rope(cpu::context(), y, pos, inv);
  float worst = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const float* a = x.data<float>() + (r * heads + h) * hd;
      const float* b = y.data<float>() + (r * heads + h) * hd;
      for (int64_t i = 0; i < hd - rope_dim; ++i) ASSERT_EQ(a[i], b[i]);  // no-RoPE dims untouched
      for (int64_t i = 0; i < half; ++i) {
        // the angle is the fp32 product, as in the reference
        const double angle = inv.data<float>()[i] * static_cast<float>(pos.data<int64_t>()[r]);
        const double x0 = a[hd - rope_dim + 2 * i], x1 = a[hd - rope_dim + 2 * i + 1];
        worst = std::max(
            worst, float(std::fabs(x0 * std::cos(angle) - x1 * std::sin(angle) - b[hd - rope_dim + 2 * i])));
        worst = std::max(worst, float(std::fabs(x1 * std::cos(angle) + x0 * std::sin(angle) -
                                                b[hd - rope_dim + 2 * i + 1])));
      }
    }
  EXPECT_LE(worst, 2e-6f);
  ops::rope(cpu::context(), y, pos, inv, /*inverse=*/true);
  EXPECT_LE(test::max_abs_diff(x, y), 2e-6f);
}

}  // namespace
}  // namespace tern
