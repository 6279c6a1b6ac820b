// Small ops around the big ones: embedding lookup, residual add, clamped SwiGLU, row gather.
#pragma once

#include "core/tensor.h"

namespace tern::ops {

class Context;  // ops/context.h: each op runs in one

// out[t] = table[ids[t]].  table bf16|f32 [vocab, D], ids i64 [T], out f32 [T, D].
void embedding(const Context& ctx, const TensorView& table, const TensorView& ids, const TensorView& out);

// y += x.  f32, same shape.
void add(const Context& ctx, const TensorView& x, const TensorView& y);

// out = silu(min(gate, limit)) * clamp(up, -limit, limit).  f32, same shape; out may alias gate or up. out is
// contiguous; gate and up may be rows (TensorView::row_stride): the column ranges of the shared expert's
// stacked w1 | w3 product (model/stacked.h).
void swiglu(const Context& ctx, const TensorView& gate, const TensorView& up, float limit,
            const TensorView& out);

// out[i] = x[rows[i]].  x f32 [R, D], rows i64 [n], out f32 [n, D].
void gather_rows(const Context& ctx, const TensorView& x, const TensorView& rows, const TensorView& out);

// dst = src, byte for byte: host <-> device or within one device (core's DeviceMemory of the device
// side; host to host is a memmove). Same byte count, both contiguous.
inline void copy(const TensorView& src, const TensorView& dst) {
  copy_view(src, dst);
}

}  // namespace tern::ops
