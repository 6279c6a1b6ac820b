// Element types of tern's tensors and their exact conversions to and from fp32.
// Every conversion here is exact where the value is representable and rounds to nearest-even
// otherwise; tests check every bit pattern of the 8-bit-or-smaller types.
#pragma once

#include <cstdint>
#include <string_view>

namespace tern {

enum class DType : uint8_t {
  f32,
  f16,
  bf16,
  e4m3,   // float8 e4m3fn: no infinities, 0x7f/0xff are NaN, max 448
  e8m0,   // float8 e8m0fnu: power-of-two scale 2^(bits-127), 0xff is NaN
  e2m1,   // fp4 e2m1: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; stored two per byte, low nibble first
  ue4m3,  // unsigned e4m3 (NVFP4 block scales): an e4m3fn byte whose sign bit must be 0
  i8,
  u8,
  i32,
  i64,
};

// Size of one element in bits (4 for e2m1).
int dtype_bits(DType t);
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string ("F32", "BF16", "F8_E4M3", "F8_E8M0", "I8", "U8", "I64", ...).
// Returns false for strings tern does not know.
bool dtype_from_safetensors(std::string_view s, DType* out);
std::string_view dtype_to_safetensors(DType t);

// --- host conversions (the CUDA backend has its own device versions, tested against these) ---
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float x);  // round to nearest even; NaN stays NaN
float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float x);  // round to nearest even; overflow to infinity
float e4m3_to_f32(uint8_t bits);
uint8_t f32_to_e4m3(float x);  // round to nearest even; saturates to +-448; NaN -> 0x7f
float e8m0_to_f32(uint8_t bits);
// Exact encoding of a power of two in [2^-127, 2^127]; anything else is not representable and gives
// 0xff (NaN). Use e8m0_ceil_pow2 to pick a scale.
uint8_t f32_to_e8m0(float x);
// The smallest power of two >= x (x > 0), as e8m0 bits: the power-of-two scale rule of DeepSeek's
// quantizers (scale = 2^ceil(log2(amax / max_representable))).
uint8_t e8m0_ceil_pow2(float x);
float e2m1_to_f32(uint8_t nibble);  // low 4 bits used
uint8_t f32_to_e2m1(float x);       // round to nearest even; saturates to +-6
float ue4m3_to_f32(uint8_t bits);   // NaN if the sign bit is set
uint8_t f32_to_ue4m3(float x);      // round to nearest even, saturates to 448; negative or NaN -> 0x7f

}  // namespace tern
