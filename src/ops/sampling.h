// Sampling rows of logits where they are (a device backend samples without copying the logits back):
// penalties, temperature, top-k / top-p / min-p, the draw from a uniform number the caller drew, and the
// logprobs. The same result as the host sampler (engine/sampler.h) for the same logits, parameters,
// history and uniform: both use ops/sampling_math.h and visit candidates in the same order.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/sampling_math.h"

namespace tern::ops {

class Context;  // ops/context.h: each op runs in one

using sampling::SampledRow;
using sampling::SampleRowDesc;

// One row's request: the parameters (the engine's SamplingParams, flattened), the uniform the host drew
// for it (engine::draw_uniforms; not read when greedy), and the penalty history: the ids seen in the
// prompt or the output (repetition) and the output counts (presence / frequency). Ids outside the
// vocabulary are ignored, as the host sampler ignores them.
struct SampleRowSpec {
  SampleRowDesc params;  // its offset / count fields are filled by pack_sample_rows
  std::span<const int32_t> seen;
  std::span<const std::pair<int32_t, int32_t>> output_counts;
};

// The packed buffer of sample_rows: specs.size() SampleRowDesc, then the int32 area (each row's seen ids
// ascending, then its (token, count) pairs by token ascending; a history is packed only when its penalty
// is on). Checks the parameters and that the ids are distinct. Returns the bytes in `out`.
void pack_sample_rows(std::span<const SampleRowSpec> specs, int64_t vocab, std::vector<uint8_t>& out);

// logits f32 [rows, vocab] on a device backend's device; one spec and one result per row. Synchronous:
// the results are on the host when it returns.
void sample_rows(const Context& ctx, const TensorView& logits, std::span<const SampleRowSpec> specs,
                 std::span<SampledRow> out);

}  // namespace tern::ops
