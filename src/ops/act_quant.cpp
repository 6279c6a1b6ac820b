#include "ops/act_quant.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"

namespace tern::ops {

std::string_view activations_name(Activations a) {
  switch (a) {
    case Activations::native:
      return "native";
    case Activations::fp8:
      return "fp8";
    case Activations::f32:
      return "f32";
  }
  return "?";
}

Activations parse_activations(std::string_view s) {
  if (s == "native") return Activations::native;
  if (s == "fp8") return Activations::fp8;
  if (s == "f32") return Activations::f32;
  fail("activations \"", s, "\": expected native (each backend's own), fp8 (1x128 e4m3, power-of-two scales) or f32 "
       "(every product exact in f32: slow)");
}

int fp8_scale_exponent(float amax) {
  return static_cast<int>(std::ceil(std::log2(std::max<double>(amax, 1e-4f) / 448.0)));
}

namespace {
// One block: its scale and the e4m3 bytes (q may be null).
float quant_block(const float* x, uint8_t* q) {
  float amax = 0.0f;
  for (int64_t i = 0; i < kActBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = std::ldexp(1.0f, fp8_scale_exponent(amax));
  if (q != nullptr)
    for (int64_t i = 0; i < kActBlock; ++i) q[i] = f32_to_e4m3(x[i] / scale);
  return scale;
}
}  // namespace

void act_quant_fp8(const float* x, int64_t n, uint8_t* q, float* scales) {
  TERN_CHECK(n % kActBlock == 0, "act_quant_fp8: ", n, " values is not a multiple of ", kActBlock);
  for (int64_t b = 0; b < n / kActBlock; ++b) scales[b] = quant_block(x + b * kActBlock, q + b * kActBlock);
}

void act_fake_quant_fp8(const float* x, int64_t n, float* out) {
  TERN_CHECK(n % kActBlock == 0, "act_fake_quant_fp8: ", n, " values is not a multiple of ", kActBlock);
  uint8_t q[kActBlock];
  for (int64_t b = 0; b < n / kActBlock; ++b) {
    const float scale = quant_block(x + b * kActBlock, q);
    for (int64_t i = 0; i < kActBlock; ++i) out[b * kActBlock + i] = e4m3_to_f32(q[i]) * scale;
  }
}

}  // namespace tern::ops
