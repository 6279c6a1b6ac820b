// y = x W^T for weights in every checkpoint format; quantized formats are dequantized exactly inside the
// kernel (no dequantized copy of the matrix is kept).
#pragma once

#include "core/tensor.h"
#include "ops/act_quant.h"
#include "ops/weight.h"

namespace tern::ops {

class Context;  // ops/context.h: each op runs in one

// x f32 [T, in], y f32 [T, out].
void linear(const Context& ctx, const TensorView& x, const Weight& w, const TensorView& y);

// Block-diagonal (V4's wo_a): W [G * out_g, in_g] holds G matrices [out_g, in_g]; group g maps x[:, g]
// to y[:, g].  x f32 [T, G, in_g], y f32 [T, G, out_g].
void grouped_linear(const Context& ctx, const TensorView& x, const Weight& w, const TensorView& y);

// x quantised by rows as an FP8 product with --activations fp8 would (x f32 [T, cols]; out.rows == T): for a
// producer that hands a product rows already quantised (sparse_attention's heads) and rows it computed in f32.
void act_quant(const Context& ctx, const TensorView& x, const Fp8Rows& out);
// grouped_linear on rows already quantised (x: T = x.rows rows of groups * w.in columns); y f32 [T, groups, out_g].
// w must take FP8 activations (act_fp8): the product is grouped_linear's on the dequantised x, bit for bit (a
// quantised value quantises to itself).
void grouped_linear(const Context& ctx, const Fp8Rows& x, int64_t groups, const Weight& w, const TensorView& y);

// A hint that a product with w comes soon: a backend with a cache between the weights and its cores may start
// bringing w's bytes in (CUDA: into L2, docs/cuda-backend.md "L2 prefetch"); the CPU backend does nothing. No
// value changes, nothing waits for it.
void prefetch(const Context& ctx, const Weight& w);

// The whole matrix as f32 [out, in] (tests and tools; the forward never materialises it).
void dequantize(const Context& ctx, const Weight& w, const TensorView& out);

}  // namespace tern::ops
