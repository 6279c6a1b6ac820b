// Synthetic weights written in place on any device (model/synthetic_model.h builds the whole model with it):
// one tensor at a time, values from ops/synth_values.h indexed by (seed, element), so the CPU backend and the
// CUDA kernels write the same bytes, in the formats of docs/checkpoints.md.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tern::ops {

class Context;  // ops/context.h: each op runs in one

enum class SynthKind : uint8_t {
  normal,         // out f32 or bf16: a + b * unit value (mean a, std b)
  uniform,        // out f32 or bf16: uniform in [a, b)
  fp8_block,      // a weight [out, in] of std b: out e4m3 [out, in], scale e8m0 [ceil(out/128), ceil(in/128)]
  mxfp4,          // a weight of std b: out i8/u8 [out, in/2] (e2m1 pairs, low nibble first), scale e8m0 [out, in/32]
  nvfp4,          // a weight of std b: out u8 [out, in/2], scale ue4m3 [out, in/16]; global_scale
  distinct_rows,  // out i64 [rows, k]: each row k distinct values in [0, choices)
};

struct SynthFillArgs {
  SynthKind kind = SynthKind::normal;
  uint64_t seed = 0;  // the tensor's stream (synth::tensor_seed)
  float a = 0, b = 1;
  TensorView out, scale;
  // nvfp4: the fp32 global scale the block scales are relative to (synth::nvfp4_global_scale(b)).
  float global_scale = 1;
  int64_t choices = 0;  // distinct_rows
  // Quantized kinds: the logical [out, in] of the weight (value index r * in + c).
  int64_t rows = 0, cols = 0;
};

// Checks the views against the kind and fills them on their device (ordered after earlier work there).
// Quantized kinds: FP8 blocks scaled so that amax / scale <= 448 with a power-of-two (e8m0) scale, MXFP4
// amax / scale <= 6 per 32 values, NVFP4 ue4m3 scales per 16 values times global_scale.
void synth_fill(const Context& ctx, const SynthFillArgs& a);

}  // namespace tern::ops
