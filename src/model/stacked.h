// Two linears that read the same input, stacked along out into one matrix [a.out + b.out, in] once at load:
// one product then makes both outputs (a's in columns [0, a.out), b's after them), which saves a launch and
// its fixed cost (~8 us at batch 1, docs/cuda-backend.md "Measured gaps") per pair. The model stacks
// attention's wq_a + wkv, each compressor's wkv + wgate and the shared expert's w1 + w3; the parts stay
// bound as row views of the stack, so they hold no memory of their own.
#pragma once

#include <functional>
#include <string>

#include "model/weights.h"

namespace tern::model {

// Why a and b cannot be stacked (empty: they can): they must share the format, in, dtypes and global scale,
// and for fp8_block a.out must be a multiple of 128, so that no 128-row scale block straddles the join (b's
// last block may be partial: it ends the stack as it ended b).
std::string stack_refusal(const Linear& a, const Linear& b);

// The stack's description (format, out, in, name), without tensors.
Linear stacked_linear(const Linear& a, const Linear& b);

// Rows of a linear's scale tensor: 128-row blocks for fp8_block, one per output row for mxfp4 / nvfp4.
int64_t scale_rows(const Linear& l);

// The stack with its tensors from `take` (dtype, shape; any device), a and b copied in; a and b then view
// its rows. Requires stack_refusal(a, b) to be empty.
using Take = std::function<TensorView(DType, const Shape&)>;
Linear stack_linears(Linear& a, Linear& b, const Take& take);

// a and b as views of the stack's rows, a first (nothing when the stack has no tensors: a measuring walk).
void view_parts(const Linear& stacked, Linear& a, Linear& b);

}  // namespace tern::model
