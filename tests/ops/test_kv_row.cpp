// The stored kv row formats: sizes, exact f32 round trip, and FP8 rounding by the reference's rule.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "ops/kv_row.h"
#include "test_util.h"

namespace tern {
namespace {

TEST(KvRow, Sizes) {
  EXPECT_EQ((ops::KvRowFormat{ops::KvFormat::fp8_ds, 512, 64}.row_bytes()),
            584);  // V4-Flash: 448 + 128 + 7 + 1
  EXPECT_EQ((ops::KvRowFormat{ops::KvFormat::fp8_ds, 256, 64}.row_bytes()), 192 + 128 + 8);
  EXPECT_EQ((ops::KvRowFormat{ops::KvFormat::f32, 512, 64}.row_bytes()), 2048);
  EXPECT_THROW((ops::KvRowFormat{ops::KvFormat::fp8_ds, 100, 64}.check()), Error);
}

TEST(KvRow, Fp8RoundsLikeTheReference) {
  test::Random rng(51);
  const ops::KvRowFormat f{ops::KvFormat::fp8_ds, 256, 64};
  const int64_t n = 4;
  Tensor x = rng.tensor({n, 256}, 3.0f);
  for (int64_t i = 0; i < 64; ++i) x.data<float>()[64 + i] = 1e-7f * rng.normal();  // tiny block: amax clamp
  for (int64_t i = 0; i < 64; ++i) x.data<float>()[256 + i] *= 1000.0f;             // large block
  Tensor rows(DType::u8, {n, f.row_bytes()}), y(DType::f32, {n, 256});
  ops::kv_pack(cpu::context(), x, f, rows);
  ops::kv_unpack(cpu::context(), rows, f, y);
  for (int64_t r = 0; r < n; ++r) {
    const float* a = x.data<float>() + r * 256;
    const float* b = y.data<float>() + r * 256;
    for (int64_t blk = 0; blk < 3; ++blk) {
      double amax = 0;
      for (int64_t i = 0; i < 64; ++i) amax = std::max(amax, double(std::fabs(a[blk * 64 + i])));
      const double scale = std::pow(2.0, std::ceil(std::log2(std::max(amax, double(1e-4f)) / 448.0)));
      for (int64_t i = 0; i < 64; ++i) {
        const float want = e4m3_to_f32(f32_to_e4m3(float(a[blk * 64 + i] / scale))) * float(scale);
        ASSERT_EQ(b[blk * 64 + i], want) << "row " << r << " dim " << blk * 64 + i;
      }
    }
    for (int64_t i = 192; i < 256; ++i) ASSERT_EQ(b[i], bf16_to_f32(f32_to_bf16(a[i])));
  }
}

TEST(KvRow, F32IsExact) {
  test::Random rng(52);
  const ops::KvRowFormat f{ops::KvFormat::f32, 128, 64};
  Tensor x = rng.tensor({3, 128}), rows(DType::u8, {3, f.row_bytes()}), y(DType::f32, {3, 128});
  ops::kv_pack(cpu::context(), x, f, rows);
  ops::kv_unpack(cpu::context(), rows, f, y);
  EXPECT_EQ(test::max_abs_diff(x, y), 0.0f);
}

}  // namespace
}  // namespace tern
