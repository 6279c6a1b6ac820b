// RoPE inverse frequencies, computed in fp32 step by step as transformers does, so the angles match the
// reference to the last bit where the platform's powf agrees.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "ops/rope.h"

namespace tern::ops {
namespace {

// YaRN: the dimension index at which a frequency makes `rotations` turns over the original context.
double correction_dim(double rotations, double dim, double base, double max_pos) {
  return dim * std::log(max_pos / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

}  // namespace

Tensor rope_inv_freq(const RopeParams& p) {
  TERN_CHECK(p.dim > 0 && p.dim % 2 == 0, "rope: dim ", p.dim, " must be positive and even");
  TERN_CHECK(p.theta > 0, "rope: theta must be positive");
  const int64_t half = p.dim / 2;
  Tensor out(DType::f32, {half});
  float* inv = out.data<float>();
  const auto base = static_cast<float>(p.theta);
  for (int64_t i = 0; i < half; ++i) {
    const float pos_freq = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(p.dim));
    inv[i] = 1.0f / pos_freq;
  }
  if (!p.yarn) return out;
  TERN_CHECK(p.factor > 0 && p.original_max_position > 0,
             "rope: YaRN needs factor and original_max_position");
  double low = std::floor(correction_dim(p.beta_fast, p.dim, p.theta, p.original_max_position));
  double high = std::ceil(correction_dim(p.beta_slow, p.dim, p.theta, p.original_max_position));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(p.dim - 1));
  if (low == high) high += 0.001;  // as the reference: no zero-width ramp
  const auto factor = static_cast<float>(p.factor);
  for (int64_t i = 0; i < half; ++i) {
    const float pos_freq = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(p.dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) /
                                      (static_cast<float>(high) - static_cast<float>(low)),
                                  0.0f, 1.0f);
    const float extrapolation_weight = 1.0f - ramp;
    inv[i] = interpolation * (1.0f - extrapolation_weight) + extrapolation * extrapolation_weight;
  }
  return out;
}

}  // namespace tern::ops
