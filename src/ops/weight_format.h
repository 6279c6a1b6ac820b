// The formats a weight matrix W [out, in] comes in: the one format enum of the code base (issue #17). The model's
// loader binds it, the ops and backends take it, and the CUDA kernels use it as their template parameter, so it
// depends on nothing (nvcc compiles it into device code).
#pragma once

#include <cstdint>
#include <string_view>

namespace tern::ops {

enum class WeightFormat : uint8_t {
  f32,        // weight f32 [out, in]
  bf16,       // weight bf16 [out, in]
  fp8_block,  // weight e4m3 [out, in] + scale e8m0 (or f32) [ceil(out/128), ceil(in/128)]
  mxfp4,      // weight e2m1 [out, in] or i8/u8 [out, in/2] (low nibble first) + scale e8m0 [out, in/32]
  nvfp4,      // as mxfp4 + scale ue4m3 [out, in/16] + global_scale: W = e2m1 * scale * global_scale
};

// "f32", "bf16", "fp8_block", "mxfp4", "nvfp4" (inline: header-only users such as the profile report link no ops)
constexpr std::string_view weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::f32: return "f32";
    case WeightFormat::bf16: return "bf16";
    case WeightFormat::fp8_block: return "fp8_block";
    case WeightFormat::mxfp4: return "mxfp4";
    case WeightFormat::nvfp4: return "nvfp4";
  }
  return "?";
}

}  // namespace tern::ops
