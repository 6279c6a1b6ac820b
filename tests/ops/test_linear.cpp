// linear / grouped_linear in every weight format against dequantize-by-formula then matmul in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "ops/act_quant.h"
#include "ops/linear.h"
#include "test_util.h"

namespace tern {
namespace {

// A weight in format f with random bytes, plus its values decoded independently of the kernel.
struct TestWeight {
  Tensor weight, scale;
  ops::Weight w;
  std::vector<double> values;  // [out, in]
};

TestWeight make_weight(ops::WeightFormat f, int64_t out, int64_t in, test::Random& rng) {
  TestWeight t;
  t.w.format = f, t.w.out = out, t.w.in = in, t.w.name = "test";
  t.values.resize(out * in);
  auto byte = [&](int lo, int hi) { return static_cast<uint8_t>(rng.integer(lo, hi)); };
  switch (f) {
    case ops::WeightFormat::f32:
      t.weight = rng.tensor({out, in});
      for (int64_t i = 0; i < out * in; ++i) t.values[i] = t.weight.data<float>()[i];
      break;
    case ops::WeightFormat::bf16:
      t.weight = Tensor(DType::bf16, {out, in});
      for (int64_t i = 0; i < out * in; ++i) {
        t.weight.data<uint16_t>()[i] = f32_to_bf16(rng.normal());
        t.values[i] = bf16_to_f32(t.weight.data<uint16_t>()[i]);
      }
      break;
    case ops::WeightFormat::fp8_block: {
      t.weight = Tensor(DType::e4m3, {out, in});
      t.scale = Tensor(DType::e8m0, {(out + 127) / 128, (in + 127) / 128});
      for (int64_t i = 0; i < t.scale.numel(); ++i) t.scale.data<uint8_t>()[i] = byte(118, 130);
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          uint8_t b = byte(0, 255);
          if ((b & 0x7f) == 0x7f) b = 0x3c;  // not NaN
          t.weight.data<uint8_t>()[o * in + i] = b;
          t.values[o * in + i] = double(e4m3_to_f32(b)) *
                                 e8m0_to_f32(t.scale.data<uint8_t>()[(o / 128) * t.scale.dim(1) + i / 128]);
        }
      break;
    }
    case ops::WeightFormat::mxfp4:
    case ops::WeightFormat::nvfp4: {
      const bool mx = f == ops::WeightFormat::mxfp4;
      const int64_t block = mx ? 32 : 16;
      t.weight = Tensor(DType::u8, {out, in / 2});
      t.scale = Tensor(mx ? DType::e8m0 : DType::ue4m3, {out, in / block});
      t.w.global_scale = mx ? 1.0f : 0.0371f;
      for (int64_t i = 0; i < t.scale.numel(); ++i)
        t.scale.data<uint8_t>()[i] = mx ? byte(122, 131) : byte(1, 0x7e);
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; i += 2) {
          const uint8_t b = byte(0, 255);
          t.weight.data<uint8_t>()[o * (in / 2) + i / 2] = b;
          const uint8_t s = t.scale.data<uint8_t>()[o * (in / block) + i / block];
          const double scale = mx ? double(e8m0_to_f32(s)) : double(ue4m3_to_f32(s)) * t.w.global_scale;
          t.values[o * in + i] = e2m1_to_f32(b & 0xf) * scale;
          t.values[o * in + i + 1] = e2m1_to_f32(b >> 4) * scale;
        }
      break;
    }
  }
  t.w.weight = t.weight.view();
  if (!t.scale.empty()) t.w.scale = t.scale.view();
  return t;
}

class LinearFormats : public ::testing::TestWithParam<ops::WeightFormat> {};

TEST_P(LinearFormats, MatchesDequantizeThenMatmul) {
  test::Random rng(11 + static_cast<int>(GetParam()));
  const int64_t out = 200, in = 320, T = 5;  // out and in not multiples of 128: partial FP8 blocks
  TestWeight tw = make_weight(GetParam(), out, in, rng);
  Tensor x = rng.tensor({T, in});
  Tensor y(DType::f32, {T, out});
  ops::linear(cpu::context(), x, tw.w, y);
  double worst = 0, scale = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double want = 0;
      for (int64_t i = 0; i < in; ++i) want += double(x.data<float>()[t * in + i]) * tw.values[o * in + i];
      worst = std::max(worst, std::fabs(want - y.data<float>()[t * out + o]));
      scale = std::max(scale, std::fabs(want));
    }
  std::printf("linear %s: max|dy| = %.3g (max|y| %.3g)\n",
              std::string(ops::weight_format_name(GetParam())).c_str(), worst, scale);
  EXPECT_LE(worst, 2e-6 * scale);

  Tensor dense(DType::f32, {out, in});
  ops::dequantize(cpu::context(), tw.w, dense);
  for (int64_t i = 0; i < out * in; ++i)
    ASSERT_EQ(dense.data<float>()[i], static_cast<float>(tw.values[i])) << i;
}

