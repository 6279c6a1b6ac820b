// One weight element W[r, c] decoded in f32, whatever its format: what the exact CUDA-core paths read (the exact
// linear kernels, dequantize, the exact experts). e4m3, e2m1 and their block scales decode exactly in f32.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/device_common.cuh"
#include "ops/weight_format.h"

namespace tern::cuda::dev {

using ops::WeightFormat;

struct SimpleMat {
  int kind;  // WeightFormat
  const uint8_t* w;
  const uint8_t* s;
  int64_t out, in, s_cols;
  int scale_f32;
  float global_scale;
};

__device__ inline float weight_at(const SimpleMat& m, int64_t r, int64_t c) {
  switch (static_cast<WeightFormat>(m.kind)) {
    case WeightFormat::f32: return reinterpret_cast<const float*>(m.w)[r * m.in + c];
    case WeightFormat::bf16: return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(m.w)[r * m.in + c]);
    case WeightFormat::fp8_block: {
      const int64_t si = (r / 128) * m.s_cols + c / 128;
      const float s = m.scale_f32 ? reinterpret_cast<const float*>(m.s)[si] : e8m0_to_f32(m.s[si]);
      return e4m3_to_f32(m.w[r * m.in + c]) * s;
    }
    case WeightFormat::mxfp4:
    case WeightFormat::nvfp4: {
      const uint8_t byte = m.w[r * (m.in / 2) + c / 2];
      const float v = e2m1_to_f32((c & 1) ? byte >> 4 : byte & 0xf);
      if (static_cast<WeightFormat>(m.kind) == WeightFormat::mxfp4) return v * e8m0_to_f32(m.s[r * m.s_cols + c / 32]);
      return v * ue4m3_to_f32(m.s[r * m.s_cols + c / 16]) * m.global_scale;
    }
  }
  return nan_f32();
}

}  // namespace tern::cuda::dev
