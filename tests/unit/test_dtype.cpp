// Every bit pattern of the 8-bit-or-smaller types, and all 65536 of the 16-bit ones, against an
// independent formula; rounding checked at every midpoint between neighbouring values.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"

namespace tern {
namespace {

// Independent definition: sign, exponent field, mantissa field, evaluated with pow().
double formula(uint32_t bits, int ebits, int mbits, int bias) {
  const uint32_t s = (bits >> (ebits + mbits)) & 1, e = (bits >> mbits) & ((1u << ebits) - 1),
                 m = bits & ((1u << mbits) - 1);
  const double frac = static_cast<double>(m) / std::pow(2.0, mbits);
  const double mag = e == 0 ? frac * std::pow(2.0, 1 - bias) : (1.0 + frac) * std::pow(2.0, int(e) - bias);
  return s ? -mag : mag;
}

// Checks decode against the formula, encode(decode(b)) == b, and round-to-nearest-even at every
// midpoint of consecutive positive values (and just either side of it).
template <typename Dec, typename Enc>
void check_minifloat(int ebits, int mbits, int bias, uint32_t max_code, Dec dec, Enc enc) {
  std::vector<std::pair<double, uint32_t>> positives;
  for (uint32_t b = 0; b <= max_code; ++b) {
    const double want = formula(b, ebits, mbits, bias);
    ASSERT_EQ(dec(b), static_cast<float>(want)) << "bits " << b;
    ASSERT_EQ(enc(dec(b)), b) << "bits " << b;
    const uint32_t neg = b | (1u << (ebits + mbits));
    ASSERT_EQ(dec(neg), static_cast<float>(-want)) << "bits " << neg;
    ASSERT_EQ(enc(dec(neg)), neg) << "bits " << neg;
    positives.emplace_back(want, b);
  }
  for (size_t i = 0; i + 1 < positives.size(); ++i) {
    const auto [lo, lo_bits] = positives[i];
    const auto [hi, hi_bits] = positives[i + 1];
    const float mid = static_cast<float>((lo + hi) / 2);
    const uint32_t even = (lo_bits % 2 == 0) ? lo_bits : hi_bits;
    EXPECT_EQ(enc(mid), even) << "midpoint " << mid;
    EXPECT_EQ(enc(std::nextafter(mid, 0.0f)), lo_bits) << "below midpoint " << mid;
    EXPECT_EQ(enc(std::nextafter(mid, 1e9f)), hi_bits) << "above midpoint " << mid;
  }
}

TEST(DType, E4M3EveryPattern) {
  check_minifloat(4, 3, 7, 0x7e, e4m3_to_f32, f32_to_e4m3);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7e);  // saturates
  EXPECT_EQ(f32_to_e4m3(-1e6f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(NAN), 0x7f);
}

TEST(DType, E2M1EveryPattern) {
  check_minifloat(2, 1, 1, 0x7, e2m1_to_f32, f32_to_e2m1);
  const float want[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int b = 0; b < 16; ++b) EXPECT_EQ(e2m1_to_f32(b), (b & 8 ? -1 : 1) * want[b & 7]);
  EXPECT_EQ(f32_to_e2m1(100.0f), 0x7);
  EXPECT_EQ(f32_to_e2m1(5.0f), 0x6);  // midpoint of 4 and 6 rounds to even mantissa (4)
}

TEST(DType, E8M0EveryPattern) {
  for (int b = 0; b < 255; ++b) {
    const float v = e8m0_to_f32(static_cast<uint8_t>(b));
    ASSERT_EQ(v, static_cast<float>(std::pow(2.0, b - 127))) << b;
    ASSERT_EQ(f32_to_e8m0(v), b);
    ASSERT_EQ(e8m0_ceil_pow2(v), b);
    if (b > 0 && b < 254) {
      ASSERT_EQ(e8m0_ceil_pow2(v * 1.25f), b + 1);
      ASSERT_EQ(e8m0_ceil_pow2(std::nextafter(v, 0.0f)), b);
    }
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xff)));
  EXPECT_EQ(f32_to_e8m0(3.0f), 0xff);  // not a power of two
  EXPECT_EQ(f32_to_e8m0(-1.0f), 0xff);
  EXPECT_EQ(e8m0_ceil_pow2(448.0f / 448.0f), 127);
}

TEST(DType, UE4M3EveryPattern) {
  for (int b = 0; b < 256; ++b) {
    const float v = ue4m3_to_f32(static_cast<uint8_t>(b));
    if (b & 0x80 || b == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << b;
      continue;
    }
    EXPECT_EQ(v, static_cast<float>(formula(b, 4, 3, 7))) << b;
    EXPECT_EQ(f32_to_ue4m3(v), b);
  }
  EXPECT_EQ(f32_to_ue4m3(-1.0f), 0x7f);
}

TEST(DType, BF16AllPatterns) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float v = bf16_to_f32(static_cast<uint16_t>(b));
    const uint32_t e = (b >> 7) & 0xff;
    if (e == 0xff && (b & 0x7f)) {
      ASSERT_TRUE(std::isnan(v));
      ASSERT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(v))));
      continue;
    }
    if (e != 0xff) ASSERT_EQ(v, static_cast<float>(formula(b, 8, 7, 127))) << b;
    ASSERT_EQ(f32_to_bf16(v), b) << b;
  }
  // Round to nearest even at a midpoint: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
}

TEST(DType, F16AllPatterns) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float v = f16_to_f32(static_cast<uint16_t>(b));
    const uint32_t e = (b >> 10) & 0x1f;
    if (e == 0x1f) {
      ASSERT_TRUE((b & 0x3ff) ? std::isnan(v) : std::isinf(v));
      if (!(b & 0x3ff)) ASSERT_EQ(f32_to_f16(v), b);
      continue;
    }
    ASSERT_EQ(v, static_cast<float>(formula(b, 5, 10, 15))) << b;
    ASSERT_EQ(f32_to_f16(v), b) << b;
  }
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
}

TEST(DType, SafetensorsNames) {
  DType t;
  EXPECT_TRUE(dtype_from_safetensors("F8_E4M3", &t));
  EXPECT_EQ(t, DType::e4m3);
  EXPECT_TRUE(dtype_from_safetensors("F8_E8M0", &t));
  EXPECT_EQ(t, DType::e8m0);
  EXPECT_TRUE(dtype_from_safetensors("I64", &t));
  EXPECT_EQ(t, DType::i64);
  EXPECT_FALSE(dtype_from_safetensors("F8_E5M3", &t));
  EXPECT_FALSE(dtype_from_safetensors("", &t));
  EXPECT_EQ(dtype_bits(DType::e2m1), 4);
}

}  // namespace
}  // namespace tern