INSTANTIATE_TEST_SUITE_P(All, LinearFormats,
                         ::testing::Values(ops::WeightFormat::f32, ops::WeightFormat::bf16,
                                           ops::WeightFormat::fp8_block, ops::WeightFormat::mxfp4,
                                           ops::WeightFormat::nvfp4));

TEST(GroupedLinear, EachGroupHasItsOwnBlock) {
  test::Random rng(5);
  const int64_t T = 3, G = 4, in_g = 64, out_g = 48;
  TestWeight tw = make_weight(ops::WeightFormat::fp8_block, G * out_g, in_g, rng);
  Tensor x = rng.tensor({T, G, in_g});
  Tensor y(DType::f32, {T, G, out_g});
  ops::grouped_linear(cpu::context(), x, tw.w, y);
  double worst = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t o = 0; o < out_g; ++o) {
        double want = 0;
        for (int64_t i = 0; i < in_g; ++i)
          want += double(x.data<float>()[(t * G + g) * in_g + i]) * tw.values[(g * out_g + o) * in_g + i];
        worst = std::max(worst, std::fabs(want - y.data<float>()[(t * G + g) * out_g + o]));
      }
  EXPECT_LE(worst, 1e-4);
}

TEST(Linear, RejectsMisshapedWeights) {
  test::Random rng(1);
  TestWeight tw = make_weight(ops::WeightFormat::mxfp4, 8, 64, rng);
  tw.w.in = 96;  // the views say 64
  Tensor x = rng.tensor({1, 96}), y(DType::f32, {1, 8});
  try {
    ops::linear(cpu::context(), x, tw.w, y);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight test (mxfp4)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// The reference's act_quant: power-of-two scales 2^ceil(log2(max(amax, 1e-4) / 448)), e4m3 values within +-448,
// and the dequantised value within half an e4m3 step (relative 2^-4) of x; the amax floor keeps tiny blocks
// finite.
TEST(ActQuant, ReferenceRule) {
  test::Random rng(3);
  const int64_t n = 4 * ops::kActBlock;
  Tensor x = rng.tensor({n});
  float* v = x.data<float>();
  for (int64_t i = 0; i < ops::kActBlock; ++i) v[i] *= 1e-7f;                    // block 0: under the floor
  for (int64_t i = 2 * ops::kActBlock; i < 3 * ops::kActBlock; ++i) v[i] *= 1000.0f;  // block 2: large
  v[3 * ops::kActBlock + 5] = 448.0f;  // block 3: amax exactly 448 -> scale 1
  std::vector<uint8_t> q(n);
  std::vector<float> s(n / ops::kActBlock), fq(n);
  ops::act_quant_fp8(v, n, q.data(), s.data());
  ops::act_fake_quant_fp8(v, n, fq.data());
  EXPECT_EQ(s[0], std::ldexp(1.0f, ops::fp8_scale_exponent(1e-4f)));  // the floor
  EXPECT_EQ(s[3], 1.0f);
  for (int64_t b = 0; b < n / ops::kActBlock; ++b) {
    int e = 0;
    EXPECT_EQ(std::frexp(s[b], &e), 0.5f) << "scale " << s[b] << " is not a power of two";
    float amax = 0;
    for (int64_t i = 0; i < ops::kActBlock; ++i) amax = std::max(amax, std::fabs(v[b * ops::kActBlock + i]));
    EXPECT_LE(std::max(amax, 1e-4f) / s[b], 448.0f);
    EXPECT_GT(std::max(amax, 1e-4f) / s[b], 224.0f);  // the smallest power of two that fits
    for (int64_t i = b * ops::kActBlock; i < (b + 1) * ops::kActBlock; ++i) {
      EXPECT_EQ(fq[i], e4m3_to_f32(q[i]) * s[b]) << i;
      EXPECT_LE(std::fabs(fq[i] - v[i]), std::max(std::fabs(v[i]) / 16, s[b] * 0x1p-10f)) << i;
    }
  }
  EXPECT_THROW(ops::act_quant_fp8(v, 100, q.data(), s.data()), Error);
}

// A weight with act_fp8 multiplies the dequantised quantised x: exactly the plain product of act_fake_quant(x).
TEST(ActQuant, LinearTakesTheQuantisedRows) {
  test::Random rng(7);
  const int64_t out = 96, in = 256, T = 3;
  TestWeight tw = make_weight(ops::WeightFormat::fp8_block, out, in, rng);
  Tensor x = rng.tensor({T, in}), xq = rng.tensor({T, in});
  for (int64_t t = 0; t < T; ++t) ops::act_fake_quant_fp8(x.data<float>() + t * in, in, xq.data<float>() + t * in);
  Tensor want(DType::f32, {T, out}), got(DType::f32, {T, out});
  ops::linear(cpu::context(), xq, tw.w, want);
  tw.w.act_fp8 = true;
  ops::linear(cpu::context(), x, tw.w, got);
  EXPECT_EQ(std::memcmp(want.data<float>(), got.data<float>(), want.nbytes()), 0);
  Tensor plain(DType::f32, {T, out});
  tw.w.act_fp8 = false;
  ops::linear(cpu::context(), x, tw.w, plain);
  EXPECT_NE(std::memcmp(want.data<float>(), plain.data<float>(), want.nbytes()), 0) << "quantisation changed nothing";
  Tensor odd = rng.tensor({T, 200});
  TestWeight tw2 = make_weight(ops::WeightFormat::fp8_block, out, 200, rng);
  tw2.w.act_fp8 = true;
  Tensor y2(DType::f32, {T, out});
  EXPECT_THROW(ops::linear(cpu::context(), odd, tw2.w, y2), Error);
}

// Rows quantised by the act_quant op (ops::Fp8Rows: token-major scales, a step's rows written in slices) are
// act_quant_fp8's bytes and scales, and grouped_linear from them gives grouped_linear's bits on the f32 rows (a
// quantised value quantises to itself). Misfit rows are refused.
TEST(ActQuant, Fp8RowsFeedTheGroupedProduct) {
  test::Random rng(9);
  const int64_t T = 5, G = 2, in_g = 256, out_g = 64, width = G * in_g, P = ops::Fp8Rows::padded_rows(T);
  ASSERT_EQ(P, 8);
  TestWeight tw = make_weight(ops::WeightFormat::fp8_block, G * out_g, in_g, rng);
  tw.w.act_fp8 = true;
  Tensor x = rng.tensor({T, width}), values(DType::u8, {P, width}), scales(DType::f32, {width / 128, P});
  const ops::Fp8Rows rows{values, scales, T};
  ops::act_quant(cpu::context(), x.view().rows(0, 2), rows.slice(0, 2));
  ops::act_quant(cpu::context(), x.view().rows(2, T), rows.slice(2, T));
  std::vector<uint8_t> q(width);
  std::vector<float> sc(width / 128);
  for (int64_t t = 0; t < T; ++t) {
    ops::act_quant_fp8(x.data<float>() + t * width, width, q.data(), sc.data());
    EXPECT_EQ(std::memcmp(q.data(), values.data<uint8_t>() + t * width, width), 0) << "row " << t;
    for (int64_t b = 0; b < width / 128; ++b) EXPECT_EQ(scales.data<float>()[b * P + t], sc[b]) << "row " << t;
  }
  Tensor want(DType::f32, {T, G, out_g}), got(DType::f32, {T, G, out_g});
  ops::grouped_linear(cpu::context(), x.view().reshape({T, G, in_g}), tw.w, want);
  ops::grouped_linear(cpu::context(), rows, G, tw.w, got);
  EXPECT_EQ(std::memcmp(want.data<float>(), got.data<float>(), want.nbytes()), 0);
  Tensor y_bad(DType::f32, {T, G, out_g + 1});
  EXPECT_THROW(ops::grouped_linear(cpu::context(), rows, G, tw.w, y_bad), Error);
  EXPECT_THROW(ops::grouped_linear(cpu::context(), ops::Fp8Rows{values, scales, P + 1}, G, tw.w, want), Error);
  tw.w.act_fp8 = false;  // the product must take FP8 activations
  EXPECT_THROW(ops::grouped_linear(cpu::context(), rows, G, tw.w, got), Error);
  Tensor narrow(DType::f32, {width / 128 - 1, P});
  EXPECT_THROW(ops::act_quant(cpu::context(), x, ops::Fp8Rows{values, narrow, T}), Error);
}

TEST(ActQuant, ParsesItsModes) {
  EXPECT_EQ(ops::parse_activations("fp8"), ops::Activations::fp8);
  EXPECT_EQ(ops::parse_activations("native"), ops::Activations::native);
  EXPECT_EQ(ops::parse_activations("f32"), ops::Activations::f32);
  EXPECT_EQ(ops::activations_name(ops::Activations::f32), "f32");
  EXPECT_THROW(ops::parse_activations("bf16"), Error);
}

}  // namespace
}  // namespace tern
