// A weight matrix W [out, in] in one of the checkpoint formats, as the ops see it. The model maps its
// checkpoint-bound `model::Linear` onto this (ops may not include model headers).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/tensor.h"

namespace tern::ops {

enum class WeightFormat : uint8_t {
  f32,        // weight f32 [out, in]
  bf16,       // weight bf16 [out, in]
  fp8_block,  // weight e4m3 [out, in] + scale e8m0 (or f32) [ceil(out/128), ceil(in/128)]
  mxfp4,      // weight e2m1 [out, in] or i8/u8 [out, in/2] (low nibble first) + scale e8m0 [out, in/32]
  nvfp4,      // as mxfp4 + scale ue4m3 [out, in/16] + global_scale: W = e2m1 * scale * global_scale
};

std::string_view weight_format_name(WeightFormat f);

struct Weight {
  WeightFormat format = WeightFormat::f32;
  int64_t out = 0, in = 0;
  TensorView weight;
  TensorView scale;           // empty for f32 / bf16
  float global_scale = 1.0f;  // nvfp4 only
  std::string name;           // for messages
  // Compute y in f32 on every backend (the CUDA one otherwise rounds x to bf16 for the tensor cores): set for
  // the router gates, whose top-k must pick the reference's experts.
  bool exact = false;
  // x is quantised as the official reference does before the product (act_quant.h: 1x128 e4m3, power-of-two
  // scales) on every backend: set by `--activations fp8` on the FP8 and FP4 weights (with `exact`, the product
  // of the quantised x stays exact).
  bool act_fp8 = false;

  Device device() const { return weight.device(); }
};

// Throws tern::Error naming the weight when its views do not describe a [out, in] matrix of its format.
void check_weight(const Weight& w);

// A weight as a model uses it: in linear() (groups 1) or grouped_linear() over `groups` groups.
struct LinearUse {
  const Weight* weight = nullptr;
  int64_t groups = 1;
};

}  // namespace tern::ops
