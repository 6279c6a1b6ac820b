// A weight matrix W [out, in] in one of the checkpoint formats: the one description of a weight (issue #17). The
// model's loader binds these (model::Linear is this type), Model::to_device uploads them in place, and the ops
// take them as they are.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/tensor.h"
#include "ops/weight_format.h"

namespace tern::ops {

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
