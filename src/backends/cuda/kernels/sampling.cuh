// Device sampling (host interface): one block per row of logits turns it into the token, its logprob and
// the top logprobs, with the host sampler's arithmetic and candidate order (ops/sampling_math.h), so the
// result equals engine::Sampler's for the same logits, parameters, history and uniform.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/sampling_math.h"

namespace tern::cuda {

// logits f32 [rows, vocab]; `packed`: ops::pack_sample_rows's buffer on the device (rows descriptors,
// then the int32 area); `work`: rows * vocab floats of scratch; `out`: rows results (device).
void launch_sample_rows(const float* logits, int64_t rows, int64_t vocab, const void* packed, float* work,
                        sampling::SampledRow* out, cudaStream_t stream);

}  // namespace tern::cuda
