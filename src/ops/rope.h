// Rotary position embedding, DeepSeek-V4 style: interleaved pairs (x[2i], x[2i+1]) of the LAST rope_dim
// dims of each head; the leading (no-RoPE) dims are untouched.
//   angle_i = position * inv_freq[i];  (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)
// `inverse` rotates by -angle (V4 applies it to the attention output at the query position).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tern::ops {

class Context;  // ops/context.h: each op runs in one

struct RopeParams {
  double theta = 10000.0;
  int64_t dim = 64;  // rope_dim: number of rotated dims
  bool yarn = false;
  double factor = 1.0;
  double original_max_position = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  // V4 never scales cos/sin by YaRN's attention factor, so there is none here.
};

// The inverse frequencies f32 [dim/2], with the arithmetic (fp32) of transformers' default and YaRN
// initialisers (_compute_yarn_parameters with truncate=True). Host tensor.
Tensor rope_inv_freq(const RopeParams& p);

// x f32 [rows, heads, head_dim] or [rows, head_dim], rotated in place; positions i64 [rows];
// inv_freq f32 [rope_dim/2] on x's device.
void rope(const Context& ctx, const TensorView& x, const TensorView& positions, const TensorView& inv_freq,
          bool inverse = false);

// rms_norm(x, weight, eps, out) then rope(out, positions, inv_freq), the same bits, in one pass where the
// backend can (the attention's per-head q norm and its kv row: one launch for two on the GPU). x f32
// [rows, head_dim] or [rows, heads, head_dim], may be rows (a stacked product's column range); weight as
// rms_norm's; out f32 contiguous, x's shape (may alias x).
void norm_rope(const Context& ctx, const TensorView& x, const TensorView& weight, float eps,
               const TensorView& positions, const TensorView& inv_freq, const TensorView& out);

}  // namespace tern::ops
