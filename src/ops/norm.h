// RMSNorm in fp32: out = x * rsqrt(mean(x^2) + eps) * weight.
#pragma once

#include "core/tensor.h"

namespace tern::ops {

class Context;  // ops/context.h: each op runs in one

// x f32 [rows, dim] (any rank: the last dim is normalised), weight bf16|f32 [dim] or empty (unweighted,
// as the per-head q norm and the mHC input norm), out f32 like x (may alias x), contiguous. x may be rows
// (TensorView::row_stride): a column range of a stacked product's output (model/stacked.h).
void rms_norm(const Context& ctx, const TensorView& x, const TensorView& weight, float eps,
              const TensorView& out);

}  // namespace tern::ops
