#include "core/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace tern {
namespace {

struct DTypeInfo {
  DType type;
  int bits;
  std::string_view name;
  std::string_view safetensors;
};

constexpr DTypeInfo kInfo[] = {
    {DType::f32, 32, "f32", "F32"},      {DType::f16, 16, "f16", "F16"},
    {DType::bf16, 16, "bf16", "BF16"},   {DType::e4m3, 8, "e4m3", "F8_E4M3"},
    {DType::e8m0, 8, "e8m0", "F8_E8M0"}, {DType::e2m1, 4, "e2m1", "F4"},
    {DType::ue4m3, 8, "ue4m3", "UE4M3"}, {DType::i8, 8, "i8", "I8"},
    {DType::u8, 8, "u8", "U8"},          {DType::i32, 32, "i32", "I32"},
    {DType::i64, 64, "i64", "I64"},
};

const DTypeInfo& info(DType t) { return kInfo[static_cast<int>(t)]; }

uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float bits_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// A small binary float format: sign, `ebits` exponent bits with `bias`, `mbits` mantissa bits.
struct MiniFloat {
  int ebits, mbits, bias;
  bool ieee_inf;       // top exponent is inf/NaN (f16); otherwise all of it is finite (fn types)
  uint32_t max_code;   // largest finite magnitude code
};

constexpr MiniFloat kF16{5, 10, 15, true, 0x7bff};
constexpr MiniFloat kE4M3{4, 3, 7, false, 0x7e};
constexpr MiniFloat kE2M1{2, 1, 1, false, 0x7};

float mini_decode(const MiniFloat& f, uint32_t code) {
  const uint32_t sign = code >> (f.ebits + f.mbits) & 1;
  const uint32_t exp = (code >> f.mbits) & ((1u << f.ebits) - 1);
  const uint32_t man = code & ((1u << f.mbits) - 1);
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), 1 - f.bias - f.mbits);
  } else {
    mag = std::ldexp(static_cast<float>(man | (1u << f.mbits)), static_cast<int>(exp) - f.bias - f.mbits);
  }
  return sign ? -mag : mag;
}

// Magnitude code of |x| rounded to nearest even, not yet clamped to the format's range.
uint32_t mini_encode_magnitude(const MiniFloat& f, float a) {
  if (a == 0.0f) return 0;
  int e;
  std::frexp(a, &e);  // a = m * 2^e with m in [0.5, 1)
  int unbiased = e - 1;
  const int min_normal = 1 - f.bias;
  if (unbiased < min_normal) unbiased = min_normal;  // subnormal: fixed quantum
  // Quantum of this binade; nearbyint rounds half to even in the default rounding mode.
  const float q = std::nearbyint(std::ldexp(a, f.mbits - unbiased));
  if (e - 1 < min_normal) return static_cast<uint32_t>(q);  // subnormal (q may carry into normal)
  uint32_t qi = static_cast<uint32_t>(q);
  if (qi == (2u << f.mbits)) {  // mantissa overflowed into the next binade
    qi = 1u << f.mbits;
    ++unbiased;
  }
  const uint32_t exp = static_cast<uint32_t>(unbiased + f.bias);
  return (exp << f.mbits) | (qi - (1u << f.mbits));
}

uint32_t mini_encode(const MiniFloat& f, float x, bool saturate) {
  const uint32_t sign_bit = 1u << (f.ebits + f.mbits);
  const uint32_t sign = std::signbit(x) ? sign_bit : 0;
  const float a = std::fabs(x);
  const uint32_t top = (1u << f.ebits) - 1;
  if (std::isnan(x)) return f.ieee_inf ? (sign | (top << f.mbits) | 1) : (sign | f.max_code | 1);
  uint32_t code;
  if (std::isinf(a)) {
    code = f.ieee_inf && !saturate ? (top << f.mbits) : f.max_code;
  } else {
    code = mini_encode_magnitude(f, a);
    if (code > f.max_code) code = (f.ieee_inf && !saturate) ? (top << f.mbits) : f.max_code;
  }
  return sign | code;
}

}  // namespace

int dtype_bits(DType t) { return info(t).bits; }
std::string_view dtype_name(DType t) { return info(t).name; }
std::string_view dtype_to_safetensors(DType t) { return info(t).safetensors; }

bool dtype_from_safetensors(std::string_view s, DType* out) {
  for (const auto& i : kInfo) {
    if (i.safetensors == s) {
      *out = i.type;
      return true;
    }
  }
  if (s == "F8_E8M0FNU") {
    *out = DType::e8m0;
    return true;
  }
  return false;
}

float bf16_to_f32(uint16_t bits) { return bits_float(static_cast<uint32_t>(bits) << 16); }

uint16_t f32_to_bf16(float x) {
  uint32_t u = float_bits(x);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN, keep sign
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t bits) {
  const uint32_t exp = (bits >> 10) & 0x1f;
  if (exp == 0x1f) {
    const bool neg = bits & 0x8000;
    if (bits & 0x3ff) return std::numeric_limits<float>::quiet_NaN();
    return neg ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  }
  return mini_decode(kF16, bits);
}

uint16_t f32_to_f16(float x) { return static_cast<uint16_t>(mini_encode(kF16, x, false)); }

float e4m3_to_f32(uint8_t bits) {
  if ((bits & 0x7f) == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  return mini_decode(kE4M3, bits);
}

uint8_t f32_to_e4m3(float x) { return static_cast<uint8_t>(mini_encode(kE4M3, x, true)); }

float e8m0_to_f32(uint8_t bits) {
  if (bits == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

uint8_t f32_to_e8m0(float x) {
  if (!(x > 0.0f) || std::isinf(x)) return 0xff;
  int e;
  const float m = std::frexp(x, &e);
  if (m != 0.5f) return 0xff;  // not a power of two
  const int biased = e - 1 + 127;
  return (biased < 0 || biased > 254) ? 0xff : static_cast<uint8_t>(biased);
}

uint8_t e8m0_ceil_pow2(float x) {
  if (!(x > 0.0f) || std::isinf(x)) return 0xff;
  int e;
  const float m = std::frexp(x, &e);
  int exponent = (m == 0.5f) ? e - 1 : e;  // x in (2^(e-1), 2^e) rounds up to 2^e
  const int biased = exponent + 127;
  if (biased < 0) return 0;
  return biased > 254 ? 0xff : static_cast<uint8_t>(biased);
}

float e2m1_to_f32(uint8_t nibble) { return mini_decode(kE2M1, nibble & 0xf); }

uint8_t f32_to_e2m1(float x) { return static_cast<uint8_t>(mini_encode(kE2M1, x, true)); }

float ue4m3_to_f32(uint8_t bits) {
  if (bits & 0x80) return std::numeric_limits<float>::quiet_NaN();
  return e4m3_to_f32(bits);
}

uint8_t f32_to_ue4m3(float x) {
  if (std::isnan(x) || x < 0.0f) return 0x7f;
  return f32_to_e4m3(x);
}

}  // namespace tern
